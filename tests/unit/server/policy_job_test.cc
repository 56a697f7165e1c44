// Precision-aware numerics through the step coordinator: for every state policy (master fp32,
// bf16+remainder or fp16; moments fp32, bf16, fp16 or fp8 with nearest or stochastic rounding) a
// job registered through JobRegistry on a real CpuBackend serves, at every version from 0 on,
// every recipe x direction bit for bit equal to the independent scalar model (paramd_reference,
// which does not link kernels/): the master from reference/policy_reference.h and every format
// from reference/quantize_reference.h applied to it, fp8_tensor and fp8_delayed with their scales
// carried over the steps. The moments are checked through the masters they produce on later steps.
// Status reports the state bytes of DESIGN.md §10's memory formula.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/recipes.h"
#include "server/backend/backend.h"
#include "server/registration.h"
#include "server/registry.h"
#include "tests/unit/server/policy_cases.h"
#include "tests/unit/server/policy_reference_job.h"
#include "tests/unit/server/reference_job.h"
#include "tests/unit/server/registry_job_harness.h"

namespace paramd {
namespace {

using testing::BitIdentical;
using testing::Cases;
using testing::kDirections;
using testing::kRecipes;
using testing::MakeSpec;
using testing::Policy;
using testing::PolicyCase;
using testing::PolicyReferenceJob;
using testing::PolicySpec;
using testing::PolicyWeights;
using testing::RandomGradients;
using testing::RandomWeights;
using testing::RegistryJobHarness;
using testing::StepGradients;
using testing::StepGradScale;
using testing::StepLr;

std::string FormatText(v1::Recipe recipe, v1::Direction direction) {
  return v1::Recipe_Name(recipe) + "/" + v1::Direction_Name(direction);
}

class PolicyJobTest : public ::testing::TestWithParam<PolicyCase> {
 protected:
  PolicyJobTest()
      : spec_(PolicySpec(GetParam())),
        initial_(PolicyWeights(spec_)),
        h_(spec_),
        reference_(spec_, initial_) {}

  // Every tensor's newest version: its number, not skipped, every format as the reference serves;
  // with `fp32_served` false, all but FP32 rowwise, which is not served.
  static void ExpectEveryFormatMatches(const RegistryJobHarness& h,
                                       const PolicyReferenceJob& reference,
                                       const v1::RegisterRequest& spec, int64_t version,
                                       bool fp32_served = true) {
    for (int i = 0; i < spec.tensors_size(); ++i) {
      SCOPED_TRACE(::testing::Message()
                   << "tensor " << spec.tensors(i).name() << ", version " << version);
      std::shared_ptr<const ServedTensor> served = h.Newest(i);
      ASSERT_NE(served, nullptr);
      EXPECT_EQ(served->version, version);
      EXPECT_FALSE(served->skipped);
      // Every recipe x direction, each once.
      EXPECT_EQ(served->formats.size(), fp32_served ? 14u : 13u);
      EXPECT_EQ(served->Find(FormatKey{v1::RECIPE_FP32, v1::DIRECTION_ROWWISE}) != nullptr,
                fp32_served);
      for (v1::Recipe recipe : kRecipes) {
        for (v1::Direction direction : kDirections) {
          if (!fp32_served && recipe == v1::RECIPE_FP32 && direction == v1::DIRECTION_ROWWISE) {
            continue;
          }
          SCOPED_TRACE(FormatText(recipe, direction));
          EXPECT_TRUE(
              BitIdentical(h.Served(i, recipe, direction), reference.Served(i, recipe, direction)));
        }
      }
      if (reference.policy().master == reference::MasterRef::kBf16Remainder) {
        // The stored half is the BF16 nearest the master with ties away from zero (the second,
        // value-based model of that rule).
        const std::vector<float> master = reference.MasterValues(i);
        std::vector<uint16_t> want;
        for (float x : master) want.push_back(reference::Bf16ServedRef(x));
        EXPECT_TRUE(BitIdentical(reference.state(i).master_u16, want));
      }
    }
  }
  void ExpectEveryFormatMatches(int64_t version) {
    ExpectEveryFormatMatches(h_, reference_, spec_, version);
  }

