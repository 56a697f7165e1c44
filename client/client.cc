#include "client/client.h"

#include <arpa/inet.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/sharded_job.h"
#include "common/element_type.h"
#include "common/error_reason.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/owner_address.h"
#include "common/quoted.h"
#include "common/status_macros.h"
#include "common/token_file.h"
#include "paramd/v1/data.grpc.pb.h"

namespace paramd {
namespace {

// Runs one unary RPC with a deadline and converts its status.
template <typename Call>
absl::Status Unary(Deadline deadline, Call&& call) {
  grpc::ClientContext context;
  context.set_deadline(deadline);
  return FromGrpcStatus(call(&context));
}

// The system's answer for `name`: its IPv4 addresses, or where it has none its IPv6 ones (in
// brackets). A dual-stack name answers both for each daemon, which advertises one.
absl::StatusOr<std::vector<std::string>> SystemResolve(const std::string& name) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(name.c_str(), nullptr, &hints, &found); rc != 0) {
    return absl::NotFoundError(
        absl::StrCat("the name ", Quoted(name), " does not resolve: ", gai_strerror(rc)));
  }
  std::vector<std::string> hosts, hosts6;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    if (a->ai_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
      if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) != nullptr) hosts.push_back(text);
    } else if (a->ai_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(a->ai_addr);
      if (inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text)) != nullptr) {
        hosts6.push_back(absl::StrCat("[", text, "]"));
      }
    }
  }
  freeaddrinfo(found);
  return hosts.empty() ? hosts6 : hosts;
}

bool NamesADnsEntry(const std::vector<std::string>& entries) {
  return std::any_of(entries.begin(), entries.end(),
                     [](const std::string& e) { return absl::StartsWith(e, "dns:"); });
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& given) {
  ClientOptions options = given;
  if (!options.token_file.empty()) {
    PARAMD_ASSIGN_OR_RETURN(options.token, ReadClientToken(options.token_file));
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  // A daemon that restarts is found again within a second or so, not after gRPC's default
  // reconnect backoff (up to 120 s), which would outlast any reconnect_timeout.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  std::shared_ptr<grpc::Channel> channel = OwnerChannel(options.address, args, options.token);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + options.connect_timeout)) {
    return absl::UnavailableError(absl::StrCat("no paramd answered at ", options.address,
                                               " within ", options.connect_timeout.count(),
                                               " ms; is the daemon running there?"));
  }
  return std::unique_ptr<Client>(new Client(options, std::move(channel)));
}

Client::Client(const ClientOptions& options, std::shared_ptr<grpc::Channel> channel)
    : options_(options),
      channel_(std::move(channel)),
      control_(v1::Control::NewStub(channel_)),
      data_(v1::Data::NewStub(channel_)) {}

Client::~Client() = default;

std::string Client::transport_name() const {
  if (sharded_ != nullptr) return sharded_->transports();
  return transport_ ? transport_->name() : "";
}

std::vector<Client::OwnerTransport> Client::transport_traits() const {
  if (sharded_ != nullptr) return sharded_->transport_traits();
  if (transport_ == nullptr) return {};
  return {OwnerTransport{"", transport_->name(), transport_->traits()}};
}

Deadline Client::NextDeadline() const {
  return std::chrono::system_clock::now() + options_.rpc_timeout;
}

namespace {

int64_t PushBytes(std::span<const PushItem> items) {
  int64_t bytes = 0;
  for (const PushItem& item : items) bytes += static_cast<int64_t>(item.data.size());
  return bytes;
}

}  // namespace

Deadline Client::PushDeadline(std::span<const PushItem> items) const {
  const int64_t pace = std::max<int64_t>(options_.push_bytes_per_second, 1000);  // bytes/s
  return NextDeadline() + std::chrono::milliseconds(PushBytes(items) / (pace / 1000));
}

