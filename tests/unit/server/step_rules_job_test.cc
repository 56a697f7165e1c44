// The job-wide step rules of DESIGN.md §2 through the step coordinator (JobRegistry, Job, a real
// CpuBackend), against the independent reference (tests/unit/server/policy_reference_job.h):
// a non-finite gradient (NaN, inf, a value whose square or rank sum overflows) in one rank's slot
// of one tensor skips the whole step: every version advances with `skipped` set and the previous
// bytes, the state and the applied-step count k stay, and the next step equals the reference that
// never saw the skipped one. Global-norm clipping scales the gradient by the clip factor of the
// FP64 block/chunk pairwise sums, which Status reports.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "server/backend/backend.h"
#include "tests/unit/server/policy_reference_job.h"
#include "tests/unit/server/reference_job.h"
#include "tests/unit/server/registry_job_harness.h"

namespace paramd {
namespace {

using testing::BitIdentical;
using testing::FromBytes;
using testing::MakeSpec;
using testing::PolicyReferenceJob;
using testing::RandomGradients;
using testing::RandomWeights;
using testing::RegistryJobHarness;
using testing::StepGradients;
using testing::ToBytes;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

constexpr v1::Recipe kRecipes[] = {
    v1::RECIPE_FP32,        v1::RECIPE_BF16,      v1::RECIPE_FP16, v1::RECIPE_FP8_TENSOR,
    v1::RECIPE_FP8_DELAYED, v1::RECIPE_FP8_BLOCK, v1::RECIPE_MXFP8};
constexpr v1::Direction kDirections[] = {v1::DIRECTION_ROWWISE, v1::DIRECTION_COLUMNWISE};

// fp32 master with fp8 moments at their default rounding (stochastic exp_avg_sq, whose random
// bits depend on k), or bf16+remainder with fp16 moments; every format served; fp8_delayed with
// a short history so a wrongly appended amax shows.
v1::RegisterRequest RulesSpec(bool fp8_moments, double max_grad_norm) {
  v1::RegisterRequest spec = MakeSpec("rules", 2,
                                      {{"scalar", 1, 1, v1::ELEMENT_TYPE_FP32},
                                       {"odd", 7, 13, v1::ELEMENT_TYPE_BF16},
                                       {"panels", 131, 257, v1::ELEMENT_TYPE_FP32},
                                       {"vector", 1, 1000, v1::ELEMENT_TYPE_BF16}});
  v1::StatePolicy* p = spec.mutable_state_policy();
  if (fp8_moments) {
    p->set_exp_avg(v1::MOMENT_TYPE_FP8);
    p->set_exp_avg_sq(v1::MOMENT_TYPE_FP8);
  } else {
    p->set_master(v1::MASTER_TYPE_BF16_REMAINDER);
    p->set_exp_avg(v1::MOMENT_TYPE_FP16);
    p->set_exp_avg_sq(v1::MOMENT_TYPE_FP16);
  }
  spec.clear_serve();
  for (v1::Recipe recipe : kRecipes) {
    for (v1::Direction direction : kDirections) {
      v1::ServeFormat* f = spec.add_serve();
      f->set_recipe(recipe);
      f->set_direction(direction);
      if (recipe == v1::RECIPE_FP8_DELAYED) f->set_amax_history(2);
    }
  }
  spec.set_max_grad_norm(max_grad_norm);
  return spec;
}

// Every format of every tensor's newest version equals the reference's, bit for bit.
void ExpectMatchesReference(const RegistryJobHarness& h, const PolicyReferenceJob& reference,
                            const v1::RegisterRequest& spec, int64_t version) {
  for (int i = 0; i < spec.tensors_size(); ++i) {
    SCOPED_TRACE(spec.tensors(i).name());
    std::shared_ptr<const ServedTensor> served = h.Newest(i);
    ASSERT_NE(served, nullptr);
    EXPECT_EQ(served->version, version);
    EXPECT_FALSE(served->skipped);
    for (v1::Recipe recipe : kRecipes) {
      for (v1::Direction direction : kDirections) {
        SCOPED_TRACE(v1::Recipe_Name(recipe) + "/" + v1::Direction_Name(direction));
        EXPECT_TRUE(
            BitIdentical(h.Served(i, recipe, direction), reference.Served(i, recipe, direction)));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Non-finite gradients skip the whole step.

struct BadGradient {
  std::string name;
  int tensor;         // index in RulesSpec
  int64_t element;    // where the bad value goes
  float value;        // what rank `rank` pushes there
  int rank;           // -1: every rank pushes it (a rank sum that overflows)
  double grad_scale;  // of the bad step
};
void PrintTo(const BadGradient& c, std::ostream* os) { *os << c.name; }

const std::vector<BadGradient>& BadGradients() {
  static const auto* cases = new std::vector<BadGradient>{
      {"NanInAnFp32Slot", 2, 5000, kNaN, 1, 0.5},
      {"InfInAnFp32Slot", 2, 131 * 257 - 1, kInf, 0, 0.5},
      {"NegativeInfInABf16Slot", 3, 999, -kInf, 1, 0.5},
      {"NanInABf16Slot", 1, 90, kNaN, 0, 0.5},
      // 2e19^2 = 4e38 > FLT_MAX: finite, but its square is not (moments would overflow).
      {"ValueWhoseSquareOverflowsInTheOneElementTensor", 0, 0, 4e19f, 1, 0.5},
      {"ValueWhoseSquareOverflowsInABf16Slot", 3, 0, -4e19f, 0, 0.5},
      // Each rank's value is finite and so is its square after grad_scale; their FP32 sum is inf.
      {"RankSumThatOverflows", 2, 128 * 257, 3e38f, -1, 1e-30},
      // g0 = 1.5e19 has a finite square; gs = g0 * 2 = 3e19 does not.
      {"GradScaleThatMakesTheSquareOverflow", 2, 7, 1.5e19f, 0, 2.0},
  };
  return *cases;
}

// The gradients of `step` with the bad value put in.
StepGradients WithBadValue(const v1::RegisterRequest& spec, StepGradients grads,
                           const BadGradient& bad) {
  const bool bf16 = spec.tensors(bad.tensor).grad_type() == v1::ELEMENT_TYPE_BF16;
  for (int r = 0; r < spec.world_size(); ++r) {
    if (bad.rank >= 0 && r != bad.rank) continue;
    std::string& bytes = grads[static_cast<size_t>(bad.tensor)][r];
    if (bf16) {
      std::vector<uint16_t> codes = FromBytes<uint16_t>(bytes);
      codes[static_cast<size_t>(bad.element)] = reference::Bf16FromFloat(bad.value);
      bytes = ToBytes(codes);
    } else {
      std::vector<float> values = FromBytes<float>(bytes);
      values[static_cast<size_t>(bad.element)] = bad.value;
      bytes = ToBytes(values);
    }
  }
  return grads;
}

class SkippedStepTest : public ::testing::TestWithParam<
                            std::tuple<BadGradient, bool /*fp8 moments*/, bool /*clipping*/>> {};

TEST_P(SkippedStepTest, SkipsTheWholeStepAndTheNextStepUsesTheNextAppliedCount) {
  const auto& [bad, fp8_moments, clipping] = GetParam();
  // With clipping the finiteness comes from the block sums of squares, without from its own pass.
  const v1::RegisterRequest spec = RulesSpec(fp8_moments, clipping ? 0.05 : 0.0);
  const std::vector<std::vector<float>> initial = RandomWeights(spec, 5);
  RegistryJobHarness h(spec);
  PolicyReferenceJob reference(spec, initial);
  ASSERT_TRUE(h.Start(initial).ok());
  auto grads = [&spec](int64_t step) {
    return RandomGradients(spec, 300 + static_cast<uint64_t>(step));
  };

  // Step 0 applies.
  ASSERT_TRUE(h.RunStep(0, grads(0), std::nullopt, 0.5).ok());
  ASSERT_TRUE(reference.Step(grads(0), std::nullopt, 0.5));
  ExpectMatchesReference(h, reference, spec, 1);
  std::vector<std::shared_ptr<const ServedTensor>> version1;
  for (int i = 0; i < spec.tensors_size(); ++i) version1.push_back(h.Newest(i));
  std::vector<std::vector<std::vector<uint8_t>>> version1_bytes;  // copies: [tensor][format]
  for (const auto& served : version1) {
    auto& formats = version1_bytes.emplace_back();
    for (const ServedFormat& f : served->formats) formats.push_back(f.bytes.ToVector());
  }

  // Steps 1 and 2 are skipped (the bad value in one rank's slot of one tensor, every other
  // gradient fine): every version advances, re-serving version 1's bytes.
  for (int64_t step = 1; step <= 2; ++step) {
    SCOPED_TRACE(::testing::Message() << "skipped step " << step);
    const StepGradients bad_grads = WithBadValue(spec, grads(step), bad);
    ASSERT_FALSE(reference.Step(bad_grads, std::nullopt, bad.grad_scale))
        << "the reference finds the gradient finite";
    absl::StatusOr<StepReport> report = h.RunStep(step, bad_grads, std::nullopt, bad.grad_scale);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_TRUE(report->skipped);
    for (int i = 0; i < spec.tensors_size(); ++i) {
      SCOPED_TRACE(spec.tensors(i).name());
      std::shared_ptr<const ServedTensor> served = h.Newest(i);
      ASSERT_NE(served, nullptr);
      EXPECT_EQ(served->version, step + 1);
      EXPECT_TRUE(served->skipped);
      ASSERT_EQ(served->formats.size(), version1_bytes[static_cast<size_t>(i)].size());
      for (size_t f = 0; f < served->formats.size(); ++f) {
        SCOPED_TRACE(FormatName(served->formats[f].key));
        EXPECT_TRUE(BitIdentical(served->formats[f].bytes.ToVector(), version1_bytes[i][f]));
      }
    }
    const v1::JobStatus status = h.job().Status();
    EXPECT_EQ(status.next_step(), step + 1);
    EXPECT_EQ(status.applied_steps(), 1);
    EXPECT_EQ(status.skipped_steps(), step);
    for (const v1::TensorStatus& t : status.tensors()) EXPECT_EQ(t.version(), step + 1);
  }
  // A reader that held version 1 through the skips still reads its bytes.
  for (size_t i = 0; i < version1.size(); ++i) {
    EXPECT_EQ(version1[i]->version, 1);
    for (size_t f = 0; f < version1[i]->formats.size(); ++f) {
      EXPECT_EQ(version1[i]->formats[f].bytes.ToVector(), version1_bytes[i][f]);
    }
  }

  // The next good steps use k = 2, 3: bias correction, stochastic rounding's counter, the
  // fp8_delayed history and fp8_tensor's previous scale as if the skipped steps never happened.
  for (int64_t step = 3; step <= 4; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    absl::StatusOr<StepReport> report = h.RunStep(step, grads(step), 2e-3, 0.5);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_FALSE(report->skipped);
    ASSERT_TRUE(reference.Step(grads(step), 2e-3, 0.5));
    ExpectMatchesReference(h, reference, spec, step + 1);
    const v1::JobStatus status = h.job().Status();
    EXPECT_EQ(status.applied_steps(), reference.applied_steps());
    EXPECT_EQ(status.skipped_steps(), 2);
  }
}

INSTANTIATE_TEST_SUITE_P(NonFiniteGradients, SkippedStepTest,
                         ::testing::Combine(::testing::ValuesIn(BadGradients()), ::testing::Bool(),
                                            ::testing::Bool()),
                         [](const ::testing::TestParamInfo<SkippedStepTest::ParamType>& info) {
                           return std::get<0>(info.param).name +
                                  (std::get<1>(info.param) ? "_Fp8Moments"
                                                           : "_Bf16RemainderFp16Moments") +
                                  (std::get<2>(info.param) ? "_Clipping" : "_NoClipping");
                         });

// ---------------------------------------------------------------------------------------------
// Global-norm clipping.

// The clip factor from the plain float64 norm of gs (one sum after another, no tree), for the
// 1-ulp comparison: the tree order changes the FP64 total by a few FP64 ulps at most, which the
// rounding to FP32 hides except at a tie.
float NaiveClip(const PolicyReferenceJob& reference, const v1::RegisterRequest& spec,
                const StepGradients& grads, double grad_scale) {
  long double total = 0;
  for (int i = 0; i < spec.tensors_size(); ++i) {
    for (float gs : reference.ScaledGradients(grads, i, grad_scale)) {
      total += static_cast<long double>(gs) * gs;
    }
  }
  const double clip = spec.max_grad_norm() / (std::sqrt(static_cast<double>(total)) + 1e-6);
  return static_cast<float>(std::min(clip, 1.0));
}

class ClippingTest : public ::testing::TestWithParam<bool /*fp8 moments*/> {};

TEST_P(ClippingTest, ASmallMaxGradNormScalesGradientsByTheReferenceClipFactor) {
  const v1::RegisterRequest spec = RulesSpec(GetParam(), 0.05);
  const std::vector<std::vector<float>> initial = RandomWeights(spec, 6);
  RegistryJobHarness h(spec);
  PolicyReferenceJob reference(spec, initial);
  ASSERT_TRUE(h.Start(initial).ok());
  for (int64_t step = 0; step < 4; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    const StepGradients grads = RandomGradients(spec, 400 + static_cast<uint64_t>(step));
    const double grad_scale = step == 2 ? 1.0 : 0.5;
    // The reference's clip: DESIGN.md §2's tree over (double)gs^2 per 128-element chunk, the tree
    // over the chunk sums of each 128-row block, block sums in order; then min(1, max / (norm +
    // 1e-6)) in double, rounded once to FP32.
    const float want = reference.Clip(grads, grad_scale);
    ASSERT_LT(want, 0.5f) << "the test means to clip";
    EXPECT_LE(std::fabs(want - NaiveClip(reference, spec, grads, grad_scale)),
              std::nextafter(want, 1.0f) - want);
    absl::StatusOr<StepReport> report = h.RunStep(step, grads, std::nullopt, grad_scale);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_FALSE(report->skipped);
    EXPECT_EQ(report->clip, want);  // bit for bit
    ASSERT_TRUE(reference.Step(grads, std::nullopt, grad_scale));
    ExpectMatchesReference(h, reference, spec, step + 1);
    const v1::JobStatus status = h.job().Status();
    EXPECT_EQ(status.last_clip(), static_cast<double>(want));
    EXPECT_EQ(status.max_grad_norm(), 0.05);
  }
}

TEST_P(ClippingTest, ALargeMaxGradNormClipsNothingAndEqualsTheUnclippedJob) {
  const v1::RegisterRequest spec = RulesSpec(GetParam(), 1e6);
  v1::RegisterRequest unclipped_spec = spec;
  unclipped_spec.set_max_grad_norm(0);
  const std::vector<std::vector<float>> initial = RandomWeights(spec, 7);
  RegistryJobHarness h(spec);
  PolicyReferenceJob unclipped(unclipped_spec, initial);
  ASSERT_TRUE(h.Start(initial).ok());
  for (int64_t step = 0; step < 3; ++step) {
    const StepGradients grads = RandomGradients(spec, 500 + static_cast<uint64_t>(step));
    absl::StatusOr<StepReport> report = h.RunStep(step, grads, std::nullopt, 0.5);
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_EQ(report->clip, 1.0f);
    ASSERT_TRUE(unclipped.Step(grads, std::nullopt, 0.5));
    ExpectMatchesReference(h, unclipped, spec, step + 1);
    EXPECT_EQ(h.job().Status().last_clip(), 1.0);
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, ClippingTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Fp8Moments" : "Bf16RemainderFp16Moments";
                         });

// A clipped step followed by a skipped one: the skip leaves last_clip at 1 (no factor applied)
// and the clip of the next good step is computed from that step's gradients alone.
TEST(ClippingAndSkippingTest, TheStepAfterASkipIsClippedFromItsOwnGradients) {
  const v1::RegisterRequest spec = RulesSpec(true, 0.05);
  const std::vector<std::vector<float>> initial = RandomWeights(spec, 8);
  RegistryJobHarness h(spec);
  PolicyReferenceJob reference(spec, initial);
  ASSERT_TRUE(h.Start(initial).ok());
  const StepGradients g0 = RandomGradients(spec, 600), g2 = RandomGradients(spec, 602);
  ASSERT_TRUE(h.RunStep(0, g0).ok());
  ASSERT_TRUE(reference.Step(g0, std::nullopt, 1.0));
  EXPECT_EQ(h.job().Status().last_clip(), static_cast<double>(reference.Clip(g0, 1.0)));
  const StepGradients bad = WithBadValue(spec, RandomGradients(spec, 601), BadGradients()[0]);
  absl::StatusOr<StepReport> skipped = h.RunStep(1, bad);
  ASSERT_TRUE(skipped.ok());
  EXPECT_TRUE(skipped->skipped);
  EXPECT_EQ(h.job().Status().last_clip(), 1.0);
  absl::StatusOr<StepReport> report = h.RunStep(2, g2);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->clip, reference.Clip(g2, 1.0));
  ASSERT_TRUE(reference.Step(g2, std::nullopt, 1.0));
  ExpectMatchesReference(h, reference, spec, 3);
}

}  // namespace
}  // namespace paramd
