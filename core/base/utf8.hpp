// utf8: well-formedness of UTF-8 text (RFC 3629: no overlong forms, no surrogates, nothing above
// U+10FFFF) and its repair, for text that arrives from outside (clients, publishers, old stores)
// and must be shown, logged or exported.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace eldr {

// The offset of the first byte that does not start a well-formed sequence; s.size() when s is
// well-formed.
size_t utf8_error_at(std::string_view s);
inline bool valid_utf8(std::string_view s) {
  return utf8_error_at(s) == s.size();
}
// s with each byte that is not part of a well-formed sequence replaced by U+FFFD.
std::string utf8_replacing(std::string_view s);

}  // namespace eldr