absl::Status Client::Retry(const std::function<absl::Status()>& attempt) const {
  std::chrono::milliseconds backoff{50};
  absl::Status status;
  const auto reconnect_until = std::chrono::steady_clock::now() + options_.reconnect_timeout;
  for (int i = 0;
       i < std::max(1, options_.max_attempts) || std::chrono::steady_clock::now() < reconnect_until;
       ++i) {
    if (i > 0) {
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds{2000});
    }
    status = attempt();
    // A draining daemon answers UNAVAILABLE too, with its reason: a retry cannot help.
    const bool draining = ReasonOf(status) == v1::ERROR_REASON_DRAINING;
    if (status.code() != absl::StatusCode::kUnavailable || draining) break;
  }
  return status;
}

absl::Status Client::Restarted() const {
  return absl::AbortedError(absl::StrCat(
      "the daemon at ", options_.address,
      " restarted since this client registered; it serves what it restored from its checkpoints: "
      "register again to learn the step to resume from"));
}

absl::Status Client::CheckStart() const {
  v1::StatusRequest request;
  v1::StatusResponse response;
  PARAMD_RETURN_IF_ERROR(Unary(NextDeadline(), [&](grpc::ClientContext* context) {
    return control_->Status(context, request, &response);
  }));
  const uint64_t known = instance_.load();
  if (known != 0 && response.instance() != known) restarted_.store(true);
  return absl::OkStatus();
}

absl::StatusOr<bool> Client::DaemonRestarted() const {
  if (!restarted_.load()) PARAMD_RETURN_IF_ERROR(Retry([&] { return CheckStart(); }));
  return restarted_.load();
}

absl::Status Client::RetryData(const std::function<absl::Status()>& attempt) const {
  if (restarted_.load()) return Restarted();
  bool lost = false;
  return Retry([&]() -> absl::Status {
    if (lost) {
      // The connection broke: the daemon may be another start now, which knows nothing of this
      // call's step or version. From then on every such call is ABORTED, until Register.
      PARAMD_RETURN_IF_ERROR(CheckStart());
      if (restarted_.load()) return Restarted();
    }
    const absl::Status status = attempt();
    if (status.code() == absl::StatusCode::kUnavailable) lost = true;
    return status;
  });
}

absl::Status Client::NeedTransport() const {
  if (transport_ == nullptr) {
    return absl::FailedPreconditionError("call Register before pushing or pulling");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ResolveDaemonList(const std::vector<std::string>& entries,
                                                           const NameResolver& resolve) {
  std::vector<std::string> list;
  for (const std::string& entry : entries) {
    if (!absl::StartsWith(entry, "dns:")) {
      list.push_back(entry);
      continue;
    }
    const std::string rest = entry.substr(4);
    const size_t colon = rest.rfind(':');
    int port = 0;
    if (colon == std::string::npos || colon == 0 ||
        !absl::SimpleAtoi(rest.substr(colon + 1), &port) || port < 1 || port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("daemon list entry ", Quoted(entry),
                       " is not dns:NAME:PORT with a port in 1..65535 (the port every daemon "
                       "listens on, as it advertises itself)"));
    }
    const std::string name = rest.substr(0, colon);
    absl::StatusOr<std::vector<std::string>> hosts = resolve ? resolve(name) : SystemResolve(name);
    if (!hosts.ok()) return hosts.status();
    if (hosts->empty()) {
      return absl::NotFoundError(absl::StrCat("the name ", Quoted(name), " resolves to nothing"));
    }
    for (const std::string& host : *hosts) list.push_back(absl::StrCat(host, ":", port));
  }
  std::sort(list.begin(), list.end());
  list.erase(std::unique(list.begin(), list.end()), list.end());
  return list;
}

absl::StatusOr<std::vector<std::string>> Client::ResolveDaemons(
    const std::string& job, const std::vector<std::string>& entries) const {
  if (!NamesADnsEntry(entries)) return entries;
  const auto deadline = std::chrono::steady_clock::now() + options_.daemons_wait;
  const int want = options_.daemons_count;
  while (true) {
    absl::StatusOr<std::vector<std::string>> list = ResolveDaemonList(entries, options_.resolver);
    if (absl::IsInvalidArgument(list.status())) return list.status();
    if (list.ok() && (want == 0 ? !list->empty() : static_cast<int>(list->size()) == want)) {
      return list;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      const std::string answer = list.ok() ? absl::StrCat("[", absl::StrJoin(*list, ", "), "] (",
                                                          list->size(), " addresses)")
                                           : list.status().ToString();
      return absl::DeadlineExceededError(absl::StrCat(
          "job \"", job, "\": the daemon list [", absl::StrJoin(entries, ", "), "] resolved to ",
          answer, want > 0 ? absl::StrCat(", not the ", want, " daemons of daemons_count") : "",
          " within ", options_.daemons_wait.count(),
          " ms (ClientOptions::daemons_wait); a daemon that is not ready is missing from a DNS "
          "answer. Nothing was registered"));
    }
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
        std::chrono::milliseconds(500), deadline - std::chrono::steady_clock::now()));
  }
}

