#include "reference/quantize_reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace paramd::reference {
namespace {

struct FormatDef {
  int exp_bits;
  int man_bits;
  uint32_t max_finite;  // largest finite magnitude code
  uint32_t nan_code;    // the code every NaN becomes
  bool has_inf;         // all-ones exponent with a zero mantissa is infinity
};

FormatDef Def(Format f) {
  switch (f) {
    case Format::kBf16:
      return {8, 7, 0x7F7F, 0x7FFF, true};
    case Format::kFp16:
      return {5, 10, 0x7BFF, 0x7FFF, true};
    case Format::kE4m3:
      return {4, 3, 0x7E, 0x7F, false};
    case Format::kE5m2:
      return {5, 2, 0x7B, 0x7F, true};
  }
  return {};
}

// The magnitude of a non-negative code below the sign bit, from the format's definition.
double Magnitude(const FormatDef& d, uint32_t abs) {
  const int bias = (1 << (d.exp_bits - 1)) - 1;
  const uint32_t exp = abs >> d.man_bits;
  const uint32_t mant = abs & ((1u << d.man_bits) - 1);
  if (exp == 0) return std::ldexp(static_cast<double>(mant), 1 - bias - d.man_bits);
  return std::ldexp(static_cast<double>((1u << d.man_bits) + mant),
                    static_cast<int>(exp) - bias - d.man_bits);
}

// The magnitudes of codes 0 .. max_finite + 1 in increasing order (the last one is where the
// next code would be: one step past the largest finite value, infinity's place for BF16).
const std::vector<double>& Magnitudes(Format f) {
  static const auto* tables = [] {
    auto* t = new std::vector<double>[4];
    for (const Format g : {Format::kBf16, Format::kFp16, Format::kE4m3, Format::kE5m2}) {
      const FormatDef d = Def(g);
      std::vector<double>& m = t[static_cast<int>(g)];
      for (uint32_t c = 0; c <= d.max_finite; ++c) m.push_back(Magnitude(d, c));
      m.push_back(2 * m.back() - m[m.size() - 2]);
    }
    return t;
  }();
  return tables[static_cast<int>(f)];
}

// The largest magnitude code whose value is <= mag (0 <= mag < the table's last entry), by
// bisection over the table.
uint32_t FloorCode(Format f, double mag) {
  const std::vector<double>& m = Magnitudes(f);
  return static_cast<uint32_t>(std::upper_bound(m.begin(), m.end(), mag) - m.begin() - 1);
}

void AppendFloat(std::vector<uint8_t>& out, float v) {
  uint8_t b[4];
  std::memcpy(b, &v, 4);
  out.insert(out.end(), b, b + 4);
}

void PutCode(std::vector<uint8_t>& out, size_t index, uint32_t code, int bytes) {
  for (int k = 0; k < bytes; ++k) out[index * bytes + k] = static_cast<uint8_t>(code >> (8 * k));
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Transposes a row-major [rows, cols] array of `bytes`-byte elements.
std::vector<uint8_t> Transposed(const std::vector<uint8_t>& in, int64_t rows, int64_t cols,
                                int bytes) {
  std::vector<uint8_t> out(in.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      std::memcpy(&out[(c * rows + r) * bytes], &in[(r * cols + c) * bytes], bytes);
    }
  }
  return out;
}

// Plain casts and per-tensor FP8, rowwise.
ServedRef Elementwise(RecipeRef recipe, const float* x, int64_t n, float tensor_scale) {
  ServedRef out;
  switch (recipe) {
    case RecipeRef::kFp32:
      out.data.resize(n * 4);
      if (n > 0) std::memcpy(out.data.data(), x, n * 4);
      break;
    case RecipeRef::kBf16:
    case RecipeRef::kFp16:
      out.data.resize(n * 2);
      for (int64_t i = 0; i < n; ++i) {
        const Format f = recipe == RecipeRef::kBf16 ? Format::kBf16 : Format::kFp16;
        PutCode(out.data, i, EncodeRef(f, x[i]), 2);
      }
      break;
    default:  // fp8_tensor, fp8_delayed: the FP32 product x * scale, then the cast
      out.data.resize(n);
      for (int64_t i = 0; i < n; ++i) {
        const float scaled =
            static_cast<float>(static_cast<double>(x[i]) * static_cast<double>(tensor_scale));
        out.data[i] = static_cast<uint8_t>(EncodeRef(Format::kE4m3, scaled));
      }
      AppendFloat(out.scales, static_cast<float>(1.0 / static_cast<double>(tensor_scale)));
      break;
  }
  return out;
}

// fp8_block rowwise: scales [ceil(rows/128), ceil(cols/128)] of scale_inv. Scaled values are exact
// double products (an FP32 product could only round below 2^-126, where E4M3 gives 0 anyway).
ServedRef Block(const float* x, int64_t rows, int64_t cols) {
  ServedRef out;
  out.data.resize(rows * cols);
  const int64_t brows = CeilDiv(rows, 128), bcols = CeilDiv(cols, 128);
  for (int64_t br = 0; br < brows; ++br) {
    for (int64_t bc = 0; bc < bcols; ++bc) {
      const int64_t r1 = std::min(rows, br * 128 + 128), c1 = std::min(cols, bc * 128 + 128);
      std::vector<float> block;
      for (int64_t r = br * 128; r < r1; ++r) {
        for (int64_t c = bc * 128; c < c1; ++c) block.push_back(x[r * cols + c]);
      }
      const double amax = AmaxRef(block.data(), static_cast<int64_t>(block.size()));
      const float scale = Pow2ScaleRef(amax, 448.0);
      for (int64_t r = br * 128; r < r1; ++r) {
        for (int64_t c = bc * 128; c < c1; ++c) {
          const double scaled = static_cast<double>(x[r * cols + c]) * scale;
          out.data[r * cols + c] = static_cast<uint8_t>(EncodeRef(Format::kE4m3, scaled));
        }
      }
      AppendFloat(out.scales, static_cast<float>(1.0 / scale));
    }
  }
  return out;
}

// One mxfp8 block of `n` values at x[0], x[stride], ...: its code, and its data at out[0],
// out[stride], ...
uint8_t MxBlock(const float* x, int64_t stride, int64_t n, uint8_t* out) {
  std::vector<float> block;
  for (int64_t i = 0; i < n; ++i) block.push_back(x[i * stride]);
  const uint8_t code = MxScaleCodeRef(AmaxRef(block.data(), n));
  const int e = code == 255 ? 0 : code - 127;
  for (int64_t i = 0; i < n; ++i) {
    out[i * stride] = static_cast<uint8_t>(EncodeRef(Format::kE4m3, std::ldexp(block[i], -e)));
  }
  return code;
}

ServedRef Mx(const float* x, int64_t rows, int64_t cols, bool columnwise) {
  ServedRef out;
  out.data.resize(rows * cols);
  if (!columnwise) {
    const int64_t nb = CeilDiv(cols, 32);
    out.scales.resize(rows * nb);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t c0 = b * 32, n = std::min<int64_t>(32, cols - c0);
        out.scales[r * nb + b] = MxBlock(&x[r * cols + c0], 1, n, &out.data[r * cols + c0]);
      }
    }
  } else {
    const int64_t nb = CeilDiv(rows, 32);
    out.scales.resize(nb * cols);
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t r0 = b * 32, n = std::min<int64_t>(32, rows - r0);
      for (int64_t c = 0; c < cols; ++c) {
        out.scales[b * cols + c] = MxBlock(&x[r0 * cols + c], cols, n, &out.data[r0 * cols + c]);
      }
    }
  }
  return out;
}

}  // namespace

