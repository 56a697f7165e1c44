// paramd::reference — an independent float64 model of DESIGN.md §3's formats and serve recipes,
// which kernels/formats.h and kernels/recipes.h are tested against bit for bit. Where the kernels
// work on the bits (integer rounding, exponent arithmetic), this model works on values: a code's
// value comes from its definition through std::ldexp, a cast picks the nearest representable
// value by bisection over the codes, scales are found by search, and scaled values are exact
// double products. Like adamw_reference.h it must NOT link or include kernels/.
#pragma once

#include <cstdint>
#include <vector>

namespace paramd::reference {

// The element formats, described only by their bit counts, largest finite code and NaN code.
enum class Format { kBf16, kFp16, kE4m3, kE5m2 };

// The value a code stands for (exact in double): +-inf for an infinity code of a format that has
// one, NaN for the NaN codes.
double DecodeRef(Format format, uint32_t code);

// The code of a value: the nearest finite value (the even code on a tie); magnitudes at or beyond
// the largest finite value (infinities too) give the largest finite code, with the sign; NaN
// gives the positive NaN code (0x7F for both FP8 formats, 0x7FFF for BF16 and FP16). Any double
// may be passed, so scaled values need no intermediate rounding.
uint32_t EncodeRef(Format format, double value);

// amax: NaN if any value is NaN, else the largest magnitude (inf included); 0 for n == 0.
double AmaxRef(const float* x, int64_t n);

// The largest 2^k with 2^k * amax <= top, k searched over [-126, 126] (so clamped there); 1 for
// amax 0, inf or NaN.
float Pow2ScaleRef(double amax, double top);

// The E8M0 code of an mxfp8 block: smallest e with amax <= 448 * 2^e, found by search, as e + 127
// clamped to [0, 254]; 127 for amax 0, 255 for inf or NaN.
uint8_t MxScaleCodeRef(double amax);

// top / amax in double, clamped to [2^-126, 2^126], rounded once to FP32 (which equals one FP32
// division: double rounding is innocuous for division at 53 >= 2 * 24 + 2 bits); amax 0 or
// non-finite gives prev_scale.
float ScaleFromAmaxRef(double amax, double top, float prev_scale);

// fp8_delayed: top = 448 * 2^-margin over the history's amax; empty history gives 1.
float DelayedScaleRef(const float* history, int count, int margin, float prev_scale);

// bf16+remainder: served = the BF16 nearest the master, ties away from zero (as values, in
// double); masters beyond the largest BF16 (with its half step) serve +-inf.
uint16_t Bf16ServedRef(float finite_master);

enum class RecipeRef { kFp32, kBf16, kFp16, kFp8Tensor, kFp8Delayed, kFp8Block, kMxfp8 };

// One served output as raw little-endian bytes, in kernels/recipes.h's layouts.
struct ServedRef {
  std::vector<uint8_t> data;
  std::vector<uint8_t> scales;
};

// The whole tensor [rows, cols] (row-major) served in one recipe and direction. tensor_scale is
// the scale of fp8_tensor / fp8_delayed (ignored otherwise); their one scale_inv is 1 / scale.
ServedRef ServeRef(RecipeRef recipe, bool columnwise, const float* master, int64_t rows,
                   int64_t cols, float tensor_scale);

}  // namespace paramd::reference
