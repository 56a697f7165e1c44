// The daemon's end of `nccl` (nccl.h): offered on a cuda:N backend. It answers Attach as cuda_ipc
// does (the exported allocations, here by address and size, and a rank's slot places) and runs the
// sessions: an Attach of purpose nccl_open starts a 2-rank communicator, joined as rank 0 in
// NCCL's background while the trainer joins as rank 1; a transfer (nccl_transfer) waits for the
// join, checks that every span lies in the exported memory, queues its side on the session's stream
// (a send first waits for the backend's step event: a version is published while its step may still
// run), and answers once it ran. A transfer runs on the calling RPC's thread, one per session at a
// time.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "transport/nccl/communicator.h"
#include "transport/nccl/nccl.h"

namespace paramd {
namespace {

// Sessions one daemon keeps: a new one past this drops the oldest (its trainer opens another).
constexpr size_t kMaxSessions = 64;
// How long a transfer (the session's join included) may take where the call names none.
constexpr std::chrono::milliseconds kDefaultTimeout{60000};
constexpr std::chrono::milliseconds kMaxTimeout{600000};

std::chrono::milliseconds TimeoutOf(const v1::NcclTransfer& call) {
  if (call.timeout_ms() <= 0) return kDefaultTimeout;
  return std::min(kMaxTimeout, std::chrono::milliseconds(call.timeout_ms()));
}

// One trainer's communicator with this backend, and the stream its transfers run on.
struct Session {
  ~Session() {
    comm.reset();  // aborts: no transfer of it waits for a peer that left
    if (stream != nullptr) {
      const DeviceScope scope(device);
      cudaStreamDestroy(stream);
    }
  }
  std::mutex mu;  // one transfer at a time: both sides queue in the same order
  int device = -1;
  std::string job;  // whose exported memory its transfers may touch
  std::unique_ptr<NcclCommunicator> comm;
  cudaStream_t stream = nullptr;
};

class NcclDaemonEnd final : public DaemonEnd {
 public:
  explicit NcclDaemonEnd(TransportHost& host) : host_(host) {}

  std::string why_not_offered() const override {
    if (host_.device_exports().has_value()) return std::string();
    return absl::StrCat("the daemon's backend is ", host_.backend_name(),
                        ", which keeps no GPU memory; nccl needs a cuda:N backend");
  }

  std::optional<Memory> memory() const override { return Memory::kDevice; }

  absl::Status Attach(const v1::AttachRequest& request, v1::AttachResponse* response) override {
    if (request.has_nccl_open()) return Open(request, response);
    if (request.has_nccl_transfer()) return Transfer(request);
    return AttachPlaced(
        host_, Memory::kDevice, request,
        [this](const std::string& job, v1::AttachResponse* r) {
          Describe(job, r);
          return absl::OkStatus();
        },
        response);
  }

 private:
  // The regions of job `job`'s exported memory (none for "").
  void Describe(const std::string& job, v1::AttachResponse* response) const {
    const DeviceExports exports = *host_.device_exports(job);
    v1::NcclRegions* regions = response->mutable_nccl();
    regions->clear_bases();
    regions->clear_sizes();
    for (size_t i = 0; i < exports.bases.size() && i < exports.sizes.size(); ++i) {
      regions->add_bases(exports.bases[i]);
      regions->add_sizes(exports.sizes[i]);
    }
    regions->set_device(exports.device);
    regions->set_device_uuid(exports.uuid);
    response->set_instance(host_.instance());
  }

  // A session for the trainer of the request's job: its transfers touch that job's memory alone.
  absl::Status Open(const v1::AttachRequest& request, v1::AttachResponse* response) {
    if (request.job().empty()) {
      return absl::InvalidArgumentError(
          "an nccl session is opened for a job: name it (AttachRequest.job)");
    }
    const DeviceExports exports = *host_.device_exports(request.job());
    absl::StatusOr<std::string> id = NewNcclUniqueId();
    if (!id.ok()) return id.status();
    auto session = std::make_shared<Session>();
    session->device = exports.device;
    session->job = request.job();
    {
      const DeviceScope scope(exports.device);
      if (!scope.status().ok()) return scope.status();
      PARAMD_CUDA_RETURN_IF_ERROR(
          cudaStreamCreateWithFlags(&session->stream, cudaStreamNonBlocking));
    }
    absl::StatusOr<std::unique_ptr<NcclCommunicator>> comm =
        NcclCommunicator::Start(*id, 2, 0, exports.device);
    if (!comm.ok()) return comm.status();
    session->comm = *std::move(comm);
    uint64_t number = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      do {
        number = random_();
      } while (number == 0 || sessions_.count(number) > 0);
      std::erase_if(order_, [&](uint64_t n) { return sessions_.count(n) == 0; });  // dropped
      if (sessions_.size() >= kMaxSessions) {
        sessions_.erase(order_.front());
        order_.erase(order_.begin());
      }
      sessions_[number] = session;
      order_.push_back(number);
    }
    Describe(request.job(), response);
    response->mutable_nccl()->set_unique_id(*id);
    response->mutable_nccl()->set_session(number);
    return absl::OkStatus();
  }

