#include "common/config.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>
#include <grp.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "common/owner_address.h"
#include "common/step_cpus.h"

namespace paramd {
namespace {

constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = 1024 * kKiB;
// Room for a message's fields beside its payload.
constexpr int64_t kEnvelopeBytes = 64 * kKiB;

// Collects parse errors with their line and column.
class ErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    absl::StrAppend(&text_, text_.empty() ? "" : "; ", "line ", line + 1, " column ", column + 1,
                    ": ", message);
  }
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

bool IsWildcardHost(const std::string& host) {
  return host == "0.0.0.0" || host == "::" || host == "[::]";
}

absl::Status CheckHostPort(const std::string& field, const std::string& value) {
  const size_t colon = value.rfind(':');
  uint32_t port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(value.substr(colon + 1), &port) || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config field ", field, " = \"", value, "\" is not \"host:port\" with a port in 0..65535"));
  }
  return absl::OkStatus();
}

// advertise_address: a port of 0 would name no daemon, and a wildcard host no machine.
absl::Status CheckAdvertiseAddress(const std::string& value) {
  const size_t colon = value.rfind(':');
  uint32_t port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(value.substr(colon + 1), &port) || port == 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("config field advertise_address = \"", value,
                     "\" is not \"host:port\" with a port in 1..65535"));
  }
  if (IsWildcardHost(value.substr(0, colon))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config field advertise_address = \"", value,
        "\" has a wildcard host, which names no machine; give the name or address other nodes "
        "reach this daemon at, or leave it empty for this machine's hostname"));
  }
  return absl::OkStatus();
}

// a + b clamped to int64_t: before validation a config's fields may hold any value, and a bound
// derived from an out-of-range field must not overflow (that field's own check refuses it).
int64_t SaturatingAdd(int64_t a, int64_t b) {
  int64_t sum;
  if (!__builtin_add_overflow(a, b, &sum)) return sum;
  return b > 0 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
}

absl::Status CheckRange(const std::string& field, int64_t value, int64_t lo, int64_t hi) {
  if (value < lo || value > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("config field ", field, " = ", value, " is outside [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::DaemonConfig> ParseConfigText(const std::string& text) {
  v1::DaemonConfig config;
  google::protobuf::TextFormat::Parser parser;
  ErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &config)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config is not a valid paramd.v1.DaemonConfig: ", errors.text()));
  }
  return config;
}

absl::StatusOr<v1::DaemonConfig> LoadConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open config file ", path));
  std::stringstream text;
  text << in.rdbuf();
  auto config = ParseConfigText(text.str());
  if (!config.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

bool IsBackendName(std::string_view name) {
  for (const std::string_view prefix : {"cpu:", "cuda:"}) {
    if (name.substr(0, prefix.size()) == prefix) {
      const std::string_view digits = name.substr(prefix.size());
      return !digits.empty() && digits.size() <= 4 &&
             std::all_of(digits.begin(), digits.end(), [](char d) { return d >= '0' && d <= '9'; });
    }
  }
  return name == "cpu";
}

std::vector<std::string> ConfigBackends(const std::string& backend) {
  return absl::StrSplit(backend, ',');
}

absl::Status CheckBackends(const std::string& backend) {
  if (backend == kAllGpus) return absl::OkStatus();
  const std::vector<std::string> names = ConfigBackends(backend);
  if (static_cast<int>(names.size()) > kMaxBackends) {
    return absl::InvalidArgumentError(absl::StrCat("config field backend lists ", names.size(),
                                                   " backends; a daemon has at most ",
                                                   kMaxBackends));
  }
  std::set<std::string> seen;
  for (const std::string& name : names) {
    if (!IsBackendName(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config field backend = \"", backend, "\": \"", name,
          "\" is not \"cpu\", \"cpu:K\" or \"cuda:N\" (a list of distinct ones, comma-separated, "
          "or \"",
          kAllGpus, "\")"));
    }
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("config field backend = \"", backend, "\" lists \"", name, "\" twice"));
    }
  }
  return absl::OkStatus();
}

