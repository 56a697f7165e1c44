// The early step (RegisterRequest.early_step, docs/host_tier.md): each tensor stepped as its
// gradients land, into a second state, and adopted by the step where it answers it. A job with
// early_step serves the same bytes, exports the same state and counts the same steps as the same
// job without it, bit for bit, over several steps, state policies and serve formats, and through
// the cases that discard an early result: a non-finite gradient (the step skipped), a commit
// whose lr differs from the predicted one, and an in-place range marked again after it landed;
// gradients that land while a step is taken are stepped early once it ran; early steps not begun
// when the step is taken are withdrawn, and the step steps those tensors itself.
// Every case also checks that early results were adopted, so it cannot pass without any. Register
// refuses early_step with clipping, and a budget without room for the second state. The outcomes
// do not depend on timing: the driver lets the early steps run before it commits
// (Job::AwaitEarlyIdle), and the case of late ones holds the early thread at a gate.
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/host_buffer.h"
#include "server/backend/cpu_backend.h"
#include "server/job/job.h"
#include "server/job/job_memory.h"
#include "server/memory_budget.h"
#include "server/registration.h"
#include "server/registry.h"
#include "server/state/state_transfer.h"
#include "tests/unit/server/push_chunks.h"
#include "tests/unit/server/reference_job.h"
#include "tests/unit/server/run_taken_step.h"
#include "tests/unit/server/same_served.h"

namespace paramd {
namespace {

using testing::ForRank;
using testing::MakeSpec;
using testing::RandomGradients;
using testing::RandomWeights;
using testing::RunTakenStep;
using testing::StepGradients;
using testing::ToBytes;

// Heap memory handed out as if a transport exposed it (a place whose offset is the address), so
// ranks can write their slots in place and mark them.
class PlacedHeap : public BufferAllocator {
 public:
  absl::StatusOr<HostBuffer> Allocate(int64_t bytes) override {
    if (bytes == 0) return HostBuffer();
    auto* data = new uint8_t[static_cast<size_t>(bytes)]();
    return Make(data, bytes, Place{0, static_cast<int64_t>(reinterpret_cast<intptr_t>(data))});
  }
  bool shared() const override { return true; }
  static uint8_t* At(const Place& place) {
    return reinterpret_cast<uint8_t*>(static_cast<intptr_t>(place.offset));
  }

 protected:
  void Free(uint8_t* data, int64_t, Place) override { delete[] data; }
};

// A cpu backend whose next early step, once armed, waits at a gate until it is opened: the step
// can be taken while the early thread is held inside one early step.
class GatedBackend : public CpuBackend {
 public:
  GatedBackend() : CpuBackend(2) {}

  void Arm() {
    absl::MutexLock lock(&mu_);
    armed_ = true;
    entered_ = false;
    open_ = false;
  }
  void AwaitEntered() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&entered_));
  }
  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  absl::Status StepEarly(const TensorState& from, TensorState& into, const TensorStep& step,
                         const StepScalars& scalars) override {
    {
      absl::MutexLock lock(&mu_);
      if (armed_) {
        armed_ = false;
        entered_ = true;
        mu_.Await(absl::Condition(&open_));
      }
    }
    return CpuBackend::StepEarly(from, into, step, scalars);
  }

 private:
  absl::Mutex mu_;
  bool armed_ ABSL_GUARDED_BY(mu_) = false;
  bool entered_ ABSL_GUARDED_BY(mu_) = false;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
};

// A gated cpu backend that keeps the second states it made (MakeShadow, in tensor order where
// the initial weights are uploaded so) and the ones its early steps wrote into, in the order they
// began.
class ShadowCountingBackend : public GatedBackend {
 public:
  absl::StatusOr<std::unique_ptr<TensorState>> MakeShadow(const TensorState& of) override {
    absl::StatusOr<std::unique_ptr<TensorState>> shadow = CpuBackend::MakeShadow(of);
    absl::MutexLock lock(&mu_);
    if (shadow.ok()) made_.push_back(shadow->get());
    return shadow;
  }
  absl::Status StepEarly(const TensorState& from, TensorState& into, const TensorStep& step,
                         const StepScalars& scalars) override {
    {
      absl::MutexLock lock(&mu_);
      written_.push_back(&into);
    }
    return GatedBackend::StepEarly(from, into, step, scalars);
  }
  // The tensors whose early steps began, in that order (indices into made()).
  std::vector<int> EarlyOrder() {
    absl::MutexLock lock(&mu_);
    std::vector<int> order;
    for (const TensorState* into : written_) {
      order.push_back(
          static_cast<int>(std::find(made_.begin(), made_.end(), into) - made_.begin()));
    }
    return order;
  }
  std::vector<const TensorState*> made() {
    absl::MutexLock lock(&mu_);
    return made_;
  }
  std::vector<const TensorState*> written() {
    absl::MutexLock lock(&mu_);
    return written_;
  }

