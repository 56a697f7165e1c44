// A job's daemon list over real RPCs (DESIGN.md §7): real daemons on 127.0.0.1 port 0 with the
// cpu backend, each advertising a name of its own (advertise_address). A list that is unsorted,
// repeats an address, does not name the daemon called, or differs from the one the job registered
// with is refused with its code and both lists shown, and changes nothing; every daemon of a
// 3-daemon job answers the shard map of those three owners, with the devices the others give it
// (unknown for one that is gone); Status shows the advertised address
// and the job's list; the client sorts the list it is given; a daemon listening on 127.0.0.1
// advertises the address it is bound at; a Register waits for the list's daemons (one starting
// late) and names one that never answers.
#include <arpa/inet.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "common/grpc_status.h"
#include "common/shard_map.h"
#include "paramd/v1/control.grpc.pb.h"
#include "server/rpc/server.h"
#include "tests/unit/server/reference_job.h"

namespace paramd {
namespace {

using testing::ForRank;
using testing::HasStatus;
using testing::MakeSpec;

constexpr char kJob[] = "sharded";
constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
constexpr auto kPrecondition = absl::StatusCode::kFailedPrecondition;

// The names three daemons advertise, sorted.
const std::vector<std::string>& Names() {
  static const auto* names =
      new std::vector<std::string>{"node-a.test:7000", "node-b.test:7000", "node-c.test:7001"};
  return *names;
}

v1::DaemonConfig Config(const std::string& advertise) {
  v1::DaemonConfig config;
  config.set_listen("127.0.0.1:0");
  config.set_metrics_listen("");
  config.set_step_threads(1);
  config.set_log_level("error");
  config.set_advertise_address(advertise);
  return config;
}

// A tensor that three owners split (embed), and smaller ones that stay whole.
v1::RegisterRequest Spec(const std::vector<std::string>& daemons) {
  v1::RegisterRequest spec = MakeSpec(kJob, 2,
                                      {{"embed", 1000, 64, v1::ELEMENT_TYPE_BF16},
                                       {"w", 300, 17, v1::ELEMENT_TYPE_FP32},
                                       {"b", 1, 5, v1::ELEMENT_TYPE_FP32},
                                       {"s", 1, 1, v1::ELEMENT_TYPE_FP32}});
  for (const std::string& d : daemons) spec.add_daemons(d);
  return spec;
}

struct RunningDaemon {
  std::unique_ptr<Server> server;
  std::unique_ptr<Client> client;
};

class DaemonListTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (RunningDaemon& d : daemons_) {
      d.client.reset();
      if (d.server != nullptr) d.server->Shutdown();
    }
  }

  // Starts a daemon of `config` and connects a client to it, given `listed` as its
  // ClientOptions::daemons, waiting `wait_ms` for them in Register (ClientOptions::daemons_wait).
  RunningDaemon& Start(const v1::DaemonConfig& config, const std::vector<std::string>& listed = {},
                       int64_t wait_ms = 0) {
    RunningDaemon& d = daemons_.emplace_back();
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(config);
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return d;
    d.server = *std::move(server);
    ClientOptions options;
    options.address = d.server->address();
    options.daemons = listed;
    options.rpc_timeout = std::chrono::seconds(20);
    options.max_attempts = 1;
    // The names the daemons here advertise resolve nowhere: Register does not wait for them
    // (ARegisterWaitsForADaemonThatStartsLate... waits for real ones).
    options.daemons_wait = std::chrono::milliseconds(wait_ms);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    if (client.ok()) d.client = *std::move(client);
    return d;
  }

