#include "absl/strings/str_cat.h"
#include "transport/cuda_ipc/cuda_ipc.h"
#include "transport/inline/inline.h"
#include "transport/nccl/nccl.h"
#include "transport/shm/shm.h"
#include "transport/transport.h"

namespace paramd {

const std::vector<TransportEntry>& Transports() {
  static const std::vector<TransportEntry> kTransports = {
      // cuda_ipc or shm, whichever the daemon's backend offers (DESIGN.md §6).
      {"cuda_ipc", CudaIpcWhyNotViable, MakeCudaIpcTransport, MakeCudaIpcDaemonEnd},
      // Another GPU of the node without peer access to the daemon's (nccl.h).
      {"nccl", NcclWhyNotViable, MakeNcclTransport, MakeNcclDaemonEnd},
      {"shm", ShmWhyNotViable, MakeShmTransport, MakeShmDaemonEnd},
      {"inline", [](const TransportContext&) { return std::string(); },
       [](const TransportContext& context) -> absl::StatusOr<std::unique_ptr<Transport>> {
         return MakeInlineTransport(context);
       },
       MakeInlineDaemonEnd},
  };
  return kTransports;
}

absl::StatusOr<std::unique_ptr<Transport>> ChooseTransport(const std::string& name,
                                                           const TransportContext& context,
                                                           std::string* reason) {
  std::string skipped;
  for (const TransportEntry& entry : Transports()) {
    if (name != "auto" && name != entry.name) continue;
    const std::string why_not = entry.why_not_viable(context);
    if (!why_not.empty()) {
      if (name != "auto") {
        return absl::FailedPreconditionError(
            absl::StrCat("transport \"", name, "\" cannot work with this daemon: ", why_not));
      }
      absl::StrAppend(&skipped, "; ", entry.name, ": ", why_not);
      continue;
    }
    *reason = name == "auto" ? absl::StrCat("first viable transport", skipped)
                             : std::string("asked for by name");
    return entry.make(context);
  }
  std::string known;
  for (const TransportEntry& entry : Transports()) absl::StrAppend(&known, " ", entry.name);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown transport \"", name, "\"; known: auto", known));
}

}  // namespace paramd
