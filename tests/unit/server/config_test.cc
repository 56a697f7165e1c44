// The daemon's config: text-format parse errors name their line and column, absent fields get
// their documented defaults, and every invalid field is INVALID_ARGUMENT naming it (STYLE.md 14).
#include "common/config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/owner_address.h"
#include "common/step_cpus.h"
#include "server/backend/backends.h"
#include "server/backend/cpu_backend.h"
#include "tests/unit/server/status_assertions.h"

namespace paramd {
namespace {

using testing::HasStatus;

constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = 1024 * kKiB;
constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

TEST(ConfigTest, ParsesTheTextFormat) {
  absl::StatusOr<v1::DaemonConfig> config = ParseConfigText(
      "listen: \"0.0.0.0:7000\"\n"
      "# comments are allowed\n"
      "metrics_listen: \"\"\n"
      "max_chunk_bytes: 8192\n"
      "log_level: \"debug\"\n");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->listen(), "0.0.0.0:7000");
  EXPECT_TRUE(config->has_metrics_listen());
  EXPECT_EQ(config->metrics_listen(), "");
  EXPECT_EQ(config->max_chunk_bytes(), 8192);
  EXPECT_EQ(config->log_level(), "debug");
}

TEST(ConfigTest, EmptyTextIsAnEmptyConfig) {
  absl::StatusOr<v1::DaemonConfig> config = ParseConfigText("");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->has_metrics_listen());
}

TEST(ConfigTest, UnknownFieldIsInvalidArgumentNamingLineAndColumn) {
  EXPECT_TRUE(HasStatus(ParseConfigText("listen: \"127.0.0.1:1\"\nmax_chunks: 3\n"), kInvalid,
                        "line 2 column 1"));
  EXPECT_TRUE(HasStatus(ParseConfigText("listen: \"127.0.0.1:1\"\nmax_chunks: 3\n"), kInvalid,
                        "max_chunks"));
}

TEST(ConfigTest, SyntaxErrorIsInvalidArgumentNamingLineAndColumn) {
  EXPECT_TRUE(HasStatus(ParseConfigText("\n\n  max_jobs: \"many\"\n"), kInvalid, "line 3 column"));
  EXPECT_TRUE(HasStatus(ParseConfigText("listen: \"unterminated\n"), kInvalid, "line 1 column"));
  EXPECT_TRUE(HasStatus(ParseConfigText("max_jobs: 3 }"), kInvalid, "line 1 column 13"));
}

TEST(ConfigTest, LoadConfigFileOfAMissingFileIsNotFound) {
  EXPECT_TRUE(HasStatus(LoadConfigFile("/nonexistent/paramd.textproto"),
                        absl::StatusCode::kNotFound, "/nonexistent/paramd.textproto"));
}

TEST(ConfigTest, WithDefaultsFillsEveryAbsentField) {
  const v1::DaemonConfig c = WithDefaults(v1::DaemonConfig());
  EXPECT_EQ(c.listen(), "127.0.0.1:50051");
  EXPECT_EQ(c.backend(), "cpu");
  EXPECT_EQ(c.metrics_listen(), "127.0.0.1:9464");
  EXPECT_EQ(c.step_threads(),
            static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency())));
  EXPECT_EQ(c.max_chunk_bytes(), 4 * kMiB);
  EXPECT_EQ(c.max_message_bytes(), 4 * kMiB + 64 * kKiB);
  EXPECT_EQ(c.max_tensors_per_job(), 65536);
  EXPECT_EQ(c.max_job_bytes(), 0);
  EXPECT_EQ(c.max_jobs(), 64);
  EXPECT_EQ(c.pull_chunk_bytes(), 1 * kMiB);
  EXPECT_EQ(c.log_level(), "info");
  EXPECT_EQ(c.address_file(), "");
  EXPECT_EQ(c.advertise_address(), "");  // resolved at start, from where the daemon listens
  EXPECT_EQ(c.checkpoint_dir(), "");
  EXPECT_EQ(c.keep_checkpoints(), 3);
  EXPECT_EQ(c.checkpoint_every_steps(), 0);
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
}

