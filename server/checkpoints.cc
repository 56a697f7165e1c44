#include "server/checkpoints.h"

#include <google/protobuf/wire_format_lite.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/quoted.h"
#include "common/status_macros.h"
#include "server/registration.h"
#include "server/state/checkpoint.h"
#include "server/state/checkpoint_progress.h"
#include "server/state/state_transfer.h"

namespace paramd {
namespace {

// The state's files: large enough that a checkpoint is a few files, small enough to check and
// copy one by one.
constexpr int64_t kCheckpointFileBytes = int64_t{256} << 20;

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// A chunk's bytes in the stream, as the writer counts them: its message with the data, which
// ReadCheckpoint hands on apart.
int64_t StreamBytes(const v1::StateChunk& chunk, std::string_view data) {
  using google::protobuf::internal::WireFormatLite;
  size_t bytes = chunk.ByteSizeLong();
  if (!data.empty()) {
    bytes += WireFormatLite::TagSize(v1::StateChunk::kDataFieldNumber, WireFormatLite::TYPE_BYTES) +
             WireFormatLite::LengthDelimitedSize(data.size());
  }
  return static_cast<int64_t>(bytes);
}

// `path` with every link and dot resolved, or "" where it does not exist.
std::string RealPath(const std::string& path) {
  char resolved[PATH_MAX];
  return realpath(path.c_str(), resolved) == nullptr ? std::string() : std::string(resolved);
}

}  // namespace

absl::StatusOr<std::string> Checkpoints::Root() const {
  const std::string& root = daemon_->config().checkpoint_dir();
  if (root.empty()) {
    return absl::FailedPreconditionError(
        "this daemon has no checkpoint_dir; start it with one in its config "
        "(checkpoint_dir: \"/var/lib/paramd/checkpoints\") to write and restore checkpoints");
  }
  return root;
}

int64_t Checkpoints::WriteBuffer(const std::string& job, int64_t state_bytes,
                                 MemoryBudget::Reservation* held) {
  // No bigger than the state (the chunks' data is the state's bytes).
  const int64_t wanted = std::max(
      std::min(daemon_->config().checkpoint_buffer_bytes(), state_bytes), kDefaultCheckpointBuffer);
  if (wanted == kDefaultCheckpointBuffer) return wanted;
  absl::StatusOr<MemoryBudget::Reservation> reserved = daemon_->mutable_memory_budget().Reserve(
      absl::StrCat("checkpoint of ", job), MemoryBytes{wanted - kDefaultCheckpointBuffer, 0});
  if (!reserved.ok()) {
    PARAMD_LOG(WARNING) << "job " << job << ": the checkpoint is written with a buffer of "
                        << kDefaultCheckpointBuffer << " bytes, not checkpoint_buffer_bytes ("
                        << wanted << "), so its later steps wait while it is written: "
                        << reserved.status().message();
    return kDefaultCheckpointBuffer;
  }
  *held = *std::move(reserved);
  return wanted;
}

absl::StatusOr<v1::CheckpointResponse> Checkpoints::Write(const std::string& name) {
  absl::StatusOr<v1::CheckpointResponse> written = WriteNow(name);
  daemon_->metrics().CheckpointDone(name, "write", written.ok(),
                                    written.ok() ? written->version() : -1);
  return written;
}

absl::StatusOr<v1::CheckpointResponse> Checkpoints::WriteNow(const std::string& name) {
  PARAMD_ASSIGN_OR_RETURN(const std::string root, Root());
  PARAMD_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, daemon_->registry().Find(name));
  PARAMD_RETURN_IF_ERROR(job->CheckUsable());
  const int64_t state_bytes = job->Status().state_bytes();
  CheckpointProgress::Tracked progress =
      daemon_->checkpoint_progress().Begin(name, v1::CHECKPOINT_OPERATION_WRITE, state_bytes);
  const auto start = std::chrono::steady_clock::now();
  Daemon* daemon = daemon_;
  // Steps committed after the call wait until the state is in the writer's buffer (the export
  // holds them), then go back to the step executor while the disk catches up.
  PARAMD_ASSIGN_OR_RETURN(
      std::unique_ptr<StateExport> exported,
      StateExport::BeginAndWait(
          ExportOf(job, [daemon, job](const StepWork& held) { daemon->StartStep(job, held); }),
          daemon_->config().max_chunk_bytes()));
  MemoryBudget::Reservation held;
  const int64_t buffer = WriteBuffer(name, state_bytes, &held);
  PARAMD_ASSIGN_OR_RETURN(
      std::unique_ptr<CheckpointWriter> writer,
      CheckpointWriter::Start(root, job->registration(), kCheckpointFileBytes, buffer));
  v1::CheckpointResponse response;
  v1::StateChunk chunk;
  while (true) {
    PARAMD_ASSIGN_OR_RETURN(const bool more, exported->Next(&chunk));
    if (!more) break;
    if (chunk.has_header()) response.set_version(chunk.header().next_step());
    response.set_bytes(response.bytes() + static_cast<int64_t>(chunk.ByteSizeLong()));
    progress.Update(response.bytes());
    PARAMD_RETURN_IF_ERROR(writer->Add(&chunk));
  }
  exported.reset();  // the held steps run while the files are made durable
  PARAMD_ASSIGN_OR_RETURN(const std::string path, writer->Finish());
  response.set_path(path);
  response.set_seconds(SecondsSince(start));
  PARAMD_ASSIGN_OR_RETURN(const std::vector<std::string> kept, ListCheckpoints(root, name));
  for (size_t i = static_cast<size_t>(daemon_->config().keep_checkpoints()); i < kept.size(); ++i) {
    std::error_code error;
    std::filesystem::remove_all(kept[i], error);
    if (error) {
      PARAMD_LOG(WARNING) << "job " << name << ": cannot remove the old checkpoint " << kept[i]
                          << ": " << error.message();
    } else {
      response.set_removed(response.removed() + 1);
    }
  }
  PARAMD_LOG(INFO) << "job " << name << ": checkpoint of version " << response.version()
                   << " written to " << path << " (" << response.bytes() << " bytes in "
                   << response.seconds() << " s)";
  return response;
}

