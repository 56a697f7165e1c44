// Tokens at the boundary (server/rpc/access.h): a daemon with a token file answers every call
// without a token, or with one it does not have, UNAUTHENTICATED; a trainer token reaches the jobs
// its line names and nothing else (PERMISSION_DENIED, the other job unchanged); admin reaches
// everything; the Peer service takes peer tokens; the file must be its owner's alone; SIGHUP's
// reload takes a token away. Real gRPC on a real port, the C++ client with ClientOptions::token.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "client/client.h"
#include "common/grpc_status.h"
#include "common/owner_address.h"
#include "common/token_file.h"
#include "paramd/v1/data.grpc.pb.h"
#include "paramd/v1/peer.grpc.pb.h"
#include "server/rpc/server.h"
#include "tests/integration/sharded_run.h"
#include "tests/unit/server/reference_job.h"
#include "tests/unit/server/status_assertions.h"

namespace paramd {
namespace {

using testing::HasStatus;
using testing::MakeSpec;
using testing::RandomGradients;
using testing::RandomWeights;
using testing::ToBytes;

constexpr char kAdmin[] = "admin-token-0123456789";
constexpr char kTrainerA[] = "trainer-a-token-0123456789";
constexpr char kTeam[] = "team-token-0123456789";
constexpr char kPeer[] = "peer-token-0123456789";
constexpr absl::StatusCode kUnauthenticated = absl::StatusCode::kUnauthenticated;
constexpr absl::StatusCode kDenied = absl::StatusCode::kPermissionDenied;

std::string WriteFile(const std::string& path, const std::string& text, mode_t mode) {
  std::ofstream(path) << text;
  chmod(path.c_str(), mode);
  return path;
}

class TokensTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/tokens_test." + std::to_string(getpid());
    mkdir(dir_.c_str(), 0700);
    tokens_ = WriteFile(
        dir_ + "/tokens",
        absl::StrCat("# role token jobs\n", "admin ", kAdmin, "\n", "trainer ", kTrainerA,
                     " job-a\n", "trainer ", kTeam,
                     " team-*   # every job whose name begins team-\n", "peer ", kPeer, "\n"),
        0600);
    v1::DaemonConfig config;
    config.set_listen("127.0.0.1:0");
    config.set_metrics_listen("");
    config.set_backend("cpu:1");
    config.set_log_level("error");  // shared memory on: a place pull takes a lease
    config.set_token_file(tokens_);
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(config);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    admin_ = Connect(kAdmin);
    a_ = Connect(kTrainerA);
    // The admin makes job-b, which trainer A's token does not name.
    RegisterAndUpload(*admin_, "job-b");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<Client> Connect(const std::string& token) {
    ClientOptions options;
    options.address = server_->address();
    options.transport = "inline";
    options.max_attempts = 1;
    options.token_file = "";
    options.token = token;
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  static v1::RegisterRequest Spec(const std::string& job) {
    return MakeSpec(job, 1, {{"w", 4, 8}});
  }
  static void RegisterAndUpload(Client& client, const std::string& job) {
    ASSERT_TRUE(client.Register(Spec(job)).ok());
    const std::string weights = ToBytes(RandomWeights(Spec(job), 3)[0]);
    const PushItem items[] = {
        {"w", std::as_bytes(std::span<const char>(weights.data(), weights.size()))}};
    ASSERT_TRUE(client.UploadInitialWeights(job, items).ok());
  }
  // One step of `job` through `client`: push, commit, pull version `step + 1`.
  static absl::Status Step(Client& client, const std::string& job, int64_t step) {
    const std::string g = RandomGradients(Spec(job), 10 + static_cast<uint64_t>(step))[0][0];
    const PushItem items[] = {{"w", std::as_bytes(std::span<const char>(g.data(), g.size()))}};
    if (absl::Status s = client.PushGradients(job, 0, step, items); !s.ok()) return s;
    if (absl::Status s = client.Commit(job, 0, step).status(); !s.ok()) return s;
    Pulled pulled;
    v1::ServeFormat format;
    format.set_recipe(v1::RECIPE_FP32);
    return client.Pull({job, "w", format, step + 1}, std::chrono::seconds(20), &pulled);
  }

  std::string dir_;
  std::string tokens_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<Client> admin_;
  std::unique_ptr<Client> a_;
};

TEST_F(TokensTest, ACallWithoutATokenOrWithAnUnknownOneIsUnauthenticated) {
  for (const std::string& token : {std::string(), std::string("not-a-token-of-this-daemon")}) {
    std::unique_ptr<Client> client = Connect(token);
    ASSERT_NE(client, nullptr);
    EXPECT_TRUE(HasStatus(client->Register(Spec("job-a")), kUnauthenticated, "")) << token;
    EXPECT_TRUE(HasStatus(client->Status("job-b"), kUnauthenticated, "")) << token;
    EXPECT_TRUE(HasStatus(client->Drain(), kUnauthenticated, "")) << token;
    // The data service too (the client would not push before its Register).
    auto data = v1::Data::NewStub(OwnerChannel(server_->address(), {}, token));
    grpc::ClientContext context;
    v1::CommitRequest commit;
    commit.set_job("job-b");
    v1::CommitResponse committed;
    EXPECT_EQ(data->Commit(&context, commit, &committed).error_code(),
              grpc::StatusCode::UNAUTHENTICATED)
        << token;
  }
  absl::StatusOr<v1::StatusResponse> b = admin_->Status("job-b");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->jobs(0).tensors(0).version(), 0);
  EXPECT_FALSE(server_->daemon().draining());
}

TEST_F(TokensTest, ATrainerTokenReachesTheJobsItsLineNamesAndNoOther) {
  RegisterAndUpload(*a_, "job-a");
  for (int64_t step = 0; step < 2; ++step) EXPECT_TRUE(Step(*a_, "job-a", step).ok());
  ASSERT_TRUE(a_->ExportState("job-a").ok());
  // Job B: every call refused, and B as it was.
  EXPECT_TRUE(HasStatus(a_->Register(Spec("job-b")), kDenied, "use job \"job-b\""));
  EXPECT_TRUE(HasStatus(a_->GetLayout("job-b"), kDenied, "job-b"));
  EXPECT_TRUE(HasStatus(a_->Status("job-b"), kDenied, "job-b"));
  v1::SetHyperparamsRequest hyper;
  hyper.set_job("job-b");
  hyper.set_lr(1.0);
  EXPECT_TRUE(HasStatus(a_->SetHyperparams(hyper), kDenied, "job-b"));
  EXPECT_TRUE(HasStatus(Step(*a_, "job-b", 0), kDenied, "job-b"));
  EXPECT_TRUE(HasStatus(a_->ExportState("job-b"), kDenied, "job-b"));
  absl::StatusOr<JobState> a_state = a_->ExportState("job-a");
  ASSERT_TRUE(a_state.ok());
  JobState into_b = *a_state;
  into_b.job = "job-b";
  EXPECT_TRUE(HasStatus(a_->ImportState(into_b), kDenied, "job-b"));
  EXPECT_TRUE(HasStatus(a_->Checkpoint("job-b"), kDenied, "job-b"));
  EXPECT_TRUE(HasStatus(a_->DeleteJob("job-b"), kDenied, "job-b"));
  EXPECT_TRUE(HasStatus(a_->Register(Spec("job-c")), kDenied, "job-c"));
  absl::StatusOr<v1::StatusResponse> b = admin_->Status("job-b");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->jobs(0).tensors(0).version(), 0) << "job-b stepped";
  // What spans jobs or the daemon is the admin's.
  EXPECT_TRUE(HasStatus(a_->Status(), kDenied, "an admin token"));
  // The daemon's own figures (its address, its backends, which a client asks before it registers)
  // are any token's.
  absl::StatusOr<v1::StatusResponse> own = a_->Status("", /*daemon_only=*/true);
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(own->jobs_size(), 0);
  EXPECT_TRUE(HasStatus(a_->Drain(), kDenied, "an admin token"));
  EXPECT_FALSE(server_->daemon().draining());
  absl::StatusOr<v1::StatusResponse> all = admin_->Status();
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->jobs_size(), 2);
  // The admin steps job B too.
  EXPECT_TRUE(Step(*admin_, "job-b", 0).ok());
}

