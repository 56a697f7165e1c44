#include "common/version.h"

#ifndef PARAMD_VERSION
#error "PARAMD_VERSION is defined by common/CMakeLists.txt from the project's version"
#endif

namespace paramd {

std::string_view Version() { return PARAMD_VERSION; }

}  // namespace paramd
