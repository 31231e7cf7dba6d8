// spelling: "did you mean" for the words an operator types -- config keys (node_config) and
// eldrctl's subcommands -- so both suggest alike.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string_view>

namespace eldr {

// Levenshtein distance: insertions, deletions and substitutions of one byte each.
std::size_t edit_distance(std::string_view a, std::string_view b);

// The candidate closest to `word` if it is within max_distance edits (the first such on a tie),
// else nullopt. A typo of one or two letters is caught; an unrelated word is not "corrected".
std::optional<std::string_view> closest_spelling(std::string_view word,
                                                 std::span<const std::string_view> candidates,
                                                 std::size_t max_distance = 2);

}  // namespace eldr