TEST_F(TokensTest, AJobNamePatternCoversTheJobsItBegins) {
  std::unique_ptr<Client> team = Connect(kTeam);
  RegisterAndUpload(*team, "team-x");
  EXPECT_TRUE(Step(*team, "team-x", 0).ok());
  EXPECT_TRUE(HasStatus(team->Register(Spec("teamx")), kDenied, "teamx"));
  EXPECT_TRUE(HasStatus(team->Status("job-a"), kDenied, "job-a"));
}

TEST_F(TokensTest, AJobsSharedMemoryIsNamedOnlyToCallersThatMayUseTheJob) {
  RegisterAndUpload(*a_, "job-a");
  const auto segments = [&](const std::string& token, const std::string& job) {
    auto data = v1::Data::NewStub(OwnerChannel(server_->address(), {}, token));
    grpc::ClientContext context;
    v1::AttachRequest request;
    request.set_transport("shm");
    request.set_job(job);
    request.mutable_regions();
    v1::AttachResponse response;
    const absl::Status status = FromGrpcStatus(data->Attach(&context, request, &response));
    return status.ok() ? absl::StatusOr<std::vector<std::string>>(std::vector<std::string>(
                             response.shm().segments().begin(), response.shm().segments().end()))
                       : absl::StatusOr<std::vector<std::string>>(status);
  };
  absl::StatusOr<std::vector<std::string>> a = segments(kTrainerA, "job-a");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(HasStatus(segments(kTrainerA, "job-b"), kDenied, "job-b"));
  EXPECT_TRUE(HasStatus(segments("", "job-b"), kUnauthenticated, ""));
  absl::StatusOr<std::vector<std::string>> b = segments(kAdmin, "job-b");
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_FALSE(a->empty());
  ASSERT_FALSE(b->empty());
  for (const std::string& name : *a) {
    EXPECT_EQ(std::count(b->begin(), b->end(), name), 0) << name << " is job-b's too";
  }
}

