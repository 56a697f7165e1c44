// paramctl: the operator's CLI for a running daemon.
//   paramctl [--address=HOST:PORT] [--json] status [JOB]
//   paramctl [--address=HOST:PORT] [--json] tensors JOB
//   paramctl [--address=HOST:PORT] [--json] set-lr JOB LR
//   paramctl [--address=HOST:PORT] [--json] delete JOB
//   paramctl [--address=HOST:PORT] [--json] checkpoint JOB
//   paramctl [--address=HOST:PORT] [--json] restore JOB [DIR]
//   paramctl [--address=HOST:PORT] [--json] drain
//   paramctl [--wait_s=S] wait ADDRESS_FILE [PID]
// checkpoint and restore draw a progress bar on stderr while they run, where it is a terminal.
#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/client.h"
#include "client/wait_until_serving.h"
#include "common/flags_help.h"
#include "common/shard_map.h"
#include "tools/progress_bar.h"

ABSL_FLAG(std::string, address, "127.0.0.1:50051", "Daemon address host:port");
ABSL_FLAG(bool, json, false, "Print the daemon's answer as JSON");
ABSL_FLAG(int, timeout_ms, 10000, "Deadline of each call, milliseconds");
ABSL_FLAG(std::string, token_file, "",
          "File holding the token calls carry where the daemon takes tokens (mode 0600); default "
          "$PARAMD_TOKEN_FILE");
ABSL_FLAG(double, wait_s, 60, "wait: how long a daemon may take to serve, seconds");

