// The gradient check accumulated as gradients land (DESIGN.md §2): each tensor's finiteness and
// FP64 block sums computed when its last slot lands (LandedCheckAbility) equal the check over all
// tensors at the step, bit for bit; a step whose every tensor was checked as it landed reads no
// gradient again; and a job that checks as gradients land steps exactly as one that checks only
// at the step (the same served bytes, skips and clip), across clipping, a non-finite gradient,
// several ranks in any order, retried pushes, pre-reduced pushes, a grad_scale that changes, and
// an in-place range marked again, which falls back to the step's own check.
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "common/host_buffer.h"
#include "server/backend/cpu_backend.h"
#include "server/job/job.h"
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

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; }

// ---------------------------------------------------------------------------------------------
// The backend alone: CheckLanded per tensor against CheckGradients over all tensors.

struct Slots {
  std::vector<std::vector<uint8_t>> bytes;  // per rank
  std::vector<const void*> pointers() const {
    std::vector<const void*> p;
    for (const auto& b : bytes) p.push_back(b.data());
    return p;
  }
};

// `ranks` gradients of `rows` x `cols` in `type`, N(0, scale), with `bad` at element `at` of the
// last rank where set.
Slots RandomSlots(int64_t rows, int64_t cols, kernels::SlotType type, int ranks, uint64_t seed,
                  double scale, std::optional<float> bad = std::nullopt, int64_t at = 0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, scale);
  Slots slots;
  const int64_t n = rows * cols;
  for (int r = 0; r < ranks; ++r) {
    std::vector<float> g(static_cast<size_t>(n));
    for (float& x : g) x = static_cast<float>(normal(rng));
    if (bad.has_value() && r == ranks - 1) g[static_cast<size_t>(at)] = *bad;
    std::vector<uint8_t>& b = slots.bytes.emplace_back();
    if (type == kernels::SlotType::kBf16) {
      b.resize(static_cast<size_t>(2 * n));
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t code = reference::Bf16FromFloat(g[static_cast<size_t>(i)]);
        std::memcpy(b.data() + 2 * i, &code, 2);
      }
    } else {
      b.resize(static_cast<size_t>(4 * n));
      std::memcpy(b.data(), g.data(), b.size());
    }
  }
  return slots;
}

struct CheckedTensor {
  TensorInfo info;
  kernels::SlotType type;
  Slots slots;
  ServedTensor served;  // no format: the check needs none
  std::unique_ptr<TensorState> state;
};