  // Register as sent, past the client (which sorts the list).
  static absl::Status RawRegister(const Server& server, const v1::RegisterRequest& request) {
    const std::unique_ptr<v1::Control::Stub> stub = v1::Control::NewStub(
        grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    v1::RegisterResponse response;
    return FromGrpcStatus(stub->Register(&context, request, &response));
  }

  static v1::JobStatus JobOf(Client& client) {
    absl::StatusOr<v1::StatusResponse> status = client.Status(kJob);
    EXPECT_TRUE(status.ok()) << status.status();
    return status.ok() && status->jobs_size() == 1 ? status->jobs(0) : v1::JobStatus();
  }

  static std::vector<std::string> DaemonsOf(const v1::JobStatus& job) {
    return {job.daemons().begin(), job.daemons().end()};
  }

  std::deque<RunningDaemon> daemons_;  // Start's references stay valid
};

TEST_F(DaemonListTest, AnUnsortedRepeatingOrMalformedListIsInvalidArgumentAndCreatesNoJob) {
  RunningDaemon& d = Start(Config(Names()[1]));
  ASSERT_NE(d.client, nullptr);
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{Names()[1], Names()[0]},
       "daemons is not sorted: \"node-b.test:7000\" comes before \"node-a.test:7000\""},
      {{Names()[0], Names()[1], Names()[1]}, "daemons lists \"node-b.test:7000\" twice"},
      {{"node-a.test", Names()[1]}, "daemons[0] = \"node-a.test\" is not \"host:port\""},
      {{Names()[1], "node-c.test:0"}, "daemons[1] = \"node-c.test:0\" is not \"host:port\""},
      {{"node a:7000", Names()[1]}, "daemons[0] = \"node a:7000\" is not \"host:port\""},
  };
  for (const auto& [list, text] : cases) {
    EXPECT_TRUE(HasStatus(RawRegister(*d.server, ForRank(Spec(list), 0)), kInvalid, text));
  }
  // An unsorted list that does not name this daemon is bad input first.
  EXPECT_TRUE(HasStatus(RawRegister(*d.server, ForRank(Spec({Names()[2], Names()[0]}), 0)),
                        kInvalid, "not sorted"));
  absl::StatusOr<v1::StatusResponse> status = d.client->Status();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->jobs_size(), 0);
}

TEST_F(DaemonListTest, AListWithoutThisDaemonIsFailedPreconditionNamingItsAddressAndTheList) {
  RunningDaemon& d = Start(Config("node-x.test:7000"));
  ASSERT_NE(d.client, nullptr);
  const absl::Status refused = RawRegister(*d.server, ForRank(Spec(Names()), 0));
  EXPECT_TRUE(HasStatus(refused, kPrecondition,
                        "the daemon list of job \"sharded\", [node-a.test:7000, node-b.test:7000, "
                        "node-c.test:7001], does not name this daemon, which advertises itself "
                        "as \"node-x.test:7000\""));
  EXPECT_TRUE(HasStatus(refused, kPrecondition, "advertise_address"));
  absl::StatusOr<v1::StatusResponse> status = d.client->Status();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->jobs_size(), 0);
}

TEST_F(DaemonListTest, ARankWithAnotherListIsFailedPreconditionShowingBothAndChangesNothing) {
  // Raw Register calls to one daemon: a client given a list of several would register with each.
  RunningDaemon& d = Start(Config(Names()[1]));
  ASSERT_NE(d.client, nullptr);
  ASSERT_TRUE(RawRegister(*d.server, ForRank(Spec(Names()), 0)).ok());
  const v1::JobStatus before = JobOf(*d.client);

  const std::vector<std::string> other = {Names()[0], Names()[1], "node-d.test:7000"};
  const absl::Status refused = RawRegister(*d.server, ForRank(Spec(other), 1));
  EXPECT_TRUE(HasStatus(refused, kPrecondition,
                        "job \"sharded\" is registered with daemons [node-a.test:7000, "
                        "node-b.test:7000, node-c.test:7001]; this request lists daemons "
                        "[node-a.test:7000, node-b.test:7000, node-d.test:7000]"));
  // A one-daemon list, and none at all, are other lists too.
  EXPECT_TRUE(HasStatus(RawRegister(*d.server, ForRank(Spec({Names()[1]}), 1)), kPrecondition,
                        "this request lists daemons [node-b.test:7000]"));
  EXPECT_TRUE(HasStatus(RawRegister(*d.server, ForRank(Spec({}), 1)), kPrecondition,
                        "this request lists daemons [] (the daemon called alone)"));

  const v1::JobStatus after = JobOf(*d.client);
  EXPECT_EQ(after.registered_ranks_size(), 1);
  EXPECT_EQ(DaemonsOf(after), Names());
  EXPECT_EQ(after.ShortDebugString(), before.ShortDebugString());
  EXPECT_TRUE(RawRegister(*d.server, ForRank(Spec(Names()), 1)).ok());
  EXPECT_EQ(JobOf(*d.client).registered_ranks_size(), 2);
}

