#include "server/shard/peer_exchange.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grpc_status.h"
#include "common/owner_address.h"
#include "common/quoted.h"
#include "google/protobuf/util/message_differencer.h"

namespace paramd {
namespace {

// Rounds remembered as gathered per job, so that a retried offer of one is acknowledged.
constexpr size_t kGatheredKept = 1024;
constexpr size_t kMaxRoundName = 64;

std::string RoundName(const v1::PeerOffer& offer) {
  return absl::StrCat("job ", Quoted(offer.job()), " step ", offer.step(), " round ",
                      Quoted(offer.round()));
}

}  // namespace

PeerExchange::PeerExchange(std::chrono::milliseconds timeout, int max_rounds_per_job)
    : timeout_(timeout), max_rounds_per_job_(max_rounds_per_job) {}

PeerExchange::~PeerExchange() = default;

void PeerExchange::SetSelf(std::string address) {
  absl::MutexLock lock(&mu_);
  self_ = std::move(address);
}

absl::Status PeerExchange::OpenJob(const std::string& job,
                                   const std::vector<std::string>& daemons) {
  absl::MutexLock lock(&mu_);
  if (!std::is_sorted(daemons.begin(), daemons.end()) ||
      std::adjacent_find(daemons.begin(), daemons.end()) != daemons.end() ||
      !std::binary_search(daemons.begin(), daemons.end(), self_)) {
    return absl::InvalidArgumentError(absl::StrCat("the daemon list of job ", Quoted(job),
                                                   " must be sorted, without repeats, ",
                                                   "and name this daemon (", self_, ")"));
  }
  auto it = jobs_.find(job);
  if (it != jobs_.end()) {
    if (it->second->daemons == daemons) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", Quoted(job), " takes part in the peer agreement with daemons [",
        absl::StrJoin(it->second->daemons, ", "), "], not [", absl::StrJoin(daemons, ", "), "]"));
  }
  auto rounds = std::make_shared<JobRounds>();
  rounds->daemons = daemons;
  jobs_.emplace(job, std::move(rounds));
  return absl::OkStatus();
}

void PeerExchange::Rewind(const std::string& job, int64_t step) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return;
  JobRounds& rounds = *it->second;
  std::erase_if(rounds.rounds, [step](const auto& entry) { return entry.first.first >= step; });
  std::erase_if(rounds.gathered, [step](const auto& key) { return key.first >= step; });
}

void PeerExchange::CloseJob(const std::string& job, const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return;
  it->second->closed = why.ok() ? absl::CancelledError("the job was closed") : why;
  jobs_.erase(it);
}

absl::Status PeerExchange::Store(JobRounds& job, int index, const v1::PeerOffer& offer) {
  const std::pair<int64_t, std::string> key{offer.step(), offer.round()};
  auto it = job.rounds.find(key);
  if (it == job.rounds.end()) {
    it = job.rounds.emplace(key, Round{}).first;
    it->second.offers.resize(job.daemons.size());
  }
  Round& round = it->second;
  std::optional<v1::PeerOffer>& slot = round.offers[static_cast<size_t>(index)];
  if (slot.has_value()) {
    if (google::protobuf::util::MessageDifferencer::Equals(*slot, offer)) {
      return absl::OkStatus();
    }
    return absl::FailedPreconditionError(
        absl::StrCat(RoundName(offer), ": daemon ", offer.from(),
                     " offered different values before; an offer is sent once per round"));
  }
  slot = offer;
  ++round.count;
  return absl::OkStatus();
}

absl::Status PeerExchange::Accept(const v1::PeerOffer& offer) {
  if (offer.round().empty() || offer.round().size() > kMaxRoundName || offer.step() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a peer offer names a round of 1 to ", kMaxRoundName,
                     " characters and a step >= 0; this one has round ", Quoted(offer.round()),
                     " and step ", offer.step()));
  }
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(offer.job());
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("daemon ", self_, " holds no sharded job ",
                                            Quoted(offer.job()), " to agree on"));
  }
  JobRounds& job = *it->second;
  const auto sender = std::lower_bound(job.daemons.begin(), job.daemons.end(), offer.from());
  if (sender == job.daemons.end() || *sender != offer.from() || offer.from() == self_) {
    return absl::PermissionDeniedError(
        absl::StrCat("daemon ", Quoted(offer.from()), " is not another daemon of job ",
                     Quoted(offer.job()), " (daemons [", absl::StrJoin(job.daemons, ", "), "])"));
  }
  const std::pair<int64_t, std::string> key{offer.step(), offer.round()};
  if (std::find(job.gathered.begin(), job.gathered.end(), key) != job.gathered.end()) {
    return absl::OkStatus();  // a retry of an offer this daemon has used already
  }
  if (job.rounds.find(key) == job.rounds.end() &&
      static_cast<int>(job.rounds.size()) >= max_rounds_per_job_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(RoundName(offer), ": daemon ", self_, " holds ", job.rounds.size(),
                     " rounds of the job waiting for offers, its limit"));
  }
  return Store(job, static_cast<int>(sender - job.daemons.begin()), offer);
}

std::shared_ptr<v1::Peer::Stub> PeerExchange::StubFor(const std::string& peer) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<v1::Peer::Stub>& stub = stubs_[peer];
  if (stub == nullptr) {
    stub = v1::Peer::NewStub(OwnerChannel(peer, {}, token_));
  }
  return stub;
}