double DecodeRef(Format format, uint32_t code) {
  const FormatDef d = Def(format);
  const uint32_t sign_bit = 1u << (d.exp_bits + d.man_bits);
  const uint32_t abs = code & (sign_bit - 1);
  const double sign = (code & sign_bit) != 0 ? -1.0 : 1.0;
  if (abs > d.max_finite) {
    const bool is_inf = d.has_inf && (abs & ((1u << d.man_bits) - 1)) == 0;
    return is_inf ? sign * std::numeric_limits<double>::infinity()
                  : std::numeric_limits<double>::quiet_NaN();
  }
  return sign * Magnitude(d, abs);
}

uint32_t EncodeRef(Format format, double value) {
  const FormatDef d = Def(format);
  if (std::isnan(value)) return d.nan_code;
  const uint32_t sign = std::signbit(value) ? 1u << (d.exp_bits + d.man_bits) : 0u;
  const double mag = std::fabs(value);
  const std::vector<double>& m = Magnitudes(format);
  if (mag >= m[d.max_finite]) return sign | d.max_finite;
  const uint32_t below = FloorCode(format, mag);
  const double mid = (m[below] + m[below + 1]) / 2;  // exact: the values have few bits
  uint32_t code = below;
  if (mag > mid || (mag == mid && (below & 1u) != 0)) code = below + 1;
  return sign | code;
}

