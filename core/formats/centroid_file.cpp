// centroid_file: encoding, strict decoding and validation of centroid-set files.
#include "core/formats/centroid_file.hpp"

#include <bit>
#include <cmath>
#include <cstring>

#include "core/base/file_io.hpp"
#include "core/base/msgpack.hpp"
#include "core/formats/format_head.hpp"

namespace eldr {
namespace {

static_assert(std::endian::native == std::endian::little,
              "centroid files store little-endian float32; add a byte swap for big-endian hosts");

std::span<const uint8_t> float_bytes(const std::vector<float>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)};
}

result<std::vector<float>> floats_from(std::span<const uint8_t> b, const std::string& what) {
  if (b.size() % sizeof(float) != 0)
    return status::corrupt(what + ": " + std::to_string(b.size()) +
                           " bytes is not a whole number of float32 values");
  std::vector<float> v(b.size() / sizeof(float));
  if (!b.empty()) std::memcpy(v.data(), b.data(), b.size());
  return v;
}

// A strict reader for one map level: remembers which required keys it saw.
struct decoder {
  msgpack::reader& r;
  const std::string& name;
  status fail(const std::string& field, const std::string& why) const {
    return status::corrupt(name + ": field '" + field + "': " + why);
  }
  result<uint64_t> uint(const std::string& field) {
    auto v = r.read_uint();
    if (!v.ok()) return fail(field, "expected an unsigned integer");
    return *v;
  }
  result<std::string> str(const std::string& field) {
    auto v = r.read_str();
    if (!v.ok()) return fail(field, "expected a string");
    return std::string(*v);
  }
  result<double> number(const std::string& field) {
    auto v = r.read_number();
    if (!v.ok()) return fail(field, "expected a number");
    return *v;
  }
  result<std::vector<float>> floats(const std::string& field) {
    auto v = r.read_bin();
    if (!v.ok()) return fail(field, "expected bin (little-endian float32)");
    return floats_from(*v, name + ": field '" + field + "'");
  }
};

#define ELDR_TRY_ASSIGN(lhs, expr)   \
  do {                               \
    auto _v = (expr);                \
    if (!_v.ok()) return _v.error(); \
    lhs = std::move(_v).value();     \
  } while (0)

}  // namespace

status validate_centroid_file(const centroid_file& f) {
  const uint32_t width = f.spec.width();
  if (f.workers == 0) return status::invalid_argument("centroid file: workers must be >= 1");
  if (width == 0) return status::invalid_argument("centroid file: signature width is 0");
  if (f.centroids.size() != std::size_t{f.workers} * width)
    return status::invalid_argument("centroid file: 'centroids' holds " +
                                    std::to_string(f.centroids.size()) +
                                    " values, expected workers (" + std::to_string(f.workers) +
                                    ") * width (" + std::to_string(width) + ")");
  for (uint32_t k = 0; k < f.workers; ++k) {
    double n2 = 0;
    for (uint32_t d = 0; d < width; ++d) {
      const float v = f.centroids[std::size_t{k} * width + d];
      if (!std::isfinite(v))
        return status::invalid_argument("centroid file: centroid " + std::to_string(k) +
                                        " has a non-finite value at dimension " +
                                        std::to_string(d));
      n2 += static_cast<double>(v) * v;
    }
    if (std::abs(std::sqrt(n2) - 1.0) > 1e-3)
      return status::invalid_argument("centroid file: centroid " + std::to_string(k) +
                                      " has norm " + std::to_string(std::sqrt(n2)) +
                                      ", expected 1");
  }
  if (!f.worker_weights.empty()) {
    if (f.worker_weights.size() != f.workers)
      return status::invalid_argument("centroid file: " + std::to_string(f.worker_weights.size()) +
                                      " worker weights for " + std::to_string(f.workers) +
                                      " workers");
    for (float w : f.worker_weights)
      if (!std::isfinite(w) || w <= 0)
        return status::invalid_argument("centroid file: worker weights must be finite and > 0");
  }
  return {};
}

