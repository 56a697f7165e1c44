// Internal to kernels/cpu: the code paths behind FusedStepCpu (each an instantiation of
// step_pipeline.h), the prefetch helpers they share, and hooks that let the unit tests run one
// path's casts and Philox directly. Not part of the API.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/fused_step.h"
#include "kernels/philox.h"

namespace paramd::kernels::cpu_internal {

// Each path runs [begin, end) of an already validated FusedStepArgs and returns the largest
// magnitude bits of the new stored master (above 0x7F800000 when a NaN was among them); with
// chunk_amax_bits (begin a multiple of 128), those of each 128-element chunk too.
uint32_t FusedStepScalar(const FusedStepArgs& args, int64_t begin, int64_t end,
                         uint32_t* chunk_amax_bits);
uint32_t FusedStepAvx2(const FusedStepArgs& args, int64_t begin, int64_t end,
                       uint32_t* chunk_amax_bits);
uint32_t FusedStepAvx512(const FusedStepArgs& args, int64_t begin, int64_t end,
                         uint32_t* chunk_amax_bits);

// One chunk [c, c + count) through the scalar instantiation: the vector paths' partial chunks.
uint32_t StepChunkScalar(const FusedStepArgs& args, int64_t c, int count);

// Below this many elements per call the served outputs are stored normally: a small tensor's
// served copy may well be read again from the cache.
inline constexpr int64_t kMinStreamElements = 4096;

// How far ahead of the current chunk the vector paths prefetch their input streams: 512 elements,
// 2 KiB of each FP32 stream. The hardware prefetchers alone keep too few lines in flight for these
// streams while the divider and square-root unit are busy (on the development machine, 2 cores
// with AVX-512, the fp32 policy went from 0.93 to 0.99 of the bandwidth of its bare access pattern
// when this was added).
inline constexpr int64_t kPrefetchAhead = 512;

// Prefetches one cache line into all cache levels. An asm statement rather than
// __builtin_prefetch: GCC 12 at -O2 silently dropped every __builtin_prefetch of a loop that
// contained nothing but prefetches; a volatile asm cannot be dropped.
inline void PrefetchLine(const void* p) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 0, 3);
#endif
}

inline void PrefetchBytes(const void* base, int64_t offset, int64_t bytes) {
  const char* p = static_cast<const char*>(base) + offset;
  for (int64_t b = 0; b < bytes; b += 64) PrefetchLine(p + b);
}

inline int64_t MomentBytes(MomentType t) {
  return t == MomentType::kFp32 ? 4 : t == MomentType::kFp8 ? 1 : 2;
}

// Prefetches the input streams of elements [c, c + count): the slots and the state, read from its
// sources (all set: FusedStepCpu checked) when kSeparate, else in place.
template <bool kSeparate>
inline void PrefetchElements(const FusedStepArgs& a, int64_t c, int64_t count) {
  const int64_t slot_bytes = a.slot_type == SlotType::kFp32 ? 4 : 2;
  for (int r = 0; r < a.num_slots; ++r) {
    PrefetchBytes(a.slots[r], c * slot_bytes, count * slot_bytes);
  }
  const int64_t master_bytes = a.policy.master == MasterType::kFp32 ? 4 : 2;
  PrefetchBytes(kSeparate ? a.master_in : a.master, c * master_bytes, count * master_bytes);
  if (a.policy.master == MasterType::kBf16Remainder) {
    PrefetchBytes(kSeparate ? a.master_remainder_in : a.master_remainder, c * 2, count * 2);
  }
  const int64_t m_bytes = MomentBytes(a.policy.exp_avg);
  PrefetchBytes(kSeparate ? a.exp_avg_in : a.exp_avg, c * m_bytes, count * m_bytes);
  const int64_t v_bytes = MomentBytes(a.policy.exp_avg_sq);
  PrefetchBytes(kSeparate ? a.exp_avg_sq_in : a.exp_avg_sq, c * v_bytes, count * v_bytes);
}

// Where a state buffer is read from: its *_in source, or the destination itself (in place).
template <class T, class U>
inline const T* StateSource(const T* in, U* out) {
  return in != nullptr ? in : out;
}

inline bool IsAligned(const void* p, uintptr_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

// ---- hooks for the unit tests: one path's casts, decodes and Philox on arrays ----

enum class CodecFormat { kE4m3, kFp16, kBf16 };

// codes[j] = the cast of x[j] (nearest when r is null, else stochastic with r[j]); n a multiple of
// 16.
void EncodeForTest(CpuPath path, CodecFormat format, const float* x, const uint32_t* r,
                   uint32_t* codes, int64_t n);
// out[j] = the value of codes[j]; n a multiple of 16.
void DecodeForTest(CpuPath path, CodecFormat format, const uint32_t* codes, float* out, int64_t n);
// words[j] = stochastic rounding's word of `stream` for element index + j of a tensor
// (kernels/philox.h's RoundingWord), drawn as the step draws them; any count.
void PhiloxForTest(CpuPath path, uint64_t seed, RoundingStream stream, uint32_t k,
                   uint32_t tensor_index, uint64_t index, int64_t count, uint32_t* words);

// Each path's own hooks, behind the three above.
void EncodeForTestScalar(CodecFormat format, const float* x, const uint32_t* r, uint32_t* codes,
                         int64_t n);
void EncodeForTestAvx2(CodecFormat format, const float* x, const uint32_t* r, uint32_t* codes,
                       int64_t n);
void EncodeForTestAvx512(CodecFormat format, const float* x, const uint32_t* r, uint32_t* codes,
                         int64_t n);
void DecodeForTestScalar(CodecFormat format, const uint32_t* codes, float* out, int64_t n);
void DecodeForTestAvx2(CodecFormat format, const uint32_t* codes, float* out, int64_t n);
void DecodeForTestAvx512(CodecFormat format, const uint32_t* codes, float* out, int64_t n);
void PhiloxForTestScalar(const PhiloxKey& key, RoundingStream stream, uint32_t k,
                         uint32_t tensor_index, uint64_t index, int64_t count, uint32_t* words);
void PhiloxForTestAvx2(const PhiloxKey& key, RoundingStream stream, uint32_t k,
                       uint32_t tensor_index, uint64_t index, int64_t count, uint32_t* words);
void PhiloxForTestAvx512(const PhiloxKey& key, RoundingStream stream, uint32_t k,
                         uint32_t tensor_index, uint64_t index, int64_t count, uint32_t* words);

}  // namespace paramd::kernels::cpu_internal
