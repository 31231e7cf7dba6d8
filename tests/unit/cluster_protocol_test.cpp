// The cluster protocol's version guards its layouts (actors/cluster/cluster_protocol.hpp): CAF
// serializes a type's fields by position, so a build that adds, drops or widens a field of a
// cluster type cannot talk to the builds before it, and must say so with another
// cluster_protocol_version (nodes of different versions refuse each other at the hello). This
// test fingerprints every type register_cluster_types registers -- its name and the bytes of a
// default-constructed value, in name order -- and fails when the layouts change while the version
// does not.
#include <gtest/gtest.h>

#include <caf/all.hpp>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "actors/cluster/cluster_protocol.hpp"
#include "cluster/security/hmac.hpp"

namespace eldr {
namespace {

// Every cluster_protocol_version with the fingerprint of its layouts. Append a row when the
// layouts change (the test's message prints the new fingerprint); never edit an existing one.
struct protocol_row {
  uint32_t version;
  const char* fingerprint;
};
constexpr protocol_row protocol_history[] = {
    {1, "079b4b724e8448bb"},
};

// The names and default bytes of the types register_cluster_types registers.
std::map<std::string, std::vector<char>> registered_layouts() {
  caf::actor_system_config plain;
  caf::actor_system_config cfg;
  register_cluster_types(cfg);
  cfg.set("scheduler.max-threads", size_t{1});
  cfg.set("logger.console", caf::atom("none"));
  // A system (no middleman, no socket) for the serializer's context: actor handles need one.
  caf::actor_system sys{cfg};
  std::map<std::string, std::vector<char>> out;
  for (const auto& [name, make] : cfg.value_factories_by_name) {
    if (plain.value_factories_by_name.count(name)) continue;  // CAF's own (may be re-registered)
    if (name.rfind("stream<", 0) == 0) continue;  // CAF's stream wrapper of each type: no fields
    std::vector<char> bytes;
    caf::binary_serializer sink{sys, bytes};
    auto value = make();
    EXPECT_FALSE(value->save(sink)) << name;
    out[name] = bytes;
  }
  return out;
}

std::string fingerprint(const std::map<std::string, std::vector<char>>& layouts) {
  std::string text;
  for (const auto& [name, bytes] : layouts) {
    text += name;
    text += '\0';
    text += std::to_string(bytes.size());
    text += '\0';
    text.append(bytes.begin(), bytes.end());
  }
  const auto digest = sha256(text);
  return to_hex(std::span<const uint8_t>(digest.data(), 8));
}

TEST(ClusterProtocol, EveryClusterTypeIsRegisteredAndSerializes) {
  const auto layouts = registered_layouts();
  // The types of cluster_protocol.hpp, by their wire names (a sample: a type missing from the
  // registration makes remote_actor fail at run time, so the list is checked here).
  for (const char* name :
       {"eldr::member_info", "eldr::join_challenge", "eldr::join_welcome", "eldr::worker_row",
        "eldr::pool_snapshot", "eldr::load_delta_msg", "eldr::load_vector_msg",
        "eldr::shard_sign_request", "eldr::handoff_block"})
    EXPECT_TRUE(layouts.count(name)) << name << " is not registered";
  // A default value serializes to something: its fields are there to fingerprint.
  for (const auto& [name, bytes] : layouts)
    EXPECT_FALSE(bytes.empty()) << name;
}

TEST(ClusterProtocol, TheVersionChangesWithTheLayouts) {
  const auto& newest = protocol_history[std::size(protocol_history) - 1];
  ASSERT_EQ(newest.version, cluster_protocol_version)
      << "cluster_protocol_version changed: append a row {" << cluster_protocol_version << ", \""
      << fingerprint(registered_layouts()) << "\"} to protocol_history";
  EXPECT_EQ(fingerprint(registered_layouts()), newest.fingerprint)
      << "a cluster type's fields changed (actors/cluster/cluster_protocol.hpp): nodes of this "
         "build and the last cannot read each other's messages. Raise cluster_protocol_version "
         "and append its row with this fingerprint to protocol_history.";
  // Versions only grow, and a fingerprint names one version.
  for (size_t i = 1; i < std::size(protocol_history); ++i) {
    EXPECT_LT(protocol_history[i - 1].version, protocol_history[i].version);
    for (size_t j = 0; j < i; ++j)
      EXPECT_STRNE(protocol_history[i].fingerprint, protocol_history[j].fingerprint);
  }
}

// What the fingerprint sees: one field more in a type (here worker_row, also carried inside
// pool_snapshot) changes it.
TEST(ClusterProtocol, TheFingerprintSeesAFieldAdded) {
  auto layouts = registered_layouts();
  const auto before = fingerprint(layouts);
  ASSERT_TRUE(layouts.count("eldr::worker_row"));
  layouts["eldr::worker_row"].push_back(0);  // as a bool appended to worker_row would serialize
  EXPECT_NE(fingerprint(layouts), before);
}

// A router's refit sample crosses the cluster as packed little-endian floats (sample_reply):
// whole rows come back as they went, a ragged payload is refused and appends nothing.
TEST(ClusterProtocol, SamplePointsPackAndUnpackWholeRows) {
  const std::vector<float> rows = {0.5f, -1.0f, 0.0f, 2.25f, 3.0f, 1e-7f};
  const std::vector<uint8_t> packed = pack_points(rows);
  EXPECT_EQ(packed.size(), rows.size() * sizeof(float));
  std::vector<float> out = {9.0f};
  ASSERT_TRUE(unpack_points(packed, 3, out));
  EXPECT_EQ(out, (std::vector<float>{9.0f, 0.5f, -1.0f, 0.0f, 2.25f, 3.0f, 1e-7f}));
  EXPECT_FALSE(unpack_points(packed, 4, out));  // 6 floats are not rows of 4
  EXPECT_FALSE(unpack_points(std::span<const uint8_t>(packed).first(5), 1, out));
  EXPECT_FALSE(unpack_points(packed, 0, out));
  EXPECT_EQ(out.size(), 7u);
  EXPECT_TRUE(pack_points({}).empty());
}

}  // namespace
}  // namespace eldr
