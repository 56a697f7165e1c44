// The client library's deadlines and retries against a real daemon: a daemon that is not there
// is a clear UNAVAILABLE within the connect deadline; a daemon that restarts on the same port is
// reached again by retried idempotent calls; a draining daemon is not retried; a daemon cannot
// start on a port another one serves; a push has time for its bytes beyond the RPC deadline.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <span>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "server/rpc/server.h"
#include "tests/unit/server/reference_job.h"

namespace paramd {
namespace {

using std::chrono::milliseconds;

v1::DaemonConfig Config(const std::string& listen) {
  v1::DaemonConfig config;
  config.set_listen(listen);
  config.set_metrics_listen("");
  config.set_step_threads(1);
  config.set_log_level("warning");
  return config;
}

TEST(ClientRetryTest, APushHasTimeForItsBytesBeyondTheRpcTimeout) {
  // 256 MiB of initial weights take the daemon well over the 300 ms that Register takes here (it
  // writes them, the state and the served versions into fresh memory); at 1 MiB a second the push
  // gets 256 s more, far more than any build of the daemon takes.
  auto server = Server::Start(Config("127.0.0.1:0"));
  ASSERT_TRUE(server.ok()) << server.status();
  ClientOptions options;
  options.address = (*server)->address();
  options.rpc_timeout = milliseconds(300);
  options.push_bytes_per_second = int64_t{1} << 20;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  constexpr int64_t kRows = 8192, kCols = 8192;
  const v1::RegisterRequest spec =
      testing::MakeSpec("large", 1, {{"w", kRows, kCols, v1::ELEMENT_TYPE_BF16}});
  const absl::StatusOr<v1::RegisterResponse> registered = (*client)->Register(spec);
  ASSERT_TRUE(registered.ok()) << registered.status();
  const std::vector<float> weights(static_cast<size_t>(kRows * kCols), 0.25f);
  const PushItem item{"w", std::as_bytes(std::span<const float>(weights))};
  const auto start = std::chrono::steady_clock::now();
  const absl::Status uploaded =
      (*client)->UploadInitialWeights("large", std::span<const PushItem>(&item, 1));
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(uploaded.ok()) << uploaded;
  (*server)->Shutdown();
  // The case this test is for is a push that ran past rpc_timeout: a daemon that took the bytes
  // sooner could not tell it.
  if (took <= options.rpc_timeout) GTEST_SKIP() << "the upload was quicker than rpc_timeout here";
}

TEST(ClientRetryTest, ConnectingWhereNoDaemonListensIsUnavailableNamingTheAddress) {
  // A port that was free a moment ago: bind a server, note its port, stop it.
  auto server = Server::Start(Config("127.0.0.1:0"));
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->address();
  (*server)->Shutdown();
  server->reset();

  ClientOptions options;
  options.address = address;
  options.connect_timeout = milliseconds(300);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  ASSERT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(client.status().message(), address)) << client.status();
}

TEST(ClientRetryTest, IdempotentCallsAreRetriedUntilARestartedDaemonAnswers) {
  auto first = Server::Start(Config("127.0.0.1:0"));
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string address = (*first)->address();
  ClientOptions options;
  options.address = address;
  options.max_attempts = 30;  // backoff 50 ms doubling to 2 s: well over a second in all
  options.rpc_timeout = milliseconds(500);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Status().ok());

  (*first)->Shutdown();
  first->reset();
  // The daemon comes back on the same port while the client is already retrying.
  std::promise<std::unique_ptr<Server>> restarted;
  std::thread restart([&] {
    std::this_thread::sleep_for(milliseconds(400));
    auto server = Server::Start(Config(address));
    restarted.set_value(server.ok() ? *std::move(server) : nullptr);
  });
  absl::StatusOr<v1::StatusResponse> status = (*client)->Status();
  restart.join();
  std::unique_ptr<Server> second = restarted.get_future().get();
  ASSERT_NE(second, nullptr) << "the port could not be bound again";
  EXPECT_TRUE(status.ok()) << status.status();
  second->Shutdown();
}

TEST(ClientRetryTest, ADrainingDaemonIsNotRetried) {
  auto server = Server::Start(Config("127.0.0.1:0"));
  ASSERT_TRUE(server.ok()) << server.status();
  ClientOptions options;
  options.address = (*server)->address();
  options.max_attempts = 30;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Drain().ok());
  const auto start = std::chrono::steady_clock::now();
  v1::SetHyperparamsRequest request;
  request.set_job("any");
  request.set_lr(0.1);
  absl::StatusOr<v1::SetHyperparamsResponse> response = (*client)->SetHyperparams(request);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(response.status().message(), "draining")) << response.status();
  // Thirty attempts with backoff would take over half a minute.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  (*server)->Shutdown();
}

// Launchers pick a port and try the next one where it is taken (deploy/slurm); gRPC's default
// SO_REUSEPORT would let a second daemon of the same user bind it too and take half of the
// first one's connections.
TEST(ClientRetryTest, ADaemonCannotStartOnAPortAnotherDaemonServes) {
  auto first = Server::Start(Config("127.0.0.1:0"));
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string address = (*first)->address();
  auto second = Server::Start(Config(address));
  ASSERT_EQ(second.status().code(), absl::StatusCode::kUnavailable)
      << "a second daemon started on " << address;
  EXPECT_TRUE(absl::StrContains(second.status().message(), address)) << second.status();
  (*first)->Shutdown();
}

}  // namespace
}  // namespace paramd
