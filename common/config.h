// The daemon's typed configuration: read once at start from the text format of
// paramd.v1.DaemonConfig, overridden by flags, defaults applied, validated. Absent -> default;
// present but invalid -> an error naming the field.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "paramd/v1/config.pb.h"

namespace paramd {

// checkpoint_buffer_bytes's default: what a checkpoint holds without a reservation.
inline constexpr int64_t kDefaultCheckpointBuffer = int64_t{16} << 20;

// DaemonConfig.backend's value for one cuda:N backend per GPU the process sees.
inline constexpr char kAllGpus[] = "cuda:all";
// The most backends one daemon holds.
inline constexpr int kMaxBackends = 64;

// Whether `name` names one backend: "cpu", "cpu:K" or "cuda:N" (K, N of 1 to 4 digits).
bool IsBackendName(std::string_view name);
// DaemonConfig.backend's names, in order ("cuda:all" stays one name: the daemon counts its GPUs).
std::vector<std::string> ConfigBackends(const std::string& backend);
// INVALID_ARGUMENT unless `backend` is one backend's name, a comma-separated list of distinct
// ones, or "cuda:all".
absl::Status CheckBackends(const std::string& backend);

// Parses a config file's text. Unknown fields and syntax errors are INVALID_ARGUMENT.
absl::StatusOr<v1::DaemonConfig> ParseConfigText(const std::string& text);

// Reads and parses a config file.
absl::StatusOr<v1::DaemonConfig> LoadConfigFile(const std::string& path);

// Fills every absent field with its default (documented in config.proto).
v1::DaemonConfig WithDefaults(v1::DaemonConfig config);

// Checks a config with defaults applied. INVALID_ARGUMENT names the offending field.
absl::Status ValidateConfig(const v1::DaemonConfig& config);

// The id of the group `name` of this host (DaemonConfig.listen_group); INVALID_ARGUMENT where there
// is none.
absl::StatusOr<gid_t> GroupId(const std::string& name);

// The address a daemon of (valid) `config` is known by in daemon lists: advertise_address when
// set, else the listen host with `port` (the bound one) where that host is no wildcard, else
// `hostname` with `port`.
std::string AdvertisedAddress(const v1::DaemonConfig& config, int port,
                              const std::string& hostname);

}  // namespace paramd