 private:
  absl::Mutex mu_;
  std::vector<const TensorState*> made_ ABSL_GUARDED_BY(mu_);
  std::vector<const TensorState*> written_ ABSL_GUARDED_BY(mu_);
};

class Driver {
 public:
  Driver(v1::RegisterRequest spec, bool early, bool placed,
         std::unique_ptr<CpuBackend> backend = nullptr)
      : spec_(WithEarly(std::move(spec), early)),
        backend_(backend != nullptr ? std::move(backend) : std::make_unique<CpuBackend>(2)),
        job_(std::make_shared<Job>(spec_, backend_.get(),
                                   placed ? std::make_shared<PlacedHeap>() : nullptr)) {
    for (int r = 0; r < spec_.world_size(); ++r) {
      EXPECT_TRUE(job_->Register(ForRank(spec_, r), 4096).ok());
    }
    const std::vector<std::vector<float>> weights = RandomWeights(spec_, 5);
    for (int i = 0; i < spec_.tensors_size(); ++i) {
      EXPECT_TRUE(PushTensor(0, 0, i, ToBytes(weights[static_cast<size_t>(i)]), 1 << 20,
                             v1::PUSH_KIND_INITIAL_WEIGHTS)
                      .ok());
    }
  }

  Job& job() { return *job_; }
  CpuBackend& backend() { return *backend_; }

  absl::Status PushTensor(int rank, int64_t step, int tensor, std::string_view bytes,
                          int64_t chunk_bytes, v1::PushKind kind = v1::PUSH_KIND_GRADIENT) {
    return testing::PushInChunks(*job_, spec_, rank, step, tensor, bytes, chunk_bytes, kind);
  }
  // Writes `bytes` into rank `rank`'s slot place of `tensor` for `step` and marks them.
  absl::StatusOr<ChunkBuffer::Stored> WriteInPlace(int rank, int64_t step, int tensor,
                                                   std::string_view bytes) {
    absl::StatusOr<SlotPlaces> places = job_->SlotsForStep(rank, step);
    if (!places.ok()) return places.status();
    std::memcpy(PlacedHeap::At(places->places[static_cast<size_t>(tensor)]), bytes.data(),
                bytes.size());
    v1::PushChunk chunk;
    chunk.set_job(spec_.job());
    chunk.set_rank(rank);
    chunk.set_step(step);
    chunk.set_tensor(spec_.tensors(tensor).name());
    chunk.set_kind(v1::PUSH_KIND_GRADIENT);
    chunk.set_offset(0);
    chunk.mutable_in_place()->set_bytes(static_cast<int64_t>(bytes.size()));
    chunk.mutable_in_place()->set_memory(v1::PLACE_MEMORY_HOST);
    return job_->Push(chunk);
  }
  // Commits; runs the step the last commit hands over. The early steps queued run first, so that
  // none is late whatever the threads' timing.
  absl::Status Commit(int rank, int64_t step, std::optional<double> lr = std::nullopt) {
    job_->AwaitEarlyIdle();
    v1::CommitRequest request;
    request.set_job(spec_.job());
    request.set_rank(rank);
    request.set_step(step);
    if (lr) request.set_lr(*lr);
    absl::StatusOr<CommitOutcome> outcome = job_->Commit(request);
    if (!outcome.ok()) return outcome.status();
    if (outcome->work) return RunTakenStep(*job_, *outcome->work).failed;
    return absl::OkStatus();
  }
  // Commits without running the step: the last commit's work, which Run runs later. Where
  // `await_early`, after the early steps queued ran (as Commit).
  std::optional<StepWork> CommitHeld(int rank, int64_t step, bool await_early = true) {
    if (await_early) job_->AwaitEarlyIdle();
    v1::CommitRequest request;
    request.set_job(spec_.job());
    request.set_rank(rank);
    request.set_step(step);
    absl::StatusOr<CommitOutcome> outcome = job_->Commit(request);
    EXPECT_TRUE(outcome.ok()) << outcome.status();
    return outcome.ok() ? outcome->work : std::nullopt;
  }
  absl::Status Run(const StepWork& work) { return RunTakenStep(*job_, work).failed; }
  // The job's state as an export streams it.
  std::vector<v1::StateChunk> Export() {
    absl::StatusOr<std::unique_ptr<StateExport>> exporter =
        StateExport::BeginAndWait(ExportOf(job_, nullptr), 1 << 20);
    EXPECT_TRUE(exporter.ok()) << exporter.status();
    std::vector<v1::StateChunk> chunks;
    if (!exporter.ok()) return chunks;
    v1::StateChunk chunk;
    for (;;) {
      absl::StatusOr<bool> more = (*exporter)->Next(&chunk);
      EXPECT_TRUE(more.ok()) << more.status();
      if (!more.ok() || !*more) break;
      chunks.push_back(chunk);
    }
    return chunks;
  }

