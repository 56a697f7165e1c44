#include "client/served_pieces.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace paramd {
namespace {

// Rows [0, rows) of a row-major [rows, width] array of `element`-byte entries, `from` into columns
// [col_begin, col_begin + width) of a row-major [rows, whole_width] one.
void CopyColumnBlock(const uint8_t* from, int64_t rows, int64_t width, uint8_t* to,
                     int64_t whole_width, int64_t col_begin, int64_t element) {
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(to + (r * whole_width + col_begin) * element, from + r * width * element,
                static_cast<size_t>(width * element));
  }
}

}  // namespace

absl::Status PlaceServedRange(kernels::Recipe recipe, kernels::Direction direction, int64_t rows,
                              int64_t cols, int64_t row_begin, int64_t row_end,
                              std::span<const uint8_t> range, std::span<uint8_t> whole) {
  if (rows < 1 || cols < 1 || row_begin < 0 || row_end <= row_begin || row_end > rows ||
      row_begin % kernels::kServePanelRows != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rows [", row_begin, ", ", row_end, ") of a [", rows, ", ", cols,
                     "] tensor are not a range an owner serves (non-empty, inside it, starting at "
                     "a multiple of ",
                     kernels::kServePanelRows, " rows)"));
  }
  const kernels::ServeBufferLayout w = kernels::ServeLayout(recipe, direction, rows, cols);
  const kernels::ServeBufferLayout p =
      kernels::ServeLayout(recipe, direction, row_end - row_begin, cols);
  if (static_cast<int64_t>(range.size()) != p.data_bytes + p.scale_bytes ||
      static_cast<int64_t>(whole.size()) != w.data_bytes + w.scale_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a range's served bytes are ", p.data_bytes + p.scale_bytes,
                     " and the whole tensor's ", w.data_bytes + w.scale_bytes,
                     " in this format; got ", range.size(), " and ", whole.size()));
  }
  const int64_t element = w.data_bytes / (w.data_rows * w.data_cols);
  // The data: transposed ([cols, rows]) or not.
  if (w.data_rows == rows) {
    std::memcpy(whole.data() + row_begin * w.data_cols * element, range.data(),
                static_cast<size_t>(p.data_bytes));
  } else {
    CopyColumnBlock(range.data(), w.data_rows, p.data_cols, whole.data(), w.data_cols, row_begin,
                    element);
  }
  if (w.scale_count == 0) return absl::OkStatus();
  const uint8_t* scales = range.data() + p.data_bytes;
  uint8_t* whole_scales = whole.data() + w.data_bytes;
  const int64_t scale_element = w.scale_bytes / w.scale_count;
  if (w.scale_count == 1) {  // per tensor: the whole tensor's, the same on every owner
    std::memcpy(whole_scales, scales, static_cast<size_t>(w.scale_bytes));
  } else if (recipe == kernels::Recipe::kFp8Block && direction == kernels::Direction::kColumnwise) {
    // [ceil(cols / 128), ceil(rows / 128)]: a column block.
    CopyColumnBlock(scales, w.scale_rows, p.scale_cols, whole_scales, w.scale_cols,
                    row_begin / kernels::kFp8BlockSize, scale_element);
  } else {
    // A scale row per block of `block` rows.
    const int64_t block = recipe == kernels::Recipe::kFp8Block           ? kernels::kFp8BlockSize
                          : direction == kernels::Direction::kColumnwise ? kernels::kMxBlockSize
                                                                         : 1;
    std::memcpy(whole_scales + (row_begin / block) * w.scale_cols * scale_element, scales,
                static_cast<size_t>(p.scale_bytes));
  }
  return absl::OkStatus();
}

}  // namespace paramd
