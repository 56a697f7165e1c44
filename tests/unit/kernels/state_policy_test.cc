// Every state policy of FusedStepCpu (DESIGN.md §3): bit-identical to the independent reference,
// on every dispatch path, bf16+remainder identical to fp32, stochastic rounding reproducible, and
// the argument rules of chunk-scaled ranges.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "kernels/formats.h"
#include "kernels/fused_step.h"
#include "reference/adamw_reference.h"
#include "reference/policy_reference.h"
#include "tests/unit/kernels/kernels_test_util.h"
#include "tests/unit/kernels/policy_test_util.h"

namespace paramd::kernels {
namespace {

using testing::CompareTensors;
using testing::PolicyName;
using testing::PolicyTensor;

// A job's gradient slots of one tensor.
struct Grads {
  SlotType type = SlotType::kFp32;
  std::vector<std::vector<float>> fp32;
  std::vector<std::vector<uint16_t>> bf16;
  std::vector<const void*> ptrs;

  Grads(std::mt19937_64& rng, SlotType t, int num_slots, size_t n) : type(t) {
    for (int r = 0; r < num_slots; ++r) {
      std::vector<float> values = testing::RandomFloats(rng, n);
      if (t == SlotType::kFp32) {
        fp32.push_back(std::move(values));
      } else {
        std::vector<uint16_t> codes(n);
        for (size_t i = 0; i < n; ++i) codes[i] = reference::Bf16FromFloat(values[i]);
        bf16.push_back(std::move(codes));
      }
    }
    for (int r = 0; r < num_slots; ++r) {
      ptrs.push_back(t == SlotType::kFp32 ? static_cast<const void*>(fp32[r].data())
                                          : static_cast<const void*>(bf16[r].data()));
    }
  }

