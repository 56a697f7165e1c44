// The daemon's end of `inline`: always offered; its bytes travel in the Data service's Push and
// Pull messages, so Attach only records the rank's choice.
#include "transport/inline/inline.h"

namespace paramd {
namespace {

class InlineDaemonEnd final : public DaemonEnd {
 public:
  explicit InlineDaemonEnd(TransportHost& host) : host_(host) {}

  std::string why_not_offered() const override { return std::string(); }
  std::optional<Memory> memory() const override { return std::nullopt; }

  absl::Status Attach(const v1::AttachRequest& request, v1::AttachResponse* response) override {
    if (request.has_step()) {
      return absl::InvalidArgumentError(
          "slot places (step) exist only for transports that write in place; this one pushes "
          "its bytes in its messages");
    }
    return host_.DeclareTransport(request);
  }

 private:
  TransportHost& host_;
};

}  // namespace

std::unique_ptr<DaemonEnd> MakeInlineDaemonEnd(TransportHost& host) {
  return std::make_unique<InlineDaemonEnd>(host);
}

}  // namespace paramd
