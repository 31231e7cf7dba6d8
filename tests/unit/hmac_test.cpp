// hmac: the OpenSSL wrappers -- SHA-256 against the FIPS 180-2 vectors and the padding
// boundaries, HMAC-SHA256 against all of RFC 4231's test cases (also the empty key), random bytes,
// the constant-time compare and hex.
#include "cluster/security/hmac.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace eldr {
namespace {

std::string hex(const sha256_digest& d) {
  return to_hex(d);
}

std::vector<uint8_t> repeat(uint8_t byte, std::size_t n) {
  return std::vector<uint8_t>(n, byte);
}

std::vector<uint8_t> bytes_of(std::string_view s) {
  return {s.begin(), s.end()};
}

// FIPS 180-2 appendix B.1 and B.2, and the empty message.
TEST(Sha256, FipsVectors) {
  EXPECT_EQ(hex(sha256("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(hex(sha256("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex(sha256(std::span<const uint8_t>())),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

// FIPS 180-2 appendix B.3: one million 'a'.
TEST(Sha256, MillionA) {
  const std::string a(1000000, 'a');
  const std::string expected = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
  EXPECT_EQ(hex(sha256(a)), expected);
}

// Lengths around the padding boundaries: 55 bytes leave exactly room for the 0x80 byte and the
// length in one block, 56..63 force a second padding block, 64 and 119/120 repeat that one block
// on. Expected digests from an independent implementation (Python's hashlib).
TEST(Sha256, PaddingBoundaries) {
  const struct {
    std::size_t n;
    const char* digest;
  } cases[] = {
      {55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
      {56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
      {63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"},
      {64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
      {119, "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb"},
      {120, "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c"},
  };
  for (const auto& c : cases)
    EXPECT_EQ(hex(sha256(std::string(c.n, 'a'))), c.digest) << c.n << " bytes";
}

TEST(Sha256, StringAndByteFormsAgree) {
  const std::string s = "block hash \x01\x00\xff";
  EXPECT_EQ(sha256(s), sha256(bytes_of(s)));
  EXPECT_NE(sha256("abc"), sha256("abd"));
}

// RFC 4231 section 4: test cases 1-7 (case 5's tag is truncated to 128 bits).
TEST(HmacSha256, Rfc4231Case1) {
  EXPECT_EQ(hex(hmac_sha256(repeat(0x0b, 20), bytes_of("Hi There"))),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
}

TEST(HmacSha256, Rfc4231Case2KeyShorterThanOutput) {
  EXPECT_EQ(hex(hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(HmacSha256, Rfc4231Case3) {
  EXPECT_EQ(hex(hmac_sha256(repeat(0xaa, 20), repeat(0xdd, 50))),
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
}

TEST(HmacSha256, Rfc4231Case4) {
  std::vector<uint8_t> key(25);
  for (std::size_t i = 0; i < key.size(); ++i)
    key[i] = static_cast<uint8_t>(i + 1);
  EXPECT_EQ(hex(hmac_sha256(key, repeat(0xcd, 50))),
            "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
}

TEST(HmacSha256, Rfc4231Case5Truncated) {
  const sha256_digest tag = hmac_sha256(repeat(0x0c, 20), bytes_of("Test With Truncation"));
  EXPECT_EQ(to_hex(std::span<const uint8_t>(tag).first(16)), "a3b6167473100ee06e0c796c2955552b");
}

TEST(HmacSha256, Rfc4231Case6KeyLongerThanBlock) {
  EXPECT_EQ(hex(hmac_sha256(repeat(0xaa, 131),
                            bytes_of("Test Using Larger Than Block-Size Key - Hash Key First"))),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(HmacSha256, Rfc4231Case7KeyAndDataLongerThanBlock) {
  EXPECT_EQ(hex(hmac_sha256(
                repeat(0xaa, 131),
                bytes_of("This is a test using a larger than block-size key and a larger than "
                         "block-size data. The key needs to be hashed before being used by the "
                         "HMAC algorithm."))),
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

// Empty key and message, and keys of exactly one block and one byte more (the first is used as
// is, the second hashed first). Expected tags from Python's hmac module.
TEST(HmacSha256, KeyLengthEdges) {
  EXPECT_EQ(hex(hmac_sha256("", "")),
            "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad");
  EXPECT_EQ(hex(hmac_sha256(std::string(64, 'k'), "msg")),
            "d62ad25bb128e96ab6ef43464aaf2bb91b5b85f013381e9ba6be747e8d0911b2");
  EXPECT_EQ(hex(hmac_sha256(std::string(65, 'k'), "msg")),
            "c65585780e821bd312cfaa440c33cb28d6af6b323d4977ae83934834ce589e38");
}

// The join handshake: the tag depends on both the secret and the challenge.
TEST(HmacSha256, ChallengeResponseDistinguishesSecretAndNonce) {
  const sha256_digest good = hmac_sha256("cluster-secret", "nonce-1");
  EXPECT_TRUE(equal_constant_time(good, hmac_sha256("cluster-secret", "nonce-1")));
  EXPECT_FALSE(equal_constant_time(good, hmac_sha256("cluster-secreT", "nonce-1")));
  EXPECT_FALSE(equal_constant_time(good, hmac_sha256("cluster-secret", "nonce-2")));
}

// Nonces: the length asked for, and two draws of 16 bytes never equal (a fixed or unseeded
// generator would repeat; 2^-128 chance otherwise).
TEST(RandomBytes, LengthAndFreshness) {
  auto a = random_bytes(16);
  auto b = random_bytes(16);
  ASSERT_TRUE(a.ok()) << a.error().message();
  ASSERT_TRUE(b.ok()) << b.error().message();
  EXPECT_EQ(a->size(), 16u);
  EXPECT_NE(*a, *b);
  auto none = random_bytes(0);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST(EqualConstantTime, ComparesLengthAndEveryByte) {
  const sha256_digest a = sha256("abc");
  for (std::size_t i = 0; i < a.size(); ++i) {
    sha256_digest b = a;
    b[i] ^= 0x01;  // a difference at every position, first to last, is seen
    EXPECT_FALSE(equal_constant_time(a, b)) << "byte " << i;
  }
  EXPECT_TRUE(equal_constant_time(a, a));
  EXPECT_FALSE(equal_constant_time(a, std::span<const uint8_t>(a).first(31)));
  EXPECT_TRUE(equal_constant_time(std::span<const uint8_t>(), std::span<const uint8_t>()));
}

TEST(Hex, RoundTripsAndRejectsMalformed) {
  EXPECT_EQ(to_hex(std::vector<uint8_t>{0x00, 0x0f, 0xa5, 0xff}), "000fa5ff");
  EXPECT_EQ(to_hex(std::span<const uint8_t>()), "");

  auto upper = from_hex("000FA5ff");
  ASSERT_TRUE(upper.ok()) << upper.error().to_string();
  EXPECT_EQ(*upper, (std::vector<uint8_t>{0x00, 0x0f, 0xa5, 0xff}));
  auto empty = from_hex("");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());

  const sha256_digest d = sha256("abc");
  auto back = from_hex(to_hex(d));
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(equal_constant_time(*back, d));

  EXPECT_EQ(from_hex("abc").error().code(), status_code::invalid_argument);
  EXPECT_EQ(from_hex("0g").error().code(), status_code::invalid_argument);
  EXPECT_EQ(from_hex("g0").error().code(), status_code::invalid_argument);
  EXPECT_EQ(from_hex("0 ").error().code(), status_code::invalid_argument);
}

}  // namespace
}  // namespace eldr