absl::Status PeerExchange::Send(const std::string& peer, const v1::PeerOffer& offer,
                                std::chrono::system_clock::time_point deadline) {
  std::shared_ptr<v1::Peer::Stub> stub = StubFor(peer);
  auto backoff = std::chrono::milliseconds(5);
  absl::Status last;
  while (true) {
    grpc::ClientContext context;
    context.set_deadline(deadline);
    v1::PeerOfferResponse response;
    last = FromGrpcStatus(stub->Offer(&context, offer, &response));
    // A daemon not up yet, or not yet holding the job, is called again until the deadline.
    const bool again = absl::IsUnavailable(last) || absl::IsNotFound(last);
    if (!again || std::chrono::system_clock::now() + backoff >= deadline) break;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
  if (last.ok()) return last;
  return absl::Status(last.code(),
                      absl::StrCat(RoundName(offer), ": daemon ", peer,
                                   " did not take this daemon's offer: ", last.message()));
}

absl::StatusOr<std::vector<v1::PeerOffer>> PeerExchange::Exchange(v1::PeerOffer own,
                                                                  std::vector<int> among) {
  const auto started = std::chrono::steady_clock::now();
  const std::string job = own.job();
  absl::StatusOr<std::vector<v1::PeerOffer>> offers = Gather(std::move(own), std::move(among));
  if (observer_) {
    observer_(job,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(),
              offers.ok());
  }
  return offers;
}

absl::StatusOr<std::vector<v1::PeerOffer>> PeerExchange::Gather(v1::PeerOffer own,
                                                                std::vector<int> among) {
  const auto deadline = std::chrono::system_clock::now() + timeout_;
  std::shared_ptr<JobRounds> job;
  std::string self;
  {
    absl::MutexLock lock(&mu_);
    self = self_;
    own.set_from(self);
    auto it = jobs_.find(own.job());
    if (it == jobs_.end()) {
      return absl::NotFoundError(
          absl::StrCat("daemon ", self_, " holds no sharded job ", Quoted(own.job())));
    }
    job = it->second;
    const int index = static_cast<int>(
        std::lower_bound(job->daemons.begin(), job->daemons.end(), self_) - job->daemons.begin());
    const int n = static_cast<int>(job->daemons.size());
    if (among.empty()) {
      for (int i = 0; i < n; ++i) among.push_back(i);
    }
    if (!std::is_sorted(among.begin(), among.end()) ||
        std::adjacent_find(among.begin(), among.end()) != among.end() || among.front() < 0 ||
        among.back() >= n || !std::binary_search(among.begin(), among.end(), index)) {
      return absl::InvalidArgumentError(
          absl::StrCat(RoundName(own),
                       ": the daemons of a round are distinct indexes into the "
                       "job's list, sorted, this daemon's among them"));
    }
    if (absl::Status s = Store(*job, index, own); !s.ok()) return s;
  }
  // The sends run at once, one thread per other daemon of the round, each until its offer is taken.
  std::vector<absl::Status> sent(job->daemons.size());
  std::vector<std::thread> senders;
  for (const int i : among) {
    if (job->daemons[static_cast<size_t>(i)] == self) continue;
    senders.emplace_back([&, i] {
      sent[static_cast<size_t>(i)] = Send(job->daemons[static_cast<size_t>(i)], own, deadline);
    });
  }
  for (std::thread& t : senders) t.join();
  const std::pair<int64_t, std::string> key{own.step(), own.round()};
  absl::MutexLock lock(&mu_);
  for (const absl::Status& s : sent) {
    if (!s.ok()) {
      job->rounds.erase(key);  // the job fails with it; nothing of the round is kept
      return s;
    }
  }
  auto complete = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {  // mu_ held
    if (!job->closed.ok()) return true;
    auto it = job->rounds.find(key);
    if (it == job->rounds.end()) return false;
    for (const int i : among) {
      if (!it->second.offers[static_cast<size_t>(i)].has_value()) return false;
    }
    return true;
  };
  mu_.AwaitWithDeadline(absl::Condition(&complete), absl::FromChrono(deadline));
  if (!job->closed.ok()) return job->closed;
  auto it = job->rounds.find(key);
  if (it == job->rounds.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat(RoundName(own), " was gathered by another call; a round is exchanged once"));
  }
  if (!complete()) {
    std::vector<std::string> silent;
    for (const int i : among) {
      if (!it->second.offers[static_cast<size_t>(i)].has_value()) {
        silent.push_back(job->daemons[static_cast<size_t>(i)]);
      }
    }
    const absl::Status status = absl::DeadlineExceededError(
        absl::StrCat(RoundName(own), ": no offer from daemon", silent.size() > 1 ? "s " : " ",
                     absl::StrJoin(silent, ", "), " within peer_timeout_ms = ", timeout_.count(),
                     "; a daemon of the job is down or cut off"));
    job->rounds.erase(it);
    return status;
  }
  std::vector<v1::PeerOffer> offers;
  offers.reserve(among.size());
  for (const int i : among) offers.push_back(std::move(*it->second.offers[static_cast<size_t>(i)]));
  job->rounds.erase(it);
  job->gathered.push_back(key);
  if (job->gathered.size() > kGatheredKept) job->gathered.pop_front();
  return offers;
}

int PeerExchange::rounds_held() const {
  absl::MutexLock lock(&mu_);
  int total = 0;
  for (const auto& [name, job] : jobs_) total += static_cast<int>(job->rounds.size());
  return total;
}

}  // namespace paramd