 private:
  static v1::RegisterRequest WithEarly(v1::RegisterRequest spec, bool early) {
    spec.set_early_step(early);
    return spec;
  }

  const v1::RegisterRequest spec_;
  std::unique_ptr<CpuBackend> backend_;
  std::shared_ptr<Job> job_;
};

// Drives one step of a job (pushes and commits, in the case's order).
using StepScript = std::function<void(Driver&, int64_t step)>;

// Every rank pushes every tensor in chunks, rank by rank and tensor by tensor, then every rank
// commits with `lr` (none: the job's).
StepScript PushAllThenCommit(const v1::RegisterRequest& spec, uint64_t seed,
                             std::function<std::optional<double>(int64_t)> lr = nullptr) {
  return [spec, seed, lr](Driver& d, int64_t step) {
    const StepGradients grads = RandomGradients(spec, seed + static_cast<uint64_t>(step));
    for (int r = 0; r < spec.world_size(); ++r) {
      for (int i = 0; i < spec.tensors_size(); ++i) {
        ASSERT_TRUE(d.PushTensor(r, step, i, grads[static_cast<size_t>(i)][r], 1000).ok());
      }
    }
    for (int r = 0; r < spec.world_size(); ++r) {
      ASSERT_TRUE(d.Commit(r, step, lr ? lr(step) : std::nullopt).ok());
    }
  };
}

struct Counters {
  int64_t adopted = 0;
  int64_t discarded = 0;
  int64_t late = 0;
};

// Runs `steps` steps of `spec` with and without early_step and expects the same served bytes,
// versions and outcomes of every tensor, the same Status (but for the early counters and the
// reservation) after each step, and the same exported state at the end. Returns the early job's
// counters, which its backend's count of adoptions matches. `early_backend`: the early job's
// (default: a CpuBackend).
Counters ExpectSameSteps(const v1::RegisterRequest& spec, int steps, const StepScript& script,
                         bool placed = false, std::unique_ptr<CpuBackend> early_backend = nullptr) {
  Driver early(spec, /*early=*/true, placed, std::move(early_backend));
  Driver plain(spec, /*early=*/false, placed);
  for (int64_t step = 0; step < steps; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    script(early, step);
    script(plain, step);
    testing::ExpectSameServed(early.job(), plain.job(), spec.tensors_size(), step + 1);
    v1::JobStatus sa = early.job().Status();
    v1::JobStatus sb = plain.job().Status();
    EXPECT_EQ(sb.early_steps_adopted(), 0);
    EXPECT_EQ(sb.early_steps_discarded(), 0);
    EXPECT_EQ(sb.early_steps_late(), 0);
    for (v1::JobStatus* s : {&sa, &sb}) {
      s->clear_last_step_seconds();
      s->clear_early_steps_adopted();
      s->clear_early_steps_discarded();
      s->clear_early_steps_late();
      s->clear_reserved_host_bytes();
    }
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(sa, sb))
        << sa.DebugString() << "\nvs\n"
        << sb.DebugString();
  }
  const std::vector<v1::StateChunk> ea = early.Export();
  const std::vector<v1::StateChunk> eb = plain.Export();
  EXPECT_FALSE(ea.empty());
  EXPECT_EQ(ea.size(), eb.size());
  for (size_t c = 0; c < ea.size() && c < eb.size(); ++c) {
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(ea[c], eb[c]))
        << "exported chunk " << c << " differs";
  }
  const v1::JobStatus status = early.job().Status();
  EXPECT_EQ(status.early_steps_adopted(), early.backend().early_steps_adopted());
  return {status.early_steps_adopted(), status.early_steps_discarded(), status.early_steps_late()};
}

