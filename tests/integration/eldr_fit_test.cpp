// eldr-fit as users run it: a real process on the real ESFT trace and on synthetic data, its
// centroid file and JSON report, and its errors on bad input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/centroid_file.hpp"
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
