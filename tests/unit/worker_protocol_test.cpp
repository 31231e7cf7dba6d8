// worker_protocol: every message round trips, dispatch by type, unknown keys ignored, required
// fields and wrong types named, every limit enforced, truncation at every byte offset refused.
#include "cluster/wire/worker_protocol.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/base/msgpack.hpp"

namespace eldr {
namespace {

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

void envelope(msgpack::writer& w, uint32_t fields, std::string_view type) {
  w.write_map_header(fields + 2);
  w.write_str("version");
  w.write_uint(1);
  w.write_str("type");
  w.write_str(type);
}

result<worker_message> decode(std::span<const uint8_t> b, const worker_protocol_limits& l = {}) {
  return decode_worker_message(b, l);
}

void expect_error(const status& s, status_code code, std::string_view text) {
  EXPECT_EQ(s.code(), code) << s.to_string();
  EXPECT_NE(s.message().find(text), std::string::npos) << s.message();
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
  std::vector<uint8_t> out;
  msgpack::writer w(out);
  envelope(w, 1, "route_request");
  w.write_str("model");
  w.write_str("m");
  auto m = decode(out);
  ASSERT_FALSE(m.ok());
  expect_error(m.error(), status_code::not_found, "route_request");
  EXPECT_EQ(wire_error_for_decode(m.error()), wire_error_code::unknown_type);
}

TEST(WorkerProtocol, UnknownKeysAndNilOptionalsAreAccepted) {
  std::vector<uint8_t> out;
  msgpack::writer w(out);
  envelope(w, 9, "load_report");
  w.write_str("future");
  w.write_map_header(1);
  w.write_str("x");
  w.write_array_header(2);
  w.write_uint(1);
  w.write_str("y");
  w.write_str("id");
  w.write_nil();
  w.write_str("model");
  w.write_str("m");
  w.write_str("worker");
  w.write_uint(2);
  w.write_str("in_flight");
  w.write_uint(4);
  w.write_str("seq");
  w.write_uint(11);
  w.write_str("running");
  w.write_nil();
  w.write_str("waiting");
  w.write_nil();
  w.write_str("kv_usage");
  w.write_uint(1);  // an integer is a number too
  auto m = decode(out);
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  const auto& l = std::get<load_report>(*m);
  EXPECT_EQ(l.id, "");
  EXPECT_EQ(l.worker, 2u);
  EXPECT_EQ(l.in_flight, 4u);
  EXPECT_EQ(l.seq, 11u);
  EXPECT_EQ(l.running, 0u);
  EXPECT_EQ(l.kv_usage, 1.0f);

  // worker_register's capacity is optional (0 = unbounded).
  out.clear();
  envelope(w, 3, "worker_register");
  w.write_str("endpoint");
  w.write_str("tcp://h:1");
  w.write_str("worker");
  w.write_uint(0);
  w.write_str("model");
  w.write_str("m");
  auto r = decode(out);
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
      auto m = decode(out);
      ASSERT_FALSE(m.ok()) << type << " without " << name;
      expect_error(m.error(), status_code::invalid_argument, type + "." + name + ": missing");
    }
  }
  std::vector<uint8_t> out;
  msgpack::writer w(out);
  w.write_map_header(1);
  w.write_str("version");
  w.write_uint(1);
  expect_error(decode(out).error(), status_code::invalid_argument, "type: missing");
  out.clear();
  w.write_map_header(1);
  w.write_str("type");
  w.write_str("finished");
  expect_error(decode(out).error(), status_code::invalid_argument, "version: missing");
  out.clear();
  envelope(w, 0, "worker_ack");
  expect_error(decode_worker_ack(out, {}).error(), status_code::invalid_argument,
               "worker_ack.state: missing");
}

TEST(WorkerProtocol, WrongTypesAndValuesAreNamed) {
  std::vector<uint8_t> out;
  msgpack::writer w(out);
  envelope(w, 4, "worker_drain");
  w.write_str("model");
  w.write_str("m");
  w.write_str("worker");
  w.write_uint(1);
  w.write_str("drain");
  w.write_uint(1);  // not a bool
  w.write_str("id");
  w.write_str("x");
  expect_error(decode(out).error(), status_code::invalid_argument, "worker_drain.drain");

  out.clear();
  envelope(w, 3, "finished");
  w.write_str("model");
  w.write_str("m");
  w.write_str("worker");
  w.write_uint(1);
  w.write_str("requests");
  w.write_array_header(2);
  w.write_str("a");
  w.write_uint(7);
  expect_error(decode(out).error(), status_code::invalid_argument, "finished.requests[1]");

  out.clear();
  envelope(w, 2, "publisher_register");
  w.write_str("model");
  w.write_str("");
  w.write_str("endpoint");
  w.write_str("tcp://h:1");
  expect_error(decode(out).error(), status_code::invalid_argument,
               "publisher_register.model: empty");

  out.clear();
  envelope(w, 3, "worker_register");
  w.write_str("model");
  w.write_str("m");
  w.write_str("worker");
  w.write_uint(1ULL << 33);
  w.write_str("endpoint");
  w.write_str("tcp://h:1");
  expect_error(decode(out).error(), status_code::invalid_argument, "worker_register.worker");

  for (double bad : {-0.5, 1.5, std::nan("")}) {
    out.clear();
    envelope(w, 5, "load_report");
    w.write_str("model");
    w.write_str("m");
    w.write_str("worker");
    w.write_uint(1);
    w.write_str("in_flight");
    w.write_uint(1);
    w.write_str("seq");
    w.write_uint(1);
    w.write_str("kv_usage");
    w.write_float64(bad);
    expect_error(decode(out).error(), status_code::invalid_argument, "load_report.kv_usage");
  }

  // Another version is failed_precondition; trailing bytes are corrupt; a non-map is refused.
  out.clear();
  w.write_map_header(2);
  w.write_str("type");
  w.write_str("finished");
  w.write_str("version");
  w.write_uint(2);
  expect_error(decode(out).error(), status_code::failed_precondition, "version");
  auto bytes = encode_worker_message(sample_drain());
  bytes.push_back(0xc0);
  expect_error(decode(bytes).error(), status_code::corrupt, "trailing");
  out.clear();
  w.write_array_header(0);
  expect_error(decode(out).error(), status_code::invalid_argument, "expected map");
}

