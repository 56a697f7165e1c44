// Pushes one tensor's bytes into a job in chunks, as a trainer's inline pushes do, for the server
// tests that drive a Job directly.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "server/job/job.h"

namespace paramd::testing {

// The chunk of rank `rank`'s gradient of `step` (or, with `kind`, the initial weights) of tensor
// `tensor` of job `job` that holds `data` at byte `offset`.
inline v1::PushChunk ChunkOf(const std::string& job, int rank, int64_t step,
                             const std::string& tensor, int64_t offset, std::string_view data,
                             v1::PushKind kind = v1::PUSH_KIND_GRADIENT) {
  v1::PushChunk chunk;
  chunk.set_job(job);
  chunk.set_rank(rank);
  chunk.set_step(step);
  chunk.set_tensor(tensor);
  chunk.set_kind(kind);
  chunk.set_offset(offset);
  chunk.set_data(std::string(data));
  return chunk;
}

// Pushes `bytes` of tensor `tensor` of `spec`'s job into `job` in chunks of at most `chunk_bytes`,
// in order, as rank `rank`'s gradient of `step` (or, with `kind`, the initial weights).
inline absl::Status PushInChunks(Job& job, const v1::RegisterRequest& spec, int rank, int64_t step,
                                 int tensor, std::string_view bytes, int64_t chunk_bytes,
                                 v1::PushKind kind = v1::PUSH_KIND_GRADIENT) {
  const int64_t size = static_cast<int64_t>(bytes.size());
  for (int64_t offset = 0; offset < size; offset += chunk_bytes) {
    const std::string_view part = bytes.substr(
        static_cast<size_t>(offset), static_cast<size_t>(std::min(chunk_bytes, size - offset)));
    absl::StatusOr<ChunkBuffer::Stored> stored =
        job.Push(ChunkOf(spec.job(), rank, step, spec.tensors(tensor).name(), offset, part, kind));
    if (!stored.ok()) return stored.status();
  }
  return absl::OkStatus();
}

}  // namespace paramd::testing
