// Checkpoints across backends (label gpu; skips with the reason without a GPU): the backends are
// bit-identical, so a job checkpointed on a cpu daemon and restored on cuda:0, or checkpointed on
// cuda:0 and restored on cpu, serves the checkpoint's bytes and trains on bit for bit like the
// daemon that wrote it. fp8 moments rounded stochastically, every serve format, clipping, two
// ranks with fp32 and bf16 gradients. The same harness from cpu to cpu runs on any machine.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "kernels/cuda_step.h"
#include "server/checkpoints.h"
#include "server/daemon.h"
#include "tests/unit/server/policy_cases.h"
#include "tests/unit/server/reference_job.h"

namespace paramd {
namespace {

using testing::Cases;
using testing::ForRank;
using testing::PolicySpec;
using testing::PolicyWeights;
using testing::RandomGradients;
using testing::StepLr;
using testing::ToBytes;

v1::RegisterRequest Spec() {
  for (const testing::PolicyCase& c : Cases()) {
    if (c.name == "Fp8BothWithDefaultRounding") {
      v1::RegisterRequest spec = PolicySpec(c);
      spec.set_max_grad_norm(0.05);
      return spec;
    }
  }
  return {};
}

class CudaCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/paramd-cuda-checkpoints-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    root_ = pattern;
  }
  void TearDown() override {
    if (!root_.empty()) std::filesystem::remove_all(root_);
  }

  std::unique_ptr<Daemon> MakeDaemon(const std::string& backend) {
    v1::DaemonConfig config;
    config.set_backend(backend);
    config.set_shared_memory(false);
    config.set_checkpoint_dir(root_);
    config.set_keep_checkpoints(10);
    config.set_memory_budget_bytes(int64_t{1} << 34);
    absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Create(WithDefaults(config));
    EXPECT_TRUE(daemon.ok()) << daemon.status();
    return daemon.ok() ? *std::move(daemon) : nullptr;
  }

  // Registers the job's ranks and uploads its initial weights.
  void StartJob(Daemon& daemon) {
    for (int r = 0; r < spec_.world_size(); ++r) {
      absl::StatusOr<v1::RegisterResponse> registered = daemon.Register(ForRank(spec_, r));
      ASSERT_TRUE(registered.ok()) << registered.status();
    }
    const std::vector<std::vector<float>> weights = PolicyWeights(spec_);
    for (int i = 0; i < spec_.tensors_size(); ++i) {
      v1::PushChunk chunk;
      chunk.set_job(spec_.job());
      chunk.set_kind(v1::PUSH_KIND_INITIAL_WEIGHTS);
      chunk.set_tensor(spec_.tensors(i).name());
      chunk.set_data(ToBytes(weights[static_cast<size_t>(i)]));
      ASSERT_TRUE(Find(daemon)->Push(chunk).ok());
    }
  }

  std::shared_ptr<Job> Find(Daemon& daemon) { return daemon.registry().Find(spec_.job()).value(); }

  // Every rank pushes `step`'s gradients and commits; the step runs on the daemon's executor.
  void RunStep(Daemon& daemon, int64_t step) {
    std::shared_ptr<Job> job = Find(daemon);
    const auto grads = RandomGradients(spec_, 300 + static_cast<uint64_t>(step));
    for (int r = 0; r < spec_.world_size(); ++r) {
      for (int i = 0; i < spec_.tensors_size(); ++i) {
        v1::PushChunk chunk;
        chunk.set_job(spec_.job());
        chunk.set_rank(r);
        chunk.set_step(step);
        chunk.set_tensor(spec_.tensors(i).name());
        chunk.set_data(grads[static_cast<size_t>(i)][static_cast<size_t>(r)]);
        ASSERT_TRUE(job->Push(chunk).ok());
      }
    }
    for (int r = 0; r < spec_.world_size(); ++r) {
      v1::CommitRequest commit;
      commit.set_job(spec_.job());
      commit.set_rank(r);
      commit.set_step(step);
      if (std::optional<double> lr = StepLr(step)) commit.set_lr(*lr);
      absl::StatusOr<CommitOutcome> outcome = job->Commit(commit);
      ASSERT_TRUE(outcome.ok()) << outcome.status();
      if (outcome->work) daemon.StartStep(job, *outcome->work);
    }
    daemon.WaitForSteps();
    ASSERT_TRUE(job->CheckUsable().ok()) << job->CheckUsable();
  }