TEST(ConfigTest, WithDefaultsKeepsPresentFields) {
  v1::DaemonConfig raw;
  raw.set_listen("127.0.0.1:0");
  raw.set_metrics_listen("");  // present and empty: metrics off
  raw.set_step_threads(3);
  raw.set_max_chunk_bytes(8192);
  raw.set_log_level("error");
  const v1::DaemonConfig c = WithDefaults(raw);
  EXPECT_EQ(c.listen(), "127.0.0.1:0");
  EXPECT_EQ(c.metrics_listen(), "");
  EXPECT_EQ(c.step_threads(), 3);
  EXPECT_EQ(c.max_chunk_bytes(), 8192);
  EXPECT_EQ(c.max_message_bytes(), 8192 + 64 * kKiB);  // follows the chunk size
  EXPECT_EQ(c.log_level(), "error");
}

// One invalid field: how to set it on a config with defaults applied, and the field's name.
struct BadField {
  std::string name;
  std::function<void(v1::DaemonConfig&)> mutate;
  std::string field;
};
// Test output names the case, not the bytes of its function object.
void PrintTo(const BadField& c, std::ostream* os) { *os << c.name; }

class ConfigBadFieldTest : public ::testing::TestWithParam<BadField> {};

TEST_P(ConfigBadFieldTest, IsInvalidArgumentNamingTheField) {
  v1::DaemonConfig c = WithDefaults(v1::DaemonConfig());
  GetParam().mutate(c);
  EXPECT_TRUE(HasStatus(ValidateConfig(c), kInvalid,
                        absl::StrCat("config field ", GetParam().field, " = ")));
}

