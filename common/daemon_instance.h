// How a daemon refuses an in-place mark whose slot place another start of it handed out (the
// daemon restarted at the same address; DESIGN.md §6): a FAILED_PRECONDITION with reason
// ERROR_REASON_ANOTHER_DAEMON_START, which a trainer's transport recognizes, forgets its cached
// places and mappings, and writes anew.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/error_reason.h"

namespace paramd {

inline constexpr char kFromAnotherDaemonStart[] = "came from another start of this daemon";

// A trainer's own refusal of a place (in `where`: a segment, a GPU allocation) handed out by a
// start of the daemon other than the one whose memory it maps now; read as the daemon's.
inline absl::Status PlaceFromAnotherDaemonStart(absl::string_view where) {
  return WithReason(
      absl::FailedPreconditionError(absl::StrCat("a place in ", where, " ", kFromAnotherDaemonStart,
                                                 " than the one this trainer maps now")),
      v1::ERROR_REASON_ANOTHER_DAEMON_START);
}

inline bool FromAnotherDaemonStart(const absl::Status& status) {
  return status.code() == absl::StatusCode::kFailedPrecondition &&
         ReasonOf(status) == v1::ERROR_REASON_ANOTHER_DAEMON_START;
}

}  // namespace paramd
