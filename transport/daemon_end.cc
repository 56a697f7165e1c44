#include "transport/daemon_end.h"

#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "common/quoted.h"
#include "common/status_macros.h"
#include "common/version.h"
#include "transport/transport.h"

namespace paramd {

DaemonEnds DaemonEnds::Make(TransportHost& host) {
  DaemonEnds ends;
  for (const TransportEntry& entry : Transports()) {
    ends.ends_.push_back(End{entry.name, entry.daemon_end(host)});
  }
  return ends;
}

absl::StatusOr<DaemonEnd*> DaemonEnds::Find(const std::string& name) const {
  std::string known;
  for (const End& e : ends_) {
    if (e.name == name) return e.end.get();
    absl::StrAppend(&known, known.empty() ? "" : ", ", e.name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("transport ", Quoted(name), " is not one this daemon offers (", known, ")"));
}

absl::Status DaemonEnds::Attach(const v1::AttachRequest& request,
                                v1::AttachResponse* response) const {
  if (request.purpose_case() == v1::AttachRequest::PURPOSE_NOT_SET) {
    return WithReason(
        absl::FailedPreconditionError(absl::StrCat(
            "this Attach names no purpose (AttachRequest.purpose): the client is older than the "
            "daemon (paramd ",
            std::string(Version()),
            "), whose Attach says what it asks for; upgrade the client (the paramd C++ library, "
            "or the paramd Python package) to the daemon's version")),
        v1::ERROR_REASON_CLIENT_TOO_OLD);
  }
  PARAMD_ASSIGN_OR_RETURN(DaemonEnd * end, Find(request.transport()));
  if (std::string why = end->why_not_offered(); !why.empty()) {
    return absl::FailedPreconditionError(why);
  }
  return end->Attach(request, response);
}

const std::string& DaemonEnds::NameOf(std::optional<Memory> memory) const {
  for (const End& e : ends_) {
    if (e.end->memory() == memory && e.end->offered()) return e.name;
  }
  static const std::string kNone = "unknown";
  return kNone;
}

const std::string& DaemonEnds::LabelFor(const std::string& declared,
                                        std::optional<Memory> memory) const {
  for (const End& e : ends_) {
    // A declared transport was offered when the rank attached (Attach refuses others): it is
    // not asked again here, on every stored chunk and pulled header.
    if (e.name == declared && e.end->memory() == memory) return e.name;
  }
  return NameOf(memory);
}

DaemonEnds DaemonEnds::Of(std::vector<End> ends) {
  DaemonEnds made;
  made.ends_ = std::move(ends);
  return made;
}

std::shared_ptr<BufferAllocator> DaemonEnds::JobBuffers(const std::string& job,
                                                        int64_t bytes) const {
  for (const End& e : ends_) {
    if (!e.end->offered()) continue;
    if (std::shared_ptr<BufferAllocator> buffers = e.end->JobBuffers(job, bytes)) return buffers;
  }
  return nullptr;
}

std::string AttachPurpose(const v1::AttachRequest& request) {
  if (request.purpose_case() == v1::AttachRequest::PURPOSE_NOT_SET) return "none";
  // A oneof case's value is its field's number.
  return request.GetDescriptor()->FindFieldByNumber(request.purpose_case())->name();
}

absl::Status NotThisTransports(const v1::AttachRequest& request) {
  return absl::InvalidArgumentError(absl::StrCat("transport ", Quoted(request.transport()),
                                                 " takes no Attach of purpose ",
                                                 AttachPurpose(request)));
}

absl::Status AttachPlaced(TransportHost& host, Memory memory, const v1::AttachRequest& request,
                          const DescribeRegions& describe, v1::AttachResponse* response) {
  switch (request.purpose_case()) {
    case v1::AttachRequest::kProbe:
      return describe("", response);
    case v1::AttachRequest::kRegions:
      if (request.job().empty()) {
        return absl::InvalidArgumentError(
            "Attach regions names the job whose regions it asks for (AttachRequest.job); before "
            "a job is registered, ask with probe");
      }
      return describe(request.job(), response);
    case v1::AttachRequest::kDeclare:
      PARAMD_RETURN_IF_ERROR(host.DeclareTransport(request));
      return describe(request.job(), response);
    case v1::AttachRequest::kSlots:
      break;
    default:
      return NotThisTransports(request);
  }
  absl::StatusOr<SlotPlaces> slots =
      host.SlotsForStep(request.job(), request.rank(), request.slots().step(), memory);
  if (!slots.ok()) return slots.status();
  response->set_committed(slots->committed);
  for (size_t i = 0; i < slots->places.size(); ++i) {
    v1::Place* place = response->add_slots();
    place->set_segment(slots->places[i].region);
    place->set_offset(slots->places[i].offset);
    place->set_bytes(slots->bytes[i]);
    place->set_tensor(slots->tensors[i]);
    place->set_received(slots->received[i]);
  }
  return describe(request.job(), response);  // after the slots: they may have added regions
}

}  // namespace paramd
