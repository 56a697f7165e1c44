#include "tests/conformance/backend_conformance.h"

#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "kernels/recipes.h"
#include "server/job/job.h"
#include "server/job/job_memory.h"
#include "server/registration.h"
#include "server/state/state_transfer.h"
#include "tests/unit/server/policy_cases.h"
#include "tests/unit/server/policy_reference_job.h"
#include "tests/unit/server/reference_job.h"
#include "tests/unit/server/registry_job_harness.h"

namespace paramd::testing {

void BackendConformanceTest::SetUp() {
  absl::StatusOr<std::unique_ptr<Backend>> probe = GetParam().make();
  if (!probe.ok()) GTEST_SKIP() << "backend " << GetParam().name << ": " << probe.status();
}

std::unique_ptr<Backend> BackendConformanceTest::MakeBackend() {
  absl::StatusOr<std::unique_ptr<Backend>> backend = GetParam().make();
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? *std::move(backend) : nullptr;
}

namespace {

// Every tensor's newest version is `version`, and every format the spec serves equals the
// reference's; with `fp32_served` false, FP32 rowwise is not served at all.
void ExpectServedAsReference(const RegistryJobHarness& h, const PolicyReferenceJob& reference,
                             const v1::RegisterRequest& spec, int64_t version,
                             bool fp32_served = true) {
  for (int i = 0; i < spec.tensors_size(); ++i) {
    SCOPED_TRACE(::testing::Message()
                 << "tensor " << spec.tensors(i).name() << ", version " << version);
    std::shared_ptr<const ServedTensor> served = h.Newest(i);
    ASSERT_NE(served, nullptr);
    EXPECT_EQ(served->version, version);
    const bool has_fp32 =
        served->Find(FormatKey{v1::RECIPE_FP32, v1::DIRECTION_ROWWISE}) != nullptr;
    EXPECT_EQ(has_fp32, fp32_served);
    for (v1::Recipe recipe : kRecipes) {
      for (v1::Direction direction : kDirections) {
        if (!fp32_served && recipe == v1::RECIPE_FP32 && direction == v1::DIRECTION_ROWWISE) {
          continue;
        }
        SCOPED_TRACE(v1::Recipe_Name(recipe) + "/" + v1::Direction_Name(direction));
        EXPECT_TRUE(
            BitIdentical(h.Served(i, recipe, direction), reference.Served(i, recipe, direction)));
      }
    }
  }
}

// The policies of every kind of state: fp32, the split master, the fp16 master, scaled fp8
// moments with stochastic rounding.
std::vector<PolicyCase> ConformancePolicies() {
  std::vector<PolicyCase> picked;
  for (const PolicyCase& c : Cases()) {
    if (c.name == "Fp32" || c.name == "Bf16RemainderMaster" ||
        c.name == "StochasticFp8ExpAvgOnAnFp16Master" || c.name == "Fp8BothWithDefaultRounding") {
      picked.push_back(c);
    }
  }
  return picked;
}

// The whole state of a job, as ExportState streams it.
std::vector<v1::StateChunk> Export(const std::shared_ptr<Job>& job) {
  absl::StatusOr<std::unique_ptr<StateExport>> exporting =
      StateExport::BeginAndWait(ExportOf(job, [](const StepWork&) {}), 4096);
  EXPECT_TRUE(exporting.ok()) << exporting.status();
  std::vector<v1::StateChunk> chunks;
  if (!exporting.ok()) return chunks;
  for (;;) {
    v1::StateChunk chunk;
    absl::StatusOr<bool> more = (*exporting)->Next(&chunk);
    EXPECT_TRUE(more.ok()) << more.status();
    if (!more.ok() || !*more) break;
    chunks.push_back(std::move(chunk));
  }
  return chunks;
}

// The policy job without FP32 rowwise in its serve list: it is served every other format only.
v1::RegisterRequest WithoutFp32(const v1::RegisterRequest& spec) {
  v1::RegisterRequest without = spec;
  without.clear_serve();
  for (const v1::ServeFormat& f : spec.serve()) {
    if (f.recipe() != v1::RECIPE_FP32 || f.direction() != v1::DIRECTION_ROWWISE) {
      *without.add_serve() = f;
    }
  }
  return without;
}

}  // namespace

// A job pays only for the formats it names: without FP32 in its list, every other format of every
// version, and of an imported state, is still the reference's bit for bit.
TEST_P(BackendConformanceTest, AJobThatDoesNotListFp32IsServedEveryOtherFormatAsTheReference) {
  for (const PolicyCase& c : ConformancePolicies()) {
    SCOPED_TRACE(c.name);
    const v1::RegisterRequest spec = WithoutFp32(PolicySpec(c));
    const std::vector<std::vector<float>> initial = PolicyWeights(spec);
    RegistryJobHarness h(spec, MakeBackend());
    PolicyReferenceJob reference(spec, initial);
    ASSERT_TRUE(h.Start(initial).ok());
    ExpectServedAsReference(h, reference, spec, 0, /*fp32_served=*/false);
    for (int64_t step = 0; step < 2; ++step) {
      const StepGradients grads = RandomGradients(spec, 940 + static_cast<uint64_t>(step));
      ASSERT_TRUE(h.RunStep(step, grads, StepLr(step), StepGradScale(step)).ok());
      ASSERT_TRUE(reference.Step(grads, StepLr(step), StepGradScale(step).value_or(1.0)));
      ExpectServedAsReference(h, reference, spec, step + 1, /*fp32_served=*/false);
    }
    // An import serves the version it was exported at from the master alone.
    RegistryJobHarness b(spec, MakeBackend());
    ASSERT_TRUE(b.Start(RandomWeights(spec, 4)).ok());
    StateImport import(b.job().spec(), 4096);
    for (const v1::StateChunk& chunk : Export(h.shared())) ASSERT_TRUE(import.Add(chunk).ok());
    absl::StatusOr<StagedState> staged = import.Finish();
    ASSERT_TRUE(staged.ok()) << staged.status();
    ASSERT_TRUE(b.job().Import(*std::move(staged)).ok());
    ExpectServedAsReference(b, reference, spec, 2, /*fp32_served=*/false);
  }
}

TEST_P(BackendConformanceTest, EveryPolicyServesEveryFormatOfEveryVersionAsTheReference) {
  for (const PolicyCase& c : ConformancePolicies()) {
    SCOPED_TRACE(c.name);
    const v1::RegisterRequest spec = PolicySpec(c);
    const std::vector<std::vector<float>> initial = PolicyWeights(spec);
    RegistryJobHarness h(spec, MakeBackend());
    PolicyReferenceJob reference(spec, initial);
    ASSERT_TRUE(h.Start(initial).ok());
    ExpectServedAsReference(h, reference, spec, 0);
    for (int64_t step = 0; step < 3; ++step) {
      const StepGradients grads = RandomGradients(spec, 900 + static_cast<uint64_t>(step));
      absl::StatusOr<StepReport> report = h.RunStep(step, grads, StepLr(step), StepGradScale(step));
      ASSERT_TRUE(report.ok()) << report.status();
      EXPECT_FALSE(report->skipped);
      ASSERT_TRUE(reference.Step(grads, StepLr(step), StepGradScale(step).value_or(1.0)));
      ExpectServedAsReference(h, reference, spec, step + 1);
    }
    EXPECT_EQ(h.job().Status().applied_steps(), 3);
  }
}

TEST_P(BackendConformanceTest, ANonFiniteGradientSkipsAndClippingScalesAsTheReference) {
  PolicyCase c = ConformancePolicies().back();
  v1::RegisterRequest spec = PolicySpec(c);
  spec.set_max_grad_norm(0.01);  // below the gradients' norm: every applied step is clipped
  const std::vector<std::vector<float>> initial = PolicyWeights(spec);
  RegistryJobHarness h(spec, MakeBackend());
  PolicyReferenceJob reference(spec, initial);
  ASSERT_TRUE(h.Start(initial).ok());
  StepGradients grads = RandomGradients(spec, 950);
  absl::StatusOr<StepReport> clipped = h.RunStep(0, grads, std::nullopt, 0.5);
  ASSERT_TRUE(clipped.ok()) << clipped.status();
  EXPECT_LT(clipped->clip, 1.0f);
  ASSERT_TRUE(reference.Step(grads, std::nullopt, 0.5));
  ExpectServedAsReference(h, reference, spec, 1);
  // A NaN in one rank's FP32 slot of one tensor: the whole step skips, version 2 re-serves 1.
  const std::vector<uint8_t> before = h.Served(2, v1::RECIPE_MXFP8, v1::DIRECTION_COLUMNWISE);
  grads = RandomGradients(spec, 951);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(grads[2][1].data() + 4 * 17, &nan, sizeof(nan));
  absl::StatusOr<StepReport> skipped = h.RunStep(1, grads, std::nullopt, 0.5);
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  EXPECT_TRUE(skipped->skipped);
  EXPECT_FALSE(reference.Step(grads, std::nullopt, 0.5));
  EXPECT_EQ(h.Newest(2)->version, 2);
  EXPECT_TRUE(h.Newest(2)->skipped);
  EXPECT_TRUE(BitIdentical(h.Served(2, v1::RECIPE_MXFP8, v1::DIRECTION_COLUMNWISE), before));
  // Every format of every tensor re-serves version 1 (on a backend that decides on the device, the
  // ones its kernels write in place too), with the same per-tensor scales.
  ExpectServedAsReference(h, reference, spec, 2);
  // The next applied step counts k = 2.
  grads = RandomGradients(spec, 952);
  ASSERT_TRUE(h.RunStep(2, grads, std::nullopt, 0.5).ok());
  ASSERT_TRUE(reference.Step(grads, std::nullopt, 0.5));
  ExpectServedAsReference(h, reference, spec, 3);
}

TEST_P(BackendConformanceTest, AnExportImportedIntoAnotherJobContinuesBitForBit) {
  const PolicyCase c = ConformancePolicies()[2];
  const v1::RegisterRequest spec = PolicySpec(c);
  const std::vector<std::vector<float>> initial = PolicyWeights(spec);
  RegistryJobHarness a(spec, MakeBackend());
  RegistryJobHarness b(spec, MakeBackend());
  ASSERT_TRUE(a.Start(initial).ok());
  for (int64_t step = 0; step < 2; ++step) {
    ASSERT_TRUE(a.RunStep(step, RandomGradients(spec, 960 + static_cast<uint64_t>(step))).ok());
  }
  // b is registered with the same description but other initial weights: the import replaces
  // them.
  ASSERT_TRUE(b.Start(RandomWeights(spec, 3)).ok());
  StateImport import(b.job().spec(), 4096);
  for (const v1::StateChunk& chunk : Export(a.shared())) ASSERT_TRUE(import.Add(chunk).ok());
  absl::StatusOr<StagedState> staged = import.Finish();
  ASSERT_TRUE(staged.ok()) << staged.status();
  absl::StatusOr<v1::ImportStateResponse> imported = b.job().Import(*std::move(staged));
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(imported->next_step(), 2);
  for (int64_t step = 2; step < 4; ++step) {
    const StepGradients grads = RandomGradients(spec, 960 + static_cast<uint64_t>(step));
    ASSERT_TRUE(a.RunStep(step, grads).ok());
    ASSERT_TRUE(b.RunStep(step, grads).ok());
    for (int i = 0; i < spec.tensors_size(); ++i) {
      for (v1::Recipe recipe : kRecipes) {
        for (v1::Direction direction : kDirections) {
          EXPECT_TRUE(BitIdentical(a.Served(i, recipe, direction), b.Served(i, recipe, direction)))
              << spec.tensors(i).name() << " " << v1::Recipe_Name(recipe) << " step " << step;
        }
      }
    }
  }
}

// Served bytes stay where the step wrote them: a backend with GPU memory copies a version down to
// the host only for a host reader (an inline pull), once per version; steps alone copy nothing.
TEST_P(BackendConformanceTest, HostBytesAreCopiedDownOnlyForAHostReaderOncePerVersion) {
  const v1::RegisterRequest spec = PolicySpec(ConformancePolicies()[0]);
  const std::vector<std::vector<float>> initial = PolicyWeights(spec);
  RegistryJobHarness h(spec, MakeBackend());
  PolicyReferenceJob reference(spec, initial);
  ASSERT_TRUE(h.Start(initial).ok());
  for (int64_t step = 0; step < 3; ++step) {
    const StepGradients grads = RandomGradients(spec, 970 + static_cast<uint64_t>(step));
    ASSERT_TRUE(h.RunStep(step, grads).ok());
    ASSERT_TRUE(reference.Step(grads, std::nullopt, 1.0));
  }
  // A backend without host staging (cpu) copies nothing down: its bytes are the host's.
  const HostStagingAbility* staging = h.backend().host_staging();
  const auto host_copies = [staging] { return staging != nullptr ? staging->host_copies() : 0; };
  EXPECT_EQ(host_copies(), 0) << "steps copied served bytes to the host";
  const bool on_device = h.backend().exported_memory() != nullptr;
  const int64_t copies = on_device ? 1 : 0;
  EXPECT_TRUE(BitIdentical(h.Served(1, v1::RECIPE_BF16, v1::DIRECTION_ROWWISE),
                           reference.Served(1, v1::RECIPE_BF16, v1::DIRECTION_ROWWISE)));
  EXPECT_EQ(host_copies(), copies);
  EXPECT_TRUE(BitIdentical(h.Served(1, v1::RECIPE_MXFP8, v1::DIRECTION_COLUMNWISE),
                           reference.Served(1, v1::RECIPE_MXFP8, v1::DIRECTION_COLUMNWISE)));
  EXPECT_EQ(host_copies(), copies) << "a version was copied down twice";
  EXPECT_TRUE(BitIdentical(h.Served(3, v1::RECIPE_FP8_TENSOR, v1::DIRECTION_ROWWISE),
                           reference.Served(3, v1::RECIPE_FP8_TENSOR, v1::DIRECTION_ROWWISE)));
  EXPECT_EQ(host_copies(), 2 * copies);
}

// A job's steps cycle through a few buffer sets (its served versions): a backend that keeps its
// steps' plans makes a handful for many steps, and every step is still the reference's, bit for
// bit (a kept plan must never serve a step whose buffers differ from the ones it was made for).
TEST_P(BackendConformanceTest, ManyStepsReuseAFewPlansAndStayExact) {
  const v1::RegisterRequest spec = PolicySpec(ConformancePolicies()[0]);
  const std::vector<std::vector<float>> initial = PolicyWeights(spec);
  RegistryJobHarness h(spec, MakeBackend());
  PolicyReferenceJob reference(spec, initial);
  ASSERT_TRUE(h.Start(initial).ok());
  constexpr int64_t kSteps = 12;
  for (int64_t step = 0; step < kSteps; ++step) {
    const StepGradients grads = RandomGradients(spec, 1200 + static_cast<uint64_t>(step));
    ASSERT_TRUE(h.RunStep(step, grads).ok());
    ASSERT_TRUE(reference.Step(grads, std::nullopt, 1.0));
    for (int i = 0; i < spec.tensors_size(); ++i) {
      EXPECT_TRUE(BitIdentical(h.Served(i, v1::RECIPE_BF16, v1::DIRECTION_ROWWISE),
                               reference.Served(i, v1::RECIPE_BF16, v1::DIRECTION_ROWWISE)))
          << spec.tensors(i).name() << " step " << step;
    }
  }
  // kServedVersions served buffer sets, and one more plan at most for the first step's state (a
  // backend without device memory, cpu, makes no plan).
  if (const DeviceMemoryAbility* device = h.backend().device_memory(); device != nullptr) {
    EXPECT_LE(device->plans_made(), kServedVersions + 1);
  }
}

TEST_P(BackendConformanceTest, AStateReadPastItsArrayIsAStatusAndAReadInsideIsTheWeights) {
  // The backend alone: a state made from initial weights, as a job's first push makes it.
  const v1::RegisterRequest spec = NormalizedSpec(PolicySpec(ConformancePolicies()[0]));
  const TensorInfo info = TensorInfoOf(spec, 2);
  const std::vector<float> weights = RandomWeights(spec, 8)[2];
  std::unique_ptr<Backend> backend = MakeBackend();
  ServedTensor out;
  ServedFormat& fp32 = out.formats.emplace_back();
  fp32.layout = kernels::ServeLayout(kernels::Recipe::kFp32, kernels::Direction::kRowwise,
                                     info.rows, info.cols);
  fp32.bytes = HeapBuffer(fp32.layout.data_bytes);
  absl::StatusOr<std::unique_ptr<TensorState>> state =
      backend->CreateState(info, weights, &out, nullptr);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(std::memcmp(fp32.bytes.data(), weights.data(), weights.size() * 4), 0);
  std::vector<uint8_t> read(weights.size() * 4);
  ASSERT_TRUE(backend->ReadStateArray(**state, StateArray::kMaster, 0, read).ok());
  EXPECT_EQ(std::memcmp(read.data(), weights.data(), read.size()), 0);
  std::vector<uint8_t> small(16);
  EXPECT_FALSE(backend->ReadStateArray(**state, StateArray::kMaster, read.size() - 8, small).ok());
  EXPECT_FALSE(backend->ReadStateArray(**state, StateArray::kMaster, -4, small).ok());
  EXPECT_EQ((*state)->state_bytes().total(), PolicyStateBytes(info).total());
}

}  // namespace paramd::testing
