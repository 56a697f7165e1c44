// The fp32 policy of FusedStepCpu: bit-identical to the independent reference (DESIGN.md §3) and
// across every CPU code path.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "kernels/fused_step.h"
#include "reference/adamw_reference.h"
#include "tests/unit/kernels/kernels_test_util.h"

namespace paramd::kernels {

// Readable test parameters in GoogleTest output (found by argument-dependent lookup).
void PrintTo(SlotType t, std::ostream* os) { *os << (t == SlotType::kFp32 ? "fp32" : "bf16"); }
void PrintTo(CpuPath p, std::ostream* os) { *os << CpuPathName(p); }

namespace {

using testing::Describe;
using testing::FirstBitMismatch;

// A job's gradient slots of one tensor, in either slot type.
struct Slots {
  SlotType type = SlotType::kFp32;
  std::vector<std::vector<float>> fp32;
  std::vector<std::vector<uint16_t>> bf16;
  std::vector<const void*> ptrs;

  // g0 * grad_scale of element i, computed by the reference.
  float ScaledGrad(size_t i, float grad_scale) const {
    const int num = static_cast<int>(ptrs.size());
    const float g0 =
        type == SlotType::kFp32
            ? reference::SumSlotsFp32(reinterpret_cast<const float* const*>(ptrs.data()), num, i)
            : reference::SumSlotsBf16(reinterpret_cast<const uint16_t* const*>(ptrs.data()), num,
                                      i);
    return g0 * grad_scale;
  }
};

Slots RandomSlots(std::mt19937_64& rng, SlotType type, int num_slots, size_t n) {
  Slots s;
  s.type = type;
  for (int r = 0; r < num_slots; ++r) {
    std::vector<float> values = testing::RandomFloats(rng, n);
    if (type == SlotType::kFp32) {
      s.fp32.push_back(std::move(values));
      s.ptrs.push_back(s.fp32.back().data());
    } else {
      std::vector<uint16_t> codes(n);
      for (size_t i = 0; i < n; ++i) codes[i] = reference::Bf16FromFloat(values[i]);
      s.bf16.push_back(std::move(codes));
      s.ptrs.push_back(s.bf16.back().data());
    }
  }
  return s;
}

// Which served outputs a case asks for.
enum class Outputs { kBoth, kFp32Only, kBf16Only };

// One tensor's state plus its served outputs. The outputs sit at an element offset inside padded
// buffers, so their alignment (which decides the vector paths' streaming stores) varies by case.
struct State {
  std::vector<float> p, m, v;
  std::vector<float> fp32_buffer;
  std::vector<uint16_t> bf16_buffer;
  size_t fp32_shift = 0;
  size_t bf16_shift = 0;

  State(size_t n, size_t fp32_shift_in, size_t bf16_shift_in)
      : p(n),
        m(n),
        v(n),
        fp32_buffer(n + 16),
        bf16_buffer(n + 32),
        fp32_shift(fp32_shift_in % 16),
        bf16_shift(bf16_shift_in % 32) {}

  float* out_fp32() { return fp32_buffer.data() + fp32_shift; }
  const float* out_fp32() const { return fp32_buffer.data() + fp32_shift; }
  uint16_t* out_bf16() { return bf16_buffer.data() + bf16_shift; }
  const uint16_t* out_bf16() const { return bf16_buffer.data() + bf16_shift; }