TEST(LandedCheckTest, EachTensorsLandedCheckEqualsItsShareOfTheCheckOverAllTensors) {
  CpuBackend backend(3);
  struct Shape {
    int64_t rows, cols, row_offset;
    kernels::SlotType type;
    std::optional<float> bad;
    int64_t at;
  };
  // Sizes 1, primes, a non-multiple of the 128-row block, a row range of a split tensor (its
  // blocks are the whole tensor's), BF16 and FP32 slots; non-finite values in some.
  const std::vector<Shape> shapes = {
      {1, 1, 0, kernels::SlotType::kFp32, std::nullopt, 0},
      {7, 13, 0, kernels::SlotType::kBf16, std::nullopt, 0},
      {131, 257, 0, kernels::SlotType::kFp32, std::nullopt, 0},
      {256, 64, 128, kernels::SlotType::kBf16, std::nullopt, 0},
      {300, 33, 0, kernels::SlotType::kFp32, kNaN, 300 * 33 - 1},
      {129, 5, 0, kernels::SlotType::kBf16, -kInf, 640},
      {3, 1000, 0, kernels::SlotType::kFp32, 2e19f, 2500},  // finite, its square is not
  };
  for (int ranks : {1, 2, 3}) {
    for (bool with_bad : {false, true}) {
      SCOPED_TRACE(::testing::Message() << ranks << " ranks, non-finite values: " << with_bad);
      std::vector<std::unique_ptr<CheckedTensor>> tensors;
      for (size_t i = 0; i < shapes.size(); ++i) {
        const Shape& s = shapes[i];
        auto t = std::make_unique<CheckedTensor>();
        t->info.rows = s.rows;
        t->info.cols = s.cols;
        t->info.row_offset = s.row_offset;
        t->info.index = static_cast<uint32_t>(i);
        t->type = s.type;
        t->slots = RandomSlots(s.rows, s.cols, s.type, ranks, 100 * i + ranks, 1e-3,
                               with_bad ? s.bad : std::nullopt, s.at);
        absl::StatusOr<std::unique_ptr<TensorState>> state = backend.CreateState(
            t->info, std::vector<float>(static_cast<size_t>(s.rows * s.cols), 0.01f), &t->served,
            nullptr);
        ASSERT_TRUE(state.ok()) << state.status();
        t->state = *std::move(state);
        tensors.push_back(std::move(t));
      }
      auto steps = [&] {
        std::vector<TensorStep> steps;
        for (const auto& t : tensors) {
          TensorStep& step = steps.emplace_back();
          step.state = t->state.get();
          step.slots = t->slots.pointers();
          step.slot_type = t->type;
        }
        return steps;
      };
      for (bool norms : {true, false}) {
        for (float grad_scale : {1.0f, 0.375f, 3e-5f}) {
          SCOPED_TRACE(::testing::Message() << "norms " << norms << ", grad_scale " << grad_scale);
          std::vector<TensorStep> all = steps();
          const int64_t read_before = backend.checked_at_step();
          absl::StatusOr<GradientCheck> whole = backend.CheckGradients(all, grad_scale, norms);
          ASSERT_TRUE(whole.ok()) << whole.status();
          EXPECT_EQ(backend.checked_at_step() - read_before, static_cast<int64_t>(all.size()));
          ASSERT_EQ(whole->block_sums.size(), tensors.size());
          EXPECT_EQ(whole->finite, !with_bad);

          std::vector<TensorCheck> landed;
          bool finite = true;
          for (size_t i = 0; i < tensors.size(); ++i) {
            SCOPED_TRACE(i);
            const CheckedTensor& t = *tensors[i];
            const std::vector<const void*> slots = t.slots.pointers();
            absl::StatusOr<TensorCheck> check =
                backend.CheckLanded(t.info, slots, t.type, grad_scale, norms);
            ASSERT_TRUE(check.ok()) << check.status();
            EXPECT_EQ(check->grad_scale, grad_scale);
            EXPECT_EQ(check->norms, norms);
            finite = finite && check->finite;
            const std::vector<double>& expected = whole->block_sums[i];
            ASSERT_EQ(check->block_sums.size(), expected.size());
            for (size_t b = 0; b < expected.size(); ++b) {
              EXPECT_TRUE(SameBits(check->block_sums[b], expected[b]))
                  << "block " << b << ": " << check->block_sums[b] << " vs " << expected[b];
            }
            landed.push_back(*std::move(check));
          }
          EXPECT_EQ(finite, whole->finite);

          // Handed to the step, the landed checks are the check: no gradient is read again.
          std::vector<TensorStep> reuse = steps();
          for (size_t i = 0; i < reuse.size(); ++i) reuse[i].landed = &landed[i];
          const int64_t read = backend.checked_at_step();
          const int64_t used = backend.landed_checks_used();
          absl::StatusOr<GradientCheck> from_landed =
              backend.CheckGradients(reuse, grad_scale, norms);
          ASSERT_TRUE(from_landed.ok()) << from_landed.status();
          EXPECT_EQ(backend.checked_at_step(), read);
          EXPECT_EQ(backend.landed_checks_used() - used, static_cast<int64_t>(reuse.size()));
          EXPECT_EQ(from_landed->finite, whole->finite);
          ASSERT_EQ(from_landed->block_sums.size(), whole->block_sums.size());
          for (size_t i = 0; i < whole->block_sums.size(); ++i) {
            ASSERT_EQ(from_landed->block_sums[i].size(), whole->block_sums[i].size());
            for (size_t b = 0; b < whole->block_sums[i].size(); ++b) {
              EXPECT_TRUE(SameBits(from_landed->block_sums[i][b], whole->block_sums[i][b]));
            }
          }
        }
      }
    }
  }
}