namespace paramd {
namespace {

constexpr char kUsage[] =
    "paramctl [--address=HOST:PORT] [--json] COMMAND\n"
    "commands:\n"
    "  status [JOB]     daemon, jobs, steps, versions, memory\n"
    "  tensors JOB      the job's tensors with shape, version and state bytes\n"
    "  set-lr JOB LR    the learning rate used by commits that carry none\n"
    "  delete JOB       remove the job (active or failed) and free its memory\n"
    "  checkpoint JOB   write a checkpoint of the job under the daemon's checkpoint_dir\n"
    "  restore JOB [DIR]  restore the job from checkpoint DIR (default: its newest)\n"
    "                   (both draw a progress bar on stderr where it is a terminal)\n"
    "  drain            refuse new work; running steps complete\n"
    "  wait FILE [PID]  wait until the daemon started with --address_file=FILE serves (the file\n"
    "                   holds its address and its Control service answers), print the address;\n"
    "                   fail at once where process PID ends first, or after --wait_s\n";

std::string Bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  if (unit == 0) return absl::StrFormat("%d B", bytes);
  return absl::StrFormat("%.1f %s", value, units[unit]);
}

std::string PolicyName(const v1::StatePolicy& p) {
  auto tail = [](const std::string& name) { return name.substr(name.rfind('_') + 1); };
  return absl::StrCat("master ", tail(v1::MasterType_Name(p.master())), ", exp_avg ",
                      tail(v1::MomentType_Name(p.exp_avg())), ", exp_avg_sq ",
                      tail(v1::MomentType_Name(p.exp_avg_sq())));
}

int PrintJson(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  google::protobuf::util::MessageToJsonString(message, &json, options);
  std::cout << json;
  return 0;
}

int Fail(const absl::Status& status) {
  std::cerr << "paramctl: " << absl::StatusCodeToString(status.code()) << ": " << status.message()
            << "\n";
  return 1;
}

// What another daemon of a job says of it: its backend, and the version it serves of the job.
struct DaemonView {
  std::string backend;       // "" where unknown
  std::string state;         // ", version N", or why there is none
  int64_t state_bytes = -1;  // of its part of the job; -1 where unknown
};

// A client's options with this command's token file (--token_file, else $PARAMD_TOKEN_FILE).
ClientOptions CommandOptions() {
  ClientOptions options;
  if (!absl::GetFlag(FLAGS_token_file).empty())
    options.token_file = absl::GetFlag(FLAGS_token_file);
  return options;
}

DaemonView AskDaemon(const std::string& address, const std::string& job) {
  ClientOptions options = CommandOptions();
  options.address = address;
  options.rpc_timeout = std::chrono::milliseconds(absl::GetFlag(FLAGS_timeout_ms));
  options.connect_timeout = std::min(options.rpc_timeout, std::chrono::milliseconds(3000));
  options.max_attempts = 1;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  absl::StatusOr<v1::StatusResponse> status =
      client.ok() ? (*client)->Status(job) : absl::StatusOr<v1::StatusResponse>(client.status());
  if (absl::IsNotFound(status.status())) return {"", ", not registered there"};
  if (!status.ok()) {
    return {"",
            absl::StrCat(", unreachable (", absl::StatusCodeToString(status.status().code()), ")")};
  }
  for (const v1::JobStatus& j : status->jobs()) {
    if (j.name() == job) {
      return {status->backend(), absl::StrCat(", version ", j.next_step()), j.state_bytes()};
    }
  }
  return {status->backend(), ", not registered there"};
}

// A job over several daemons: each owner of its shard map (GetLayout) with the tensors and rows it
// owns, its part of the job's state (as its daemon says, else estimated by rows from this
// daemon's tensors), and what its daemon says: its backend and the
// version it serves of the job (asked of each daemon, this one's from `job`).
void PrintOwners(Client& client, const v1::JobStatus& job, const std::string& self,
                 const std::string& self_backend) {
  absl::StatusOr<v1::GetLayoutResponse> layout = client.GetLayout(job.name());
  if (!layout.ok()) {
    std::cout << "  owners unknown: " << layout.status().message() << "\n";
    return;
  }
  std::map<std::string, const v1::TensorStatus*> tensors;
  for (const v1::TensorStatus& t : job.tensors()) tensors[t.name()] = &t;
  struct Owner {
    std::set<std::string> tensors;
    int64_t pieces = 0, rows = 0;
    double state_bytes = 0;
  };
  std::map<std::pair<std::string, int32_t>, Owner> owners;
  for (const v1::GetLayoutResponse::Placement& p : layout->placements()) {
    Owner& o = owners[{p.daemon(), p.device()}];
    o.tensors.insert(p.tensor());
    ++o.pieces;
    auto it = tensors.find(p.tensor());
    const int64_t rows = p.row_end() > 0       ? p.row_end() - p.row_begin()
                         : it != tensors.end() ? it->second->rows()
                                               : 0;
    o.rows += rows;
    if (it == tensors.end()) continue;
    if (it->second->rows() > 0) {
      o.state_bytes += static_cast<double>(it->second->state_bytes()) * static_cast<double>(rows) /
                       static_cast<double>(it->second->rows());
    }
  }
  auto count = [](int64_t n, const char* what) {
    return absl::StrCat(n, " ", what, n == 1 ? "" : "s");
  };
  // The daemons are asked side by side: one that does not answer costs one deadline.
  std::map<std::string, DaemonView> views;
  for (const auto& [key, o] : owners) views[key.first];
  std::vector<std::thread> asks;
  for (auto& [address, view] : views) {
    if (address == self) {
      view = {self_backend, absl::StrCat(", version ", job.next_step()), job.state_bytes()};
      continue;
    }
    asks.emplace_back([&address, &view, &job] { view = AskDaemon(address, job.name()); });
  }
  for (std::thread& t : asks) t.join();
  for (const auto& [key, o] : owners) {
    const DaemonView& view = views[key.first];
    const std::string device = !view.backend.empty()          ? view.backend
                               : key.second == kUnknownDevice ? std::string("device unknown")
                               : key.second < 0               ? std::string("cpu")
                                                              : absl::StrCat("cuda:", key.second);
    std::cout << absl::StrFormat(
        "  owner %s %s: %s in %s, %s, %s of state%s%s\n", key.first, device,
        count(static_cast<int64_t>(o.tensors.size()), "tensor"), count(o.pieces, "piece"),
        count(o.rows, "row"),
        // A daemon holds one owner: its part's state, where it said.
        Bytes(view.state_bytes >= 0 ? view.state_bytes : static_cast<int64_t>(o.state_bytes)),
        view.state, key.first == self ? " (this daemon)" : "");
  }
}

int Status(Client& client, const std::string& job) {
  absl::StatusOr<v1::StatusResponse> status = client.Status(job);
  if (!status.ok()) return Fail(status.status());
  if (absl::GetFlag(FLAGS_json)) return PrintJson(*status);
  std::cout << absl::StrFormat("paramd %s  at %s  backend %s  transports %s  up %.0f s%s\n",
                               status->daemon_version(), status->advertise_address(),
                               status->backend(), absl::StrJoin(status->transports(), ","),
                               status->uptime_seconds(), status->draining() ? "  DRAINING" : "");
  if (status->backend_addresses_size() > 1) {
    // A daemon of several backends: this is one of them; each has a status of its own.
    std::cout << absl::StrFormat(
        "backends of this daemon: %s (paramctl --address=ADDRESS status "
        "for each)\n",
        absl::StrJoin(status->backend_addresses(), " "));
  }
  if (status->shm_segments() > 0) {
    std::cout << absl::StrFormat("shared memory: %d segments, %s reserved, %s in use\n",
                                 status->shm_segments(), Bytes(status->shm_reserved_bytes()),
                                 Bytes(status->shm_used_bytes()));
  }
  std::cout << absl::StrFormat("memory budget: %s of %s reserved by jobs",
                               Bytes(status->memory_reserved_bytes()),
                               Bytes(status->memory_budget_bytes()));
  if (status->device_memory_budget_bytes() > 0) {
    std::cout << absl::StrFormat("; GPU %s of %s", Bytes(status->device_memory_reserved_bytes()),
                                 Bytes(status->device_memory_budget_bytes()));
  }
  std::cout << absl::StrFormat("; %d streams open, %d pulls waiting, %d leases\n",
                               status->open_streams(), status->waiting_pulls(), status->leases());
  if (status->has_backend_failure()) {
    std::cout << "BACKEND FAILED: " << status->backend_failure().message() << "\n";
  }
  if (status->jobs().empty()) std::cout << "no jobs\n";
  for (const v1::JobStatus& j : status->jobs()) {
    std::cout << absl::StrFormat(
        "job %s: %d/%d ranks registered, next step %d (%d/%d committed), %d applied, "
        "last step %.2f ms\n",
        j.name(), j.registered_ranks_size(), j.world_size(), j.next_step(),
        j.committed_ranks_size(), j.world_size(), j.applied_steps(), j.last_step_seconds() * 1e3);
    // The daemon list as the job registered it; empty: a one-daemon job.
    std::cout << absl::StrFormat("  daemons %s\n", j.daemons().empty()
                                                       ? std::string("this one alone")
                                                       : absl::StrJoin(j.daemons(), " "));
    if (j.daemons_size() > 1) {
      PrintOwners(client, j, status->advertise_address(), status->backend());
    }
    if (j.state() == v1::JOB_STATE_FAILED) {
      std::cout << absl::StrFormat(
          "  FAILED (%s): %s\n",
          absl::StatusCodeToString(static_cast<absl::StatusCode>(j.failure().code())),
          j.failure().message());
    }
    std::cout << absl::StrFormat("  lr %g  betas %g/%g  eps %g  weight_decay %g\n",
                                 j.hyperparams().lr(), j.hyperparams().beta1(),
                                 j.hyperparams().beta2(), j.hyperparams().eps(),
                                 j.hyperparams().weight_decay());
    std::cout << absl::StrFormat("  state %s (%s), served %s, slots %s, %d tensors\n",
                                 Bytes(j.state_bytes()), PolicyName(j.state_policy()),
                                 Bytes(j.served_bytes()), Bytes(j.slot_bytes()), j.tensors_size());
    std::cout << absl::StrFormat(
        "  reserved %s of host memory%s\n", Bytes(j.reserved_host_bytes()),
        j.reserved_device_bytes() > 0
            ? absl::StrCat(", ", Bytes(j.reserved_device_bytes()), " of GPU memory")
            : std::string());
    const v1::StateBytes& k = j.state_bytes_by_kind();
    std::cout << absl::StrFormat(
        "  state by kind: master %s, exp_avg %s, exp_avg_sq %s, moment scales %s\n",
        Bytes(k.master()), Bytes(k.exp_avg()), Bytes(k.exp_avg_sq()), Bytes(k.moment_scales()));
    std::cout << absl::StrFormat(
        "  skipped steps %d, clipping %s (last clip %g)\n", j.skipped_steps(),
        j.max_grad_norm() > 0 ? absl::StrCat("at ", j.max_grad_norm()) : std::string("off"),
        j.last_clip());
    if (j.early_steps_adopted() > 0 || j.early_steps_discarded() > 0 || j.early_steps_late() > 0) {
      std::cout << absl::StrFormat(
          "  early steps: %d tensor-steps adopted, %d discarded, %d late\n",
          j.early_steps_adopted(), j.early_steps_discarded(), j.early_steps_late());
    }
    std::vector<std::string> trainers;
    for (const v1::TrainerTransport& t : j.trainers()) {
      trainers.push_back(absl::StrCat(t.rank(), ":", t.transport()));
    }
    std::cout << absl::StrFormat("  transports %s, leases held %d%s\n",
                                 trainers.empty() ? "-" : absl::StrJoin(trainers, " "), j.leases(),
                                 j.shared_memory() ? ", buffers in shared memory" : "");
  }
  return 0;
}

int Tensors(Client& client, const std::string& job) {
  absl::StatusOr<v1::StatusResponse> status = client.Status(job);
  if (!status.ok()) return Fail(status.status());
  const v1::JobStatus& j = status->jobs(0);
  if (absl::GetFlag(FLAGS_json)) return PrintJson(j);
  std::cout << absl::StrFormat("%-40s %14s %6s %8s %12s\n", "tensor", "shape", "grad", "version",
                               "state");
  for (const v1::TensorStatus& t : j.tensors()) {
    const std::string grad = v1::ElementType_Name(t.grad_type());
    std::cout << absl::StrFormat(
        "%-40s %14s %6s %8d %12s\n", t.name(), absl::StrCat(t.rows(), "x", t.cols()),
        grad.substr(grad.rfind('_') + 1), t.version(), Bytes(t.state_bytes()));
  }
  return 0;
}

int SetLr(Client& client, const std::string& job, const std::string& text) {
  double lr = 0;
  if (!absl::SimpleAtod(text, &lr)) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("\"", text, "\" is not a number")));
  }
  v1::SetHyperparamsRequest request;
  request.set_job(job);
  request.set_lr(lr);
  absl::StatusOr<v1::SetHyperparamsResponse> response = client.SetHyperparams(request);
  if (!response.ok()) return Fail(response.status());
  if (absl::GetFlag(FLAGS_json)) return PrintJson(*response);
  std::cout << absl::StrFormat("job %s: lr %g from the next step\n", job,
                               response->hyperparams().lr());
  return 0;
}