TEST_F(DaemonListTest, EveryDaemonOfAThreeDaemonJobAnswersTheShardMapOfItsOwners) {
  // Three daemons advertising the addresses they are bound at: each asks the others for their
  // devices.
  std::vector<std::string> names;
  for (int i = 0; i < 3; ++i) {
    v1::DaemonConfig config = Config("");
    config.set_peer_timeout_ms(2000);
    RunningDaemon& d = Start(config);
    ASSERT_NE(d.client, nullptr);
    names.push_back(d.server->daemon().advertised_address());
  }
  std::sort(names.begin(), names.end());
  const v1::RegisterRequest spec = Spec(names);
  for (RunningDaemon& d : daemons_) {
    // Raw calls, rank by rank, to each daemon.
    for (int rank = 0; rank < 2; ++rank) {
      const absl::Status registered = RawRegister(*d.server, ForRank(spec, rank));
      ASSERT_TRUE(registered.ok()) << registered;
    }
  }
  std::vector<Owner> owners;
  for (const std::string& name : names) owners.push_back(Owner{name, kCpuDevice});
  absl::StatusOr<ShardMap> map = ComputeShardMap(JobTensorShapes(spec.tensors()), owners);
  ASSERT_TRUE(map.ok()) << map.status();

  std::vector<std::string> first;
  for (RunningDaemon& d : daemons_) {
    absl::StatusOr<v1::GetLayoutResponse> layout = d.client->GetLayout(kJob);
    ASSERT_TRUE(layout.ok()) << layout.status();
    std::vector<std::string> placements;
    int placement = 0;
    for (int i = 0; i < spec.tensors_size(); ++i) {
      for (const ShardPiece& piece : map->tensors[static_cast<size_t>(i)]) {
        ASSERT_LT(placement, layout->placements_size());
        const v1::GetLayoutResponse::Placement& p = layout->placements(placement++);
        EXPECT_EQ(p.tensor(), spec.tensors(i).name());
        EXPECT_EQ(p.daemon(), map->owners[static_cast<size_t>(piece.owner)].daemon);
        EXPECT_EQ(p.device(), kCpuDevice);
        EXPECT_EQ(p.row_begin(), piece.row_begin);
        EXPECT_EQ(p.row_end(), piece.row_end);
        placements.push_back(p.ShortDebugString());
      }
    }
    EXPECT_EQ(placement, layout->placements_size());
    if (first.empty()) first = placements;
    EXPECT_EQ(placements, first) << "every daemon answers the same layout";
  }
  // The map is spread: every daemon owns some rows.
  for (size_t o = 0; o < owners.size(); ++o) EXPECT_GT(map->owner_bytes[o], 0) << o;

  // A daemon of the job that is gone: the layout still answers, by the peer deadline, with the
  // same pieces, and that daemon's device unknown instead of guessed.
  const std::string gone = daemons_[2].server->daemon().advertised_address();
  daemons_[2].client.reset();
  daemons_[2].server->Shutdown();
  daemons_[2].server.reset();
  const auto asked = std::chrono::steady_clock::now();
  absl::StatusOr<v1::GetLayoutResponse> layout = daemons_[0].client->GetLayout(kJob);
  EXPECT_LT(std::chrono::steady_clock::now() - asked, std::chrono::seconds(10));
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(static_cast<size_t>(layout->placements_size()), first.size());
  int unknown = 0;
  for (const v1::GetLayoutResponse::Placement& p : layout->placements()) {
    EXPECT_EQ(p.device(), p.daemon() == gone ? kUnknownDevice : kCpuDevice) << p.daemon();
    unknown += p.daemon() == gone ? 1 : 0;
  }
  EXPECT_GT(unknown, 0);
}

