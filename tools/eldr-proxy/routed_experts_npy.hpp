// routed_experts_npy: vLLM's routed experts field (a base64 string of the bytes np.save writes,
// docs/vllm.md (a)) decoded in eldr-proxy's compiled library (counts_native.cpp), the work
// cluster/python/eldr_routed_experts.py's decode does with binascii and numpy, in less CPU time.
//
// Everything here comes from outside (an HTTP response): every byte is checked, every size
// bounded, and anything that is not exactly a C-order .npy of a 3-dimensional integer array in a
// dtype vLLM sends is refused with a message. What is refused here may still be a valid .npy
// (Fortran order, another spelling of a dtype): eldr_proxy_native.py then lets the numpy path
// judge it, so the proxy accepts and refuses exactly what it did before.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "core/base/status.hpp"

namespace eldr::proxy {

// The dtypes eldr_routed_experts accepts, in its order (numpy's descr in the comments).
enum class npy_dtype : uint32_t { u1 = 0, u2 = 1, i4 = 2, u4 = 3, i8 = 4 };  // |u1 <u2 <i4 <u4 <i8

struct npy_array {
  npy_dtype dtype = npy_dtype::u1;
  uint64_t shape[3] = {0, 0, 0};  // (tokens, layers, top_k)
  size_t data_offset = 0;         // where the C-order elements start in the decoded bytes
  size_t data_bytes = 0;          // shape's product times the dtype's size
};

// The decoded size of base64 text of this many characters, an upper bound before its padding is
// known: text_len / 4 * 3.
size_t base64_decoded_bound(size_t text_len);

// Decodes strict base64 text (RFC 4648 alphabet, length a multiple of 4, '=' only as the last
// one or two characters, no whitespace: what Python's base64.b64encode writes) into out, which
// must hold base64_decoded_bound(text.size()) bytes, then reads the .npy header (format 1.0, 2.0
// or 3.0) of what it decoded and checks its data: the elements fill the rest exactly, signed ids
// are >= 0. Errors: invalid_argument naming the first problem.
result<npy_array> decode_routed_experts(std::string_view text, std::span<uint8_t> out);

}  // namespace eldr::proxy
