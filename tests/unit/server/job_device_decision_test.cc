// A job on a backend that decides its steps on the device (Backend::Step as cuda:N runs it for a
// job on one daemon), here the cpu backend deciding that way: versions are published before the
// step's outcome is known (pending, then resolved), Status counts the step only once it has run,
// and the served bytes, skips and clips are the same as the job's own decision on the plain cpu
// backend.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "kernels/step_rules.h"
#include "server/backend/cpu_backend.h"
#include "tests/unit/server/policy_cases.h"
#include "tests/unit/server/reference_job.h"
#include "tests/unit/server/registry_job_harness.h"

namespace paramd::testing {
namespace {

// The cpu backend deciding as a device does: the check, the decision and the step in one call,
// every version published (pending) before the outcome is known; `inside` runs after that, before
// the return.
class DecidingCpuBackend : public CpuBackend {
 public:
  DecidingCpuBackend() : CpuBackend(2) {}
  absl::StatusOr<StepOutcome> Step(const StepInput& input) override {
    if (input.agreement) return StepDecidedOnHost(input);  // a sharded job's (none here)
    ++calls;
    const std::span<TensorStep> tensors = input.tensors;
    const StepScalars& scalars = input.scalars;
    const double max_grad_norm = input.max_grad_norm;
    const auto queued = [&] { input.publish(0, tensors.size(), nullptr); };
    absl::StatusOr<GradientCheck> check =
        CheckGradients(tensors, scalars.grad_scale, max_grad_norm > 0);
    if (!check.ok()) return check.status();
    StepOutcome outcome;
    outcome.skipped = !check->finite;
    if (outcome.skipped) {
      for (size_t i = 0; i < tensors.size(); ++i) {
        for (size_t f = 0; f < tensors[i].out->formats.size(); ++f) {
          const HostBuffer& from = tensors[i].previous->formats[f].bytes;
          std::memcpy(tensors[i].out->formats[f].bytes.data(), from.data(),
                      static_cast<size_t>(from.size()));
        }
      }
      queued();
    } else {
      StepScalars decided = scalars;
      if (max_grad_norm > 0) {
        std::vector<double> blocks;
        for (const std::vector<double>& t : check->block_sums) {
          blocks.insert(blocks.end(), t.begin(), t.end());
        }
        decided.clip = kernels::ClipFactor(
            kernels::SumInOrder(blocks.data(), static_cast<int64_t>(blocks.size())), max_grad_norm);
      }
      outcome.clip = decided.clip;
      if (absl::Status s = ApplyStep(tensors, decided); !s.ok()) return s;
      queued();
    }
    if (inside) inside();
    return outcome;
  }
  std::function<void()> inside;
  int calls = 0;
};

TEST(JobDeviceDecisionTest, VersionsArePublishedPendingAndTheStepsMatchTheJobsOwnDecisions) {
  PolicyCase c = Cases().back();
  v1::RegisterRequest spec = PolicySpec(c);
  spec.set_max_grad_norm(0.01);  // every applied step is clipped
  const std::vector<std::vector<float>> initial = PolicyWeights(spec);
  auto deciding = std::make_unique<DecidingCpuBackend>();
  DecidingCpuBackend* backend = deciding.get();
  RegistryJobHarness device(spec, std::move(deciding));
  RegistryJobHarness host(spec);
  ASSERT_TRUE(device.Start(initial).ok());
  ASSERT_TRUE(host.Start(initial).ok());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t step = 0; step < 4; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    StepGradients grads = RandomGradients(spec, 700 + static_cast<uint64_t>(step));
    const bool skip = step == 2;
    if (skip) std::memcpy(grads[1][0].data() + 8, &nan, sizeof(nan));
    // Inside the step, after every tensor's version is published: pending, and not counted yet.
    bool looked = false;
    backend->inside = [&] {
      looked = true;
      for (int i = 0; i < spec.tensors_size(); ++i) {
        std::shared_ptr<const ServedTensor> served = device.Newest(i);
        ASSERT_NE(served, nullptr);
        EXPECT_EQ(served->version, step + 1);
        EXPECT_TRUE(served->outcome_pending());
        EXPECT_FALSE(served->skipped);
      }
      const v1::JobStatus status = device.job().Status();
      EXPECT_EQ(status.applied_steps() + status.skipped_steps(), step);
    };
    absl::StatusOr<StepReport> decided = device.RunStep(step, grads, std::nullopt, 0.5);
    absl::StatusOr<StepReport> own = host.RunStep(step, grads, std::nullopt, 0.5);
    ASSERT_TRUE(decided.ok()) << decided.status();
    ASSERT_TRUE(own.ok()) << own.status();
    EXPECT_TRUE(looked);
    EXPECT_EQ(decided->skipped, skip);
    EXPECT_EQ(decided->skipped, own->skipped);
    EXPECT_EQ(decided->clip, own->clip);
    if (!skip) {
      EXPECT_LT(decided->clip, 1.0f);
    }
    const v1::JobStatus status = device.job().Status();
    EXPECT_EQ(status.applied_steps(), host.job().Status().applied_steps());
    EXPECT_EQ(status.skipped_steps(), skip || step > 2 ? 1 : 0);
    for (int i = 0; i < spec.tensors_size(); ++i) {
      std::shared_ptr<const ServedTensor> served = device.Newest(i);
      EXPECT_FALSE(served->outcome_pending());
      EXPECT_EQ(served->skipped, skip);
      for (v1::Recipe recipe : kRecipes) {
        for (v1::Direction direction : kDirections) {
          EXPECT_EQ(device.Served(i, recipe, direction), host.Served(i, recipe, direction))
              << "tensor " << i << " " << v1::Recipe_Name(recipe) << "/"
              << v1::Direction_Name(direction);
        }
      }
    }
  }
  EXPECT_EQ(backend->calls, 4);
}

}  // namespace
}  // namespace paramd::testing
