// Strings and arguments from clients, checked where they enter: UTF-8 and lengths in every
// decoder, the endpoint charset and schemes, admin arguments that must be unsigned integers or
// strings (never converted), Prometheus label values escaped, and the reply byte cap's key.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cluster/config/node_config.hpp"
#include "cluster/wire/admin_protocol.hpp"
#include "cluster/wire/route_protocol.hpp"
#include "cluster/wire/wire_fields.hpp"
#include "cluster/wire/worker_protocol.hpp"
#include "core/base/metrics.hpp"
#include "core/base/utf8.hpp"
#include "tests/support/refused_registrations.hpp"

namespace eldr {
namespace {

using nlohmann::json;

const std::string not_utf8 = "pub\xff\xfe";
const std::string overlong = "a\xc0\xaf";      // '/' written in two bytes
const std::string surrogate = "\xed\xa0\x80";  // U+D800
const std::string truncated = "ok\xe2\x82";    // the start of a three-byte sequence

TEST(Utf8, FindsTheFirstBadByteAndReplacesEachOne) {
  EXPECT_EQ(utf8_error_at("plain"), 5u);
  EXPECT_EQ(utf8_error_at("\xc3\xa9t\xc3\xa9 \xf0\x9f\x98\x80"), 10u);  // "été 😀"
  EXPECT_EQ(utf8_error_at(not_utf8), 3u);
  EXPECT_EQ(utf8_error_at(overlong), 1u);
  EXPECT_EQ(utf8_error_at(surrogate), 0u);
  EXPECT_EQ(utf8_error_at(truncated), 2u);
  EXPECT_EQ(utf8_error_at("\xf4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(utf8_replacing(not_utf8), "pub\xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_EQ(utf8_replacing("\xc3\xa9"), "\xc3\xa9");
  EXPECT_TRUE(valid_utf8(utf8_replacing(truncated)));
}

route_request request(std::string id, std::string model = "m") {
  route_request r;
  r.id = std::move(id);
  r.model = std::move(model);
  r.block_hashes = {1};
  return r;
}

// The decode error of a route request, as the frontend answers it: code and message.
std::pair<wire_error_code, std::string> route_error(const route_request& r) {
  std::vector<kv_decode_issue> issues;
  auto d = decode_route_request(encode_route_request(r), route_protocol_limits{}, issues);
  EXPECT_FALSE(d.ok());
  if (d.ok()) return {wire_error_code::internal, ""};
  return {wire_error_for_decode(d.error()), d.error().message()};
}

TEST(EdgeValidation, RouteRequestIdsAndModelsMustBeUtf8WithinTheirLimits) {
  auto [code, message] = route_error(request(not_utf8));
  EXPECT_EQ(code, wire_error_code::malformed);
  EXPECT_EQ(message, "route_request.id: not valid UTF-8 at byte 3 (0xff)");
  std::tie(code, message) = route_error(request("fine", overlong));
  EXPECT_EQ(code, wire_error_code::malformed);
  EXPECT_EQ(message, "route_request.model: not valid UTF-8 at byte 1 (0xc0)");
  std::tie(code, message) = route_error(request(std::string(257, 'x')));
  EXPECT_EQ(code, wire_error_code::too_large);
  EXPECT_EQ(message, "route_request.id: 257 bytes, limit 256");
  // Valid UTF-8 of any script is an id.
  std::vector<kv_decode_issue> issues;
  EXPECT_TRUE(
      decode_route_request(encode_route_request(request("\xc3\xa9t\xc3\xa9")), {}, issues).ok());
}

result<worker_message> decode_worker(const worker_message& m) {
  return decode_worker_message(encode_worker_message(m), worker_protocol_limits{});
}

std::string worker_error(const worker_message& m) {
  auto d = decode_worker(m);
  EXPECT_FALSE(d.ok()) << worker_message_type(m);
  if (d.ok()) return "";
  EXPECT_EQ(wire_error_for_decode(d.error()), wire_error_code::malformed) << d.error().message();
  return d.error().message();
}

TEST(EdgeValidation, WorkerEndpointsArePrintableAsciiWithoutQuotesOrSpaces) {
  for (const std::string ok : {"tcp://10.0.0.3:5600", "10.0.0.3:5600", "http://decode-3:8000/kv",
                               "tcp://[::1]:5600", "ipc:///run/kv.sock"})
    EXPECT_TRUE(decode_worker(worker_register{"", "m", 1, ok, 0, ""}).ok()) << ok;
  EXPECT_EQ(worker_error(worker_register{"", "m", 1, "tcp://a\"b", 0, ""}),
            "worker_register.endpoint: contains byte 7 (0x22); an endpoint is printable ASCII "
            "without whitespace, quotes or backslashes");
  EXPECT_EQ(worker_error(worker_register{"", "m", 1, "tcp://a:1\nx 1", 0, ""}),
            "worker_register.endpoint: contains byte 9 (0x0a); an endpoint is printable ASCII "
            "without whitespace, quotes or backslashes");
  EXPECT_EQ(worker_error(worker_register{"", "m", 1, "tcp://" + not_utf8, 0, ""}),
            "worker_register.endpoint: not valid UTF-8 at byte 9 (0xff)");
  // Valid UTF-8, but not ASCII: an endpoint names a host, a port, a path.
  EXPECT_EQ(worker_error(worker_register{"", "m", 1, "tcp://h\xc3\xa9:1", 0, ""}),
            "worker_register.endpoint: contains byte 7 (0xc3); an endpoint is printable ASCII "
            "without whitespace, quotes or backslashes");
  for (const std::string& bad :
       std::vector<std::string>{"a b", "a\tb", "a'b", "a`b", "a\\b", std::string("a\0b", 3)})
    EXPECT_FALSE(decode_worker(worker_register{"", "m", 1, bad, 0, ""}).ok()) << bad;
}

TEST(EdgeValidation, PublisherEndpointsAreTcpOrIpcOnly) {
  EXPECT_TRUE(decode_worker(publisher_register{"", "m", "tcp://10.0.0.3:5557", ""}).ok());
  EXPECT_TRUE(
      decode_worker(publisher_register{"", "m", "ipc:///run/kv", "tcp://10.0.0.3:5558"}).ok());
  // Anything but tcp:// and ipc:// is no ZeroMQ endpoint, or (inproc://, in
  // refused_registrations) one inside the node.
  EXPECT_FALSE(decode_worker(publisher_register{"", "m", "tcp://", ""}).ok());
  EXPECT_FALSE(decode_worker(publisher_register{"", "m", "10.0.0.3:5557", ""}).ok());
  EXPECT_EQ(worker_error(publisher_register{"", "m", "tcp://h:1", "tcp://h:2 "}),
            "publisher_register.replay_endpoint: contains byte 9 (0x20); an endpoint is "
            "printable ASCII without whitespace, quotes or backslashes");
  EXPECT_EQ(worker_error(publisher_register{"", "m", "tcp://h:1", "udp://h:2"}),
            "publisher_register.replay_endpoint: \"udp://h:2\" is not tcp://HOST:PORT or "
            "ipc://PATH");
}

// The cases a running node is held to as well (tests/integration/node_edge_test.cpp).
TEST(EdgeValidation, RefusedRegistrationsNameTheFieldAndTheByte) {
  const auto cases = testing::refused_registrations("m", 1);
  for (size_t i = 0; i < cases.size(); ++i)
    EXPECT_EQ(worker_error(cases[i].message), cases[i].error) << "case " << i;
}

TEST(EdgeValidation, EveryWorkerMessageStringIsUtf8) {
  EXPECT_EQ(worker_error(finished_requests{"", "m", 1, {"r0", not_utf8}}),
            "finished.requests[1]: not valid UTF-8 at byte 3 (0xff)");
  EXPECT_EQ(worker_error(load_report{not_utf8, "m", 1, 0, 0, 0, 0.0f, 1}),
            "load_report.id: not valid UTF-8 at byte 3 (0xff)");
  EXPECT_EQ(worker_error(worker_drain{"", surrogate, 1, true}),
            "worker_drain.model: not valid UTF-8 at byte 0 (0xed)");
}

TEST(EdgeValidation, AdminRequestIdsAreUtf8) {
  admin_request r;
  r.id = truncated;
  r.command = "status";
  auto d = decode_admin_request(encode_admin_request(r), admin_protocol_limits{});
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().message(), "admin_request.id: not valid UTF-8 at byte 2 (0xe2)");
}

TEST(AdminArgs, UnsignedIntegersAreNeverConverted) {
  const json args = {{"worker", 3},
                     {"big", 4294967296ull},
                     {"bigger", 4294967297ull},
                     {"max", UINT64_MAX},
                     {"float", 1.9},
                     {"whole_float", 1.0},
                     {"bool", true},
                     {"negative", -1},
                     {"text", "3"},
                     {"list", json::array({1})},
                     {"null", nullptr}};
  auto worker = admin_uint_arg(args, "worker", UINT32_MAX);
  ASSERT_TRUE(worker.ok());
  EXPECT_EQ(*worker, std::optional<uint64_t>(3));
  EXPECT_EQ(*admin_uint_arg(args, "max"), std::optional<uint64_t>(UINT64_MAX));
  // Absent and null are "not given": the handler decides whether the argument is required.
  EXPECT_EQ(*admin_uint_arg(args, "absent"), std::nullopt);
  EXPECT_EQ(*admin_uint_arg(args, "null"), std::nullopt);
  EXPECT_EQ(*admin_uint_arg(json::array({1}), "worker"), std::nullopt);
  const std::pair<const char*, const char*> refused[] = {
      {"big", "4294967296"}, {"bigger", "4294967297"}, {"float", "1.9"},  {"whole_float", "1.0"},
      {"bool", "true"},      {"negative", "-1"},       {"text", "\"3\""}, {"list", "[1]"}};
  for (const auto& [key, shown] : refused) {
    auto r = admin_uint_arg(args, key, UINT32_MAX);
    ASSERT_FALSE(r.ok()) << key;
    EXPECT_EQ(r.error().code(), status_code::invalid_argument);
    EXPECT_EQ(r.error().message(), std::string("argument '") + key +
                                       "' must be an unsigned integer <= 4294967295, got " + shown);
  }
  // Without a maximum, 2^64-1 is the limit and -1 is still not 2^64-1.
  auto epoch = admin_uint_arg({{"epoch", -1}}, "epoch");
  ASSERT_FALSE(epoch.ok());
  EXPECT_EQ(epoch.error().message(),
            "argument 'epoch' must be an unsigned integer <= 18446744073709551615, got -1");
  // A non-negative integer written as a signed MessagePack int is still an unsigned integer.
  EXPECT_EQ(*admin_uint_arg({{"epoch", json(int64_t{7})}}, "epoch"), std::optional<uint64_t>(7));
}

TEST(AdminArgs, StringsAreStringsAndLongValuesAreCutInTheError) {
  EXPECT_EQ(*admin_string_arg({{"model", "toy"}}, "model"), std::optional<std::string>("toy"));
  EXPECT_EQ(*admin_string_arg({{"model", nullptr}}, "model"), std::nullopt);
  EXPECT_EQ(*admin_string_arg(json::object(), "model"), std::nullopt);
  auto r = admin_string_arg({{"model", 5}}, "model");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message(), "argument 'model' must be a string, got 5");
  r = admin_string_arg({{"model", json::array({std::string(100, 'x')})}}, "model");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message(),
            "argument 'model' must be a string, got [\"" + std::string(59, 'x') + "...");
  r = admin_string_arg({{"model", json::binary({1, 2, 3})}}, "model");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message(), "argument 'model' must be a string, got a binary of 3 bytes");
}