std::vector<uint8_t> encode_centroid_file(const centroid_file& f) {
  std::vector<uint8_t> out;
  msgpack::writer w(out);
  const bool has_idf = f.spec.transform() == signature_transform::count_idf;
  w.write_map_header(10 + (has_idf ? 1 : 0) + (f.worker_weights.empty() ? 0 : 1));
  write_format_head(w, "eldr-centroids", centroid_file_version, f.model_name, f.spec.geometry());
  w.write_str("transform");
  w.write_str(to_string(f.spec.transform()));
  w.write_str("layer_mask");
  w.write_array_header(static_cast<uint32_t>(f.spec.layer_mask().size()));
  for (uint32_t l : f.spec.layer_mask())
    w.write_uint(l);
  if (has_idf) {
    w.write_str("idf");
    w.write_bin(float_bytes(f.spec.idf()));
  }
  w.write_str("epoch");
  w.write_uint(f.epoch);
  w.write_str("workers");
  w.write_uint(f.workers);
  w.write_str("width");
  w.write_uint(f.spec.width());
  w.write_str("centroids");
  w.write_bin(float_bytes(f.centroids));
  if (!f.worker_weights.empty()) {
    w.write_str("worker_weights");
    w.write_bin(float_bytes(f.worker_weights));
  }
  w.write_str("provenance");
  w.write_map_header(7);
  w.write_str("source");
  w.write_str(f.provenance.source);
  w.write_str("tool");
  w.write_str(f.provenance.tool);
  w.write_str("seed");
  w.write_uint(f.provenance.seed);
  w.write_str("calibration_requests");
  w.write_uint(f.provenance.calibration_requests);
  w.write_str("rho");
  w.write_float64(f.provenance.rho);
  w.write_str("objective");
  w.write_float64(f.provenance.objective);
  w.write_str("kmeans_variant");
  w.write_str(f.provenance.kmeans_variant);
  return out;
}

