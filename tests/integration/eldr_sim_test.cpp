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
  for (const char* flag :
       {"--trace", "--policies", "--rate", "--decode-workers", "--prefill-workers", "--requests",
        "--seed", "--out", "--centroids", "--routers", "--load-sync-ms", "--load-sync-lag",
        "--drift-phases", "--refit-sample-horizon"})
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
      {small + "--routers 0", "--routers"},
      {small + "--load-sync-ms -1", "--load-sync-ms"},
      {small + "--load-sync-ms inf", "--load-sync-ms"},
      {small + "--load-sync-lag 17", "--load-sync-lag"},
      {small + "--refit-sample-size 64 --refit-sample-horizon 63", "--refit-sample-horizon"},
      {small + "--drift-phases 65", "--drift-phases"},
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

// The first 16 columns of summary.csv of the one-router simulator before several routers were
// modelled (commit 52b9314), for RUN_ONE_ROUTER below on the real ESFT trace: with one router,
// at any sharing interval, eldr-sim must reproduce them exactly.
const std::string one_router_before =
    "policy,tpot_p50_ms,tpot_p99_ms,ttft_p50_ms,distinct_experts_per_layer,tpot_p95_ms,ttft_p99_ms,"
    "load_imbalance,throughput_tokens_s,throughput_requests_s,batch_size_mean,rate_rps,requests,"
    "decode_steps,refits,prefix_hit_fraction\n"
    "rr,7.564,8.549,41.181,10.334,8.311,80.212,1.2618,3210.6,40.608,1.85,50.00,600,25589,0,0.0000\n"
    "random,7.787,8.984,41.849,11.257,8.714,79.632,1.3967,3221.4,40.745,2.08,50.00,600,22766,0,0."
    "0000\n"
    "jsq,7.545,8.024,40.982,9.948,7.978,79.747,1.2085,3207.9,40.575,1.76,50.00,600,26963,0,0.0000\n"
    "p2c,7.620,8.308,41.364,10.421,8.098,78.946,1.3444,3224.2,40.781,1.87,50.00,600,25404,0,0."
    "0000\n"
    "eldr,7.272,9.169,36.256,11.151,8.948,79.498,2.4703,3195.3,40.415,2.20,50.00,600,21565,0,0."
    "0000\n"
    "eldr-adaptive,7.547,8.021,40.862,10.009,7.983,79.298,1.1053,3218.4,40.707,1.77,50.00,600,"
    "26813,0,0.0000\n"
    "eldr-online,7.411,8.831,39.356,10.752,8.498,81.168,1.6291,3178.9,40.207,2.04,50.00,600,23288,"
    "7,0.0000\n"
    "eldr-adaptive-online,7.547,8.021,40.862,10.009,7.983,79.298,1.1053,3218.4,40.707,1.77,50.00,"
    "600,26813,7,0.0000\n"
    "rr,9.954,10.998,337.009,21.977,10.711,645.782,1.2834,8822.6,111.592,5.50,400.00,600,8619,0,0."
    "0000\n"
    "random,9.978,11.176,337.582,23.258,10.827,647.689,1.3384,8541.0,108.029,5.93,400.00,600,8000,"
    "0,0.0000\n"
    "jsq,10.024,10.614,338.981,23.410,10.522,650.515,1.2362,8539.7,108.013,5.86,400.00,600,8095,0,"
    "0.0000\n"
    "p2c,9.955,10.719,335.546,22.377,10.624,647.667,1.3441,8774.4,110.981,5.61,400.00,600,8456,0,0."
    "0000\n"
    "eldr,8.673,11.883,335.122,24.844,11.704,646.837,2.4416,7736.1,97.849,7.75,400.00,600,6118,0,0."
    "0000\n"
    "eldr-adaptive,9.733,10.547,337.927,24.364,10.389,646.768,1.7741,7925.2,100.241,6.52,400.00,"
    "600,7272,0,0.0000\n"
    "eldr-online,8.841,11.137,338.585,25.382,10.996,646.285,2.2929,7555.0,95.559,7.71,400.00,600,"
    "6149,1,0.0000\n"
    "eldr-adaptive-online,9.716,10.628,337.133,25.522,10.400,644.076,1.8177,7938.6,100.410,6.90,"
    "400.00,600,6877,1,0.0000\n";