v1::DaemonConfig WithDefaults(v1::DaemonConfig c) {
  if (c.listen().empty()) c.set_listen("127.0.0.1:50051");
  if (c.backend().empty()) c.set_backend("cpu");
  if (!c.has_metrics_listen()) c.set_metrics_listen("127.0.0.1:9464");
  if (c.step_threads() == 0) {
    // As many as the CPUs they are placed on, where they are placed (an invalid placement is
    // ValidateConfig's to report).
    const absl::StatusOr<std::vector<int>> placed = StepCpus(c);
    c.set_step_threads(
        placed.ok() && !placed->empty()
            ? static_cast<int32_t>(placed->size())
            : static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency())));
  }
  if (c.max_chunk_bytes() == 0) c.set_max_chunk_bytes(4 * kMiB);
  if (c.max_message_bytes() == 0) {
    c.set_max_message_bytes(SaturatingAdd(c.max_chunk_bytes(), kEnvelopeBytes));
  }
  if (c.max_tensors_per_job() == 0) c.set_max_tensors_per_job(65536);
  if (c.max_jobs() == 0) c.set_max_jobs(64);
  if (c.pull_chunk_bytes() == 0) c.set_pull_chunk_bytes(std::min(1 * kMiB, c.max_chunk_bytes()));
  if (c.log_level().empty()) c.set_log_level("info");
  if (!c.has_shared_memory()) c.set_shared_memory(true);
  if (c.shm_segment_bytes() == 0) c.set_shm_segment_bytes(64 * kMiB);
  if (c.max_lease_ms() == 0) c.set_max_lease_ms(600000);
  if (c.lease_ms() == 0) c.set_lease_ms(std::min<int64_t>(30000, c.max_lease_ms()));
  // memory_budget_bytes and device_memory_budget_bytes stay 0 here: the daemon takes them from the
  // machine at start (server/memory_budget.h).
  if (c.max_open_streams() == 0) c.set_max_open_streams(4096);
  if (c.max_waiting_pulls() == 0) c.set_max_waiting_pulls(4096);
  if (c.max_leases() == 0) c.set_max_leases(65536);
  if (c.max_streams_per_connection() == 0) c.set_max_streams_per_connection(1024);
  if (c.keep_checkpoints() == 0) c.set_keep_checkpoints(3);
  if (c.checkpoint_buffer_bytes() == 0) c.set_checkpoint_buffer_bytes(kDefaultCheckpointBuffer);
  if (c.peer_timeout_ms() == 0) c.set_peer_timeout_ms(30000);
  return c;
}

namespace {

// listen = "unix:PATH": a socket path the kernel takes (sun_path holds 107 bytes and a NUL).
absl::Status CheckUnixListen(const std::string& value) {
  const std::string path = UnixSocketPath(value);
  if (path.empty() || path.size() > 107) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config field listen = \"", value, "\" names no Unix socket path of 1 to 107 bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<gid_t> GroupId(const std::string& name) {
  std::vector<char> buffer(16384);
  group entry;
  group* found = nullptr;
  const int error = getgrnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found);
  if (error != 0 || found == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("config field listen_group = \"", name, "\" names no group of this host",
                     error != 0 ? absl::StrCat(" (", std::strerror(error), ")") : std::string()));
  }
  return found->gr_gid;
}

