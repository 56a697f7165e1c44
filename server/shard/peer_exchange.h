// The agreement of a sharded job's daemons (DESIGN.md §5's Peer service, §7). A round (job, step,
// name) is all-gathered by push: each daemon sends its offer to every other daemon of the job
// (Peer.Offer), keeps the offers the others send it, and once it holds every daemon's offer, its
// own included, it has them in the job's daemon order, the same on every daemon: each computes the
// round's result (found-inf, the clip from the block sums in registration order, a split tensor's
// amax) from the same values in the same order.
//
// Nothing hangs: a daemon that does not answer is called again until the deadline
// (peer_timeout_ms), and a round whose offers do not all come by then fails with a status that
// names the daemons it did not hear from.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "paramd/v1/peer.grpc.pb.h"

namespace paramd {

class PeerExchange {
 public:
  // `timeout`: peer_timeout_ms; `max_rounds_per_job`: rounds a job may hold waiting for their
  // offers, past which another daemon's offer of a new round is RESOURCE_EXHAUSTED.
  explicit PeerExchange(std::chrono::milliseconds timeout, int max_rounds_per_job = 64);
  ~PeerExchange();
  PeerExchange(const PeerExchange&) = delete;
  PeerExchange& operator=(const PeerExchange&) = delete;

  // Told of every round Exchange ends: the job, the seconds it waited, whether it gathered them.
  using RoundObserver = std::function<void(const std::string& job, double seconds, bool ok)>;
  // Set before the daemon serves.
  void set_round_observer(RoundObserver observer) { observer_ = std::move(observer); }
  // The token its offers carry where the daemons take tokens (common/token_file.h's PeerToken).
  // Set before the first offer.
  void set_token(std::string token) { token_ = std::move(token); }
  const std::string& token() const { return token_; }

  // This daemon's advertised address, the name jobs' daemon lists give it (known once the server
  // has bound its port).
  void SetSelf(std::string address);

  // Job `job`, sharded over `daemons` (sorted, distinct, naming this daemon), takes part from now
  // on.
  // Opening it again with the same list does nothing; with another list it is FAILED_PRECONDITION.
  absl::Status OpenJob(const std::string& job, const std::vector<std::string>& daemons);
  // The job is gone: its rounds are dropped, and an Exchange waiting on one fails with `why`.
  void CloseJob(const std::string& job, const absl::Status& why);

  // The job went back to step `step` (an import or a restore, between steps): its rounds of that
  // step and later ones, held or remembered as gathered, are forgotten, so that the steps run
  // again exchange afresh.
  void Rewind(const std::string& job, int64_t step);

  // Peer.Offer: stores another daemon's offer of a round. OK for an offer identical to one stored
  // or of a round already gathered; NOT_FOUND for a job not open here; PERMISSION_DENIED for a
  // sender outside the job's list (or this daemon itself); FAILED_PRECONDITION for a different
  // offer of a round offered; INVALID_ARGUMENT for an offer without a round or a step below 0;
  // RESOURCE_EXHAUSTED past max_rounds_per_job waiting rounds.
  absl::Status Accept(const v1::PeerOffer& offer);

  // This daemon's part of round (own.job, own.step, own.round): sends `own` (its `from` set here)
  // to every other daemon of the round and waits until every one's offer of the round is here.
  // The round's daemons are `among` (indexes into the job's list, sorted, this daemon's included:
  // a split tensor's owners), or every daemon of the job where it is empty.
  // Returns the offers in the job's daemon order, this daemon's included. DEADLINE_EXCEEDED or
  // UNAVAILABLE naming the daemons not heard from by the deadline; another daemon's refusal of the
  // offer as its status, naming that daemon; NOT_FOUND for a job not open here.
  absl::StatusOr<std::vector<v1::PeerOffer>> Exchange(v1::PeerOffer own,
                                                      std::vector<int> among = {});

  // Rounds held waiting for offers, over all jobs.
  int rounds_held() const;

 private:
  struct Round {
    std::vector<std::optional<v1::PeerOffer>> offers;  // by the sender's index in the list
    int count = 0;
  };
  struct JobRounds {
    std::vector<std::string> daemons;
    std::map<std::pair<int64_t, std::string>, Round> rounds;
    // Rounds gathered lately, whose late duplicates (a peer's retry) are acknowledged, not kept.
    std::deque<std::pair<int64_t, std::string>> gathered;
    absl::Status closed;  // set once the job is closed
  };

  // Sends `offer` to `peer` until it is stored there or `deadline` passes.
  absl::Status Send(const std::string& peer, const v1::PeerOffer& offer,
                    std::chrono::system_clock::time_point deadline);
  std::shared_ptr<v1::Peer::Stub> StubFor(const std::string& peer);
  static absl::Status Store(JobRounds& job, int index, const v1::PeerOffer& offer);

  absl::StatusOr<std::vector<v1::PeerOffer>> Gather(v1::PeerOffer own, std::vector<int> among);

  const std::chrono::milliseconds timeout_;
  RoundObserver observer_;
  const int max_rounds_per_job_;
  mutable absl::Mutex mu_;
  std::string self_ ABSL_GUARDED_BY(mu_);
  std::string token_;  // set once, before the first offer
  std::map<std::string, std::shared_ptr<JobRounds>> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<v1::Peer::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace paramd