v1::RegisterRequest JobSpec(const v1::StatePolicy& policy) {
  v1::RegisterRequest spec = MakeSpec("early", 2,
                                      {{"scalar", 1, 1, v1::ELEMENT_TYPE_FP32},
                                       {"odd", 7, 13, v1::ELEMENT_TYPE_BF16},
                                       {"panels", 131, 257, v1::ELEMENT_TYPE_FP32},
                                       {"vector", 1, 1000, v1::ELEMENT_TYPE_BF16}});
  *spec.mutable_state_policy() = policy;
  return spec;
}

v1::StatePolicy Policy(v1::MasterType master, v1::MomentType m, v1::MomentType v,
                       v1::Rounding rounding) {
  v1::StatePolicy p;
  p.set_master(master);
  p.set_exp_avg(m);
  p.set_exp_avg_sq(v);
  p.set_exp_avg_rounding(rounding);
  p.set_exp_avg_sq_rounding(rounding);
  return p;
}

struct Case {
  const char* name;
  v1::StatePolicy policy;
  bool bf16_only;  // serve BF16 alone (no FP32): a 16-bit master keeps a working copy
};

std::vector<Case> Cases() {
  return {
      {"fp32", v1::StatePolicy(), false},
      {"fp8_stochastic",
       Policy(v1::MASTER_TYPE_FP32, v1::MOMENT_TYPE_FP8, v1::MOMENT_TYPE_FP8,
              v1::ROUNDING_STOCHASTIC),
       false},
      {"fp8m_fp16v",
       Policy(v1::MASTER_TYPE_FP32, v1::MOMENT_TYPE_FP8, v1::MOMENT_TYPE_FP16,
              v1::ROUNDING_UNSPECIFIED),
       false},
      {"bf16_remainder_stochastic_bf16_served",
       Policy(v1::MASTER_TYPE_BF16_REMAINDER, v1::MOMENT_TYPE_BF16, v1::MOMENT_TYPE_FP16,
              v1::ROUNDING_STOCHASTIC),
       true},
      {"fp16_master_fp8_tensor_served",
       Policy(v1::MASTER_TYPE_FP16, v1::MOMENT_TYPE_FP8, v1::MOMENT_TYPE_FP16,
              v1::ROUNDING_STOCHASTIC),
       true},
  };
}

v1::RegisterRequest CaseSpec(const Case& c) {
  v1::RegisterRequest spec = JobSpec(c.policy);
  if (c.bf16_only) {
    spec.clear_serve();
    spec.add_serve()->set_recipe(v1::RECIPE_BF16);
    if (c.policy.master() == v1::MASTER_TYPE_FP16) {
      // Per-tensor and delayed scales: the state's scalars travel with the adopted state.
      spec.add_serve()->set_recipe(v1::RECIPE_FP8_TENSOR);
      spec.add_serve()->set_recipe(v1::RECIPE_FP8_DELAYED);
    }
  }
  return spec;
}

TEST(EarlyStepTest, EveryPolicyAndFormatStepsExactlyAsWithoutIt) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    const v1::RegisterRequest spec = CaseSpec(c);
    constexpr int kSteps = 4;
    const Counters counters = ExpectSameSteps(spec, kSteps, PushAllThenCommit(spec, 11));
    // Every tensor of every step landed before its commit, with the scalars predicted.
    EXPECT_EQ(counters.adopted, kSteps * spec.tensors_size());
    EXPECT_EQ(counters.discarded, 0);
    EXPECT_EQ(counters.late, 0);
  }
}

