// The serve kernel: every recipe x direction of kernels/recipes.h from a stored master, many
// outputs in one launch (pass 2 of FusedStepCuda, and ServeQuantizeCuda). A thread block owns a
// 128 x 128 tile of one output (edge tiles partial): it reads the tile's master once into shared
// memory (FP32, rows padded to 129 floats so that row and column walks are both free of bank
// conflicts) and writes the tile's data and scales: plain and per-tensor casts element by element
// (columnwise ones transposed), fp8_block from the tile's amax, mxfp8 rowwise with a warp per
// 32-element block, mxfp8 columnwise with the column codes first and the data second.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_vec.cuh"
#include "kernels/cuda/serve_launch.h"
#include "kernels/cuda/step_desc.h"
#include "kernels/cuda/step_math.cuh"
#include "kernels/cuda_step.h"
#include "kernels/recipes.h"

namespace paramd::kernels::cuda_internal {
namespace {

// Floats per row of the tile: odd, so row walks and column walks are both free of bank conflicts.
constexpr int kServeStride = 129;
constexpr uint32_t kBufBytes = kTileRows * kServeStride * 4;
constexpr uint32_t kSmemBytes = kBufBytes + 4 * 128 /* mx column codes */ + 64 /* reduce */;

// The stored master value of element i as FP32 (what ServeQuantizeCpu reads); for a
// bf16+remainder master's bf16 output, its stored served half as the bits of a float.
__device__ __forceinline__ float SourceValue(const ServeDesc& d, int64_t i, bool raw_half) {
  switch (d.master_type) {
    case static_cast<uint8_t>(MasterType::kFp16):
      return DecodeFp16(static_cast<const uint16_t*>(d.master)[i]);
    case static_cast<uint8_t>(MasterType::kBf16Remainder): {
      const uint32_t hi = static_cast<const uint16_t*>(d.master)[i];
      if (raw_half) return __uint_as_float(hi);
      return MergeMaster(hi, static_cast<uint16_t>(d.remainder[i]));
    }
    default:
      return static_cast<const float*>(d.master)[i];
  }
}

// Elementwise recipes: one value -> its code (E4M3 with `scale`).
__device__ __forceinline__ void StoreCast(uint8_t recipe, bool raw_half, float x, float scale,
                                          void* data, int64_t at) {
  switch (recipe) {
    case static_cast<uint8_t>(Recipe::kFp32):
      static_cast<float*>(data)[at] = x;
      break;
    case static_cast<uint8_t>(Recipe::kBf16):
      static_cast<uint16_t*>(data)[at] =
          static_cast<uint16_t>(raw_half ? __float_as_uint(x) : Bf16(x));
      break;
    case static_cast<uint8_t>(Recipe::kFp16):
      static_cast<uint16_t*>(data)[at] = static_cast<uint16_t>(Fp16(x));
      break;
    default:
      static_cast<uint8_t*>(data)[at] = static_cast<uint8_t>(E4m3(__fmul_rn(x, scale)));
      break;
  }
}

__device__ uint32_t BlockMax(uint32_t x, uint32_t* reduce) {
  x = WarpMaxU(x);
  if ((threadIdx.x & 31) == 0) reduce[threadIdx.x >> 5] = x;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t out = 0;
    for (int k = 0; k < kThreads / 32; ++k) out = max(out, reduce[k]);
    reduce[8] = out;
  }
  __syncthreads();
  return reduce[8];
}

__global__ void __launch_bounds__(kThreads)
    ServeKernel(const ServeDesc* descs, const int64_t* starts, int n, const int* all_finite) {
  // Pass 2 of a step decided on the device that was skipped: nothing to serve anew.
  if (all_finite != nullptr && *all_finite == 0) return;
  extern __shared__ __align__(16) unsigned char smem[];
  float* buf = reinterpret_cast<float*>(smem);
  uint8_t* codes = smem + kBufBytes;
  uint32_t* reduce = reinterpret_cast<uint32_t*>(smem + kBufBytes + 4 * 128);
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;

  const int64_t tile = blockIdx.x;
  const ServeDesc& d = descs[FindOwner(starts, n, tile)];
  const int64_t local = tile - d.first_tile;
  const int64_t tr = local / d.tile_cols, tc = local - tr * d.tile_cols;
  const int64_t r0 = tr * kTileRows, c0 = tc * kTileCols;
  const int h = static_cast<int>(min(static_cast<int64_t>(kTileRows), d.rows - r0));
  const int wd = static_cast<int>(min(static_cast<int64_t>(kTileCols), d.cols - c0));
  const uint8_t recipe = d.recipe;
  const bool columnwise = d.direction == static_cast<uint8_t>(Direction::kColumnwise);
  const bool raw_half = recipe == static_cast<uint8_t>(Recipe::kBf16) &&
                        d.master_type == static_cast<uint8_t>(MasterType::kBf16Remainder);

  uint32_t bits = 0;
  for (int rr = w; rr < h; rr += 8) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int cc = lane + 32 * q;
      if (cc >= wd) continue;
      const float x = SourceValue(d, (r0 + rr) * d.cols + c0 + cc, raw_half);
      buf[rr * kServeStride + cc] = x;
      bits = max(bits, AbsBitsDev(x));
    }
  }
  __syncthreads();

  if (recipe == static_cast<uint8_t>(Recipe::kMxfp8)) {
    uint8_t* data = static_cast<uint8_t*>(d.data);
    uint8_t* scales = static_cast<uint8_t*>(d.scales);
    if (!columnwise) {
      const int64_t blocks_per_row = (d.cols + 31) / 32;
      for (int rr = w; rr < h; rr += 8) {
        for (int q = 0; q * 32 < wd; ++q) {
          const int cc = 32 * q + lane;
          const float x = cc < wd ? buf[rr * kServeStride + cc] : 0.0f;
          const uint8_t code = MxScaleCode(AmaxFromBits(WarpMaxU(cc < wd ? AbsBitsDev(x) : 0u)));
          if (cc < wd) {
            data[(r0 + rr) * d.cols + c0 + cc] =
                static_cast<uint8_t>(E4m3(__fmul_rn(x, MxDataScale(code))));
          }
          if (lane == 0) scales[(r0 + rr) * blocks_per_row + c0 / 32 + q] = code;
        }
      }
      return;
    }
    const int groups = (h + 31) / 32;
    for (int idx = w; idx < groups * wd; idx += 8) {
      const int g = idx / wd, cc = idx - g * wd;
      const int rr = 32 * g + lane;
      const uint32_t b = rr < h ? AbsBitsDev(buf[rr * kServeStride + cc]) : 0u;
      const uint8_t code = MxScaleCode(AmaxFromBits(WarpMaxU(b)));
      if (lane == 0) {
        codes[g * 128 + cc] = code;
        scales[(r0 / 32 + g) * d.cols + c0 + cc] = code;
      }
    }
    __syncthreads();
    for (int rr = w; rr < h; rr += 8) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int cc = lane + 32 * q;
        if (cc >= wd) continue;
        const float scale = MxDataScale(codes[(rr / 32) * 128 + cc]);
        data[(r0 + rr) * d.cols + c0 + cc] =
            static_cast<uint8_t>(E4m3(__fmul_rn(buf[rr * kServeStride + cc], scale)));
      }
    }
    return;
  }

  float scale = 1.0f;
  if (recipe == static_cast<uint8_t>(Recipe::kFp8Block)) {
    scale = Pow2Scale(AmaxFromBits(BlockMax(bits, reduce)), kE4m3Max);
    if (threadIdx.x == 0) {
      const int64_t brows = (d.rows + kTileRows - 1) / kTileRows;
      static_cast<float*>(d.scales)[columnwise ? tc * brows + tr : tr * d.tile_cols + tc] =
          ScaleInv(scale);
    }
  } else if (recipe == static_cast<uint8_t>(Recipe::kFp8Tensor) ||
             recipe == static_cast<uint8_t>(Recipe::kFp8Delayed)) {
    scale = *d.tensor_scale;
    if (local == 0 && threadIdx.x == 0) *static_cast<float*>(d.scales) = ScaleInv(scale);
  }
  const uint8_t cast = recipe == static_cast<uint8_t>(Recipe::kFp8Block)
                           ? static_cast<uint8_t>(Recipe::kFp8Tensor)
                           : recipe;
  if (!columnwise) {
    for (int rr = w; rr < h; rr += 8) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int cc = lane + 32 * q;
        if (cc < wd) {
          StoreCast(cast, raw_half, buf[rr * kServeStride + cc], scale, d.data,
                    (r0 + rr) * d.cols + c0 + cc);
        }
      }
    }
    return;
  }
  // Transposed: output [cols, rows].
  for (int cc = w; cc < wd; cc += 8) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int rr = lane + 32 * q;
      if (rr < h) {
        StoreCast(cast, raw_half, buf[rr * kServeStride + cc], scale, d.data,
                  (c0 + cc) * d.rows + r0 + rr);
      }
    }
  }
}

}  // namespace

