// Checks of a Register request on its own, before any job exists: names, shapes, ranges, state
// policy, rounding and serve formats.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/shard_map.h"
#include "paramd/v1/control.pb.h"
#include "server/backend/backend.h"

namespace paramd {

// INVALID_ARGUMENT with a message naming the field.
absl::Status ValidateRegistration(const v1::RegisterRequest& request);

// The daemon list of a job (RegisterRequest.daemons) checked against the daemon known as
// `advertised` (DaemonConfig.advertise_address): INVALID_ARGUMENT where the list is unsorted,
// repeats an address or holds one that is not "host:port" (as ValidateRegistration);
// FAILED_PRECONDITION, naming `advertised` and the list, where a list does not name it.
absl::Status CheckDaemonList(const v1::RegisterRequest& request, std::string_view advertised);

// FAILED_PRECONDITION showing both lists where `request` lists other daemons than the job
// registered as `registered` (its spec).
absl::Status CheckSameDaemons(const v1::RegisterRequest& registered,
                              const v1::RegisterRequest& request);

// A daemon list as messages show it: "[a:1, b:2]", or "[] (the daemon called alone)".
std::string DaemonListText(const google::protobuf::RepeatedPtrField<std::string>& daemons);

// The daemons of a job: its list, or `advertised` (this daemon) alone where the list is empty.
std::vector<std::string> JobDaemons(const v1::RegisterRequest& spec, const std::string& advertised);

// The shard map of a job (common/shard_map.h): one owner per daemon of its list (JobDaemons), each
// with `device` (the pieces do not depend on it: owners sort by daemon first, one per daemon).
absl::StatusOr<ShardMap> JobShardMap(const v1::RegisterRequest& spec, const std::string& advertised,
                                     int device);

// The part of a normalized job description the daemon advertised as `advertised` holds: the whole
// description where its list names fewer than two daemons; else only the tensors the shard map
// gives it, each with its job_index, and for a row range of a split tensor those rows (rows,
// row_offset, whole_rows). A daemon may hold none. FAILED_PRECONDITION where the list does not
// name it.
absl::StatusOr<v1::RegisterRequest> DaemonPart(const v1::RegisterRequest& spec,
                                               const std::string& advertised);

// The job description every rank must repeat: the request with its rank cleared and every
// UNSPECIFIED enum replaced by the value it means.
v1::RegisterRequest NormalizedSpec(const v1::RegisterRequest& request);

// The formats a job serves: the requested ones in order, without repeats; FP32 rowwise where it
// requests none.
std::vector<FormatKey> ServedFormats(const v1::RegisterRequest& spec);

// What the backend needs to know of tensor `i` of a normalized job description (NormalizedSpec).
TensorInfo TensorInfoOf(const v1::RegisterRequest& spec, int i);

// Bytes per element of a gradient type (fp32 4, bf16 2).
int64_t ElementBytes(v1::ElementType type);

}  // namespace paramd
