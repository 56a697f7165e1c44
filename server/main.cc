// paramd: parses flags, loads the config, starts the server, waits for SIGTERM or SIGINT.
#include <google/protobuf/stubs/logging.h>
#include <malloc.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/config.h"
#include "common/flags_help.h"
#include "common/logging.h"
#include "server/rpc/server.h"

ABSL_FLAG(std::string, config, "", "Config file: text format of paramd.v1.DaemonConfig");
ABSL_FLAG(std::string, listen, "", "gRPC address host:port (overrides the config)");
ABSL_FLAG(std::string, backend, "", "cpu or cuda:N (overrides the config)");
ABSL_FLAG(std::string, metrics_listen, "-",
          "Prometheus address host:port, or \"\" to disable (overrides the config)");
ABSL_FLAG(int, step_threads, 0, "Threads of the cpu backend's step (overrides the config)");
ABSL_FLAG(std::string, log_level, "", "debug, info, warning or error (overrides the config)");
ABSL_FLAG(std::string, address_file, "",
          "Write the bound gRPC address here once serving (overrides the config)");
ABSL_FLAG(std::string, listen_group, "",
          "With --listen=unix:PATH, a group whose members may connect too (socket mode 0660); "
          "default: the daemon's user alone (0600) (overrides the config)");
ABSL_FLAG(std::string, token_file, "",
          "File of bearer tokens every call must carry one of (trainer TOKEN JOB..., admin TOKEN, "
          "peer TOKEN; mode 0600); SIGHUP reads it again (overrides the config)");
ABSL_FLAG(std::string, metrics_auth_file, "",
          "File of USER:PASSWORD (mode 0600) that a /metrics scrape must present (HTTP basic "
          "auth) (overrides the config)");
ABSL_FLAG(std::string, advertise_address, "",
          "host:port this daemon is known by in jobs' daemon lists; default: the listen address, "
          "or this machine's hostname where it listens on a wildcard (overrides the config)");

// gRPC allocates a fresh buffer of a few MiB for every pushed chunk. With glibc's defaults such
// buffers are mapped, faulted in page by page and unmapped again (or trimmed off the heap) per
// message, which cost a third of the throughput of pushes in data chunks. Keeping them on the heap
// and not trimming it recycles the same pages. State buffers are allocated once per job, so the
// heap does not grow with this.
void KeepMessageBuffersOnTheHeap() {
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 << 20);
}

// protobuf logs every request it cannot parse (a string that is not UTF-8, say) at ERROR on
// stderr: a client could fill the log with them. The service answers such a request itself
// (INVALID_ARGUMENT, counted), so protobuf's lines go to the debug level.
void QuietProtobufParseErrors() {
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel level, const char* file, int line, const std::string& text) {
        if (level == google::protobuf::LOGLEVEL_FATAL) {
          PARAMD_LOG(ERROR) << "protobuf " << file << ":" << line << ": " << text;
          return;
        }
        PARAMD_LOG(DEBUG) << "protobuf " << file << ":" << line << ": " << text;
      });
}

// A cuda:N step is queued behind trainers' events (lent gradients) on the daemon's stream; loading
// a kernel lazily at its first launch may synchronize the context, which would make the daemon's
// host wait for those trainers' backward at its first step. So the kernels load when CUDA starts,
// unless the user chose otherwise.
void LoadKernelsEagerly() { setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0); }

int main(int argc, char** argv) {
  LoadKernelsEagerly();
  KeepMessageBuffersOnTheHeap();
  QuietProtobufParseErrors();
  absl::SetProgramUsageMessage("paramd --config=FILE [--listen=HOST:PORT] [--backend=cpu]");
  paramd::HandleHelpFlag(argc, argv);
  absl::ParseCommandLine(argc, argv);

  paramd::v1::DaemonConfig config;
  if (const std::string path = absl::GetFlag(FLAGS_config); !path.empty()) {
    absl::StatusOr<paramd::v1::DaemonConfig> loaded = paramd::LoadConfigFile(path);
    if (!loaded.ok()) {
      std::fprintf(stderr, "paramd: %s\n", std::string(loaded.status().message()).c_str());
      return 2;
    }
    config = *std::move(loaded);
  }
  if (!absl::GetFlag(FLAGS_listen).empty()) config.set_listen(absl::GetFlag(FLAGS_listen));
  if (!absl::GetFlag(FLAGS_backend).empty()) config.set_backend(absl::GetFlag(FLAGS_backend));
  if (absl::GetFlag(FLAGS_metrics_listen) != "-") {
    config.set_metrics_listen(absl::GetFlag(FLAGS_metrics_listen));
  }
  if (absl::GetFlag(FLAGS_step_threads) != 0) {
    config.set_step_threads(absl::GetFlag(FLAGS_step_threads));
  }
  if (!absl::GetFlag(FLAGS_log_level).empty()) config.set_log_level(absl::GetFlag(FLAGS_log_level));
  if (!absl::GetFlag(FLAGS_address_file).empty()) {
    config.set_address_file(absl::GetFlag(FLAGS_address_file));
  }
  if (!absl::GetFlag(FLAGS_advertise_address).empty()) {
    config.set_advertise_address(absl::GetFlag(FLAGS_advertise_address));
  }
  if (!absl::GetFlag(FLAGS_token_file).empty()) {
    config.set_token_file(absl::GetFlag(FLAGS_token_file));
  }
  if (!absl::GetFlag(FLAGS_metrics_auth_file).empty()) {
    config.set_metrics_auth_file(absl::GetFlag(FLAGS_metrics_auth_file));
  }
  if (!absl::GetFlag(FLAGS_listen_group).empty()) {
    config.set_listen_group(absl::GetFlag(FLAGS_listen_group));
  }

  // Signals are taken synchronously by this thread; every other thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<std::unique_ptr<paramd::Server>> server = paramd::Server::Start(config);
  if (!server.ok()) {
    std::fprintf(stderr, "paramd: %s\n", server.status().ToString().c_str());
    return server.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  if (!config.address_file().empty()) {
    const std::string tmp = config.address_file() + ".tmp";
    std::ofstream(tmp) << (*server)->address() << "\n";
    std::rename(tmp.c_str(), config.address_file().c_str());
  }
  int signal = 0;
  for (sigwait(&signals, &signal); signal == SIGHUP; sigwait(&signals, &signal)) {
    const absl::Status reloaded = (*server)->ReloadTokens();
    if (reloaded.ok()) {
      PARAMD_LOG(INFO) << "SIGHUP: the token file was read again";
    } else {
      PARAMD_LOG(ERROR) << "SIGHUP: " << reloaded << "; the tokens stay as they were";
    }
  }
  PARAMD_LOG(INFO) << "signal " << signal << ": finishing the running step, then stopping";
  (*server)->Shutdown();
  return 0;
}
