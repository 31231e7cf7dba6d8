// signature: a request's expert signature, the vector ELDR routes on (eldr-method.md section 1).
//
// A signature lives in the *masked* space: |mask| * E dimensions, layer-major, one global L2
// normalisation. Stored sparse (sorted indices, values) because short prompts touch few experts
// and a block of 16 tokens touches at most 16 * k experts per layer; a long prompt's signature is
// near-dense, and consumers (centroid scoring) handle both shapes with one loop.
#pragma once

#include <cstdint>
#include <vector>

namespace eldr {

struct signature {
  uint32_t width = 0;            // dimension of the masked space: |mask| * E
  std::vector<uint32_t> index;   // strictly increasing, each < width
  std::vector<float> value;      // same length as index; unit L2 norm overall, or empty (all zero)

  bool empty() const { return index.empty(); }
  std::size_t nnz() const { return index.size(); }
};

}  // namespace eldr