const std::string one_router_run =
    " --requests 600 --rate 50,400 --policies "
    "rr,random,jsq,p2c,eldr,eldr-adaptive,eldr-online,eldr-adaptive-online --refit-interval-s 0.5 "
    "--refit-min-sample 32 --seed 1 --quiet ";

// summary.csv's rows cut to their first `columns` columns, and the named ones only (all when
// `keep` is empty).
std::string first_columns(const std::string& csv, int columns,
                          const std::vector<std::string>& keep = {}) {
  std::istringstream lines(csv);
  std::string line, out;
  bool header = true;
  while (std::getline(lines, line)) {
    const std::string name = line.substr(0, line.find(','));
    const bool kept = header || keep.empty() || std::count(keep.begin(), keep.end(), name) > 0;
    header = false;
    if (!kept) continue;
    std::size_t end = 0;
    for (int c = 0; c < columns && end != std::string::npos; ++c)
      end = line.find(',', end == 0 ? 0 : end + 1);
    out += line.substr(0, end) + "\n";
  }
  return out;
}

TEST_F(EldrSim, OneRouterReproducesTheOneRouterSimulatorOnTheRealTrace) {
  ELDR_REQUIRE_SHARED_DATA(path, "esft-deepseek-v2-lite.eldrtrace");
  for (const char* sync : {"5", "50"}) {
    const fs::path out = dir_ / (std::string("one-") + sync);
    const run_result r = run("--trace " + path + one_router_run + "--routers 1 --load-sync-ms " +
                             sync + " --out " + out.string());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string csv = read_all(out / "summary.csv");
    EXPECT_EQ(first_columns(csv, 16), one_router_before) << sync;
    EXPECT_NE(csv.find("inflight_imbalance,decision_cv,routers,load_sync_ms\n"), std::string::npos)
        << csv;
  }
  // Two routers with exact views decide as one for the policies without state of their own
  // (jsq, eldr, and eldr-online, whose refit is installed in both routers); round-robin's two
  // cursors do not.
  const fs::path two = dir_ / "two-exact";
  const run_result r = run("--trace " + path + one_router_run +
                           "--routers 2 --load-sync-ms 0 --out " + two.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string csv = read_all(two / "summary.csv");
  const std::vector<std::string> stateless{"jsq", "eldr", "eldr-online"};
  EXPECT_EQ(first_columns(csv, 16, stateless), first_columns(one_router_before, 16, stateless));
  EXPECT_NE(first_columns(csv, 16, {"rr"}), first_columns(one_router_before, 16, {"rr"}));
}

// Four routers that share the load every 50 ms and count only their own decisions herd on JSQ
// where one router does not: the in-flight imbalance column grows. With the peer estimate (the
// default, as in the node) they herd less. summary.md says how the routers were run.
TEST_F(EldrSim, StaleRoutersShowInTheImbalanceColumns) {
  ELDR_REQUIRE_SHARED_DATA(path, "esft-deepseek-v2-lite.eldrtrace");
  auto inflight = [&](const std::string& cluster, const fs::path& out) {
    const run_result r =
        run("--trace " + path + " --requests 600 --rate 200 --policies jsq --seed 1 --quiet " +
            cluster + " --out " + out.string());
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::istringstream lines(read_all(out / "summary.csv"));
    std::string line;
    std::getline(lines, line);
    std::getline(lines, line);
    std::vector<std::string> cells;
    std::stringstream cs(line);
    std::string cell;
    while (std::getline(cs, cell, ','))
      cells.push_back(cell);
    EXPECT_EQ(cells.size(), 20u) << line;
    return cells.size() == 20u ? std::stod(cells[16]) : 0.0;
  };
  const double one = inflight("--routers 1", dir_ / "one");
  const double own =
      inflight("--routers 4 --load-sync-ms 50 --no-peer-estimate", dir_ / "four-own");
  const double four = inflight("--routers 4 --load-sync-ms 50", dir_ / "four");
  EXPECT_GT(own, one * 1.05) << one << " " << own;
  EXPECT_LT(four, own) << one << " " << own << " " << four;
  EXPECT_EQ(read_all(dir_ / "four-own" / "summary.md")
                .rfind("4 routers, the load shared every 50.000 ms of simulated time, no peer "
                       "estimate.",
                       0),
            0u);
  EXPECT_EQ(read_all(dir_ / "four" / "summary.md")
                .rfind("4 routers, the load shared every 50.000 ms of simulated time, peers' "
                       "decisions estimated.",
                       0),
            0u);
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