TEST(PrometheusLabels, ValuesAreEscapedPerTheExpositionFormat) {
  // A label value as the registry writes it between its double quotes.
  const auto rendered = [](const std::string& value) {
    metric_registry one;
    EXPECT_TRUE(one.gauge("g", "h", {{"v", value}}).ok());
    const std::string text = one.render();
    const size_t from = text.find("g{v=\"") + 5, to = text.rfind("\"} 0\n");
    return from < to && to != std::string::npos ? text.substr(from, to - from) : "(not found)";
  };
  EXPECT_EQ(rendered("plain"), "plain");
  EXPECT_EQ(rendered("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  EXPECT_EQ(rendered(not_utf8), "pub\xef\xbf\xbd\xef\xbf\xbd");
  // The injected text stays inside one label value on one line.
  metric_registry reg;
  auto c = reg.counter("eldr_test_total", "A test.",
                       {{"publisher", "tcp://h:1\"} 1\neldr_fake_total{x=\"" + not_utf8}});
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  (*c)->inc();
  const std::string text = reg.render();
  EXPECT_EQ(text.find("\neldr_fake_total"), std::string::npos) << text;
  EXPECT_NE(text.find("eldr_test_total{publisher=\"tcp://h:1\\\"} 1\\neldr_fake_total{x=\\\"pub"
                      "\xef\xbf\xbd\xef\xbf\xbd\"} 1\n"),
            std::string::npos)
      << text;
  EXPECT_TRUE(valid_utf8(text));
}

TEST(ReplyCapConfig, TheKeyIsReadAndBounded) {
  const std::string model = "[[models]]\nname = \"m\"\n";
  auto c = parse_node_config("[limits]\nmax_queued_reply_bytes = 1048576\n" + model, "t.toml");
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  EXPECT_EQ(c->max_queued_reply_bytes, 1048576u);
  auto d = parse_node_config(model, "t.toml");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->max_queued_reply_bytes, uint64_t{64} << 20);
  auto negative = parse_node_config("[limits]\nmax_queued_reply_bytes = -1\n" + model, "t.toml");
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.error().message().find("limits.max_queued_reply_bytes"), std::string::npos)
      << negative.error().message();
  auto huge =
      parse_node_config("[limits]\nmax_queued_reply_bytes = 1099511627777\n" + model, "t.toml");
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.error().message(),
            "t.toml: limits.max_queued_reply_bytes: must be <= 2^40 (1 TiB), got 1099511627777");
}

}  // namespace
}  // namespace eldr
