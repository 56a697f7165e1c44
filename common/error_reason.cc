#include "common/error_reason.h"

#include <optional>
#include <string>

#include "absl/strings/cord.h"

namespace paramd {

absl::Status WithReason(absl::Status status, v1::ErrorReason reason) {
  if (status.ok()) return status;
  v1::ErrorDetails details;
  details.set_reason(reason);
  status.SetPayload(kErrorDetailsUrl, absl::Cord(details.SerializeAsString()));
  return status;
}

v1::ErrorReason ReasonOf(const absl::Status& status) {
  const auto payload = status.GetPayload(kErrorDetailsUrl);  // absl::optional in this Abseil
  v1::ErrorDetails details;
  if (!payload.has_value() || !details.ParseFromString(std::string(*payload))) {
    return v1::ERROR_REASON_UNSPECIFIED;
  }
  return details.reason();
}

absl::Status Reworded(const absl::Status& status, std::string message) {
  absl::Status out(status.code(), message);
  status.ForEachPayload(
      [&out](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

}  // namespace paramd
