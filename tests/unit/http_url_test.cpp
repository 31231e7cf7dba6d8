// http_url: the metrics URLs a worker may register, and hostile ones refused with a reason.
#include "cluster/http/http_url.hpp"

#include <gtest/gtest.h>

#include <string>

namespace eldr {
namespace {

TEST(HttpUrl, ParsesHostPortPath) {
  auto u = parse_http_url("http://10.0.0.7:8000/metrics");
  ASSERT_TRUE(u.ok()) << u.error().to_string();
  EXPECT_EQ(u->host, "10.0.0.7");
  EXPECT_EQ(u->port, 8000);
  EXPECT_EQ(u->path, "/metrics");
  EXPECT_EQ(u->to_string(), "http://10.0.0.7:8000/metrics");
}

TEST(HttpUrl, DefaultsPortAndPath) {
  auto u = parse_http_url("http://vllm-decode-0.svc");
  ASSERT_TRUE(u.ok()) << u.error().to_string();
  EXPECT_EQ(u->host, "vllm-decode-0.svc");
  EXPECT_EQ(u->port, 80);
  EXPECT_EQ(u->path, "/");
}

TEST(HttpUrl, KeepsQueryAndBracketedIpv6) {
  auto u = parse_http_url("http://[::1]:9000/metrics?name[]=x");
  ASSERT_TRUE(u.ok()) << u.error().to_string();
  EXPECT_EQ(u->host, "::1");
  EXPECT_EQ(u->port, 9000);
  EXPECT_EQ(u->path, "/metrics?name[]=x");
  EXPECT_EQ(u->to_string(), "http://[::1]:9000/metrics?name[]=x");
}

TEST(HttpUrl, RefusesHostileAndMalformed) {
  const char* bad[] = {
      "",
      "https://h:1/metrics",
      "HTTP://h/",
      "ftp://h/",
      "http://",
      "http:///metrics",
      "http://:80/",
      "http://h:/",
      "http://h:0/",
      "http://h:65536/",
      "http://h:99999999999999999999/",
      "http://h:-1/",
      "http://h:80x/",
      "http://user:pw@h/",
      "http://h/metrics#frag",
      "http://h /metrics",
      "http://h/me trics",
      "http://h/\n",
      "http://h\r\n/",
      "http://h/\x7f",
      "http://h\xc3\xa9/",
      "http://[::1/",
      "http://[]/",
      "http://[::1]x/",
      "http://[zz::1]/",
      "http://h%2f/",
      "http://a;b/",
  };
  for (const char* s : bad) {
    auto u = parse_http_url(s);
    EXPECT_FALSE(u.ok()) << "accepted: " << s;
    if (!u.ok()) {
      EXPECT_EQ(u.error().code(), status_code::invalid_argument) << s;
      EXPECT_FALSE(u.error().message().empty()) << s;
    }
  }
}

TEST(HttpUrl, LengthLimited) {
  const std::string prefix = "http://h/";
  EXPECT_TRUE(parse_http_url(prefix + std::string(max_http_url_bytes - prefix.size(), 'a')).ok());
  auto u = parse_http_url(prefix + std::string(max_http_url_bytes - prefix.size() + 1, 'a'));
  ASSERT_FALSE(u.ok());
  // The error never echoes the input.
  EXPECT_LT(u.error().message().size(), 100u);
}

// Found by fuzz.vllm_metrics_fuzz: a URL of the limit's length without a path printed to one
// longer than the limit (the port and '/' written out), which did not parse again.
TEST(HttpUrl, WhatIsAcceptedPrintsToAUrlThatParsesToTheSameParts) {
  const std::string at_limit = "http://" + std::string(max_http_url_bytes - 7, 'h');
  EXPECT_FALSE(parse_http_url(at_limit).ok());
  for (const std::string& s :
       {"http://" + std::string(max_http_url_bytes - 8, 'h'), std::string("http://h:80/x"),
        std::string("http://h:0080"), std::string("http://[::1]:9000/m"),
        "http://h/" + std::string(max_http_url_bytes - 9, 'a')}) {
    auto u = parse_http_url(s);
    ASSERT_TRUE(u.ok()) << s.substr(0, 40) << ": " << u.error().to_string();
    EXPECT_LE(u->to_string().size(), max_http_url_bytes);
    auto again = parse_http_url(u->to_string());
    ASSERT_TRUE(again.ok()) << u->to_string().substr(0, 40);
    EXPECT_EQ(again->host, u->host);
    EXPECT_EQ(again->port, u->port);
    EXPECT_EQ(again->path, u->path);
  }
  EXPECT_EQ(parse_http_url("http://h:0080")->to_string(), "http://h/");
}

}  // namespace
}  // namespace eldr