  // Every format's bytes of every tensor at the newest version, which must be `version`.
  std::vector<std::vector<uint8_t>> Served(Daemon& daemon, int64_t version) {
    std::shared_ptr<Job> job = Find(daemon);
    std::vector<std::vector<uint8_t>> out;
    for (int i = 0; i < spec_.tensors_size(); ++i) {
      std::shared_ptr<const ServedTensor> served = job->Served(i, version);
      EXPECT_NE(served, nullptr) << spec_.tensors(i).name() << " has no version " << version;
      if (served == nullptr) return out;
      EXPECT_EQ(served->version, version);
      EXPECT_TRUE(daemon.ReadyHostBytes(*served).ok());
      for (const ServedFormat& f : served->formats) out.push_back(f.bytes.ToVector());
    }
    return out;
  }

  // `from` trains 3 steps and writes a checkpoint; `to` restores it (registering the job from the
  // manifest) and both train 3 more steps: the same bytes at the checkpoint and after each step.
  void CheckpointAndRestoreAcross(const std::string& from_backend, const std::string& to_backend) {
    std::unique_ptr<Daemon> from = MakeDaemon(from_backend);
    ASSERT_NE(from, nullptr);
    StartJob(*from);
    for (int64_t step = 0; step < 3; ++step) RunStep(*from, step);
    absl::StatusOr<v1::CheckpointResponse> written = Checkpoints(from.get()).Write(spec_.job());
    ASSERT_TRUE(written.ok()) << written.status();
    EXPECT_EQ(written->version(), 3);

    std::unique_ptr<Daemon> to = MakeDaemon(to_backend);
    ASSERT_NE(to, nullptr);
    absl::StatusOr<v1::RestoreResponse> restored =
        Checkpoints(to.get()).Restore(spec_.job(), written->path());
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_TRUE(restored->registered());
    EXPECT_EQ(restored->version(), 3);
    for (int r = 0; r < spec_.world_size(); ++r) {
      absl::StatusOr<v1::RegisterResponse> again = to->Register(ForRank(spec_, r));
      ASSERT_TRUE(again.ok()) << again.status();
      EXPECT_EQ(again->next_step(), 3);
    }
    EXPECT_EQ(Served(*to, 3), Served(*from, 3)) << from_backend << " -> " << to_backend;
    for (int64_t step = 3; step < 6; ++step) {
      RunStep(*from, step);
      RunStep(*to, step);
      ASSERT_EQ(Served(*to, step + 1), Served(*from, step + 1))
          << from_backend << " -> " << to_backend << ", after step " << step;
    }
  }

  const v1::RegisterRequest spec_ = Spec();
  std::string root_;
};

// The harness itself, on any machine: cpu to another cpu daemon.
TEST_F(CudaCheckpointTest, ACpuCheckpointRestoredOnAnotherCpuDaemonTrainsOnBitIdentically) {
  CheckpointAndRestoreAcross("cpu", "cpu");
}

TEST_F(CudaCheckpointTest, ACpuCheckpointRestoredOnCudaTrainsOnBitIdentically) {
  std::string why;
  if (!kernels::CudaDeviceAvailable(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  CheckpointAndRestoreAcross("cpu", "cuda:0");
}

TEST_F(CudaCheckpointTest, ACudaCheckpointRestoredOnCpuTrainsOnBitIdentically) {
  std::string why;
  if (!kernels::CudaDeviceAvailable(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  CheckpointAndRestoreAcross("cuda:0", "cpu");
}

}  // namespace
}  // namespace paramd
