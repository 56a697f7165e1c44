// Assertions on absl statuses for the server tests: the exact code and a message that names the
// problem (DESIGN.md §5).
#pragma once

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace paramd::testing {

// The status has `code` and a message containing `text`.
inline ::testing::AssertionResult HasStatus(const absl::Status& status, absl::StatusCode code,
                                            absl::string_view text = "") {
  if (status.code() == code && absl::StrContains(status.message(), text)) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "got " << status << "; want " << absl::StatusCodeToString(code)
         << " with a message containing \"" << text << "\"";
}
template <typename T>
::testing::AssertionResult HasStatus(const absl::StatusOr<T>& result, absl::StatusCode code,
                                     absl::string_view text = "") {
  return HasStatus(result.status(), code, text);
}

}  // namespace paramd::testing