TEST_F(DaemonListTest, StatusShowsTheAdvertisedAddressAndTheJobsListSortedByTheClient) {
  // Three real daemons, each advertising the address it is bound at; the client is given them out
  // of order and registers with each.
  std::vector<std::string> bound;
  for (int i = 0; i < 3; ++i) {
    RunningDaemon& d = Start(Config(""));
    ASSERT_NE(d.server, nullptr);
    bound.push_back(d.server->address());
  }
  std::vector<std::string> sorted = bound;
  std::sort(sorted.begin(), sorted.end());
  const std::vector<std::string> given = {sorted[2], sorted[0], sorted[1]};
  ClientOptions options;
  options.address = daemons_[0].server->address();
  options.daemons = given;
  options.max_attempts = 1;
  options.daemons_wait = std::chrono::milliseconds(0);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Register(ForRank(Spec({}), 0)).ok());
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<v1::StatusResponse> status = daemons_[static_cast<size_t>(i)].client->Status();
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_EQ(status->advertise_address(), bound[static_cast<size_t>(i)]);
    ASSERT_EQ(status->jobs_size(), 1);
    EXPECT_EQ(DaemonsOf(status->jobs(0)), sorted);
  }
}

TEST_F(DaemonListTest, ADaemonOnALoopbackAddressAdvertisesTheAddressItIsBoundAt) {
  RunningDaemon& d = Start(Config(""));
  ASSERT_NE(d.client, nullptr);
  absl::StatusOr<v1::StatusResponse> status = d.client->Status();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->advertise_address(), d.server->address());
  EXPECT_NE(d.server->address(), "127.0.0.1:0");
  // A list naming it by that address is its own.
  ASSERT_TRUE(d.client->Register(ForRank(Spec({d.server->address()}), 0)).ok());
  absl::StatusOr<v1::GetLayoutResponse> layout = d.client->GetLayout(kJob);
  ASSERT_TRUE(layout.ok()) << layout.status();
  for (const v1::GetLayoutResponse::Placement& p : layout->placements()) {
    EXPECT_EQ(p.daemon(), d.server->address());
  }
}

// A port on 127.0.0.1 nothing listens at now (a daemon is started there later, or never).
std::string FreeLoopbackAddress() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof(addr);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &size), 0);
  close(fd);
  return "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
}

// The daemons of a job may start after its trainers: Register waits for every daemon of the list
// to answer, and one that never does is named in DEADLINE_EXCEEDED, with nothing registered.
TEST_F(DaemonListTest, ARegisterWaitsForADaemonThatStartsLateAndNamesOneThatNeverAnswers) {
  const std::string late = FreeLoopbackAddress();
  RunningDaemon& d = Start(Config(""), {}, 10000);
  ASSERT_NE(d.client, nullptr);
  const std::string me = d.server->address();
  std::thread starter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(700));
    v1::DaemonConfig config = Config("");
    config.set_listen(late);
    Start(config);
  });
  const auto began = std::chrono::steady_clock::now();
  const absl::StatusOr<v1::RegisterResponse> registered =
      d.client->Register(ForRank(Spec({late, me}), 0));
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  starter.join();
  ASSERT_TRUE(registered.ok()) << registered.status();
  EXPECT_GE(waited, 0.5) << "Register did not wait for the late daemon";
  std::vector<std::string> both = {late, me};
  std::sort(both.begin(), both.end());
  EXPECT_EQ(DaemonsOf(JobOf(*d.client)), both);

  RunningDaemon& impatient = Start(Config(""), {}, 300);
  ASSERT_NE(impatient.client, nullptr);
  const std::string never = FreeLoopbackAddress();
  v1::RegisterRequest request = ForRank(Spec({impatient.server->address(), never}), 0);
  request.set_job("never");
  EXPECT_TRUE(HasStatus(impatient.client->Register(request).status(),
                        absl::StatusCode::kDeadlineExceeded, never + " of its daemons"));
  absl::StatusOr<v1::StatusResponse> status = impatient.client->Status();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->jobs_size(), 0) << "a Register that timed out registered a job";
}

