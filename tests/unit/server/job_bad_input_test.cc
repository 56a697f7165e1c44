// Every bad input of the step coordinator gets its exact status code and a message naming the
// problem, and changes nothing (DESIGN.md §5): afterwards the job's status is as before and a
// correct step still gives the reference result bit for bit.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "server/job/job.h"
#include "tests/unit/server/job_harness.h"
#include "tests/unit/server/reference_job.h"

namespace paramd {
namespace {

using testing::BitIdentical;
using testing::HasStatus;
using testing::JobHarness;
using testing::MakeSpec;
using testing::RandomGradients;
using testing::RandomWeights;
using testing::ReferenceJob;
using testing::SameStatus;
using testing::StepGradients;
using testing::ToBytes;

constexpr auto kNotFound = absl::StatusCode::kNotFound;
constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
constexpr auto kFailedPrecondition = absl::StatusCode::kFailedPrecondition;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

v1::RegisterRequest Spec() {
  // "w": 200 fp32 elements = 800 gradient bytes; "b": 24 bf16 elements = 48 gradient bytes.
  return MakeSpec("bad", 3,
                  {{"w", 5, 40, v1::ELEMENT_TYPE_FP32}, {"b", 1, 24, v1::ELEMENT_TYPE_BF16}});
}

std::string Floats(std::vector<float> values) { return ToBytes(values); }

class JobBadInputTest : public ::testing::Test {
 protected:
  JobBadInputTest()
      : spec_(Spec()), initial_(RandomWeights(spec_, 5)), h_(spec_), reference_(spec_, initial_) {}

  void SetUp() override {
    ASSERT_TRUE(h_.RegisterAll().ok());
    ASSERT_TRUE(h_.UploadWeights(initial_).ok());
    before_ = h_.Snapshot();
  }

  // The gradients every rank pushes at `step`.
  StepGradients Grads(int64_t step) const { return RandomGradients(spec_, 500 + step); }

  // A correct step on the job and the reference; the status before the next bad call is taken.
  void RunCorrectStep(std::optional<double> lr = std::nullopt,
                      std::optional<double> grad_scale = std::nullopt) {
    const int64_t step = h_.job().Status().next_step();
    const absl::Status status = h_.RunFullStep(step, Grads(step), lr, grad_scale);
    ASSERT_TRUE(status.ok()) << status;
    reference_.Step(Grads(step), lr, grad_scale.value_or(1.0));
    for (int i = 0; i < spec_.tensors_size(); ++i) {
      ASSERT_TRUE(BitIdentical(h_.Master(i), reference_.master(i))) << spec_.tensors(i).name();
      ASSERT_TRUE(BitIdentical(h_.Bf16(i), reference_.Bf16(i))) << spec_.tensors(i).name();
    }
    before_ = h_.Snapshot();
  }

  // Call after every rejected input: nothing changed, and the job still steps exactly.
  void ExpectUnchangedAndStillExact(std::optional<double> lr = std::nullopt,
                                    std::optional<double> grad_scale = std::nullopt) {
    EXPECT_TRUE(SameStatus(h_.Snapshot(), before_));
    RunCorrectStep(lr, grad_scale);
    RunCorrectStep();
  }

  absl::StatusOr<ChunkBuffer::Stored> PushBytes(int rank, int64_t step, const std::string& tensor,
                                                int64_t offset, const std::string& data) {
    return h_.Push(rank, step, tensor, offset, data);
  }

