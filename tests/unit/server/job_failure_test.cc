// A failure stays in its job: a backend error during a step fails that job (its trainers get the
// status on their next call, its waiting pulls end, Status shows it, DeleteJob frees it) while
// every other job of the daemon goes on; a backend that is itself unusable (a sticky CUDA error)
// fails every job and refuses new ones. The faults come from a CpuBackend whose Step fails when
// told to.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/config.h"
#include "common/error_reason.h"
#include "server/backend/cpu_backend.h"
#include "server/daemon.h"
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

class FaultyBackend final : public CpuBackend {
 public:
  FaultyBackend() : CpuBackend(1) {}

  absl::Status ApplyStep(std::span<TensorStep> tensors, const StepScalars& scalars,
                         const std::function<void(size_t)>& tensor_done) override {
    if (fail_next_.exchange(false)) {
      if (break_backend_) {
        absl::MutexLock lock(&mu_);
        unusable_ = absl::InternalError("backend cpu is unusable (injected)");
      }
      return absl::ResourceExhaustedError("out of device memory for the step (injected)");
    }
    return CpuBackend::ApplyStep(tensors, scalars, tensor_done);
  }
  absl::Status Health() override {
    absl::MutexLock lock(&mu_);
    return unusable_;
  }

  void FailNextStep(bool break_backend) {
    break_backend_ = break_backend;
    fail_next_ = true;
  }

 private:
  std::atomic<bool> fail_next_{false};
  bool break_backend_ = false;
  absl::Mutex mu_;
  absl::Status unusable_ ABSL_GUARDED_BY(mu_);
};

class JobFailureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    v1::DaemonConfig config;
    config.set_shared_memory(false);
    config.set_memory_budget_bytes(int64_t{1} << 30);
    auto backend = std::make_unique<FaultyBackend>();
    backend_ = backend.get();
    absl::StatusOr<std::unique_ptr<Daemon>> daemon =
        Daemon::CreateWithBackend(WithDefaults(config), std::move(backend));
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = *std::move(daemon);
    for (const std::string name : {"a", "b"}) {
      const v1::RegisterRequest spec = Spec(name);
      ASSERT_TRUE(daemon_->Register(ForRank(spec, 0)).ok());
      v1::PushChunk chunk;
      chunk.set_job(name);
      chunk.set_kind(v1::PUSH_KIND_INITIAL_WEIGHTS);
      chunk.set_tensor("w");
      chunk.set_data(ToBytes(RandomWeights(spec, 1)[0]));
      ASSERT_TRUE(Find(name)->Push(chunk).ok());
    }
  }

  static v1::RegisterRequest Spec(const std::string& name) {
    return MakeSpec(name, 1, {{"w", 8, 16}});
  }
  std::shared_ptr<Job> Find(const std::string& name) {
    return daemon_->registry().Find(name).value();
  }
  v1::PushChunk Gradient(const std::string& job, int64_t step) {
    v1::PushChunk chunk;
    chunk.set_job(job);
    chunk.set_step(step);
    chunk.set_tensor("w");
    chunk.set_data(RandomGradients(Spec(job), 7 + static_cast<uint64_t>(step))[0][0]);
    return chunk;
  }
  v1::CommitRequest CommitOf(const std::string& job, int64_t step) {
    v1::CommitRequest commit;
    commit.set_job(job);
    commit.set_step(step);
    return commit;
  }
  // Pushes and commits `step` of `job` and lets the daemon run it.
  absl::Status RunStep(const std::string& job, int64_t step) {
    std::shared_ptr<Job> j = Find(job);
    if (absl::StatusOr<ChunkBuffer::Stored> s = j->Push(Gradient(job, step)); !s.ok()) {
      return s.status();
    }
    absl::StatusOr<CommitOutcome> outcome = j->Commit(CommitOf(job, step));
    if (!outcome.ok()) return outcome.status();
    daemon_->StartStep(j, *outcome->work);
    daemon_->WaitForSteps();
    return absl::OkStatus();
  }

  FaultyBackend* backend_ = nullptr;
  std::unique_ptr<Daemon> daemon_;
};

