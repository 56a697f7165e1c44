#include "reference/policy_reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace paramd::reference {
namespace {

constexpr size_t kChunk = 128;

uint32_t BitsOf(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

float FloatOf(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

double MaxFiniteValue(const MiniFormatRef& f) { return CodeValueRef(f, f.max_code); }

// The code of a magnitude the format represents exactly (0 <= mag <= largest finite).
uint32_t CodeOfMagnitude(const MiniFormatRef& f, double mag) {
  if (mag == 0.0) return 0;
  int e;
  std::frexp(mag, &e);  // mag in [2^(e-1), 2^e)
  const int exponent = e - 1;
  if (exponent < f.min_exp) {
    return static_cast<uint32_t>(mag / std::ldexp(1.0, f.min_exp - f.man_bits));
  }
  const double steps = mag / std::ldexp(1.0, exponent - f.man_bits);  // in [2^man, 2^(man+1))
  const uint32_t field = static_cast<uint32_t>(exponent - f.min_exp + 1);
  return (field << f.man_bits) | (static_cast<uint32_t>(steps) - (1u << f.man_bits));
}

// Per-step scalars of DESIGN.md §3 (double, rounded once to FP32).
struct Scalars {
  float beta1, beta2, c1, c2, eps, decay, step_size, bc2;
};

Scalars MakeScalars(const Hyper& h, int64_t k) {
  const double kd = static_cast<double>(k);
  return {static_cast<float>(h.beta1),
          static_cast<float>(h.beta2),
          static_cast<float>(1.0 - h.beta1),
          static_cast<float>(1.0 - h.beta2),
          static_cast<float>(h.eps),
          static_cast<float>(1.0 - h.lr * h.weight_decay),
          static_cast<float>(h.lr / (1.0 - std::pow(h.beta1, kd))),
          static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(h.beta2, kd)))};
}

// The amax rule: NaN if any value is NaN, else the largest magnitude.
float ChunkAmax(const float* x, size_t n) {
  float amax = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) return std::nanf("");
    amax = std::max(amax, std::fabs(x[i]));
  }
  return amax;
}

void StoreMoment(MomentRef type, bool stochastic, const RngRef& rng, StreamRef stream,
                 const float* x, size_t c, size_t count, MomentStateRef* st) {
  auto random = [&](size_t j, uint32_t* r) -> const uint32_t* {
    if (!stochastic) return nullptr;
    *r = RandomWordRef(rng, stream, c + j);
    return r;
  };
  uint32_t r;
  switch (type) {
    case MomentRef::kFp32:
      std::copy(x, x + count, st->fp32.begin() + static_cast<std::ptrdiff_t>(c));
      return;
    case MomentRef::kBf16:
      for (size_t j = 0; j < count; ++j) {
        st->u16[c + j] = static_cast<uint16_t>(RoundToCodeRef(kBf16Ref, x[j], random(j, &r)));
      }
      return;
    case MomentRef::kFp16:
    case MomentRef::kFp8: {
      const bool fp16 = type == MomentRef::kFp16;
      const float s = Pow2ScaleSearchRef(ChunkAmax(x, count), fp16 ? 32768.0f : 448.0f);
      st->scale_inv[c / kChunk] = 1.0f / s;
      for (size_t j = 0; j < count; ++j) {
        const float y = x[j] * s;
        const uint32_t code = RoundToCodeRef(fp16 ? kFp16Ref : kE4m3Ref, y, random(j, &r));
        if (fp16) {
          st->u16[c + j] = static_cast<uint16_t>(code);
        } else {
          st->u8[c + j] = static_cast<uint8_t>(code);
        }
      }
      return;
    }
  }
}

void StoreMaster(const PolicyRef& policy, float p, size_t i, PolicyStateRef* st) {
  switch (policy.master) {
    case MasterRef::kFp32:
      st->master_fp32[i] = p;
      return;
    case MasterRef::kBf16Remainder: {
      // Ties (and above) of the low half go up: round half away from zero on the magnitude.
      const uint32_t bits = BitsOf(p);
      const uint32_t low = bits & 0xFFFFu;
      st->master_u16[i] = static_cast<uint16_t>((bits >> 16) + (low >= 0x8000u ? 1u : 0u));
      st->master_remainder[i] = static_cast<int16_t>(low >= 0x8000u ? static_cast<int>(low) - 65536
                                                                    : static_cast<int>(low));
      return;
    }
    case MasterRef::kFp16:
      st->master_u16[i] = static_cast<uint16_t>(RoundToCodeRef(kFp16Ref, p, nullptr));
      return;
  }
}

