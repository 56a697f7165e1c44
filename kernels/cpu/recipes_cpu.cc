// ServeQuantizeCpu and the amax functions: argument checks, the choice of code path, and every
// recipe x direction built once from the loops of kernels/cpu/recipes_paths.h. Columnwise outputs
// that are transposes are produced per tile of at most 128 x 128 elements: cast rowwise into a
// small buffer, then written transposed, so reads and writes both stay sequential.
#include <emmintrin.h>  // SSE2, part of x86-64: the transposes below

#include <algorithm>
#include <cstring>
#include <string>

#include "kernels/cpu/recipes_paths.h"
#include "kernels/recipes.h"

namespace paramd::kernels {
namespace {

using cpu_internal::ServeKernels;

constexpr int64_t kTile = 128;        // transposed tiles: kTile x kTile elements at most
constexpr int64_t kMxColChunk = 256;  // mxfp8 columnwise: columns per pass over a 32-row group

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The scales follow the data bytes in one buffer, so they have no alignment (recipes.h): a float
// store through a float* there is undefined behaviour (UBSan: misaligned store).
void StoreScale(void* scales, int64_t i, float value) {
  std::memcpy(static_cast<uint8_t*>(scales) + i * static_cast<int64_t>(sizeof(float)), &value,
              sizeof(float));
}

const ServeKernels& KernelsFor(CpuPath path) {
  switch (path) {
    case CpuPath::kAvx512:
      return cpu_internal::Avx512ServeKernels();
    case CpuPath::kAvx2:
      return cpu_internal::Avx2ServeKernels();
    default:
      return cpu_internal::ScalarServeKernels();
  }
}

// The path to run: kAuto resolves to the best; one this CPU cannot run is nullopt.
std::optional<CpuPath> Resolve(CpuPath path) {
  if (path == CpuPath::kAuto) return BestCpuPath();
  if (!CpuPathSupported(path)) return std::nullopt;
  return path;
}

KStatus Invalid(const std::string& what) {
  return KStatus(Code::kInvalidArgument, "ServeQuantizeCpu: " + what);
}

KStatus Validate(const ServeArgs& a, int64_t row_begin, int64_t row_end) {
  if (a.rows < 0 || a.cols < 0) {
    return Invalid("bad shape [" + std::to_string(a.rows) + ", " + std::to_string(a.cols) + "]");
  }
  if (static_cast<int>(a.recipe) >= kNumRecipes) return Invalid("unknown recipe");
  if (a.direction != Direction::kRowwise && a.direction != Direction::kColumnwise) {
    return Invalid("unknown direction");
  }
  if (row_begin < 0 || row_end < row_begin || row_end > a.rows ||
      row_begin % kServePanelRows != 0 || (row_end % kServePanelRows != 0 && row_end != a.rows)) {
    return Invalid("row range [" + std::to_string(row_begin) + ", " + std::to_string(row_end) +
                   ") of " + std::to_string(a.rows) +
                   " rows: it must start at a multiple of 128 and end at one or at the last row");
  }
  const ServeBufferLayout layout = ServeLayout(a.recipe, a.direction, a.rows, a.cols);
  const bool from_halves = a.recipe == Recipe::kBf16 && a.bf16_halves != nullptr;
  if (a.master == nullptr && !from_halves && a.rows * a.cols > 0) return Invalid("master is null");
  if (a.data == nullptr && layout.data_bytes > 0) return Invalid("data is null");
  if (a.scales == nullptr && layout.scale_count > 0) return Invalid("scales is null");
  if (a.chunk_amax_bits != nullptr &&
      (a.recipe != Recipe::kFp8Block || a.cols % kFp8BlockSize != 0)) {
    return Invalid("chunk amaxes serve fp8_block with a multiple of 128 columns only, not " +
                   std::string(RecipeName(a.recipe)) + " with " + std::to_string(a.cols));
  }
  if (RecipeInfoOf(a.recipe).scale_kind == ScaleKind::kTensor) {
    const uint32_t bits = std::bit_cast<uint32_t>(a.tensor_scale);
    if (bits == 0 || bits >= 0x7F800000u) {
      return Invalid("tensor_scale must be positive and finite, got " +
                     std::to_string(a.tensor_scale));
    }
  }
  return KStatus::Ok();
}

// One stage of the in-register transpose of kM rows: interleaves kUnit-byte units of register
// pairs (2i, 2i + 1), the low halves into register i and the high halves into register i + kM/2.
template <int kM, int kUnit>
inline void TransposeStage(__m128i* x) {
  __m128i y[kM];
#pragma GCC unroll 16
  for (int i = 0; i < kM / 2; ++i) {
    const __m128i a = x[2 * i], b = x[2 * i + 1];
    if constexpr (kUnit == 1) {
      y[i] = _mm_unpacklo_epi8(a, b), y[i + kM / 2] = _mm_unpackhi_epi8(a, b);
    } else if constexpr (kUnit == 2) {
      y[i] = _mm_unpacklo_epi16(a, b), y[i + kM / 2] = _mm_unpackhi_epi16(a, b);
    } else if constexpr (kUnit == 4) {
      y[i] = _mm_unpacklo_epi32(a, b), y[i + kM / 2] = _mm_unpackhi_epi32(a, b);
    } else {
      y[i] = _mm_unpacklo_epi64(a, b), y[i + kM / 2] = _mm_unpackhi_epi64(a, b);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < kM; ++i) x[i] = y[i];
}

// The column register j holds after the stages: j with its log2(kM) bits reversed.
template <int kM>
constexpr int TransposedColumn(int j) {
  int out = 0;
  for (int bit = 1, rev = kM / 2; bit < kM; bit <<= 1, rev >>= 1) out |= (j & bit) ? rev : 0;
  return out;
}

// Transposes one kM x kM block of T (kM = 16 / sizeof(T): one 16-byte register per row). Pure
// data movement, so any path may use it.
template <typename T>
inline void TransposeBlock(const T* in, int64_t in_stride, T* out, int64_t out_stride) {
  constexpr int kM = 16 / sizeof(T);
  __m128i x[kM];
#pragma GCC unroll 16
  for (int r = 0; r < kM; ++r) {
    x[r] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + r * in_stride));
  }
  if constexpr (sizeof(T) == 1) TransposeStage<kM, 1>(x);
  if constexpr (sizeof(T) <= 2) TransposeStage<kM, 2>(x);
  TransposeStage<kM, 4>(x);
  TransposeStage<kM, 8>(x);
#pragma GCC unroll 16
  for (int j = 0; j < kM; ++j) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + TransposedColumn<kM>(j) * out_stride), x[j]);
  }
}

