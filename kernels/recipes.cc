// The backend-independent part of kernels/recipes.h: buffer layouts, per-tensor scales and the
// amax history of fp8_delayed.
#include "kernels/recipes.h"

#include <algorithm>

#include "kernels/formats.h"

namespace paramd::kernels {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

ServeBufferLayout ServeLayout(Recipe recipe, Direction direction, int64_t rows, int64_t cols) {
  const RecipeInfo& info = RecipeInfoOf(recipe);
  const bool columnwise = direction == Direction::kColumnwise;
  ServeBufferLayout l;
  l.data_dtype = info.data_dtype;
  // Columnwise data is the transpose, except mxfp8's, which keeps [rows, cols].
  const bool transposed = columnwise && info.scale_kind != ScaleKind::kMx32;
  l.data_rows = transposed ? cols : rows;
  l.data_cols = transposed ? rows : cols;
  l.data_bytes = rows * cols * static_cast<int64_t>(DTypeSize(info.data_dtype));
  l.scale_dtype = info.scale_dtype;
  switch (info.scale_kind) {
    case ScaleKind::kNone:
      break;
    case ScaleKind::kTensor:
      l.scale_rows = 1;
      l.scale_cols = 1;
      break;
    case ScaleKind::kBlock128: {
      const int64_t brows = CeilDiv(rows, kFp8BlockSize), bcols = CeilDiv(cols, kFp8BlockSize);
      l.scale_rows = columnwise ? bcols : brows;
      l.scale_cols = columnwise ? brows : bcols;
      break;
    }
    case ScaleKind::kMx32:
      l.scale_rows = columnwise ? CeilDiv(rows, kMxBlockSize) : rows;
      l.scale_cols = columnwise ? cols : CeilDiv(cols, kMxBlockSize);
      break;
  }
  l.scale_count = l.scale_rows * l.scale_cols;
  l.scale_bytes = l.scale_count * static_cast<int64_t>(DTypeSize(info.scale_dtype));
  return l;
}

TensorScale NextFp8TensorScale(float amax, float prev_scale) {
  const float scale = Fp8TensorScale(amax, prev_scale);
  return {scale, ScaleInv(scale)};
}

TensorScale NextFp8DelayedScale(const float* history, int count, int margin, float prev_scale) {
  if (count <= 0) return {1.0f, 1.0f};
  float amax = 0.0f;
  for (int i = 0; i < count; ++i) amax = AmaxCombine(amax, history[i]);
  // 448 * 2^-margin is exact for margin <= 126, so the scale is one FP32 division.
  const float top = kE4m3Max * Pow2(-std::clamp(margin, 0, 126));
  const float scale = ScaleFromAmax(amax, top, prev_scale);
  return {scale, ScaleInv(scale)};
}

AmaxHistory::AmaxHistory(int len) : ring_(static_cast<size_t>(std::max(len, 1)), 0.0f) {}

void AmaxHistory::Append(float amax) {
  ring_[next_] = amax;
  next_ = (next_ + 1) % capacity();
  count_ = std::min(count_ + 1, capacity());
}

TensorScale AmaxHistory::NextScale(int margin, float prev_scale) const {
  const std::vector<float> entries = Entries();
  return NextFp8DelayedScale(entries.data(), count_, margin, prev_scale);
}

std::vector<float> AmaxHistory::Entries() const {
  std::vector<float> out;
  out.reserve(count_);
  for (int i = 0; i < count_; ++i)
    out.push_back(ring_[(next_ - count_ + i + capacity()) % capacity()]);
  return out;
}

void AmaxHistory::Restore(const std::vector<float>& oldest_first) {
  next_ = 0;
  count_ = 0;
  const size_t keep = std::min(oldest_first.size(), ring_.size());
  for (size_t i = oldest_first.size() - keep; i < oldest_first.size(); ++i) Append(oldest_first[i]);
}

}  // namespace paramd::kernels
