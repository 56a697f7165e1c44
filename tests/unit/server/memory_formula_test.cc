// DESIGN.md §10: the daemon's memory for a job is the memory formula within 5 %. A job of 64 Mi
// parameters (fp32 master, fp8 exp_avg, fp16 exp_avg_sq; mxfp8 rowwise served; bf16 gradients
// from 2 ranks) is registered on a real CpuBackend, its weights uploaded, one step run and the
// next step's gradients pushed, so that everything the formula counts is held: the state, the
// published and the retired served version, and two gradient slot sets (the step collected and
// the step run). The growth of this process's resident set (/proc/self/statm) over that sequence
// must equal the formula within 5 % plus a fixed 16 MiB for allocations the formula does not
// count (protobuf messages, chunk maps, thread-local arenas, the rounding of mappings to pages).
// The buffers the test pushes from are allocated before the first measurement; the upload
// buffers the job frees after version 0 are large enough to be returned to the system at once.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/fused_step.h"
#include "kernels/recipes.h"
#include "server/backend/backend.h"
#include "server/backend/cpu_backend.h"
#include "server/job/job.h"
#include "server/registration.h"
#include "server/registry.h"
#include "tests/unit/server/reference_job.h"
#include "tests/unit/server/resident_bytes.h"
#include "tests/unit/server/run_taken_step.h"

namespace paramd {
namespace {

using testing::ForRank;
using testing::MakeSpec;
using testing::ResidentBytes;
using testing::RunTakenStep;

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kChunkBytes = 4 * kMiB;
constexpr int64_t kFixedAllowance = 16 * kMiB;

v1::RegisterRequest LargeSpec() {
  // 4 tensors of 4096 x 4096 = 64 Mi parameters.
  v1::RegisterRequest spec = MakeSpec("large", 2,
                                      {{"w0", 4096, 4096, v1::ELEMENT_TYPE_BF16},
                                       {"w1", 4096, 4096, v1::ELEMENT_TYPE_BF16},
                                       {"w2", 4096, 4096, v1::ELEMENT_TYPE_BF16},
                                       {"w3", 4096, 4096, v1::ELEMENT_TYPE_BF16}});
  spec.mutable_state_policy()->set_master(v1::MASTER_TYPE_FP32);
  spec.mutable_state_policy()->set_exp_avg(v1::MOMENT_TYPE_FP8);
  spec.mutable_state_policy()->set_exp_avg_sq(v1::MOMENT_TYPE_FP16);
  spec.clear_serve();
  v1::ServeFormat* mxfp8 = spec.add_serve();
  mxfp8->set_recipe(v1::RECIPE_MXFP8);
  mxfp8->set_direction(v1::DIRECTION_ROWWISE);
  return spec;
}

// The memory formula from its parts: PolicyStateBytes per tensor; the served format (mxfp8
// rowwise, data and scales by ServeLayout: a job that names formats is not served FP32) twice, for
// the published and the retired version; the gradient slots of every rank twice, for the step
// collected and the step running.
struct Formula {
  int64_t state = 0;
  int64_t served = 0;
  int64_t slots = 0;
  int64_t total() const { return state + served + slots; }
};

Formula MemoryFormula(const v1::RegisterRequest& spec) {
  const v1::RegisterRequest normalized = NormalizedSpec(spec);
  Formula f;
  for (int i = 0; i < normalized.tensors_size(); ++i) {
    const v1::TensorSpec& t = normalized.tensors(i);
    f.state += PolicyStateBytes(TensorInfoOf(normalized, i)).total();
    const kernels::ServeBufferLayout layout = kernels::ServeLayout(
        kernels::Recipe::kMxfp8, kernels::Direction::kRowwise, t.rows(), t.cols());
    f.served += 2 * (layout.data_bytes + layout.scale_bytes);
    f.slots += 2 * int64_t{normalized.world_size()} * t.rows() * t.cols() * 2;  // bf16
  }
  return f;
}

// Deterministic values without a big table: a hash of the index.
float WeightAt(int64_t i) {
  uint64_t x = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull;
  x ^= x >> 29;
  return static_cast<float>(static_cast<int64_t>(x % 2001) - 1000) * 2e-5f;
}

TEST(MemoryFormulaTest, ResidentGrowthOfALargeJobMatchesTheMemoryFormula) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's shadow memory and redzones count in the resident set";
#endif
  if (ResidentBytes() <= 0) GTEST_SKIP() << "/proc/self/statm is not readable on this system";
  const v1::RegisterRequest spec = LargeSpec();
  const Formula formula = MemoryFormula(spec);
  // The parts as the formula states them per parameter: 4 + 1 + 2 B of state and 2 x 4 B of
  // per-chunk scales per 128; mxfp8 (1 B + 1 per 32) served, twice; 2 ranks x
  // 2 B of bf16 gradients, twice.
  const int64_t n = 64 * kMiB;
  EXPECT_EQ(formula.state, 7 * n + 2 * 4 * (n / 128));
  EXPECT_EQ(formula.served, 2 * (n + n / 32));
  EXPECT_EQ(formula.slots, 2 * 2 * 2 * n);
  EXPECT_EQ(JobRegistry::JobBytes(spec), formula.total());