TEST_F(TokensTest, ALeaseOfAnotherJobIsNotReleased) {
  v1::ServeFormat format;
  format.set_recipe(v1::RECIPE_FP32);
  // Leases are taken by place pulls; job B's is made through the raw Pull with the admin token.
  auto data = v1::Data::NewStub(OwnerChannel(server_->address(), {}, kAdmin));
  grpc::ClientContext context;
  v1::PullRequest request;
  request.set_job("job-b");
  request.set_tensor("w");
  *request.mutable_format() = format;
  request.set_delivery(v1::PULL_DELIVERY_PLACE);
  auto reader = data->Pull(&context, request);
  v1::PullChunk chunk;
  ASSERT_TRUE(reader->Read(&chunk));
  for (v1::PullChunk more; reader->Read(&more);) {
  }
  const grpc::Status pulled = reader->Finish();
  ASSERT_TRUE(pulled.ok()) << pulled.error_message();
  ASSERT_TRUE(chunk.header().has_place()) << "the daemon gave no place (no shared memory?)";
  ASSERT_EQ(server_->daemon().leases().Held("job-b"), 1);
  auto as_a = v1::Data::NewStub(OwnerChannel(server_->address(), {}, kTrainerA));
  grpc::ClientContext release_context;
  v1::ReleaseRequest release;
  release.add_leases(chunk.header().lease());
  v1::ReleaseResponse released;
  ASSERT_TRUE(as_a->Release(&release_context, release, &released).ok());
  EXPECT_EQ(released.released(), 0);
  EXPECT_EQ(server_->daemon().leases().Held("job-b"), 1);
}