TEST(EarlyStepTest, EarlyStepsNotBegunWhenTheStepIsTakenAreSteppedByTheStep) {
  // The early thread is held inside the first tensor's early step while the others land and the
  // step is taken: their early steps are withdrawn (late), the step steps them itself and adopts
  // the first one's, bit for bit as the job without early steps.
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    const v1::RegisterRequest spec = CaseSpec(c);
    const auto script = [&spec](Driver& d, int64_t step) {
      auto* gate = dynamic_cast<GatedBackend*>(&d.backend());
      if (gate != nullptr) gate->Arm();
      const StepGradients grads = RandomGradients(spec, 61 + static_cast<uint64_t>(step));
      for (int r = 0; r < spec.world_size(); ++r) {
        for (int i = 0; i < spec.tensors_size(); ++i) {
          ASSERT_TRUE(d.PushTensor(r, step, i, grads[static_cast<size_t>(i)][r], 1000).ok());
        }
      }
      if (gate != nullptr) gate->AwaitEntered();  // the first tensor to land: "scalar"
      std::optional<StepWork> work;
      for (int r = 0; r < spec.world_size(); ++r) {
        std::optional<StepWork> w = d.CommitHeld(r, step, /*await_early=*/false);
        if (w) work = w;
      }
      ASSERT_TRUE(work.has_value());
      if (gate != nullptr) gate->Open();
      ASSERT_TRUE(d.Run(*work).ok());
    };
    constexpr int kSteps = 3;
    const Counters counters =
        ExpectSameSteps(spec, kSteps, script, /*placed=*/false, std::make_unique<GatedBackend>());
    EXPECT_EQ(counters.adopted, kSteps);
    EXPECT_EQ(counters.late, kSteps * (spec.tensors_size() - 1));
    EXPECT_EQ(counters.discarded, 0);
  }
}

TEST(EarlyStepTest, EachTensorsSecondStateIsMadeWithItsStateAndNoEarlyStepMakesOne) {
  // The second state's memory is taken when the initial weights arrive (where the budget reserved
  // it), not by the early steps, which run while backward does.
  const v1::RegisterRequest spec = JobSpec(v1::StatePolicy());
  Driver d(spec, /*early=*/true, /*placed=*/false, std::make_unique<ShadowCountingBackend>());
  auto& backend = dynamic_cast<ShadowCountingBackend&>(d.backend());
  const std::vector<const TensorState*> made = backend.made();
  ASSERT_EQ(made.size(), static_cast<size_t>(spec.tensors_size()));
  const StepScript script = PushAllThenCommit(spec, 40);
  for (int64_t step = 0; step < 3; ++step) script(d, step);
  EXPECT_EQ(backend.made(), made);
  const std::vector<const TensorState*> written = backend.written();
  EXPECT_EQ(written.size(), 3 * made.size());
  for (const TensorState* into : written) {
    EXPECT_NE(std::find(made.begin(), made.end(), into), made.end());
  }
  EXPECT_EQ(d.job().Status().early_steps_adopted(), 3 * spec.tensors_size());
}

TEST(EarlyStepTest, QueuedTensorsAreSteppedInTheOrderTheNextForwardReadsThem) {
  // The last tensor lands first (backward's order) and its early step is held at the gate while
  // the others land: they then run first-tensor first, so those still queued at a commit are the
  // ones the forward reads last.
  const v1::RegisterRequest spec = JobSpec(v1::StatePolicy());
  const int n = spec.tensors_size();
  Driver d(spec, /*early=*/true, /*placed=*/false, std::make_unique<ShadowCountingBackend>());
  auto& backend = dynamic_cast<ShadowCountingBackend&>(d.backend());
  const StepGradients grads = RandomGradients(spec, 70);
  backend.Arm();
  for (int i = n - 1; i >= 0; --i) {
    for (int r = 0; r < spec.world_size(); ++r) {
      ASSERT_TRUE(d.PushTensor(r, 0, i, grads[static_cast<size_t>(i)][r], 1000).ok());
    }
    if (i == n - 1) backend.AwaitEntered();
  }
  backend.Open();
  for (int r = 0; r < spec.world_size(); ++r) ASSERT_TRUE(d.Commit(r, 0).ok());
  std::vector<int> expected = {n - 1};
  for (int i = 0; i < n - 1; ++i) expected.push_back(i);
  EXPECT_EQ(backend.EarlyOrder(), expected);
  EXPECT_EQ(d.job().Status().early_steps_adopted(), n);
}