absl::Status ValidateConfig(const v1::DaemonConfig& c) {
  if (absl::Status s = IsUnixAddress(c.listen()) ? CheckUnixListen(c.listen())
                                                 : CheckHostPort("listen", c.listen());
      !s.ok()) {
    return s;
  }
  if (!c.listen_group().empty() && !IsUnixAddress(c.listen())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config field listen_group = \"", c.listen_group(),
        "\" is for a Unix socket (listen = \"unix:PATH\"), not listen = \"", c.listen(), "\""));
  }
  if (!c.listen_group().empty()) {
    if (absl::StatusOr<gid_t> group = GroupId(c.listen_group()); !group.ok()) {
      return group.status();
    }
  }
  if (!c.metrics_listen().empty()) {
    if (absl::Status s = CheckHostPort("metrics_listen", c.metrics_listen()); !s.ok()) return s;
  }
  if (!c.advertise_address().empty()) {
    if (absl::Status s = CheckAdvertiseAddress(c.advertise_address()); !s.ok()) return s;
  }
  if (absl::Status s = CheckBackends(c.backend()); !s.ok()) return s;
  if (absl::StatusOr<std::vector<int>> cpus = StepCpus(c); !cpus.ok()) return cpus.status();
  for (const absl::Status& s : {
           CheckRange("step_threads", c.step_threads(), 1, 1024),
           CheckRange("max_chunk_bytes", c.max_chunk_bytes(), 4 * kKiB, 64 * kMiB),
           CheckRange("max_message_bytes", c.max_message_bytes(),
                      SaturatingAdd(c.max_chunk_bytes(), kEnvelopeBytes), 1024 * kMiB),
           CheckRange("max_tensors_per_job", c.max_tensors_per_job(), 1, 1 << 24),
           CheckRange("max_jobs", c.max_jobs(), 1, 1 << 16),
           CheckRange("max_job_bytes", c.max_job_bytes(), 0, int64_t{1} << 50),
           CheckRange("pull_chunk_bytes", c.pull_chunk_bytes(), 4 * kKiB,
                      SaturatingAdd(c.max_message_bytes(), -kEnvelopeBytes)),
           CheckRange("shm_segment_bytes", c.shm_segment_bytes(), 2 * kMiB, int64_t{1} << 40),
           CheckRange("max_lease_ms", c.max_lease_ms(), 1, 86400000),
           CheckRange("lease_ms", c.lease_ms(), 1, c.max_lease_ms()),
           CheckRange("max_open_streams", c.max_open_streams(), 1, 1 << 20),
           CheckRange("max_waiting_pulls", c.max_waiting_pulls(), 1, 1 << 20),
           CheckRange("max_leases", c.max_leases(), 1, 1 << 24),
           CheckRange("max_streams_per_connection", c.max_streams_per_connection(), 1, 65536),
           CheckRange("keep_checkpoints", c.keep_checkpoints(), 1, 1000),
           CheckRange("peer_timeout_ms", c.peer_timeout_ms(), 1, 3600000),
           CheckRange("checkpoint_every_steps", c.checkpoint_every_steps(), 0, 1000000000),
           CheckRange("checkpoint_buffer_bytes", c.checkpoint_buffer_bytes(), kMiB,
                      int64_t{1} << 50),
       }) {
    if (!s.ok()) return s;
  }
  for (const auto& [field, value] :
       {std::pair<const char*, int64_t>{"memory_budget_bytes", c.memory_budget_bytes()},
        std::pair<const char*, int64_t>{"device_memory_budget_bytes",
                                        c.device_memory_budget_bytes()}}) {
    if (value != 0 && (value < kMiB || value > (int64_t{1} << 56))) {
      return absl::InvalidArgumentError(absl::StrCat("config field ", field, " = ", value,
                                                     " is outside [1 MiB, 2^56] (0 = from the "
                                                     "machine at start)"));
    }
  }
  if (c.checkpoint_every_steps() > 0 && c.checkpoint_dir().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config field checkpoint_every_steps = ", c.checkpoint_every_steps(),
                     " needs a checkpoint_dir to write them to"));
  }
  LogLevel level;
  if (!ParseLogLevel(c.log_level(), &level)) {
    return absl::InvalidArgumentError(absl::StrCat("config field log_level = \"", c.log_level(),
                                                   "\" is not one of debug, info, warning, error"));
  }
  return absl::OkStatus();
}

std::string AdvertisedAddress(const v1::DaemonConfig& config, int port,
                              const std::string& hostname) {
  if (!config.advertise_address().empty()) return config.advertise_address();
  if (IsUnixAddress(config.listen())) return config.listen();
  const std::string host = config.listen().substr(0, config.listen().rfind(':'));
  return absl::StrCat(IsWildcardHost(host) ? hostname : host, ":", port);
}

}  // namespace paramd
