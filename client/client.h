// The thin client library trainers link: connect, register, push, commit, pull. Every call has a
// deadline; idempotent calls (all of them: pushes and commits are idempotent by design) are
// retried with backoff while the daemon is UNAVAILABLE. Errors are statuses carrying the daemon's
// message.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/job_state.h"
#include "common/token_file.h"
#include "paramd/v1/control.grpc.pb.h"
#include "paramd/v1/data.grpc.pb.h"
#include "transport/transport.h"

namespace paramd {

class ShardedJob;

// A job's daemon list with each "dns:NAME:PORT" entry replaced by every address NAME resolves to
// ("IP:PORT": its IPv4 addresses, or where it has none its IPv6 ones, "[IP]:PORT"), sorted and
// without repeats; other entries are kept as given.
// INVALID_ARGUMENT for a "dns:" entry that is not NAME:PORT with a port in 1..65535; NOT_FOUND for
// a name that resolves to nothing. `resolve` stands in for the system's resolver (getaddrinfo)
// where set: NAME to its addresses.
using NameResolver = std::function<absl::StatusOr<std::vector<std::string>>(const std::string&)>;
absl::StatusOr<std::vector<std::string>> ResolveDaemonList(const std::vector<std::string>& entries,
                                                           const NameResolver& resolve = nullptr);

struct ClientOptions {
  // Daemon address, "host:port".
  std::string address = "127.0.0.1:50051";
  // The job's daemons, each as it advertises itself (DaemonConfig.advertise_address), in any
  // order: Register sends them sorted (RegisterRequest.daemons) where the request lists none.
  // Empty: a one-daemon job, on `address`. With two or more, the job is sharded over them
  // (client/sharded_job.h): the client registers with every daemon, pushes each owner its rows,
  // commits, sets hyperparameters, checkpoints, restores and deletes on every daemon, puts a
  // split tensor's pieces together on pulls, and exports and imports the whole job's state from
  // and into every daemon's part; Status and GetLayout go to `address` alone.
  // An entry "dns:NAME:PORT" stands for every address NAME resolves to, each as "IP:PORT": a
  // Kubernetes headless Service's name, say, which answers one address per ready daemon
  // (ResolveDaemonList: the IPv4 addresses, or where there are none the IPv6 ones, "[IP]:PORT").
  std::vector<std::string> daemons;
  // How many daemons the job has, where the list holds a "dns:" name: Register resolves the list
  // again until it gives that many addresses (a daemon that is not ready yet is missing from a
  // DNS answer), up to daemons_wait, then DEADLINE_EXCEEDED showing the last answer. 0: the first
  // answer with at least one address is the list.
  int daemons_count = 0;
  // How long Register waits for every daemon of a job's list (of two or more) to answer at the
  // address it advertises: the daemons of a job may start after its trainers (one per node, in
  // any order). Past it, Register is DEADLINE_EXCEEDED naming those that did not answer, and
  // registers nothing. 0 = no wait (the list is only checked by the daemon called).
  std::chrono::milliseconds daemons_wait{120000};
  // Stands in for the system's resolver of "dns:" names (a test's); null: getaddrinfo.
  NameResolver resolver;
  // Transport name, or "auto" for the first viable one (DESIGN.md §6).
  std::string transport = "auto";
  // Deadline of each unary call and each push; a push has one more second per
  // push_bytes_per_second of its bytes.
  std::chrono::milliseconds rpc_timeout{30000};
  // The pace a push is allowed beyond rpc_timeout: 32 MiB a second, below what a slow host takes
  // (the daemon writes several bytes of memory it may touch for the first time per byte of
  // initial weights, and a large model's are tens of GB), so that a daemon that stopped taking
  // the bytes misses its deadline, not a slow one.
  int64_t push_bytes_per_second = int64_t{32} << 20;
  // How long Connect waits for the daemon to answer.
  std::chrono::milliseconds connect_timeout{10000};
  // Attempts of a call while the daemon answers UNAVAILABLE (1 = no retry).
  int max_attempts = 5;
  // How long a call keeps retrying, with backoff, while the daemon answers UNAVAILABLE (gone, or
  // restarting at the same address), even past max_attempts: a trainer waits this long for a
  // daemon that comes back (from its checkpoints). 0 = max_attempts alone decides.
  std::chrono::milliseconds reconnect_timeout{0};
  // Largest message the client accepts (pull chunks).
  int max_message_bytes = 64 << 20;
  // Deadline of a whole ExportState or ImportState stream (a job's state can be large).
  std::chrono::milliseconds state_timeout{600000};
  // Largest data of one state chunk, bytes, both ways: at most the daemon's max_chunk_bytes
  // (4 MiB unless configured otherwise), or ImportState is RESOURCE_EXHAUSTED.
  int64_t state_chunk_bytes = 1 << 20;
  // The CUDA stream (a cudaStream_t) the trainer writes its gradients on: cuda_ipc's copies of a
  // push wait for the work queued there when Push is called, so a push may follow backward's
  // kernels without synchronizing first. 0 = the legacy default stream (PyTorch's default
  // stream), which also orders every blocking stream; name a non-blocking stream here.
  uintptr_t cuda_stream = 0;
  // The trainer's GPU (a CUDA device index), for a transport of host memory (shm): the daemon's
  // segments are page-locked for it as they are mapped (cudaHostRegister, once), gradients in its
  // memory are pushed by DMA straight into their slots (after cuda_stream's work, on a stream of
  // the transport's; the caller's thread does not wait for the device), and a view of served
  // bytes can be copied to it by DMA. Registrations end with the transport, and those of a daemon
  // that restarted as soon as the transport follows it. -1: host memory only (a trainer without
  // a GPU need not load CUDA). transport_traits() says whether it took (reads_device_memory).
  int cuda_device = -1;
  // cuda_ipc: a gradient in GPU memory on the daemon's own GPU is lent, not copied. The daemon
  // reads it where it lies when the step runs, so a push costs a mark and no copy; in exchange the
  // caller keeps those bytes unchanged, and allocated, until the step has run: until a pull of the
  // step's version (which makes the pulling stream wait for the step on the GPU) has returned, and
  // only work queued after it on that stream may reuse them. Push does not wait for the work
  // queued on cuda_stream before it (backward): its marks name an interprocess event recorded
  // there, which the daemon's step waits for on the GPU. Gradients elsewhere (host memory, another
  // GPU, an allocation CUDA cannot share) are copied as without it.
  bool lend_gradients = false;
  // A file holding the bearer token every call carries, where the daemon takes tokens
  // (DaemonConfig.token_file; the file holds the token alone, mode 0600: common/token_file.h).
  // Default: $PARAMD_TOKEN_FILE, none where it is unset.
  std::string token_file = TokenFileFromEnvironment();
  // The token itself, where no file holds it (token_file, when set, is read instead).
  std::string token;
};

class Client {
 public:
  ~Client();
  // Opens a channel and waits (up to connect_timeout) until the daemon answers.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);

