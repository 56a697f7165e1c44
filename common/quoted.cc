#include "common/quoted.h"

#include "absl/strings/str_cat.h"

namespace paramd {

std::string Quoted(std::string_view name) {
  std::string out = "\"";
  const std::string_view shown = name.substr(0, kQuotedNameLength);
  for (const char c : shown) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte >= 0x7f || c == '"' || c == '\\') {
      absl::StrAppend(&out, "\\x", absl::Hex(byte, absl::kZeroPad2));
    } else {
      out.push_back(c);
    }
  }
  if (shown.size() < name.size()) {
    absl::StrAppend(&out, "...\" (", name.size(), " bytes)");
  } else {
    out.push_back('"');
  }
  return out;
}

}  // namespace paramd
