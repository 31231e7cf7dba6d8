// block_hashes_native: a canonical CBOR writer for BlockHasher's tuples, and the SHA-256 chain.
#include "tools/eldr-proxy/block_hashes_native.hpp"

#include <openssl/evp.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace eldr::proxy {
namespace {

constexpr size_t digest_bytes = 32;

// CBOR major types (RFC 8949 section 3.1).
constexpr uint8_t unsigned_int = 0, negative_int = 1, byte_string = 2, text_string = 3, array = 4;
constexpr uint8_t cbor_null = 0xf6;

// The shortest head of a major type and argument, as canonical encoding requires.
void head(std::vector<uint8_t>& out, uint8_t major, uint64_t n) {
  const auto m = static_cast<uint8_t>(major << 5);
  if (n < 24) {
    out.push_back(static_cast<uint8_t>(m | n));
    return;
  }
  int bytes = 8;
  uint8_t info = 27;
  if (n <= 0xff) {
    bytes = 1;
    info = 24;
  } else if (n <= 0xffff) {
    bytes = 2;
    info = 25;
  } else if (n <= 0xffffffff) {
    bytes = 4;
    info = 26;
  }
  out.push_back(static_cast<uint8_t>(m | info));
  for (int i = bytes - 1; i >= 0; --i)
    out.push_back(static_cast<uint8_t>(n >> (8 * i)));
}

void integer(std::vector<uint8_t>& out, int64_t v) {
  if (v >= 0)
    head(out, unsigned_int, static_cast<uint64_t>(v));
  else  // -1 - n: the argument of a negative integer
    head(out, negative_int, ~static_cast<uint64_t>(v));
}

void bytes(std::vector<uint8_t>& out, std::span<const uint8_t> b) {
  head(out, byte_string, b.size());
  out.insert(out.end(), b.begin(), b.end());
}

void text(std::vector<uint8_t>& out, std::string_view s) {
  head(out, text_string, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

void tokens(std::vector<uint8_t>& out, std::span<const int64_t> ids) {
  head(out, array, ids.size());
  for (const int64_t id : ids)
    integer(out, id);
}

struct md_ctx_free {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
struct md_free {
  void operator()(EVP_MD* m) const { EVP_MD_free(m); }
};

// SHA-256 with the digest fetched once and one context reused: the per-call fetch of EVP_Digest
// would cost more than a block's hash.
class sha256 {
 public:
  sha256() : md_(EVP_MD_fetch(nullptr, "SHA256", nullptr)), ctx_(EVP_MD_CTX_new()) {}
  bool ok() const { return md_ != nullptr && ctx_ != nullptr; }
  bool digest(const std::vector<uint8_t>& data, uint8_t* out) {
    unsigned int len = 0;
    return EVP_DigestInit_ex2(ctx_.get(), md_.get(), nullptr) == 1 &&
           EVP_DigestUpdate(ctx_.get(), data.data(), data.size()) == 1 &&
           EVP_DigestFinal_ex(ctx_.get(), out, &len) == 1 && len == digest_bytes;
  }

 private:
  std::unique_ptr<EVP_MD, md_free> md_;
  std::unique_ptr<EVP_MD_CTX, md_ctx_free> ctx_;
};

}  // namespace

status vllm_block_hashes(const block_hash_request& q, std::span<uint8_t> out) {
  if (q.none_hash.size() != digest_bytes)
    return status::invalid_argument("none_hash: 32 bytes expected, got " +
                                    std::to_string(q.none_hash.size()));
  if (q.block_size < 1) return status::invalid_argument("block_size must be >= 1");
  const size_t n = q.token_ids.size();
  const size_t full = n / q.block_size;
  const size_t blocks = full + (n % q.block_size != 0 ? 1 : 0);
  if (out.size() < blocks * digest_bytes)
    return status::invalid_argument("out holds " + std::to_string(out.size()) + " bytes, " +
                                    std::to_string(blocks) + " hashes need " +
                                    std::to_string(blocks * digest_bytes));
  sha256 h;
  if (!h.ok()) return status::failed_precondition("OpenSSL: SHA-256 is not available");
  std::vector<uint8_t> cbor;
  cbor.reserve(64 + 9 * size_t{q.block_size} + q.salt.size() + q.partial_tag.size());
  const uint8_t* parent = q.none_hash.data();
  for (size_t i = 0; i < full; ++i) {
    cbor.clear();
    head(cbor, array, 3);
    bytes(cbor, std::span(parent, digest_bytes));
    tokens(cbor, q.token_ids.subspan(i * q.block_size, q.block_size));
    if (i == 0 && q.has_salt && !q.salt.empty()) {
      head(cbor, array, 1);
      text(cbor, q.salt);
    } else {
      cbor.push_back(cbor_null);
    }
    uint8_t* digest = out.data() + i * digest_bytes;
    if (!h.digest(cbor, digest)) return status::failed_precondition("OpenSSL: SHA-256 failed");
    parent = digest;
  }
  if (blocks > full) {
    cbor.clear();
    head(cbor, array, 3);
    text(cbor, q.partial_tag);
    bytes(cbor, std::span(parent, digest_bytes));
    tokens(cbor, q.token_ids.subspan(full * q.block_size));
    if (!h.digest(cbor, out.data() + full * digest_bytes))
      return status::failed_precondition("OpenSSL: SHA-256 failed");
  }
  return {};
}

}  // namespace eldr::proxy