TEST(LandedCheckTest, ALandedCheckOfAnotherScaleOrWithoutNormsIsNotUsed) {
  TensorCheck check;
  check.grad_scale = 0.5f;
  check.norms = false;
  EXPECT_TRUE(check.Answers(0.5f, false));
  EXPECT_FALSE(check.Answers(0.5f, true));  // the step needs block sums it has not
  EXPECT_FALSE(check.Answers(std::nextafter(0.5f, 1.0f), false));
  check.norms = true;
  EXPECT_TRUE(check.Answers(0.5f, true));
  EXPECT_TRUE(check.Answers(0.5f, false));
  // -0 and +0 are not the same scale bit for bit (commits refuse both: grad_scale > 0).
  check.grad_scale = 0.0f;
  EXPECT_FALSE(check.Answers(-0.0f, false));

  // A landed check that does not answer the step is ignored: the step reads the gradient, and
  // a fabricated sum it was handed does not show.
  CpuBackend backend(2);
  CheckedTensor t;
  t.info.rows = 200;
  t.info.cols = 3;
  t.type = kernels::SlotType::kFp32;
  t.slots = RandomSlots(200, 3, t.type, 2, 7, 1e-2);
  absl::StatusOr<std::unique_ptr<TensorState>> state =
      backend.CreateState(t.info, std::vector<float>(600, 0.01f), &t.served, nullptr);
  ASSERT_TRUE(state.ok()) << state.status();
  t.state = *std::move(state);
  TensorCheck fabricated;
  fabricated.grad_scale = 0.25f;
  fabricated.norms = true;
  fabricated.finite = false;
  fabricated.block_sums = {1.0, 2.0};
  std::vector<TensorStep> steps(1);
  steps[0].state = t.state.get();
  steps[0].slots = t.slots.pointers();
  steps[0].slot_type = t.type;
  steps[0].landed = &fabricated;
  absl::StatusOr<GradientCheck> other_scale = backend.CheckGradients(steps, 0.5f, true);
  ASSERT_TRUE(other_scale.ok());
  EXPECT_TRUE(other_scale->finite);
  EXPECT_NE(other_scale->block_sums[0][0], 1.0);
  EXPECT_EQ(backend.checked_at_step(), 1);
  // With the scale it was made for, it is taken as it is (the job never hands over a check of
  // other bytes: this shows that nothing is read again).
  absl::StatusOr<GradientCheck> same_scale = backend.CheckGradients(steps, 0.25f, true);
  ASSERT_TRUE(same_scale.ok());
  EXPECT_FALSE(same_scale->finite);
  EXPECT_EQ(same_scale->block_sums[0], fabricated.block_sums);
  EXPECT_EQ(backend.checked_at_step(), 1);
  EXPECT_EQ(backend.landed_checks_used(), 1);
}

// ---------------------------------------------------------------------------------------------
// Through a job: the same steps with and without the checks as gradients land.

// A cpu backend without the LandedCheckAbility: its jobs check every gradient at the step, as
// before the ability existed.
class CheckAtStepBackend : public CpuBackend {
 public:
  using CpuBackend::CpuBackend;
  LandedCheckAbility* landed_check() override { return nullptr; }
};

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

class Driver {
 public:
  Driver(const v1::RegisterRequest& spec, bool landed, bool placed)
      : spec_(spec),
        backend_(landed ? std::make_unique<CpuBackend>(2)
                        : std::make_unique<CheckAtStepBackend>(2)),
        job_(spec, backend_.get(), placed ? std::make_shared<PlacedHeap>() : nullptr) {
    for (int r = 0; r < spec.world_size(); ++r) {
      EXPECT_TRUE(job_.Register(ForRank(spec, r), 4096).ok());
    }
    const std::vector<std::vector<float>> weights = RandomWeights(spec, 5);
    for (int i = 0; i < spec.tensors_size(); ++i) {
      EXPECT_TRUE(PushTensor(0, 0, i, ToBytes(weights[static_cast<size_t>(i)]), 1 << 20,
                             v1::PUSH_KIND_INITIAL_WEIGHTS)
                      .ok());
    }
  }

  Job& job() { return job_; }
  CpuBackend& backend() { return *backend_; }