absl::StatusOr<v1::RestoreResponse> Checkpoints::Restore(const std::string& name,
                                                         const std::string& path) {
  PARAMD_ASSIGN_OR_RETURN(const std::string root, Root());
  if (path.empty()) {
    PARAMD_ASSIGN_OR_RETURN(const std::vector<std::string> found, ListCheckpoints(root, name));
    if (found.empty()) {
      return absl::NotFoundError(
          absl::StrCat("no checkpoint of job ", Quoted(name), " under ", root, "/", name));
    }
    return RestoreFrom(name, found.front());
  }
  // Only the job's own checkpoints under checkpoint_dir: a client names no other file.
  const std::string job_dir = RealPath(absl::StrCat(root, "/", name));
  const std::string dir = RealPath(path);
  if (job_dir.empty() || dir.empty() || dir.rfind(job_dir + "/", 0) != 0 ||
      dir.find('/', job_dir.size() + 1) != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", Quoted(path), " is not a checkpoint directory of job ",
                     Quoted(name), " under this daemon's checkpoint_dir (", root, "/", name,
                     "/step-N; paramctl checkpoints lists them)"));
  }
  return RestoreFrom(name, dir);
}

absl::StatusOr<v1::RestoreResponse> Checkpoints::RestoreFrom(const std::string& name,
                                                             const std::string& dir) {
  absl::StatusOr<v1::RestoreResponse> restored = RestoreFromNow(name, dir);
  daemon_->metrics().CheckpointDone(name, "restore", restored.ok(),
                                    restored.ok() ? restored->version() : -1);
  daemon_->UpdateGauges();
  return restored;
}