INSTANTIATE_TEST_SUITE_P(
    EveryField, ConfigBadFieldTest,
    ::testing::Values(
        BadField{"ListenWithoutPort", [](v1::DaemonConfig& c) { c.set_listen("localhost"); },
                 "listen"},
        BadField{"ListenWithoutHost", [](v1::DaemonConfig& c) { c.set_listen(":50051"); },
                 "listen"},
        BadField{"ListenPortTooLarge", [](v1::DaemonConfig& c) { c.set_listen("127.0.0.1:65536"); },
                 "listen"},
        BadField{"ListenPortNotANumber",
                 [](v1::DaemonConfig& c) { c.set_listen("127.0.0.1:http"); }, "listen"},
        BadField{"MetricsListenWithoutPort",
                 [](v1::DaemonConfig& c) { c.set_metrics_listen("127.0.0.1"); }, "metrics_listen"},
        BadField{"UnknownBackend", [](v1::DaemonConfig& c) { c.set_backend("tpu"); }, "backend"},
        BadField{"TooManyCheckpointsKept",
                 [](v1::DaemonConfig& c) { c.set_keep_checkpoints(1001); }, "keep_checkpoints"},
        BadField{"NegativeCheckpointInterval",
                 [](v1::DaemonConfig& c) {
                   c.set_checkpoint_dir("/tmp/ck");
                   c.set_checkpoint_every_steps(-1);
                 },
                 "checkpoint_every_steps"},
        BadField{"CheckpointIntervalWithoutADirectory",
                 [](v1::DaemonConfig& c) { c.set_checkpoint_every_steps(10); },
                 "checkpoint_every_steps"},
        BadField{"CudaBackendWithoutDevice", [](v1::DaemonConfig& c) { c.set_backend("cuda:"); },
                 "backend"},
        BadField{"CudaBackendWithNegativeDevice",
                 [](v1::DaemonConfig& c) { c.set_backend("cuda:-1"); }, "backend"},
        BadField{"BackendListedTwice",
                 [](v1::DaemonConfig& c) { c.set_backend("cuda:0,cpu,cuda:0"); }, "backend"},
        BadField{"BackendListWithAnEmptyName",
                 [](v1::DaemonConfig& c) { c.set_backend("cpu:0,,cpu:1"); }, "backend"},
        BadField{"BackendListWithAnUnknownName",
                 [](v1::DaemonConfig& c) { c.set_backend("cpu:0,tpu:1"); }, "backend"},
        BadField{"CpuBackendWithoutIndex", [](v1::DaemonConfig& c) { c.set_backend("cpu:"); },
                 "backend"},
        BadField{"AllGpusInAList", [](v1::DaemonConfig& c) { c.set_backend("cuda:all,cpu"); },
                 "backend"},
        BadField{"NegativeStepThreads", [](v1::DaemonConfig& c) { c.set_step_threads(-1); },
                 "step_threads"},
        BadField{"TooManyStepThreads", [](v1::DaemonConfig& c) { c.set_step_threads(1025); },
                 "step_threads"},
        BadField{"TinyChunks",
                 [](v1::DaemonConfig& c) {
                   c.set_max_chunk_bytes(4095);
                   c.set_max_message_bytes(4095 + 64 * kKiB);
                 },
                 "max_chunk_bytes"},
        BadField{"HugeChunks",
                 [](v1::DaemonConfig& c) {
                   c.set_max_chunk_bytes(64 * kMiB + 1);
                   c.set_max_message_bytes(128 * kMiB);
                 },
                 "max_chunk_bytes"},
        BadField{"MessageSmallerThanAChunk",
                 [](v1::DaemonConfig& c) { c.set_max_message_bytes(4 * kMiB + 64 * kKiB - 1); },
                 "max_message_bytes"},
        BadField{"HugeMessages",
                 [](v1::DaemonConfig& c) { c.set_max_message_bytes(1024 * kMiB + 1); },
                 "max_message_bytes"},
        BadField{"NegativeTensorsPerJob",
                 [](v1::DaemonConfig& c) { c.set_max_tensors_per_job(-1); }, "max_tensors_per_job"},
        BadField{"NegativeJobs", [](v1::DaemonConfig& c) { c.set_max_jobs(-5); }, "max_jobs"},
        BadField{"TooManyJobs", [](v1::DaemonConfig& c) { c.set_max_jobs(65537); }, "max_jobs"},
        BadField{"NegativeJobBytes", [](v1::DaemonConfig& c) { c.set_max_job_bytes(-1); },
                 "max_job_bytes"},
        BadField{"TinyPullChunks", [](v1::DaemonConfig& c) { c.set_pull_chunk_bytes(4095); },
                 "pull_chunk_bytes"},
        BadField{"PullChunksBeyondTheMessage",
                 [](v1::DaemonConfig& c) { c.set_pull_chunk_bytes(4 * kMiB + 1); },
                 "pull_chunk_bytes"},
        BadField{"UnknownLogLevel", [](v1::DaemonConfig& c) { c.set_log_level("verbose"); },
                 "log_level"},
        BadField{"AdvertiseAddressWithoutPort",
                 [](v1::DaemonConfig& c) { c.set_advertise_address("node-1"); },
                 "advertise_address"},
        BadField{"AdvertiseAddressWithPortZero",
                 [](v1::DaemonConfig& c) { c.set_advertise_address("node-1:0"); },
                 "advertise_address"},
        BadField{"AdvertiseAddressWithoutHost",
                 [](v1::DaemonConfig& c) { c.set_advertise_address(":50051"); },
                 "advertise_address"},
        BadField{"AdvertiseAddressOnAWildcard",
                 [](v1::DaemonConfig& c) { c.set_advertise_address("0.0.0.0:50051"); },
                 "advertise_address"},
        BadField{"AdvertiseAddressOnTheIpv6Wildcard",
                 [](v1::DaemonConfig& c) { c.set_advertise_address("[::]:50051"); },
                 "advertise_address"}),
    [](const ::testing::TestParamInfo<BadField>& info) { return info.param.name; });