TEST_F(TokensTest, ThePeerServiceTakesPeerTokensOnly) {
  v1::PeerOffer offer;
  offer.set_job("job-b");
  for (const char* token : {kTrainerA, kTeam}) {
    auto peer = v1::Peer::NewStub(OwnerChannel(server_->address(), {}, token));
    grpc::ClientContext context;
    v1::PeerOfferResponse response;
    EXPECT_EQ(peer->Offer(&context, offer, &response).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  auto peer = v1::Peer::NewStub(OwnerChannel(server_->address(), {}, kPeer));
  grpc::ClientContext context;
  v1::PeerOfferResponse response;
  const grpc::Status offered = peer->Offer(&context, offer, &response);
  EXPECT_NE(offered.error_code(), grpc::StatusCode::PERMISSION_DENIED) << offered.error_message();
  EXPECT_NE(offered.error_code(), grpc::StatusCode::UNAUTHENTICATED) << offered.error_message();
  // A peer token reads a job's status (its device) and does nothing else.
  std::unique_ptr<Client> as_peer = Connect(kPeer);
  EXPECT_TRUE(as_peer->Status("job-b").ok());
  EXPECT_TRUE(HasStatus(as_peer->Register(Spec("job-b")), kDenied, "not a peer token"));
  EXPECT_TRUE(HasStatus(as_peer->ExportState("job-b"), kDenied, "not a peer token"));
}

TEST_F(TokensTest, AReloadTakesATokenAwayAndAFileOthersMayReadIsRefused) {
  EXPECT_EQ(a_->Status("job-b").status().code(), kDenied);
  WriteFile(tokens_, absl::StrCat("admin ", kAdmin, "\n"), 0600);
  ASSERT_TRUE(server_->ReloadTokens().ok());
  EXPECT_TRUE(HasStatus(a_->Status("job-a"), kUnauthenticated, "not one of this daemon's"));
  EXPECT_TRUE(admin_->Status("job-b").ok());
  // A file others may read (or, not root's, its group) is not read again: the tokens stay as
  // they were.
  WriteFile(tokens_, absl::StrCat("admin ", kAdmin, "\ntrainer ", kTrainerA, " job-a\n"),
            geteuid() == 0 ? 0644 : 0640);
  EXPECT_TRUE(HasStatus(server_->ReloadTokens(), absl::StatusCode::kInvalidArgument, "chmod 600"));
  EXPECT_TRUE(HasStatus(a_->Status("job-a"), kUnauthenticated, ""));
  // And no daemon starts with one.
  v1::DaemonConfig config;
  config.set_listen("127.0.0.1:0");
  config.set_metrics_listen("");
  config.set_token_file(tokens_);
  EXPECT_TRUE(HasStatus(Server::Start(config), absl::StatusCode::kInvalidArgument, "other users"));
}

// A job sharded over three daemons that share the token file: their agreement rounds (clipping,
// stochastic rounding) go over the Peer service with the file's peer token, and the trainers'
// token ($PARAMD_TOKEN_FILE, read by every client the run makes) names the job; every step
// serves the one-daemon job's bytes.
TEST(TokensShardedTest, TheDaemonsOfAShardedJobAgreeWithTheirPeerToken) {
  const std::string dir = ::testing::TempDir() + "/tokens_sharded." + std::to_string(getpid());
  mkdir(dir.c_str(), 0700);
  const std::string tokens = WriteFile(
      dir + "/tokens",
      absl::StrCat("trainer ", kTrainerA, " ", sharded_run::kJob, "\npeer ", kPeer, "\n"), 0600);
  const std::string mine = WriteFile(dir + "/trainer.token", kTrainerA, 0600);
  ASSERT_EQ(setenv("PARAMD_TOKEN_FILE", mine.c_str(), 1), 0);
  std::unique_ptr<Server> single = sharded_run::StartDaemon(30000, "", "cpu", tokens);
  std::vector<std::unique_ptr<Server>> sharded;
  std::vector<std::string> names;
  for (int i = 0; i < 3; ++i) {
    sharded.push_back(sharded_run::StartDaemon(30000, "", "cpu", tokens));
    ASSERT_NE(sharded.back(), nullptr);
    names.push_back(sharded.back()->daemon().advertised_address());
  }
  std::sort(names.begin(), names.end());
  ASSERT_NE(single, nullptr);
  sharded_run::ExpectShardedRunMatchesOneDaemon(sharded_run::Spec(), single->address(),
                                                sharded[1]->address(), names, 6,
                                                sharded_run::StatusOf);
  unsetenv("PARAMD_TOKEN_FILE");
  for (auto& d : sharded) d->Shutdown();
  single->Shutdown();
  std::filesystem::remove_all(dir);
}

// The token files themselves (common/token_file.h): what a line must be.
TEST(TokenFileTest, LinesThatAreNotATokenAreRefusedNamingTheLine) {
  const std::string dir = ::testing::TempDir();
  const auto refused = [&](const std::string& text, const std::string& why) {
    const std::string path = WriteFile(dir + "/bad_tokens", text, 0600);
    return HasStatus(ReadTokenFile(path), absl::StatusCode::kInvalidArgument, why);
  };
  EXPECT_TRUE(refused("admin short\n", "at least 16 characters"));
  EXPECT_TRUE(refused("owner 0123456789abcdef\n", "trainer, admin or peer"));
  EXPECT_TRUE(
      refused("admin 0123456789abcdef\npeer 0123456789abcdef\n", "line 2: a token named twice"));
  EXPECT_TRUE(refused("trainer 0123456789abcdef\n", "names its jobs"));
  EXPECT_TRUE(refused("admin 0123456789abcdef job-a\n", "only a trainer token names jobs"));
  EXPECT_TRUE(refused("# nothing\n\n", "has no token"));
  const std::string client =
      WriteFile(dir + "/client_token", "# mine\n  0123456789abcdef  \n", 0600);
  absl::StatusOr<std::string> token = ReadClientToken(client);
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "0123456789abcdef");
  chmod(client.c_str(), 0644);
  EXPECT_TRUE(HasStatus(ReadClientToken(client), absl::StatusCode::kInvalidArgument, "chmod 600"));
  // Root's file that one group may read (a Kubernetes Secret with an fsGroup) is taken; one the
  // group may write, or others read, is not.
  if (geteuid() == 0) {
    chmod(client.c_str(), 0440);
    EXPECT_TRUE(ReadClientToken(client).ok());
    chmod(client.c_str(), 0640);
    EXPECT_TRUE(ReadClientToken(client).ok());
    chmod(client.c_str(), 0660);
    EXPECT_TRUE(HasStatus(ReadClientToken(client), absl::StatusCode::kInvalidArgument, "640"));
    chmod(client.c_str(), 0604);
    EXPECT_TRUE(HasStatus(ReadClientToken(client), absl::StatusCode::kInvalidArgument, "640"));
  }
}

}  // namespace
}  // namespace paramd