  absl::StatusOr<ChunkBuffer::Stored> Push(int rank, int64_t step, int tensor, int64_t offset,
                                           std::string_view data,
                                           v1::PushKind kind = v1::PUSH_KIND_GRADIENT) {
    return job_.Push(testing::ChunkOf(spec_.job(), rank, step, spec_.tensors(tensor).name(), offset,
                                      data, kind));
  }
  absl::Status PushTensor(int rank, int64_t step, int tensor, std::string_view bytes,
                          int64_t chunk_bytes, v1::PushKind kind = v1::PUSH_KIND_GRADIENT) {
    for (int64_t offset = 0; offset < static_cast<int64_t>(bytes.size()); offset += chunk_bytes) {
      const std::string_view part =
          bytes.substr(static_cast<size_t>(offset), static_cast<size_t>(chunk_bytes));
      absl::StatusOr<ChunkBuffer::Stored> stored = Push(rank, step, tensor, offset, part, kind);
      if (!stored.ok()) return stored.status();
    }
    return absl::OkStatus();
  }
  // Writes `bytes` into rank `rank`'s slot place of `tensor` for `step` and marks them.
  absl::StatusOr<ChunkBuffer::Stored> WriteInPlace(int rank, int64_t step, int tensor,
                                                   std::string_view bytes) {
    absl::StatusOr<SlotPlaces> places = job_.SlotsForStep(rank, step);
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
    return job_.Push(chunk);
  }
  // Commits; runs the step the last commit hands over.
  absl::Status Commit(int rank, int64_t step, std::optional<double> grad_scale) {
    v1::CommitRequest request;
    request.set_job(spec_.job());
    request.set_rank(rank);
    request.set_step(step);
    if (grad_scale) request.set_grad_scale(*grad_scale);
    absl::StatusOr<CommitOutcome> outcome = job_.Commit(request);
    if (!outcome.ok()) return outcome.status();
    if (outcome->work) return RunTakenStep(job_, *outcome->work).failed;
    return absl::OkStatus();
  }

 private:
  const v1::RegisterRequest spec_;
  std::unique_ptr<CpuBackend> backend_;
  Job job_;
};

// Drives one step of a job (pushes and commits, in the case's order).
using StepScript = std::function<void(Driver&, int64_t step)>;

// Every rank pushes every tensor in chunks, rank by rank, then every rank commits.
StepScript PushAllThenCommit(const v1::RegisterRequest& spec, uint64_t seed,
                             std::optional<double> grad_scale) {
  return [spec, seed, grad_scale](Driver& d, int64_t step) {
    const StepGradients grads = RandomGradients(spec, seed + static_cast<uint64_t>(step));
    for (int r = 0; r < spec.world_size(); ++r) {
      for (int i = 0; i < spec.tensors_size(); ++i) {
        ASSERT_TRUE(d.PushTensor(r, step, i, grads[static_cast<size_t>(i)][r], 1000).ok());
      }
    }
    for (int r = 0; r < spec.world_size(); ++r) ASSERT_TRUE(d.Commit(r, step, grad_scale).ok());
  };
}

// Runs `steps` steps of `spec` on a job that checks gradients as they land and on one that checks
// them at the step, and expects the same served bytes, version and outcome of every tensor and
// the same Status after each step. Returns the landed job's backend counters: (tensors read at a
// step, landed checks used).
std::pair<int64_t, int64_t> ExpectSameSteps(const v1::RegisterRequest& spec, int steps,
                                            const StepScript& script, bool placed = false) {
  Driver landed(spec, /*landed=*/true, placed);
  Driver at_step(spec, /*landed=*/false, placed);
  for (int64_t step = 0; step < steps; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    script(landed, step);
    script(at_step, step);
    testing::ExpectSameServed(landed.job(), at_step.job(), spec.tensors_size(), step + 1);
    v1::JobStatus sa = landed.job().Status();
    v1::JobStatus sb = at_step.job().Status();
    sa.clear_last_step_seconds();
    sb.clear_last_step_seconds();
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(sa, sb))
        << sa.DebugString() << "\nvs\n"
        << sb.DebugString();
  }
  // The job without the ability read every tensor at every step.
  EXPECT_EQ(at_step.backend().checked_at_step(), int64_t{steps} * spec.tensors_size());
  EXPECT_EQ(at_step.backend().landed_checks_used(), 0);
  return {landed.backend().checked_at_step(), landed.backend().landed_checks_used()};
}

v1::RegisterRequest JobSpec(int world_size, double max_grad_norm) {
  v1::RegisterRequest spec = MakeSpec("landed", world_size,
                                      {{"scalar", 1, 1, v1::ELEMENT_TYPE_FP32},
                                       {"odd", 7, 13, v1::ELEMENT_TYPE_BF16},
                                       {"panels", 131, 257, v1::ELEMENT_TYPE_FP32},
                                       {"vector", 1, 1000, v1::ELEMENT_TYPE_BF16}});
  spec.set_max_grad_norm(max_grad_norm);
  return spec;
}

TEST(LandedCheckJobTest, FiniteGradientsWithoutClippingNeedNoSecondPass) {
  const v1::RegisterRequest spec = JobSpec(2, 0);
  const auto [read, used] = ExpectSameSteps(spec, 3, PushAllThenCommit(spec, 11, std::nullopt));
  EXPECT_EQ(read, 0);
  EXPECT_EQ(used, 3 * spec.tensors_size());
}