TEST(EarlyStepTest, ANonFiniteGradientInTheLastTensorToLandDiscardsEveryEarlyResult) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    const v1::RegisterRequest spec = CaseSpec(c);
    const int last = spec.tensors_size() - 1;  // rank 1's, pushed last
    const auto script = [&spec, last](Driver& d, int64_t step) {
      StepGradients grads = RandomGradients(spec, 51 + static_cast<uint64_t>(step));
      if (step == 1) {
        // A NaN in rank 1's "vector" (BF16): 0x7fc0.
        const uint16_t nan = 0x7fc0;
        std::memcpy(grads[static_cast<size_t>(last)][1].data() + 2 * 500, &nan, 2);
      }
      for (int r = 0; r < spec.world_size(); ++r) {
        for (int i = 0; i < spec.tensors_size(); ++i) {
          ASSERT_TRUE(d.PushTensor(r, step, i, grads[static_cast<size_t>(i)][r], 4096).ok());
        }
      }
      for (int r = 0; r < spec.world_size(); ++r) ASSERT_TRUE(d.Commit(r, step).ok());
    };
    Driver probe(spec, true, false);
    script(probe, 0);
    script(probe, 1);
    EXPECT_EQ(probe.job().Status().skipped_steps(), 1);
    const Counters counters = ExpectSameSteps(spec, 3, script);
    // Step 1's tensors were all stepped early, then the step was skipped.
    EXPECT_EQ(counters.discarded, spec.tensors_size());
    EXPECT_EQ(counters.adopted, 2 * spec.tensors_size());
  }
}

TEST(EarlyStepTest, ACommitWhoseLrDiffersFromThePredictionIsSteppedAtTheStep) {
  const v1::RegisterRequest spec = CaseSpec(Cases()[1]);
  // Step 0 runs with the job's lr (predicted); step 1's commits say 5e-4 (predicted: the job's),
  // steps 2 and 3 repeat it (predicted from the last commit).
  const auto lr = [](int64_t step) -> std::optional<double> {
    if (step == 0) return std::nullopt;
    return 5e-4;
  };
  const Counters counters = ExpectSameSteps(spec, 4, PushAllThenCommit(spec, 21, lr));
  EXPECT_EQ(counters.discarded, spec.tensors_size());
  EXPECT_EQ(counters.adopted, 3 * spec.tensors_size());
}

TEST(EarlyStepTest, ALearningRateScheduleAnnouncedBeforeThePushesIsPredicted) {
  // An lr that changes every step (a schedule): told by SetHyperparams before each step's
  // gradients land (as paramd.torch does with early_step), every early result is adopted; the
  // commits say the same lr. Unannounced, each step's commit lr differs from the last one's and
  // every early result is discarded, the bytes the same either way.
  const v1::RegisterRequest spec = CaseSpec(Cases()[1]);
  const auto lr = [](int64_t step) { return 1e-3 / static_cast<double>(step + 1); };
  for (const bool announced : {true, false}) {
    SCOPED_TRACE(announced ? "announced" : "not announced");
    const StepScript commit = PushAllThenCommit(spec, 41, lr);
    const auto script = [&spec, &lr, &commit, announced](Driver& d, int64_t step) {
      if (announced) {
        v1::SetHyperparamsRequest request;
        request.set_job(spec.job());
        request.set_lr(lr(step));
        ASSERT_TRUE(d.job().SetHyperparams(request).ok());
      }
      commit(d, step);
    };
    const Counters counters = ExpectSameSteps(spec, 3, script);
    if (announced) {
      EXPECT_EQ(counters.adopted, 3 * spec.tensors_size());
      EXPECT_EQ(counters.discarded, 0);
    } else {
      // Step 0 predicts the job's registered lr, the later ones the last commit's: all miss but
      // where the registered lr is step 0's.
      EXPECT_EQ(counters.adopted + counters.discarded, 3 * spec.tensors_size());
      EXPECT_GE(counters.discarded, 2 * spec.tensors_size());
    }
  }
}

TEST(EarlyStepTest, SetHyperparamsChangesThePredictionOfTheNextStep) {
  const v1::RegisterRequest spec = CaseSpec(Cases()[0]);
  // The weight decay changes between the pushes and the commits of step 1: its early results
  // were made with the old one, and step 2's with the new one.
  const auto script = [&spec](Driver& d, int64_t step) {
    const StepGradients grads = RandomGradients(spec, 31 + static_cast<uint64_t>(step));
    for (int r = 0; r < spec.world_size(); ++r) {
      for (int i = 0; i < spec.tensors_size(); ++i) {
        ASSERT_TRUE(d.PushTensor(r, step, i, grads[static_cast<size_t>(i)][r], 1000).ok());
      }
    }
    if (step == 1) {
      v1::SetHyperparamsRequest request;
      request.set_job(spec.job());
      request.set_weight_decay(0.25);
      ASSERT_TRUE(d.job().SetHyperparams(request).ok());
    }
    for (int r = 0; r < spec.world_size(); ++r) ASSERT_TRUE(d.Commit(r, step).ok());
  };
  const Counters counters = ExpectSameSteps(spec, 3, script);
  EXPECT_EQ(counters.discarded, spec.tensors_size());
  EXPECT_EQ(counters.adopted, 2 * spec.tensors_size());
}

