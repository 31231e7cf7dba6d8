// centroid_file: round trips, strict decoding, and validation errors that name the field.
#include "core/formats/centroid_file.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include <unistd.h>

#include "core/base/file_io.hpp"
#include "core/base/msgpack.hpp"
#include "tests/support/protocol_test_cases.hpp"

namespace eldr {
namespace {

centroid_file sample(signature_transform t) {
  const model_geometry g{3, 4, 2};
  std::vector<float> idf(g.width());
  for (std::size_t i = 0; i < idf.size(); ++i)
    idf[i] = 0.1f * static_cast<float>(i);
  centroid_file f;
  f.model_name = "toy";
  f.spec = *signature_spec::make(g, t, {0, 2}, idf);
  f.epoch = 42;
  f.workers = 2;
  f.centroids.assign(2 * f.spec.width(), 0.0f);
  f.centroids[1] = 1.0f;                   // worker 0: unit vector
  f.centroids[f.spec.width() + 2] = 0.6f;  // worker 1: (0.6, 0.8)
  f.centroids[f.spec.width() + 5] = 0.8f;
  f.worker_weights = {1.0f, 2.0f};
  f.provenance = {"unit test", "eldr-fit test", 7, 100, 0.75, 0.3, "balanced"};
  return f;
}

TEST(CentroidFile, RoundTripsEveryTransform) {
  for (signature_transform t : all_transforms) {
    const centroid_file f = sample(t);
    ASSERT_TRUE(validate_centroid_file(f).ok());
    auto back = parse_centroid_file(encode_centroid_file(f), "mem");
    ASSERT_TRUE(back.ok()) << back.error().to_string();
    EXPECT_EQ(back->model_name, "toy");
    EXPECT_EQ(back->spec.geometry(), f.spec.geometry());
    EXPECT_EQ(back->spec.transform(), t);
    EXPECT_EQ(back->spec.layer_mask(), f.spec.layer_mask());
    EXPECT_EQ(back->spec.idf(), f.spec.idf());
    EXPECT_EQ(back->epoch, 42u);
    EXPECT_EQ(back->workers, 2u);
    EXPECT_EQ(back->centroids, f.centroids);
    EXPECT_EQ(back->worker_weights, f.worker_weights);
    EXPECT_EQ(back->provenance.seed, 7u);
    EXPECT_EQ(back->provenance.kmeans_variant, "balanced");
    EXPECT_DOUBLE_EQ(back->provenance.rho, 0.75);
  }
}

TEST(CentroidFile, WritesAtomicallyAndReadsBack) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("eldr-cf-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "set.centroids").string();
  ASSERT_TRUE(write_centroid_file(sample(signature_transform::count), path).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  auto back = read_centroid_file(path);
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_EQ(back->epoch, 42u);
  auto missing = read_centroid_file((dir / "nope").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code(), status_code::not_found);
  std::filesystem::remove_all(dir);
}

TEST(CentroidFile, ValidationNamesTheProblem) {
  centroid_file f = sample(signature_transform::count);
  f.centroids[1] = 2.0f;
  auto s = validate_centroid_file(f);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("norm"), std::string::npos);
  f = sample(signature_transform::count);
  f.centroids[3] = std::nanf("");
  EXPECT_NE(validate_centroid_file(f).message().find("non-finite"), std::string::npos);
  f = sample(signature_transform::count);
  f.centroids.pop_back();
  EXPECT_NE(validate_centroid_file(f).message().find("centroids"), std::string::npos);
  f = sample(signature_transform::count);
  f.worker_weights = {1.0f, 0.0f};
  EXPECT_FALSE(validate_centroid_file(f).ok());
  f = sample(signature_transform::count);
  EXPECT_FALSE(write_centroid_file(f, "/nonexistent-dir/x.centroids").ok());
  f.centroids[1] = 3.0f;
  EXPECT_FALSE(write_centroid_file(f, "/tmp/never-written.centroids").ok());
  EXPECT_FALSE(std::filesystem::exists("/tmp/never-written.centroids"));
}

// Re-encodes a sample with one top-level field replaced (or dropped when value is empty).
std::vector<uint8_t> with_field(const std::string& key, const std::vector<uint8_t>& value) {
  return testing::with_field(encode_centroid_file(sample(signature_transform::count_idf)), key,
                             value);
}

std::vector<uint8_t> packed_str(const std::string& s) {
  std::vector<uint8_t> out;
  msgpack::writer(out).write_str(s);
  return out;
}

std::vector<uint8_t> packed_uint(uint64_t v) {
  std::vector<uint8_t> out;
  msgpack::writer(out).write_uint(v);
  return out;
}

TEST(CentroidFile, StrictDecodingErrorsNameTheField) {
  auto expect_error = [](const std::vector<uint8_t>& bytes, const std::string& needle) {
    auto r = parse_centroid_file(bytes, "f.centroids");
    ASSERT_FALSE(r.ok()) << "expected an error mentioning " << needle;
    EXPECT_EQ(r.error().code(), status_code::corrupt);
    EXPECT_NE(r.error().message().find(needle), std::string::npos) << r.error().message();
    EXPECT_EQ(r.error().message().rfind("f.centroids", 0), 0u);
  };
  expect_error(with_field("format", packed_str("eldr-trace")), "format");
  expect_error(with_field("version", packed_uint(2)), "version");
  expect_error(with_field("transform", packed_str("gate")), "transform");
  expect_error(with_field("width", packed_uint(5)), "width");
  expect_error(with_field("workers", packed_uint(3)), "centroids");
  expect_error(with_field("centroids", {}), "centroids");
  expect_error(with_field("layer_mask", {}), "layer_mask");
  expect_error(with_field("idf", {}), "IDF");
  expect_error(with_field("epoch", packed_str("one")), "epoch");
  expect_error(packed_str("hello"), "eldr-centroids: expected map, found str");
  auto good = encode_centroid_file(sample(signature_transform::count));
  good.push_back(0xc0);
  expect_error(good, "trailing");
  // Unknown keys are ignored.
  auto extra = encode_centroid_file(sample(signature_transform::count));
  ++extra[0];  // fixmap with one more pair
  msgpack::writer w(extra);
  w.write_str("future_key");
  w.write_array_header(1);
  w.write_nil();
  EXPECT_TRUE(parse_centroid_file(extra, "f").ok());
}

// The file's table: each field is named as "eldr-centroids.<field>" in the table's uniform form.
TEST(CentroidFile, TableErrorsNameTheFieldUniformly) {
  auto expect_exact = [](const std::vector<uint8_t>& bytes, const std::string& message) {
    auto r = parse_centroid_file(bytes, "f.centroids");
    ASSERT_FALSE(r.ok()) << "expected: " << message;
    EXPECT_EQ(r.error().code(), status_code::corrupt);
    EXPECT_EQ(r.error().message(), "f.centroids: " + message);
  };
  // A missing required field.
  expect_exact(with_field("epoch", {}), "eldr-centroids.epoch: missing");
  expect_exact(with_field("model", {}), "eldr-centroids.model: missing");
  // A wrong type, at the top level and in a nested map.
  expect_exact(with_field("transform", packed_uint(7)),
               "eldr-centroids.transform: expected str, found int");
  std::vector<uint8_t> model;
  msgpack::writer m(model);
  m.write_map_header(4);
  m.write_str("name");
  m.write_str("toy");
  m.write_str("layers");
  m.write_str("two");
  m.write_str("experts");
  m.write_uint(8);
  m.write_str("top_k");
  m.write_uint(2);
  expect_exact(with_field("model", model), "eldr-centroids.model.layers: expected int, found str");
  expect_exact(with_field("centroids", packed_str("x")),
               "eldr-centroids.centroids: expected bin, found str");
  // Over a limit: a string of the file's limits, an array of more layers than a model has.
  expect_exact(with_field("transform", packed_str(std::string(5000, 'c'))),
               "eldr-centroids.transform: 5000 bytes, limit 4096");
  std::vector<uint8_t> mask;
  msgpack::writer w(mask);
  w.write_array_header(5000);
  for (int i = 0; i < 5000; ++i)
    w.write_uint(0);
  expect_exact(with_field("layer_mask", mask),
               "eldr-centroids.layer_mask: 5000 layers, limit 4096");
  expect_exact(with_field("workers", packed_uint(uint64_t{1} << 21)),
               "eldr-centroids.workers: 2097152, limit 1048576");
  // The head is checked first, and a key may appear once.
  expect_exact(with_field("version", packed_uint(2)),
               "eldr-centroids.version: 2, this build reads 1");
  expect_exact(with_field("format", packed_str("eldr-trace")),
               "eldr-centroids.format: \"eldr-trace\", expected \"eldr-centroids\"");
  auto twice = encode_centroid_file(sample(signature_transform::count));
  ++twice[0];  // fixmap with one more pair
  msgpack::writer t(twice);
  t.write_str("epoch");
  t.write_uint(3);
  expect_exact(twice, "eldr-centroids.epoch: duplicate");
}

TEST(CentroidFile, EveryTruncationFailsCleanly) {
  const auto bytes = encode_centroid_file(sample(signature_transform::count_idf));
  for (std::size_t cut = 0; cut < bytes.size(); ++cut)
    EXPECT_FALSE(parse_centroid_file(std::span(bytes).first(cut), "cut").ok()) << cut;
}

}  // namespace
}  // namespace eldr