  const v1::RegisterRequest spec_;
  const std::vector<std::vector<float>> initial_;
  JobHarness h_;
  ReferenceJob reference_;
  v1::JobStatus before_;
};

TEST_F(JobBadInputTest, UnknownTensorIsNotFound) {
  EXPECT_TRUE(HasStatus(PushBytes(0, 0, "nope", 0, Floats({1})), kNotFound,
                        "job \"bad\" has no tensor \"nope\""));
  EXPECT_TRUE(HasStatus(h_.job().TensorIndex("nope"), kNotFound, "\"nope\""));
  ExpectUnchangedAndStillExact();
}

TEST_F(JobBadInputTest, ByteCountThatIsNotAWholeNumberOfElementsIsInvalidArgument) {
  EXPECT_TRUE(
      HasStatus(PushBytes(0, 0, "w", 0, std::string(6, 'x')), kInvalid, "multiples of 4 bytes"));
  EXPECT_TRUE(
      HasStatus(PushBytes(1, 0, "b", 0, std::string(3, 'x')), kInvalid, "multiples of 2 bytes"));
  EXPECT_TRUE(HasStatus(PushBytes(2, 0, "w", 0, ""), kInvalid, "does not fit tensor \"w\""));
  ExpectUnchangedAndStillExact();
}

TEST_F(JobBadInputTest, GradientOfTheWrongDtypeIsInvalidArgument) {
  // A whole fp32 gradient pushed to the bf16 tensor is twice its byte count.
  EXPECT_TRUE(HasStatus(PushBytes(0, 0, "b", 0, Floats(std::vector<float>(24, 1.0f))), kInvalid,
                        "does not fit tensor \"b\" of 48 bytes (1x24 ELEMENT_TYPE_BF16)"));
  ExpectUnchangedAndStillExact();
}

TEST_F(JobBadInputTest, MisalignedOffsetIsInvalidArgument) {
  EXPECT_TRUE(HasStatus(PushBytes(0, 0, "w", 2, Floats({1})), kInvalid, "chunk [2, 6)"));
  EXPECT_TRUE(HasStatus(PushBytes(0, 0, "b", 1, std::string(2, 'x')), kInvalid, "chunk [1, 3)"));
  EXPECT_TRUE(HasStatus(PushBytes(0, 0, "w", -4, Floats({1})), kInvalid, "chunk [-4, 0)"));
  ExpectUnchangedAndStillExact();
}

TEST_F(JobBadInputTest, ChunkBeyondTheEndIsInvalidArgument) {
  EXPECT_TRUE(HasStatus(PushBytes(0, 0, "w", 796, Floats({1, 2})), kInvalid,
                        "chunk [796, 804) does not fit tensor \"w\" of 800 bytes"));
  EXPECT_TRUE(HasStatus(PushBytes(0, 0, "w", 800, Floats({1})), kInvalid, "does not fit"));
  EXPECT_TRUE(HasStatus(PushBytes(0, 0, "w", std::numeric_limits<int64_t>::max() - 3, Floats({1})),
                        kInvalid, "does not fit"));
  EXPECT_TRUE(HasStatus(h_.Push(0, 0, "w", 800, Floats({1}), v1::PUSH_KIND_INITIAL_WEIGHTS),
                        kInvalid, "fp32 weights"));
  ExpectUnchangedAndStillExact();
}

// An in-place mark names > 0 gradient bytes in a known memory; anything else is refused before it
// touches a slot. (A mark carries no bytes: the payload is one or the other.)
TEST_F(JobBadInputTest, InPlaceMarksOfNoBytesUnknownMemoryOrWeightsAreInvalidArgument) {
  auto mark = [this](int64_t bytes, v1::PlaceMemory memory, v1::PushKind kind) {
    v1::PushChunk chunk;
    chunk.set_job(spec_.job());
    chunk.set_rank(0);
    chunk.set_step(0);
    chunk.set_tensor("w");
    chunk.set_kind(kind);
    chunk.set_offset(0);
    chunk.mutable_in_place()->set_bytes(bytes);
    chunk.mutable_in_place()->set_memory(memory);
    return h_.job().Push(chunk);
  };
  EXPECT_TRUE(HasStatus(mark(0, v1::PLACE_MEMORY_HOST, v1::PUSH_KIND_GRADIENT), kInvalid,
                        "in-place mark of 0 bytes"));
  EXPECT_TRUE(HasStatus(mark(-8, v1::PLACE_MEMORY_DEVICE, v1::PUSH_KIND_GRADIENT), kInvalid,
                        "in-place mark of -8 bytes"));
  EXPECT_TRUE(HasStatus(mark(8, v1::PLACE_MEMORY_UNSPECIFIED, v1::PUSH_KIND_GRADIENT), kInvalid,
                        "in PLACE_MEMORY_UNSPECIFIED"));
  EXPECT_TRUE(HasStatus(mark(8, v1::PLACE_MEMORY_HOST, v1::PUSH_KIND_INITIAL_WEIGHTS), kInvalid,
                        "initial weights travel in data chunks"));
  // A well-formed mark for a slot the daemon did not place in shared memory or GPU memory.
  EXPECT_TRUE(HasStatus(mark(8, v1::PLACE_MEMORY_HOST, v1::PUSH_KIND_GRADIENT),
                        absl::StatusCode::kFailedPrecondition, "not in shared memory"));
  EXPECT_TRUE(HasStatus(mark(8, v1::PLACE_MEMORY_DEVICE, v1::PUSH_KIND_GRADIENT),
                        absl::StatusCode::kFailedPrecondition,
                        "GPU slot the daemon did not hand out"));
  ExpectUnchangedAndStillExact();
}

// A lent gradient (cuda_ipc, InPlaceMark.lent) is marked whole in GPU memory; the cpu backend reads
// no trainer's GPU memory, so a well-formed one is refused too, and nothing changes.
TEST_F(JobBadInputTest, LentGradientsOfPartsOrOnACpuBackendAreRefused) {
  auto lend = [this](int64_t offset, int64_t bytes, v1::PlaceMemory memory) {
    v1::PushChunk chunk;
    chunk.set_job(spec_.job());
    chunk.set_rank(0);
    chunk.set_step(0);
    chunk.set_tensor("w");
    chunk.set_kind(v1::PUSH_KIND_GRADIENT);
    chunk.set_offset(offset);
    v1::InPlaceMark* mark = chunk.mutable_in_place();
    mark->set_bytes(bytes);
    mark->set_memory(memory);
    mark->mutable_lent()->set_ipc_handle(std::string(64, 'h'));
    mark->mutable_lent()->set_pid(1);
    return h_.job().Push(chunk);
  };
  EXPECT_TRUE(HasStatus(lend(8, 792, v1::PLACE_MEMORY_DEVICE), kInvalid, "marked whole"));
  EXPECT_TRUE(HasStatus(lend(0, 400, v1::PLACE_MEMORY_DEVICE), kInvalid, "marked whole"));
  EXPECT_TRUE(HasStatus(lend(0, 800, v1::PLACE_MEMORY_HOST), kInvalid, "in PLACE_MEMORY_HOST"));
  EXPECT_TRUE(HasStatus(lend(0, 800, v1::PLACE_MEMORY_DEVICE),
                        absl::StatusCode::kFailedPrecondition, "reads no trainer's GPU memory"));
  ExpectUnchangedAndStillExact();
}

TEST_F(JobBadInputTest, ConflictingDuplicatePushIsFailedPrecondition) {
  const StepGradients grads = Grads(0);
  const std::string& right = grads[0][1];  // tensor "w", rank 1
  ASSERT_TRUE(PushBytes(1, 0, "w", 0, right.substr(0, 256)).ok());
  before_ = h_.Snapshot();
  std::string wrong = right.substr(0, 256);
  wrong[100] ^= 1;
  EXPECT_TRUE(HasStatus(PushBytes(1, 0, "w", 0, wrong), kFailedPrecondition,
                        "a different chunk of 256 bytes at offset 0 was already pushed"));
  EXPECT_TRUE(HasStatus(PushBytes(1, 0, "w", 128, right.substr(128, 256)), kFailedPrecondition,
                        "overlaps the stored chunk [0, 256)"));
  // The identical chunk is still a duplicate.
  EXPECT_EQ(PushBytes(1, 0, "w", 0, right.substr(0, 256)).value(), ChunkBuffer::Stored::kDuplicate);
  ExpectUnchangedAndStillExact();
}

TEST_F(JobBadInputTest, StaleStepInPushAndCommitIsFailedPrecondition) {
  RunCorrectStep();
  RunCorrectStep();  // the job collects step 2
  EXPECT_TRUE(HasStatus(PushBytes(0, 1, "w", 0, Floats({1})), kFailedPrecondition,
                        "step 1 of job \"bad\" is stale: the job collects step 2"));
  EXPECT_TRUE(HasStatus(PushBytes(0, -1, "w", 0, Floats({1})), kFailedPrecondition, "stale"));
  // Step 1 was the last step taken: its commit may be a retry. Step 0 cannot be.
  EXPECT_TRUE(h_.Commit(0, 1).ok());
  EXPECT_TRUE(HasStatus(h_.Commit(0, 0), kFailedPrecondition,
                        "step 0 of job \"bad\" is stale: the job collects step 2"));
  EXPECT_TRUE(HasStatus(h_.Commit(1, -1), kFailedPrecondition, "stale"));
  ExpectUnchangedAndStillExact();
}

TEST_F(JobBadInputTest, NegativeStepIsStaleBeforeTheFirstStep) {
  EXPECT_TRUE(HasStatus(PushBytes(0, -1, "w", 0, Floats({1})), kFailedPrecondition, "stale"));
  EXPECT_TRUE(HasStatus(h_.Commit(0, -1), kFailedPrecondition, "stale"));
  ExpectUnchangedAndStillExact();
}

TEST_F(JobBadInputTest, FutureStepInPushAndCommitIsFailedPrecondition) {
  EXPECT_TRUE(HasStatus(PushBytes(0, 1, "w", 0, Floats({1})), kFailedPrecondition,
                        "step 1 of job \"bad\" is ahead of the step it collects (0)"));
  EXPECT_TRUE(
      HasStatus(PushBytes(2, 1000, "b", 0, std::string(2, 'x')), kFailedPrecondition, "ahead"));
  EXPECT_TRUE(HasStatus(h_.Commit(0, 1), kFailedPrecondition,
                        "step 1 of job \"bad\" is ahead of the step it collects (0)"));
  ExpectUnchangedAndStillExact();
}

TEST_F(JobBadInputTest, PushChangingCommittedGradientsIsFailedPrecondition) {
  const StepGradients grads = Grads(0);
  ASSERT_TRUE(h_.PushGradients(1, 0, grads).ok());
  ASSERT_TRUE(h_.Commit(1, 0).ok());
  before_ = h_.Snapshot();
  // A re-send of the same bytes (a retry, or a restarted trainer) is acknowledged.
  EXPECT_EQ(PushBytes(1, 0, "b", 0, grads[1][1]).value(), ChunkBuffer::Stored::kDuplicate);
  std::string changed = grads[1][1];
  changed[0] ^= 1;
  EXPECT_TRUE(HasStatus(PushBytes(1, 0, "b", 0, changed), kFailedPrecondition,
                        "rank 1 already committed step 0; its gradients are final"));
  EXPECT_TRUE(HasStatus(PushBytes(1, 0, "w", 4, grads[0][1].substr(4, 8)), kFailedPrecondition,
                        "already committed"));
  ExpectUnchangedAndStillExact();
}

TEST_F(JobBadInputTest, CommitBeforeAllChunksArrivedIsFailedPrecondition) {
  const StepGradients grads = Grads(0);
  // Rank 0 pushes "w" but not all of "b"; rank 1 pushes the first and third 256-byte chunks of "w".
  ASSERT_TRUE(h_.PushTensor(0, 0, 0, grads[0][0], 256).ok());
  ASSERT_TRUE(PushBytes(1, 0, "w", 0, grads[0][1].substr(0, 256)).ok());
  ASSERT_TRUE(PushBytes(1, 0, "w", 512, grads[0][1].substr(512, 256)).ok());
  ASSERT_TRUE(h_.PushTensor(1, 0, 1, grads[1][1], 256).ok());
  before_ = h_.Snapshot();
  EXPECT_TRUE(HasStatus(h_.Commit(0, 0), kFailedPrecondition,
                        "rank 0 commits step 0 but tensor \"b\" has 0 of 48 gradient bytes"));
  EXPECT_TRUE(HasStatus(h_.Commit(1, 0), kFailedPrecondition,
                        "rank 1 commits step 0 but tensor \"w\" has 512 of 800 gradient bytes"));
  EXPECT_TRUE(HasStatus(h_.Commit(2, 0), kFailedPrecondition,
                        "push every chunk of every tensor before committing"));
  ExpectUnchangedAndStillExact();
}

TEST_F(JobBadInputTest, RanksDisagreeingOnLrAreInvalidArgument) {
  const StepGradients grads = Grads(0);
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(h_.PushGradients(r, 0, grads).ok());
  ASSERT_TRUE(h_.Commit(0, 0, 2e-3).ok());
  before_ = h_.Snapshot();
  EXPECT_TRUE(HasStatus(h_.Commit(1, 0, 3e-3), kInvalid,
                        "rank 1 commits step 0 with lr 0.003 and grad_scale 1 but rank 0 "
                        "committed lr 0.002 and grad_scale 1"));
  EXPECT_TRUE(HasStatus(h_.Commit(2, 0), kInvalid, "with lr none"));
  EXPECT_TRUE(HasStatus(h_.Commit(0, 0, 3e-3), kInvalid, "same values"));  // its own earlier one
  ExpectUnchangedAndStillExact(2e-3);
}

TEST_F(JobBadInputTest, RanksDisagreeingOnGradScaleAreInvalidArgument) {
  const StepGradients grads = Grads(0);
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(h_.PushGradients(r, 0, grads).ok());
  ASSERT_TRUE(h_.Commit(2, 0, std::nullopt, 0.25).ok());
  before_ = h_.Snapshot();
  EXPECT_TRUE(HasStatus(h_.Commit(0, 0, std::nullopt, 0.5), kInvalid,
                        "grad_scale 0.5 but rank 2 committed lr none and grad_scale 0.25"));
  EXPECT_TRUE(HasStatus(h_.Commit(1, 0), kInvalid, "grad_scale 1 but rank 2"));
  ExpectUnchangedAndStillExact(std::nullopt, 0.25);
}

TEST_F(JobBadInputTest, NonPositiveOrNonFiniteLrAndGradScaleAreInvalidArgument) {
  for (double bad : {0.0, -1e-3, kNaN, kInf}) {
    EXPECT_TRUE(HasStatus(h_.Commit(0, 0, bad), kInvalid, "lr = "));
    EXPECT_TRUE(HasStatus(h_.Commit(0, 0, std::nullopt, bad), kInvalid, "grad_scale = "));
  }
  ExpectUnchangedAndStillExact();
}

TEST_F(JobBadInputTest, RankOutsideTheWorldIsInvalidArgument) {
  EXPECT_TRUE(HasStatus(PushBytes(3, 0, "w", 0, Floats({1})), kInvalid,
                        "rank 3 is outside [0, 3) of job \"bad\""));
  EXPECT_TRUE(HasStatus(h_.Commit(-1, 0), kInvalid, "rank -1 is outside"));
  ExpectUnchangedAndStillExact();
}

TEST_F(JobBadInputTest, ReuploadOfDifferentInitialWeightsIsFailedPrecondition) {
  std::string different = ToBytes(initial_[0]);
  different[5] ^= 1;
  EXPECT_TRUE(HasStatus(h_.Push(0, 0, "w", 0, different, v1::PUSH_KIND_INITIAL_WEIGHTS),
                        kFailedPrecondition,
                        "initial weights of tensor \"w\" were already uploaded"));
  // Identical bytes before the first step are a retry of the upload, at any boundaries.
  const std::string same = ToBytes(initial_[0]);
  EXPECT_EQ(h_.Push(0, 0, "w", 4, same.substr(4, 40), v1::PUSH_KIND_INITIAL_WEIGHTS).value(),
            ChunkBuffer::Stored::kDuplicate);
  ExpectUnchangedAndStillExact();
  // After a step the state is no longer the upload: even identical bytes are refused.
  EXPECT_TRUE(HasStatus(h_.Push(0, 0, "w", 0, same, v1::PUSH_KIND_INITIAL_WEIGHTS),
                        kFailedPrecondition, "already uploaded (published version 2)"));
  ExpectUnchangedAndStillExact();
}

TEST_F(JobBadInputTest, BadHyperparamsAreInvalidArgument) {
  for (double bad : {0.0, -1.0, kNaN, kInf}) {
    v1::SetHyperparamsRequest request;
    request.set_job("bad");
    request.set_lr(bad);
    request.set_weight_decay(0.5);  // valid, but the request as a whole is refused
    EXPECT_TRUE(HasStatus(h_.job().SetHyperparams(request), kInvalid, "lr = "));
  }
  for (double bad : {-0.01, kNaN, kInf}) {
    v1::SetHyperparamsRequest request;
    request.set_job("bad");
    request.set_weight_decay(bad);
    EXPECT_TRUE(HasStatus(h_.job().SetHyperparams(request), kInvalid, "weight_decay = "));
  }
  ExpectUnchangedAndStillExact();
}

TEST_F(JobBadInputTest, UnservedFormatIsInvalidArgument) {
  v1::ServeFormat fp16;
  fp16.set_recipe(v1::RECIPE_FP16);
  EXPECT_TRUE(HasStatus(h_.job().CheckServes(fp16), kInvalid,
                        "job \"bad\" does not serve fp16; it serves bf16, fp32"));
  v1::ServeFormat columnwise;
  columnwise.set_recipe(v1::RECIPE_BF16);
  columnwise.set_direction(v1::DIRECTION_COLUMNWISE);
  EXPECT_TRUE(HasStatus(h_.job().CheckServes(columnwise), kInvalid, "bf16/columnwise"));
  v1::ServeFormat bf16;
  bf16.set_recipe(v1::RECIPE_BF16);
  EXPECT_TRUE(h_.job().CheckServes(bf16).ok());
  ExpectUnchangedAndStillExact();
}

// FP32 is served only when the job lists it (or lists nothing): a job serving BF16 alone refuses
// an FP32 pull the same way.
TEST(JobServeTest, Fp32IsNotServedUnlessListed) {
  v1::RegisterRequest spec = Spec();
  spec.clear_serve();
  spec.add_serve()->set_recipe(v1::RECIPE_BF16);
  JobHarness h(spec);
  ASSERT_TRUE(h.RegisterAll().ok());
  v1::ServeFormat fp32;
  fp32.set_recipe(v1::RECIPE_FP32);
  EXPECT_TRUE(HasStatus(h.job().CheckServes(fp32), kInvalid,
                        "job \"bad\" does not serve fp32; it serves bf16"));
  spec.clear_serve();
  JobHarness all_default(spec);
  ASSERT_TRUE(all_default.RegisterAll().ok());
  EXPECT_TRUE(all_default.job().CheckServes(fp32).ok());
}

// ---------------------------------------------------------------------------------------------
// Before the initial weights, and with a rank missing.

TEST(JobUploadTest, NonFiniteInitialWeightsAreInvalidArgumentAndChangeNothing) {
  const v1::RegisterRequest spec = Spec();
  const std::vector<std::vector<float>> initial = RandomWeights(spec, 9);
  JobHarness h(spec);
  ASSERT_TRUE(h.RegisterAll().ok());
  const std::string good = ToBytes(initial[0]);
  ASSERT_TRUE(h.Push(0, 0, "w", 0, good.substr(0, 256), v1::PUSH_KIND_INITIAL_WEIGHTS).ok());
  const v1::JobStatus before = h.Snapshot();
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity(), 0x1p127f, -0x1p127f, FLT_MAX}) {
    std::vector<float> chunk(initial[0].begin() + 64, initial[0].begin() + 128);
    chunk[5] = bad;
    EXPECT_TRUE(HasStatus(h.Push(0, 0, "w", 256, ToBytes(chunk), v1::PUSH_KIND_INITIAL_WEIGHTS),
                          kInvalid, "initial weight 69 of tensor \"w\" is "))
        << bad;
  }
  EXPECT_TRUE(SameStatus(h.Snapshot(), before));
  EXPECT_EQ(h.job().Status().tensors(0).version(), -1);
  // The correct upload still completes (its first chunk is a duplicate) and steps exactly.
  ASSERT_TRUE(h.UploadWeights(initial).ok());
  EXPECT_TRUE(BitIdentical(h.Master(0), initial[0]));
  ReferenceJob reference(spec, initial);
  const StepGradients grads = RandomGradients(spec, 1);
  ASSERT_TRUE(h.RunFullStep(0, grads).ok());
  reference.Step(grads, std::nullopt, 1.0);
  EXPECT_TRUE(BitIdentical(h.Master(0), reference.master(0)));
  EXPECT_TRUE(BitIdentical(h.Master(1), reference.master(1)));
}

