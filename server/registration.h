// Checks of a Register request on its own, before any job exists: names, shapes, ranges, state
// policy, rounding and serve formats.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "paramd/v1/control.pb.h"
#include "server/backend.h"

namespace paramd {

// INVALID_ARGUMENT with a message naming the field.
absl::Status ValidateRegistration(const v1::RegisterRequest& request);

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