TEST_F(JobFailureTest, ABackendErrorFailsItsJobAloneAndItsTrainersGetTheStatus) {
  std::shared_ptr<Job> a = Find("a");
  // A pull of a's version 1, waiting when the step fails: it is woken and finds no version.
  absl::Notification woken;
  ASSERT_NE(a->AddWaiter(0, 1, [&] { woken.Notify(); }), 0u);

  backend_->FailNextStep(/*break_backend=*/false);
  ASSERT_TRUE(RunStep("a", 0).ok());
  EXPECT_TRUE(woken.HasBeenNotified());
  EXPECT_EQ(a->Served(0, 1), nullptr);
  EXPECT_EQ(a->Served(0, 0), nullptr);  // a failed job serves nothing (its state may be torn)
  EXPECT_EQ(a->AddWaiter(0, 1, [] {}), 0u);
  // Every call names the failure, with the backend's own code.
  EXPECT_TRUE(HasStatus(a->CheckUsable(), absl::StatusCode::kResourceExhausted,
                        "job \"a\" failed at step 0: out of device memory for the step"));
  EXPECT_TRUE(HasStatus(a->Push(Gradient("a", 1)), absl::StatusCode::kResourceExhausted,
                        "failed at step 0"));
  EXPECT_TRUE(HasStatus(a->Commit(CommitOf("a", 1)), absl::StatusCode::kResourceExhausted,
                        "failed at step 0"));
  EXPECT_EQ(ReasonOf(a->CheckUsable()), v1::ERROR_REASON_JOB_FAILED);
  EXPECT_TRUE(HasStatus(daemon_->Register(ForRank(Spec("a"), 0)),
                        absl::StatusCode::kResourceExhausted, "delete it"));
  const v1::StatusResponse status = daemon_->Status("a");
  ASSERT_EQ(status.jobs_size(), 1);
  EXPECT_EQ(status.jobs(0).state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(status.jobs(0).failure().code(),
            static_cast<int32_t>(absl::StatusCode::kResourceExhausted));
  EXPECT_FALSE(status.has_backend_failure());

  // The other job steps on, several times.
  for (int64_t step = 0; step < 3; ++step) ASSERT_TRUE(RunStep("b", step).ok());
  EXPECT_NE(Find("b")->Served(0, 3), nullptr);
  EXPECT_EQ(daemon_->Status("b").jobs(0).state(), v1::JOB_STATE_ACTIVE);

  // Deleting the failed job gives its budget back.
  const int64_t reserved = daemon_->memory_budget().used().host;
  absl::StatusOr<MemoryBytes> released = daemon_->DeleteJob("a");
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_GT(released->host, 0);
  a.reset();
  EXPECT_EQ(daemon_->memory_budget().used().host, reserved - released->host);
  EXPECT_TRUE(HasStatus(daemon_->registry().Find("a"), absl::StatusCode::kNotFound));
  // And the name can be registered again, from scratch.
  EXPECT_TRUE(daemon_->Register(ForRank(Spec("a"), 0)).ok());
}

TEST_F(JobFailureTest, AnUnusableBackendFailsEveryJobAndRefusesNewOnes) {
  backend_->FailNextStep(/*break_backend=*/true);
  ASSERT_TRUE(RunStep("a", 0).ok());
  EXPECT_TRUE(HasStatus(Find("a")->CheckUsable(), absl::StatusCode::kResourceExhausted,
                        "failed at step 0"));
  // b never stepped, yet its backend cannot step any more.
  EXPECT_TRUE(HasStatus(Find("b")->CheckUsable(), absl::StatusCode::kInternal, "unusable"));
  EXPECT_TRUE(
      HasStatus(Find("b")->Push(Gradient("b", 0)), absl::StatusCode::kInternal, "unusable"));
  EXPECT_TRUE(
      HasStatus(daemon_->Register(ForRank(Spec("c"), 0)), absl::StatusCode::kInternal, "unusable"));
  EXPECT_EQ(ReasonOf(Find("b")->CheckUsable()), v1::ERROR_REASON_BACKEND_UNUSABLE);
  const v1::StatusResponse status = daemon_->Status("");
  EXPECT_TRUE(status.has_backend_failure());
  for (const v1::JobStatus& job : status.jobs()) EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
}

}  // namespace
}  // namespace paramd
