// The exhaustive check of the hardware converts (kernels/cuda/test_hooks.h).
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_vec.cuh"
#include "kernels/cuda/step_math.cuh"
#include "kernels/cuda/test_hooks.h"

namespace paramd::kernels::cuda_internal {
namespace {

__device__ void Record(CastCheck* out, int which, bool bad, uint32_t input) {
  const unsigned mask = __ballot_sync(0xFFFFFFFFu, bad);
  if (mask == 0) return;
  if ((threadIdx.x & 31) == 0) atomicAdd(&out->mismatches[which], __popc(mask));
  if (bad) atomicMin(&out->first[which], input);
}

__global__ void CastKernel(CastCheck* out) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t b = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < (1ull << 32);
       b += stride) {
    const uint32_t bits = static_cast<uint32_t>(b);
    const float x = __uint_as_float(bits);
    const uint32_t e4 = SwE4m3(x);
    const uint32_t pair = HwE4m3x2(x, -x);
    Record(out, 0, (pair & 0xFFu) != e4 || (pair >> 8) != SwE4m3(-x), bits);
    Record(out, 1, HwFp16(x) != SwFp16(x), bits);
    Record(out, 2, HwBf16(x) != SwBf16(x), bits);
    Record(out, 5,
           __float_as_uint(Pow2ScaleDev(x, 448.0f)) != __float_as_uint(Pow2Scale(x, 448.0f)), bits);
    Record(out, 6,
           __float_as_uint(Pow2ScaleDev(x, 32768.0f)) != __float_as_uint(Pow2Scale(x, 32768.0f)),
           bits);
    Record(out, 7, MxScaleCodeDev(x) != MxScaleCode(x), bits);
    Record(out, 9, SqrtFastOk(x) && __float_as_uint(SqrtFast(x)) != __float_as_uint(__fsqrt_rn(x)),
           bits);
    // A 32-bit mixer (murmur3's finalizer) pairs every pattern with a pseudo-random one.
    uint32_t h = bits ^ 0x9E3779B9u;
    h ^= h >> 16, h *= 0x85EBCA6Bu, h ^= h >> 13, h *= 0xC2B2AE35u, h ^= h >> 16;
    const float y = __uint_as_float(h);
    const bool ok1 = DivFastOk(x, y), ok2 = DivFastOk(y, x);
    Record(out, 10,
           (ok1 && __float_as_uint(DivFast(x, y)) != __float_as_uint(__fdiv_rn(x, y))) ||
               (ok2 && __float_as_uint(DivFast(y, x)) != __float_as_uint(__fdiv_rn(y, x))),
           bits);
    uint32_t code;
    const float mx_scale = MxBlockScaleDev(x, &code);
    Record(out, 11,
           code != MxScaleCode(x) ||
               __float_as_uint(mx_scale) !=
                   __float_as_uint(MxDataScale(static_cast<uint8_t>(MxScaleCode(x)))),
           bits);
    Record(out, 12,
           __float_as_uint(Pow2ScaleInvDev(Pow2ScaleDev(x, 448.0f))) !=
                   __float_as_uint(ScaleInv(Pow2Scale(x, 448.0f))) ||
               __float_as_uint(Pow2ScaleInvDev(Pow2ScaleDev(x, 32768.0f))) !=
                   __float_as_uint(ScaleInv(Pow2Scale(x, 32768.0f))),
           bits);
    const uint32_t am = __float_as_uint(AbsMaxDev(x, y));
    const uint32_t want = max(AbsBitsDev(x), AbsBitsDev(y));
    Record(out, 13, want > 0x7F800000u ? am <= 0x7F800000u : am != want, bits);
    const unsigned covered =
        __popc(__ballot_sync(0xFFFFFFFFu, ok1)) + __popc(__ballot_sync(0xFFFFFFFFu, ok2));
    if ((threadIdx.x & 31) == 0) atomicAdd(&out->fast_divisions, covered);
  }
}

__global__ void DecodeKernel(CastCheck* out) {
  const uint32_t code = blockIdx.x * blockDim.x + threadIdx.x;  // 65536 threads
  if (code < 256) {
    float lo, hi;
    DecodeE4m3x2Moment(code | (code << 8), &lo, &hi);
    const bool nan = (code & 0x7Fu) == 0x7Fu;
    const uint32_t want = __float_as_uint(FloatFromE4m3(static_cast<uint8_t>(code)));
    const bool bad = !nan && (__float_as_uint(lo) != want || __float_as_uint(hi) != want);
    if (bad) {
      atomicAdd(&out->mismatches[3], 1ull);
      atomicMin(&out->first[3], code);
    }
  }
  if (code < 256 && __float_as_uint(MxDataScaleDev(code)) !=
                        __float_as_uint(MxDataScale(static_cast<uint8_t>(code)))) {
    atomicAdd(&out->mismatches[8], 1ull);
    atomicMin(&out->first[8], code);
  }
  const bool nan = (code & 0x7FFFu) > 0x7C00u;
  const bool bad = !nan && __float_as_uint(DecodeFp16Moment(code)) !=
                               __float_as_uint(FloatFromFp16(static_cast<uint16_t>(code)));
  if (bad) {
    atomicAdd(&out->mismatches[4], 1ull);
    atomicMin(&out->first[4], code);
  }
}

}  // namespace

namespace {

KStatus RunChecks(CastCheck* d_out, CastCheck* out, cudaStream_t stream) {
  CastCheck init{};
  for (unsigned int& f : init.first) f = 0xFFFFFFFFu;
  PARAMD_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(d_out, &init, sizeof init, cudaMemcpyHostToDevice, stream));
  CastKernel<<<4096, 256, 0, stream>>>(d_out);
  PARAMD_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  DecodeKernel<<<256, 256, 0, stream>>>(d_out);
  PARAMD_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  PARAMD_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(out, d_out, sizeof *out, cudaMemcpyDeviceToHost, stream));
  PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return KStatus::Ok();
}

}  // namespace

KStatus CheckHardwareCasts(CastCheck* out, cudaStream_t stream) {
  CastCheck* d_out = nullptr;
  PARAMD_CUDA_RETURN_IF_ERROR(cudaMalloc(&d_out, sizeof(CastCheck)));
  KStatus st = RunChecks(d_out, out, stream);
  cudaFree(d_out);
  return st;
}

}  // namespace paramd::kernels::cuda_internal