TEST(EarlyStepTest, AnInPlaceRangeMarkedAgainAfterItLandedIsSteppedAtTheStep) {
  // Ranks write their slots in place and mark them. Rank 1 then writes "panels" anew (four times
  // the values) and marks the same range again, which the daemon cannot tell from a retry: that
  // tensor's early result read the old bytes and is not adopted.
  const v1::RegisterRequest spec = CaseSpec(Cases()[2]);
  const auto script = [&spec](Driver& d, int64_t step) {
    const StepGradients grads = RandomGradients(spec, 91 + static_cast<uint64_t>(step));
    for (int r = 0; r < spec.world_size(); ++r) {
      for (int i = 0; i < spec.tensors_size(); ++i) {
        absl::StatusOr<ChunkBuffer::Stored> stored =
            d.WriteInPlace(r, step, i, grads[static_cast<size_t>(i)][r]);
        ASSERT_TRUE(stored.ok()) << stored.status();
        EXPECT_EQ(*stored, ChunkBuffer::Stored::kNew);
      }
    }
    std::vector<float> rewritten = testing::FromBytes<float>(grads[2][1]);  // "panels" is FP32
    for (float& x : rewritten) x *= 4;
    absl::StatusOr<ChunkBuffer::Stored> again = d.WriteInPlace(1, step, 2, ToBytes(rewritten));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(*again, ChunkBuffer::Stored::kDuplicate);
    for (int r = 0; r < spec.world_size(); ++r) ASSERT_TRUE(d.Commit(r, step).ok());
  };
  const Counters counters = ExpectSameSteps(spec, 3, script, /*placed=*/true);
  EXPECT_EQ(counters.discarded, 3);
  EXPECT_EQ(counters.adopted, 3 * (spec.tensors_size() - 1));
}

TEST(EarlyStepTest, GradientsThatLandWhileAStepIsTakenAreSteppedOnceItRan) {
  // Staleness: step 1's gradients land while step 0 is taken and not yet run (its state is not
  // free): their early steps wait until step 0 ran, and step 1 adopts them. Step 2's land while
  // step 1 is taken, and step 2 is committed before step 1 runs: step 2 steps its tensors itself.
  const v1::RegisterRequest spec = CaseSpec(Cases()[1]);
  const auto push = [&spec](Driver& d, int64_t step) {
    const StepGradients grads = RandomGradients(spec, 71 + static_cast<uint64_t>(step));
    for (int r = 0; r < spec.world_size(); ++r) {
      for (int i = spec.tensors_size() - 1; i >= 0; --i) {
        ASSERT_TRUE(d.PushTensor(r, step, i, grads[static_cast<size_t>(i)][r], 1000).ok());
      }
    }
  };
  const auto commit = [&spec](Driver& d, int64_t step) {
    std::optional<StepWork> work;
    for (int r = 0; r < spec.world_size(); ++r) {
      std::optional<StepWork> w = d.CommitHeld(r, step);
      if (w) work = w;
    }
    EXPECT_TRUE(work.has_value());
    return work.value_or(StepWork{});
  };
  const auto script = [&push, &commit](Driver& d, int64_t step) {
    if (step == 0) {
      push(d, 0);
      const StepWork work = commit(d, 0);
      push(d, 1);  // while step 0 waits to run
      ASSERT_TRUE(d.Run(work).ok());
    } else if (step == 1) {
      const StepWork one = commit(d, 1);
      push(d, 2);  // while step 1 waits to run
      const StepWork two = commit(d, 2);
      ASSERT_TRUE(d.Run(one).ok());
      ASSERT_TRUE(d.Run(two).ok());
    } else if (step == 3) {
      push(d, 3);
      ASSERT_TRUE(d.Run(commit(d, 3)).ok());
    }
  };
  const Counters counters = ExpectSameSteps(spec, 4, script);
  EXPECT_EQ(counters.adopted, 3 * spec.tensors_size());  // steps 0, 1 and 3
  EXPECT_EQ(counters.discarded, 0);
}

