#include "client/wait_until_serving.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <fstream>
#include <memory>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace paramd {
namespace {

// Whether process `pid` has ended: gone, or a zombie its parent has not reaped yet.
bool Ended(int pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t close = line.rfind(')');  // the state follows "pid (comm) "
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z';
}

}  // namespace

absl::StatusOr<std::string> WaitUntilServing(const std::string& address_file, int pid,
                                             double wait_s, ClientOptions options) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(std::max(0.0, wait_s)));
  options.rpc_timeout = std::chrono::milliseconds(2000);
  options.connect_timeout = options.rpc_timeout;
  options.max_attempts = 1;
  std::string why = absl::StrCat("it wrote no address to ", address_file);
  while (true) {
    std::ifstream in(address_file);
    std::string address;
    if (in && std::getline(in, address) && !address.empty()) {
      options.address = address;
      absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
      const absl::Status answer = client.ok() ? (*client)->Status().status() : client.status();
      if (answer.ok() || absl::IsUnauthenticated(answer) || absl::IsPermissionDenied(answer)) {
        return address;
      }
      why = absl::StrCat("its address ", address, " does not answer (", answer.message(), ")");
    }
    if (pid > 0 && Ended(pid)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "process ", pid, " ended before the daemon served: ", why, " (its log says why)"));
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("no daemon served within ", wait_s, " s: ", why));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace paramd
