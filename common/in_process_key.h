// A secret of this process: 16 random bytes, drawn once. A request field that only a caller in the
// same process may use (a trainer in the daemon's own process lends its GPU memory by address, as
// CUDA opens no process's own IPC handles) carries it; a caller in another process cannot know it,
// so it cannot make the daemon use its pointers by naming the daemon's pid.
#pragma once

#include <string>
#include <string_view>

namespace paramd {

// This process's key (the same bytes on every call).
const std::string& InProcessKey();

// True when `key` is this process's key, compared in time that does not depend on where it differs.
bool IsInProcessKey(std::string_view key);

}  // namespace paramd
