// Internal to kernels/cuda: hooks for tests/gpu (host side). Not part of the API.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/status.h"

namespace paramd::kernels::cuda_internal {

// The hardware converts of device_vec.cuh against kernels/formats.h's integer casts, both run on
// the GPU, over every one of the 2^32 FP32 bit patterns (each E4M3 cast in both halves of the
// packed convert), and the hardware decodes against formats.h's for every code that is not NaN.
struct CastCheck {
  // e4m3, fp16, bf16, e4m3 decode, fp16 decode, and the device scale fast paths against
  // formats.h: Pow2Scale(x, 448), Pow2Scale(x, 32768), MxScaleCode(x), MxDataScale(code); the
  // branch-free square root (all inputs in its range) and division (2^32 pairs in its range,
  // x / hash(x) and hash(x) / x) against __fsqrt_rn / __fdiv_rn; the fused mxfp8 code and scale
  // (MxBlockScaleDev) against MxScaleCode and MxDataScale; the inverse of both power-of-two scales
  // of x (Pow2ScaleInvDev) against ScaleInv; and AbsMaxDev(x, hash(x)) against the maximum of
  // the magnitude bits (equal bits, or both NaN).
  unsigned long long mismatches[14];
  unsigned int first[14];             // smallest mismatching input bits (0xFFFFFFFF: none)
  unsigned long long fast_divisions;  // pairs inside the division's range (coverage)
};
inline constexpr int kCastChecks = 14;
inline constexpr const char* kCastCheckNames[kCastChecks] = {
    "e4m3",         "fp16",           "bf16",          "e4m3 decode",   "fp16 decode",
    "pow2(x, 448)", "pow2(x, 32768)", "mx scale code", "mx data scale", "sqrt",
    "division",     "mx block scale", "pow2 inverse",  "abs max"};

// Runs the checks; synchronizes the stream.
KStatus CheckHardwareCasts(CastCheck* out, cudaStream_t stream);

}  // namespace paramd::kernels::cuda_internal
