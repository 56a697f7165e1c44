// A name from a request, as error messages and logs quote it: in double quotes, bytes outside
// printable ASCII escaped (\xNN), and cut after kQuotedNameLength characters with its length
// ("abc..." (10240 bytes)), so a 10 KB name cannot push a status past a client's metadata limit.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace paramd {

inline constexpr size_t kQuotedNameLength = 64;

std::string Quoted(std::string_view name);

}  // namespace paramd
