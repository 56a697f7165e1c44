// Internal to kernels/cpu: the fused step of every state policy, written once over a vector type V
// (vec_scalar.h, vec_avx2.h, vec_avx512.h) and instantiated by each path's translation unit under
// its own target. Everything here is a template on V, so the copies never collide.
//
// The step runs a span of up to four chunks at a time (a chunk: 128 elements, the unit of the
// moments' scales; a span of four amortizes the per-call work: prefetches, Philox's key schedule,
// loop set-up), each span in stages over small buffers that stay in L1:
//   1. dequantize each quantized moment into an FP32 buffer (FP32 moments are used where they lie;
//      FP8 and FP16 moments beside an FP32 master are decoded in stage 3 instead, see CodedMoment);
//   2. for each moment that rounds stochastically, draw its stream's Philox blocks for the chunk's
//      elements (kernels/philox.h: 4 elements per block, every word used);
//   3. per vector of elements: the gradient from the slots, the new moments and AdamW's
//      denominator, then the master stored in its type, the served copies and the running amax of
//      the stored master (in two passes over the chunk where a moment is decoded here);
//   4. re-quantize each quantized moment chunk by chunk: its amax, power-of-two scale, the cast.
// Every operation is per element and the same in every instantiation, so every path gives the
// same bits. A vector path hands chunks that are not whole vectors to the scalar instantiation.
// The state is read from its sources (FusedStepArgs' *_in) when they are set, else from the
// destinations: in place, through the same code as before there were sources (StepSpan and
// UpdateLanes without kSeparate).
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/fused_step_paths.h"
#include "kernels/cpu/state_codec.h"
#include "kernels/formats.h"
#include "kernels/fused_step.h"
#include "kernels/philox.h"

namespace paramd::kernels::cpu_internal {

// Per-call constants, broadcast once.
template <class V>
struct StepContext {
  using F = typename V::F;
  const FusedStepArgs* args;
  F grad_scale, clip, beta1, beta2, c1, c2, eps, decay, neg_step_size, bc2;
  bool clip_active;
  PhiloxKey key;
  // Served outputs written with non-temporal stores (long, aligned ranges of a vector path).
  bool stream_fp32 = false, stream_bf16 = false, stream_fp16 = false;
  // FP32 moments written with non-temporal stores: out of place only (a destination read from
  // nowhere in the pass, whose lines would otherwise be read for ownership first).
  bool stream_m = false, stream_v = false;
  // The stored master likewise (FusedStepArgs::stream_master): out of place only.
  bool stream_master = false;
  // The end of the range a vector path prefetches up to (0: no prefetching).
  int64_t prefetch_end = 0;
  // Where each chunk's amax of the new stored master goes (FusedStepCpu's chunk_amax_bits): the
  // chunk at element i to chunk_amax[(i - chunk_amax_begin) / 128]; null: nowhere.
  uint32_t* chunk_amax = nullptr;
  int64_t chunk_amax_begin = 0;
  // Where the state is read from (fused_step.h): the *_in sources, or the destinations when in
  // place; `separate` when any differs from its destination (the kSeparate code).
  const void* master_in;
  const int16_t* master_remainder_in;
  const void* exp_avg_in;
  const float* exp_avg_scale_inv_in;
  const void* exp_avg_sq_in;
  const float* exp_avg_sq_scale_inv_in;
  bool separate;