int Delete(Client& client, const std::string& job) {
  absl::StatusOr<v1::DeleteJobResponse> response = client.DeleteJob(job);
  if (!response.ok()) return Fail(response.status());
  if (absl::GetFlag(FLAGS_json)) return PrintJson(*response);
  std::cout << absl::StrFormat(
      "job %s deleted; %s of host memory%s back in the budget\n", job,
      Bytes(response->released_host_bytes()),
      response->released_device_bytes() > 0
          ? absl::StrCat(" and ", Bytes(response->released_device_bytes()), " of GPU memory")
          : std::string());
  return 0;
}

// While a checkpoint or restore of `job` runs: a thread of its own asks the daemon for the job's
// Status about 5 times a second and draws its checkpoint_progress as one line on stderr, cleared
// at the end (the answer then prints as without it). Only where stderr is a terminal and the
// answer is not JSON.
class ProgressDisplay {
 public:
  ProgressDisplay(Client& client, std::string job) : client_(client), job_(std::move(job)) {
    if (absl::GetFlag(FLAGS_json) || isatty(STDERR_FILENO) == 0) return;
    thread_ = std::thread([this] { Run(); });
  }
  ~ProgressDisplay() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopped_ = true;
    }
    wake_.notify_all();
    thread_.join();
    if (drawn_ > 0) std::cerr << '\r' << std::string(drawn_, ' ') << '\r' << std::flush;
  }
  ProgressDisplay(const ProgressDisplay&) = delete;
  ProgressDisplay& operator=(const ProgressDisplay&) = delete;

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!wake_.wait_for(lock, std::chrono::milliseconds(200), [this] { return stopped_; })) {
      lock.unlock();
      Draw();
      lock.lock();
    }
  }

  void Draw() {
    absl::StatusOr<v1::StatusResponse> status = client_.Status(job_);
    // A restore registers a missing job first: until then there is nothing to draw.
    if (!status.ok() || status->jobs().empty() || !status->jobs(0).has_checkpoint_progress()) {
      return;
    }
    const v1::CheckpointProgress& p = status->jobs(0).checkpoint_progress();
    const std::string line = ProgressLine(
        absl::StrCat(p.operation() == v1::CHECKPOINT_OPERATION_RESTORE ? "restore " : "checkpoint ",
                     job_),
        p.bytes_done(), p.bytes_total(), p.seconds());
    // Spaces over the rest of a longer line drawn before.
    std::cerr << '\r' << line << std::string(drawn_ - std::min(drawn_, line.size()), ' ')
              << std::flush;
    drawn_ = std::max(drawn_, line.size());
  }

  Client& client_;
  const std::string job_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stopped_ = false;
  size_t drawn_ = 0;  // the longest line drawn; only the thread touches it until it is joined
  std::thread thread_;
};