// A list entry "dns:NAME:PORT" stands for every address NAME resolves to, as a Kubernetes headless
// Service answers one node address per ready daemon: three daemons on 127.0.0.1, .2 and .3 at one
// port. Register resolves the name again until it gives daemons_count addresses (one daemon is not
// ready at first) and sends the sorted list; a name that never gives that many is
// DEADLINE_EXCEEDED showing its answer, with nothing registered; a malformed entry is
// INVALID_ARGUMENT at once; the system's resolver answers a numeric name.
TEST_F(DaemonListTest, ADnsNameInTheListStandsForTheAddressesItResolvesTo) {
  const std::string free = FreeLoopbackAddress();
  const std::string port = free.substr(free.rfind(':') + 1);
  std::vector<std::string> addresses;
  for (const char* host : {"127.0.0.3", "127.0.0.1", "127.0.0.2"}) {
    v1::DaemonConfig config = Config("");
    config.set_listen(absl::StrCat(host, ":", port));
    RunningDaemon& d = Start(config);
    ASSERT_NE(d.server, nullptr) << host;
    addresses.push_back(d.server->address());
  }
  std::sort(addresses.begin(), addresses.end());
  const std::string name = "paramd.paramd.svc.test";
  std::atomic<int> asked{0};
  ClientOptions options;
  options.address = addresses[0];
  options.daemons = {absl::StrCat("dns:", name, ":", port)};
  options.daemons_count = 3;
  options.daemons_wait = std::chrono::seconds(10);
  options.max_attempts = 1;
  options.resolver =
      [&](const std::string& asked_name) -> absl::StatusOr<std::vector<std::string>> {
    EXPECT_EQ(asked_name, name);
    if (asked++ < 2) return std::vector<std::string>{"127.0.0.2", "127.0.0.3"};
    return std::vector<std::string>{"127.0.0.3", "127.0.0.1", "127.0.0.2"};
  };
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  const absl::StatusOr<v1::RegisterResponse> registered = (*client)->Register(ForRank(Spec({}), 0));
  ASSERT_TRUE(registered.ok()) << registered.status();
  EXPECT_GE(asked.load(), 3) << "Register did not resolve the name again";
  EXPECT_EQ(DaemonsOf(JobOf(**client)), addresses);

  // Two addresses forever, three wanted: DEADLINE_EXCEEDED with the answer, nothing registered.
  options.daemons_wait = std::chrono::milliseconds(1200);
  options.resolver = [](const std::string&) -> absl::StatusOr<std::vector<std::string>> {
    return std::vector<std::string>{"127.0.0.2", "127.0.0.3"};
  };
  client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  v1::RegisterRequest request = ForRank(Spec({}), 0);
  request.set_job("short");
  EXPECT_TRUE(HasStatus((*client)->Register(request).status(), absl::StatusCode::kDeadlineExceeded,
                        absl::StrCat("resolved to [127.0.0.2:", port, ", 127.0.0.3:", port,
                                     "] (2 addresses), not the 3 daemons")));
  absl::StatusOr<v1::StatusResponse> status = (*client)->Status("short");
  EXPECT_FALSE(status.ok() && status->jobs_size() > 0) << "a Register that gave up registered";

  // Malformed entries; the system's resolver on a numeric name.
  for (const char* entry : {"dns:", "dns:paramd", "dns::50051", "dns:paramd:0", "dns:paramd:x"}) {
    EXPECT_TRUE(HasStatus(ResolveDaemonList({entry}).status(), absl::StatusCode::kInvalidArgument,
                          "is not dns:NAME:PORT"))
        << entry;
  }
  const absl::StatusOr<std::vector<std::string>> numeric =
      ResolveDaemonList({"node-b.test:7000", absl::StrCat("dns:127.0.0.1:", port)});
  ASSERT_TRUE(numeric.ok()) << numeric.status();
  EXPECT_EQ(*numeric,
            (std::vector<std::string>{absl::StrCat("127.0.0.1:", port), "node-b.test:7000"}));
}

}  // namespace
}  // namespace paramd
