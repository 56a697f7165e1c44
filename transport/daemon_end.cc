#include "transport/daemon_end.h"

#include "absl/strings/str_cat.h"
#include "common/quoted.h"
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

const std::string& DaemonEnds::NameOf(std::optional<Memory> memory) const {
  for (const End& e : ends_) {
    if (e.end->memory() == memory) return e.name;
  }
  static const std::string kNone = "unknown";
  return kNone;
}

const std::string& DaemonEnds::LabelFor(const std::string& declared,
                                        std::optional<Memory> memory) const {
  for (const End& e : ends_) {
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

absl::Status AttachPlaced(TransportHost& host, Memory memory, const v1::AttachRequest& request,
                          const DescribeRegions& describe, v1::AttachResponse* response) {
  if (request.job().empty() && !request.has_step()) return describe("", response);  // a probe
  if (request.regions_only()) return describe(request.job(), response);
  if (!request.has_step()) {
    if (absl::Status s = host.DeclareTransport(request); !s.ok()) return s;
    return describe(request.job(), response);
  }
  absl::StatusOr<SlotPlaces> slots =
      host.SlotsForStep(request.job(), request.rank(), request.step(), memory);
  if (!slots.ok()) return slots.status();
  response->set_committed(slots->committed);
  for (size_t i = 0; i < slots->places.size(); ++i) {
    v1::ShmPlace* place = response->add_slots();
    place->set_segment(slots->places[i].region);
    place->set_offset(slots->places[i].offset);
    place->set_bytes(slots->bytes[i]);
    place->set_tensor(slots->tensors[i]);
    place->set_received(slots->received[i]);
  }
  return describe(request.job(), response);  // after the slots: they may have added regions
}

}  // namespace paramd
