#include "tools/progress_bar.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

namespace paramd {

std::string ProgressLine(std::string_view label, int64_t done, int64_t total, double seconds,
                         int width) {
  const int64_t clamped = std::clamp<int64_t>(done, 0, std::max<int64_t>(total, 0));
  const double fraction = total > 0 ? static_cast<double>(clamped) / static_cast<double>(total) : 0;
  const int cells = std::max(width, 0);
  // Both rounded down: a full bar and 100.0 % mean all of it.
  const int filled = static_cast<int>(fraction * cells);
  const double percent = std::floor(fraction * 1000) / 10;
  const double mb = static_cast<double>(clamped) / 1e6;
  return absl::StrFormat("%s [%s%s] %5.1f%%  %.1f/%.1f MB  %.1f MB/s", label,
                         std::string(static_cast<size_t>(filled), '#'),
                         std::string(static_cast<size_t>(cells - filled), '-'), percent, mb,
                         static_cast<double>(std::max<int64_t>(total, 0)) / 1e6,
                         seconds > 0 ? mb / seconds : 0.0);
}

}  // namespace paramd