result<centroid_file> parse_centroid_file(std::span<const uint8_t> bytes, const std::string& name) {
  msgpack::reader r(bytes.data(), bytes.size());
  decoder d{r, name};
  auto top = r.read_map_header();
  if (!top.ok())
    return status::corrupt(name + ": not a centroid file (expected a MessagePack map)");
  centroid_file f;
  std::string format, transform_name;
  uint64_t version = 0, layers = 0, experts = 0, top_k = 0, workers = 0, width = 0;
  bool seen_model = false, seen_mask = false, seen_centroids = false, seen_width = false;
  bool seen_epoch = false, seen_workers = false;
  std::vector<uint32_t> mask;
  std::vector<float> idf;
  for (uint32_t i = 0; i < *top; ++i) {
    auto key = r.read_str();
    if (!key.ok()) return status::corrupt(name + ": a top-level key is not a string");
    const std::string k(*key);
    if (k == "format") {
      ELDR_TRY_ASSIGN(format, d.str(k));
    } else if (k == "version") {
      ELDR_TRY_ASSIGN(version, d.uint(k));
    } else if (k == "model") {
      auto n = r.read_map_header();
      if (!n.ok()) return d.fail(k, "expected a map");
      for (uint32_t j = 0; j < *n; ++j) {
        auto mk = r.read_str();
        if (!mk.ok()) return d.fail(k, "a key is not a string");
        const std::string field = "model." + std::string(*mk);
        if (*mk == "name") {
          ELDR_TRY_ASSIGN(f.model_name, d.str(field));
        } else if (*mk == "layers") {
          ELDR_TRY_ASSIGN(layers, d.uint(field));
        } else if (*mk == "experts") {
          ELDR_TRY_ASSIGN(experts, d.uint(field));
        } else if (*mk == "top_k") {
          ELDR_TRY_ASSIGN(top_k, d.uint(field));
        } else if (!r.skip().ok()) {
          return d.fail(field, "malformed value");
        }
      }
      seen_model = true;
    } else if (k == "transform") {
      ELDR_TRY_ASSIGN(transform_name, d.str(k));
    } else if (k == "layer_mask") {
      auto n = r.read_array_header();
      if (!n.ok()) return d.fail(k, "expected an array of layer indices");
      for (uint32_t j = 0; j < *n; ++j) {
        uint64_t l = 0;
        ELDR_TRY_ASSIGN(l, d.uint(k));
        if (l > UINT32_MAX) return d.fail(k, "layer index out of range");
        mask.push_back(static_cast<uint32_t>(l));
      }
      seen_mask = true;
    } else if (k == "idf") {
      ELDR_TRY_ASSIGN(idf, d.floats(k));
    } else if (k == "epoch") {
      ELDR_TRY_ASSIGN(f.epoch, d.uint(k));
      seen_epoch = true;
    } else if (k == "workers") {
      ELDR_TRY_ASSIGN(workers, d.uint(k));
      seen_workers = true;
    } else if (k == "width") {
      ELDR_TRY_ASSIGN(width, d.uint(k));
      seen_width = true;
    } else if (k == "centroids") {
      ELDR_TRY_ASSIGN(f.centroids, d.floats(k));
      seen_centroids = true;
    } else if (k == "worker_weights") {
      ELDR_TRY_ASSIGN(f.worker_weights, d.floats(k));
    } else if (k == "provenance") {
      auto n = r.read_map_header();
      if (!n.ok()) return d.fail(k, "expected a map");
      for (uint32_t j = 0; j < *n; ++j) {
        auto pk = r.read_str();
        if (!pk.ok()) return d.fail(k, "a key is not a string");
        const std::string field = "provenance." + std::string(*pk);
        fit_provenance& p = f.provenance;
        if (*pk == "source") {
          ELDR_TRY_ASSIGN(p.source, d.str(field));
        } else if (*pk == "tool") {
          ELDR_TRY_ASSIGN(p.tool, d.str(field));
        } else if (*pk == "seed") {
          ELDR_TRY_ASSIGN(p.seed, d.uint(field));
        } else if (*pk == "calibration_requests") {
          uint64_t v = 0;
          ELDR_TRY_ASSIGN(v, d.uint(field));
          p.calibration_requests = static_cast<uint32_t>(std::min<uint64_t>(v, UINT32_MAX));
        } else if (*pk == "rho") {
          ELDR_TRY_ASSIGN(p.rho, d.number(field));
        } else if (*pk == "objective") {
          ELDR_TRY_ASSIGN(p.objective, d.number(field));
        } else if (*pk == "kmeans_variant") {
          ELDR_TRY_ASSIGN(p.kmeans_variant, d.str(field));
        } else if (!r.skip().ok()) {
          return d.fail(field, "malformed value");
        }
      }
    } else if (!r.skip().ok()) {  // unknown keys: forward compatibility
      return d.fail(k, "malformed value");
    }
  }
  if (!r.at_end()) return status::corrupt(name + ": trailing bytes after the centroid map");
  if (format != "eldr-centroids")
    return status::corrupt(name + ": field 'format' must be \"eldr-centroids\", got \"" + format +
                           "\"");
  if (version != centroid_file_version)
    return status::corrupt(name + ": unsupported version " + std::to_string(version) +
                           " (this build reads version " + std::to_string(centroid_file_version) +
                           ")");
  for (auto [seen, field] : {std::pair{seen_model, "model"},
                             {seen_mask, "layer_mask"},
                             {seen_centroids, "centroids"},
                             {seen_width, "width"},
                             {seen_epoch, "epoch"},
                             {seen_workers, "workers"}})
    if (!seen) return status::corrupt(name + ": missing field '" + field + "'");
  // Before narrowing to 32 bits; signature_spec::make then applies model_geometry::validate.
  if (layers > max_layers || experts > max_experts || top_k > max_experts || workers > (1u << 20))
    return status::corrupt(name + ": model geometry or worker count out of range");
  const model_geometry g{static_cast<uint32_t>(layers), static_cast<uint32_t>(experts),
                         static_cast<uint32_t>(top_k)};
  auto t = parse_transform(transform_name);
  if (!t.ok()) return status::corrupt(name + ": field 'transform': " + t.error().message());
  if (mask.empty()) return status::corrupt(name + ": field 'layer_mask' is empty");
  auto spec = signature_spec::make(g, *t, std::move(mask), std::move(idf));
  if (!spec.ok()) return status::corrupt(name + ": " + spec.error().message());
  f.spec = std::move(spec).value();
  f.workers = static_cast<uint32_t>(workers);
  if (width != f.spec.width())
    return status::corrupt(name + ": field 'width' is " + std::to_string(width) +
                           " but the mask and geometry give " + std::to_string(f.spec.width()));
  if (status s = validate_centroid_file(f); !s.ok())
    return status::corrupt(name + ": " + s.message());
  return f;
}

result<centroid_file> read_centroid_file(const std::string& path) {
  auto bytes = read_file(path, uint64_t{1} << 31);
  if (!bytes.ok()) return bytes.error();
  return parse_centroid_file(*bytes, path);
}

status write_centroid_file(const centroid_file& f, const std::string& path) {
  if (status s = validate_centroid_file(f); !s.ok()) return s;
  return write_file_atomic(path, encode_centroid_file(f));
}

}  // namespace eldr