TEST(ConfigTest, BackendListsOfDistinctNamesAreValid) {
  for (const char* backend :
       {"cpu", "cpu:3", "cuda:0", "cuda:all", "cuda:0,cuda:1", "cpu,cuda:0", "cpu:0,cpu:1,cpu:2"}) {
    v1::DaemonConfig c = WithDefaults(v1::DaemonConfig());
    c.set_backend(backend);
    EXPECT_TRUE(ValidateConfig(c).ok()) << backend << ": " << ValidateConfig(c);
  }
  EXPECT_EQ(ConfigBackends("cpu:0,cuda:1"), (std::vector<std::string>{"cpu:0", "cuda:1"}));
  // 64 backends at most.
  std::string many = "cpu:0";
  for (int i = 1; i <= kMaxBackends; ++i) absl::StrAppend(&many, ",cpu:", i);
  v1::DaemonConfig c = WithDefaults(v1::DaemonConfig());
  c.set_backend(many);
  EXPECT_TRUE(HasStatus(ValidateConfig(c), kInvalid, "backends; a daemon has at most 64"));
}

TEST(ConfigTest, EachOfSeveralBackendsTakesItsShareAndACheckpointDirectoryOfItsOwn) {
  v1::DaemonConfig c = WithDefaults(v1::DaemonConfig());
  c.set_step_threads(8);
  c.set_checkpoint_dir("/var/lib/paramd");
  const std::vector<std::string> backends = {"cpu:0", "cpu:1", "cuda:0", "cuda:1"};
  for (size_t i = 0; i < backends.size(); ++i) {
    const v1::DaemonConfig one = BackendConfig(c, backends, i, int64_t{4} << 30);
    EXPECT_EQ(one.backend(), backends[i]);
    EXPECT_EQ(one.memory_budget_bytes(), int64_t{1} << 30);
    // The cpu backends share the step threads; a cuda one keeps its own (its host work).
    EXPECT_EQ(one.step_threads(), i < 2 ? 4 : 8);
  }
  EXPECT_EQ(BackendConfig(c, backends, 3, 0).checkpoint_dir(), "/var/lib/paramd/cuda_1");
  // One backend: the config as it is.
  const v1::DaemonConfig alone = BackendConfig(c, {"cpu"}, 0, int64_t{4} << 30);
  EXPECT_EQ(alone.memory_budget_bytes(), 0);
  EXPECT_EQ(alone.step_threads(), 8);
  EXPECT_EQ(alone.checkpoint_dir(), "/var/lib/paramd");
}

TEST(ConfigTest, AcceptsTheEdgesOfEveryRange) {
  v1::DaemonConfig c = WithDefaults(v1::DaemonConfig());
  c.set_listen("[::1]:0");
  c.set_metrics_listen("0.0.0.0:65535");
  c.set_step_threads(1024);
  c.set_max_chunk_bytes(4 * kKiB);
  c.set_max_message_bytes(4 * kKiB + 64 * kKiB);
  c.set_pull_chunk_bytes(4 * kKiB);
  c.set_max_tensors_per_job(1);
  c.set_max_jobs(1);
  c.set_max_job_bytes(int64_t{1} << 50);
  c.set_log_level("warning");
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
}

// The name a daemon goes by in daemon lists: the configured one, else where it listens, with the
// bound port, and the machine's hostname in place of a wildcard host.
TEST(ConfigTest, TheAdvertisedAddressDefaultsToTheListenAddressOrTheHostname) {
  struct Case {
    std::string listen;
    std::string advertise;
    std::string advertised;
  };
  for (const Case& c : {
           Case{"127.0.0.1:0", "", "127.0.0.1:43121"},
           Case{"10.1.2.3:50051", "", "10.1.2.3:43121"},
           Case{"localhost:50051", "", "localhost:43121"},
           Case{"[::1]:0", "", "[::1]:43121"},
           Case{"0.0.0.0:50051", "", "node-7:43121"},
           Case{":::50051", "", "node-7:43121"},
           Case{"[::]:0", "", "node-7:43121"},
           Case{"0.0.0.0:50051", "node-7.cluster.local:50051", "node-7.cluster.local:50051"},
           Case{"unix:/run/paramd/paramd.sock", "", "unix:/run/paramd/paramd.sock"},
       }) {
    v1::DaemonConfig config;
    config.set_listen(c.listen);
    config.set_advertise_address(c.advertise);
    ASSERT_TRUE(ValidateConfig(WithDefaults(config)).ok()) << c.listen;
    EXPECT_EQ(AdvertisedAddress(config, 43121, "node-7"), c.advertised) << c.listen;
  }
}

