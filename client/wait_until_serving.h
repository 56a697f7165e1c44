#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "client/client.h"

namespace paramd {

// The one rule for "the daemon started with --address_file=FILE serves", shared by
// `paramctl wait` and the Python package's paramd.daemon: FILE holds an address (paramd writes it
// atomically once it listens) and a Status call there is answered. A daemon that refuses this
// caller's token (or its lack of one) serves all the same. Polls every 20 ms.
//
// `options` carries what a call needs beyond the address (its token); its address, timeouts and
// attempts are set here. `pid` > 0: the daemon's process; its end (or a zombie of it) fails the
// wait at once. Returns the address; FAILED_PRECONDITION where the process ended first,
// DEADLINE_EXCEEDED after `wait_s` seconds, each message saying what was seen last.
absl::StatusOr<std::string> WaitUntilServing(const std::string& address_file, int pid,
                                             double wait_s, ClientOptions options = {});

}  // namespace paramd