TEST(EarlyStepTest, ATensorWhoseServedVersionsAreAllLeasedWhenItLandsIsSteppedAtTheStep) {
  // A reader leases versions 1, 2 and 3 of "scalar" (every buffer it may have): when step 3's
  // gradients land no buffer of its version 4 is free, so it is not stepped early; the lease of
  // version 1 ends before the commits, and the step steps it.
  const v1::RegisterRequest spec = CaseSpec(Cases()[0]);
  std::map<Driver*, std::vector<std::shared_ptr<const ServedTensor>>> leases;
  const auto script = [&spec, &leases](Driver& d, int64_t step) {
    const StepGradients grads = RandomGradients(spec, 81 + static_cast<uint64_t>(step));
    for (int r = 0; r < spec.world_size(); ++r) {
      for (int i = 0; i < spec.tensors_size(); ++i) {
        ASSERT_TRUE(d.PushTensor(r, step, i, grads[static_cast<size_t>(i)][r], 1000).ok());
      }
    }
    std::vector<std::shared_ptr<const ServedTensor>>& held = leases[&d];
    if (step == 3) held.erase(held.begin());  // version 1's lease ends
    for (int r = 0; r < spec.world_size(); ++r) ASSERT_TRUE(d.Commit(r, step).ok());
    if (step <= 2) held.push_back(d.job().Served(0, step + 1));
  };
  const Counters counters = ExpectSameSteps(spec, 4, script);
  EXPECT_EQ(counters.adopted, 4 * spec.tensors_size() - 1);
  EXPECT_EQ(counters.discarded, 0);
}

TEST(EarlyStepTest, RegisterRefusesEarlyStepWithClipping) {
  v1::RegisterRequest spec = JobSpec(v1::StatePolicy());
  spec.set_early_step(true);
  EXPECT_TRUE(ValidateRegistration(spec).ok());
  spec.set_max_grad_norm(1.0);
  const absl::Status refused = ValidateRegistration(spec);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("early_step"), std::string::npos) << refused;
  EXPECT_NE(refused.message().find("clipping"), std::string::npos) << refused;

  // Through a registry, too; and a rank whose early_step differs from the job's is refused.
  CpuBackend backend(1);
  JobRegistry registry(&backend, {});
  EXPECT_EQ(registry.Register(ForRank(spec, 0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  spec.set_max_grad_norm(0);
  ASSERT_TRUE(registry.Register(ForRank(spec, 0)).ok());
  v1::RegisterRequest other = ForRank(spec, 1);
  other.set_early_step(false);
  EXPECT_EQ(registry.Register(other).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(EarlyStepTest, ABudgetWithoutRoomForTheSecondStateRefusesEarlyStep) {
  v1::RegisterRequest spec = JobSpec(v1::StatePolicy());
  const int64_t plain = JobFootprint(spec, BackendPlacement{}).host;
  spec.set_early_step(true);
  const int64_t early = JobFootprint(spec, BackendPlacement{}).host;
  const int64_t second = EarlyStepBytes(spec);
  int64_t state = 0;
  for (int i = 0; i < spec.tensors_size(); ++i) {
    state += PolicyStateBytes(TensorInfoOf(spec, i)).total();
  }
  EXPECT_EQ(second, state);  // FP32 master and served FP32: no working copy
  EXPECT_EQ(early, plain + second);
  // A backend whose state lies on the device ignores early_step: nothing more is reserved.
  v1::RegisterRequest without = spec;
  without.set_early_step(false);
  const MemoryBytes on_device = JobFootprint(spec, BackendPlacement{true});
  EXPECT_EQ(on_device.host, JobFootprint(without, BackendPlacement{true}).host);
  EXPECT_EQ(on_device.device, JobFootprint(without, BackendPlacement{true}).device);

  CpuBackend backend(1);
  MemoryBudget budget({plain, 0});  // room for the job, not for its second state
  JobRegistry registry(&backend, {}, {}, &budget);
  const absl::Status refused = registry.Register(ForRank(spec, 0)).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("early_step"), std::string::npos) << refused;
  EXPECT_NE(refused.message().find(std::to_string(second)), std::string::npos) << refused;
  spec.set_early_step(false);
  EXPECT_TRUE(registry.Register(ForRank(spec, 0)).ok());
}

}  // namespace
}  // namespace paramd