absl::Status Client::WaitForDaemons(
    const std::string& job, const google::protobuf::RepeatedPtrField<std::string>& daemons) const {
  const Deadline deadline = std::chrono::system_clock::now() + options_.daemons_wait;
  // One call to each, which waits for its channel to be ready; any answer but UNAVAILABLE or the
  // deadline is a daemon.
  std::vector<std::unique_ptr<v1::Control::Stub>> stubs;
  for (const std::string& address : daemons) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    stubs.push_back(v1::Control::NewStub(OwnerChannel(address, args, options_.token)));
  }
  // The calls wait side by side (one that never answers must not use up the others' time).
  std::vector<char> answered(stubs.size(), 0);
  std::vector<std::thread> calls;
  for (size_t i = 0; i < stubs.size(); ++i) {
    calls.emplace_back([&, i] {
      v1::StatusRequest request;
      request.set_job(job);
      v1::StatusResponse response;
      grpc::ClientContext context;
      context.set_deadline(deadline);
      context.set_wait_for_ready(true);
      const grpc::StatusCode code = stubs[i]->Status(&context, request, &response).error_code();
      answered[i] =
          code != grpc::StatusCode::UNAVAILABLE && code != grpc::StatusCode::DEADLINE_EXCEEDED;
    });
  }
  for (std::thread& call : calls) call.join();
  std::vector<std::string> silent;
  for (size_t i = 0; i < stubs.size(); ++i) {
    if (!answered[i]) silent.push_back(daemons[static_cast<int>(i)]);
  }
  if (silent.empty()) return absl::OkStatus();
  return absl::DeadlineExceededError(absl::StrCat(
      "job \"", job, "\": ", absl::StrJoin(silent, ", "), " of its daemons [",
      absl::StrJoin(daemons, ", "), "] did not answer within ", options_.daemons_wait.count(),
      " ms; start a daemon at each (advertising that address), or give them longer "
      "(ClientOptions::daemons_wait). Nothing was registered"));
}

absl::StatusOr<std::vector<std::string>> Client::OwnerAddresses(
    const std::vector<std::string>& daemons) const {
  // One Status of each daemon named without a backend (this one for an empty list), asked once:
  // a daemon that does not answer is kept as named, and its registration says why it fails.
  auto backends = [&](v1::Control::Stub& control, bool retry) -> std::vector<std::string> {
    v1::StatusRequest request;
    request.set_daemon_only(true);
    v1::StatusResponse response;
    auto ask = [&] {
      return Unary(NextDeadline(), [&](grpc::ClientContext* context) {
        return control.Status(context, request, &response);
      });
    };
    const absl::Status status = retry ? Retry(ask) : ask();
    if (!status.ok() || response.backend_addresses_size() < 2) return {};
    return {response.backend_addresses().begin(), response.backend_addresses().end()};
  };
  // The daemon connected to is waited for as its Register is (one restarting is found again).
  if (daemons.empty()) return backends(*control_, /*retry=*/true);
  std::vector<std::string> owners;
  for (const std::string& daemon : daemons) {
    std::vector<std::string> several;
    if (SplitOwnerAddress(daemon).backend.empty()) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
      several = backends(*v1::Control::NewStub(OwnerChannel(daemon, args, options_.token)),
                         /*retry=*/false);
    }
    if (several.empty()) {
      owners.push_back(daemon);
    } else {
      owners.insert(owners.end(), several.begin(), several.end());
    }
  }
  return owners;
}

