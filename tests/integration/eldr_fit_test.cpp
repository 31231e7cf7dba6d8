// eldr-fit as users run it: a real process on the real ESFT trace and on synthetic data, its
// centroid file and JSON report, and its errors on bad input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/formats/centroid_file.hpp"
#include "tests/support/process.hpp"
#include "tests/support/test_data.hpp"

namespace eldr {
namespace {

namespace fs = std::filesystem;
using eldr::testing::run_command;

const std::string fit_binary = std::string(ELDR_BINARY_DIR) + "/tools/eldr-fit/eldr-fit";

class EldrFit : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("eldr-fit-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST_F(EldrFit, RealEsftTraceReproducesThePublishedRhoAndWritesAValidCentroidSet) {
  ELDR_REQUIRE_SHARED_DATA(trace, "esft-deepseek-v2-lite.eldrtrace");
  const auto r = run_command(fit_binary + " --trace " + trace + " --workers 8 --seed 1 --out " +
                             path("esft.centroids") + " --report " + path("esft.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(path("esft.json"));
  const auto report = nlohmann::json::parse(in);
  // ../shared/formats/eldr-trace.md: first half as prefill gives rho 0.78 (count), 0.69 (idf).
  EXPECT_NEAR(report["rho"]["count"].get<double>(), 0.78, 0.02);
  EXPECT_NEAR(report["rho"]["count_idf"].get<double>(), 0.69, 0.02);
  for (const char* t : {"sqrt", "binary"})
    EXPECT_TRUE(report["rho"].contains(t)) << t;
  EXPECT_EQ(report["transform"], "count");  // auto picks the best rho
  const auto& curve = report["layer_curve"];
  ASSERT_EQ(curve["order"].size(), 26u);
  ASSERT_EQ(curve["rho"].size(), 26u);
  const uint32_t n_star = report["n_star"];
  ASSERT_GE(n_star, 1u);
  double peak = -2;
  for (double v : curve["rho"])
    peak = std::max(peak, v);
  EXPECT_DOUBLE_EQ(curve["rho"][n_star - 1].get<double>(), peak);
  EXPECT_EQ(report["mask"].size(), n_star);
  EXPECT_NEAR(curve["rho"][25].get<double>(), report["rho"]["count"].get<double>(), 1e-9);

  auto f = read_centroid_file(path("esft.centroids"));
  ASSERT_TRUE(f.ok()) << f.error().to_string();
  EXPECT_EQ(f->workers, 8u);
  EXPECT_EQ(f->spec.geometry(), (model_geometry{26, 64, 6}));
  EXPECT_EQ(f->spec.layer_mask().size(), n_star);
  EXPECT_EQ(f->spec.transform(), signature_transform::count);
  // Balanced: no cluster above ceil(213 / 8) = 27; the vanilla fit is reported alongside.
  for (uint32_t s : report["kmeans"]["balanced"]["cluster_sizes"])
    EXPECT_LE(s, 27u);
  EXPECT_TRUE(report["kmeans"].contains("vanilla"));
}

TEST_F(EldrFit, ForcedTransformAndSyntheticInputAreDeterministic) {
  const std::string cmd = fit_binary +
                          " --synthetic gpt-oss-task --requests 120 --workers 4 --seed 5"
                          " --transform count_idf --pairs 3000 --out ";
  const auto a = run_command(cmd + path("a.centroids") + " --report " + path("a.json"));
  const auto b = run_command(cmd + path("b.centroids"));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(b.exit_code, 0) << b.output;
  auto fa = read_centroid_file(path("a.centroids"));
  auto fb = read_centroid_file(path("b.centroids"));
  ASSERT_TRUE(fa.ok() && fb.ok());
  EXPECT_EQ(fa->spec.transform(), signature_transform::count_idf);
  EXPECT_EQ(fa->centroids, fb->centroids);
  EXPECT_EQ(fa->spec.layer_mask(), fb->spec.layer_mask());
  std::ifstream in(path("a.json"));
  const auto report = nlohmann::json::parse(in);
  EXPECT_EQ(report["transform_chosen_by"], "flag");
  EXPECT_EQ(report["model"]["layers"], 36);
}

// Issue 12: 3 requests gave "rho 1.0000" from 3 distinct pairs without a word.
TEST_F(EldrFit, ATraceTooSmallForItsPairsIsWarnedAboutAndTheDistinctPairsAreReported) {
  const auto r =
      run_command(fit_binary + " --synthetic qwen-task --requests 3 --workers 1 --seed 1 --out " +
                  path("tiny.centroids") + " --report " + path("tiny.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("warning: rho was measured on only 3 distinct pairs (30000 drawn; 3 "
                          "requests with decode tokens allow 3)"),
            std::string::npos)
      << r.output;
  std::ifstream in(path("tiny.json"));
  const auto report = nlohmann::json::parse(in);
  EXPECT_EQ(report["pairs"], 30000);
  EXPECT_EQ(report["pairs_distinct"], 3);
  EXPECT_EQ(report["pairs_possible"], 3);
  ASSERT_TRUE(report.contains("warnings")) << report.dump(2);
  EXPECT_NE(report["warnings"][0].get<std::string>().find("3 distinct pairs"), std::string::npos);

  // A trace large enough for its pairs says nothing.
  const auto ok = run_command(fit_binary +
                              " --synthetic qwen-task --requests 400 --workers 2 --pairs 2000"
                              " --model qwen3 --out " +
                              path("ok.centroids") + " --report " + path("ok.json"));
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_EQ(ok.output.find("warning"), std::string::npos) << ok.output;
  std::ifstream in2(path("ok.json"));
  const auto report2 = nlohmann::json::parse(in2);
  EXPECT_GE(report2["pairs_distinct"].get<uint64_t>(), 1800u);
  EXPECT_FALSE(report2.contains("warnings"));
}

// The centroid file's model name is what eldrctl centroids import checks against the node's
// model: --model sets it; without it the trace's description is used, and eldr-fit says so.
TEST_F(EldrFit, ModelNamesTheCentroidFileAndItsAbsenceIsWarnedAbout) {
  const std::string cmd = fit_binary + " --synthetic qwen-task --requests 60 --workers 2 --out ";
  const auto named = run_command(cmd + path("named.centroids") + " --model qwen3-30b-a3b");
  ASSERT_EQ(named.exit_code, 0) << named.output;
  EXPECT_EQ(named.output.find("no --model"), std::string::npos) << named.output;
  auto f = read_centroid_file(path("named.centroids"));
  ASSERT_TRUE(f.ok()) << f.error().to_string();
  EXPECT_EQ(f->model_name, "qwen3-30b-a3b");

  const auto unnamed = run_command(cmd + path("unnamed.centroids"));
  ASSERT_EQ(unnamed.exit_code, 0) << unnamed.output;
  EXPECT_NE(unnamed.output.find("warning: no --model: the centroid file names the model "
                                "\"synthetic, Qwen3-30B-A3B shape\", the trace's description"),
            std::string::npos)
      << unnamed.output;
  auto g = read_centroid_file(path("unnamed.centroids"));
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->model_name, "synthetic, Qwen3-30B-A3B shape");
}

TEST_F(EldrFit, BadInputStopsWithOneClearMessage) {
  struct bad_case {
    std::string args;
    std::string expect;
  };
  std::ofstream(path("garbage.eldrtrace")) << "not a trace";
  const std::vector<bad_case> cases = {
      {"--synthetic qwen-task --workers 4", "--out"},
      {"--trace " + path("missing.eldrtrace") + " --workers 4 --out x", "missing.eldrtrace"},
      {"--trace " + path("garbage.eldrtrace") + " --workers 4 --out " + path("x"), "garbage"},
      {"--synthetic no-such-preset --workers 4 --out " + path("x"), "no-such-preset"},
      {"--synthetic qwen-task --requests 10 --workers 64 --out " + path("x"), "--workers"},
      {"--synthetic qwen-task --requests 20 --workers 2 --transform gate --out " + path("x"),
       "gate"},
      {"--synthetic qwen-task --requests 20 --workers 2 --weights 1,2,3 --out " + path("x"),
       "--weights"},
  };
  for (const auto& c : cases) {
    const auto r = run_command(fit_binary + " " + c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_FALSE(fs::exists(path("x"))) << c.args;
  }
}

}  // namespace
}  // namespace eldr
