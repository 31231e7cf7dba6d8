// worker_protocol: every message round trips, dispatch by type, unknown keys ignored, required
// fields and wrong types named, every limit enforced, truncation at every byte offset refused.
#include "cluster/wire/worker_protocol.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/base/msgpack.hpp"
#include "tests/support/protocol_test_cases.hpp"

namespace eldr {
namespace {

using testing::expect_error;
using testing::map_payload;
using testing::message;

worker_register sample_register() {
  return {"m-1", "qwen3-30b-a3b", 3, "tcp://10.0.0.3:5600", 64, ""};
}
load_report sample_load() {
  load_report m;
  m.id = "m-2";
  m.model = "qwen3-30b-a3b";
  m.worker = 3;
  m.in_flight = 17;
  m.running = 12;
  m.waiting = 5;
  m.kv_usage = 0.625f;
  m.seq = 1ULL << 40;
  return m;
}
finished_requests sample_finished() {
  return {"m-3", "qwen3-30b-a3b", 3, {"req-1", "req-2"}};
}
worker_drain sample_drain() {
  return {"", "qwen3-30b-a3b", 3, false};
}
publisher_register sample_publisher() {
  return {"m-5", "qwen3-30b-a3b", "tcp://10.0.0.9:5557", "tcp://10.0.0.9:5558"};
}

std::vector<worker_message> samples() {
  return {sample_register(), sample_load(), sample_finished(), sample_drain(), sample_publisher()};
}

result<worker_message> decode(std::span<const uint8_t> b, const worker_protocol_limits& l = {}) {
  return decode_worker_message(b, l);
}

// A hand-written `type` message starting with the fields most of them require.
map_payload model_and_worker(std::string_view type, uint64_t worker = 1) {
  return message(type).str("model", "m").uint("worker", worker);
}

TEST(WorkerProtocol, EveryMessageRoundTrips) {
  for (const worker_message& m : samples()) {
    auto back = decode(encode_worker_message(m));
    ASSERT_TRUE(back.ok()) << back.error().to_string();
    ASSERT_EQ(back->index(), m.index());
    EXPECT_EQ(worker_message_type(*back), worker_message_type(m));
    EXPECT_EQ(worker_message_id(*back), worker_message_id(m));
  }
  const auto r = std::get<worker_register>(*decode(encode_worker_message(sample_register())));
  EXPECT_EQ(r.model, "qwen3-30b-a3b");
  EXPECT_EQ(r.worker, 3u);
  EXPECT_EQ(r.endpoint, "tcp://10.0.0.3:5600");
  EXPECT_EQ(r.capacity, 64u);

  const auto l = std::get<load_report>(*decode(encode_worker_message(sample_load())));
  EXPECT_EQ(l.in_flight, 17u);
  EXPECT_EQ(l.running, 12u);
  EXPECT_EQ(l.waiting, 5u);
  EXPECT_EQ(l.kv_usage, 0.625f);
  EXPECT_EQ(l.seq, 1ULL << 40);

  const auto f = std::get<finished_requests>(*decode(encode_worker_message(sample_finished())));
  EXPECT_EQ(f.requests, (std::vector<std::string>{"req-1", "req-2"}));
  EXPECT_EQ(f.worker, 3u);

  const auto d = std::get<worker_drain>(*decode(encode_worker_message(sample_drain())));
  EXPECT_FALSE(d.drain);
  EXPECT_EQ(d.id, "");

  const auto p = std::get<publisher_register>(*decode(encode_worker_message(sample_publisher())));
  EXPECT_EQ(p.endpoint, "tcp://10.0.0.9:5557");
  EXPECT_EQ(p.replay_endpoint, "tcp://10.0.0.9:5558");
  publisher_register no_replay = sample_publisher();
  no_replay.replay_endpoint.clear();
  const auto p2 = std::get<publisher_register>(*decode(encode_worker_message(no_replay)));
  EXPECT_EQ(p2.replay_endpoint, "");

  EXPECT_EQ(worker_message_type(sample_load()), "load_report");
  EXPECT_EQ(worker_message_type(sample_finished()), "finished");
}

TEST(WorkerProtocol, AckRoundTripsAndErrorRepliesAreAnotherType) {
  const worker_ack a{"m-1", "draining", 9};
  auto back = decode_worker_ack(encode_worker_ack(a), {});
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_EQ(*back, a);

  const worker_ack anonymous{"", "subscribed", 0};
  auto back2 = decode_worker_ack(encode_worker_ack(anonymous), {});
  ASSERT_TRUE(back2.ok()) << back2.error().to_string();
  EXPECT_EQ(*back2, anonymous);

  // An error_reply is route_protocol's, and the ack decoder names it as another type.
  const auto err = encode_error_reply({std::string("m-1"), wire_error_code::unknown_model, "x"});
  auto not_ack = decode_worker_ack(err, {});
  ASSERT_FALSE(not_ack.ok());
  EXPECT_EQ(not_ack.error().code(), status_code::not_found);
  auto e = decode_error_reply(err, {});
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->code, wire_error_code::unknown_model);