absl::StatusOr<v1::RegisterResponse> Client::Register(const v1::RegisterRequest& given) {
  v1::RegisterRequest request = given;
  if (request.daemons().empty()) {
    request.mutable_daemons()->Assign(options_.daemons.begin(), options_.daemons.end());
  }
  // "dns:NAME:PORT" entries become the addresses NAME resolves to.
  PARAMD_ASSIGN_OR_RETURN(
      const std::vector<std::string> daemons,
      ResolveDaemons(request.job(), {request.daemons().begin(), request.daemons().end()}));
  request.mutable_daemons()->Assign(daemons.begin(), daemons.end());
  // Every rank sends the same list however its addresses were found (a DNS answer's order varies).
  std::sort(request.mutable_daemons()->begin(), request.mutable_daemons()->end());
  if (request.daemons_size() > 1 && options_.daemons_wait.count() > 0) {
    PARAMD_RETURN_IF_ERROR(WaitForDaemons(request.job(), request.daemons()));
  }
  // A daemon of several backends is an owner per backend: the job is sharded over them.
  if (!shard_member_) {
    PARAMD_ASSIGN_OR_RETURN(std::vector<std::string> owners,
                            OwnerAddresses({request.daemons().begin(), request.daemons().end()}));
    std::sort(owners.begin(), owners.end());
    request.mutable_daemons()->Assign(owners.begin(), owners.end());
  }
  v1::RegisterResponse response;
  if (request.daemons_size() > 1 && !shard_member_) {
    PARAMD_ASSIGN_OR_RETURN(sharded_, ShardedJob::Register(options_, request, &response));
    return response;
  }
  if (sharded_ != nullptr && sharded_->job() == request.job()) sharded_.reset();
  absl::Status status = Retry([&] {
    return Unary(NextDeadline(), [&](grpc::ClientContext* context) {
      return control_->Register(context, request, &response);
    });
  });
  if (!status.ok()) return status;
  instance_.store(response.instance());
  restarted_.store(false);
  if (transport_ == nullptr) {
    TransportContext context{channel_, response.max_chunk_bytes(), request.job(), request.rank()};
    context.cuda_stream = options_.cuda_stream;
    context.cuda_device = options_.cuda_device;
    context.lend_gradients = options_.lend_gradients;
    std::string reason;
    absl::StatusOr<std::unique_ptr<Transport>> transport =
        ChooseTransport(options_.transport, context, &reason);
    if (!transport.ok()) return transport.status();
    transport_ = *std::move(transport);
    transport_reason_ = reason;
    PARAMD_LOG(INFO) << "job " << request.job() << " rank " << request.rank() << ": transport "
                     << transport_->name() << " (" << reason << ")";
  }
  // Tells the daemon (each time: it may have restarted), which reports each rank's transport in
  // Status and metrics.
  v1::AttachRequest attach;
  attach.set_job(request.job());
  attach.set_rank(request.rank());
  attach.set_transport(transport_->name());
  attach.mutable_declare()->set_reason(transport_reason_);
  v1::AttachResponse attached;
  status = Retry([&] {
    return Unary(NextDeadline(), [&](grpc::ClientContext* context) {
      return data_->Attach(context, attach, &attached);
    });
  });
  if (!status.ok()) return status;
  return response;
}

absl::Status Client::UploadInitialWeights(const std::string& job, std::span<const PushItem> items) {
  if (sharded_ != nullptr && sharded_->job() == job) {
    return sharded_->Push(v1::PUSH_KIND_INITIAL_WEIGHTS, 0, 0, items);
  }
  if (absl::Status s = NeedTransport(); !s.ok()) return s;
  PushTarget target{job, 0, 0, v1::PUSH_KIND_INITIAL_WEIGHTS};
  absl::Status status = Retry([&] { return transport_->Push(target, items, PushDeadline(items)); });
  if (status.code() != absl::StatusCode::kDeadlineExceeded) return status;
  return absl::DeadlineExceededError(absl::StrCat(
      "the initial weights of job ", Quoted(job), " (", items.size(), " tensors, ",
      PushBytes(items), " bytes) were not taken within the push's deadline (rpc_timeout ",
      options_.rpc_timeout.count() / 1000.0, " s plus 1 s per ", options_.push_bytes_per_second,
      " bytes): ", status.message(),
      "; a daemon on a slow or busy host needs a longer rpc_timeout or a lower "
      "push_bytes_per_second"));
}

