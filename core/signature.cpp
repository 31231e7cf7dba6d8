// signature: transforms, IDF, the spec, and the builder.
#include "core/signature.hpp"

#include <algorithm>
#include <cmath>
#include <string>

namespace eldr {

std::string_view to_string(signature_transform t) {
  switch (t) {
    case signature_transform::count:
      return "count";
    case signature_transform::sqrt:
      return "sqrt";
    case signature_transform::count_idf:
      return "count_idf";
    case signature_transform::binary:
      return "binary";
  }
  return "unknown";
}

result<signature_transform> parse_transform(std::string_view name) {
  for (signature_transform t : all_transforms)
    if (name == to_string(t)) return t;
  if (name == "count-idf") return signature_transform::count_idf;
  return status::invalid_argument("unknown signature transform '" + std::string(name) +
                                  "' (valid: count, sqrt, count_idf, binary)");
}

result<std::vector<float>> fit_idf(const model_geometry& g, std::span<const uint32_t> counts) {
  if (status s = g.validate(); !s.ok()) return s;
  const std::size_t w = g.width();
  if (counts.empty()) return status::invalid_argument("IDF needs at least one calibration request");
  if (counts.size() % w != 0)
    return status::invalid_argument(
        "IDF input holds " + std::to_string(counts.size()) +
        " counts, not a multiple of layers * experts = " + std::to_string(w));
  const std::size_t n = counts.size() / w;
  std::vector<uint32_t> df(w, 0);
  for (std::size_t r = 0; r < n; ++r)
    for (std::size_t d = 0; d < w; ++d)
      df[d] += counts[r * w + d] > 0 ? 1 : 0;
  std::vector<float> idf(w);
  for (std::size_t d = 0; d < w; ++d)
    idf[d] = static_cast<float>(std::log((static_cast<double>(n) + 1.0) / (df[d] + 1.0)));
  return idf;
}

result<signature_spec> signature_spec::make(const model_geometry& g, signature_transform t,
                                            std::vector<uint32_t> layer_mask,
                                            std::vector<float> idf) {
  if (status s = g.validate(); !s.ok()) return s;
  if (layer_mask.empty()) {
    layer_mask.resize(g.layers);
    for (uint32_t l = 0; l < g.layers; ++l)
      layer_mask[l] = l;
  }
  std::sort(layer_mask.begin(), layer_mask.end());
  for (std::size_t i = 0; i < layer_mask.size(); ++i) {
    if (layer_mask[i] >= g.layers)
      return status::invalid_argument("layer mask names layer " + std::to_string(layer_mask[i]) +
                                      " but the model has " + std::to_string(g.layers));
    if (i > 0 && layer_mask[i] == layer_mask[i - 1])
      return status::invalid_argument("layer mask names layer " + std::to_string(layer_mask[i]) +
                                      " twice");
  }
  signature_spec spec;
  spec.geometry_ = g;
  spec.transform_ = t;
  spec.layer_mask_ = std::move(layer_mask);
  if (t == signature_transform::count_idf) {
    if (idf.size() != g.width())
      return status::invalid_argument("count_idf needs " + std::to_string(g.width()) +
                                      " IDF weights (layers * experts), got " +
                                      std::to_string(idf.size()));
    for (float v : idf)
      if (!std::isfinite(v) || v < 0.0f)
        return status::invalid_argument("IDF weights must be finite and non-negative");
    spec.masked_idf_.reserve(spec.width());
    for (uint32_t l : spec.layer_mask_)
      spec.masked_idf_.insert(spec.masked_idf_.end(), idf.begin() + std::size_t{l} * g.experts,
                              idf.begin() + std::size_t{l + 1} * g.experts);
    spec.idf_ = std::move(idf);
  }
  return spec;
}

float signature_spec::transform_count(uint32_t count, uint32_t d) const {
  switch (transform_) {
    case signature_transform::count:
      return static_cast<float>(count);
    case signature_transform::sqrt:
      return std::sqrt(static_cast<float>(count));
    case signature_transform::count_idf:
      return static_cast<float>(count) * masked_idf_[d];
    case signature_transform::binary:
      return count > 0 ? 1.0f : 0.0f;
  }
  return 0.0f;
}

void signature_spec::dense_from_counts(std::span<const uint32_t> counts,
                                       std::span<float> out) const {
  const uint32_t e_count = geometry_.experts;
  for (std::size_t m = 0; m < layer_mask_.size(); ++m) {
    const uint32_t* row = counts.data() + std::size_t{layer_mask_[m]} * e_count;
    for (uint32_t e = 0; e < e_count; ++e) {
      const auto d = static_cast<uint32_t>(m * e_count + e);
      out[d] = transform_count(row[e], d);
    }
  }
  double norm2 = 0.0;
  for (float v : out)
    norm2 += static_cast<double>(v) * v;
  if (norm2 > 0.0) {
    const auto inv = static_cast<float>(1.0 / std::sqrt(norm2));
    for (float& v : out)
      v *= inv;
  }
}

signature_builder::signature_builder(std::shared_ptr<const signature_spec> spec)
    : spec_(std::move(spec)),
      acc_(spec_->width(), 0),
      index_scratch_(spec_->width()),
      value_scratch_(spec_->width()) {}

void signature_builder::reset() {
  std::fill(acc_.begin(), acc_.end(), 0u);
}

status add_masked_counts(const signature_spec& spec, const block_counts& block,
                         std::span<uint32_t> masked) {
  const model_geometry& g = spec.geometry();
  if (block.layers() != g.layers)
    return status::invalid_argument("block has " + std::to_string(block.layers()) +
                                    " layers, the signature spec expects " +
                                    std::to_string(g.layers));
  if (masked.size() != spec.width())
    return status::invalid_argument("masked sum has " + std::to_string(masked.size()) +
                                    " entries, the signature spec's width is " +
                                    std::to_string(spec.width()));
  const auto& ids = block.ids();
  const auto& counts = block.counts();
  uint32_t* acc = masked.data();
  for (uint32_t l : spec.layer_mask()) {
    // Only masked layers are touched: a 12-of-48 mask reads a quarter of the block.
    for (uint32_t i = block.offset(l), end = block.offset(l + 1); i < end; ++i)
      acc[ids[i]] += counts[i];
    acc += g.experts;
  }
  return {};
}

status signature_builder::add(const block_counts& block) {
  return add_masked_counts(*spec_, block, acc_);
}

status signature_builder::add_dense(std::span<const uint32_t> counts) {
  const model_geometry& g = spec_->geometry();
  if (counts.size() != g.width())
    return status::invalid_argument(
        "dense counts have " + std::to_string(counts.size()) +
        " entries, expected layers * experts = " + std::to_string(g.width()));
  uint32_t* acc = acc_.data();
  for (uint32_t l : spec_->layer_mask()) {
    const uint32_t* row = counts.data() + std::size_t{l} * g.experts;
    for (uint32_t e = 0; e < g.experts; ++e)
      acc[e] += row[e];
    acc += g.experts;
  }
  return {};
}

status signature_builder::add_masked(std::span<const uint32_t> masked_counts) {
  if (masked_counts.size() != acc_.size())
    return status::invalid_argument("masked counts have " + std::to_string(masked_counts.size()) +
                                    " entries, expected the signature width " +
                                    std::to_string(acc_.size()));
  for (std::size_t d = 0; d < acc_.size(); ++d)
    acc_[d] += masked_counts[d];
  return {};
}

void signature_builder::finish(signature& out) {
  out.width = spec_->width();
  // Branch-free over every masked dimension (this runs once per routed request, over up to
  // L * E dimensions whose zeros follow no pattern a branch predictor can learn): each dimension
  // is written at the next free slot of the scratch, and the slot advances only for a non-zero
  // value. Then `out` gets exactly the non-zeros, in one copy. The norm adds zeros, which leaves
  // a double sum bit-for-bit unchanged.
  const auto n = static_cast<uint32_t>(acc_.size());
  uint32_t* index = index_scratch_.data();
  float* value = value_scratch_.data();
  auto collect = [&](auto value_of) {
    double norm2 = 0.0;
    uint32_t k = 0;
    for (uint32_t d = 0; d < n; ++d) {
      // value_of(0, d) == 0 for every transform; an IDF of zero (an expert every calibration
      // request used) also gives 0 and is dropped.
      const float v = value_of(acc_[d], d);
      index[k] = d;
      value[k] = v;
      k += v != 0.0f ? 1u : 0u;
      norm2 += static_cast<double>(v) * v;
    }
    std::fill(acc_.begin(), acc_.end(), 0u);
    out.index.assign(index, index + k);
    out.value.assign(value, value + k);
    return norm2;
  };
  double norm2 = 0.0;
  switch (spec_->transform()) {
    case signature_transform::count:
      norm2 = collect([](uint32_t c, uint32_t) { return static_cast<float>(c); });
      break;
    case signature_transform::sqrt:
      norm2 = collect([](uint32_t c, uint32_t) { return std::sqrt(static_cast<float>(c)); });
      break;
    case signature_transform::count_idf: {
      const float* idf = spec_->masked_idf_.data();
      norm2 = collect([idf](uint32_t c, uint32_t d) { return static_cast<float>(c) * idf[d]; });
      break;
    }
    case signature_transform::binary:
      norm2 = collect([](uint32_t c, uint32_t) { return c != 0 ? 1.0f : 0.0f; });
      break;
  }
  if (norm2 > 0.0) {
    const auto inv = static_cast<float>(1.0 / std::sqrt(norm2));
    for (float& v : out.value)
      v *= inv;
  }
}

float cosine(const signature& a, const signature& b) {
  float s = 0.0f;
  std::size_t i = 0, j = 0;
  while (i < a.index.size() && j < b.index.size()) {
    if (a.index[i] < b.index[j]) {
      ++i;
    } else if (a.index[i] > b.index[j]) {
      ++j;
    } else {
      s += a.value[i++] * b.value[j++];
    }
  }
  return s;
}

}  // namespace eldr