void ResizeMoment(MomentRef type, size_t n, MomentStateRef* st) {
  switch (type) {
    case MomentRef::kFp32:
      st->fp32.assign(n, 0.0f);
      break;
    case MomentRef::kBf16:
    case MomentRef::kFp16:
      st->u16.assign(n, 0);
      break;
    case MomentRef::kFp8:
      st->u8.assign(n, 0);
      break;
  }
  st->scale_inv.assign((n + kChunk - 1) / kChunk, 1.0f);
}

}  // namespace

std::array<uint32_t, 4> PhiloxRef(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t a = static_cast<uint64_t>(counter[0]) * 0xD2511F53u;
    const uint64_t b = static_cast<uint64_t>(counter[2]) * 0xCD9E8D57u;
    counter = {static_cast<uint32_t>(b >> 32) ^ counter[1] ^ key[0],
               static_cast<uint32_t>(b & 0xFFFFFFFFu),
               static_cast<uint32_t>(a >> 32) ^ counter[3] ^ key[1],
               static_cast<uint32_t>(a & 0xFFFFFFFFu)};
    key[0] += 0x9E3779B9u;
    key[1] += 0xBB67AE85u;
  }
  return counter;
}

uint32_t RandomWordRef(const RngRef& rng, StreamRef stream, uint64_t i) {
  const uint64_t block = i / 4;
  const uint32_t stream_bit = stream == StreamRef::kExpAvgSq ? 0x80000000u : 0u;
  const std::array<uint32_t, 4> out = PhiloxRef(
      {static_cast<uint32_t>(block & 0xFFFFFFFFu), static_cast<uint32_t>(block >> 32) | stream_bit,
       rng.k, rng.tensor_index},
      {static_cast<uint32_t>(rng.seed & 0xFFFFFFFFu), static_cast<uint32_t>(rng.seed >> 32)});
  return out[i % 4];
}

uint32_t RoundToCodeRef(const MiniFormatRef& f, float x, const uint32_t* random) {
  if (std::isnan(x)) return f.nan_code;
  const uint32_t sign = std::signbit(x) ? 1u << (f.bits - 1) : 0u;
  const double a = std::fabs(static_cast<double>(x));
  const double max_value = MaxFiniteValue(f);
  if (a >= max_value) return sign | f.max_code;
  int e;
  std::frexp(a, &e);
  const int exponent = a == 0.0 ? f.min_exp : std::max(e - 1, f.min_exp);
  const double step = std::ldexp(1.0, exponent - f.man_bits);
  const double steps = std::floor(a / step);      // exact: step is a power of two
  const double frac = (a - steps * step) / step;  // exact, in [0, 1)
  bool up;
  if (random != nullptr) {
    up = static_cast<double>(*random) < std::floor(std::ldexp(frac, 32));
  } else {
    up = frac > 0.5 || (frac == 0.5 && std::fmod(steps, 2.0) == 1.0);
  }
  const double mag = std::min((steps + (up ? 1.0 : 0.0)) * step, max_value);
  return sign | CodeOfMagnitude(f, mag);
}

float CodeValueRef(const MiniFormatRef& f, uint32_t code) {
  const uint32_t sign_bit = 1u << (f.bits - 1);
  const bool negative = (code & sign_bit) != 0;
  const uint32_t mag = code & (sign_bit - 1);
  if (mag > f.max_code) {
    const uint32_t mantissa = mag & ((1u << f.man_bits) - 1);
    if (f.has_inf && mantissa == 0) {
      return negative ? -std::numeric_limits<float>::infinity()
                      : std::numeric_limits<float>::infinity();
    }
    return FloatOf(0x7FC00000u | (negative ? 0x80000000u : 0u));
  }
  const uint32_t field = mag >> f.man_bits;
  const uint32_t mantissa = mag & ((1u << f.man_bits) - 1);
  const double value = field == 0
                           ? std::ldexp(static_cast<double>(mantissa), f.min_exp - f.man_bits)
                           : std::ldexp(static_cast<double>((1u << f.man_bits) + mantissa),
                                        static_cast<int>(field) - 1 + f.min_exp - f.man_bits);
  return static_cast<float>(negative ? -value : value);
}

float Pow2ScaleSearchRef(float amax, float top) {
  if (amax == 0.0f || !std::isfinite(amax)) return 1.0f;
  const double a = std::fabs(static_cast<double>(amax));
  for (int k = 126; k >= -126; --k) {
    if (std::ldexp(a, k) <= static_cast<double>(top)) return static_cast<float>(std::ldexp(1.0, k));
  }
  return static_cast<float>(std::ldexp(1.0, -126));
}

