// format_head: see format_head.hpp.
#include "core/formats/format_head.hpp"

namespace eldr {

status check_format_head(std::span<const uint8_t> bytes, std::string_view format,
                         std::initializer_list<uint32_t> versions, uint32_t& version) {
  using F = table::fields<format_head, file_limits>;
  // Neither field is required here: a file of another type is named by its format even when it
  // has no version.
  const table::message_table<format_head, file_limits> head{
      format,
      {F::str<&format_head::format>("format", &file_limits::max_name_bytes, table::once),
       F::u32<&format_head::version>("version", table::once)}};
  msgpack::reader r(bytes.data(), bytes.size());
  std::monostate none;
  const file_limits limits;
  format_head h;
  if (status s = head.read(r, {limits, bytes, none}, h); !s.ok()) return s;
  const auto quoted = [](std::string_view s) { return table::join(table::join("\"", s), "\""); };
  if (!h.format) return table::missing(format, "format");
  if (*h.format != format)
    return status::invalid_argument(table::field(format, "format: ") + quoted(*h.format) +
                                    ", expected " + quoted(format));
  if (!h.version) return table::missing(format, "version");
  std::string known;
  for (uint32_t v : versions) {
    if (v == *h.version) {
      version = v;
      return {};
    }
    known += (known.empty() ? "" : " and ") + std::to_string(v);
  }
  return status::failed_precondition(table::field(format, "version: ") +
                                     std::to_string(*h.version) + ", this build reads " + known);
}

}  // namespace eldr