  // The session, or NOT_FOUND.
  absl::StatusOr<std::shared_ptr<Session>> Find(uint64_t number) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(number);
    if (it == sessions_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no nccl session ", number,
                       " at this daemon (it restarted, or dropped the session "
                       "after a failed transfer or for a newer one); open another"));
    }
    return it->second;
  }

  void Drop(uint64_t number) {
    std::lock_guard<std::mutex> lock(mu_);
    sessions_.erase(number);
  }

  // Every span within one allocation of the session's job.
  absl::Status CheckSpans(const v1::NcclTransfer& call, const DeviceExports& exports) const {
    for (const v1::NcclSpan& span : call.spans()) {
      bool inside = false;
      for (size_t i = 0; i < exports.bases.size() && i < exports.sizes.size() && !inside; ++i) {
        inside = span.bytes() >= 0 && span.address() >= exports.bases[i] &&
                 span.address() - exports.bases[i] <= static_cast<uint64_t>(exports.sizes[i]) &&
                 static_cast<uint64_t>(span.bytes()) <=
                     static_cast<uint64_t>(exports.sizes[i]) - (span.address() - exports.bases[i]);
      }
      if (!inside) {
        return absl::InvalidArgumentError(
            absl::StrCat("nccl span [", span.address(), ", +", span.bytes(),
                         ") is not inside the exported GPU memory of this session's job "
                         "(NcclRegions); nothing moved"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status Transfer(const v1::AttachRequest& request) {
    const v1::NcclTransfer& call = request.nccl_transfer();
    // The caller may use the job it names (the service checked); the spans lie in that job's
    // memory, and the session is that job's.
    const DeviceExports exports = *host_.device_exports(request.job());
    PARAMD_RETURN_IF_ERROR(CheckSpans(call, exports));
    PARAMD_ASSIGN_OR_RETURN(std::shared_ptr<Session> session, Find(call.session()));
    if (session->job != request.job()) {
      return absl::PermissionDeniedError(absl::StrCat("nccl session ", call.session(),
                                                      " is not job \"", request.job(),
                                                      "\"'s; open one for it"));
    }
    std::lock_guard<std::mutex> lock(session->mu);
    const auto deadline = std::chrono::steady_clock::now() + TimeoutOf(call);
    // The trainer joins as soon as Open answered: the first transfer waits for that at most.
    absl::Status status = session->comm->Joined(deadline);
    std::vector<NcclCommunicator::Piece> pieces;
    for (const v1::NcclSpan& span : call.spans()) {
      pieces.push_back(
          {reinterpret_cast<void*>(span.address()), static_cast<size_t>(span.bytes())});
    }
    if (status.ok() && !call.to_daemon() && exports.step_event_local != 0) {
      // The served bytes may be a version whose step still runs on the backend's stream.
      const DeviceScope scope(session->device);
      status = scope.status();
      if (status.ok()) {
        status = CudaStatus(
            cudaStreamWaitEvent(session->stream,
                                reinterpret_cast<cudaEvent_t>(exports.step_event_local), 0),
            "cudaStreamWaitEvent(the step event)");
      }
    }
    if (status.ok()) {
      status =
          session->comm->Queue(pieces, /*send=*/!call.to_daemon(), /*peer=*/1, session->stream);
    }
    if (status.ok()) {
      status = session->comm->Wait(session->stream,
                                   std::chrono::duration_cast<std::chrono::milliseconds>(
                                       deadline - std::chrono::steady_clock::now()));
    }
    if (!status.ok()) {
      Drop(call.session());  // its communicator is aborted: the trainer opens another
      return absl::Status(status.code(),
                          absl::StrCat("nccl session ", call.session(), ": ", status.message()));
    }
    return absl::OkStatus();
  }

  TransportHost& host_;
  std::mutex mu_;
  std::mt19937_64 random_{std::random_device{}()};
  std::map<uint64_t, std::shared_ptr<Session>> sessions_;
  std::vector<uint64_t> order_;  // sessions, oldest first
};

}  // namespace

std::unique_ptr<DaemonEnd> MakeNcclDaemonEnd(TransportHost& host) {
  return std::make_unique<NcclDaemonEnd>(host);
}

}  // namespace paramd