  // Registers a rank and picks the transport (logged, with its reason). The request's daemon list,
  // or else ClientOptions::daemons, goes sorted, once every daemon of it answers
  // (ClientOptions::daemons_wait).
  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request);
  // Rank 0 uploads the initial FP32 weights (version 0).
  absl::Status UploadInitialWeights(const std::string& job, std::span<const PushItem> items);
  // Pushes gradients of `step` from `rank`. `ready_event`: for gradients in GPU memory, a
  // cudaEvent_t recorded after backward wrote them (PushTarget::ready_event): the copies wait for
  // it, not for all the work queued on ClientOptions::cuda_stream so far.
  absl::Status PushGradients(const std::string& job, int32_t rank, int64_t step,
                             std::span<const PushItem> items, uintptr_t ready_event = 0);
  absl::StatusOr<v1::CommitResponse> Commit(const std::string& job, int32_t rank, int64_t step,
                                            std::optional<double> lr = std::nullopt,
                                            std::optional<double> grad_scale = std::nullopt);
  // Waits up to `timeout` for target.min_version and copies the served bytes into `out`, reusing
  // its buffer (pull into the same Pulled every step: a fresh buffer costs its page faults).
  absl::Status Pull(const PullTarget& target, std::chrono::milliseconds timeout, Pulled* out);
  // Waits like Pull, then leases the served bytes where they lie (the `shm` transport): no copy.
  // The view stays valid and unchanged until Release or until `lease` passes (0: the daemon's
  // default, DaemonConfig.lease_ms). FAILED_PRECONDITION on transports that cannot.
  absl::StatusOr<PulledView> PullInPlace(const PullTarget& target,
                                         std::chrono::milliseconds timeout,
                                         std::chrono::milliseconds lease = {});
  // A tensor's pieces in place, one view per daemon holding rows of it, in row order, one version
  // for all: each view's row_begin and header.rows() say which rows it holds (a rowwise format's
  // rows, a transposed format's column block). A tensor held whole, or a job on one daemon: one
  // view, as PullInPlace. End them with Release(views).
  absl::StatusOr<std::vector<PulledView>> PullInPlacePieces(const PullTarget& target,
                                                            std::chrono::milliseconds timeout,
                                                            std::chrono::milliseconds lease = {});
  // Ends the lease of a PullInPlace view.
  absl::Status Release(const PulledView& view);
  // Several tensors in one call, in `target.tensors`' order: over shm and cuda_ipc one request,
  // each tensor copied as soon as the daemon has published it (per-tensor publish), so a trainer
  // pulls a whole model with one round trip; other transports pull them one by one.
  absl::Status PullMany(const PullManyTarget& target, std::chrono::milliseconds timeout,
                        std::vector<Pulled>* out);
  // The same in place: one view per tensor, each with its lease; end them with Release(views).
  // A job sharded over several daemons gives a split tensor's pieces, in row order, each with its
  // row_begin and owner (ShardedJob::PullInPlaceMany).
  absl::StatusOr<std::vector<PulledView>> PullInPlaceMany(const PullManyTarget& target,
                                                          std::chrono::milliseconds timeout,
                                                          std::chrono::milliseconds lease = {});
  // Ends the leases of several views in one call.
  absl::Status Release(std::span<const PulledView> views);

