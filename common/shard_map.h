// The shard map (DESIGN.md §1, §7): which owner holds which rows of each tensor of a job. A pure
// function of the job's tensor list (in registration order) and its owners, which every client and
// daemon computes alike: integer arithmetic only, every tie broken by an index, the owners sorted
// by the function itself, so the order they were given in does not matter.
//
// The rule. Owners are sorted by daemon, then device; T = the job's bytes, n = the owners, and the
// ideal share is T / n. A tensor of at least 256 rows whose bytes exceed the ideal share (n * bytes
// > T) is split; every other tensor stays whole.
//  1. Whole tensors, largest first (ties: the lower registration index), each go to the
//     least-loaded owner (ties: the lower owner index).
//  2. Then split tensors, in the same order, fill the owners up to the ideal share: block by block
//     front to back, the least-loaded owner takes the next rows, as many 128-row blocks as keep
//     it at or under the ideal share, at least one block, the last take what is left; until every
//     row is placed. Each owner's rows of the tensor are then one piece: the pieces follow the
//     order in which their owners were first picked, the owner of the tensor's last rows last (so
//     that every piece starts at a multiple of 128 rows). An owner holds at most one piece of a
//     tensor, which a daemon addresses by the tensor's name.
// The bound: every owner holds at most T / n + U bytes, U being the largest unit: the bytes of an
// unsplit tensor, or of 128 rows of a split one. (A unit goes to the least-loaded owner, which
// holds less than T / n while bytes are left, and a split piece stops at T / n unless its first
// block alone passes it.) Only ratios of bytes matter: scaling every bytes_per_row by one constant
// gives the same pieces.
#pragma once

#include <compare>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "paramd/v1/types.pb.h"

namespace paramd {

// The device of an owner whose backend is `cpu` (a cuda:N owner's device is N).
inline constexpr int kCpuDevice = -1;
// GetLayout's device of an owner whose daemon did not say which it is (it did not answer).
inline constexpr int kUnknownDevice = -2;
// A split tensor's pieces start at multiples of this many rows (a global-norm block, DESIGN.md
// §2, is never cut).
inline constexpr int64_t kShardRowBlock = 128;
// Tensors with fewer rows are never split.
inline constexpr int64_t kMinSplitRows = 2 * kShardRowBlock;
// The most bytes one tensor, and one job, may weigh.
inline constexpr int64_t kMaxShardMapBytes = int64_t{1} << 62;

// One holder of shards: a daemon and the device of its backend. Ordered by daemon, then device.
struct Owner {
  std::string daemon;       // the address trainers reach the daemon at, "host:port"
  int device = kCpuDevice;  // N of cuda:N, or kCpuDevice
  friend auto operator<=>(const Owner&, const Owner&) = default;
};

// A tensor as the shard map weighs it.
struct TensorShape {
  std::string name;
  int64_t rows = 0;           // >= 1
  int64_t bytes_per_row = 0;  // what one row costs its owner, >= 1
};

// Rows [row_begin, row_end) of a tensor, held by owners[owner].
struct ShardPiece {
  int owner = 0;
  int64_t row_begin = 0;
  int64_t row_end = 0;
  friend bool operator==(const ShardPiece&, const ShardPiece&) = default;
};

struct ShardMap {
  std::vector<Owner> owners;  // sorted, distinct
  // Per tensor, in the order given: its pieces in row order, covering every row once. A whole
  // tensor is one piece [0, rows).
  std::vector<std::vector<ShardPiece>> tensors;
  std::vector<int64_t> owner_bytes;  // per owner: the bytes of the rows it holds
  friend bool operator==(const ShardMap&, const ShardMap&) = default;
};

// The shard map of `tensors` over `owners` (see the rule above). INVALID_ARGUMENT for no owners, a
// duplicate owner, an owner without an address or with a device below kCpuDevice, a tensor with
// rows or bytes_per_row below 1, or bytes past kMaxShardMapBytes (one tensor or the job).
absl::StatusOr<ShardMap> ComputeShardMap(std::span<const TensorShape> tensors,
                                         std::vector<Owner> owners);

// A job's tensors as its shard map weighs them, from the tensor list alone so that every client
// computes the same: a row weighs its FP32 master's bytes, 4 * cols. Under the job's one state
// policy every byte a daemon keeps for a tensor (master, moments, served formats, slots) is a fixed
// number of bytes per element, per-chunk scales aside, and only ratios of bytes matter.
std::vector<TensorShape> JobTensorShapes(
    const google::protobuf::RepeatedPtrField<v1::TensorSpec>& tensors);

// The owner device of the backend named `backend`: N for "cuda:N", kCpuDevice for "cpu" and
// "cpu:K"; INVALID_ARGUMENT for any other name.
absl::StatusOr<int> BackendDevice(std::string_view backend);

}  // namespace paramd