// A Unix socket's address: a path the kernel takes (1 to 107 bytes); its backends' addresses end
// in a backend's name after the path.
TEST(ConfigTest, AUnixSocketListensOnAPathOfAtMost107Bytes) {
  v1::DaemonConfig c = WithDefaults(v1::DaemonConfig());
  c.set_listen("unix:/run/paramd.sock");
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
  c.set_listen("unix:///run/paramd.sock");
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
  EXPECT_EQ(UnixSocketPath(c.listen()), "/run/paramd.sock");
  c.set_listen("unix:" + std::string(107, 'p'));
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
  for (const std::string& bad : {std::string("unix:"), "unix:" + std::string(108, 'p')}) {
    c.set_listen(bad);
    EXPECT_TRUE(HasStatus(ValidateConfig(c), kInvalid, "names no Unix socket path of 1 to 107"))
        << bad;
  }
  EXPECT_EQ(SplitOwnerAddress("unix:/run/p.sock").daemon, "unix:/run/p.sock");
  EXPECT_EQ(SplitOwnerAddress("unix:/run/p.sock").backend, "");
  EXPECT_EQ(SplitOwnerAddress("unix:/run/cpu:1/p.sock").backend, "");
  EXPECT_EQ(SplitOwnerAddress("unix:/run/p.sock/cuda:1").daemon, "unix:/run/p.sock");
  EXPECT_EQ(SplitOwnerAddress("unix:/run/p.sock/cuda:1").backend, "cuda:1");
  EXPECT_EQ(SplitOwnerAddress("unix:/run/p.sock/cpu").backend, "cpu");
  EXPECT_EQ(SplitOwnerAddress("node1:50051/cuda:1").backend, "cuda:1");
}

// listen_group: a group of this host, for a Unix socket only.
TEST(ConfigTest, AListenGroupIsAGroupOfThisHostForAUnixSocketOnly) {
  v1::DaemonConfig c = WithDefaults(v1::DaemonConfig());
  c.set_listen("unix:/run/paramd.sock");
  c.set_listen_group("root");  // group 0 exists on every host
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
  ASSERT_TRUE(GroupId("root").ok());
  EXPECT_EQ(*GroupId("root"), 0u);
  c.set_listen_group("no-such-group-of-paramd");
  EXPECT_TRUE(HasStatus(ValidateConfig(c), kInvalid, "names no group of this host"));
  c.set_listen_group("root");
  c.set_listen("127.0.0.1:50051");
  EXPECT_TRUE(HasStatus(ValidateConfig(c), kInvalid, "is for a Unix socket"));
}

TEST(ConfigTest, TheExampleConfigParsesAndValidates) {
  const std::filesystem::path path =
      std::filesystem::path(PARAMD_SOURCE_DIR) / "deploy" / "paramd.example.textproto";
  if (!std::filesystem::exists(path)) {
    GTEST_SKIP() << path << " does not exist in this tree";
  }
  absl::StatusOr<v1::DaemonConfig> config = LoadConfigFile(path.string());
  ASSERT_TRUE(config.ok()) << config.status();
  const absl::Status valid = ValidateConfig(WithDefaults(*config));
  EXPECT_TRUE(valid.ok()) << valid;
}