  explicit StepContext(const FusedStepArgs& a)
      : args(&a),
        grad_scale(V::SetF(a.grad_scale)),
        clip(V::SetF(a.clip)),
        beta1(V::SetF(a.scalars.beta1)),
        beta2(V::SetF(a.scalars.beta2)),
        c1(V::SetF(a.scalars.c1)),
        c2(V::SetF(a.scalars.c2)),
        eps(V::SetF(a.scalars.eps)),
        decay(V::SetF(a.scalars.decay)),
        neg_step_size(V::SetF(-a.scalars.step_size)),
        bc2(V::SetF(a.scalars.bc2)),
        clip_active(a.clip != 1.0f),
        key(RoundingKey(a.rng.seed)),
        master_in(StateSource(a.master_in, a.master)),
        master_remainder_in(StateSource(a.master_remainder_in, a.master_remainder)),
        exp_avg_in(StateSource(a.exp_avg_in, a.exp_avg)),
        exp_avg_scale_inv_in(StateSource(a.exp_avg_scale_inv_in, a.exp_avg_scale_inv)),
        exp_avg_sq_in(StateSource(a.exp_avg_sq_in, a.exp_avg_sq)),
        exp_avg_sq_scale_inv_in(StateSource(a.exp_avg_sq_scale_inv_in, a.exp_avg_sq_scale_inv)),
        separate(master_in != a.master ||
                 (a.policy.master == MasterType::kBf16Remainder &&
                  master_remainder_in != a.master_remainder) ||
                 exp_avg_in != a.exp_avg || exp_avg_sq_in != a.exp_avg_sq) {}
};

// g0 of the lanes at element i: the rank-ordered FP32 sum of the slots; `first` is slots[0], read
// once per call by the caller.
template <class V>
PARAMD_LANES_INLINE typename V::F SlotSum(SlotType type, const void* first,
                                          const void* const* slots, int num_slots, int64_t i) {
  if (type == SlotType::kFp32) {
    typename V::F g0 = V::LoadF(static_cast<const float*>(first) + i);
    for (int r = 1; r < num_slots; ++r) {
      g0 = V::Add(g0, V::LoadF(static_cast<const float*>(slots[r]) + i));
    }
    return g0;
  }
  typename V::F g0 = DecodeBf16<V>(V::LoadU16(static_cast<const uint16_t*>(first) + i));
  for (int r = 1; r < num_slots; ++r) {
    g0 = V::Add(g0, DecodeBf16<V>(V::LoadU16(static_cast<const uint16_t*>(slots[r]) + i)));
  }
  return g0;
}

// The elements a StepChunk call takes at most: four chunks.
inline constexpr int kSpanElements = 4 * kChunkElements;

// The old values of a moment at vector j of a chunk: kT kFp32 reads FP32 values at `values` (the
// state, or stage 1's buffer), the scaled types decode their codes (stage 1's DequantizeChunk and
// stage 3's CodedMoment).
template <class V, MomentType kT>
PARAMD_LANES_INLINE typename V::F OldMoment(const float* values, const void* codes,
                                            typename V::F scale_inv, int j) {
  if constexpr (kT == MomentType::kFp8) {
    return LoadE4m3<V>(static_cast<const uint8_t*>(codes) + j, scale_inv);
  } else if constexpr (kT == MomentType::kFp16) {
    return V::Mul(LoadFp16<V>(static_cast<const uint16_t*>(codes) + j), scale_inv);
  } else {
    return V::LoadF(values + j);
  }
}

// Stage 1: moment codes of elements [c, c + count) -> FP32 values q * (1 / s), c a chunk's first
// element, count <= 128.
template <class V>
void DequantizeChunk(MomentType type, const void* codes, const float* scale_inv, int64_t c,
                     int count, float* out) {
  constexpr int L = V::kLanes;
  if (type == MomentType::kBf16) {
    const uint16_t* src = static_cast<const uint16_t*>(codes) + c;
    for (int j = 0; j < count; j += L) V::StoreF(out + j, DecodeBf16<V>(V::LoadU16(src + j)));
    return;
  }
  const typename V::F s_inv = V::SetF(scale_inv[c / kChunkElements]);
  if (type == MomentType::kFp16) {
    const uint16_t* src = static_cast<const uint16_t*>(codes) + c;
    for (int j = 0; j < count; j += L) {
      V::StoreF(out + j, OldMoment<V, MomentType::kFp16>(nullptr, src, s_inv, j));
    }
    return;
  }
  const uint8_t* src = static_cast<const uint8_t*>(codes) + c;
  for (int j = 0; j < count; j += L) {
    V::StoreF(out + j, OldMoment<V, MomentType::kFp8>(nullptr, src, s_inv, j));
  }
}

// The same for a span [c, c + count): chunk by chunk, each with its own scale.
template <class V>
void DequantizeMoment(MomentType type, const void* codes, const float* scale_inv, int64_t c,
                      int count, float* out) {
  for (int k = 0; k < count; k += kChunkElements) {
    DequantizeChunk<V>(type, codes, scale_inv, c + k, std::min<int>(kChunkElements, count - k),
                       out + k);
  }
}

// Room for the words DrawWords draws for up to a span's 512 elements: 129 blocks when the first
// element is not the first of its block, rounded up to whole calls of every path's PhiloxBlocks.
inline constexpr int kDrawBlocks = 144;
inline constexpr int kDrawWords = kElementsPerBlock * kDrawBlocks;

// Stage 2: the random words of `stream` for elements [index, index + count) of the tensor, count <=
// 512, drawn a block (4 elements) at a time into `buf` (kDrawWords words). Returns where element
// `index`'s word lies in `buf`; element index + j's is j words further.
template <class V>
const uint32_t* DrawWords(const PhiloxKey& key, RoundingStream stream, uint32_t k,
                          uint32_t tensor_index, uint64_t index, int count, uint32_t* buf) {
  static_assert(kDrawBlocks % V::kPhiloxBlocks == 0);
  const uint64_t first = index / kElementsPerBlock;
  const int skip = static_cast<int>(index % kElementsPerBlock);
  const int needed = (skip + count + kElementsPerBlock - 1) / kElementsPerBlock;
  const int blocks = (needed + V::kPhiloxBlocks - 1) / V::kPhiloxBlocks * V::kPhiloxBlocks;
  const uint32_t low = static_cast<uint32_t>(first);
  if (uint64_t{low} + static_cast<uint64_t>(blocks) <= (uint64_t{1} << 32)) {
    V::PhiloxBlocks(key, RoundingCounterWord1(first, stream), k, tensor_index, low, blocks, buf);
  } else {
    // The low counter word wraps inside the range (tensors past 2^34 elements), where the vector
    // forms' constant word 1 would be wrong: block by block.
    for (int j = 0; j < needed; ++j) {
      const PhiloxCounter r = Philox4x32_10(
          RoundingCounter(first + static_cast<uint64_t>(j), stream, k, tensor_index), key);
      for (int w = 0; w < kElementsPerBlock; ++w) buf[kElementsPerBlock * j + w] = r[w];
    }
  }
  return buf + skip;
}

// The cast of one vector of a moment: stochastic with the words at r + j, or nearest (the short
// forms where there is one).
template <class V, class Fmt, bool kStochastic>
PARAMD_LANES_INLINE typename V::I EncodeAs(typename V::F y, const uint32_t* r, int j) {
  if constexpr (kStochastic && std::is_same_v<Fmt, E4m3Format>) {
    return EncodeE4m3Stochastic<V>(y, V::LoadU32(r + j));
  } else if constexpr (kStochastic) {
    return Encode<V, Fmt, true>(y, V::LoadU32(r + j));
  } else if constexpr (std::is_same_v<Fmt, Bf16Format>) {
    return EncodeBf16Nearest<V>(y);
  } else if constexpr (std::is_same_v<Fmt, E4m3Format>) {
    return EncodeE4m3Nearest<V>(y);
  } else if constexpr (std::is_same_v<Fmt, Fp16Format>) {
    return EncodeFp16Nearest<V>(y);
  } else {
    return Encode<V, Fmt, false>(y, V::SetI(0));
  }
}

// The cast loops of QuantizeMoment, one instantiation per rounding so that neither carries the
// other's constants (with AVX2's 16 registers a shared loop rebuilt them on every vector).
template <class V, bool kStochastic>
void CastMoment(MomentType type, const float* in, const uint32_t* r, void* codes,
                typename V::F scale, int64_t c, int count) {
  constexpr int L = V::kLanes;
  if (type == MomentType::kBf16) {
    uint16_t* dst = static_cast<uint16_t*>(codes) + c;
    for (int j = 0; j < count; j += L) {
      V::StoreU16(dst + j, EncodeAs<V, Bf16Format, kStochastic>(V::LoadF(in + j), r, j));
    }
  } else if (type == MomentType::kFp16) {
    uint16_t* dst = static_cast<uint16_t*>(codes) + c;
    for (int j = 0; j < count; j += L) {
      V::StoreU16(dst + j,
                  EncodeAs<V, Fp16Format, kStochastic>(V::Mul(V::LoadF(in + j), scale), r, j));
    }
  } else {
    uint8_t* dst = static_cast<uint8_t*>(codes) + c;
    for (int j = 0; j < count; j += L) {
      V::StoreU8(dst + j,
                 EncodeAs<V, E4m3Format, kStochastic>(V::Mul(V::LoadF(in + j), scale), r, j));
    }
  }
}

// Stage 4: FP32 values of elements [c, c + count) -> codes, with the chunk's new scale for the
// scaled types. r: the chunk's random words, or nullptr for nearest rounding. known_amax: the
// amax bits of `in` where stage 3 found them (CodedMoment), else nullptr.
template <class V>
void QuantizeChunk(MomentType type, const float* in, const uint32_t* r, void* codes,
                   float* scale_inv, int64_t c, int count, const uint32_t* known_amax) {
  constexpr int L = V::kLanes;
  typename V::F scale = V::SetF(1.0f);
  if (type != MomentType::kBf16) {
    uint32_t amax_bits;
    if (known_amax != nullptr) {
      amax_bits = *known_amax;
    } else {
      typename V::I amax = V::SetI(0);
      for (int j = 0; j < count; j += L) amax = V::MaxU(amax, MagnitudeBits<V>(V::LoadF(in + j)));
      amax_bits = V::ReduceMaxU(amax);
    }
    const float amax_value = std::bit_cast<float>(amax_bits);
    const float top = type == MomentType::kFp16 ? 32768.0f : kE4m3Max;
    const float s = Pow2Scale(amax_value, top);
    scale_inv[c / kChunkElements] = 1.0f / s;  // exact: s is a power of two in [2^-126, 2^126]
    scale = V::SetF(s);
  }
  if (r != nullptr) {
    CastMoment<V, true>(type, in, r, codes, scale, c, count);
  } else {
    CastMoment<V, false>(type, in, r, codes, scale, c, count);
  }
}

// The same for a span [c, c + count): chunk by chunk, each with its own scale (known_amax: one
// per chunk, or nullptr).
template <class V>
void QuantizeMoment(MomentType type, const float* in, const uint32_t* r, void* codes,
                    float* scale_inv, int64_t c, int count, const uint32_t* known_amax) {
  for (int k = 0; k < count; k += kChunkElements) {
    QuantizeChunk<V>(type, in + k, r != nullptr ? r + k : nullptr, codes, scale_inv, c + k,
                     std::min<int>(kChunkElements, count - k),
                     known_amax != nullptr ? known_amax + k / kChunkElements : nullptr);
  }
}

// A scaled moment (FP8 or FP16) that stage 3 reads from its codes (UpdateLanes' kM, kV): decoded
// there as stage 1 would have decoded it, its new values stored in the stage's buffer as before,
// and the amax of those values found on the way, so that neither a decoded copy nor an amax pass
// of its own goes through memory. One chunk: `codes` points at element c's code.
struct CodedMoment {
  const void* codes = nullptr;
  float scale_inv = 1.0f;
  uint32_t amax = 0;  // out: the magnitude bits' max of the chunk's new values
};

// Whether a moment of type `t` beside a master of type `master` is a CodedMoment: the scaled types
// beside an FP32 master (the policies whose step is compute-bound; other masters keep stage 1).
inline bool IsCoded(MasterType master, MomentType t) {
  return master == MasterType::kFp32 && (t == MomentType::kFp8 || t == MomentType::kFp16);
}

template <class V>
PARAMD_LANES_INLINE void StoreOutF(float* p, typename V::F x, bool stream) {
  if (V::kCanStream && stream) {
    V::StreamF(p, x);
  } else {
    V::StoreF(p, x);
  }
}

template <class V>
PARAMD_LANES_INLINE void StoreOutU16(uint16_t* p, typename V::I x, bool stream) {
  if (V::kCanStream && stream) {
    V::StreamU16(p, x);
  } else {
    V::StoreU16(p, x);
  }
}

// Stage 3 for elements [c, c + count) of one chunk (count <= kChunkElements): m and v are the FP32
// moments of the chunk (the state for FP32 moments, else the stage-1 buffers), overwritten with the
// new moments. With kSeparate the state is read from its sources (x.master_in, ...; FP32 moments
// from x.exp_avg_in, ...) and written here; without, it is updated in place by the very code the
// step had before there were sources (same arguments, kept out of line as the compiler kept it).
template <class V, MasterType kMaster, bool kSeparate, MomentType kM = MomentType::kFp32,
          MomentType kV = MomentType::kFp32>
[[gnu::noinline]] void UpdateLanes(const StepContext<V>& x, int64_t c, int count, float* m,
                                   float* v, typename V::I* amax, CodedMoment* coded_m = nullptr,
                                   CodedMoment* coded_v = nullptr) {
  using F = typename V::F;
  using I = typename V::I;
  constexpr int L = V::kLanes;
  // The arguments' fields in locals: the vector stores may alias anything, so a field read through
  // x.args in the loop would be read again after every store.
  const FusedStepArgs& a = *x.args;
  const SlotType slot_type = a.slot_type;
  const void* const* slots = a.slots;
  const void* slot0 = slots[0];
  const int num_slots = a.num_slots;
  void* const master = a.master;
  int16_t* const master_remainder = a.master_remainder;
  const void* const master_src = kSeparate ? x.master_in : master;
  const int16_t* const master_remainder_src = kSeparate ? x.master_remainder_in : master_remainder;
  const float* const m_src = kSeparate && a.policy.exp_avg == MomentType::kFp32
                                 ? static_cast<const float*>(x.exp_avg_in) + c
                                 : m;
  const float* const v_src = kSeparate && a.policy.exp_avg_sq == MomentType::kFp32
                                 ? static_cast<const float*>(x.exp_avg_sq_in) + c
                                 : v;
  float* const out_fp32 = a.out_fp32;
  uint16_t* const out_bf16 = a.out_bf16;
  uint16_t* const out_fp16 = a.out_fp16;
  const bool clip_active = x.clip_active;
  const bool stream_fp32 = x.stream_fp32, stream_bf16 = x.stream_bf16, stream_fp16 = x.stream_fp16;
  const bool stream_m = x.stream_m, stream_v = x.stream_v;
  const bool stream_master = kSeparate && x.stream_master;
  // The coded moments (kM, kV other than kFp32): their codes, scales and new amax.
  constexpr bool kCodedM = kM != MomentType::kFp32;
  constexpr bool kCodedV = kV != MomentType::kFp32;
  const void* m_codes = nullptr;
  const void* v_codes = nullptr;
  F m_scale_inv = V::SetF(1.0f), v_scale_inv = V::SetF(1.0f);
  I m_amax = V::SetI(0), v_amax = V::SetI(0);
  if constexpr (kCodedM) {
    m_codes = coded_m->codes;
    m_scale_inv = V::SetF(coded_m->scale_inv);
  }
  if constexpr (kCodedV) {
    v_codes = coded_v->codes;
    v_scale_inv = V::SetF(coded_v->scale_inv);
  }
  // Per vector j: the gradient, the new moments and their amax; returns the new exp_avg, the new
  // exp_avg_sq in *v_new and AdamW's denominator in *d.
  auto moments = [&](int j, F* v_new, F* d) PARAMD_LANES_INLINE_LAMBDA {
    const int64_t i = c + j;
    F g = V::Mul(SlotSum<V>(slot_type, slot0, slots, num_slots, i), x.grad_scale);
    if (clip_active) g = V::Mul(g, x.clip);
    const F m_old = OldMoment<V, kM>(m_src, m_codes, m_scale_inv, j);
    const F v_old = OldMoment<V, kV>(v_src, v_codes, v_scale_inv, j);
    const F m_new = V::Fma(x.beta1, m_old, V::Mul(x.c1, g));
    *v_new = V::Fma(x.beta2, v_old, V::Mul(x.c2, V::Mul(g, g)));
    if constexpr (kCodedM) m_amax = V::MaxU(m_amax, MagnitudeBits<V>(m_new));
    if constexpr (kCodedV) v_amax = V::MaxU(v_amax, MagnitudeBits<V>(*v_new));
    *d = V::Fma(V::Sqrt(*v_new), x.bc2, x.eps);
    return m_new;
  };
  auto store_moments = [&](int j, F m_new, F v_new) PARAMD_LANES_INLINE_LAMBDA {
    if constexpr (kSeparate) {
      StoreOutF<V>(m + j, m_new, stream_m);
      StoreOutF<V>(v + j, v_new, stream_v);
    } else {
      V::StoreF(m + j, m_new);
      V::StoreF(v + j, v_new);
    }
  };
  // Per vector j: the master stored in its type, every served copy from it, and their amax.
  I amax_lanes = *amax;
  auto update_master = [&](int j, F m_new, F d) PARAMD_LANES_INLINE_LAMBDA {
    const int64_t i = c + j;
    F p_old;
    if constexpr (kMaster == MasterType::kFp32) {
      p_old = V::LoadF(static_cast<const float*>(master_src) + i);
    } else if constexpr (kMaster == MasterType::kBf16Remainder) {
      p_old = MergeBf16RemainderLanes<V>(
          V::LoadU16(static_cast<const uint16_t*>(master_src) + i),
          V::LoadU16(reinterpret_cast<const uint16_t*>(master_remainder_src) + i));
    } else {
      p_old = LoadFp16<V>(static_cast<const uint16_t*>(master_src) + i);
    }
    F p = V::Mul(p_old, x.decay);
    p = V::Fma(x.neg_step_size, V::Div(m_new, d), p);
    F served = p;
    if constexpr (kMaster == MasterType::kFp32) {
      StoreOutF<V>(static_cast<float*>(master) + i, p, stream_master);
      if (out_bf16 != nullptr) StoreOutU16<V>(out_bf16 + i, EncodeBf16Nearest<V>(p), stream_bf16);
      if (out_fp16 != nullptr) {
        StoreOutU16<V>(out_fp16 + i, EncodeFp16Nearest<V>(p), stream_fp16);
      }
    } else if constexpr (kMaster == MasterType::kBf16Remainder) {
      I hi, remainder;
      SplitBf16RemainderLanes<V>(p, &hi, &remainder);
      StoreOutU16<V>(static_cast<uint16_t*>(master) + i, hi, stream_master);
      StoreOutU16<V>(reinterpret_cast<uint16_t*>(master_remainder) + i, remainder, stream_master);
      if (out_bf16 != nullptr) StoreOutU16<V>(out_bf16 + i, hi, stream_bf16);
      if (out_fp16 != nullptr) {
        StoreOutU16<V>(out_fp16 + i, EncodeFp16Nearest<V>(p), stream_fp16);
      }
    } else {
      const I code = EncodeFp16Nearest<V>(p);
      StoreOutU16<V>(static_cast<uint16_t*>(master) + i, code, stream_master);
      served = DecodeFp16Codes<V>(code);
      if (out_bf16 != nullptr) {
        StoreOutU16<V>(out_bf16 + i, EncodeBf16Nearest<V>(served), stream_bf16);
      }
      if (out_fp16 != nullptr) StoreOutU16<V>(out_fp16 + i, code, stream_fp16);
    }
    if (out_fp32 != nullptr) StoreOutF<V>(out_fp32 + i, served, stream_fp32);
    amax_lanes = V::MaxU(amax_lanes, MagnitudeBits<V>(served));
  };
  if constexpr (kCodedM || kCodedV) {
    // With a moment decoded here each vector's chain (decode, square root, divide, encode) is too
    // long for the out-of-order window to overlap two vectors: two passes over the chunk, the
    // moments and denominators kept in L1 between them (measured on this VM: the fp8 policies
    // 6-12 % faster; FP32 moments, whose step is bound by memory, keep one pass).
    alignas(64) float m_keep[kChunkElements];
    alignas(64) float d_keep[kChunkElements];
    for (int j = 0; j < count; j += L) {
      F v_new, d;
      const F m_new = moments(j, &v_new, &d);
      store_moments(j, m_new, v_new);
      V::StoreF(m_keep + j, m_new);
      V::StoreF(d_keep + j, d);
    }
    for (int j = 0; j < count; j += L) update_master(j, V::LoadF(m_keep + j), V::LoadF(d_keep + j));
  } else {
    // The master is read before the moments are stored (with the stores first, the fp32 policy
    // ran at 0.62x in cache on an H100 host's Xeon: most likely 4 KiB aliasing, the state arrays
    // lying at the same offsets within their pages).
    for (int j = 0; j < count; j += L) {
      F v_new, d;
      const F m_new = moments(j, &v_new, &d);
      update_master(j, m_new, d);
      store_moments(j, m_new, v_new);
    }
  }
  *amax = amax_lanes;
  if constexpr (kCodedM) coded_m->amax = V::ReduceMaxU(m_amax);
  if constexpr (kCodedV) coded_v->amax = V::ReduceMaxU(v_amax);
}

// Stage 3 of one chunk with an FP32 master, its scaled moments decoded in the loop (CodedMoment):
// the instantiation for the moments' types (kFp32 for a moment read as FP32 values), kM first.
template <class V, bool kSeparate, MomentType kM>
void UpdateCodedV(const StepContext<V>& x, int64_t c, int count, float* m, float* v,
                  typename V::I* amax, MomentType v_type, CodedMoment* coded_m,
                  CodedMoment* coded_v) {
  constexpr MasterType kFp32 = MasterType::kFp32;
  if (coded_v != nullptr && v_type == MomentType::kFp8) {
    UpdateLanes<V, kFp32, kSeparate, kM, MomentType::kFp8>(x, c, count, m, v, amax, coded_m,
                                                           coded_v);
  } else if (coded_v != nullptr) {
    UpdateLanes<V, kFp32, kSeparate, kM, MomentType::kFp16>(x, c, count, m, v, amax, coded_m,
                                                            coded_v);
  } else {
    UpdateLanes<V, kFp32, kSeparate, kM, MomentType::kFp32>(x, c, count, m, v, amax, coded_m,
                                                            nullptr);
  }
}

template <class V, bool kSeparate>
void UpdateCodedLanes(const StepContext<V>& x, int64_t c, int count, float* m, float* v,
                      typename V::I* amax, const StatePolicy& policy, CodedMoment* coded_m,
                      CodedMoment* coded_v) {
  if (coded_m != nullptr && policy.exp_avg == MomentType::kFp8) {
    UpdateCodedV<V, kSeparate, MomentType::kFp8>(x, c, count, m, v, amax, policy.exp_avg_sq,
                                                 coded_m, coded_v);
  } else if (coded_m != nullptr) {
    UpdateCodedV<V, kSeparate, MomentType::kFp16>(x, c, count, m, v, amax, policy.exp_avg_sq,
                                                  coded_m, coded_v);
  } else {
    UpdateCodedV<V, kSeparate, MomentType::kFp32>(x, c, count, m, v, amax, policy.exp_avg_sq,
                                                  nullptr, coded_v);
  }
}

// One span [c, c + count): c a chunk's first element, count <= 512 and a multiple of V::kLanes.
// kSeparate: the state read from its sources (all set: FusedStepCpu checked), else in place, by
// the code the step had before there were sources (kept out of line as the compiler kept it).
template <class V, bool kSeparate>
[[gnu::noinline]] void StepSpan(const StepContext<V>& x, int64_t c, int count,
                                typename V::I* amax) {
  const FusedStepArgs& a = *x.args;
  const StatePolicy& policy = a.policy;
  alignas(64) float m_buf[kSpanElements];
  alignas(64) float v_buf[kSpanElements];
  alignas(64) uint32_t m_words[kDrawWords];
  alignas(64) uint32_t v_words[kDrawWords];

  // The FP32 moments: the state itself for FP32 moments (read from its sources by UpdateLanes),
  // else the stage-1 buffers, dequantized from the sources; scaled moments beside an FP32 master
  // are decoded by stage 3 as it reads them (CodedMoment), which writes the buffers.
  const void* m_in = kSeparate ? a.exp_avg_in : a.exp_avg;
  const float* m_scale_inv = kSeparate ? a.exp_avg_scale_inv_in : a.exp_avg_scale_inv;
  const void* v_in = kSeparate ? a.exp_avg_sq_in : a.exp_avg_sq;
  const float* v_scale_inv = kSeparate ? a.exp_avg_sq_scale_inv_in : a.exp_avg_sq_scale_inv;
  const bool coded_m = IsCoded(policy.master, policy.exp_avg);
  const bool coded_v = IsCoded(policy.master, policy.exp_avg_sq);
  float* m = m_buf;
  if (policy.exp_avg == MomentType::kFp32) {
    m = static_cast<float*>(a.exp_avg) + c;
  } else if (!coded_m) {
    DequantizeMoment<V>(policy.exp_avg, m_in, m_scale_inv, c, count, m_buf);
  }
  float* v = v_buf;
  if (policy.exp_avg_sq == MomentType::kFp32) {
    v = static_cast<float*>(a.exp_avg_sq) + c;
  } else if (!coded_v) {
    DequantizeMoment<V>(policy.exp_avg_sq, v_in, v_scale_inv, c, count, v_buf);
  }
  // The amax of each coded moment's new values, chunk by chunk (stage 3 finds them).
  uint32_t m_amax[kSpanElements / kChunkElements];
  uint32_t v_amax[kSpanElements / kChunkElements];
  // Each stochastically rounded moment's words, from its own stream (nullptr: nearest).
  const uint64_t index = a.rng.index_offset + static_cast<uint64_t>(c);
  const uint32_t* m_random = nullptr;
  if (policy.exp_avg != MomentType::kFp32 && policy.exp_avg_rounding == Rounding::kStochastic) {
    m_random = DrawWords<V>(x.key, RoundingStream::kExpAvg, a.rng.k, a.rng.tensor_index, index,
                            count, m_words);
  }
  const uint32_t* v_random = nullptr;
  if (policy.exp_avg_sq != MomentType::kFp32 &&
      policy.exp_avg_sq_rounding == Rounding::kStochastic) {
    v_random = DrawWords<V>(x.key, RoundingStream::kExpAvgSq, a.rng.k, a.rng.tensor_index, index,
                            count, v_words);
  }

  // Chunk by chunk, each first prefetching the chunk kPrefetchAhead elements on: the prefetches
  // spread as the loads go (a span's worth at once overran the outstanding misses the cores keep,
  // measured: the fp32 policy 20 % slower on this VM's 2 cores).
  for (int k = 0; k < count; k += kChunkElements) {
    const int n = std::min<int>(kChunkElements, count - k);
    const int64_t ahead = c + k + kPrefetchAhead;
    if (ahead < x.prefetch_end) {
      PrefetchElements<kSeparate>(a, ahead,
                                  std::min<int64_t>(kChunkElements, x.prefetch_end - ahead));
    }
    // With chunk amaxes wanted, the chunk's own: its bits stored, then folded into the range's
    // (only then: a chunk accumulator on every call made the step about 5 % slower in cache).
    typename V::I chunk_lanes = V::SetI(0);
    typename V::I* acc = x.chunk_amax != nullptr ? &chunk_lanes : amax;
    switch (policy.master) {
      case MasterType::kFp32:
        if (coded_m || coded_v) {
          const int64_t chunk = (c + k) / kChunkElements;
          CodedMoment cm, cv;
          const int64_t m_bytes = MomentBytes(policy.exp_avg);
          const int64_t v_bytes = MomentBytes(policy.exp_avg_sq);
          if (coded_m) {
            cm = {static_cast<const uint8_t*>(m_in) + (c + k) * m_bytes, m_scale_inv[chunk]};
          }
          if (coded_v) {
            cv = {static_cast<const uint8_t*>(v_in) + (c + k) * v_bytes, v_scale_inv[chunk]};
          }
          UpdateCodedLanes<V, kSeparate>(x, c + k, n, m + k, v + k, acc, policy,
                                         coded_m ? &cm : nullptr, coded_v ? &cv : nullptr);
          m_amax[k / kChunkElements] = cm.amax;
          v_amax[k / kChunkElements] = cv.amax;
        } else {
          UpdateLanes<V, MasterType::kFp32, kSeparate>(x, c + k, n, m + k, v + k, acc);
        }
        break;
      case MasterType::kBf16Remainder:
        UpdateLanes<V, MasterType::kBf16Remainder, kSeparate>(x, c + k, n, m + k, v + k, acc);
        break;
      case MasterType::kFp16:
        UpdateLanes<V, MasterType::kFp16, kSeparate>(x, c + k, n, m + k, v + k, acc);
        break;
    }
    if (x.chunk_amax != nullptr) {
      x.chunk_amax[(c + k - x.chunk_amax_begin) / kChunkElements] = V::ReduceMaxU(chunk_lanes);
      *amax = V::MaxU(*amax, chunk_lanes);
    }
  }

  if (policy.exp_avg != MomentType::kFp32) {
    QuantizeMoment<V>(policy.exp_avg, m_buf, m_random, a.exp_avg, a.exp_avg_scale_inv, c, count,
                      coded_m ? m_amax : nullptr);
  }
  if (policy.exp_avg_sq != MomentType::kFp32) {
    QuantizeMoment<V>(policy.exp_avg_sq, v_buf, v_random, a.exp_avg_sq, a.exp_avg_sq_scale_inv, c,
                      count, coded_v ? v_amax : nullptr);
  }
}

// One span, in place or from the sources.
template <class V>
inline void StepChunk(const StepContext<V>& x, int64_t c, int count, typename V::I* amax) {
  if (x.separate) {
    StepSpan<V, true>(x, c, count, amax);
  } else {
    StepSpan<V, false>(x, c, count, amax);
  }
}

// Whether every stored-master store of a vector path from element `begin` on is a whole aligned
// vector (a bf16+remainder master: its remainder too).
template <class V>
bool MasterAligned(const FusedStepArgs& a, int64_t begin) {
  if (a.policy.master == MasterType::kFp32) {
    return IsAligned(static_cast<float*>(a.master) + begin, V::kLanes * 4);
  }
  const bool halves = IsAligned(static_cast<uint16_t*>(a.master) + begin, V::kLanes * 2);
  if (a.policy.master == MasterType::kFp16) return halves;
  return halves && IsAligned(a.master_remainder + begin, V::kLanes * 2);
}

// The whole range [begin, end): spans of 512 elements from `begin`, each chunk prefetched
// kPrefetchAhead elements before it runs (in StepChunk). Returns the amax bits of the new stored
// master, and with chunk_amax those of each chunk (see FusedStepScalar).
template <class V>
uint32_t RunRange(const FusedStepArgs& a, int64_t begin, int64_t end, uint32_t* chunk_amax) {
  StepContext<V> x(a);
  x.chunk_amax = chunk_amax;
  x.chunk_amax_begin = begin;
  if constexpr (V::kCanStream) {
    if (end - begin >= kMinStreamElements) {
      x.stream_fp32 = a.out_fp32 != nullptr && IsAligned(a.out_fp32 + begin, V::kLanes * 4);
      x.stream_bf16 = a.out_bf16 != nullptr && IsAligned(a.out_bf16 + begin, V::kLanes * 2);
      x.stream_fp16 = a.out_fp16 != nullptr && IsAligned(a.out_fp16 + begin, V::kLanes * 2);
      x.stream_m = a.policy.exp_avg == MomentType::kFp32 && x.exp_avg_in != a.exp_avg &&
                   IsAligned(static_cast<float*>(a.exp_avg) + begin, V::kLanes * 4);
      x.stream_v = a.policy.exp_avg_sq == MomentType::kFp32 && x.exp_avg_sq_in != a.exp_avg_sq &&
                   IsAligned(static_cast<float*>(a.exp_avg_sq) + begin, V::kLanes * 4);
      x.stream_master = a.stream_master && x.separate && MasterAligned<V>(a, begin);
    }
  }
  if constexpr (V::kLanes > 1) x.prefetch_end = end;
  typename V::I amax = V::SetI(0);
  uint32_t amax_bits = 0;
  for (int64_t c = begin; c < end; c += kSpanElements) {
    const int count = static_cast<int>(std::min<int64_t>(kSpanElements, end - c));
    if constexpr (V::kLanes > 1) {
      if (count % V::kLanes != 0) {
        // The range's last span, whose last chunk is not whole vectors: the chunks before it here,
        // that chunk by the scalar instantiation.
        const int whole = count / kChunkElements * kChunkElements;
        if (whole > 0) StepChunk<V>(x, c, whole, &amax);
        const uint32_t tail = StepChunkScalar(a, c + whole, count - whole);
        if (chunk_amax != nullptr) chunk_amax[(c + whole - begin) / kChunkElements] = tail;
        amax_bits = std::max(amax_bits, tail);
        continue;
      }
    }
    StepChunk<V>(x, c, count, &amax);
  }
  // Streaming stores are weakly ordered: fence them before the caller publishes the outputs.
  if (x.stream_fp32 || x.stream_bf16 || x.stream_fp16 || x.stream_m || x.stream_v ||
      x.stream_master) {
    V::Fence();
  }
  return std::max(amax_bits, V::ReduceMaxU(amax));
}

// The unit tests' hooks (fused_step_paths.h) on V; n a multiple of V::kLanes.
template <class V>
void EncodeArray(CodecFormat format, const float* x, const uint32_t* r, uint32_t* codes,
                 int64_t n) {
  for (int64_t j = 0; j < n; j += V::kLanes) {
    const typename V::F y = V::LoadF(x + j);
    const typename V::I rj = r != nullptr ? V::LoadU32(r + j) : V::SetI(0);
    typename V::I code;
    switch (format) {
      case CodecFormat::kE4m3:
        if (r != nullptr) {
          // The step casts with the short form; the long one (the GPU's) must give the same code,
          // else a code no cast gives.
          const typename V::I short_code = EncodeE4m3Stochastic<V>(y, rj);
          code = V::Select(V::Eq(short_code, Encode<V, E4m3Format, true>(y, rj)), short_code,
                           V::SetI(0xBADC0DEu));
        } else {
          code = EncodeE4m3Nearest<V>(y);
        }
        break;
      case CodecFormat::kFp16:
        code = r != nullptr ? Encode<V, Fp16Format, true>(y, rj) : EncodeFp16Nearest<V>(y);
        break;
      default:
        code = r != nullptr ? Encode<V, Bf16Format, true>(y, rj) : EncodeBf16Nearest<V>(y);
        break;
    }
    V::StoreU32(codes + j, code);
  }
}

// words[j] = the word of `stream` for element index + j, j < count.
template <class V>
void DrawArray(const PhiloxKey& key, RoundingStream stream, uint32_t k, uint32_t tensor_index,
               uint64_t index, int64_t count, uint32_t* words) {
  alignas(64) uint32_t buf[kDrawWords];
  for (int64_t j = 0; j < count; j += kChunkElements) {
    const int n = static_cast<int>(std::min(kChunkElements, count - j));
    const uint32_t* r =
        DrawWords<V>(key, stream, k, tensor_index, index + static_cast<uint64_t>(j), n, buf);
    std::copy(r, r + n, words + j);
  }
}

template <class V>
void DecodeArray(CodecFormat format, const uint32_t* codes, float* out, int64_t n) {
  for (int64_t j = 0; j < n; j += V::kLanes) {
    const typename V::I code = V::LoadU32(codes + j);
    switch (format) {
      case CodecFormat::kE4m3: {
        // The step reads E4M3 codes from memory times their chunk's scale (LoadE4m3): at scales
        // from the smallest to the largest a chunk can have, a lane where that differs from the
        // decode times the scale shows as a value no decode gives.
        uint8_t packed[V::kLanes];
        for (int l = 0; l < V::kLanes; ++l) packed[l] = static_cast<uint8_t>(codes[j + l]);
        const typename V::F decoded = DecodeE4m3<V>(code);
        typename V::I differ = V::SetI(0);
        for (const float s : {1.0f, 0x1p-126f, 0x1p-100f, 0x1p100f, 0x1p126f}) {
          const typename V::I loaded = V::AsI(LoadE4m3<V>(packed, V::SetF(s)));
          differ = V::Or(differ, V::Xor(loaded, V::AsI(V::Mul(decoded, V::SetF(s)))));
        }
        V::StoreF(out + j, V::AsF(V::Select(V::Eq(differ, V::SetI(0)), V::AsI(decoded),
                                            V::SetI(0x7FBADBADu))));
        break;
      }
      case CodecFormat::kFp16: {
        // The step decodes FP16 codes both from lanes and straight from memory: a lane where the
        // two differ shows as a value no decode gives.
        uint16_t packed[V::kLanes];
        for (int l = 0; l < V::kLanes; ++l) packed[l] = static_cast<uint16_t>(codes[j + l]);
        const typename V::I from_lanes = V::AsI(DecodeFp16Codes<V>(code));
        const typename V::I loaded = V::AsI(LoadFp16<V>(packed));
        V::StoreF(out + j,
                  V::AsF(V::Select(V::Eq(from_lanes, loaded), loaded, V::SetI(0x7FBADBADu))));
        break;
      }
      default:
        V::StoreF(out + j, DecodeBf16<V>(code));
        break;
    }
  }
}

}  // namespace paramd::kernels::cpu_internal