int Checkpoint(Client& client, const std::string& job) {
  absl::StatusOr<v1::CheckpointResponse> response;
  {
    ProgressDisplay progress(client, job);
    response = client.Checkpoint(job);
  }
  if (!response.ok()) return Fail(response.status());
  if (absl::GetFlag(FLAGS_json)) return PrintJson(*response);
  std::cout << absl::StrFormat(
      "job %s: version %d checkpointed to %s (%s in %.2f s, %.0f MB/s)%s\n", job,
      response->version(), response->path(), Bytes(response->bytes()), response->seconds(),
      response->bytes() / 1e6 / std::max(response->seconds(), 1e-9),
      response->removed() > 0 ? absl::StrCat("; ", response->removed(), " older removed")
                              : std::string());
  return 0;
}

int Restore(Client& client, const std::string& job, const std::string& path) {
  absl::StatusOr<v1::RestoreResponse> response;
  {
    ProgressDisplay progress(client, job);
    response = client.Restore(job, path);
  }
  if (!response.ok()) return Fail(response.status());
  if (absl::GetFlag(FLAGS_json)) return PrintJson(*response);
  std::cout << absl::StrFormat("job %s: version %d restored from %s (%s in %.2f s)%s\n", job,
                               response->version(), response->path(), Bytes(response->bytes()),
                               response->seconds(),
                               response->registered() ? "; registered from its manifest" : "");
  return 0;
}

