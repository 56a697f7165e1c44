// The Peer service over real RPCs (DESIGN.md §5, §7): three real daemons on 127.0.0.1 port 0 agree
// on rounds of a sharded job. Every daemon gets every daemon's offer, in the job's daemon order,
// whatever order they come in; a daemon that is down makes the others' round fail by the deadline
// (peer_timeout_ms) with a status naming it, and nothing hangs; an offer from outside the job's
// list, for a job not shared, or different from one already made is refused with its code; a
// retried offer is taken once; a daemon holds a bounded number of waiting rounds.
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/grpc_status.h"
#include "paramd/v1/peer.grpc.pb.h"
#include "server/rpc/server.h"

namespace paramd {
namespace {

constexpr char kJob[] = "sharded";

std::unique_ptr<Server> StartDaemon(int peer_timeout_ms) {
  v1::DaemonConfig config;
  config.set_listen("127.0.0.1:0");
  config.set_backend("cpu");
  config.set_step_threads(1);
  config.set_metrics_listen("");
  config.set_peer_timeout_ms(peer_timeout_ms);
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(WithDefaults(config));
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

class PeerExchangeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 3; ++i) {
      daemons_.push_back(StartDaemon(i == 0 ? 1500 : 20000));
      ASSERT_NE(daemons_.back(), nullptr);
      names_.push_back(daemons_.back()->daemon().advertised_address());
    }
    std::sort(names_.begin(), names_.end());
    for (auto& d : daemons_) ASSERT_TRUE(d->daemon().peers().OpenJob(kJob, names_).ok());
  }
  void TearDown() override {
    for (auto& d : daemons_) {
      if (d != nullptr) d->Shutdown();
    }
  }

  static v1::PeerOffer Offer(int64_t step, const std::string& round, bool finite, double sum,
                             float amax) {
    v1::PeerOffer offer;
    offer.set_job(kJob);
    offer.set_step(step);
    offer.set_round(round);
    offer.set_finite(finite);
    v1::PeerBlockSums* sums = offer.add_block_sums();
    sums->set_tensor(0);
    sums->set_first_block(0);
    sums->add_sums(sum);
    offer.set_amax(amax);
    return offer;
  }

  // Peer.Offer sent to daemon `to` as daemon `from` would.
  absl::Status SendAs(size_t to, const std::string& from, v1::PeerOffer offer) {
    offer.set_from(from);
    auto stub = v1::Peer::NewStub(
        grpc::CreateChannel(daemons_[to]->address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    v1::PeerOfferResponse response;
    return FromGrpcStatus(stub->Offer(&context, offer, &response));
  }

  // A series of daemon `i`'s metrics, 0 where absent.
  double Metric(size_t i, const std::string& series) {
    const std::string text = prometheus::TextSerializer().Serialize(
        daemons_[i]->daemon().metrics().registry().Collect());
    const size_t at = text.find(series + " ");
    return at == std::string::npos ? 0 : std::stod(text.substr(at + series.size() + 1));
  }

  std::vector<std::unique_ptr<Server>> daemons_;
  std::vector<std::string> names_;
};

TEST_F(PeerExchangeTest, EveryDaemonGetsEveryOfferInTheJobsDaemonOrder) {
  for (int64_t step = 0; step < 20; ++step) {
    std::vector<absl::StatusOr<std::vector<v1::PeerOffer>>> got(3);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < 3; ++i) {
      threads.emplace_back([&, i] {
        // The daemons come to the round at different times.
        std::this_thread::sleep_for(std::chrono::milliseconds((step * 7 + i * 3) % 5));
        const std::string self = daemons_[i]->daemon().advertised_address();
        const size_t rank = std::find(names_.begin(), names_.end(), self) - names_.begin();
        got[i] = daemons_[i]->daemon().peers().Exchange(
            Offer(step, "check", !(step == 7 && rank == 2), 1.5 * (rank + 1), 0.25f * rank));
      });
    }
    for (std::thread& t : threads) t.join();
    for (size_t i = 0; i < 3; ++i) {
      ASSERT_TRUE(got[i].ok()) << got[i].status();
      ASSERT_EQ(got[i]->size(), 3u);
      for (size_t k = 0; k < 3; ++k) {
        const v1::PeerOffer& o = (*got[i])[k];
        EXPECT_EQ(o.from(), names_[k]);
        EXPECT_EQ(o.step(), step);
        EXPECT_EQ(o.finite(), !(step == 7 && k == 2));
        EXPECT_EQ(o.block_sums(0).sums(0), 1.5 * (k + 1));
        EXPECT_EQ(o.amax(), 0.25f * k);
      }
    }
  }
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(daemons_[i]->daemon().peers().rounds_held(), 0);
    // Each daemon counts its rounds and how long it waited in them (Peer latency).
    EXPECT_EQ(Metric(i, absl::StrCat("paramd_peer_rounds_total{outcome=\"ok\",training_job=\"",
                                     kJob, "\"}")),
              20);
    EXPECT_EQ(Metric(i, absl::StrCat("paramd_peer_round_duration_seconds_count{training_job=\"",
                                     kJob, "\"}")),
              20);
  }
}