  // The gradient the reference steps with: ClippedGradRef of the rank-ordered sum.
  std::vector<float> ForReference(float grad_scale, float clip) const {
    const size_t n = type == SlotType::kFp32 ? fp32[0].size() : bf16[0].size();
    const int num = static_cast<int>(ptrs.size());
    std::vector<float> g(n);
    for (size_t i = 0; i < n; ++i) {
      const float g0 =
          type == SlotType::kFp32
              ? reference::SumSlotsFp32(reinterpret_cast<const float* const*>(ptrs.data()), num, i)
              : reference::SumSlotsBf16(reinterpret_cast<const uint16_t* const*>(ptrs.data()), num,
                                        i);
      g[i] = reference::ClippedGradRef(g0, grad_scale, clip);
    }
    return g;
  }
};

// The reference's step of a tensor plus its served copies, in place.
void ReferenceStep(PolicyTensor* t, const AdamwHyper& hyper, int64_t k, const RngStream& rng,
                   const std::vector<float>& g) {
  const reference::PolicyRef policy = testing::ToRef(t->policy);
  reference::PolicyStepRef(policy, testing::ToRefHyper(hyper), k,
                           {rng.seed, rng.k, rng.tensor_index}, g.data(), t->n, &t->state);
  for (size_t i = 0; i < t->n; ++i) {
    const reference::MasterServedRef s = reference::ServeMasterRef(policy, t->state, i);
    t->out_fp32[i] = s.fp32;
    t->out_bf16[i] = s.bf16;
    t->out_fp16[i] = s.fp16;
  }
}

float AmaxOf(const std::vector<float>& x) {
  float amax = 0.0f;
  for (float v : x) {
    if (std::isnan(v)) return std::bit_cast<float>(0x7FC00000u);
    amax = std::max(amax, std::fabs(v));
  }
  return amax;
}

// --- (a) every policy against the reference ------------------------------------------------------

class StatePolicyMatchesReference : public ::testing::TestWithParam<StatePolicy> {};

TEST_P(StatePolicyMatchesReference, BitForBitOverSeveralSteps) {
  const StatePolicy policy = GetParam();
  const AdamwHyper hyper = testing::AccuracySetupHyper();
  const float grad_scale = static_cast<float>(1.0 / (3.0 * 1024.0));
  ThreadPool pool(3);
  std::mt19937_64 rng(7 + std::hash<std::string>()(PolicyName(policy)));
  // 1, primes, one chunk and its neighbours, non-multiples of 128 and of the vector widths.
  for (const size_t n : {size_t{1}, size_t{127}, size_t{128}, size_t{129}, size_t{1021},
                         size_t{4099}, size_t{16411}}) {
    const std::vector<float> initial = testing::NormalFloats(rng, n, 0.02);
    PolicyTensor kernel(policy, initial), ref(policy, initial);
    for (int64_t k = 1; k <= 3; ++k) {
      const SlotType slot_type = k == 2 ? SlotType::kBf16 : SlotType::kFp32;
      const Grads grads(rng, slot_type, static_cast<int>(k), n);
      const float clip = k == 2 ? 0.73f : 1.0f;
      const RngStream stream{0x0123456789ABCDEFull + static_cast<uint64_t>(n),
                             static_cast<uint32_t>(k), static_cast<uint32_t>(n % 5)};
      const FusedStepArgs args =
          kernel.Args(grads.ptrs, slot_type, grad_scale, clip, MakeAdamwScalars(hyper, k), stream);
      // Chunk-aligned blocks of 5 chunks on 3 threads; each block's amax combined.
      std::vector<float> block_amax((n + 639) / 640);
      pool.ParallelFor(static_cast<int64_t>(n), 640, [&](int64_t begin, int64_t end) {
        const KStatus st = FusedStepCpu(args, begin, end, CpuPath::kAuto, &block_amax[begin / 640]);
        ASSERT_TRUE(st.ok()) << st.message();
      });
      float amax = 0.0f;
      for (float a : block_amax) amax = AmaxCombine(amax, a);

      ReferenceStep(&ref, hyper, k, stream, grads.ForReference(grad_scale, clip));
      const std::string diff = CompareTensors(kernel, ref);
      ASSERT_EQ(diff, "") << "n=" << n << " k=" << k;
      EXPECT_EQ(std::bit_cast<uint32_t>(amax), std::bit_cast<uint32_t>(AmaxOf(ref.out_fp32)))
          << "n=" << n << " k=" << k;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllPolicies, StatePolicyMatchesReference,
                         ::testing::ValuesIn(testing::AllPolicies()),
                         [](const ::testing::TestParamInfo<StatePolicy>& info) {
                           return PolicyName(info.param);
                         });

// --- (b) every dispatch path against the scalar path, on edge values ----------------------------

// A random code of a quantized state that is not NaN or infinity (NaN payloads of FP32 arithmetic
// may legitimately differ between instruction forms, so they are kept out of bit comparisons).
uint32_t RandomFiniteCode(std::mt19937_64& rng, MomentType t) {
  std::uniform_int_distribution<uint32_t> bits;
  for (;;) {
    const uint32_t code = bits(rng) & (t == MomentType::kFp8 ? 0xFFu : 0xFFFFu);
    const uint32_t mag = code & (t == MomentType::kFp8 ? 0x7Fu : 0x7FFFu);
    if (t == MomentType::kFp8 && mag != 0x7F) return code;
    if (t == MomentType::kFp16 && mag < 0x7C00) return code;
    if (t == MomentType::kBf16 && mag < 0x7F80) return code;
  }
}

float EdgeValue(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> kind(0, 9);
  std::uniform_int_distribution<uint32_t> bits;
  const uint32_t sign = bits(rng) & 0x80000000u;
  switch (kind(rng)) {
    case 0:
      return std::bit_cast<float>(sign);
    case 1:
      return std::bit_cast<float>(sign | (bits(rng) & 0x007FFFFFu));  // subnormal
    case 2:
      return std::bit_cast<float>(sign | (bits(rng) & 0x7F7F0000u) | 0x8000u);  // a BF16 tie
    case 3:
      return std::bit_cast<float>(sign | (0x7F7F0000u + (bits(rng) & 0xFFFFu)));  // near FLT_MAX
    case 4:
      return std::bit_cast<float>(sign | (0x477F0000u + (bits(rng) & 0xFFFFu)));  // near FP16 max
    default:
      return testing::NormalFloats(rng, 1, 0.02)[0];
  }
}

// Fills a tensor's state with edge values: masters at the casts' edges, moments of any finite
// code, scales from 2^-126 to 2^126, FP32 moments over a wide range (exp_avg_sq non-negative).
void FillEdgeState(std::mt19937_64& rng, PolicyTensor* t) {
  std::uniform_int_distribution<int> exponent(-126, 126);
  for (size_t i = 0; i < t->n; ++i) {
    switch (t->policy.master) {
      case MasterType::kFp32:
        t->state.master_fp32[i] = EdgeValue(rng);
        break;
      case MasterType::kBf16Remainder: {
        const Bf16Split s = SplitBf16Remainder(EdgeValue(rng));
        t->state.master_u16[i] = s.served;
        t->state.master_remainder[i] = s.remainder;
        break;
      }
      case MasterType::kFp16:
        t->state.master_u16[i] = static_cast<uint16_t>(RandomFiniteCode(rng, MomentType::kFp16));
        break;
    }
  }
  for (auto [type, m, sq] : {std::tuple{t->policy.exp_avg, &t->state.exp_avg, false},
                             std::tuple{t->policy.exp_avg_sq, &t->state.exp_avg_sq, true}}) {
    for (size_t i = 0; i < t->n; ++i) {
      switch (type) {
        case MomentType::kFp32:
          m->fp32[i] = sq ? std::fabs(testing::WideRangeValue(rng)) : testing::WideRangeValue(rng);
          break;
        case MomentType::kBf16:
        case MomentType::kFp16:
          m->u16[i] = static_cast<uint16_t>(RandomFiniteCode(rng, type) & (sq ? 0x7FFFu : 0xFFFFu));
          break;
        case MomentType::kFp8:
          m->u8[i] = static_cast<uint8_t>(RandomFiniteCode(rng, type) & (sq ? 0x7Fu : 0xFFu));
          break;
      }
    }
    for (float& s : m->scale_inv) s = Pow2(exponent(rng));
  }
}

class CpuPathPolicyTest : public ::testing::TestWithParam<CpuPath> {
 protected:
  void SetUp() override {
    if (!CpuPathSupported(GetParam())) {
      GTEST_SKIP() << "this CPU cannot run the " << CpuPathName(GetParam()) << " path";
    }
  }
};

TEST_P(CpuPathPolicyTest, EveryPolicyGivesTheSameBitsAsTheScalarPath) {
  const CpuPath path = GetParam();
  std::mt19937_64 rng(99);
  const AdamwHyper hyper = testing::AccuracySetupHyper();
  for (const StatePolicy& policy : testing::AllPolicies()) {
    for (const size_t n : {size_t{16}, size_t{144}, size_t{643}, size_t{4096 + 3 * 128 + 77}}) {
      std::vector<float> zeros(n, 0.0f);
      PolicyTensor scalar(policy, zeros);
      FillEdgeState(rng, &scalar);
      PolicyTensor vector = scalar;
      for (int64_t k : {1, 2, 1000}) {
        const SlotType slot_type = k == 2 ? SlotType::kBf16 : SlotType::kFp32;
        const Grads grads(rng, slot_type, k == 1000 ? 3 : 1, n);
        const float clip = k == 1 ? 0.5f : 1.0f;
        const RngStream stream{~uint64_t{0} - static_cast<uint64_t>(k), static_cast<uint32_t>(k),
                               3};
        const AdamwScalars scalars = MakeAdamwScalars(hyper, k);
        float amax_scalar = 0.0f, amax_a = 0.0f, amax_b = 0.0f;
        const KStatus st =
            FusedStepCpu(scalar.Args(grads.ptrs, slot_type, 0.37f, clip, scalars, stream), 0,
                         static_cast<int64_t>(n), CpuPath::kScalar, &amax_scalar);
        ASSERT_TRUE(st.ok()) << st.message();
        // Two ranges, split at a chunk boundary, so the second starts away from element 0.
        const int64_t split = std::min<int64_t>(static_cast<int64_t>(n), 128);
        const FusedStepArgs args = vector.Args(grads.ptrs, slot_type, 0.37f, clip, scalars, stream);
        const KStatus st_a = FusedStepCpu(args, 0, split, path, &amax_a);
        ASSERT_TRUE(st_a.ok()) << st_a.message();
        const KStatus st_b = FusedStepCpu(args, split, static_cast<int64_t>(n), path, &amax_b);
        ASSERT_TRUE(st_b.ok()) << st_b.message();
        const std::string diff = CompareTensors(vector, scalar);
        ASSERT_EQ(diff, "") << PolicyName(policy) << " n=" << n << " k=" << k;
        EXPECT_EQ(std::bit_cast<uint32_t>(AmaxCombine(amax_a, amax_b)),
                  std::bit_cast<uint32_t>(amax_scalar));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(VectorPaths, CpuPathPolicyTest,
                         ::testing::Values(CpuPath::kAvx2, CpuPath::kAvx512),
                         [](const ::testing::TestParamInfo<CpuPath>& info) {
                           return std::string(CpuPathName(info.param));
                         });

// --- (b2) out of place: the state read from its sources (FusedStepArgs' *_in)
// ---------------------

class OutOfPlaceTest : public CpuPathPolicyTest {};

// Junk in a tensor's served copies, so a step that forgot one would show.
void ScribbleOutputs(PolicyTensor* t) {
  std::fill(t->out_fp32.begin(), t->out_fp32.end(), std::bit_cast<float>(0x7FBADBADu));
  std::fill(t->out_bf16.begin(), t->out_bf16.end(), uint16_t{0xBADu});
  std::fill(t->out_fp16.begin(), t->out_fp16.end(), uint16_t{0xBADu});
}

// Every policy on every path: a step that reads one copy of the state and writes another gives the
// destination the very bytes (state and served copies) and amax an in-place step from the same
// state gives, whatever the destination held, and leaves its sources as they were; sources that
// are their destinations' own pointers are the in-place step.
TEST_P(OutOfPlaceTest, EveryPolicyWritesTheInPlaceBytesAndLeavesItsSources) {
  const CpuPath path = GetParam();
  std::mt19937_64 rng(7);
  const AdamwHyper hyper = testing::AccuracySetupHyper();
  for (const StatePolicy& policy : testing::AllPolicies()) {
    for (const size_t n : {size_t{16}, size_t{643}, size_t{4096 + 3 * 128 + 77}}) {
      std::vector<float> zeros(n, 0.0f);
      PolicyTensor in_place(policy, zeros);
      FillEdgeState(rng, &in_place);
      PolicyTensor dest(policy, zeros);
      for (int64_t k : {1, 2, 1000}) {
        SCOPED_TRACE(PolicyName(policy) + " n=" + std::to_string(n) + " k=" + std::to_string(k));
        PolicyTensor source = in_place;
        const PolicyTensor source_before = source;
        PolicyTensor self = in_place;  // stepped with its own buffers as sources
        FillEdgeState(rng, &dest);     // stale state, unlike the source's
        // (but for the scales of unscaled moments, which no step reads or writes)
        if (!HasChunkScales(policy.exp_avg)) {
          dest.state.exp_avg.scale_inv = in_place.state.exp_avg.scale_inv;
        }
        if (!HasChunkScales(policy.exp_avg_sq)) {
          dest.state.exp_avg_sq.scale_inv = in_place.state.exp_avg_sq.scale_inv;
        }
        ScribbleOutputs(&dest);
        const SlotType slot_type = k == 2 ? SlotType::kBf16 : SlotType::kFp32;
        const Grads grads(rng, slot_type, k == 1000 ? 3 : 1, n);
        const float clip = k == 1 ? 0.5f : 1.0f;
        const RngStream stream{~uint64_t{0} - static_cast<uint64_t>(k), static_cast<uint32_t>(k),
                               3};
        const AdamwScalars scalars = MakeAdamwScalars(hyper, k);
        // Two ranges, split at a chunk boundary, so the second starts away from element 0.
        const int64_t end = static_cast<int64_t>(n);
        const int64_t split = std::min<int64_t>(end, 128);
        auto run = [&](const FusedStepArgs& args) {
          float amax_a = 0.0f, amax_b = 0.0f;
          const KStatus st_a = FusedStepCpu(args, 0, split, path, &amax_a);
          EXPECT_TRUE(st_a.ok()) << st_a.message();
          const KStatus st_b = FusedStepCpu(args, split, end, path, &amax_b);
          EXPECT_TRUE(st_b.ok()) << st_b.message();
          return std::bit_cast<uint32_t>(AmaxCombine(amax_a, amax_b));
        };
        const uint32_t amax_in_place =
            run(in_place.Args(grads.ptrs, slot_type, 0.37f, clip, scalars, stream));

        FusedStepArgs args = dest.Args(grads.ptrs, slot_type, 0.37f, clip, scalars, stream);
        source.SetAsSources(&args);
        EXPECT_EQ(run(args), amax_in_place);
        ASSERT_EQ(CompareTensors(dest, in_place), "");
        ASSERT_EQ(CompareTensors(source, source_before), "") << "a source was written";

        FusedStepArgs own = self.Args(grads.ptrs, slot_type, 0.37f, clip, scalars, stream);
        self.SetAsSources(&own);
        EXPECT_EQ(run(own), amax_in_place);
        ASSERT_EQ(CompareTensors(self, in_place), "");
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllPaths, OutOfPlaceTest,
                         ::testing::Values(CpuPath::kScalar, CpuPath::kAvx2, CpuPath::kAvx512),
                         [](const ::testing::TestParamInfo<CpuPath>& info) {
                           return std::string(CpuPathName(info.param));
                         });

// Long ranges with 64-byte aligned FP32 moment destinations, which the vector paths write with
// non-temporal stores out of place: the same bits as in place.
TEST_P(OutOfPlaceTest, AlignedFp32MomentDestinationsGetTheInPlaceBits) {
  const CpuPath path = GetParam();
  std::mt19937_64 rng(17);
  constexpr size_t kN = 3 * 4096 + 128 + 5;
  struct Aligned {
    // aligned_alloc wants a size that is a multiple of the alignment.
    explicit Aligned(size_t bytes)
        : p(static_cast<char*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64))) {}
    ~Aligned() { std::free(p); }
    char* p;
  };
  for (const MasterType master :
       {MasterType::kFp32, MasterType::kBf16Remainder, MasterType::kFp16}) {
    const StatePolicy policy = MakeStatePolicy(master, MomentType::kFp32, MomentType::kFp32);
    SCOPED_TRACE(PolicyName(policy));
    PolicyTensor in_place(policy, std::vector<float>(kN, 0.0f));
    FillEdgeState(rng, &in_place);
    PolicyTensor source = in_place;
    const PolicyTensor source_before = source;
    const Grads grads(rng, SlotType::kFp32, 2, kN);
    const AdamwScalars scalars = MakeAdamwScalars(testing::AccuracySetupHyper(), 7);
    const RngStream stream{};
    ASSERT_TRUE(
        FusedStepCpu(in_place.Args(grads.ptrs, SlotType::kFp32, 1.0f, 1.0f, scalars, stream), 0, kN,
                     path)
            .ok());

    PolicyTensor dest = source;  // its served copies; the state goes to the aligned buffers
    Aligned master_out(kN * 4), remainder_out(kN * 2), m_out(kN * 4), v_out(kN * 4);
    FusedStepArgs args = dest.Args(grads.ptrs, SlotType::kFp32, 1.0f, 1.0f, scalars, stream);
    source.SetAsSources(&args);
    args.master = master_out.p;
    args.master_remainder = reinterpret_cast<int16_t*>(remainder_out.p);
    args.exp_avg = m_out.p;
    args.exp_avg_sq = v_out.p;
    // Two ranges, the second from an aligned element past the first vectors.
    ASSERT_TRUE(FusedStepCpu(args, 0, 4096, path).ok());
    ASSERT_TRUE(FusedStepCpu(args, 4096, kN, path).ok());
    EXPECT_EQ(CompareTensors(source, source_before), "");
    auto same = [&](const char* what, const void* got, const void* want, size_t bytes) {
      EXPECT_EQ(std::memcmp(got, want, bytes), 0) << what;
    };
    same("exp_avg", m_out.p, in_place.state.exp_avg.fp32.data(), kN * 4);
    same("exp_avg_sq", v_out.p, in_place.state.exp_avg_sq.fp32.data(), kN * 4);
    if (master == MasterType::kFp32) {
      same("master", master_out.p, in_place.state.master_fp32.data(), kN * 4);
    } else {
      same("master", master_out.p, in_place.state.master_u16.data(), kN * 2);
    }
    if (master == MasterType::kBf16Remainder) {
      same("remainder", remainder_out.p, in_place.state.master_remainder.data(), kN * 2);
    }
    EXPECT_EQ(CompareTensors(dest, in_place, /*outputs=*/true).find("out_"), std::string::npos)
        << CompareTensors(dest, in_place);
  }
}

// The sources are all set or none, and each is its destination or clear of it: anything else is
// refused before a byte is written, the sources' and the destinations'.
TEST(OutOfPlaceRulesTest, AMixedSetOrAPartialOverlapIsRefusedAndWritesNothing) {
  const StatePolicy policy =
      MakeStatePolicy(MasterType::kBf16Remainder, MomentType::kFp8, MomentType::kFp16);
  std::mt19937_64 rng(5);
  constexpr size_t kN = 300;
  PolicyTensor source(policy, testing::NormalFloats(rng, kN, 0.02));
  PolicyTensor dest(policy, testing::NormalFloats(rng, kN, 0.02));
  const Grads grads(rng, SlotType::kFp32, 1, kN);
  FusedStepArgs good =
      dest.Args(grads.ptrs, SlotType::kFp32, 1.0f, 1.0f, MakeAdamwScalars({}, 1), {});
  source.SetAsSources(&good);
  const PolicyTensor source_before = source, dest_before = dest;

  // Each used source left out in turn: a mixed set.
  const std::pair<const char*, void (*)(FusedStepArgs*)> drop[] = {
      {"master_in", [](FusedStepArgs* a) { a->master_in = nullptr; }},
      {"master_remainder_in", [](FusedStepArgs* a) { a->master_remainder_in = nullptr; }},
      {"exp_avg_in", [](FusedStepArgs* a) { a->exp_avg_in = nullptr; }},
      {"exp_avg_scale_inv_in", [](FusedStepArgs* a) { a->exp_avg_scale_inv_in = nullptr; }},
      {"exp_avg_sq_in", [](FusedStepArgs* a) { a->exp_avg_sq_in = nullptr; }},
      {"exp_avg_sq_scale_inv_in", [](FusedStepArgs* a) { a->exp_avg_sq_scale_inv_in = nullptr; }},
  };
  for (const auto& [name, clear] : drop) {
    FusedStepArgs bad = good;
    clear(&bad);
    for (const CpuPath path : {CpuPath::kScalar, CpuPath::kAuto}) {
      const KStatus st = FusedStepCpu(bad, 0, static_cast<int64_t>(kN), path);
      EXPECT_EQ(st.code(), Code::kInvalidArgument) << name;
      EXPECT_NE(st.message().find(name), std::string::npos) << st.message();
    }
  }
  // A source that overlaps its own destination without being it.
  FusedStepArgs bad = good;
  bad.master_in = dest.state.master_u16.data() + 1;
  EXPECT_EQ(FusedStepCpu(bad, 0, 128).code(), Code::kInvalidArgument);
  bad = good;
  bad.exp_avg_in = dest.state.exp_avg.u8.data() + 64;
  EXPECT_EQ(FusedStepCpu(bad, 0, 128).code(), Code::kInvalidArgument);
  bad = good;
  bad.exp_avg_sq_scale_inv_in = dest.state.exp_avg_sq.scale_inv.data() + 1;
  EXPECT_EQ(FusedStepCpu(bad, 0, 128).code(), Code::kInvalidArgument);
  bad = good;
  bad.master_remainder_in = dest.state.master_remainder.data() + kN - 1;
  EXPECT_EQ(FusedStepCpu(bad, 0, 128).code(), Code::kInvalidArgument);
  EXPECT_EQ(CompareTensors(dest, dest_before), "") << "a refused call wrote its destination";
  EXPECT_EQ(CompareTensors(source, source_before), "") << "a refused call wrote a source";

  // The whole set is accepted, and leaves its sources as they were.
  EXPECT_TRUE(FusedStepCpu(good, 0, static_cast<int64_t>(kN)).ok());
  EXPECT_EQ(CompareTensors(source, source_before), "");
  EXPECT_NE(CompareTensors(dest, dest_before), "");

  // A source the policy does not use is ignored (as such destinations are): in place.
  const std::vector<float> initial = testing::NormalFloats(rng, kN, 0.02);
  PolicyTensor plain(MakeStatePolicy(MasterType::kFp32, MomentType::kFp32, MomentType::kFp32),
                     initial);
  PolicyTensor ignoring = plain;
  const AdamwScalars scalars = MakeAdamwScalars({}, 1);
  ASSERT_TRUE(
      FusedStepCpu(plain.Args(grads.ptrs, SlotType::kFp32, 1.0f, 1.0f, scalars, {}), 0, kN).ok());
  FusedStepArgs unused = ignoring.Args(grads.ptrs, SlotType::kFp32, 1.0f, 1.0f, scalars, {});
  unused.master_remainder_in = dest.state.master_remainder.data();
  ASSERT_TRUE(FusedStepCpu(unused, 0, kN).ok());
  EXPECT_EQ(CompareTensors(ignoring, plain), "");
}

// --- (c) bf16+remainder is the fp32 policy, bit for bit ------------------------------------------

TEST(StatePolicyTest, Bf16RemainderMasterStepsExactlyLikeAnFp32Master) {
  const AdamwHyper hyper = testing::AccuracySetupHyper();
  const MomentType moments[] = {MomentType::kFp32, MomentType::kBf16, MomentType::kFp16,
                                MomentType::kFp8};
  std::mt19937_64 rng(5);
  constexpr size_t kN = 2000;
  for (MomentType m : moments) {
    for (MomentType v : moments) {
      const std::vector<float> initial = testing::NormalFloats(rng, kN, 0.02);
      PolicyTensor fp32(MakeStatePolicy(MasterType::kFp32, m, v), initial);
      PolicyTensor split(MakeStatePolicy(MasterType::kBf16Remainder, m, v), initial);
      for (int64_t k = 1; k <= 20; ++k) {
        const Grads grads(rng, SlotType::kFp32, 1, kN);
        const RngStream stream{42, static_cast<uint32_t>(k), 0};
        const AdamwScalars s = MakeAdamwScalars(hyper, k);
        ASSERT_TRUE(
            FusedStepCpu(fp32.Args(grads.ptrs, SlotType::kFp32, 1.0f, 1.0f, s, stream), 0, kN)
                .ok());
        ASSERT_TRUE(
            FusedStepCpu(split.Args(grads.ptrs, SlotType::kFp32, 1.0f, 1.0f, s, stream), 0, kN)
                .ok());
      }
      std::vector<float> merged(kN);
      for (size_t i = 0; i < kN; ++i) {
        merged[i] = MergeBf16Remainder(split.state.master_u16[i], split.state.master_remainder[i]);
        ASSERT_EQ(split.out_bf16[i], split.state.master_u16[i]) << "the served half, i=" << i;
      }
      const std::string what = PolicyName(split.policy);
      EXPECT_EQ(testing::FirstDifference(merged, fp32.state.master_fp32), -1) << what;
      EXPECT_EQ(testing::FirstDifference(split.out_fp32, fp32.out_fp32), -1) << what;
      EXPECT_EQ(testing::FirstDifference(split.out_fp16, fp32.out_fp16), -1) << what;
      EXPECT_EQ(split.state.exp_avg.u8, fp32.state.exp_avg.u8) << what;
      EXPECT_EQ(split.state.exp_avg.u16, fp32.state.exp_avg.u16) << what;
      EXPECT_EQ(testing::FirstDifference(split.state.exp_avg.fp32, fp32.state.exp_avg.fp32), -1);
      EXPECT_EQ(split.state.exp_avg_sq.u8, fp32.state.exp_avg_sq.u8) << what;
      EXPECT_EQ(split.state.exp_avg_sq.u16, fp32.state.exp_avg_sq.u16) << what;
      EXPECT_EQ(testing::FirstDifference(split.state.exp_avg_sq.fp32, fp32.state.exp_avg_sq.fp32),
                -1);
    }
  }
}

// --- (d) stochastic rounding is reproducible, and keyed by every counter part
// ---------------------

TEST(StochasticRoundingTest, SameKeyAndCounterGiveTheSameBitsAndAnyChangeOthers) {
  const StatePolicy policy = [] {
    StatePolicy p = MakeStatePolicy(MasterType::kFp32, MomentType::kFp8, MomentType::kFp8);
    p.exp_avg_rounding = Rounding::kStochastic;
    return p;
  }();
  std::mt19937_64 rng(11);
  constexpr size_t kN = 4096;
  const std::vector<float> initial = testing::NormalFloats(rng, kN, 0.02);
  const Grads grads(rng, SlotType::kFp32, 1, kN);
  const AdamwScalars s = MakeAdamwScalars(testing::AccuracySetupHyper(), 3);
  auto run = [&](const RngStream& stream) {
    PolicyTensor t(policy, initial);
    EXPECT_TRUE(
        FusedStepCpu(t.Args(grads.ptrs, SlotType::kFp32, 1.0f, 1.0f, s, stream), 0, kN).ok());
    return t;
  };
  const RngStream base{0xFEEDull << 32 | 7, 3, 2};
  const PolicyTensor a = run(base), b = run(base);
  EXPECT_EQ(CompareTensors(a, b), "");
  for (const RngStream& other :
       {RngStream{base.seed ^ 1, 3, 2}, RngStream{base.seed ^ (1ull << 40), 3, 2},
        RngStream{base.seed, 4, 2}, RngStream{base.seed, 3, 3}}) {
    const PolicyTensor c = run(other);
    EXPECT_NE(c.state.exp_avg.u8, a.state.exp_avg.u8);
    EXPECT_NE(c.state.exp_avg_sq.u8, a.state.exp_avg_sq.u8);
  }
}

// Each moment draws from a stream of its own (kernels/philox.h): its codes are the same whether
// or not the other moment rounds stochastically, on every path.
TEST(StochasticRoundingTest, EachMomentDrawsTheSameBitsWhateverTheOtherRounds) {
  std::mt19937_64 rng(12);
  constexpr size_t kN = 1000;
  const std::vector<float> initial = testing::NormalFloats(rng, kN, 0.02);
  const Grads grads(rng, SlotType::kFp32, 1, kN);
  const AdamwScalars s = MakeAdamwScalars(testing::AccuracySetupHyper(), 2);
  const RngStream stream{77, 2, 5};
  auto run = [&](Rounding m, Rounding v, CpuPath path) {
    StatePolicy p = MakeStatePolicy(MasterType::kFp32, MomentType::kFp8, MomentType::kFp8);
    p.exp_avg_rounding = m;
    p.exp_avg_sq_rounding = v;
    PolicyTensor t(p, initial);
    EXPECT_TRUE(
        FusedStepCpu(t.Args(grads.ptrs, SlotType::kFp32, 1.0f, 1.0f, s, stream), 0, kN, path).ok());
    return t;
  };
  for (const CpuPath path : {CpuPath::kScalar, CpuPath::kAvx2, CpuPath::kAvx512}) {
    if (!CpuPathSupported(path)) continue;
    const PolicyTensor both = run(Rounding::kStochastic, Rounding::kStochastic, path);
    const PolicyTensor only_v = run(Rounding::kNearest, Rounding::kStochastic, path);
    const PolicyTensor only_m = run(Rounding::kStochastic, Rounding::kNearest, path);
    EXPECT_EQ(both.state.exp_avg_sq.u8, only_v.state.exp_avg_sq.u8) << CpuPathName(path);
    EXPECT_EQ(both.state.exp_avg.u8, only_m.state.exp_avg.u8) << CpuPathName(path);
    EXPECT_NE(both.state.exp_avg.u8, only_v.state.exp_avg.u8) << CpuPathName(path);
  }
}

// Ranges that start inside a Philox block (a bf16 moment has no chunk scales, so its ranges may
// start anywhere) and a split tensor's index_offset draw each element's word at its index in the
// whole tensor: the last 301 elements stepped as a tensor of their own, with index_offset 3 and
// ranges split at odd places, equal the same elements of the whole tensor, on every path.
TEST(StochasticRoundingTest, RangesAndOffsetsInsideABlockDrawEachElementsOwnWord) {
  StatePolicy policy = MakeStatePolicy(MasterType::kFp32, MomentType::kBf16, MomentType::kBf16);
  policy.exp_avg_rounding = Rounding::kStochastic;
  policy.exp_avg_sq_rounding = Rounding::kStochastic;
  constexpr size_t kOffset = 3, kN = 301;
  std::mt19937_64 rng(13);
  const std::vector<float> initial = testing::NormalFloats(rng, kOffset + kN, 0.02);
  const Grads grads(rng, SlotType::kFp32, 2, kOffset + kN);
  const AdamwScalars s = MakeAdamwScalars(testing::AccuracySetupHyper(), 4);
  const RngStream stream{0xABCDEF0123ull, 4, 1, 0};
  PolicyTensor whole(policy, initial);
  ASSERT_TRUE(FusedStepCpu(whole.Args(grads.ptrs, SlotType::kFp32, 1.0f, 1.0f, s, stream), 0,
                           kOffset + kN, CpuPath::kScalar)
                  .ok());
  const std::vector<const void*> tail_slots = {static_cast<const float*>(grads.ptrs[0]) + kOffset,
                                               static_cast<const float*>(grads.ptrs[1]) + kOffset};
  auto tail_of = [&](const auto& v) {
    using T = typename std::decay_t<decltype(v)>::value_type;
    return std::vector<T>(v.begin() + kOffset, v.end());
  };
  for (const CpuPath path : {CpuPath::kScalar, CpuPath::kAvx2, CpuPath::kAvx512}) {
    if (!CpuPathSupported(path)) continue;
    PolicyTensor part(policy, tail_of(initial));
    RngStream part_stream = stream;
    part_stream.index_offset = kOffset;
    const FusedStepArgs args = part.Args(tail_slots, SlotType::kFp32, 1.0f, 1.0f, s, part_stream);
    for (const auto& [begin, end] :
         {std::pair<int64_t, int64_t>{0, 1}, {1, 6}, {6, 135}, {135, static_cast<int64_t>(kN)}}) {
      ASSERT_TRUE(FusedStepCpu(args, begin, end, path).ok());
    }
    const std::string name = CpuPathName(path);
    EXPECT_EQ(testing::FirstDifference(part.state.master_fp32, tail_of(whole.state.master_fp32)),
              -1)
        << name;
    EXPECT_EQ(part.state.exp_avg.u16, tail_of(whole.state.exp_avg.u16)) << name;
    EXPECT_EQ(part.state.exp_avg_sq.u16, tail_of(whole.state.exp_avg_sq.u16)) << name;
  }
}

// --- argument rules, amax and panels
// --------------------------------------------------------------

TEST(StatePolicyTest, ChunkScaledRangesMustNotSplitAChunk) {
  const StatePolicy policy =
      MakeStatePolicy(MasterType::kFp32, MomentType::kFp8, MomentType::kFp16);
  std::mt19937_64 rng(3);
  constexpr size_t kN = 300;
  PolicyTensor t(policy, testing::NormalFloats(rng, kN, 0.02));
  const Grads grads(rng, SlotType::kFp32, 1, kN);
  const FusedStepArgs good =
      t.Args(grads.ptrs, SlotType::kFp32, 1.0f, 1.0f, MakeAdamwScalars({}, 1), {});
  const PolicyTensor before = t;
  EXPECT_EQ(FusedStepCpu(good, 1, 128).code(), Code::kInvalidArgument);
  EXPECT_EQ(FusedStepCpu(good, 0, 129).code(), Code::kInvalidArgument);
  EXPECT_EQ(FusedStepCpu(good, 256, 301).code(), Code::kInvalidArgument) << "past numel";
  FusedStepArgs bad = good;
  bad.numel = 0;
  EXPECT_EQ(FusedStepCpu(bad, 0, 128).code(), Code::kInvalidArgument) << "numel is required";
  bad = good;
  bad.exp_avg_sq_scale_inv = nullptr;
  EXPECT_EQ(FusedStepCpu(bad, 0, 128).code(), Code::kInvalidArgument);
  bad = good;
  bad.policy.master = MasterType::kBf16Remainder;
  EXPECT_EQ(FusedStepCpu(bad, 0, 128).code(), Code::kInvalidArgument) << "no remainders";
  bad = good;
  bad.policy.exp_avg = MomentType::kFp32;
  bad.policy.exp_avg_rounding = Rounding::kStochastic;
  EXPECT_EQ(FusedStepCpu(bad, 0, 128).code(), Code::kInvalidArgument);
  EXPECT_EQ(CompareTensors(t, before), "") << "a rejected call writes nothing";

  EXPECT_TRUE(FusedStepCpu(good, 0, 128).ok());
  EXPECT_TRUE(FusedStepCpu(good, 128, 256).ok());
  EXPECT_TRUE(FusedStepCpu(good, 256, 300).ok()) << "a range may end at numel";
}

TEST(StatePolicyTest, MasterAmaxIsTheLargestMagnitudeOrNaN) {
  std::vector<float> initial = {0.5f, -3.0f, 1.0f, 2.0f};
  PolicyTensor t(MakeStatePolicy(MasterType::kFp32, MomentType::kFp32, MomentType::kFp32), initial);
  std::vector<float> zero(4, 0.0f);
  const std::vector<const void*> slots = {zero.data()};
  AdamwHyper h;
  h.lr = 0.0;
  const FusedStepArgs args = t.Args(slots, SlotType::kFp32, 1.0f, 1.0f, MakeAdamwScalars(h, 1), {});
  float amax = -1.0f;
  ASSERT_TRUE(FusedStepCpu(args, 0, 4, CpuPath::kAuto, &amax).ok());
  EXPECT_EQ(amax, 3.0f);
  ASSERT_TRUE(FusedStepCpu(args, 0, 0, CpuPath::kAuto, &amax).ok());
  EXPECT_EQ(amax, 0.0f) << "an empty range";
  t.state.master_fp32[2] = std::nanf("");
  ASSERT_TRUE(FusedStepCpu(args, 0, 4, CpuPath::kAuto, &amax).ok());
  EXPECT_TRUE(std::isnan(amax));
}

}  // namespace
}  // namespace paramd::kernels