// Casts rows [r0, r1) x columns [c0, c1) of the master with cast(x, n, out) into a tile, then
// writes it transposed into out [cols, rows]: whole m x m blocks in registers, the edges by
// element.
template <typename T, typename Cast>
void CastTransposed(const ServeArgs& a, int64_t r0, int64_t r1, int64_t c0, int64_t c1, Cast cast,
                    T* out) {
  constexpr int64_t m = 16 / sizeof(T);
  T tile[kTile * kTile];
  const int64_t h = r1 - r0, w = c1 - c0;
  for (int64_t r = 0; r < h; ++r) {
    const float* row = a.master + (r0 + r) * a.cols;
    cast(row + c0, w, tile + r * w);
    // The next tile's part of this row: h short strided streams, too many for the hardware
    // prefetchers to follow.
    for (int64_t c = c1; c < std::min(c1 + kTile, a.cols); c += 16) {
      _mm_prefetch(reinterpret_cast<const char*>(row + c), _MM_HINT_T0);
    }
  }
  const int64_t h_blocks = h / m * m, w_blocks = w / m * m;
  for (int64_t c = 0; c < w_blocks; c += m) {
    for (int64_t r = 0; r < h_blocks; r += m) {
      TransposeBlock(tile + r * w + c, w, out + (c0 + c) * a.rows + r0 + r, a.rows);
    }
  }
  for (int64_t c = 0; c < w; ++c) {
    T* dst = out + (c0 + c) * a.rows + r0;
    for (int64_t r = c < w_blocks ? h_blocks : 0; r < h; ++r) dst[r] = tile[r * w + c];
  }
}

// An elementwise recipe (plain casts, per-tensor FP8) over rows [rb, re), either direction.
template <typename T, typename Cast>
void Elementwise(const ServeArgs& a, int64_t rb, int64_t re, Cast cast) {
  T* out = static_cast<T*>(a.data);
  if (a.direction == Direction::kRowwise) {
    cast(a.master + rb * a.cols, (re - rb) * a.cols, out + rb * a.cols);
    return;
  }
  for (int64_t r0 = rb; r0 < re; r0 += kTile) {
    for (int64_t c0 = 0; c0 < a.cols; c0 += kTile) {
      CastTransposed<T>(a, r0, std::min(r0 + kTile, re), c0, std::min(c0 + kTile, a.cols), cast,
                        out);
    }
  }
}

// bf16 from a bf16+remainder master's stored halves, rows [rb, re), either direction.
void Bf16Halves(const ServeArgs& a, int64_t rb, int64_t re) {
  auto* out = static_cast<uint16_t*>(a.data);
  if (a.direction == Direction::kRowwise) {
    if (re > rb) {
      std::memcpy(out + rb * a.cols, a.bf16_halves + rb * a.cols,
                  static_cast<size_t>((re - rb) * a.cols) * sizeof(uint16_t));
    }
    return;
  }
  for (int64_t r = rb; r < re; ++r) {
    for (int64_t c = 0; c < a.cols; ++c) out[c * a.rows + r] = a.bf16_halves[r * a.cols + c];
  }
}

