// A job's state streamed out (Control.ExportState) and in (Control.ImportState) in bounded chunks
// of v1::StateChunk, every field in its stored dtype (server/state/state_fields.h,
// client/job_state.h). Plain C++: the Control service moves the chunks.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "paramd/v1/control.pb.h"
#include "server/backend/backend.h"
#include "server/state/exported_job.h"
#include "server/state/state_fields.h"

namespace paramd {

// An import received whole and checked against the job: what Job::Import applies.
struct StagedState {
  v1::StateHeader header;
  std::vector<HostTensorState> tensors;  // registration order
  int64_t fields = 0;
  int64_t bytes = 0;
};

// Reads a job's state chunk by chunk from the backend's buffers: extra memory is one chunk (and a
// tensor's few scalars). While it lives the job's steps are held back; its end lets them run
// (ExportedJob::EndExport).
class StateExport {
 public:
  using Ready = std::function<void(absl::StatusOr<std::unique_ptr<StateExport>>)>;
  // Starts an export of the state after every step all ranks committed before this call: `ready`
  // gets it at once when none of those is queued or running, else from the thread that runs the
  // last of them (Job::BeginExport); nothing blocks meanwhile. FAILED_PRECONDITION before every
  // tensor has its initial weights. `max_chunk_bytes` >= 1 bounds the data of one chunk.
  static void Begin(std::shared_ptr<ExportedJob> job, int64_t max_chunk_bytes, Ready ready);
  // The same, waiting for the export to start: for a caller that does not itself run the steps
  // it may wait for.
  static absl::StatusOr<std::unique_ptr<StateExport>> BeginAndWait(std::shared_ptr<ExportedJob> job,
                                                                   int64_t max_chunk_bytes);
  ~StateExport();
  StateExport(const StateExport&) = delete;
  StateExport& operator=(const StateExport&) = delete;

  // Fills `chunk` (cleared first) with the next message of the stream; false once it is complete.
  absl::StatusOr<bool> Next(v1::StateChunk* chunk);

 private:
  StateExport(std::shared_ptr<ExportedJob> job, ExportedJob::Snapshot snapshot,
              int64_t max_chunk_bytes);
  absl::Status LoadTensor();

  const std::shared_ptr<ExportedJob> job_;
  const ExportedJob::Snapshot snapshot_;
  const int64_t max_chunk_bytes_;
  bool header_sent_ = false;
  size_t tensor_ = 0;                   // the tensor being sent
  std::vector<StateFieldSpec> fields_;  // its fields (empty until loaded)
  TensorScalars scalars_;               // its scalars
  size_t field_ = 0;                    // the field being sent
  int64_t offset_ = 0;                  // bytes of it sent
};

// Receives an import stream for a job and stages it; nothing is applied until the job takes it
// (Job::Import). Every
// field's size is checked against the job before its bytes are held, so the staged memory is at
// most the job's state size.
class StateImport {
 public:
  // `spec` is the job's normalized registration (Job::spec()); `max_chunk_bytes` bounds one
  // chunk's data. With `stage_ahead`, a thread of the import's own allocates and faults in the
  // memory of every array field the job keeps (the job's state size, no more), in export order,
  // while the caller receives the stream: for a restore, whose disk delivers the bytes faster than
  // fresh memory faults in, so the faults run beside the reading instead of after each field's
  // first chunk.
  StateImport(const v1::RegisterRequest& spec, int64_t max_chunk_bytes, bool stage_ahead = false);
  ~StateImport();
  StateImport(const StateImport&) = delete;
  StateImport& operator=(const StateImport&) = delete;

  // Takes the next chunk (the first carries the header). INVALID_ARGUMENT naming the tensor and
  // field on a mismatch; RESOURCE_EXHAUSTED for a chunk over max_chunk_bytes.
  absl::Status Add(const v1::StateChunk& chunk);
  // The same, with the chunk's data given apart (a view into the caller's buffer, copied into the
  // staged state): `chunk.data()` is not read.
  absl::Status Add(const v1::StateChunk& chunk, std::string_view data);
  // Checks that every field arrived whole and that the scales are usable; the staged state.
  // With `new_serve_formats` (a restored job registered again with other serve formats), the
  // scales of an fp8_tensor or fp8_delayed format the stream does not hold start as a new job's:
  // fp8_tensor's from the master's amax, fp8_delayed's at 1 with an empty history.
  absl::StatusOr<StagedState> Finish(bool new_serve_formats = false);

 private:
  absl::Status CheckHeader(const v1::StateHeader& header) const;
  absl::Status StartField(const v1::StateField& field);
  // Sizes the staging storage of a field of `elements` elements (a field staged ahead already has
  // its size); where its bytes go.
  uint8_t* Stage(HostTensorState& state, const StateFieldSpec& spec, int64_t elements);
  // The staging thread: every array field in expected_'s order, until stopped.
  void StageAhead();
  // Waits until field `field` of tensor `tensor` is staged ahead (at once without stage_ahead);
  // RESOURCE_EXHAUSTED where the staging thread found no memory.
  absl::Status AwaitStagedAhead(int tensor, size_t field);
  // Stops the staging thread and waits for it.
  void StopStagingAhead();

  const v1::RegisterRequest spec_;
  const int64_t max_chunk_bytes_;
  std::vector<std::vector<StateFieldSpec>> expected_;  // [tensor] fields the job keeps
  std::vector<std::vector<bool>> seen_;                // [tensor][field]
  bool have_header_ = false;
  StagedState staged_;
  // The field being received.
  bool in_field_ = false;
  int tensor_ = 0;
  size_t field_ = 0;
  uint8_t* dest_ = nullptr;
  int64_t size_ = 0;
  int64_t received_ = 0;
  // Staging ahead: the fields the thread has staged, counted in expected_'s order (first_field_[t]
  // is tensor t's first), and what stopped it.
  std::vector<size_t> first_field_;
  absl::Mutex ahead_mu_;
  size_t staged_ahead_ ABSL_GUARDED_BY(ahead_mu_) = 0;
  bool stop_ahead_ ABSL_GUARDED_BY(ahead_mu_) = false;
  absl::Status ahead_status_ ABSL_GUARDED_BY(ahead_mu_);
  std::thread ahead_;  // started last, in the constructor's body
};

}  // namespace paramd
