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

// Pushes `bytes` of tensor `tensor` of `spec`'s job into `job` in chunks of at most `chunk_bytes`,
// in order, as rank `rank`'s gradient of `step` (or, with `kind`, the initial weights).
inline absl::Status PushInChunks(Job& job, const v1::RegisterRequest& spec, int rank, int64_t step,
                                 int tensor, std::string_view bytes, int64_t chunk_bytes,
                                 v1::PushKind kind = v1::PUSH_KIND_GRADIENT) {
  const int64_t size = static_cast<int64_t>(bytes.size());
  for (int64_t offset = 0; offset < size; offset += chunk_bytes) {
    v1::PushChunk chunk;
    chunk.set_job(spec.job());
    chunk.set_rank(rank);
    chunk.set_step(step);
    chunk.set_tensor(spec.tensors(tensor).name());
    chunk.set_kind(kind);
    chunk.set_offset(offset);
    chunk.set_data(std::string(bytes.substr(
        static_cast<size_t>(offset), static_cast<size_t>(std::min(chunk_bytes, size - offset)))));
    absl::StatusOr<ChunkBuffer::Stored> stored = job.Push(chunk);
    if (!stored.ok()) return stored.status();
  }
  return absl::OkStatus();
}

}  // namespace paramd::testing