  // `daemon_only`: the daemon's own figures alone (address, version, backends, memory), which any
  // token of a daemon with a token file reads; every job's status takes an admin token.
  absl::StatusOr<v1::StatusResponse> Status(const std::string& job = "", bool daemon_only = false);
  absl::StatusOr<v1::GetLayoutResponse> GetLayout(const std::string& job);
  absl::StatusOr<v1::SetHyperparamsResponse> SetHyperparams(
      const v1::SetHyperparamsRequest& request);
  absl::StatusOr<v1::DrainResponse> Drain();
  // Removes a job from the daemon and frees its memory (Control.DeleteJob).
  absl::StatusOr<v1::DeleteJobResponse> DeleteJob(const std::string& job);

  // Writes a checkpoint of the job under the daemon's checkpoint_dir (Control.Checkpoint); waits
  // up to state_timeout.
  absl::StatusOr<v1::CheckpointResponse> Checkpoint(const std::string& job);
  // Restores the job from its checkpoint in `path`, or its newest one when `path` is empty
  // (Control.Restore); waits up to state_timeout.
  absl::StatusOr<v1::RestoreResponse> Restore(const std::string& job, const std::string& path = "");

  // The job's whole state in its stored dtypes (client/job_state.h), streamed in chunks of at
  // most the daemon's max_chunk_bytes: the state after every step all ranks committed before the
  // call (it waits for those to run); later steps wait while the export streams (pushes, commits
  // and pulls go on).
  absl::StatusOr<JobState> ExportState(const std::string& job);
  // Replaces the state of a registered job (same tensors, state policy and serve formats) with
  // `state`, which need not come from this daemon; the job then collects state.next_step and
  // serves version state.next_step, recomputed from the imported master. FAILED_PRECONDITION
  // while the job collects pushes or commits, runs a step or streams an export; INVALID_ARGUMENT
  // naming the tensor and field on any mismatch. A refused import changes nothing.
  absl::Status ImportState(const JobState& state);