PolicyStateRef MakePolicyStateRef(const PolicyRef& policy, const std::vector<float>& initial) {
  const size_t n = initial.size();
  PolicyStateRef st;
  switch (policy.master) {
    case MasterRef::kFp32:
      st.master_fp32.assign(n, 0.0f);
      break;
    case MasterRef::kBf16Remainder:
      st.master_u16.assign(n, 0);
      st.master_remainder.assign(n, 0);
      break;
    case MasterRef::kFp16:
      st.master_u16.assign(n, 0);
      break;
  }
  for (size_t i = 0; i < n; ++i) StoreMaster(policy, initial[i], i, &st);
  ResizeMoment(policy.exp_avg, n, &st.exp_avg);
  ResizeMoment(policy.exp_avg_sq, n, &st.exp_avg_sq);
  return st;
}

float MasterValueRef(const PolicyRef& policy, const PolicyStateRef& st, size_t i) {
  switch (policy.master) {
    case MasterRef::kFp32:
      return st.master_fp32[i];
    case MasterRef::kBf16Remainder: {
      const int remainder = st.master_remainder[i];
      const uint32_t hi = (st.master_u16[i] - (remainder < 0 ? 1u : 0u)) & 0xFFFFu;
      const uint32_t low = static_cast<uint32_t>(remainder < 0 ? remainder + 65536 : remainder);
      return FloatOf(hi << 16 | low);
    }
    case MasterRef::kFp16:
      return CodeValueRef(kFp16Ref, st.master_u16[i]);
  }
  return 0.0f;
}

float MomentValueRef(MomentRef type, const MomentStateRef& st, size_t i) {
  switch (type) {
    case MomentRef::kFp32:
      return st.fp32[i];
    case MomentRef::kBf16:
      return CodeValueRef(kBf16Ref, st.u16[i]);
    case MomentRef::kFp16:
      return CodeValueRef(kFp16Ref, st.u16[i]) * st.scale_inv[i / kChunk];
    case MomentRef::kFp8:
      return CodeValueRef(kE4m3Ref, st.u8[i]) * st.scale_inv[i / kChunk];
  }
  return 0.0f;
}

float ClippedGradRef(float g0, float grad_scale, float clip) {
  const float gs = g0 * grad_scale;
  return clip == 1.0f ? gs : gs * clip;
}

void PolicyStepRef(const PolicyRef& policy, const Hyper& hyper, int64_t k, const RngRef& rng,
                   const float* g, size_t n, PolicyStateRef* st) {
  const Scalars s = MakeScalars(hyper, k);
  float m_new[kChunk];
  float v_new[kChunk];
  for (size_t c = 0; c < n; c += kChunk) {
    const size_t count = std::min(kChunk, n - c);
    for (size_t j = 0; j < count; ++j) {
      const size_t i = c + j;
      const float m = MomentValueRef(policy.exp_avg, st->exp_avg, i);
      const float v = MomentValueRef(policy.exp_avg_sq, st->exp_avg_sq, i);
      const float p = MasterValueRef(policy, *st, i);
      const float g_times_c1 = s.c1 * g[i];
      m_new[j] = std::fma(s.beta1, m, g_times_c1);
      const float g_squared_times_c2 = s.c2 * (g[i] * g[i]);
      v_new[j] = std::fma(s.beta2, v, g_squared_times_c2);
      const float denom = std::fma(std::sqrt(v_new[j]), s.bc2, s.eps);
      const float decayed = p * s.decay;
      StoreMaster(policy, std::fma(-s.step_size, m_new[j] / denom, decayed), i, st);
    }
    StoreMoment(policy.exp_avg, policy.exp_avg_stochastic, rng, StreamRef::kExpAvg, m_new, c, count,
                &st->exp_avg);
    StoreMoment(policy.exp_avg_sq, policy.exp_avg_sq_stochastic, rng, StreamRef::kExpAvgSq, v_new,
                c, count, &st->exp_avg_sq);
  }
}

MasterServedRef ServeMasterRef(const PolicyRef& policy, const PolicyStateRef& st, size_t i) {
  const float value = MasterValueRef(policy, st, i);
  MasterServedRef out;
  out.fp32 = value;
  out.bf16 = policy.master == MasterRef::kBf16Remainder ? st.master_u16[i] : Bf16FromFloat(value);
  out.fp16 = static_cast<uint16_t>(RoundToCodeRef(kFp16Ref, value, nullptr));
  return out;
}

}  // namespace paramd::reference
