// The one-line progress bar paramctl draws on a terminal while a checkpoint is written or
// restored, rendered from the numbers alone so that it can be tested without a terminal.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace paramd {

// `label`, a bar of `width` cells, the percent done, MB (10^6 bytes) done of `total` and the rate
// over `seconds`: "checkpoint mlp [#######-------]  50.0%  512.0/1024.0 MB  256.0 MB/s". `done`
// is taken between 0 and `total`; the cells and the percent are rounded down, so that only all of
// it reads full and 100.0 %. A `total` of 0 or less reads 0 %, `seconds` of 0 or less a rate of 0.
std::string ProgressLine(std::string_view label, int64_t done, int64_t total, double seconds,
                         int width = 30);

}  // namespace paramd
