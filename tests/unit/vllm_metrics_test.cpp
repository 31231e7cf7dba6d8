// vllm_metrics: vLLM's /metrics as prometheus_client writes it (docs/vllm.md section (c)), data
// parallel engines, the model selection, and malformed, hostile and oversized bodies.
#include "cluster/http/vllm_metrics.hpp"

#include <gtest/gtest.h>

#include <string>

namespace eldr {
namespace {

// As vLLM at 005a810b exposes it (help texts from vllm/v1/metrics/loggers.py), with the
// histogram and counter lines a scraper must skip.
const char* const one_engine =
    R"(# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-30B-A3B"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-30B-A3B"} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-30B-A3B"} 0.4375
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="Qwen/Qwen3-30B-A3B"} 12345.0
vllm:prompt_tokens_created{engine="0",model_name="Qwen/Qwen3-30B-A3B"} 1.7e+09
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="Qwen/Qwen3-30B-A3B"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-30B-A3B"} 7.0
python_gc_objects_collected_total{generation="0"} 1234.0
)";

TEST(VllmMetrics, ReadsOneEngine) {
  auto l = parse_vllm_metrics(one_engine, "Qwen/Qwen3-30B-A3B");
  ASSERT_TRUE(l.ok()) << l.error().to_string();
  EXPECT_EQ(l->running, 3u);
  EXPECT_EQ(l->waiting, 2u);
  EXPECT_EQ(l->in_flight(), 5u);
  EXPECT_FLOAT_EQ(l->kv_usage, 0.4375f);
}

TEST(VllmMetrics, TheOnlyModelWhateverItsName) {
  // eldr's model name need not be vLLM's served name: one vLLM serves one model.
  auto l = parse_vllm_metrics(one_engine, "qwen3");
  ASSERT_TRUE(l.ok()) << l.error().to_string();
  EXPECT_EQ(l->in_flight(), 5u);
}

TEST(VllmMetrics, SumsDataParallelEnginesAndTakesFullestUsage) {
  const std::string body =
      "vllm:num_requests_running{model_name=\"m\",engine=\"0\"} 4\n"
      "vllm:num_requests_running{model_name=\"m\",engine=\"1\"} 6\r\n"
      "vllm:num_requests_waiting{engine=\"0\", model_name=\"m\"} 1 1700000000000\n"
      "vllm:num_requests_waiting{model_name=\"m\",engine=\"1\",} 0\n"
      "vllm:gpu_cache_usage_perc{model_name=\"m\",engine=\"0\"} 0.25\n"
      "vllm:gpu_cache_usage_perc{model_name=\"m\",engine=\"1\"} 0.75";  // no final newline
  auto l = parse_vllm_metrics(body, "m");
  ASSERT_TRUE(l.ok()) << l.error().to_string();
  EXPECT_EQ(l->running, 10u);
  EXPECT_EQ(l->waiting, 1u);
  EXPECT_FLOAT_EQ(l->kv_usage, 0.75f);
}

TEST(VllmMetrics, PicksTheNamedModelAmongSeveral) {
  const std::string body =
      "vllm:num_requests_running{model_name=\"a\"} 1\n"
      "vllm:num_requests_waiting{model_name=\"a\"} 1\n"
      "vllm:num_requests_running{model_name=\"b\\\"q\\\\\"} 7\n"
      "vllm:num_requests_waiting{model_name=\"b\\\"q\\\\\"} 0\n";
  auto b = parse_vllm_metrics(body, "b\"q\\");
  ASSERT_TRUE(b.ok()) << b.error().to_string();
  EXPECT_EQ(b->running, 7u);
  auto none = parse_vllm_metrics(body, "c");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code(), status_code::invalid_argument);
}

TEST(VllmMetrics, MissingGaugesAreNotFound) {
  auto l = parse_vllm_metrics("vllm:num_requests_running{model_name=\"m\"} 1\n", "m");
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.error().code(), status_code::not_found);
  EXPECT_NE(l.error().message().find("vllm:num_requests_waiting"), std::string::npos);
  EXPECT_FALSE(parse_vllm_metrics("", "m").ok());
  EXPECT_FALSE(parse_vllm_metrics("<html>502 Bad Gateway</html>", "m").ok());
}

TEST(VllmMetrics, MalformedGaugeLinesNameTheLine) {
  const char* bad[] = {
      "vllm:num_requests_running{model_name=\"m\" 1\n",
      "vllm:num_requests_running{model_name=m} 1\n",
      "vllm:num_requests_running{model_name=\"m\\x\"} 1\n",
      "vllm:num_requests_running{model_name=\"m\"}\n",
      "vllm:num_requests_running{model_name=\"m\"} \n",
      "vllm:num_requests_running{model_name=\"m\"} NaN\n",
      "vllm:num_requests_running{model_name=\"m\"} +Inf\n",
      "vllm:num_requests_running{model_name=\"m\"} -1\n",
      "vllm:num_requests_running{model_name=\"m\"} 1x\n",
      "vllm:num_requests_running{model_name=\"m\"} 0x10\n",
      "vllm:num_requests_running{model_name=\"m\"} 1e999\n",
      "vllm:num_requests_running{=\"m\"} 1\n",
      "vllm:num_requests_running{model_name=\"unterminated",
      "vllm:num_requests_running1\n",
  };
  for (const char* b : bad) {
    auto l = parse_vllm_metrics(std::string("# ok\n") + b, "m");
    ASSERT_FALSE(l.ok()) << b;
    if (l.error().code() == status_code::corrupt) {
      EXPECT_NE(l.error().message().find("line 2"), std::string::npos) << l.error().message();
    }
  }
}

TEST(VllmMetrics, HugeValuesSaturate) {
  auto l = parse_vllm_metrics(
      "vllm:num_requests_running 1e12\nvllm:num_requests_waiting 4294967295\n", "m");
  ASSERT_TRUE(l.ok()) << l.error().to_string();
  EXPECT_EQ(l->running, 4294967295u);
  EXPECT_EQ(l->in_flight(), 4294967295u);
}

TEST(VllmMetrics, OversizedBodyRefused) {
  std::string body(1000, '#');
  auto l = parse_vllm_metrics(body, "m", 999);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.error().code(), status_code::out_of_range);
  // A huge body of unrelated lines is read without trouble.
  std::string big;
  for (int i = 0; i < 20000; ++i)
    big += "other_metric{a=\"" + std::to_string(i) + "\"} 1\n";
  big += "vllm:num_requests_running 2\nvllm:num_requests_waiting 3\n";
  auto ok = parse_vllm_metrics(big, "m");
  ASSERT_TRUE(ok.ok()) << ok.error().to_string();
  EXPECT_EQ(ok->in_flight(), 5u);
}

}  // namespace
}  // namespace eldr