// The amax bits of fp8_block's column blocks [b0, b1) over rows [r0, r1) into bits[bc - b0]
// (zeroed first): from the step's chunk amaxes where the caller has them (`chunks`: row r0's
// first), else read from the master a row at a time.
void BlockAmaxBits(const ServeKernels& k, const ServeArgs& a, const uint32_t* chunks, int64_t r0,
                   int64_t r1, int64_t b0, int64_t b1, uint32_t* bits) {
  const int64_t bcols = CeilDiv(a.cols, kFp8BlockSize);
  std::fill(bits, bits + (b1 - b0), 0u);
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t bc = b0; bc < b1; ++bc) {
      const int64_t c0 = bc * kFp8BlockSize, c1 = std::min(c0 + kFp8BlockSize, a.cols);
      const uint32_t row_bits = chunks != nullptr
                                    ? chunks[(r - r0) * bcols + bc]
                                    : k.max_abs_bits(a.master + r * a.cols + c0, c1 - c0);
      bits[bc - b0] = std::max(bits[bc - b0], row_bits);
    }
  }
}

// Rowwise fp8_block over one 128-row block row [r0, r1): the column blocks in bands of
// kBandBlocks, each band's rows read twice (the amaxes, then the casts) while the band is in L2,
// or once where the step left the amaxes (`chunks`, BlockAmaxBits). A band's row is 4 KiB of FP32
// values, a whole page, where a block at a time read 128 rows of 512 bytes, each on a page of its
// own (on a 16-core Xeon host a few percent of the fp8 step).
void BlockRowRowwise(const ServeKernels& k, const ServeArgs& a, const uint32_t* chunks, int64_t r0,
                     int64_t r1) {
  constexpr int64_t kBandBlocks = 8;
  const int64_t bcols = CeilDiv(a.cols, kFp8BlockSize), br = r0 / kFp8BlockSize;
  uint8_t* data = static_cast<uint8_t*>(a.data);
  for (int64_t b0 = 0; b0 < bcols; b0 += kBandBlocks) {
    const int64_t b1 = std::min(b0 + kBandBlocks, bcols);
    uint32_t bits[kBandBlocks];
    float scale[kBandBlocks];
    BlockAmaxBits(k, a, chunks, r0, r1, b0, b1, bits);
    for (int64_t bc = b0; bc < b1; ++bc) {
      scale[bc - b0] = Pow2Scale(AmaxFromBits(bits[bc - b0]), kE4m3Max);
      StoreScale(a.scales, br * bcols + bc, ScaleInv(scale[bc - b0]));
    }
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t bc = b0; bc < b1; ++bc) {
        const int64_t c0 = bc * kFp8BlockSize, c1 = std::min(c0 + kFp8BlockSize, a.cols);
        k.e4m3_scaled(a.master + r * a.cols + c0, c1 - c0, scale[bc - b0], data + r * a.cols + c0);
      }
    }
  }
}

// fp8_block: rows [rb, re) hold whole 128-row blocks (the last one possibly partial).
void Block(const ServeKernels& k, const ServeArgs& a, int64_t rb, int64_t re) {
  const int64_t brows = CeilDiv(a.rows, kFp8BlockSize), bcols = CeilDiv(a.cols, kFp8BlockSize);
  // The step's chunk amaxes of block row r0's first row, where it left them.
  const auto chunks = [&](int64_t r0) {
    return a.chunk_amax_bits != nullptr ? a.chunk_amax_bits + (r0 - rb) * bcols : nullptr;
  };
  if (a.direction == Direction::kRowwise) {
    for (int64_t r0 = rb; r0 < re; r0 += kFp8BlockSize) {
      BlockRowRowwise(k, a, chunks(r0), r0, std::min(r0 + kFp8BlockSize, re));
    }
    return;
  }
  uint8_t* data = static_cast<uint8_t*>(a.data);
  for (int64_t r0 = rb; r0 < re; r0 += kFp8BlockSize) {
    const int64_t r1 = std::min(r0 + kFp8BlockSize, re), br = r0 / kFp8BlockSize;
    for (int64_t bc = 0; bc < bcols; ++bc) {
      const int64_t c0 = bc * kFp8BlockSize, c1 = std::min(c0 + kFp8BlockSize, a.cols);
      uint32_t bits;
      BlockAmaxBits(k, a, chunks(r0), r0, r1, bc, bc + 1, &bits);
      const float scale = Pow2Scale(AmaxFromBits(bits), kE4m3Max);
      const auto cast = [&k, scale](const float* x, int64_t n, uint8_t* out) {
        k.e4m3_scaled(x, n, scale, out);
      };
      CastTransposed<uint8_t>(a, r0, r1, c0, c1, cast, data);
      StoreScale(a.scales, bc * brows + br, ScaleInv(scale));
    }
  }
}