  // Whether the daemon restarted since this client's last Register (another start answers at
  // the address: it serves what it restored from its checkpoints, and every push, commit and pull
  // is ABORTED until the next Register). Asks the daemon unless a call already found out.
  absl::StatusOr<bool> DaemonRestarted() const;

  // The transport chosen at Register ("" before), for display.
  // For a sharded job, each daemon's ("host:port=name", comma-separated).
  std::string transport_name() const;
  // The transport of each daemon the job's bytes move to, with its traits (what callers decide
  // from; never the name): one with an empty `daemon` for a job on one daemon, one per owner in
  // the job's sorted daemon list for a sharded job; none before Register.
  struct OwnerTransport {
    std::string daemon;
    std::string name;
    TransportTraits traits;
  };
  std::vector<OwnerTransport> transport_traits() const;
  const std::string& transport_reason() const { return transport_reason_; }

 private:
  friend class ShardedJob;
  explicit Client(const ClientOptions& options, std::shared_ptr<grpc::Channel> channel);
  Deadline NextDeadline() const;
  // NextDeadline plus the time `items`' bytes take at push_bytes_per_second.
  Deadline PushDeadline(std::span<const PushItem> items) const;
  // `entries` with their "dns:" names resolved (ResolveDaemonList), again until the list has
  // daemons_count addresses, up to daemons_wait.
  absl::StatusOr<std::vector<std::string>> ResolveDaemons(
      const std::string& job, const std::vector<std::string>& entries) const;
  // The job's owners (RegisterRequest.daemons): each daemon of `daemons` (this one where empty) of
  // several backends in place of its address (StatusResponse.backend_addresses), the others (and
  // any that does not answer) as they are; empty where the job stays on this daemon alone.
  absl::StatusOr<std::vector<std::string>> OwnerAddresses(
      const std::vector<std::string>& daemons) const;
  // Waits (up to ClientOptions::daemons_wait) until every daemon of `daemons` answers a call.
  absl::Status WaitForDaemons(const std::string& job,
                              const google::protobuf::RepeatedPtrField<std::string>& daemons) const;
  // Calls `attempt` until it is not UNAVAILABLE or the attempts run out.
  absl::Status Retry(const std::function<absl::Status()>& attempt) const;
  // Retry for the calls that carry a step or version (pushes, commits, pulls): once the
  // connection broke, each further attempt first asks the daemon's start; a daemon that
  // restarted since Register is ABORTED (it lost this call's context: register again), and so is
  // every such call after it until Register.
  absl::Status RetryData(const std::function<absl::Status()>& attempt) const;
  absl::Status NeedTransport() const;

  const ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Control::Stub> control_;
  std::unique_ptr<v1::Data::Stub> data_;
  std::unique_ptr<Transport> transport_;
  std::string transport_reason_;
  // The daemon's start as the last Register saw it (RegisterResponse.instance); 0 before.
  std::atomic<uint64_t> instance_{0};
  // Set once a call found another start of the daemon; cleared by Register.
  mutable std::atomic<bool> restarted_{false};
  absl::Status Restarted() const;
  // One Status call: notes in restarted_ whether the daemon is another start than Register saw.
  absl::Status CheckStart() const;
  // The job sharded over several daemons this client registered, or null.
  std::unique_ptr<ShardedJob> sharded_;
  // One of a ShardedJob's clients: registers with its own daemon alone.
  bool shard_member_ = false;
};

}  // namespace paramd