KStatus LaunchServe(const ServeDesc* d_descs, const int64_t* d_starts, int n, int64_t num_tiles,
                    cudaStream_t stream, const int* d_all_finite) {
  if (num_tiles <= 0) return KStatus::Ok();
  PARAMD_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(ServeKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  ServeKernel<<<static_cast<unsigned>(num_tiles), kThreads, kSmemBytes, stream>>>(d_descs, d_starts,
                                                                                  n, d_all_finite);
  PARAMD_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return KStatus::Ok();
}

}  // namespace paramd::kernels::cuda_internal

namespace paramd::kernels {

KStatus ServeQuantizeCuda(std::span<const CudaServeArgs> outputs, void* d_workspace, size_t bytes,
                          cudaStream_t stream) {
  using cuda_internal::ServeDesc;
  const size_t n = outputs.size();
  if (bytes < ServeQuantizeCudaWorkspaceBytes(n) || (n > 0 && d_workspace == nullptr)) {
    return KStatus(Code::kInvalidArgument, "ServeQuantizeCuda: workspace too small");
  }
  std::vector<ServeDesc> descs;
  std::vector<int64_t> starts;
  int64_t tiles = 0;
  for (size_t j = 0; j < n; ++j) {
    const CudaServeArgs& a = outputs[j];
    const std::string where = "ServeQuantizeCuda: output " + std::to_string(j) + ": ";
    if (a.rows < 0 || a.cols < 0 || static_cast<int>(a.recipe) >= kNumRecipes ||
        (a.direction != Direction::kRowwise && a.direction != Direction::kColumnwise)) {
      return KStatus(Code::kInvalidArgument, where + "bad shape, recipe or direction");
    }
    if (a.rows * a.cols == 0) continue;
    const ServeBufferLayout l = ServeLayout(a.recipe, a.direction, a.rows, a.cols);
    if (a.d_master == nullptr || a.d_data == nullptr || (l.scale_count > 0 && !a.d_scales) ||
        (a.master_type == MasterType::kBf16Remainder && a.d_master_remainder == nullptr)) {
      return KStatus(Code::kInvalidArgument, where + "a buffer is null");
    }
    if (RecipeInfoOf(a.recipe).scale_kind == ScaleKind::kTensor && a.d_tensor_scale == nullptr) {
      return KStatus(Code::kInvalidArgument, where + "per-tensor recipes need d_tensor_scale");
    }
    ServeDesc s{};
    s.rows = a.rows;
    s.cols = a.cols;
    s.tile_cols = (a.cols + cuda_internal::kTileCols - 1) / cuda_internal::kTileCols;
    s.first_tile = tiles;
    tiles += (a.rows + cuda_internal::kTileRows - 1) / cuda_internal::kTileRows * s.tile_cols;
    s.master = a.d_master;
    s.remainder = a.d_master_remainder;
    s.tensor_scale = a.d_tensor_scale;
    s.data = a.d_data;
    s.scales = a.d_scales;
    s.master_type = static_cast<uint8_t>(a.master_type);
    s.recipe = static_cast<uint8_t>(a.recipe);
    s.direction = static_cast<uint8_t>(a.direction);
    descs.push_back(s);
    starts.push_back(s.first_tile);
  }
  if (descs.empty()) return KStatus::Ok();
  auto* base = static_cast<unsigned char*>(d_workspace);
  const size_t starts_at = (n * sizeof(ServeDesc) + 255) / 256 * 256;
  PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(base, descs.data(), descs.size() * sizeof(ServeDesc),
                                              cudaMemcpyHostToDevice, stream));
  PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(base + starts_at, starts.data(),
                                              starts.size() * sizeof(int64_t),
                                              cudaMemcpyHostToDevice, stream));
  if (KStatus st = cuda_internal::LaunchServe(reinterpret_cast<const ServeDesc*>(base),
                                              reinterpret_cast<const int64_t*>(base + starts_at),
                                              static_cast<int>(descs.size()), tiles, stream);
      !st.ok()) {
    return st;
  }
  // The descriptors are locals: the copies must be done before they go.
  PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return KStatus::Ok();
}

}  // namespace paramd::kernels