  // Nor is an ack a worker message, or a worker message an ack.
  EXPECT_EQ(decode(encode_worker_ack(a)).error().code(), status_code::not_found);
  EXPECT_EQ(decode_worker_ack(encode_worker_message(sample_drain()), {}).error().code(),
            status_code::not_found);
}

TEST(WorkerProtocol, UnknownTypeIsNotFound) {
  auto m = decode(message("route_request").str("model", "m").bytes());
  expect_error(m, status_code::not_found, "route_request");
  EXPECT_EQ(wire_error_for_decode(m.error()), wire_error_code::unknown_type);
}

TEST(WorkerProtocol, UnknownKeysAndNilOptionalsAreAccepted) {
  const auto future = [](msgpack::writer& w) {
    w.write_map_header(1);
    w.write_str("x");
    w.write_array_header(2);
    w.write_uint(1);
    w.write_str("y");
  };
  auto m = decode(message("load_report")
                      .value("future", future)
                      .nil("id")
                      .str("model", "m")
                      .uint("worker", 2)
                      .uint("in_flight", 4)
                      .uint("seq", 11)
                      .nil("running")
                      .nil("waiting")
                      .uint("kv_usage", 1)  // an integer is a number too
                      .bytes());
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  const auto& l = std::get<load_report>(*m);
  EXPECT_EQ(l.id, "");
  EXPECT_EQ(l.worker, 2u);
  EXPECT_EQ(l.in_flight, 4u);
  EXPECT_EQ(l.seq, 11u);
  EXPECT_EQ(l.running, 0u);
  EXPECT_EQ(l.kv_usage, 1.0f);

  // worker_register's capacity is optional (0 = unbounded).
  auto r = decode(message("worker_register")
                      .str("endpoint", "tcp://h:1")
                      .uint("worker", 0)
                      .str("model", "m")
                      .bytes());
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(std::get<worker_register>(*r).capacity, 0u);
}

TEST(WorkerProtocol, MissingRequiredFieldsAreNamed) {
  struct field_case {
    worker_message message;
    std::vector<std::string> required;
  };
  const std::vector<field_case> cases = {
      {sample_register(), {"model", "worker", "endpoint"}},
      {sample_load(), {"model", "worker", "in_flight", "seq"}},
      {sample_finished(), {"model", "worker", "requests"}},
      {sample_drain(), {"model", "worker", "drain"}},
      {sample_publisher(), {"model", "endpoint"}},
  };
  for (const field_case& c : cases) {
    const auto full = encode_worker_message(c.message);
    const std::string type(worker_message_type(c.message));
    for (const std::string& name : c.required) {
      // Re-encode the message without `name`: copy every other key/value pair.
      msgpack::reader r(full.data(), full.size());
      const uint32_t pairs = *r.read_map_header();
      std::vector<uint8_t> out;
      msgpack::writer w(out);
      w.write_map_header(pairs - 1);
      for (uint32_t i = 0; i < pairs; ++i) {
        const size_t key_at = r.offset();
        const std::string key(*r.read_str());
        ASSERT_TRUE(r.skip().ok());
        if (key != name) out.insert(out.end(), full.begin() + key_at, full.begin() + r.offset());
      }
      SCOPED_TRACE(type + " without " + name);
      expect_error(decode(out), status_code::invalid_argument, type + "." + name + ": missing");
    }
  }
  expect_error(decode(map_payload().uint("version", 1).bytes()), status_code::invalid_argument,
               "type: missing");
  expect_error(decode(map_payload().str("type", "finished").bytes()), status_code::invalid_argument,
               "version: missing");
  expect_error(decode_worker_ack(message("worker_ack").bytes(), {}), status_code::invalid_argument,
               "worker_ack.state: missing");
}

TEST(WorkerProtocol, WrongTypesAndValuesAreNamed) {
  struct bad_case {
    std::vector<uint8_t> bytes;
    status_code code;
    std::string fragment;
  };
  const auto two_requests = [](msgpack::writer& w) {
    w.write_array_header(2);
    w.write_str("a");
    w.write_uint(7);
  };
  std::vector<bad_case> cases = {
      {model_and_worker("worker_drain").uint("drain", 1).str("id", "x").bytes(),  // not a bool
       status_code::invalid_argument, "worker_drain.drain"},
      {model_and_worker("finished").value("requests", two_requests).bytes(),
       status_code::invalid_argument, "finished.requests[1]"},
      {message("publisher_register").str("model", "").str("endpoint", "tcp://h:1").bytes(),
       status_code::invalid_argument, "publisher_register.model: empty"},
      {model_and_worker("worker_register", 1ULL << 33).str("endpoint", "tcp://h:1").bytes(),
       status_code::invalid_argument, "worker_register.worker"},
  };
  for (double bad : {-0.5, 1.5, std::nan("")})
    cases.push_back({model_and_worker("load_report")
                         .uint("in_flight", 1)
                         .uint("seq", 1)
                         .f64("kv_usage", bad)
                         .bytes(),
                     status_code::invalid_argument, "load_report.kv_usage"});

  // Another version is failed_precondition; trailing bytes are corrupt; a non-map is refused.
  cases.push_back({map_payload().str("type", "finished").uint("version", 2).bytes(),
                   status_code::failed_precondition, "version"});
  auto trailing = encode_worker_message(sample_drain());
  trailing.push_back(0xc0);
  cases.push_back({trailing, status_code::corrupt, "trailing"});
  std::vector<uint8_t> not_a_map;
  msgpack::writer(not_a_map).write_array_header(0);
  cases.push_back({not_a_map, status_code::invalid_argument, "expected map"});

  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i) + ", expecting " + cases[i].fragment);
    expect_error(decode(cases[i].bytes), cases[i].code, cases[i].fragment);
  }
}