absl::Status Client::PushGradients(const std::string& job, int32_t rank, int64_t step,
                                   std::span<const PushItem> items, uintptr_t ready_event) {
  if (sharded_ != nullptr && sharded_->job() == job) {
    return sharded_->Push(v1::PUSH_KIND_GRADIENT, rank, step, items, ready_event);
  }
  if (absl::Status s = NeedTransport(); !s.ok()) return s;
  PushTarget target{job, rank, step, v1::PUSH_KIND_GRADIENT, ready_event};
  return RetryData([&] { return transport_->Push(target, items, PushDeadline(items)); });
}

absl::StatusOr<v1::CommitResponse> Client::Commit(const std::string& job, int32_t rank,
                                                  int64_t step, std::optional<double> lr,
                                                  std::optional<double> grad_scale) {
  if (sharded_ != nullptr && sharded_->job() == job) {
    return sharded_->Commit(rank, step, lr, grad_scale);
  }
  v1::CommitRequest request;
  request.set_job(job);
  request.set_rank(rank);
  request.set_step(step);
  if (lr) request.set_lr(*lr);
  if (grad_scale) request.set_grad_scale(*grad_scale);
  v1::CommitResponse response;
  absl::Status status = RetryData([&] {
    return Unary(NextDeadline(), [&](grpc::ClientContext* context) {
      return data_->Commit(context, request, &response);
    });
  });
  if (!status.ok()) return status;
  return response;
}

absl::Status Client::Pull(const PullTarget& target, std::chrono::milliseconds timeout,
                          Pulled* out) {
  if (sharded_ != nullptr && sharded_->job() == target.job) {
    return sharded_->Pull(target, timeout, out);
  }
  if (absl::Status s = NeedTransport(); !s.ok()) return s;
  const Deadline deadline = std::chrono::system_clock::now() + timeout;
  return RetryData([&] { return transport_->Pull(target, deadline, out); });
}

absl::StatusOr<PulledView> Client::PullInPlace(const PullTarget& target,
                                               std::chrono::milliseconds timeout,
                                               std::chrono::milliseconds lease) {
  if (sharded_ != nullptr && sharded_->job() == target.job) {
    return sharded_->PullInPlace(target, timeout, lease);
  }
  if (absl::Status s = NeedTransport(); !s.ok()) return s;
  const Deadline deadline = std::chrono::system_clock::now() + timeout;
  PulledView view;
  absl::Status status =
      RetryData([&] { return transport_->PullInPlace(target, deadline, lease, &view); });
  if (!status.ok()) return status;
  return view;
}

absl::StatusOr<std::vector<PulledView>> Client::PullInPlacePieces(const PullTarget& target,
                                                                  std::chrono::milliseconds timeout,
                                                                  std::chrono::milliseconds lease) {
  if (sharded_ != nullptr && sharded_->job() == target.job) {
    return sharded_->PullInPlacePieces(target, timeout, lease);
  }
  PARAMD_ASSIGN_OR_RETURN(PulledView view, PullInPlace(target, timeout, lease));
  return std::vector<PulledView>{std::move(view)};
}

absl::Status Client::Release(const PulledView& view) {
  if (sharded_ != nullptr) return sharded_->Release(view);
  if (absl::Status s = NeedTransport(); !s.ok()) return s;
  return Retry([&] { return transport_->Release(view.lease, NextDeadline()); });
}

absl::Status Client::PullMany(const PullManyTarget& target, std::chrono::milliseconds timeout,
                              std::vector<Pulled>* out) {
  if (sharded_ != nullptr && sharded_->job() == target.job) {
    return sharded_->PullMany(target, timeout, out);
  }
  if (absl::Status s = NeedTransport(); !s.ok()) return s;
  const Deadline deadline = std::chrono::system_clock::now() + timeout;
  return RetryData([&] { return transport_->PullMany(target, deadline, out); });
}

