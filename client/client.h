// The thin client library trainers link: connect, register, push, commit, pull. Every call has a
// deadline; idempotent calls (all of them: pushes and commits are idempotent by design) are
// retried with backoff while the daemon is UNAVAILABLE. Errors are statuses carrying the daemon's
// message.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "paramd/v1/control.grpc.pb.h"
#include "paramd/v1/data.grpc.pb.h"
#include "transport/transport.h"

namespace paramd {

struct ClientOptions {
  // Daemon address, "host:port".
  std::string address = "127.0.0.1:50051";
  // Transport name, or "auto" for the first viable one (DESIGN.md §6).
  std::string transport = "auto";
  // Deadline of each unary call and each push.
  std::chrono::milliseconds rpc_timeout{30000};
  // How long Connect waits for the daemon to answer.
  std::chrono::milliseconds connect_timeout{10000};
  // Attempts of a call while the daemon answers UNAVAILABLE (1 = no retry).
  int max_attempts = 5;
  // Largest message the client accepts (pull chunks).
  int max_message_bytes = 64 << 20;
};

class Client {
 public:
  // Opens a channel and waits (up to connect_timeout) until the daemon answers.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);

  // Registers a rank and picks the transport (logged, with its reason).
  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request);
  // Rank 0 uploads the initial FP32 weights (version 0).
  absl::Status UploadInitialWeights(const std::string& job, std::span<const PushItem> items);
  // Pushes gradients of `step` from `rank`.
  absl::Status PushGradients(const std::string& job, int32_t rank, int64_t step,
                             std::span<const PushItem> items);
  absl::StatusOr<v1::CommitResponse> Commit(const std::string& job, int32_t rank, int64_t step,
                                            std::optional<double> lr = std::nullopt,
                                            std::optional<double> grad_scale = std::nullopt);
  // Waits up to `timeout` for target.min_version and copies the served bytes into `out`.
  absl::Status Pull(const PullTarget& target, std::chrono::milliseconds timeout, Pulled* out);

  absl::StatusOr<v1::StatusResponse> Status(const std::string& job = "");
  absl::StatusOr<v1::GetLayoutResponse> GetLayout(const std::string& job);
  absl::StatusOr<v1::SetHyperparamsResponse> SetHyperparams(
      const v1::SetHyperparamsRequest& request);
  absl::StatusOr<v1::DrainResponse> Drain();

  // The transport chosen at Register ("" before).
  std::string transport_name() const { return transport_ ? transport_->name() : ""; }
  const std::string& transport_reason() const { return transport_reason_; }

 private:
  explicit Client(const ClientOptions& options, std::shared_ptr<grpc::Channel> channel);
  Deadline NextDeadline() const;
  // Calls `attempt` until it is not UNAVAILABLE or the attempts run out.
  absl::Status Retry(const std::function<absl::Status()>& attempt) const;
  absl::Status NeedTransport() const;

  const ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Control::Stub> control_;
  std::unique_ptr<v1::Data::Stub> data_;
  std::unique_ptr<Transport> transport_;
  std::string transport_reason_;
};

}  // namespace paramd
