// A paramd process on a free loopback port, for tests that need the daemon in a process of its own
// (a killed daemon's leftovers; a transport whose two ends must be two processes, as nccl's).
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

extern char** environ;

namespace paramd::testing {

// The paramd program: $PARAMD_BINARY where set (a bundle's), else `built` (the build's).
inline std::string ParamdBinary(const char* built) {
  const char* from_env = std::getenv("PARAMD_BINARY");
  return from_env != nullptr && *from_env != '\0' ? from_env : built;
}

class DaemonProcess {
 public:
  // Starts `binary` with --listen=127.0.0.1:0, no metrics, `args` after those, and this process's
  // environment plus `env` ("NAME=value"); waits up to 30 s for its address (--address_file under
  // `dir`). address() is empty where it did not start.
  DaemonProcess(const std::string& binary, const std::string& dir,
                const std::vector<std::string>& args = {}, const std::vector<std::string>& env = {})
      : address_file_(dir + "/address." + std::to_string(getpid())) {
    std::filesystem::remove(address_file_);
    std::vector<std::string> all = {binary, "--listen=127.0.0.1:0",
                                    "--metrics_listen=", "--log_level=warning",
                                    "--address_file=" + address_file_};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> added = env;
    std::vector<char*> envp;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string_view entry(*e);
      const bool replaced = std::any_of(added.begin(), added.end(), [&](const std::string& a) {
        const size_t name = a.find('=');
        return entry.substr(0, name + 1) == std::string_view(a).substr(0, name + 1);
      });
      if (!replaced) envp.push_back(*e);  // an entry of `env` takes its place
    }
    for (std::string& e : added) envp.push_back(e.data());
    envp.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], nullptr, nullptr, argv.data(), envp.data()) != 0) {
      pid_ = -1;
      return;
    }
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < give_up) {
      std::ifstream in(address_file_);
      if (in >> address_) break;
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {  // it exited: it will not start
        pid_ = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ~DaemonProcess() { Stop(SIGKILL); }
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  // Sends `signal` and waits for the exit; returns the wait status.
  int Stop(int signal) {
    if (pid_ <= 0) return 0;
    kill(pid_, signal);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return status;
  }
  const std::string& address() const { return address_; }

 private:
  const std::string address_file_;
  pid_t pid_ = -1;
  std::string address_;
};

}  // namespace paramd::testing
