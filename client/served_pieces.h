// A split tensor's served bytes put together in the trainer's buffer (DESIGN.md §7): each owner of
// a row range [r0, r1) of a [rows, cols] tensor serves its range as a tensor of its own, and the
// whole tensor's bytes of one recipe and direction are its ranges' in place:
// - rowwise data (and mxfp8's columnwise data, which stays [rows, cols]) is rows r0..r1;
// - a transposed format's data ([cols, rows]: every columnwise recipe but mxfp8) is the column
//   block [:, r0:r1], a strided copy;
// - scales per block of rows (fp8_block rowwise: 128 rows; mxfp8: each row, or 32 rows down a
//   column) are that range of scale rows, fp8_block's columnwise scales a column block;
// - a per-tensor scale (fp8_tensor, fp8_delayed) is the whole tensor's on every owner: any
//   range's serves it.
// Ranges start at multiples of 128 rows (the shard map's unit), so no block straddles two owners.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "kernels/recipes.h"

namespace paramd {

// Copies the served bytes of rows [row_begin, row_end) of a [rows, cols] tensor in `recipe` and
// `direction` (data, then scales, as a pull gives them) to their places in `whole`, the whole
// tensor's bytes in the same layout (kernels::ServeLayout). INVALID_ARGUMENT for a range that is
// empty, outside the tensor or not starting at a multiple of 128 rows, or for sizes that are not
// the layouts'.
absl::Status PlaceServedRange(kernels::Recipe recipe, kernels::Direction direction, int64_t rows,
                              int64_t cols, int64_t row_begin, int64_t row_end,
                              std::span<const uint8_t> range, std::span<uint8_t> whole);

}  // namespace paramd
