// curve_keys: Z85 key checks and the key-file reader -- comments, blanks, CRLF, and errors that
// name the file and the line.
#include "cluster/security/curve_keys.hpp"

#include <gtest/gtest.h>

#include <fstream>

#include "tests/support/temp_dir.hpp"

namespace eldr {
namespace {

void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

curve_keypair fresh_pair() {
  auto p = generate_curve_keypair();
  EXPECT_TRUE(p.ok()) << p.error().to_string();
  return p.ok() ? *p : curve_keypair{};
}

TEST(curve_keys, decode_accepts_canonical_keys_only) {
  if (!curve_available()) GTEST_SKIP() << "libzmq without CURVE";
  const auto pair = fresh_pair();
  auto k = decode_curve_key(pair.public_key);
  ASSERT_TRUE(k.ok()) << k.error().to_string();
  EXPECT_EQ(encode_curve_key(*k), pair.public_key);

  auto short_key = decode_curve_key(pair.public_key.substr(1));
  ASSERT_FALSE(short_key.ok());
  EXPECT_EQ(short_key.error().code(), status_code::invalid_argument);
  EXPECT_NE(short_key.error().message().find("got 39"), std::string::npos);

  std::string bad_char = pair.public_key;
  bad_char[7] = '~';
  auto b = decode_curve_key(bad_char);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.error().message().find("character 8"), std::string::npos);
  EXPECT_EQ(b.error().message().find(bad_char), std::string::npos);  // never echoes the key

  // "%%%%%" is 85^5 - 1 > 2^32 - 1: a spelling that no 32-bit group has.
  EXPECT_FALSE(decode_curve_key(std::string(40, '%')).ok());
}

TEST(curve_keys, public_key_derives_from_secret) {
  if (!curve_available()) GTEST_SKIP() << "libzmq without CURVE";
  const auto pair = fresh_pair();
  auto pub = curve_public_key(pair.secret_key);
  ASSERT_TRUE(pub.ok()) << pub.error().to_string();
  EXPECT_EQ(*pub, pair.public_key);
  EXPECT_FALSE(curve_public_key("short").ok());
}

TEST(curve_keys, parse_skips_comments_blanks_and_carriage_returns) {
  curve_key zero{};
  curve_key ones{};
  ones.fill(0xff);
  const auto a = encode_curve_key(zero);
  const auto b = encode_curve_key(ones);  // the largest key: starts with '%', never with '#'
  EXPECT_EQ(b.front(), '%');
  const std::string text =
      "# eldr authorized keys\r\n\n   \t\n  " + a + "  \r\n#" + b + "\n" + b + "\n";
  auto keys = parse_curve_key_lines(text, "keys.txt");
  ASSERT_TRUE(keys.ok()) << keys.error().to_string();
  ASSERT_EQ(keys->size(), 2u);
  EXPECT_EQ((*keys)[0].key, a);
  EXPECT_EQ((*keys)[0].line, 4u);
  EXPECT_EQ((*keys)[1].key, b);
  EXPECT_EQ((*keys)[1].line, 6u);

  auto empty = parse_curve_key_lines("", "keys.txt");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

TEST(curve_keys, parse_errors_name_file_and_line) {
  curve_key zero{};
  const std::string text = "# comment\n" + encode_curve_key(zero) + "\n\nnot-a-key\n";
  auto keys = parse_curve_key_lines(text, "/etc/eldr/clients.keys");
  ASSERT_FALSE(keys.ok());
  EXPECT_EQ(keys.error().code(), status_code::invalid_argument);
  EXPECT_EQ(keys.error().message().rfind("/etc/eldr/clients.keys:4: ", 0), 0u)
      << keys.error().message();
}

TEST(curve_keys, secret_key_file) {
  if (!curve_available()) GTEST_SKIP() << "libzmq without CURVE";
  testing::temp_dir dir("curve-keys");
  ASSERT_FALSE(dir.path().empty());
  const auto pair = fresh_pair();

  const auto good = dir.sub("server.key");
  write_file(good, "# node-1 server secret key\n" + pair.secret_key + "\n");
  auto read = read_curve_secret_key(good);
  ASSERT_TRUE(read.ok()) << read.error().to_string();
  EXPECT_EQ(read->secret_key, pair.secret_key);
  EXPECT_EQ(read->public_key, pair.public_key);

  const auto two = dir.sub("two.key");
  write_file(two, pair.secret_key + "\n# another\n" + pair.public_key + "\n");
  auto r2 = read_curve_secret_key(two);
  ASSERT_FALSE(r2.ok());
  EXPECT_EQ(r2.error().message().rfind(two + ":3: ", 0), 0u) << r2.error().message();
  EXPECT_NE(r2.error().message().find("line 1"), std::string::npos);

  const auto none = dir.sub("none.key");
  write_file(none, "# nothing here\n\n");
  auto r3 = read_curve_secret_key(none);
  ASSERT_FALSE(r3.ok());
  EXPECT_EQ(r3.error().message().rfind(none + ": ", 0), 0u) << r3.error().message();

  const auto bad = dir.sub("bad.key");
  write_file(bad, "\n" + pair.secret_key.substr(0, 30) + "\n");
  auto r4 = read_curve_secret_key(bad);
  ASSERT_FALSE(r4.ok());
  EXPECT_EQ(r4.error().message().rfind(bad + ":2: ", 0), 0u) << r4.error().message();
  // The message says what is wrong without printing (part of) the secret.
  EXPECT_EQ(r4.error().message().find(pair.secret_key.substr(0, 30)), std::string::npos);

  auto missing = read_curve_secret_key(dir.sub("missing.key"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code(), status_code::not_found);
  EXPECT_NE(missing.error().message().find(dir.sub("missing.key")), std::string::npos);
}

TEST(curve_keys, public_keys_file) {
  if (!curve_available()) GTEST_SKIP() << "libzmq without CURVE";
  testing::temp_dir dir("curve-keys");
  ASSERT_FALSE(dir.path().empty());
  const auto a = fresh_pair();
  const auto b = fresh_pair();

  const auto good = dir.sub("clients.keys");
  write_file(good, "# prefill-1\n" + a.public_key + "\n# prefill-2\n" + b.public_key + "\n" +
                       a.public_key + "\n");
  auto keys = read_curve_public_keys(good);
  ASSERT_TRUE(keys.ok()) << keys.error().to_string();
  EXPECT_EQ(*keys, (std::set<std::string>{a.public_key, b.public_key}));

  const auto empty = dir.sub("empty.keys");
  write_file(empty, "# nobody yet\n");
  auto r2 = read_curve_public_keys(empty);
  ASSERT_FALSE(r2.ok());
  EXPECT_EQ(r2.error().message().rfind(empty + ": ", 0), 0u) << r2.error().message();

  const auto bad = dir.sub("bad.keys");
  write_file(bad, a.public_key + "\n" + b.public_key + "x\n");
  auto r3 = read_curve_public_keys(bad);
  ASSERT_FALSE(r3.ok());
  EXPECT_EQ(r3.error().message().rfind(bad + ":2: ", 0), 0u) << r3.error().message();
}

}  // namespace
}  // namespace eldr
