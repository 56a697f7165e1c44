// JobRegistry: the first registration creates a job, later ones must repeat it (a mismatch is
// FAILED_PRECONDITION and changes nothing), and the daemon's limits are RESOURCE_EXHAUSTED.
#include "server/registry.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "server/backend/cpu_backend.h"
#include "tests/unit/server/job_harness.h"
#include "tests/unit/server/reference_job.h"

namespace paramd {
namespace {

using testing::ForRank;
using testing::HasStatus;
using testing::MakeSpec;

v1::RegisterRequest Spec(const std::string& job = "reg") {
  return MakeSpec(job, 3, {{"w", 4, 8, v1::ELEMENT_TYPE_FP32}, {"b", 1, 8, v1::ELEMENT_TYPE_BF16}});
}

class JobRegistryTest : public ::testing::Test {
 protected:
  explicit JobRegistryTest(RegistryLimits limits = {})
      : backend_(1), registry_(&backend_, limits) {}

  CpuBackend backend_;
  JobRegistry registry_;
};

TEST_F(JobRegistryTest, FirstRegistrationCreatesTheJob) {
  absl::StatusOr<v1::RegisterResponse> response = registry_.Register(ForRank(Spec(), 1));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->next_step(), 0);
  EXPECT_EQ(response->version(), -1);  // no initial weights yet
  EXPECT_EQ(response->max_chunk_bytes(), RegistryLimits{}.max_chunk_bytes);
  absl::StatusOr<std::shared_ptr<Job>> job = registry_.Find("reg");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ((*job)->world_size(), 3);
  EXPECT_EQ((*job)->registered_ranks(), 1);
  EXPECT_EQ(registry_.trainers(), 1);
}

TEST_F(JobRegistryTest, RegistrationIsIdempotentAndCountsEachRankOnce) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    for (int r = 0; r < 3; ++r) ASSERT_TRUE(registry_.Register(ForRank(Spec(), r)).ok());
  }
  EXPECT_EQ(registry_.Jobs().size(), 1u);
  EXPECT_EQ(registry_.trainers(), 3);
}

TEST_F(JobRegistryTest, UnknownJobIsNotFound) {
  EXPECT_TRUE(HasStatus(registry_.Find("nope"), absl::StatusCode::kNotFound, "no job \"nope\""));
}

TEST_F(JobRegistryTest, InvalidRegistrationCreatesNoJob) {
  v1::RegisterRequest bad = Spec();
  bad.mutable_tensors(0)->set_rows(0);
  EXPECT_TRUE(HasStatus(registry_.Register(bad), absl::StatusCode::kInvalidArgument, "shape"));
  EXPECT_TRUE(registry_.Jobs().empty());
}

// One way a later registration can differ from the job's.
struct Mismatch {
  std::string name;
  std::function<void(v1::RegisterRequest&)> mutate;
};
// Test output names the case, not the bytes of its function object.
void PrintTo(const Mismatch& c, std::ostream* os) { *os << c.name; }

class JobRegistryMismatchTest : public JobRegistryTest,
                                public ::testing::WithParamInterface<Mismatch> {};

TEST_P(JobRegistryMismatchTest, MismatchingReRegistrationIsFailedPreconditionAndChangesNothing) {
  ASSERT_TRUE(registry_.Register(ForRank(Spec(), 0)).ok());
  const v1::JobStatus before = registry_.Find("reg").value()->Status();
  v1::RegisterRequest other = ForRank(Spec(), 1);
  GetParam().mutate(other);
  EXPECT_TRUE(HasStatus(registry_.Register(other), absl::StatusCode::kFailedPrecondition,
                        "already registered with a different description"));
  std::shared_ptr<Job> job = registry_.Find("reg").value();
  EXPECT_TRUE(testing::SameStatus(job->Status(), before));
  EXPECT_EQ(job->registered_ranks(), 1);  // rank 1 was not registered
  // The same rank with the right description still registers.
  EXPECT_TRUE(registry_.Register(ForRank(Spec(), 1)).ok());
}

