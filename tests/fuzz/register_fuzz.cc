// Fuzzes registration: the bytes are a serialized paramd.v1.RegisterRequest, checked by
// ValidateRegistration and, when valid, registered on a JobRegistry over a CpuBackend with small
// limits (max_job_bytes 64 MiB, so a fuzzed shape cannot take the machine's memory).
// Invariants: nothing crashes; a rejection is INVALID_ARGUMENT (validation) or RESOURCE_EXHAUSTED
// (a limit, and then really over it); an accepted job repeats its registration (the same request,
// another rank, the request with its defaults spelled out), and a valid request that describes
// another job under the same name is FAILED_PRECONDITION.
#include <google/protobuf/stubs/logging.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/logging.h"
#include "server/backend/cpu_backend.h"
#include "server/registration.h"
#include "server/registry.h"

namespace paramd {
namespace {

constexpr int64_t kMaxJobBytes = int64_t{64} << 20;

RegistryLimits Limits() {
  RegistryLimits limits;
  limits.max_jobs = 4;
  limits.max_tensors_per_job = 256;
  limits.max_job_bytes = kMaxJobBytes;
  limits.max_chunk_bytes = 4096;
  return limits;
}

// Registers `request` on a registry that already holds its job: accepted or refused as expected.
void ExpectRegisters(JobRegistry& registry, const v1::RegisterRequest& request,
                     const v1::RegisterResponse& first) {
  absl::StatusOr<v1::RegisterResponse> again = registry.Register(request);
  PARAMD_CHECK(again.ok()) << again.status() << " for " << request.ShortDebugString();
  PARAMD_CHECK(again->SerializeAsString() == first.SerializeAsString())
      << again->ShortDebugString() << " vs " << first.ShortDebugString();
}

void ExpectRefusedAsAnotherJob(JobRegistry& registry, const v1::RegisterRequest& other) {
  if (!ValidateRegistration(other).ok()) return;  // only a valid description is "another job"
  absl::StatusOr<v1::RegisterResponse> refused = registry.Register(other);
  PARAMD_CHECK(absl::IsFailedPrecondition(refused.status()))
      << refused.status() << " for " << other.ShortDebugString();
}

void Fuzz(const uint8_t* data, size_t size) {
  static CpuBackend* const backend = new CpuBackend(1);
  v1::RegisterRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  const absl::Status valid = ValidateRegistration(request);
  if (!valid.ok()) {
    PARAMD_CHECK(absl::IsInvalidArgument(valid)) << valid;
    return;
  }
  const int64_t bytes = JobRegistry::JobBytes(request);
  PARAMD_CHECK(bytes > 0) << bytes << " bytes for " << request.ShortDebugString();

  JobRegistry registry(backend, Limits());
  absl::StatusOr<v1::RegisterResponse> first = registry.Register(request);
  if (!first.ok()) {
    PARAMD_CHECK(absl::IsResourceExhausted(first.status())) << first.status();
    PARAMD_CHECK(bytes > kMaxJobBytes || request.tensors_size() > Limits().max_tensors_per_job)
        << first.status();
    return;
  }
  PARAMD_CHECK(bytes <= kMaxJobBytes && request.tensors_size() <= Limits().max_tensors_per_job);
  PARAMD_CHECK(first->next_step() == 0 && first->version() == -1 &&
               first->max_chunk_bytes() == Limits().max_chunk_bytes)
      << first->ShortDebugString();

  // The same job: a retry, another rank, the defaults spelled out.
  ExpectRegisters(registry, request, *first);
  v1::RegisterRequest other_rank = request;
  other_rank.set_rank((request.rank() + 1) % request.world_size());
  ExpectRegisters(registry, other_rank, *first);
  v1::RegisterRequest spelled_out = NormalizedSpec(request);
  spelled_out.set_rank(request.rank());
  ExpectRegisters(registry, spelled_out, *first);
  absl::StatusOr<std::shared_ptr<Job>> job = registry.Find(request.job());
  PARAMD_CHECK(job.ok()) << job.status();
  PARAMD_CHECK((*job)->registered_ranks() == (request.world_size() > 1 ? 2 : 1));

  // Another job under the same name.
  v1::RegisterRequest other = request;
  other.set_seed(request.seed() + 1);
  ExpectRefusedAsAnotherJob(registry, other);
  other = request;
  other.set_world_size(request.world_size() + 1);
  ExpectRefusedAsAnotherJob(registry, other);
  other = request;
  v1::TensorSpec* tensor = other.mutable_tensors(0);
  tensor->set_grad_type(tensor->grad_type() == v1::ELEMENT_TYPE_FP32 ? v1::ELEMENT_TYPE_BF16
                                                                     : v1::ELEMENT_TYPE_FP32);
  ExpectRefusedAsAnotherJob(registry, other);
  other = request;
  other.mutable_hyperparams()->set_lr(request.hyperparams().lr() * 2);
  ExpectRefusedAsAnotherJob(registry, other);
  PARAMD_CHECK(registry.Jobs().size() == 1);
}

}  // namespace
}  // namespace paramd

// protobuf logs every string field that is not UTF-8 as an error: noise here, the parse fails.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  paramd::Fuzz(data, size);
  return 0;
}