TEST(WorkerProtocol, EveryLimitIsEnforced) {
  worker_protocol_limits l;
  const auto reg = encode_worker_message(sample_register());
  l.max_payload_bytes = static_cast<uint32_t>(reg.size() - 1);
  expect_error(decode(reg, l).error(), status_code::out_of_range, "payload");
  EXPECT_EQ(wire_error_for_decode(decode(reg, l).error()), wire_error_code::too_large);

  l = {};
  l.max_id_bytes = 2;  // "m-1" is 3
  expect_error(decode(reg, l).error(), status_code::out_of_range, "worker_register.id");
  expect_error(decode_worker_ack(encode_worker_ack({"m-1", "active", 0}), l).error(),
               status_code::out_of_range, "worker_ack.id");
  l = {};
  l.max_model_bytes = 4;
  expect_error(decode(reg, l).error(), status_code::out_of_range, "worker_register.model");
  l = {};
  l.max_endpoint_bytes = 5;
  expect_error(decode(reg, l).error(), status_code::out_of_range, "worker_register.endpoint");
  expect_error(decode(encode_worker_message(sample_publisher()), l).error(),
               status_code::out_of_range, "publisher_register.endpoint");
  l = {};
  l.max_finished = 1;
  expect_error(decode(encode_worker_message(sample_finished()), l).error(),
               status_code::out_of_range, "finished.requests");
  l = {};
  l.max_id_bytes = 4;  // "req-1" is 5, the message id "m-3" fits
  expect_error(decode(encode_worker_message(sample_finished()), l).error(),
               status_code::out_of_range, "finished.requests[0]");
}

TEST(WorkerProtocol, HostileLengthsDoNotAllocate) {
  std::vector<uint8_t> out;
  msgpack::writer w(out);
  envelope(w, 3, "finished");
  w.write_str("model");
  w.write_str("m");
  w.write_str("worker");
  w.write_uint(1);
  w.write_str("requests");
  w.write_array_header(UINT32_MAX);
  worker_protocol_limits l;
  l.max_finished = UINT32_MAX;
  auto m = decode(out, l);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().code(), status_code::corrupt);
}

TEST(WorkerProtocol, TruncationAtEveryOffsetIsAnError) {
  std::vector<std::vector<uint8_t>> all;
  for (const worker_message& m : samples())
    all.push_back(encode_worker_message(m));
  all.push_back(encode_worker_ack({"m-1", "active", 3}));
  for (const auto& bytes : all) {
    for (size_t n = 0; n < bytes.size(); ++n) {
      const std::span<const uint8_t> cut(bytes.data(), n);
      EXPECT_FALSE(decode(cut).ok()) << n;
      EXPECT_FALSE(decode_worker_ack(cut, {}).ok()) << n;
    }
  }
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

  auto with_url = [](auto write_value) {
    std::vector<uint8_t> out;
    msgpack::writer w(out);
    envelope(w, 4, "worker_register");
    w.write_str("endpoint");
    w.write_str("tcp://h:1");
    w.write_str("worker");
    w.write_uint(0);
    w.write_str("model");
    w.write_str("m");
    w.write_str("metrics_url");
    write_value(w);
    return out;
  };
  auto nil = decode(with_url([](msgpack::writer& w) { w.write_nil(); }));
  ASSERT_TRUE(nil.ok()) << nil.error().to_string();
  EXPECT_EQ(std::get<worker_register>(*nil).metrics_url, "");

  for (const char* bad : {"https://h:1/metrics", "tcp://h:1", "http://u@h/", "http://h:0/",
                          "http://h/#x", "", "http://h/\"quoted\""}) {
    auto r = decode(with_url([&](msgpack::writer& w) { w.write_str(bad); }));
    ASSERT_FALSE(r.ok()) << bad;
    expect_error(r.error(), status_code::invalid_argument, "worker_register.metrics_url");
  }
  auto number = decode(with_url([](msgpack::writer& w) { w.write_uint(8000); }));
  ASSERT_FALSE(number.ok());
  expect_error(number.error(), status_code::invalid_argument, "worker_register.metrics_url");
  auto long_url = decode(
      with_url([](msgpack::writer& w) { w.write_str("http://h/" + std::string(300, 'a')); }));
  ASSERT_FALSE(long_url.ok());
  expect_error(long_url.error(), status_code::out_of_range, "worker_register.metrics_url");
}

}  // namespace
}  // namespace eldr
