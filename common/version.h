// paramd's version: the one the CMake project declares (CMakeLists.txt), read by the daemon's
// Status, every program's --version, and the recipes' image tags.
#pragma once

#include <string_view>

namespace paramd {

std::string_view Version();

}  // namespace paramd