TEST(JobUploadTest, InitialWeightsComeFromRankZeroAtStepZero) {
  const v1::RegisterRequest spec = Spec();
  JobHarness h(spec);
  ASSERT_TRUE(h.RegisterAll().ok());
  const std::string bytes = ToBytes(RandomWeights(spec, 1)[1]);
  EXPECT_TRUE(HasStatus(h.Push(1, 0, "b", 0, bytes, v1::PUSH_KIND_INITIAL_WEIGHTS), kInvalid,
                        "initial weights come from rank 0 at step 0; got rank 1 step 0"));
  EXPECT_TRUE(HasStatus(h.Push(0, 3, "b", 0, bytes, v1::PUSH_KIND_INITIAL_WEIGHTS), kInvalid,
                        "got rank 0 step 3"));
  EXPECT_EQ(h.job().Status().tensors(1).version(), -1);
}

TEST(JobUploadTest, GradientsAndCommitsBeforeTheInitialWeightsAreFailedPrecondition) {
  const v1::RegisterRequest spec = Spec();
  const std::vector<std::vector<float>> initial = RandomWeights(spec, 2);
  JobHarness h(spec);
  ASSERT_TRUE(h.RegisterAll().ok());
  ASSERT_TRUE(h.Push(0, 0, "w", 0, ToBytes(initial[0]), v1::PUSH_KIND_INITIAL_WEIGHTS).ok());
  const v1::JobStatus before = h.Snapshot();
  EXPECT_TRUE(HasStatus(h.Push(1, 0, "b", 0, std::string(48, 'x')), kFailedPrecondition,
                        "tensor \"b\" has no initial weights yet"));
  EXPECT_TRUE(HasStatus(h.Commit(1, 0), kFailedPrecondition,
                        "job \"bad\" has initial weights for 1 of 2 tensors"));
  EXPECT_TRUE(SameStatus(h.Snapshot(), before));
  ASSERT_TRUE(h.UploadWeights(initial).ok());
  ReferenceJob reference(spec, initial);
  const StepGradients grads = RandomGradients(spec, 4);
  ASSERT_TRUE(h.RunFullStep(0, grads).ok());
  reference.Step(grads, std::nullopt, 1.0);
  EXPECT_TRUE(BitIdentical(h.Master(0), reference.master(0)));
  EXPECT_TRUE(BitIdentical(h.Master(1), reference.master(1)));
}

