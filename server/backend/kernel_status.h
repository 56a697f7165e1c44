// kernels/ returns its own small status; this is where it becomes an absl::Status.
#pragma once

#include "absl/status/status.h"
#include "kernels/status.h"

namespace paramd {

inline absl::Status FromKernel(const kernels::KStatus& status) {
  switch (status.code()) {
    case kernels::Code::kOk:
      return absl::OkStatus();
    case kernels::Code::kInvalidArgument:
      return absl::InvalidArgumentError(status.message());
    case kernels::Code::kUnimplemented:
      return absl::UnimplementedError(status.message());
    case kernels::Code::kInternal:
      break;
  }
  return absl::InternalError(status.message());
}

}  // namespace paramd
