// eldr-sim as a process: the documented interface, summary.csv, determinism given the seed, and
// one clear message with a non-zero exit for bad input.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/formats/trace.hpp"
#include "tests/support/test_data.hpp"

namespace {

namespace fs = std::filesystem;

const std::string sim_binary = std::string(ELDR_BINARY_DIR) + "/tools/eldr-sim/eldr-sim";
const std::string fit_binary = std::string(ELDR_BINARY_DIR) + "/tools/eldr-fit/eldr-fit";

struct run_result {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

run_result run(const std::string& args) {
  run_result r;
  FILE* p = popen((sim_binary + " " + args + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  std::size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0)
    r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class EldrSim : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("eldr-sim-test-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

// A small synthetic run: few requests, short prompts and outputs, 4 decode workers.
const std::string small =
    "--synthetic qwen-task --requests 120 --calibration-requests 60 --output-tokens 8 "
    "--prompt-max 32 --decode-workers 4 --prefill-workers 2 --pairs 300 --rate 60 --quiet ";

TEST_F(EldrSim, WritesOneSummaryRowPerPolicyAndIsDeterministic) {
  const std::string policies = "--policies rr,random,jsq,p2c,domain,eldr,eldr-online ";
  const run_result a = run(small + policies + "--seed 5 --out " + (dir_ / "a").string());
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const run_result b = run(small + policies + "--seed 5 --out " + (dir_ / "b").string());
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const std::string csv = read_all(dir_ / "a" / "summary.csv");
  EXPECT_EQ(csv.rfind("policy,tpot_p50_ms,tpot_p99_ms,ttft_p50_ms,distinct_experts_per_layer", 0),
            0u)
      << csv;
  std::istringstream lines(csv);
  std::string line;
  std::getline(lines, line);
  std::vector<std::string> names;
  while (std::getline(lines, line))
    names.push_back(line.substr(0, line.find(',')));
  EXPECT_EQ(names, (std::vector<std::string>{"rr", "random", "jsq", "p2c", "domain", "eldr",
                                             "eldr-online"}));
  EXPECT_EQ(csv, read_all(dir_ / "b" / "summary.csv"));
  EXPECT_TRUE(fs::exists(dir_ / "a" / "summary.md"));
  EXPECT_TRUE(fs::exists(dir_ / "a" / "fit.json"));
}

// summary.md's verdict per locality policy and rate: the p99 next to the median, and "loses"
// exactly when either is worse than the best load balancer's by more than the tolerance (1%
// median, 2% p99), recomputed here from summary.csv.
TEST_F(EldrSim, SummaryVerdictReportsTheP99AndLosesWhenEitherLoses) {
  std::string args = small;
  args.replace(args.find("--rate 60"), 9, "--rate 20,60");
  const run_result r =
      run(args + "--policies rr,jsq,eldr,eldr-adaptive --seed 5 --out " + (dir_ / "v").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::istringstream csv(read_all(dir_ / "v" / "summary.csv"));
  std::string line;
  std::getline(csv, line);
  struct row {
    std::string policy, rate;
    double p50 = 0, p99 = 0;
  };
  std::vector<row> rows;
  while (std::getline(csv, line)) {
    std::vector<std::string> cells;
    std::stringstream cs(line);
    std::string cell;
    while (std::getline(cs, cell, ','))
      cells.push_back(cell);
    ASSERT_GE(cells.size(), 12u) << line;
    rows.push_back({cells[0], cells[11], std::stod(cells[1]), std::stod(cells[2])});
  }
  ASSERT_EQ(rows.size(), 8u);
  const std::string md = read_all(dir_ / "v" / "summary.md");
  const std::string verdicts = read_all(dir_ / "v" / "verdicts.csv");
  int verdict_rows = 0;
  for (const char* rate : {"20.00", "60.00"}) {
    double b50 = 1e300, b99 = 1e300;
    for (const row& x : rows)
      if (x.rate == rate && (x.policy == "rr" || x.policy == "jsq")) {
        b50 = std::min(b50, x.p50);
        b99 = std::min(b99, x.p99);
      }
    for (const row& x : rows) {
      if (x.rate != rate || x.policy.rfind("eldr", 0) != 0) continue;
      const std::string head = "- " + std::string(rate).substr(0, 4) + " req/s, " + x.policy + ":";
      const std::size_t at = md.find(head);
      ASSERT_NE(at, std::string::npos) << head << "\n" << md;
      const std::string verdict = md.substr(at, md.find('\n', at) - at);
      EXPECT_NE(verdict.find("; p99 "), std::string::npos) << verdict;
      const bool loses = x.p50 > b50 * 1.01 || x.p99 > b99 * 1.02;
      EXPECT_EQ(verdict.find("**loses**") != std::string::npos, loses) << verdict;
      EXPECT_EQ(verdict.find("does not lose") != std::string::npos, !loses) << verdict;
      // verdicts.csv has the same verdict, one row per locality policy and rate.
      const std::string csv_head = std::string(rate) + "," + x.policy + ",";
      const std::size_t row_at = verdicts.find("\n" + csv_head);
      ASSERT_NE(row_at, std::string::npos) << csv_head << "\n" << verdicts;
      const std::string csv_row =
          verdicts.substr(row_at + 1, verdicts.find('\n', row_at + 1) - row_at - 1);
      EXPECT_EQ(csv_row.ends_with(",does not lose"), !loses) << csv_row;
      EXPECT_EQ(csv_row.find(",loses on ") != std::string::npos, loses) << csv_row;
      ++verdict_rows;
    }
  }
  EXPECT_EQ(verdict_rows, 4);
  EXPECT_EQ(std::count(verdicts.begin(), verdicts.end(), '\n'), 1 + verdict_rows) << verdicts;
}

TEST_F(EldrSim, HelpDocumentsEveryInterfaceFlag) {
  const run_result r = run("--help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* flag : {"--trace", "--policies", "--rate", "--decode-workers",
                           "--prefill-workers", "--requests", "--seed", "--out", "--centroids"})
    EXPECT_NE(r.output.find(flag), std::string::npos) << flag;
}

TEST_F(EldrSim, BadInputStopsWithOneClearMessage) {
  const std::string out = " --out " + (dir_ / "o").string();
  struct bad_case {
    std::string args, expected;
  };
  const fs::path garbage = dir_ / "garbage.eldrtrace";
  std::ofstream(garbage) << "not a trace";
  const bad_case cases[] = {
      {small + "--no-such-flag", "no-such-flag"},
      {small + "--policies rr,best", "unknown policy \"best\""},
      {small + "--policies eldr/tau=x", "tau"},
      {"--trace " + (dir_ / "missing.eldrtrace").string(), "missing.eldrtrace"},
      {"--trace " + garbage.string(), "garbage.eldrtrace"},
  };
  for (const bad_case& c : cases) {
    const run_result r = run(c.args + out);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_NE(r.output.find(c.expected), std::string::npos) << c.args << "\n" << r.output;
  }
}

TEST_F(EldrSim, RejectsACentroidFileOfAnotherModel) {
  const fs::path centroids = dir_ / "gptoss.centroids";
  const std::string fit = fit_binary +
                          " --synthetic gpt-oss-task --requests 60 --workers 4 --pairs 200 "
                          "--out " +
                          centroids.string() + " > /dev/null 2>&1";
  ASSERT_EQ(std::system(fit.c_str()), 0);
  const run_result r =
      run(small + "--centroids " + centroids.string() + " --out " + (dir_ / "o").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("centroid file is for a model of L=36"), std::string::npos) << r.output;
}

TEST_F(EldrSim, ReplaysTheRealEsftTrace) {
  ELDR_REQUIRE_SHARED_DATA(path, "esft-deepseek-v2-lite.eldrtrace");
  const run_result r =
      run("--trace " + path +
          " --requests 300 --decode-workers 4 --prefill-workers 2 --rate 20 --pairs 2000 "
          "--policies rr,jsq,domain,eldr,clairvoyant --quiet --out " +
          (dir_ / "esft").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string csv = read_all(dir_ / "esft" / "summary.csv");
  EXPECT_NE(csv.find("\nclairvoyant,"), std::string::npos) << csv;
}

}  // namespace