absl::StatusOr<std::vector<PulledView>> Client::PullInPlaceMany(const PullManyTarget& target,
                                                                std::chrono::milliseconds timeout,
                                                                std::chrono::milliseconds lease) {
  if (sharded_ != nullptr && sharded_->job() == target.job) {
    return sharded_->PullInPlaceMany(target, timeout, lease);
  }
  if (absl::Status s = NeedTransport(); !s.ok()) return s;
  const Deadline deadline = std::chrono::system_clock::now() + timeout;
  std::vector<PulledView> views;
  absl::Status status =
      RetryData([&] { return transport_->PullInPlaceMany(target, deadline, lease, &views); });
  if (!status.ok()) return status;
  return views;
}

absl::Status Client::Release(std::span<const PulledView> views) {
  if (sharded_ != nullptr) return sharded_->Release(views);
  if (absl::Status s = NeedTransport(); !s.ok()) return s;
  std::vector<uint64_t> leases;
  for (const PulledView& view : views) leases.push_back(view.lease);
  return Retry([&] { return transport_->ReleaseMany(leases, NextDeadline()); });
}

absl::StatusOr<v1::StatusResponse> Client::Status(const std::string& job, bool daemon_only) {
  v1::StatusRequest request;
  request.set_job(job);
  request.set_daemon_only(daemon_only);
  v1::StatusResponse response;
  absl::Status status = Retry([&] {
    return Unary(NextDeadline(), [&](grpc::ClientContext* context) {
      return control_->Status(context, request, &response);
    });
  });
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::GetLayoutResponse> Client::GetLayout(const std::string& job) {
  v1::GetLayoutRequest request;
  request.set_job(job);
  v1::GetLayoutResponse response;
  absl::Status status = Retry([&] {
    return Unary(NextDeadline(), [&](grpc::ClientContext* context) {
      return control_->GetLayout(context, request, &response);
    });
  });
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::SetHyperparamsResponse> Client::SetHyperparams(
    const v1::SetHyperparamsRequest& request) {
  if (sharded_ != nullptr && sharded_->job() == request.job()) {
    return sharded_->SetHyperparams(request);
  }
  v1::SetHyperparamsResponse response;
  absl::Status status = Retry([&] {
    return Unary(NextDeadline(), [&](grpc::ClientContext* context) {
      return control_->SetHyperparams(context, request, &response);
    });
  });
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::DrainResponse> Client::Drain() {
  v1::DrainResponse response;
  absl::Status status = Retry([&] {
    return Unary(NextDeadline(), [&](grpc::ClientContext* context) {
      return control_->Drain(context, v1::DrainRequest(), &response);
    });
  });
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::DeleteJobResponse> Client::DeleteJob(const std::string& job) {
  if (sharded_ != nullptr && sharded_->job() == job) return sharded_->DeleteJob();
  v1::DeleteJobRequest request;
  request.set_job(job);
  v1::DeleteJobResponse response;
  absl::Status status = Retry([&] {
    return Unary(NextDeadline(), [&](grpc::ClientContext* context) {
      return control_->DeleteJob(context, request, &response);
    });
  });
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::CheckpointResponse> Client::Checkpoint(const std::string& job) {
  if (sharded_ != nullptr && sharded_->job() == job) return sharded_->Checkpoint();
  v1::CheckpointRequest request;
  request.set_job(job);
  v1::CheckpointResponse response;
  // As long as the state takes to write: the state streams' deadline, not a unary call's.
  const Deadline deadline = std::chrono::system_clock::now() + options_.state_timeout;
  absl::Status status = Retry([&] {
    return Unary(deadline, [&](grpc::ClientContext* context) {
      return control_->Checkpoint(context, request, &response);
    });
  });
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::RestoreResponse> Client::Restore(const std::string& job,
                                                    const std::string& path) {
  if (sharded_ != nullptr && sharded_->job() == job) return sharded_->Restore(path);
  v1::RestoreRequest request;
  request.set_job(job);
  request.set_path(path);
  v1::RestoreResponse response;
  const Deadline deadline = std::chrono::system_clock::now() + options_.state_timeout;
  absl::Status status = Retry([&] {
    return Unary(deadline, [&](grpc::ClientContext* context) {
      return control_->Restore(context, request, &response);
    });
  });
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<JobState> Client::ExportState(const std::string& job) {
  if (sharded_ != nullptr && sharded_->job() == job) return sharded_->ExportState();
  v1::ExportStateRequest request;
  request.set_job(job);
  request.set_max_chunk_bytes(options_.state_chunk_bytes);
  JobState state;
  absl::Status status = Retry([&] {
    state = JobState();
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + options_.state_timeout);
    std::unique_ptr<grpc::ClientReader<v1::StateChunk>> reader =
        control_->ExportState(&context, request);
    v1::StateChunk chunk;
    absl::Status bad;
    while (bad.ok() && reader->Read(&chunk)) {
      if (chunk.has_header()) {
        const v1::StateHeader& h = chunk.header();
        state.job = h.job();
        state.next_step = h.next_step();
        state.applied_steps = h.applied_steps();
        state.skipped_steps = h.skipped_steps();
        state.seed = h.seed();
        state.hyperparams = h.hyperparams();
        state.state_policy = h.state_policy();
      }
      if (chunk.has_field()) {
        StateField& f = state.fields.emplace_back();
        f.tensor = chunk.field().tensor();
        f.field = chunk.field().field();
        f.type = chunk.field().type();
        f.shape.assign(chunk.field().shape().begin(), chunk.field().shape().end());
        int64_t elements = 1;
        for (int64_t d : f.shape) elements *= d;
        f.bytes.reserve(static_cast<size_t>(elements * ElementTypeBytes(f.type)));
      }
      if (chunk.data().empty()) continue;
      if (state.fields.empty() ||
          chunk.offset() != static_cast<int64_t>(state.fields.back().bytes.size())) {
        bad = absl::DataLossError(absl::StrCat("export of job \"", job, "\": chunk at offset ",
                                               chunk.offset(), " does not continue its field"));
        context.TryCancel();
        break;
      }
      const auto* data = reinterpret_cast<const std::byte*>(chunk.data().data());
      std::vector<std::byte>& bytes = state.fields.back().bytes;
      bytes.insert(bytes.end(), data, data + chunk.data().size());
    }
    absl::Status finished = FromGrpcStatus(reader->Finish());
    return bad.ok() ? finished : bad;
  });
  if (!status.ok()) return status;
  return state;
}

absl::Status Client::ImportState(const JobState& state) {
  if (sharded_ != nullptr && sharded_->job() == state.job) return sharded_->ImportState(state);
  const int64_t chunk_bytes = std::max<int64_t>(1, options_.state_chunk_bytes);
  return Retry([&] {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + options_.state_timeout);
    v1::ImportStateResponse response;
    std::unique_ptr<grpc::ClientWriter<v1::StateChunk>> writer =
        control_->ImportState(&context, &response);
    v1::StateChunk chunk;
    v1::StateHeader* h = chunk.mutable_header();
    h->set_job(state.job);
    h->set_next_step(state.next_step);
    h->set_applied_steps(state.applied_steps);
    h->set_skipped_steps(state.skipped_steps);
    h->set_seed(state.seed);
    *h->mutable_hyperparams() = state.hyperparams;
    *h->mutable_state_policy() = state.state_policy;
    // A failed write means the daemon ended the call (it refused the state): Finish says why.
    bool open = writer->Write(chunk);
    for (size_t i = 0; open && i < state.fields.size(); ++i) {
      const StateField& f = state.fields[i];
      const int64_t size = static_cast<int64_t>(f.bytes.size());
      int64_t offset = 0;
      do {
        chunk.Clear();
        if (offset == 0) {
          v1::StateField* field = chunk.mutable_field();
          field->set_tensor(f.tensor);
          field->set_field(f.field);
          field->set_type(f.type);
          for (int64_t d : f.shape) field->add_shape(d);
        }
        const int64_t length = std::min(chunk_bytes, size - offset);
        chunk.set_offset(offset);
        chunk.set_data(reinterpret_cast<const char*>(f.bytes.data()) + offset,
                       static_cast<size_t>(length));
        open = writer->Write(chunk);
        offset += length;
      } while (open && offset < size);
    }
    if (open) writer->WritesDone();
    return FromGrpcStatus(writer->Finish());
  });
}

}  // namespace paramd
