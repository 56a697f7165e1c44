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

// DESIGN.md §3's stochastic rounding of states: key = the job's 64-bit seed (word 0 = low 32 bits),
// counter = (element index within the tensor, low then high 32 bits; k, the count of applied steps;
// the tensor's registration index). Word 0 of the output rounds exp_avg, word 1 exp_avg_sq.
PARAMD_HD constexpr PhiloxKey RoundingKey(uint64_t seed) {
  return {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
}
PARAMD_HD constexpr PhiloxCounter RoundingCounter(uint64_t index, uint32_t k,
                                                  uint32_t tensor_index) {
  return {static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), k, tensor_index};
}

}  // namespace paramd::kernels