INSTANTIATE_TEST_SUITE_P(
    EveryField, JobRegistryMismatchTest,
    ::testing::Values(
        Mismatch{"Shape", [](v1::RegisterRequest& r) { r.mutable_tensors(0)->set_cols(9); }},
        Mismatch{"GradType",
                 [](v1::RegisterRequest& r) {
                   r.mutable_tensors(1)->set_grad_type(v1::ELEMENT_TYPE_FP32);
                 }},
        Mismatch{"TensorName", [](v1::RegisterRequest& r) { r.mutable_tensors(1)->set_name("c"); }},
        Mismatch{"TensorOrder",
                 [](v1::RegisterRequest& r) { r.mutable_tensors()->SwapElements(0, 1); }},
        Mismatch{"ExtraTensor",
                 [](v1::RegisterRequest& r) {
                   v1::TensorSpec* t = r.add_tensors();
                   t->set_name("extra");
                   t->set_rows(1);
                   t->set_cols(1);
                   t->set_grad_type(v1::ELEMENT_TYPE_FP32);
                 }},
        Mismatch{"WorldSize", [](v1::RegisterRequest& r) { r.set_world_size(4); }},
        Mismatch{"Lr", [](v1::RegisterRequest& r) { r.mutable_hyperparams()->set_lr(2e-3); }},
        Mismatch{"Serve", [](v1::RegisterRequest& r) { r.clear_serve(); }},
        Mismatch{"Seed", [](v1::RegisterRequest& r) { r.set_seed(1); }}),
    [](const ::testing::TestParamInfo<Mismatch>& info) { return info.param.name; });

TEST_F(JobRegistryTest, ReRegistrationSpellingOutDefaultsMatches) {
  ASSERT_TRUE(registry_.Register(ForRank(Spec(), 0)).ok());
  v1::RegisterRequest explicit_defaults = ForRank(Spec(), 1);
  explicit_defaults.mutable_state_policy()->set_master(v1::MASTER_TYPE_FP32);
  explicit_defaults.set_push_mode(v1::PUSH_MODE_FULL);
  explicit_defaults.mutable_serve(0)->set_direction(v1::DIRECTION_ROWWISE);
  EXPECT_TRUE(registry_.Register(explicit_defaults).ok());
}

class JobRegistryLimitsTest : public JobRegistryTest {
 protected:
  static RegistryLimits Limits() {
    RegistryLimits limits;
    limits.max_jobs = 2;
    limits.max_tensors_per_job = 2;
    limits.max_job_bytes = JobRegistry::JobBytes(Spec());
    limits.max_chunk_bytes = 8192;
    return limits;
  }
  JobRegistryLimitsTest() : JobRegistryTest(Limits()) {}
};

TEST_F(JobRegistryLimitsTest, RegisterReportsTheDaemonsChunkLimit) {
  EXPECT_EQ(registry_.Register(Spec()).value().max_chunk_bytes(), 8192);
}

TEST_F(JobRegistryLimitsTest, MaxJobsIsResourceExhausted) {
  ASSERT_TRUE(registry_.Register(Spec("a")).ok());
  ASSERT_TRUE(registry_.Register(Spec("b")).ok());
  EXPECT_TRUE(
      HasStatus(registry_.Register(Spec("c")), absl::StatusCode::kResourceExhausted, "max_jobs"));
  EXPECT_EQ(registry_.Jobs().size(), 2u);
  EXPECT_TRUE(HasStatus(registry_.Find("c"), absl::StatusCode::kNotFound));
  // Existing jobs still take their other ranks.
  EXPECT_TRUE(registry_.Register(ForRank(Spec("a"), 2)).ok());
}

TEST_F(JobRegistryLimitsTest, MaxTensorsPerJobIsResourceExhausted) {
  v1::RegisterRequest big = Spec();
  v1::TensorSpec* t = big.add_tensors();
  t->set_name("third");
  t->set_rows(1);
  t->set_cols(1);
  t->set_grad_type(v1::ELEMENT_TYPE_FP32);
  EXPECT_TRUE(HasStatus(registry_.Register(big), absl::StatusCode::kResourceExhausted,
                        "has 3 tensors; this daemon's max_tensors_per_job is 2"));
  EXPECT_TRUE(registry_.Jobs().empty());
}

TEST_F(JobRegistryLimitsTest, MaxJobBytesIsResourceExhausted) {
  // Spec() fits exactly; one more element per tensor row does not.
  ASSERT_TRUE(registry_.Register(Spec("fits")).ok());
  v1::RegisterRequest big = Spec("too-big");
  big.mutable_tensors(1)->set_cols(9);
  EXPECT_TRUE(
      HasStatus(registry_.Register(big), absl::StatusCode::kResourceExhausted, "max_job_bytes"));
  EXPECT_TRUE(HasStatus(registry_.Find("too-big"), absl::StatusCode::kNotFound));
}

TEST(JobRegistryBytesTest, JobBytesCountsStateServedFormatsAndSlots) {
  // Per element: 12 B state; fp32 + bf16 served, twice (current and retired version) = 12 B;
  // slots of 3 ranks, twice (collecting and running step): 24 B (fp32) or 12 B (bf16).
  EXPECT_EQ(JobRegistry::JobBytes(Spec()), 32 * (12 + 12 + 24) + 8 * (12 + 12 + 12));
}

}  // namespace
}  // namespace paramd
