// The daemon's end of `inline`: always offered; its bytes travel in the Data service's Push and
// Pull messages, so Attach only records the rank's choice (a probe or a request for regions is
// answered with none).
#include "transport/inline/inline.h"

namespace paramd {
namespace {

class InlineDaemonEnd final : public DaemonEnd {
 public:
  explicit InlineDaemonEnd(TransportHost& host) : host_(host) {}

  std::string why_not_offered() const override { return std::string(); }
  std::optional<Memory> memory() const override { return std::nullopt; }

  absl::Status Attach(const v1::AttachRequest& request, v1::AttachResponse* response) override {
    switch (request.purpose_case()) {
      case v1::AttachRequest::kDeclare:
        return host_.DeclareTransport(request);
      case v1::AttachRequest::kProbe:
      case v1::AttachRequest::kRegions:
        return absl::OkStatus();  // nothing to map
      case v1::AttachRequest::kSlots:
        return absl::InvalidArgumentError(
            "slot places exist only for transports that write in place; this one pushes its "
            "bytes in its messages");
      default:
        return NotThisTransports(request);
    }
  }

 private:
  TransportHost& host_;
};

}  // namespace

std::unique_ptr<DaemonEnd> MakeInlineDaemonEnd(TransportHost& host) {
  return std::make_unique<InlineDaemonEnd>(host);
}

}  // namespace paramd