TEST(JobUploadTest, PushAndCommitFromAnUnregisteredRankAreFailedPrecondition) {
  const v1::RegisterRequest spec = Spec();
  const std::vector<std::vector<float>> initial = RandomWeights(spec, 3);
  JobHarness h(spec);
  ASSERT_TRUE(h.Register(0).ok());
  ASSERT_TRUE(h.Register(1).ok());
  ASSERT_TRUE(h.UploadWeights(initial).ok());
  const StepGradients grads = RandomGradients(spec, 8);
  ASSERT_TRUE(h.PushGradients(0, 0, grads).ok());
  const v1::JobStatus before = h.Snapshot();
  EXPECT_TRUE(HasStatus(h.Push(2, 0, "w", 0, grads[0][2]), kFailedPrecondition,
                        "rank 2 has not registered job \"bad\"; call Register first"));
  EXPECT_TRUE(HasStatus(h.Commit(2, 0), kFailedPrecondition, "rank 2 has not registered"));
  EXPECT_TRUE(SameStatus(h.Snapshot(), before));
  ASSERT_TRUE(h.Register(2).ok());
  ReferenceJob reference(spec, initial);
  ASSERT_TRUE(h.RunFullStep(0, grads).ok());
  reference.Step(grads, std::nullopt, 1.0);
  EXPECT_TRUE(BitIdentical(h.Master(0), reference.master(0)));
  EXPECT_TRUE(BitIdentical(h.Master(1), reference.master(1)));
}

TEST(JobUploadTest, InitialWeightsBeforeRankZeroRegisteredAreFailedPrecondition) {
  const v1::RegisterRequest spec = Spec();
  JobHarness h(spec);
  ASSERT_TRUE(h.Register(1).ok());
  EXPECT_TRUE(HasStatus(
      h.Push(0, 0, "b", 0, ToBytes(RandomWeights(spec, 1)[1]), v1::PUSH_KIND_INITIAL_WEIGHTS),
      kFailedPrecondition, "rank 0 has not registered"));
}

}  // namespace
}  // namespace paramd