  FusedStepArgs Args(const Slots& slots, float grad_scale, const AdamwScalars& scalars,
                     Outputs outputs = Outputs::kBoth) {
    FusedStepArgs a;
    a.slots = slots.ptrs.data();
    a.num_slots = static_cast<int>(slots.ptrs.size());
    a.slot_type = slots.type;
    a.grad_scale = grad_scale;
    a.scalars = scalars;
    a.master = p.data();
    a.exp_avg = m.data();
    a.exp_avg_sq = v.data();
    a.out_fp32 = outputs == Outputs::kBf16Only ? nullptr : out_fp32();
    a.out_bf16 = outputs == Outputs::kFp32Only ? nullptr : out_bf16();
    return a;
  }
};

reference::Hyper ToReference(const AdamwHyper& h) {
  return {h.lr, h.beta1, h.beta2, h.eps, h.weight_decay};
}

void ExpectSameBits(const State& got, const State& want, const std::string& context) {
  const size_t n = want.p.size();
  int64_t i = FirstBitMismatch(got.p.data(), want.p.data(), n);
  EXPECT_EQ(i, -1) << context << Describe(" master", got.p.data(), want.p.data(), i);
  i = FirstBitMismatch(got.m.data(), want.m.data(), n);
  EXPECT_EQ(i, -1) << context << Describe(" exp_avg", got.m.data(), want.m.data(), i);
  i = FirstBitMismatch(got.v.data(), want.v.data(), n);
  EXPECT_EQ(i, -1) << context << Describe(" exp_avg_sq", got.v.data(), want.v.data(), i);
  i = FirstBitMismatch(got.out_fp32(), want.out_fp32(), n);
  EXPECT_EQ(i, -1) << context << Describe(" out_fp32", got.out_fp32(), want.out_fp32(), i);
  i = FirstBitMismatch(got.out_bf16(), want.out_bf16(), n);
  EXPECT_EQ(i, -1) << context << Describe(" out_bf16", got.out_bf16(), want.out_bf16(), i);
}

// --- (a) the fp32 policy against the reference ---------------------------------------------------

using ReferenceCase = std::tuple<int64_t /*n*/, int /*num_slots*/, SlotType>;

class FusedStepCpuMatchesReference : public ::testing::TestWithParam<ReferenceCase> {};

TEST_P(FusedStepCpuMatchesReference, BitForBitOverManySteps) {
  const auto [n, num_slots, slot_type] = GetParam();
  const size_t un = static_cast<size_t>(n);
  constexpr int kSteps = 6;
  // 1 / (world_size * loss_scale), rounded once to FP32 as the host does.
  const float grad_scale = static_cast<float>(1.0 / (3.0 * 1024.0));
  const AdamwHyper hyper = testing::AccuracySetupHyper();
  std::mt19937_64 rng(static_cast<uint64_t>(n) * 131 + num_slots * 7 + static_cast<int>(slot_type));
  // The pool splits the tensor into odd-sized blocks, so block edges fall inside vectors and the
  // long blocks' streaming stores start unaligned.
  ThreadPool pool(3);
  constexpr int64_t kOddGrain = 5003;

  State kernel(un, un % 7, un % 13), ref(un, 0, 0);
  kernel.p = testing::NormalFloats(rng, un, 0.02);
  ref.p = kernel.p;
  std::vector<float> gs(un);
  for (int64_t k = 1; k <= kSteps; ++k) {
    const Slots slots = RandomSlots(rng, slot_type, num_slots, un);
    const FusedStepArgs args = kernel.Args(slots, grad_scale, MakeAdamwScalars(hyper, k));
    pool.ParallelFor(n, kOddGrain, [&](int64_t begin, int64_t end) {
      const KStatus st = FusedStepCpu(args, begin, end);
      ASSERT_TRUE(st.ok()) << st.message();
    });

    for (size_t i = 0; i < un; ++i) gs[i] = slots.ScaledGrad(i, grad_scale);
    reference::AdamwStepFp32(ToReference(hyper), k, gs.data(), ref.p.data(), ref.m.data(),
                             ref.v.data(), un);
    std::copy(ref.p.begin(), ref.p.end(), ref.out_fp32());
    for (size_t i = 0; i < un; ++i) ref.out_bf16()[i] = reference::Bf16FromFloat(ref.p[i]);
    ExpectSameBits(kernel, ref, "step k=" + std::to_string(k) + ":");
    if (HasFailure()) return;
  }
}

std::string ReferenceCaseName(const ::testing::TestParamInfo<ReferenceCase>& info) {
  const auto [n, num_slots, slot_type] = info.param;
  return "n" + std::to_string(n) + "_" + std::to_string(num_slots) +
         (slot_type == SlotType::kFp32 ? "Fp32Slots" : "Bf16Slots");
}

INSTANTIATE_TEST_SUITE_P(SizesSlotsAndTypes, FusedStepCpuMatchesReference,
                         ::testing::Combine(::testing::Values<int64_t>(1, 2, 3, 7, 8, 15, 16, 17,
                                                                       31, 33, 101, 1021, 4099,
                                                                       65537, 100003),
                                            ::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(SlotType::kFp32, SlotType::kBf16)),
                         ReferenceCaseName);

// --- (b) every dispatch path against the scalar path ---------------------------------------------

// Masters that stress the cast and the update: signed zeros, subnormals, BF16 ties, values at the
// edge of BF16's range, and ordinary weights.
float EdgeMaster(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> kind(0, 9);
  std::uniform_int_distribution<uint32_t> bits;
  const uint32_t sign = bits(rng) & 0x80000000u;
  switch (kind(rng)) {
    case 0:
      return std::bit_cast<float>(sign);  // +-0
    case 1:
      return std::bit_cast<float>(sign | (bits(rng) & 0x007FFFFFu));  // subnormal
    case 2:
      return std::bit_cast<float>(sign | (bits(rng) & 0x7F7F0000u) | 0x8000u);  // a BF16 tie
    case 3:
      return std::bit_cast<float>(sign | (0x7F7F0000u + (bits(rng) & 0xFFFFu)));  // near FLT_MAX
    default:
      return testing::NormalFloats(rng, 1, 0.02)[0];
  }
}

class CpuPathTest : public ::testing::TestWithParam<CpuPath> {
 protected:
  void SetUp() override {
    if (!CpuPathSupported(GetParam())) {
      GTEST_SKIP() << "this CPU cannot run the " << CpuPathName(GetParam()) << " path";
    }
  }
};

TEST_P(CpuPathTest, GivesTheSameBitsAsTheScalarPath) {
  const CpuPath path = GetParam();
  std::mt19937_64 rng(42);
  std::vector<int64_t> sizes;
  for (int64_t n = 1; n <= 48; ++n) sizes.push_back(n);
  sizes.insert(sizes.end(), {1000, 4096 + 7, 3 * 4096 + 5, 65536 + 13});
  const std::vector<std::pair<int, SlotType>> slot_mixes = {
      {1, SlotType::kFp32}, {3, SlotType::kFp32}, {2, SlotType::kBf16}, {4, SlotType::kBf16}};
  AdamwHyper hyper = testing::AccuracySetupHyper();

  std::uniform_int_distribution<size_t> shift(0, 31);
  for (const int64_t n : sizes) {
    for (const auto& [num_slots, slot_type] : slot_mixes) {
      const size_t un = static_cast<size_t>(n);
      const Outputs outputs = static_cast<Outputs>((n + num_slots) % 3);
      State scalar(un, shift(rng), shift(rng));
      for (size_t i = 0; i < un; ++i) {
        scalar.p[i] = EdgeMaster(rng);
        scalar.m[i] = testing::WideRangeValue(rng);
        scalar.v[i] = std::abs(testing::WideRangeValue(rng));
      }
      State vector = scalar;
      for (int64_t k : {1, 2, 1000}) {
        const Slots slots = RandomSlots(rng, slot_type, num_slots, un);
        const float grad_scale = k == 2 ? 1.0f : 0.37f;
        const AdamwScalars scalars = MakeAdamwScalars(hyper, k);
        ASSERT_TRUE(
            FusedStepCpu(scalar.Args(slots, grad_scale, scalars, outputs), 0, n, CpuPath::kScalar)
                .ok());
        // Three ranges, so the vector path also starts at unaligned elements.
        const int64_t split1 = std::min<int64_t>(n, 3);
        const int64_t split2 = std::max(split1, n / 2 + 1);
        const FusedStepArgs args = vector.Args(slots, grad_scale, scalars, outputs);
        ASSERT_TRUE(FusedStepCpu(args, 0, split1, path).ok());
        ASSERT_TRUE(FusedStepCpu(args, split1, split2, path).ok());
        ASSERT_TRUE(FusedStepCpu(args, split2, n, path).ok());
        ExpectSameBits(vector, scalar,
                       "n=" + std::to_string(n) + " slots=" + std::to_string(num_slots) +
                           " outputs=" + std::to_string(static_cast<int>(outputs)) +
                           " k=" + std::to_string(k) + ":");
        if (HasFailure()) return;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(VectorPaths, CpuPathTest,
                         ::testing::Values(CpuPath::kAvx2, CpuPath::kAvx512),
                         [](const ::testing::TestParamInfo<CpuPath>& info) {
                           return std::string(CpuPathName(info.param));
                         });

// --- dispatch and argument checks ----------------------------------------------------------------

TEST(FusedStepCpuTest, AutoPicksTheWidestSupportedPath) {
  const CpuPath best = BestCpuPath();
  EXPECT_TRUE(CpuPathSupported(best));
  if (CpuPathSupported(CpuPath::kAvx512)) {
    EXPECT_EQ(best, CpuPath::kAvx512);
  } else if (CpuPathSupported(CpuPath::kAvx2)) {
    EXPECT_EQ(best, CpuPath::kAvx2);
  } else {
    EXPECT_EQ(best, CpuPath::kScalar);
  }
}

TEST(FusedStepCpuTest, GivesEachChunksAmaxOfTheNewMaster) {
  // Five whole chunks and a partial one (the vector paths' scalar tail), stepped from chunk 1 on;
  // chunk 2 holds a NaN and chunk 3 an infinity, whose bits must win as the range amax's do.
  const int64_t n = 5 * kChunkElements + 37, begin = kChunkElements;
  const int64_t chunks = NumChunks(n) - 1;
  std::mt19937_64 rng(7);
  for (CpuPath path : {CpuPath::kScalar, CpuPath::kAvx2, CpuPath::kAvx512}) {
    if (!CpuPathSupported(path)) continue;
    SCOPED_TRACE(CpuPathName(path));
    State s(static_cast<size_t>(n), 3, 5);
    for (int64_t i = 0; i < n; ++i) {
      s.p[i] = EdgeMaster(rng);
      s.m[i] = testing::WideRangeValue(rng);
      s.v[i] = std::abs(testing::WideRangeValue(rng));
    }
    s.p[2 * kChunkElements + 17] = NAN;
    s.p[3 * kChunkElements + 100] = -INFINITY;
    const Slots slots = RandomSlots(rng, SlotType::kFp32, 1, static_cast<size_t>(n));
    const FusedStepArgs args =
        s.Args(slots, 1.0f, MakeAdamwScalars(testing::AccuracySetupHyper(), 2));
    std::vector<uint32_t> got(chunks + 1, 0xDEADBEEFu);
    float range_amax = 0.0f;
    ASSERT_TRUE(FusedStepCpu(args, begin, n, path, &range_amax, got.data()).ok());
    EXPECT_EQ(got[chunks], 0xDEADBEEFu) << "written past the range's chunks";
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t lo = begin + c * kChunkElements, hi = std::min(n, lo + kChunkElements);
      uint32_t want = 0;
      for (int64_t i = lo; i < hi; ++i) {
        want = std::max(want, std::bit_cast<uint32_t>(s.p[i]) & 0x7FFFFFFFu);
      }
      EXPECT_EQ(got[c], want) << "chunk " << c;
    }
    EXPECT_GT(got[1], 0x7F800000u) << "the NaN's chunk";
    EXPECT_EQ(got[2], 0x7F800000u) << "the infinity's chunk";
    EXPECT_TRUE(std::isnan(range_amax));
    // A range that does not start on a chunk cannot give chunk amaxes, and writes nothing.
    const std::vector<float> before = s.p;
    EXPECT_EQ(FusedStepCpu(args, begin + 1, n, path, nullptr, got.data()).code(),
              Code::kInvalidArgument);
    EXPECT_EQ(std::memcmp(before.data(), s.p.data(), n * sizeof(float)), 0);
  }
}

TEST(FusedStepCpuTest, RejectsBadArgumentsWithoutTouchingState) {
  State s(4, 0, 0);
  s.p = {1, 2, 3, 4};
  std::vector<float> grad(4, 1.0f);
  const void* slot = grad.data();
  FusedStepArgs good;
  good.slots = &slot;
  good.num_slots = 1;
  good.scalars = MakeAdamwScalars(testing::AccuracySetupHyper(), 1);
  good.master = s.p.data();
  good.exp_avg = s.m.data();
  good.exp_avg_sq = s.v.data();

  EXPECT_EQ(FusedStepCpu(good, 2, 1).code(), Code::kInvalidArgument);
  EXPECT_EQ(FusedStepCpu(good, -1, 2).code(), Code::kInvalidArgument);
  FusedStepArgs bad = good;
  bad.num_slots = 0;
  EXPECT_EQ(FusedStepCpu(bad, 0, 4).code(), Code::kInvalidArgument);
  bad = good;
  bad.exp_avg_sq = nullptr;
  EXPECT_EQ(FusedStepCpu(bad, 0, 4).code(), Code::kInvalidArgument);
  const void* null_slot = nullptr;
  bad = good;
  bad.slots = &null_slot;
  EXPECT_EQ(FusedStepCpu(bad, 0, 4).code(), Code::kInvalidArgument);
  EXPECT_EQ(s.p, (std::vector<float>{1, 2, 3, 4}));

  EXPECT_TRUE(FusedStepCpu(good, 0, 0).ok()) << "an empty range is a no-op";
  EXPECT_TRUE(FusedStepCpu(good, 0, 4).ok());
}

TEST(MakeAdamwScalarsTest, RoundsDoubleFormulasOnceToFp32) {
  AdamwHyper h;
  h.lr = 3e-4;
  h.beta1 = 0.9;
  h.beta2 = 0.95;
  h.eps = 1e-8;
  h.weight_decay = 0.1;
  const AdamwScalars s = MakeAdamwScalars(h, 7);
  EXPECT_EQ(s.beta1, 0.9f);
  EXPECT_EQ(s.beta2, 0.95f);
  EXPECT_EQ(s.c1, static_cast<float>(1.0 - 0.9));
  EXPECT_EQ(s.c2, static_cast<float>(1.0 - 0.95));
  EXPECT_EQ(s.eps, 1e-8f);
  EXPECT_EQ(s.decay, static_cast<float>(1.0 - 3e-4 * 0.1));
  EXPECT_EQ(s.step_size, static_cast<float>(3e-4 / (1.0 - std::pow(0.9, 7.0))));
  EXPECT_EQ(s.bc2, static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(0.95, 7.0))));
}

}  // namespace
}  // namespace paramd::kernels
