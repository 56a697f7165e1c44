// Philox 4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011): the
// counter-based generator behind stochastic rounding of optimizer states (DESIGN.md §3). Scalar,
// constexpr and the same on every backend; the CPU vector paths carry their own lane-parallel form
// (kernels/cpu/vec_avx2.h, kernels/cpu/vec_avx512.h), tested against this one.
#pragma once

#include <array>
#include <cstdint>

#include "kernels/hd.h"

namespace paramd::kernels {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

inline constexpr uint32_t kPhiloxM0 = 0xD2511F53u;  // multiplier of counter word 0
inline constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;  // multiplier of counter word 2
inline constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;  // key bump of word 0 (golden ratio)
inline constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;  // key bump of word 1 (sqrt(3) - 1)
inline constexpr int kPhiloxRounds = 10;

// One Philox4x32 round: two 32x32 -> 64-bit multiplies, their high halves xor-ed with the other
// counter words and the round key.
PARAMD_HD constexpr PhiloxCounter PhiloxRound(const PhiloxCounter& c, const PhiloxKey& k) {
  const uint64_t p0 = uint64_t{kPhiloxM0} * c[0];
  const uint64_t p1 = uint64_t{kPhiloxM1} * c[2];
  return {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
          static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
}

// Philox4x32-10 of `counter` under `key`: 10 rounds, the key bumped between rounds.
PARAMD_HD constexpr PhiloxCounter Philox4x32_10(PhiloxCounter counter, PhiloxKey key) {
  for (int round = 0; round < kPhiloxRounds; ++round) {
    if (round > 0) key = {key[0] + kPhiloxW0, key[1] + kPhiloxW1};
    counter = PhiloxRound(counter, key);
  }
  return counter;
}

// Stochastic rounding of states (README.md "Numerics", docs/numerics.md): key = the job's 64-bit
// seed (word 0 = its low 32 bits). Each moment draws from a stream of its own, and each Philox
// block of a stream covers 4 consecutive elements of the tensor: element i takes word i % 4 of the
// block numbered i / 4, whose counter is
//   (block low 32 bits; block >> 32 (below 2^30), plus 2^31 for exp_avg_sq; k; tensor_index),
// k the count of applied steps and tensor_index the tensor's registration index. Every word of a
// block is used at full 32-bit resolution, and a moment draws the same bits whether or not the
// other one rounds stochastically.
enum class RoundingStream : uint32_t { kExpAvg = 0, kExpAvgSq = 1 };
inline constexpr int kElementsPerBlock = 4;

PARAMD_HD constexpr PhiloxKey RoundingKey(uint64_t seed) {
  return {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
}
// Counter word 1 of block `block` of `stream`: block >> 32 is below 2^30 (element indices are
// below 2^64), so bit 31 is free for the stream.
PARAMD_HD constexpr uint32_t RoundingCounterWord1(uint64_t block, RoundingStream stream) {
  return static_cast<uint32_t>(block >> 32) | (static_cast<uint32_t>(stream) << 31);
}
PARAMD_HD constexpr PhiloxCounter RoundingCounter(uint64_t block, RoundingStream stream, uint32_t k,
                                                  uint32_t tensor_index) {
  return {static_cast<uint32_t>(block), RoundingCounterWord1(block, stream), k, tensor_index};
}
// The random word of element `index` of the tensor in `stream`.
PARAMD_HD constexpr uint32_t RoundingWord(const PhiloxKey& key, RoundingStream stream, uint32_t k,
                                          uint32_t tensor_index, uint64_t index) {
  return Philox4x32_10(RoundingCounter(index / kElementsPerBlock, stream, k, tensor_index),
                       key)[index % kElementsPerBlock];
}
// The words of `stream` for elements index .. index + 3 into r[0..3]: one Philox block where
// index is a multiple of 4 (the block's four words), else each element's RoundingWord. The GPU
// kernel's threads that own 4 consecutive elements draw with it; philox_test checks it against
// RoundingWord on the host.
PARAMD_HD constexpr void RoundingWords4(const PhiloxKey& key, RoundingStream stream, uint32_t k,
                                        uint32_t tensor_index, uint64_t index, uint32_t* r) {
  if (index % kElementsPerBlock == 0) {
    const PhiloxCounter out =
        Philox4x32_10(RoundingCounter(index / kElementsPerBlock, stream, k, tensor_index), key);
    for (int j = 0; j < 4; ++j) r[j] = out[j];
  } else {
    for (int j = 0; j < 4; ++j) r[j] = RoundingWord(key, stream, k, tensor_index, index + j);
  }
}

}  // namespace paramd::kernels