  const v1::RegisterRequest spec_;
  const std::vector<std::vector<float>> initial_;
  RegistryJobHarness h_;
  PolicyReferenceJob reference_;
};

TEST_P(PolicyJobTest, EveryServedFormatOfEveryVersionEqualsTheReferenceBitForBit) {
  constexpr int64_t kSteps = 5;
  ASSERT_TRUE(h_.Start(initial_).ok());
  ExpectEveryFormatMatches(0);
  for (int64_t step = 0; step < kSteps; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    const StepGradients grads = RandomGradients(spec_, 700 + static_cast<uint64_t>(step));
    absl::StatusOr<StepReport> report = h_.RunStep(step, grads, StepLr(step), StepGradScale(step));
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_FALSE(report->skipped);
    EXPECT_EQ(report->clip, 1.0f);
    ASSERT_TRUE(reference_.Step(grads, StepLr(step), StepGradScale(step).value_or(1.0)));
    ExpectEveryFormatMatches(step + 1);
  }
  const v1::JobStatus status = h_.job().Status();
  EXPECT_EQ(status.applied_steps(), kSteps);
  EXPECT_EQ(status.skipped_steps(), 0);
  EXPECT_EQ(status.last_clip(), 1.0);
}

// DESIGN.md §10: master 4 B (fp32, bf16+remainder) or 2 B (fp16); a moment 4, 2, 2 or 1 B (fp32,
// bf16, fp16, fp8) plus 4 B per 128-element chunk of the tensor for a scaled (fp16, fp8) moment.
v1::StateBytes FormulaStateBytes(const v1::StatePolicy& p, int64_t n) {
  auto moment = [n](v1::MomentType t) -> int64_t {
    switch (t) {
      case v1::MOMENT_TYPE_BF16:
      case v1::MOMENT_TYPE_FP16:
        return 2 * n;
      case v1::MOMENT_TYPE_FP8:
        return n;
      default:
        return 4 * n;
    }
  };
  auto scales = [n](v1::MomentType t) -> int64_t {
    const bool scaled = t == v1::MOMENT_TYPE_FP16 || t == v1::MOMENT_TYPE_FP8;
    return scaled ? 4 * ((n + 127) / 128) : 0;
  };
  v1::StateBytes bytes;
  bytes.set_master(p.master() == v1::MASTER_TYPE_FP16 ? 2 * n : 4 * n);
  bytes.set_exp_avg(moment(p.exp_avg()));
  bytes.set_exp_avg_sq(moment(p.exp_avg_sq()));
  bytes.set_moment_scales(scales(p.exp_avg()) + scales(p.exp_avg_sq()));
  return bytes;
}

int64_t Total(const v1::StateBytes& b) {
  return b.master() + b.exp_avg() + b.exp_avg_sq() + b.moment_scales();
}

// Bytes of one served version of a tensor: data and scales of every format, by element sizes.
int64_t FormulaServedBytes(int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  auto ceil = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  const int64_t fp32 = 2 * 4 * n, bf16 = 2 * 2 * n, fp16 = 2 * 2 * n;
  const int64_t fp8_tensor = 2 * (n + 4), fp8_delayed = 2 * (n + 4);
  const int64_t fp8_block = 2 * (n + 4 * ceil(rows, 128) * ceil(cols, 128));
  const int64_t mxfp8 = (n + rows * ceil(cols, 32)) + (n + ceil(rows, 32) * cols);
  return fp32 + bf16 + fp16 + fp8_tensor + fp8_delayed + fp8_block + mxfp8;
}

TEST_P(PolicyJobTest, StatusReportsStateBytesByKindAsTheMemoryFormula) {
  ASSERT_TRUE(h_.Start(initial_).ok());
  v1::StateBytes want;
  int64_t served = 0, slots = 0;
  for (const v1::TensorSpec& t : spec_.tensors()) {
    const v1::StateBytes b = FormulaStateBytes(spec_.state_policy(), t.rows() * t.cols());
    want.set_master(want.master() + b.master());
    want.set_exp_avg(want.exp_avg() + b.exp_avg());
    want.set_exp_avg_sq(want.exp_avg_sq() + b.exp_avg_sq());
    want.set_moment_scales(want.moment_scales() + b.moment_scales());
    served += FormulaServedBytes(t.rows(), t.cols());
    slots += spec_.world_size() * t.rows() * t.cols() * testing::GradElementBytes(t.grad_type());
  }
  auto expect_state = [&](const v1::JobStatus& s) {
    EXPECT_EQ(s.state_bytes_by_kind().master(), want.master());
    EXPECT_EQ(s.state_bytes_by_kind().exp_avg(), want.exp_avg());
    EXPECT_EQ(s.state_bytes_by_kind().exp_avg_sq(), want.exp_avg_sq());
    EXPECT_EQ(s.state_bytes_by_kind().moment_scales(), want.moment_scales());
    EXPECT_EQ(s.state_bytes(), Total(want));
    for (int i = 0; i < spec_.tensors_size(); ++i) {
      const v1::TensorSpec& t = spec_.tensors(i);
      EXPECT_EQ(s.tensors(i).state_bytes(),
                Total(FormulaStateBytes(spec_.state_policy(), t.rows() * t.cols())))
          << t.name();
    }
  };

  v1::JobStatus s = h_.job().Status();
  expect_state(s);
  EXPECT_EQ(s.served_bytes(), served);  // version 0 only
  EXPECT_EQ(s.slot_bytes(), 0);
  // The registry's bound: state, two served versions, two slot sets (collecting and running).
  EXPECT_EQ(JobRegistry::JobBytes(spec_), Total(want) + 2 * served + 2 * slots);

  for (int64_t step = 0; step < 2; ++step) {
    ASSERT_TRUE(h_.RunStep(step, RandomGradients(spec_, 800 + static_cast<uint64_t>(step))).ok());
  }
  // Step 2's gradients arrive while nothing runs: both slot sets are held.
  const StepGradients next = RandomGradients(spec_, 802);
  for (int r = 0; r < spec_.world_size(); ++r) {
    for (int i = 0; i < spec_.tensors_size(); ++i) {
      ASSERT_TRUE(h_.PushTensor(r, 2, i, next[static_cast<size_t>(i)][r]).ok());
    }
  }
  s = h_.job().Status();
  expect_state(s);
  EXPECT_EQ(s.served_bytes(), 2 * served);  // the published and the retired version
  EXPECT_EQ(s.slot_bytes(), 2 * slots);
  EXPECT_EQ(JobRegistry::JobBytes(spec_), s.state_bytes() + s.served_bytes() + s.slot_bytes());
}

// A job pays only for the formats it names: without FP32 rowwise in the list, FP32 is not served,
// every other format is still the reference's bit for bit (the block, per-tensor and columnwise
// ones are cut from the master's FP32 values, which a 16-bit master keeps in a working copy on
// the cpu backend), and the served bytes and the registry's bound shrink by FP32's share.
TEST_P(PolicyJobTest, WithoutFp32InTheListEveryOtherFormatStillEqualsTheReference) {
  v1::RegisterRequest spec = spec_;
  spec.clear_serve();
  for (const v1::ServeFormat& f : spec_.serve()) {
    if (f.recipe() == v1::RECIPE_FP32 && f.direction() == v1::DIRECTION_ROWWISE) continue;
    *spec.add_serve() = f;
  }
  RegistryJobHarness h(spec);
  PolicyReferenceJob reference(spec, initial_);
  ASSERT_TRUE(h.Start(initial_).ok());
  ASSERT_TRUE(h_.Start(initial_).ok());  // the same job serving FP32 too, at version 0 alike
  const int64_t served_without = h.job().Status().served_bytes();
  const int64_t served_with = h_.job().Status().served_bytes();
  auto expect_formats = [&](int64_t version) {
    ExpectEveryFormatMatches(h, reference, spec, version, /*fp32_served=*/false);
  };
  expect_formats(0);
  for (int64_t step = 0; step < 3; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    const StepGradients grads = RandomGradients(spec, 700 + static_cast<uint64_t>(step));
    ASSERT_TRUE(h.RunStep(step, grads, StepLr(step), StepGradScale(step)).ok());
    ASSERT_TRUE(reference.Step(grads, StepLr(step), StepGradScale(step).value_or(1.0)));
    expect_formats(step + 1);
  }

  int64_t fp32_bytes = 0, working_bytes = 0;
  for (const v1::TensorSpec& t : spec.tensors()) {
    fp32_bytes += 4 * t.rows() * t.cols();
    if (NormalizedSpec(spec).state_policy().master() != v1::MASTER_TYPE_FP32) {
      working_bytes += 4 * t.rows() * t.cols();  // the cpu backend's working FP32 copy
    }
  }
  EXPECT_EQ(served_without, served_with - fp32_bytes);
  EXPECT_EQ(JobRegistry::JobBytes(spec),
            JobRegistry::JobBytes(spec_) - 2 * fp32_bytes + working_bytes);
}

INSTANTIATE_TEST_SUITE_P(StatePolicies, PolicyJobTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<PolicyCase>& info) {
                           return info.param.name;
                         });

// PolicyStateBytes, the one function every backend allocates by, is DESIGN.md §10's formula.
TEST(PolicyStateBytesTest, EqualsTheMemoryFormulaForEveryPolicyAndShape) {
  const int64_t shapes[][2] = {{1, 1}, {7, 13}, {131, 257}, {1, 1000}, {1, 128}, {3, 129}};
  for (const PolicyCase& c : Cases()) {
    const v1::RegisterRequest spec = PolicySpec(c);
    for (const auto& shape : shapes) {
      v1::RegisterRequest one = spec;
      one.mutable_tensors(0)->set_rows(shape[0]);
      one.mutable_tensors(0)->set_cols(shape[1]);
      const StateBytes got = PolicyStateBytes(TensorInfoOf(NormalizedSpec(one), 0));
      const v1::StateBytes want = FormulaStateBytes(c.policy, shape[0] * shape[1]);
      SCOPED_TRACE(::testing::Message() << c.name << " " << shape[0] << "x" << shape[1]);
      EXPECT_EQ(got.master, want.master());
      EXPECT_EQ(got.exp_avg, want.exp_avg());
      EXPECT_EQ(got.exp_avg_sq, want.exp_avg_sq());
      EXPECT_EQ(got.moment_scales, want.moment_scales());
    }
  }
}

// The seed keys stochastic rounding: two jobs that differ only in it part ways under a
// stochastic policy, and stay bit-identical under an all-nearest one.
TEST(PolicyJobSeedTest, OnlyStochasticRoundingDependsOnTheJobSeed) {
  for (bool stochastic : {true, false}) {
    SCOPED_TRACE(stochastic ? "stochastic" : "nearest");
    PolicyCase c{"", Policy(v1::MASTER_TYPE_FP32, v1::MOMENT_TYPE_FP8, v1::MOMENT_TYPE_FP8,
                            v1::ROUNDING_NEAREST,
                            stochastic ? v1::ROUNDING_STOCHASTIC : v1::ROUNDING_NEAREST)};
    v1::RegisterRequest a = PolicySpec(c), b = PolicySpec(c);
    b.set_seed(a.seed() + 1);
    const std::vector<std::vector<float>> initial = PolicyWeights(a);
    RegistryJobHarness ha(a), hb(b);
    ASSERT_TRUE(ha.Start(initial).ok());
    ASSERT_TRUE(hb.Start(initial).ok());
    for (int64_t step = 0; step < 3; ++step) {
      const StepGradients grads = RandomGradients(a, 900 + static_cast<uint64_t>(step));
      ASSERT_TRUE(ha.RunStep(step, grads).ok());
      ASSERT_TRUE(hb.RunStep(step, grads).ok());
    }
    const int panels = 2;
    const bool same = ha.Served(panels, v1::RECIPE_FP32, v1::DIRECTION_ROWWISE) ==
                      hb.Served(panels, v1::RECIPE_FP32, v1::DIRECTION_ROWWISE);
    EXPECT_EQ(same, !stochastic);
  }
}

}  // namespace
}  // namespace paramd