  // Everything the test pushes from, allocated before the first measurement.
  v1::PushChunk chunk;
  chunk.mutable_data()->resize(static_cast<size_t>(kChunkBytes));
  std::string grad_bytes(static_cast<size_t>(kChunkBytes), '\0');
  for (size_t i = 0; i < grad_bytes.size() / 2; ++i) {
    const uint16_t code =
        reference::Bf16FromFloat(1e-3f * WeightAt(static_cast<int64_t>(i)) / 2e-2f);
    std::memcpy(&grad_bytes[2 * i], &code, 2);
  }

  CpuBackend backend(2);
  JobRegistry registry(&backend, RegistryLimits{});
  for (int r = 0; r < spec.world_size(); ++r) {
    ASSERT_TRUE(registry.Register(ForRank(spec, r)).ok());
  }
  std::shared_ptr<Job> job = registry.Find("large").value();
  auto push = [&](int rank, int64_t step, int tensor, v1::PushKind kind) {
    const v1::TensorSpec& t = spec.tensors(tensor);
    const int64_t bytes = t.rows() * t.cols() * (kind == v1::PUSH_KIND_INITIAL_WEIGHTS ? 4 : 2);
    chunk.set_job("large");
    chunk.set_rank(rank);
    chunk.set_step(step);
    chunk.set_tensor(t.name());
    chunk.set_kind(kind);
    for (int64_t offset = 0; offset < bytes; offset += kChunkBytes) {
      chunk.set_offset(offset);
      if (kind == v1::PUSH_KIND_INITIAL_WEIGHTS) {
        auto* w = reinterpret_cast<float*>(chunk.mutable_data()->data());
        for (int64_t i = 0; i < kChunkBytes / 4; ++i) w[i] = WeightAt(tensor * n + offset / 4 + i);
      } else {
        std::memcpy(chunk.mutable_data()->data(), grad_bytes.data(), grad_bytes.size());
      }
      absl::StatusOr<ChunkBuffer::Stored> stored = job->Push(chunk);
      ASSERT_TRUE(stored.ok()) << stored.status();
    }
  };

  const int64_t before = ResidentBytes();
  for (int i = 0; i < spec.tensors_size(); ++i) push(0, 0, i, v1::PUSH_KIND_INITIAL_WEIGHTS);
  for (int r = 0; r < 2; ++r) {
    for (int i = 0; i < spec.tensors_size(); ++i) push(r, 0, i, v1::PUSH_KIND_GRADIENT);
  }
  std::optional<StepWork> work;
  for (int r = 0; r < 2; ++r) {
    v1::CommitRequest commit;
    commit.set_job("large");
    commit.set_rank(r);
    commit.set_step(0);
    commit.set_grad_scale(0.5);
    absl::StatusOr<CommitOutcome> outcome = job->Commit(commit);
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    if (outcome->work) work = outcome->work;
  }
  ASSERT_TRUE(work.has_value());
  const StepReport report = RunTakenStep(*job, *work);
  EXPECT_FALSE(report.skipped);
  for (int r = 0; r < 2; ++r) {
    for (int i = 0; i < spec.tensors_size(); ++i) push(r, 1, i, v1::PUSH_KIND_GRADIENT);
  }
  const int64_t after = ResidentBytes();

  // What the job says it holds is the formula exactly.
  const v1::JobStatus status = job->Status();
  EXPECT_EQ(status.state_bytes(), formula.state);
  EXPECT_EQ(status.served_bytes(), formula.served);
  EXPECT_EQ(status.slot_bytes(), formula.slots);

  const int64_t growth = after - before;
  const double allowed = 0.05 * static_cast<double>(formula.total()) + kFixedAllowance;
  std::printf(
      "resident growth %.1f MiB; formula %.1f MiB (state %.1f, served %.1f, slots %.1f); "
      "%+.2f %%\n",
      static_cast<double>(growth) / kMiB, static_cast<double>(formula.total()) / kMiB,
      static_cast<double>(formula.state) / kMiB, static_cast<double>(formula.served) / kMiB,
      static_cast<double>(formula.slots) / kMiB,
      100.0 * (static_cast<double>(growth) / static_cast<double>(formula.total()) - 1.0));
  EXPECT_LE(std::fabs(static_cast<double>(growth - formula.total())), allowed)
      << "resident growth " << growth << " B, formula " << formula.total() << " B";
}

}  // namespace
}  // namespace paramd