TEST(LandedCheckJobTest, ClippedStepsEqualTheCheckAtTheStep) {
  // A small max_grad_norm: every step is clipped (clip < 1, which Status's last_clip shows equal).
  const v1::RegisterRequest spec = JobSpec(2, 1e-3);
  Driver probe(spec, true, false);
  PushAllThenCommit(spec, 21, std::nullopt)(probe, 0);
  ASSERT_LT(probe.job().Status().last_clip(), 1.0);
  const auto [read, used] = ExpectSameSteps(spec, 3, PushAllThenCommit(spec, 21, std::nullopt));
  EXPECT_EQ(read, 0);
  EXPECT_EQ(used, 3 * spec.tensors_size());
}

TEST(LandedCheckJobTest, AGradScaleFirstSeenAtTheCommitIsCheckedAtThatStepOnly) {
  // Gradients land before any commit of step 0 says its scale: they are checked with the scale
  // of no step before (1), which step 0's 0.25 does not answer, so step 0 reads them again; from
  // step 1 the previous step's scale is the one committed.
  const v1::RegisterRequest spec = JobSpec(2, 1e-3);
  const auto [read, used] = ExpectSameSteps(spec, 3, PushAllThenCommit(spec, 31, 0.25));
  EXPECT_EQ(read, spec.tensors_size());
  EXPECT_EQ(used, 2 * spec.tensors_size());
}

TEST(LandedCheckJobTest, ARankThatCommittedFirstGivesTheScaleOfTheGradientsStillToLand) {
  // Rank 0 pushes and commits (scale 0.5, then 3 at step 1) before rank 1 pushes anything: the
  // tensors complete with rank 1's pushes, checked with the committed scale.
  const v1::RegisterRequest spec = JobSpec(2, 1e-3);
  const auto script = [&spec](Driver& d, int64_t step) {
    const double scale = step == 0 ? 0.5 : 3.0;
    const StepGradients grads = RandomGradients(spec, 41 + static_cast<uint64_t>(step));
    for (int i = 0; i < spec.tensors_size(); ++i) {
      ASSERT_TRUE(d.PushTensor(0, step, i, grads[static_cast<size_t>(i)][0], 512).ok());
    }
    ASSERT_TRUE(d.Commit(0, step, scale).ok());
    for (int i = spec.tensors_size() - 1; i >= 0; --i) {
      ASSERT_TRUE(d.PushTensor(1, step, i, grads[static_cast<size_t>(i)][1], 512).ok());
    }
    ASSERT_TRUE(d.Commit(1, step, scale).ok());
  };
  const auto [read, used] = ExpectSameSteps(spec, 2, script);
  EXPECT_EQ(read, 0);
  EXPECT_EQ(used, 2 * spec.tensors_size());
}

TEST(LandedCheckJobTest, ANonFiniteGradientInOneTensorSkipsTheStepAlike) {
  for (float bad : {kNaN, kInf, 4e19f}) {
    SCOPED_TRACE(bad);
    const v1::RegisterRequest spec = JobSpec(2, 1e-3);
    const auto script = [&spec, bad](Driver& d, int64_t step) {
      StepGradients grads = RandomGradients(spec, 51 + static_cast<uint64_t>(step));
      if (step == 1) {
        // Element 4000 of rank 1's "panels" (FP32).
        std::memcpy(grads[2][1].data() + 4 * 4000, &bad, 4);
      }
      for (int r = 0; r < spec.world_size(); ++r) {
        for (int i = 0; i < spec.tensors_size(); ++i) {
          ASSERT_TRUE(d.PushTensor(r, step, i, grads[static_cast<size_t>(i)][r], 4096).ok());
        }
      }
      for (int r = 0; r < spec.world_size(); ++r) ASSERT_TRUE(d.Commit(r, step, 0.5).ok());
    };
    Driver probe(spec, true, false);
    script(probe, 0);
    script(probe, 1);
    EXPECT_EQ(probe.job().Status().skipped_steps(), 1);
    ExpectSameSteps(spec, 3, script);
  }
}

