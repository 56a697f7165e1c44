// The daemon on cuda:0 (label gpu; skips with the reason without a GPU), in this process: its
// GPU memory budget refuses a job past it at Register; a job whose step cannot get GPU memory
// fails alone while another job of the daemon steps on, and DeleteJob frees it; a sticky CUDA
// error (an illegal address, for real) fails every job of the backend and refuses new ones.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "kernels/cuda_step.h"
#include "server/daemon.h"
#include "server/job/job_memory.h"
#include "tests/gpu/sticky_fault.h"
#include "tests/unit/server/reference_job.h"
#include "tests/unit/server/status_assertions.h"

namespace paramd {
namespace {

using testing::ForRank;
using testing::HasStatus;
using testing::MakeSpec;
using testing::RandomGradients;
using testing::RandomWeights;
using testing::ToBytes;

class CudaDaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!kernels::CudaDeviceAvailable(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
    v1::DaemonConfig config;
    config.set_backend("cuda:0");
    config.set_shared_memory(false);
    // The host budget past any job here, so that the GPU's is the one that refuses.
    config.set_memory_budget_bytes(int64_t{1} << 50);
    absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Create(WithDefaults(config));
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = *std::move(daemon);
  }
  void TearDown() override {
    for (void* p : hog_) cudaFree(p);
  }

  static v1::RegisterRequest Spec(const std::string& name, int64_t rows = 256) {
    return MakeSpec(name, 1, {{"w", rows, 1024}});
  }
  std::shared_ptr<Job> Find(const std::string& name) {
    return daemon_->registry().Find(name).value();
  }
  absl::Status Start(const std::string& name) {
    const v1::RegisterRequest spec = Spec(name);
    if (absl::StatusOr<v1::RegisterResponse> r = daemon_->Register(ForRank(spec, 0)); !r.ok()) {
      return r.status();
    }
    v1::PushChunk chunk;
    chunk.set_job(name);
    chunk.set_kind(v1::PUSH_KIND_INITIAL_WEIGHTS);
    chunk.set_tensor("w");
    const std::string weights = ToBytes(RandomWeights(spec, 5)[0]);
    for (size_t offset = 0; offset < weights.size(); offset += 1 << 20) {
      chunk.set_offset(static_cast<int64_t>(offset));
      chunk.set_data(weights.substr(offset, 1 << 20));
      if (absl::StatusOr<ChunkBuffer::Stored> s = Find(name)->Push(chunk); !s.ok()) {
        return s.status();
      }
    }
    return absl::OkStatus();
  }
  // Pushes, commits and runs `step` of `name` on the daemon's executor.
  absl::Status RunStep(const std::string& name, int64_t step) {
    std::shared_ptr<Job> job = Find(name);
    const std::string grad = RandomGradients(Spec(name), 40 + static_cast<uint64_t>(step))[0][0];
    v1::PushChunk chunk;
    chunk.set_job(name);
    chunk.set_step(step);
    chunk.set_tensor("w");
    for (size_t offset = 0; offset < grad.size(); offset += 1 << 20) {
      chunk.set_offset(static_cast<int64_t>(offset));
      chunk.set_data(grad.substr(offset, 1 << 20));
      if (absl::StatusOr<ChunkBuffer::Stored> s = job->Push(chunk); !s.ok()) return s.status();
    }
    v1::CommitRequest commit;
    commit.set_job(name);
    commit.set_step(step);
    absl::StatusOr<CommitOutcome> outcome = job->Commit(commit);
    if (!outcome.ok()) return outcome.status();
    daemon_->StartStep(job, *outcome->work);
    daemon_->WaitForSteps();
    return absl::OkStatus();
  }
  // Takes every byte of GPU memory it can get, in chunks down to 1 MiB.
  void HogTheGpu() {
    for (size_t chunk = size_t{1} << 34; chunk >= (size_t{1} << 20); chunk /= 2) {
      void* p = nullptr;
      while (cudaMalloc(&p, chunk) == cudaSuccess) hog_.push_back(p);
      cudaGetLastError();
    }
    size_t free = 0, total = 0;
    ASSERT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
    std::printf("the test holds %zu allocations; %zu MiB of the GPU free\n", hog_.size(),
                free >> 20);
  }