// mxfp8 columnwise: 32-row groups; per group and chunk of columns, the column amaxes, their
// codes and data scales, then each row cast with its columns' scales.
void MxColumnwise(const ServeKernels& k, const ServeArgs& a, int64_t rb, int64_t re) {
  uint8_t* data = static_cast<uint8_t*>(a.data);
  uint8_t* codes = static_cast<uint8_t*>(a.scales);
  uint32_t bits[kMxColChunk];
  float scale[kMxColChunk];
  for (int64_t r0 = rb; r0 < re; r0 += kMxBlockSize) {
    const int64_t r1 = std::min(r0 + kMxBlockSize, re);
    for (int64_t c0 = 0; c0 < a.cols; c0 += kMxColChunk) {
      const int64_t w = std::min(kMxColChunk, a.cols - c0);
      std::fill_n(bits, w, 0u);
      k.column_max_abs_bits(a.master + r0 * a.cols + c0, a.cols, r1 - r0, w, bits);
      uint8_t* group_codes = codes + (r0 / kMxBlockSize) * a.cols + c0;
      for (int64_t j = 0; j < w; ++j) {
        group_codes[j] = MxScaleCode(AmaxFromBits(bits[j]));
        scale[j] = MxDataScale(group_codes[j]);
      }
      for (int64_t r = r0; r < r1; ++r) {
        k.e4m3_scaled_each(a.master + r * a.cols + c0, w, scale, data + r * a.cols + c0);
      }
    }
  }
}

void Run(const ServeKernels& k, const ServeArgs& a, int64_t rb, int64_t re) {
  switch (a.recipe) {
    case Recipe::kFp32:
      Elementwise<float>(a, rb, re, [](const float* x, int64_t n, float* out) {
        if (n > 0) std::memcpy(out, x, n * sizeof(float));
      });
      return;
    case Recipe::kBf16:
      if (a.bf16_halves != nullptr) {
        Bf16Halves(a, rb, re);
      } else {
        Elementwise<uint16_t>(a, rb, re, k.bf16);
      }
      return;
    case Recipe::kFp16:
      Elementwise<uint16_t>(a, rb, re, k.fp16);
      return;
    case Recipe::kFp8Tensor:
    case Recipe::kFp8Delayed:
      Elementwise<uint8_t>(a, rb, re, [&k, &a](const float* x, int64_t n, uint8_t* out) {
        k.e4m3_scaled(x, n, a.tensor_scale, out);
      });
      if (rb == 0) StoreScale(a.scales, 0, ScaleInv(a.tensor_scale));
      return;
    case Recipe::kFp8Block:
      Block(k, a, rb, re);
      return;
    case Recipe::kMxfp8:
      if (a.direction == Direction::kRowwise) {
        const int64_t nb = CeilDiv(a.cols, kMxBlockSize);
        uint8_t* data = static_cast<uint8_t*>(a.data);
        uint8_t* codes = static_cast<uint8_t*>(a.scales);
        for (int64_t r = rb; r < re; ++r) {
          k.mx_row(a.master + r * a.cols, a.cols, data + r * a.cols, codes + r * nb);
        }
      } else {
        MxColumnwise(k, a, rb, re);
      }
      return;
  }
}

}  // namespace

KStatus ServeQuantizeCpu(const ServeArgs& args, int64_t row_begin, int64_t row_end, CpuPath path) {
  if (KStatus st = Validate(args, row_begin, row_end); !st.ok()) return st;
  const std::optional<CpuPath> resolved = Resolve(path);
  if (!resolved) {
    return KStatus(Code::kUnimplemented, std::string("ServeQuantizeCpu: this CPU cannot run the ") +
                                             CpuPathName(path) + " path");
  }
  Run(KernelsFor(*resolved), args, row_begin, row_end);
  return KStatus::Ok();
}

float AmaxCpu(const float* x, int64_t n, CpuPath path) {
  if (n <= 0) return 0.0f;
  // Every path gives the same bits, so one this CPU cannot run is replaced by the scalar one.
  const ServeKernels& k = KernelsFor(Resolve(path).value_or(CpuPath::kScalar));
  return AmaxFromBits(k.max_abs_bits(x, n));
}

float AmaxRowsCpu(const float* master, int64_t cols, int64_t row_begin, int64_t row_end,
                  CpuPath path) {
  return AmaxCpu(master + row_begin * cols, (row_end - row_begin) * cols, path);
}

}  // namespace paramd::kernels
