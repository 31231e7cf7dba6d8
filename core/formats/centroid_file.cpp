// centroid_file: encoding, strict decoding and validation of centroid-set files. The file's map is
// one field table (centroid_table), which encodes it, decodes it and names its errors.
#include "core/formats/centroid_file.hpp"

#include <bit>
#include <cmath>
#include <cstring>
#include <optional>
#include <string_view>
#include <variant>

#include "core/base/field_table.hpp"
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

// The file's map as read: the fields before they are checked together (signature_spec::make,
// validate_centroid_file).
struct centroid_map {
  std::optional<std::string> format;
  std::optional<uint32_t> version;
  format_model model;
  std::string transform;
  std::vector<uint32_t> layer_mask;
  std::vector<float> idf;
  uint64_t epoch = 0;
  uint32_t workers = 0;
  uint32_t width = 0;
  std::vector<float> centroids;
  std::vector<float> worker_weights;
  fit_provenance provenance;
};

constexpr std::string_view format_name = "eldr-centroids";
using F = table::fields<centroid_map, file_limits>;
using table::once;
using table::required;
// Every field of the file may appear once.
constexpr unsigned required_once = required | once;

// A bin of little-endian float32 values.
template <auto P>
table::field_spec<centroid_map, file_limits> floats(std::string_view name, unsigned rules) {
  return F::custom(
      name, rules,
      [](msgpack::reader& r, const F::spec&, const F::context&, std::string_view what,
         centroid_map& m) {
        msgpack::item it;
        if (status s = table::next_of(r, msgpack::kind::bin, what, it); !s.ok()) return s;
        if (it.length % sizeof(float) != 0)
          return status::invalid_argument(table::join(what, ": ") + std::to_string(it.length) +
                                          " bytes is not a whole number of float32 values");
        std::vector<float>& v = m.*P;
        v.resize(it.length / sizeof(float));
        if (it.length != 0) std::memcpy(v.data(), it.data, it.length);
        return status{};
      },
      [](std::vector<uint8_t>& out, const centroid_map& m) {
        msgpack::writer(out).write_bin(float_bytes(m.*P));
      });
}

using provenance_fields = table::fields<fit_provenance, file_limits>;
const table::message_table<fit_provenance, file_limits> provenance_table{
    "eldr-centroids.provenance",
    {
        provenance_fields::str<&fit_provenance::source>("source", &file_limits::max_name_bytes,
                                                        once),
        provenance_fields::str<&fit_provenance::tool>("tool", &file_limits::max_name_bytes, once),
        provenance_fields::u64<&fit_provenance::seed>("seed", once),
        provenance_fields::u32<&fit_provenance::calibration_requests>("calibration_requests", once),
        provenance_fields::f64<&fit_provenance::rho>("rho", once),
        provenance_fields::f64<&fit_provenance::objective>("objective", once),
        provenance_fields::str<&fit_provenance::kmeans_variant>("kmeans_variant",
                                                                &file_limits::max_name_bytes, once),
    }};

const auto centroid_model_table = model_table("eldr-centroids.model");

// In the order of docs/centroid-file.md, which is the order the encoder writes.
const table::message_table<centroid_map, file_limits> centroid_table{
    format_name,
    {
        format_field<centroid_map>(),
        version_field<centroid_map>(),
        F::map<&centroid_map::model, centroid_model_table>("model", required_once),
        F::str<&centroid_map::transform>("transform", &file_limits::max_name_bytes, required_once),
        F::u32s<&centroid_map::layer_mask>("layer_mask", &file_limits::max_mask_layers, "layers",
                                           required_once),
        floats<&centroid_map::idf>("idf", once).written_when([](const centroid_map& m) {
          return m.transform == "count_idf";
        }),
        F::u64<&centroid_map::epoch>("epoch", required_once),
        F::u32<&centroid_map::workers>("workers", required_once),
        F::u32<&centroid_map::width>("width", required_once),
        floats<&centroid_map::centroids>("centroids", required_once),
        floats<&centroid_map::worker_weights>("worker_weights", once)
            .written_when([](const centroid_map& m) { return !m.worker_weights.empty(); }),
        F::map<&centroid_map::provenance, provenance_table>("provenance", once),
    }};

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
  const model_geometry& g = f.spec.geometry();
  centroid_map m{.format = std::string(format_name),
                 .version = centroid_file_version,
                 .model = {f.model_name, g.layers, g.experts, g.top_k},
                 .transform = std::string(to_string(f.spec.transform())),
                 .layer_mask = f.spec.layer_mask(),
                 .idf = f.spec.idf(),
                 .epoch = f.epoch,
                 .workers = f.workers,
                 .width = f.spec.width(),
                 .centroids = f.centroids,
                 .worker_weights = f.worker_weights,
                 .provenance = f.provenance};
  std::vector<uint8_t> out;
  centroid_table.write_map(out, m);
  return out;
}

result<centroid_file> parse_centroid_file(std::span<const uint8_t> bytes, const std::string& name) {
  // Every error is corrupt: the file is damaged, whichever field says so.
  const auto damaged = [&](const status& s) { return status::corrupt(name + ": " + s.message()); };
  uint32_t version = 0;
  if (status s = check_format_head(bytes, format_name, {centroid_file_version}, version); !s.ok())
    return damaged(s);
  msgpack::reader r(bytes.data(), bytes.size());
  const file_limits limits;
  std::monostate none;
  centroid_map m;
  if (status s = centroid_table.read(r, {limits, bytes, none}, m); !s.ok()) return damaged(s);
  if (!r.at_end()) return status::corrupt(name + ": trailing bytes after the centroid map");
  if (m.workers > (1u << 20))
    return status::corrupt(name + ": eldr-centroids.workers: " + std::to_string(m.workers) +
                           ", limit " + std::to_string(1u << 20));
  auto t = parse_transform(m.transform);
  if (!t.ok()) return status::corrupt(name + ": eldr-centroids.transform: " + t.error().message());
  if (m.layer_mask.empty()) return status::corrupt(name + ": eldr-centroids.layer_mask: empty");
  // signature_spec::make applies model_geometry::validate.
  auto spec =
      signature_spec::make(m.model.geometry(), *t, std::move(m.layer_mask), std::move(m.idf));
  if (!spec.ok()) return status::corrupt(name + ": " + spec.error().message());
  centroid_file f;
  f.model_name = std::move(m.model.name);
  f.spec = std::move(spec).value();
  f.epoch = m.epoch;
  f.workers = m.workers;
  f.centroids = std::move(m.centroids);
  f.worker_weights = std::move(m.worker_weights);
  f.provenance = std::move(m.provenance);
  if (m.width != f.spec.width())
    return status::corrupt(name + ": eldr-centroids.width: " + std::to_string(m.width) +
                           ", but the mask and geometry give " + std::to_string(f.spec.width()));
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