absl::StatusOr<v1::RestoreResponse> Checkpoints::RestoreFromNow(const std::string& name,
                                                                const std::string& dir) {
  const auto start = std::chrono::steady_clock::now();
  PARAMD_ASSIGN_OR_RETURN(v1::CheckpointManifest manifest, ReadCheckpointManifest(dir));
  if (manifest.registration().job() != name) {
    return absl::DataLossError(absl::StrCat(dir, "/", kCheckpointManifest, " is of job ",
                                            Quoted(manifest.registration().job()), ", not ",
                                            Quoted(name)));
  }
  v1::RestoreResponse response;
  response.set_path(dir);
  // A failed job comes back as the checkpoint's: its state may be half-updated, so it is
  // replaced whole.
  absl::StatusOr<std::shared_ptr<Job>> job = daemon_->registry().Find(name);
  if (job.ok() && !(*job)->CheckUsable().ok()) {
    PARAMD_RETURN_IF_ERROR(daemon_->DeleteJob(name).status());
    job = absl::NotFoundError("deleted");
  }
  if (!job.ok()) {
    if (!absl::IsNotFound(job.status())) return job.status();
    v1::RegisterRequest registration = manifest.registration();
    registration.set_rank(0);
    PARAMD_RETURN_IF_ERROR(daemon_->RegisterFromManifest(registration).status());
    PARAMD_ASSIGN_OR_RETURN(job, daemon_->registry().Find(name));
    response.set_registered(true);
  } else if (const auto& listed = manifest.registration().daemons();
             !std::equal(listed.begin(), listed.end(), (*job)->spec().daemons().begin(),
                         (*job)->spec().daemons().end())) {
    // The state is the checkpoint's and the job keeps its own description: a restore does not
    // move a job onto other daemons.
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint ", dir, " is of job ", Quoted(name), " over daemons ", DaemonListText(listed),
        "; the job here is registered with daemons ", DaemonListText((*job)->spec().daemons()),
        ": the field daemons must be the checkpoint's (delete the job to register it from the "
        "checkpoint)"));
  }
  // A restore that registered the job and then fails removes it again: nothing changes.
  const auto undo = [&](const absl::Status& status) -> absl::Status {
    if (response.registered()) (void)daemon_->DeleteJob(name);
    return status;
  };
  StateImport import((*job)->spec(), daemon_->config().max_chunk_bytes(), /*stage_ahead=*/true);
  CheckpointProgress::Tracked progress = daemon_->checkpoint_progress().Begin(
      name, v1::CHECKPOINT_OPERATION_RESTORE, (*job)->Status().state_bytes());
  const absl::Status read =
      ReadCheckpoint(dir, daemon_->config().max_chunk_bytes(),
                     [&](const v1::StateChunk& chunk, std::string_view data) {
                       response.set_bytes(response.bytes() + StreamBytes(chunk, data));
                       progress.Update(response.bytes());
                       return import.Add(chunk, data);
                     })
          .status();
  if (!read.ok()) return undo(read);
  absl::StatusOr<StagedState> staged = import.Finish();
  if (!staged.ok()) return undo(staged.status());
  const double read_seconds = SecondsSince(start);
  absl::StatusOr<v1::ImportStateResponse> imported = (*job)->Import(*std::move(staged));
  if (!imported.ok()) return undo(imported.status());
  (*job)->MarkRestored();
  response.set_version(imported->next_step());
  response.set_seconds(SecondsSince(start));
  PARAMD_LOG(INFO) << "job " << name << ": restored version " << response.version() << " from "
                   << dir << (response.registered() ? " (registered from its manifest)" : "")
                   << " in " << response.seconds() << " s (read " << read_seconds
                   << " s, then into the backend " << response.seconds() - read_seconds << " s)";
  return response;
}

absl::StatusOr<int> Checkpoints::RestoreAll() {
  const std::string& root = daemon_->config().checkpoint_dir();
  if (root.empty()) return 0;
  std::error_code error;
  std::filesystem::create_directories(root, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint_dir ", root, " cannot be created: ", error.message()));
  }
  std::vector<std::string> jobs;
  for (const auto& entry : std::filesystem::directory_iterator(root, error)) {
    if (entry.is_directory()) jobs.push_back(entry.path().filename().string());
  }
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint_dir ", root, " cannot be read: ", error.message()));
  }
  std::sort(jobs.begin(), jobs.end());
  int restored = 0;
  for (const std::string& name : jobs) {
    PARAMD_ASSIGN_OR_RETURN(const std::vector<std::string> found, ListCheckpoints(root, name));
    for (const std::string& dir : found) {
      absl::StatusOr<v1::RestoreResponse> r = RestoreFrom(name, dir);
      if (r.ok()) {
        ++restored;
        break;
      }
      PARAMD_LOG(WARNING) << "job " << name << ": checkpoint " << dir
                          << " not restored: " << r.status()
                          << (&dir == &found.back() ? "" : "; trying the one before");
    }
  }
  return restored;
}

CheckpointSchedule::CheckpointSchedule(Daemon* daemon)
    : checkpoints_(daemon),
      every_(daemon->config().checkpoint_every_steps()),
      thread_([this] { Run(); }) {}

CheckpointSchedule::~CheckpointSchedule() {
  {
    absl::MutexLock lock(&mu_);  // its release wakes Run
    stop_ = true;
  }
  thread_.join();
}

void CheckpointSchedule::StepRan(const std::string& job, int64_t next_step) {
  if (every_ <= 0 || next_step % every_ != 0) return;
  absl::MutexLock lock(&mu_);  // its release wakes Run
  if (std::find(queue_.begin(), queue_.end(), job) != queue_.end()) return;
  queue_.push_back(job);
}

void CheckpointSchedule::Run() {
  while (true) {
    std::string job;
    {
      absl::MutexLock lock(&mu_);
      const auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&woken));
      if (stop_) return;
      job = queue_.front();
      queue_.pop_front();
    }
    // A job deleted or failed since is no error of the schedule's.
    absl::StatusOr<v1::CheckpointResponse> written = checkpoints_.Write(job);
    if (!written.ok()) {
      PARAMD_LOG(WARNING) << "job " << job
                          << ": scheduled checkpoint not written: " << written.status();
    }
  }
}

}  // namespace paramd