int Drain(Client& client) {
  absl::StatusOr<v1::DrainResponse> response = client.Drain();
  if (!response.ok()) return Fail(response.status());
  if (absl::GetFlag(FLAGS_json)) return PrintJson(*response);
  std::cout << absl::StrFormat("draining; %d step(s) still running\n", response->running_steps());
  return 0;
}

// `paramctl wait FILE [PID]`: the one way a script starts a daemon and waits until it serves
// (client/wait_until_serving.h has the rule). Prints the address on stdout.
int Wait(const std::string& file, const std::string& pid_text) {
  int pid = 0;
  if (!pid_text.empty() && (!absl::SimpleAtoi(pid_text, &pid) || pid <= 0)) {
    std::cerr << "paramctl wait: PID must be a process id, not \"" << pid_text << "\"\n";
    return 2;
  }
  absl::StatusOr<std::string> address =
      WaitUntilServing(file, pid, absl::GetFlag(FLAGS_wait_s), CommandOptions());
  if (!address.ok()) {
    std::cerr << "paramctl wait: " << address.status().message() << "\n";
    return 1;
  }
  std::cout << *address << "\n";
  return 0;
}

int Run(const std::vector<char*>& args) {
  if (args.size() < 2) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string command = args[1];
  auto arg = [&](size_t i) { return i < args.size() ? std::string(args[i]) : std::string(); };
  if (command == "wait") {
    if (args.size() < 3 || args.size() > 4) {
      std::cerr << kUsage;
      return 2;
    }
    return Wait(arg(2), arg(3));
  }
  const size_t wanted = command == "status" || command == "drain" ? 0
                        : command == "tensors" || command == "delete" || command == "checkpoint" ||
                                command == "restore"
                            ? 1
                        : command == "set-lr" ? 2
                                              : 99;
  // status's JOB, restore's DIR
  const bool optional_job = command == "status" || command == "restore";
  if (wanted == 99 || args.size() - 2 > wanted + (optional_job ? 1 : 0) ||
      args.size() - 2 < wanted) {
    std::cerr << kUsage;
    return 2;
  }
  ClientOptions options = CommandOptions();
  options.address = absl::GetFlag(FLAGS_address);
  options.rpc_timeout = std::chrono::milliseconds(absl::GetFlag(FLAGS_timeout_ms));
  options.connect_timeout = options.rpc_timeout;
  options.max_attempts = 1;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  if (!client.ok()) return Fail(client.status());
  if (command == "status") return Status(**client, arg(2));
  if (command == "tensors") return Tensors(**client, arg(2));
  if (command == "set-lr") return SetLr(**client, arg(2), arg(3));
  if (command == "delete") return Delete(**client, arg(2));
  if (command == "checkpoint") return Checkpoint(**client, arg(2));
  if (command == "restore") return Restore(**client, arg(2), arg(3));
  return Drain(**client);
}

}  // namespace
}  // namespace paramd

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(paramd::kUsage);
  paramd::HandleHelpFlag(argc, argv);
  return paramd::Run(absl::ParseCommandLine(argc, argv));
}