TEST(LandedCheckJobTest, ThreeRanksPushingInAnyOrderAndInChunks) {
  const v1::RegisterRequest spec = JobSpec(3, 2e-3);
  const auto script = [&spec](Driver& d, int64_t step) {
    const StepGradients grads = RandomGradients(spec, 61 + static_cast<uint64_t>(step));
    // Chunk by chunk, ranks interleaved from the last; tensors from the last.
    constexpr int64_t kChunk = 256;
    for (int64_t offset = 0;; offset += kChunk) {
      bool any = false;
      for (int i = spec.tensors_size() - 1; i >= 0; --i) {
        for (int r = spec.world_size() - 1; r >= 0; --r) {
          const std::string& bytes = grads[static_cast<size_t>(i)][r];
          if (offset >= static_cast<int64_t>(bytes.size())) continue;
          any = true;
          const std::string_view part = std::string_view(bytes).substr(static_cast<size_t>(offset),
                                                                       static_cast<size_t>(kChunk));
          ASSERT_TRUE(d.Push(r, step, i, offset, part).ok());
        }
      }
      if (!any) break;
    }
    for (int r : {2, 0, 1}) ASSERT_TRUE(d.Commit(r, step, 1.0).ok());
  };
  const auto [read, used] = ExpectSameSteps(spec, 3, script);
  EXPECT_EQ(read, 0);
  EXPECT_EQ(used, 3 * spec.tensors_size());
}

TEST(LandedCheckJobTest, AGradientPushedTwiceKeepsItsLandedCheck) {
  const v1::RegisterRequest spec = JobSpec(2, 1e-3);
  const auto script = [&spec](Driver& d, int64_t step) {
    const StepGradients grads = RandomGradients(spec, 71 + static_cast<uint64_t>(step));
    for (int r = 0; r < spec.world_size(); ++r) {
      for (int i = 0; i < spec.tensors_size(); ++i) {
        ASSERT_TRUE(d.PushTensor(r, step, i, grads[static_cast<size_t>(i)][r], 2000).ok());
      }
    }
    // A retry of every chunk once every tensor landed, and again after a commit: the same bytes,
    // acknowledged without effect.
    for (int i = 0; i < spec.tensors_size(); ++i) {
      ASSERT_TRUE(d.PushTensor(0, step, i, grads[static_cast<size_t>(i)][0], 2000).ok());
    }
    ASSERT_TRUE(d.Commit(1, step, std::nullopt).ok());
    for (int i = 0; i < spec.tensors_size(); ++i) {
      ASSERT_TRUE(d.PushTensor(1, step, i, grads[static_cast<size_t>(i)][1], 2000).ok());
    }
    ASSERT_TRUE(d.Commit(0, step, std::nullopt).ok());
  };
  const auto [read, used] = ExpectSameSteps(spec, 2, script);
  EXPECT_EQ(read, 0);
  EXPECT_EQ(used, 2 * spec.tensors_size());
}

TEST(LandedCheckJobTest, PreReducedGradientsAreCheckedAsTheyLand) {
  v1::RegisterRequest spec = JobSpec(3, 1e-3);
  spec.set_push_mode(v1::PUSH_MODE_PRE_REDUCED);
  const auto script = [&spec](Driver& d, int64_t step) {
    const StepGradients grads = RandomGradients(spec, 81 + static_cast<uint64_t>(step));
    // Rank 0 pushes the reduced gradients; every rank commits.
    for (int i = 0; i < spec.tensors_size(); ++i) {
      ASSERT_TRUE(d.PushTensor(0, step, i, grads[static_cast<size_t>(i)][0], 1000).ok());
    }
    for (int r = 0; r < spec.world_size(); ++r) ASSERT_TRUE(d.Commit(r, step, std::nullopt).ok());
  };
  const auto [read, used] = ExpectSameSteps(spec, 2, script);
  EXPECT_EQ(read, 0);
  EXPECT_EQ(used, 2 * spec.tensors_size());
}

TEST(LandedCheckJobTest, AnInPlaceRangeMarkedAgainIsCheckedAtTheStep) {
  // Ranks write their slots in place and mark them. Rank 1 then writes "panels" anew (four times
  // the values: another clip) and marks the same range again, which the daemon cannot tell from a
  // retry: the step reads the bytes as they are then, so that tensor's landed check is not used.
  const v1::RegisterRequest spec = JobSpec(2, 1e-3);
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
    for (int r = 0; r < spec.world_size(); ++r) ASSERT_TRUE(d.Commit(r, step, std::nullopt).ok());
  };
  const auto [read, used] = ExpectSameSteps(spec, 2, script, /*placed=*/true);
  EXPECT_EQ(read, 2);
  EXPECT_EQ(used, 2 * (spec.tensors_size() - 1));
}

}  // namespace
}  // namespace paramd