TEST(WorkerProtocol, EveryLimitIsEnforced) {
  using limits = worker_protocol_limits;
  const auto reg = encode_worker_message(sample_register());
  const auto ack = encode_worker_ack({"m-1", "active", 0});
  const auto publisher = encode_worker_message(sample_publisher());
  const auto finished = encode_worker_message(sample_finished());
  const auto decoding = [](const std::vector<uint8_t>& bytes) {
    return [&bytes](const limits& l) { return decode(bytes, l).error(); };
  };
  testing::expect_limits_enforced<limits>({
      {"payload", &limits::max_payload_bytes, static_cast<uint32_t>(reg.size() - 1), decoding(reg)},
      {"worker_register.id", &limits::max_id_bytes, 2, decoding(reg)},  // "m-1" is 3
      {"worker_ack.id", &limits::max_id_bytes, 2,
       [&](const limits& l) { return decode_worker_ack(ack, l).error(); }},
      {"worker_register.model", &limits::max_model_bytes, 4, decoding(reg)},
      {"worker_register.endpoint", &limits::max_endpoint_bytes, 5, decoding(reg)},
      {"publisher_register.endpoint", &limits::max_endpoint_bytes, 5, decoding(publisher)},
      {"finished.requests", &limits::max_finished, 1, decoding(finished)},
      // "req-1" is 5, the message id "m-3" fits
      {"finished.requests[0]", &limits::max_id_bytes, 4, decoding(finished)},
  });
  limits l;
  l.max_payload_bytes = static_cast<uint32_t>(reg.size() - 1);
  EXPECT_EQ(wire_error_for_decode(decode(reg, l).error()), wire_error_code::too_large);
}

TEST(WorkerProtocol, HostileLengthsDoNotAllocate) {
  const auto out =
      model_and_worker("finished")
          .value("requests", [](msgpack::writer& w) { w.write_array_header(UINT32_MAX); })
          .bytes();
  worker_protocol_limits l;
  l.max_finished = UINT32_MAX;
  expect_error(decode(out, l), status_code::corrupt, "");
}

TEST(WorkerProtocol, TruncationAtEveryOffsetIsAnError) {
  std::vector<std::vector<uint8_t>> all;
  for (const worker_message& m : samples())
    all.push_back(encode_worker_message(m));
  all.push_back(encode_worker_ack({"m-1", "active", 3}));
  testing::expect_truncations_refused(
      all, [](std::span<const uint8_t> b) { return decode(b); },
      [](std::span<const uint8_t> b) { return decode_worker_ack(b, {}); });
}

TEST(WorkerProtocol, RegisterCarriesAValidatedMetricsUrl) {
  worker_register m = sample_register();
  m.metrics_url = "http://10.0.0.3:8000/metrics";
  auto back = decode(encode_worker_message(m));
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_EQ(std::get<worker_register>(*back).metrics_url, "http://10.0.0.3:8000/metrics");
  // Absent (the encoder leaves an empty one out) or nil: none.
  auto plain = decode(encode_worker_message(sample_register()));
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(std::get<worker_register>(*plain).metrics_url, "");

  auto with_url = [](const std::function<void(msgpack::writer&)>& write_value) {
    return message("worker_register")
        .str("endpoint", "tcp://h:1")
        .uint("worker", 0)
        .str("model", "m")
        .value("metrics_url", write_value)
        .bytes();
  };
  auto nil = decode(with_url([](msgpack::writer& w) { w.write_nil(); }));
  ASSERT_TRUE(nil.ok()) << nil.error().to_string();
  EXPECT_EQ(std::get<worker_register>(*nil).metrics_url, "");

  for (const char* bad : {"https://h:1/metrics", "tcp://h:1", "http://u@h/", "http://h:0/",
                          "http://h/#x", "", "http://h/\"quoted\""}) {
    SCOPED_TRACE(bad);
    expect_error(decode(with_url([&](msgpack::writer& w) { w.write_str(bad); })),
                 status_code::invalid_argument, "worker_register.metrics_url");
  }
  expect_error(decode(with_url([](msgpack::writer& w) { w.write_uint(8000); })),
               status_code::invalid_argument, "worker_register.metrics_url");
  expect_error(decode(with_url(
                   [](msgpack::writer& w) { w.write_str("http://h/" + std::string(300, 'a')); })),
               status_code::out_of_range, "worker_register.metrics_url");
}

}  // namespace
}  // namespace eldr
