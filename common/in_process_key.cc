#include "common/in_process_key.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>

#include "common/logging.h"

namespace paramd {

const std::string& InProcessKey() {
  static const std::string* const key = [] {
    auto* bytes = new std::string(16, '\0');
    size_t filled = 0;
    while (filled < bytes->size()) {
      const ssize_t n = getrandom(bytes->data() + filled, bytes->size() - filled, 0);
      if (n < 0 && errno == EINTR) continue;
      PARAMD_CHECK(n > 0) << "getrandom failed (errno " << errno << "): no in-process key";
      filled += static_cast<size_t>(n);
    }
    return bytes;
  }();
  return *key;
}

bool IsInProcessKey(std::string_view key) {
  const std::string& own = InProcessKey();
  if (key.size() != own.size()) return false;
  uint8_t differ = 0;
  for (size_t i = 0; i < own.size(); ++i) {
    differ |= static_cast<uint8_t>(key[i]) ^ static_cast<uint8_t>(own[i]);
  }
  return differ == 0;
}

}  // namespace paramd
