// How a daemon refuses an in-place mark whose slot place another start of it handed out (the
// daemon restarted at the same address; DESIGN.md §6): the words of its FAILED_PRECONDITION, which
// a trainer's transport recognizes, forgets its cached places and mappings, and writes anew.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/match.h"

namespace paramd {

inline constexpr char kFromAnotherDaemonStart[] = "came from another start of this daemon";

inline bool FromAnotherDaemonStart(const absl::Status& status) {
  return status.code() == absl::StatusCode::kFailedPrecondition &&
         absl::StrContains(status.message(), kFromAnotherDaemonStart);
}

}  // namespace paramd