TEST(StepCpusTest, ACpuListIsReadAsTheKernelWritesIt) {
  EXPECT_EQ(*ParseCpuList("0-3,8,10-11\n"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(*ParseCpuList("5"), std::vector<int>{5});
  EXPECT_TRUE(ParseCpuList("")->empty());
  for (const char* bad : {"3-1", "a", "1-2-3", "-1", "1,,2"}) {
    EXPECT_TRUE(HasStatus(ParseCpuList(bad), kInvalid, "is not a CPU list")) << bad;
  }
  EXPECT_EQ(CpuListText({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
}

// The step threads go where the config says, on CPUs this process may run on, and are as many
// as those CPUs unless step_threads says otherwise.
TEST(StepCpusTest, StepCpusAreCheckedAgainstTheProcesssCpusAndSetTheDefaultThreadCount) {
  const std::vector<int> allowed = AllowedCpus();
  ASSERT_FALSE(allowed.empty());
  v1::DaemonConfig config;
  EXPECT_TRUE(StepCpus(config)->empty());
  config.add_step_cpus(allowed.back());
  config.add_step_cpus(allowed.front());
  config.add_step_cpus(allowed.back());
  std::vector<int> expected = {allowed.front()};
  if (allowed.back() != allowed.front()) expected.push_back(allowed.back());
  EXPECT_EQ(*StepCpus(config), expected);
  v1::DaemonConfig defaulted = WithDefaults(config);
  EXPECT_EQ(defaulted.step_threads(), static_cast<int>(expected.size()));
  EXPECT_TRUE(ValidateConfig(defaulted).ok());
  config.set_step_threads(7);
  EXPECT_EQ(WithDefaults(config).step_threads(), 7);

  v1::DaemonConfig outside = WithDefaults(v1::DaemonConfig());
  outside.add_step_cpus(CPU_SETSIZE - 1);  // no machine here has it
  EXPECT_TRUE(HasStatus(
      ValidateConfig(outside), kInvalid,
      absl::StrCat("step_cpus names CPU ", CPU_SETSIZE - 1,
                   ", which this process may not run on (it may run on ", CpuListText(allowed))));
  v1::DaemonConfig both = WithDefaults(v1::DaemonConfig());
  both.add_step_cpus(allowed.front());
  both.set_step_numa_node(0);
  EXPECT_TRUE(HasStatus(ValidateConfig(both), kInvalid, "step_cpus and step_numa_node"));
}

TEST(StepCpusTest, ANumaNodeGivesItsCpusThisProcessMayRunOn) {
  const std::vector<int> allowed = AllowedCpus();
  const std::string dir = ::testing::TempDir() + "/nodes";
  std::filesystem::create_directories(dir + "/node0");
  std::filesystem::create_directories(dir + "/node1");
  // Node 0 holds every CPU this process may run on and one it may not; node 1 only the latter.
  std::ofstream(dir + "/node0/cpulist") << CpuListText(allowed) << "," << CPU_SETSIZE - 1 << "\n";
  std::ofstream(dir + "/node1/cpulist") << CPU_SETSIZE - 1 << "\n";
  v1::DaemonConfig config;
  config.set_step_numa_node(0);
  EXPECT_EQ(*StepCpus(config, dir), allowed);
  config.set_step_numa_node(1);
  EXPECT_TRUE(HasStatus(StepCpus(config, dir), kInvalid, "none of its CPUs"));
  config.set_step_numa_node(2);
  EXPECT_TRUE(HasStatus(StepCpus(config, dir), kInvalid, "names no NUMA node of this machine"));
  // This machine's own node 0, where it has one (a machine without NUMA in sysfs has none).
  if (std::filesystem::exists("/sys/devices/system/node/node0/cpulist")) {
    config.set_step_numa_node(0);
    absl::StatusOr<std::vector<int>> cpus = StepCpus(config);
    ASSERT_TRUE(cpus.ok()) << cpus.status();
    EXPECT_FALSE(cpus->empty());
  }
}

// A daemon with placed step threads starts, and its cpu backend's pool is on those CPUs.
TEST(StepCpusTest, TheCpuBackendsPoolIsPlacedAsConfigured) {
  const std::vector<int> allowed = AllowedCpus();
  v1::DaemonConfig config;
  config.add_step_cpus(allowed.back());
  config = WithDefaults(config);
  ASSERT_TRUE(ValidateConfig(config).ok());
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend(config);
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto* cpu = dynamic_cast<CpuBackend*>(backend->get());
  ASSERT_NE(cpu, nullptr);
  EXPECT_EQ(cpu->step_cpus(), std::vector<int>{allowed.back()});
}

}  // namespace
}  // namespace paramd