TEST_F(PeerExchangeTest, ADaemonThatIsDownFailsTheRoundByTheDeadlineNamingIt) {
  // Daemon 2 goes down; daemon 0 (peer_timeout_ms 1500) starts a round.
  const std::string gone = daemons_[2]->daemon().advertised_address();
  daemons_[2]->Shutdown();
  daemons_[2].reset();
  const auto started = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<v1::PeerOffer>> got =
      daemons_[0]->daemon().peers().Exchange(Offer(0, "check", true, 1.0, 0.0f));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  ASSERT_FALSE(got.ok());
  EXPECT_TRUE(absl::IsUnavailable(got.status()) || absl::IsDeadlineExceeded(got.status()))
      << got.status();
  EXPECT_NE(got.status().message().find(gone), std::string::npos) << got.status();
  EXPECT_LT(seconds, 1.5 + 2.0) << "the round outlived its deadline";
  EXPECT_GT(seconds, 1.0) << "the round gave up long before its deadline";
  EXPECT_EQ(daemons_[0]->daemon().peers().rounds_held(), 0);
  EXPECT_EQ(Metric(0, absl::StrCat("paramd_peer_rounds_total{outcome=\"failed\",training_job=\"",
                                   kJob, "\"}")),
            1);
}

TEST_F(PeerExchangeTest, ABadOfferIsRefusedWithItsCodeAndChangesNothing) {
  const std::string a = daemons_[0]->daemon().advertised_address();
  const std::string other = a == names_[0] ? names_[1] : names_[0];
  // From outside the job's list, or as the receiving daemon itself.
  EXPECT_EQ(SendAs(0, "10.9.9.9:1", Offer(0, "check", true, 1, 0)).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(SendAs(0, a, Offer(0, "check", true, 1, 0)).code(),
            absl::StatusCode::kPermissionDenied);
  // A job this daemon does not share.
  v1::PeerOffer unknown = Offer(0, "check", true, 1, 0);
  unknown.set_job("another");
  EXPECT_EQ(SendAs(0, other, unknown).code(), absl::StatusCode::kNotFound);
  // No round, a negative step.
  EXPECT_EQ(SendAs(0, other, Offer(0, "", true, 1, 0)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SendAs(0, other, Offer(-1, "check", true, 1, 0)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(daemons_[0]->daemon().peers().rounds_held(), 0);
  // An offer again is taken once; a different one for the same round is refused.
  EXPECT_TRUE(SendAs(0, other, Offer(3, "check", true, 1, 0)).ok());
  EXPECT_TRUE(SendAs(0, other, Offer(3, "check", true, 1, 0)).ok());
  EXPECT_EQ(SendAs(0, other, Offer(3, "check", false, 1, 0)).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(daemons_[0]->daemon().peers().rounds_held(), 1);
}

TEST_F(PeerExchangeTest, ADaemonHoldsABoundedNumberOfWaitingRounds) {
  const std::string a = daemons_[0]->daemon().advertised_address();
  const std::string other = a == names_[0] ? names_[1] : names_[0];
  int taken = 0;
  absl::Status refused;
  for (int step = 0; step < 200; ++step) {
    const absl::Status s = SendAs(0, other, Offer(step, "check", true, 1, 0));
    if (!s.ok()) {
      refused = s;
      break;
    }
    ++taken;
  }
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_EQ(taken, 64);
  EXPECT_EQ(daemons_[0]->daemon().peers().rounds_held(), 64);
}

}  // namespace
}  // namespace paramd