  std::unique_ptr<Daemon> daemon_;
  std::vector<void*> hog_;
};

TEST_F(CudaDaemonTest, AJobPastTheGpuBudgetIsRefusedAtRegister) {
  const int64_t budget = daemon_->memory_budget().limit().device;
  size_t free = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  EXPECT_GT(budget, 0);
  EXPECT_LE(budget, static_cast<int64_t>(free));
  // Half the GPU's memory in FP32 elements: 12 B of state each is past it.
  const int64_t rows = static_cast<int64_t>(total / 2 / 4 / 4096);
  const v1::RegisterRequest big = MakeSpec("big", 1, {{"w", rows, 4096}});
  const MemoryBytes needs = JobFootprint(big, BackendPlacement{true});
  EXPECT_GT(needs.device, budget);
  EXPECT_TRUE(HasStatus(daemon_->Register(big), absl::StatusCode::kResourceExhausted,
                        absl::StrCat("needs up to ", needs.device, " bytes of GPU memory")));
  EXPECT_TRUE(HasStatus(daemon_->Register(big), absl::StatusCode::kResourceExhausted,
                        "device_memory_budget_bytes"));
  EXPECT_EQ(daemon_->memory_budget().used().device, 0);
  ASSERT_TRUE(Start("small").ok());
  EXPECT_EQ(daemon_->memory_budget().used().device,
            JobFootprint(Spec("small"), BackendPlacement{true}).device);
}

TEST_F(CudaDaemonTest, AJobWhoseStepFindsTheGpuFullFailsAloneAndTheOtherStepsOn) {
  ASSERT_TRUE(Start("a").ok());
  ASSERT_TRUE(RunStep("a", 0).ok());  // a's buffers all exist now
  ASSERT_TRUE(Find("a")->CheckUsable().ok());
  ASSERT_TRUE(Start("b").ok());  // state and served version 0, no step yet
  HogTheGpu();                   // another process's allocations, say
  ASSERT_TRUE(RunStep("b", 0).ok());
  EXPECT_TRUE(HasStatus(Find("b")->CheckUsable(), absl::StatusCode::kResourceExhausted,
                        "job \"b\" failed at step 0"));
  EXPECT_EQ(daemon_->Status("b").jobs(0).state(), v1::JOB_STATE_FAILED);
  EXPECT_TRUE(daemon_->backend_health().ok()) << "an allocation failure broke the backend";
  // a steps on with the GPU full: its steps allocate nothing.
  for (int64_t step = 1; step <= 3; ++step) {
    ASSERT_TRUE(RunStep("a", step).ok());
    ASSERT_TRUE(Find("a")->CheckUsable().ok()) << Find("a")->CheckUsable();
  }
  EXPECT_NE(Find("a")->Served(0, 4), nullptr);
  // Deleting b gives its budget back.
  const int64_t before = daemon_->memory_budget().used().device;
  absl::StatusOr<MemoryBytes> released = daemon_->DeleteJob("b");
  ASSERT_TRUE(released.ok());
  EXPECT_EQ(daemon_->memory_budget().used().device, before - released->device);
}

TEST_F(CudaDaemonTest, AStickyCudaErrorFailsEveryJobOfTheBackend) {
  ASSERT_TRUE(Start("a").ok());
  ASSERT_TRUE(RunStep("a", 0).ok());
  ASSERT_TRUE(Start("b").ok());
  // The context is broken from here on, for every stream of this process.
  ASSERT_NE(testing::LaunchIllegalAddressFault(), cudaSuccess);
  ASSERT_TRUE(RunStep("a", 1).ok());
  EXPECT_FALSE(Find("a")->CheckUsable().ok());
  EXPECT_TRUE(HasStatus(Find("b")->CheckUsable(), absl::StatusCode::kInternal,
                        "backend cuda:0 is unusable"));
  EXPECT_TRUE(HasStatus(daemon_->Register(ForRank(Spec("c"), 0)), absl::StatusCode::kInternal,
                        "Restart the daemon"));
  EXPECT_TRUE(daemon_->Status("").has_backend_failure());
}

}  // namespace
}  // namespace paramd
