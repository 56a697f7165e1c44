// `nccl` in a build without NCCL: listed, never viable, and never offered, each saying why.
#include "absl/strings/str_cat.h"
#include "transport/nccl/nccl.h"

namespace paramd {
namespace {

constexpr char kWhy[] = "paramd was built without NCCL";

class NcclUnavailable final : public DaemonEnd {
 public:
  std::string why_not_offered() const override { return kWhy; }
  std::optional<Memory> memory() const override { return std::nullopt; }
  absl::Status Attach(const v1::AttachRequest&, v1::AttachResponse*) override {
    return absl::FailedPreconditionError(kWhy);
  }
};

}  // namespace

std::string NcclWhyNotViable(const TransportContext&) { return kWhy; }

absl::StatusOr<std::unique_ptr<Transport>> MakeNcclTransport(const TransportContext&) {
  return absl::FailedPreconditionError(kWhy);
}

std::unique_ptr<DaemonEnd> MakeNcclDaemonEnd(TransportHost&) {
  return std::make_unique<NcclUnavailable>();
}

}  // namespace paramd