double AmaxRef(const float* x, int64_t n) {
  double amax = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) return std::numeric_limits<double>::quiet_NaN();
    amax = std::max(amax, std::fabs(static_cast<double>(x[i])));
  }
  return amax;
}

float Pow2ScaleRef(double amax, double top) {
  if (amax == 0.0 || !std::isfinite(amax)) return 1.0f;
  for (int k = 126; k > -126; --k) {
    if (std::ldexp(std::fabs(amax), k) <= top) return static_cast<float>(std::ldexp(1.0, k));
  }
  return static_cast<float>(std::ldexp(1.0, -126));
}

uint8_t MxScaleCodeRef(double amax) {
  if (!std::isfinite(amax)) return 255;
  if (amax == 0.0) return 127;
  for (int e = -127; e < 127; ++e) {
    if (std::fabs(amax) <= std::ldexp(448.0, e)) return static_cast<uint8_t>(e + 127);
  }
  return 254;
}

float ScaleFromAmaxRef(double amax, double top, float prev_scale) {
  if (amax == 0.0 || !std::isfinite(amax)) return prev_scale;
  const double s = std::clamp(top / std::fabs(amax), std::ldexp(1.0, -126), std::ldexp(1.0, 126));
  return static_cast<float>(s);
}

float DelayedScaleRef(const float* history, int count, int margin, float prev_scale) {
  if (count == 0) return 1.0f;
  const double top = std::ldexp(448.0, -std::clamp(margin, 0, 126));
  return ScaleFromAmaxRef(AmaxRef(history, count), top, prev_scale);
}

uint16_t Bf16ServedRef(float finite_master) {
  const double mag = std::fabs(static_cast<double>(finite_master));
  const uint16_t sign = std::signbit(finite_master) ? 0x8000 : 0;
  // The candidates are the finite codes and 0x7F80, the table's last entry (2^128): +-inf.
  const std::vector<double>& m = Magnitudes(Format::kBf16);
  const uint32_t below = FloorCode(Format::kBf16, mag);
  const double mid = (m[below] + m[below + 1]) / 2;
  return sign | static_cast<uint16_t>(mag >= mid ? below + 1 : below);
}

ServedRef ServeRef(RecipeRef recipe, bool columnwise, const float* master, int64_t rows,
                   int64_t cols, float tensor_scale) {
  if (recipe == RecipeRef::kMxfp8) return Mx(master, rows, cols, columnwise);
  ServedRef out = recipe == RecipeRef::kFp8Block
                      ? Block(master, rows, cols)
                      : Elementwise(recipe, master, rows * cols, tensor_scale);
  if (columnwise) {
    const int bytes = static_cast<int>(out.data.size() / std::max<int64_t>(1, rows * cols));
    out.data = Transposed(out.data, rows, cols, std::max(bytes, 1));
    if (recipe == RecipeRef::kFp8Block) {
      out.scales = Transposed(out.scales, CeilDiv(rows, 128), CeilDiv(cols, 128), 4);
    }
  }
  return out;
}

}  // namespace paramd::reference
