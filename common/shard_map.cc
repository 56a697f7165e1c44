#include "common/shard_map.h"

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/quoted.h"

namespace paramd {
namespace {

std::string Describe(const Owner& owner) {
  return absl::StrCat("(", Quoted(owner.daemon), ", device ", owner.device, ")");
}

absl::Status CheckOwners(const std::vector<Owner>& sorted) {
  if (sorted.empty()) {
    return absl::InvalidArgumentError("a shard map needs at least one owner; none was given");
  }
  for (size_t i = 0; i < sorted.size(); ++i) {
    const Owner& owner = sorted[i];
    if (owner.daemon.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("owner ", Describe(owner), " has no daemon address"));
    }
    if (owner.device < kCpuDevice) {
      return absl::InvalidArgumentError(absl::StrCat("owner ", Describe(owner), ": device ",
                                                     owner.device, " is not ", kCpuDevice,
                                                     " (cpu) or a GPU index >= 0"));
    }
    if (i > 0 && sorted[i - 1] == owner) {
      return absl::InvalidArgumentError(
          absl::StrCat("owner ", Describe(owner), " is listed more than once"));
    }
  }
  return absl::OkStatus();
}

// Each tensor's bytes, rows * bytes_per_row, and their sum, or why they cannot be weighed.
absl::StatusOr<std::vector<int64_t>> TensorBytes(std::span<const TensorShape> tensors,
                                                 int64_t* total) {
  std::vector<int64_t> bytes(tensors.size());
  *total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorShape& t = tensors[i];
    const std::string name = absl::StrCat("tensor ", Quoted(t.name), " (index ", i, ")");
    if (t.rows < 1 || t.bytes_per_row < 1) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": rows = ", t.rows,
                                                     " and bytes_per_row = ", t.bytes_per_row,
                                                     " must both be >= 1"));
    }
    if (t.rows > kMaxShardMapBytes / t.bytes_per_row) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": rows * bytes_per_row = ", t.rows,
                                                     " * ", t.bytes_per_row, " exceeds 2^62"));
    }
    bytes[i] = t.rows * t.bytes_per_row;
    if (bytes[i] > kMaxShardMapBytes - *total) {
      return absl::InvalidArgumentError(
          absl::StrCat("the tensors' bytes exceed 2^62 from ", name, " on"));
    }
    *total += bytes[i];
  }
  return bytes;
}

// The owners by load, least loaded first, ties to the lower index.
class Loads {
 public:
  explicit Loads(int owners) : bytes_(owners, 0) {
    for (int i = 0; i < owners; ++i) by_load_.emplace(0, i);
  }

  int least_loaded() const { return by_load_.begin()->second; }
  int64_t bytes(int owner) const { return bytes_[owner]; }

  void Add(int owner, int64_t bytes) {
    by_load_.erase({bytes_[owner], owner});
    bytes_[owner] += bytes;
    by_load_.emplace(bytes_[owner], owner);
  }

  std::vector<int64_t> Release() { return std::move(bytes_); }

 private:
  std::vector<int64_t> bytes_;
  std::set<std::pair<int64_t, int>> by_load_;
};

}  // namespace

absl::StatusOr<ShardMap> ComputeShardMap(std::span<const TensorShape> tensors,
                                         std::vector<Owner> owners) {
  std::sort(owners.begin(), owners.end());
  if (absl::Status s = CheckOwners(owners); !s.ok()) return s;
  int64_t total = 0;
  absl::StatusOr<std::vector<int64_t>> bytes = TensorBytes(tensors, &total);
  if (!bytes.ok()) return bytes.status();

  const int n = static_cast<int>(owners.size());
  // For an integer x: x <= share <=> n * x <= total, i.e. x is at most the ideal share.
  const int64_t share = total / n;
  auto split = [&](size_t i) { return tensors[i].rows >= kMinSplitRows && (*bytes)[i] > share; };
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (split(a) != split(b)) return !split(a);
    return (*bytes)[a] != (*bytes)[b] ? (*bytes)[a] > (*bytes)[b] : a < b;
  });

  ShardMap map;
  map.owners = std::move(owners);
  map.tensors.resize(tensors.size());
  Loads loads(n);
  for (const size_t i : order) {
    const TensorShape& t = tensors[i];
    std::vector<ShardPiece>& pieces = map.tensors[i];
    if (!split(i)) {
      const int owner = loads.least_loaded();
      pieces.push_back({owner, 0, t.rows});
      loads.Add(owner, (*bytes)[i]);
      continue;
    }
    // How many rows each owner takes, and in what order owners are first picked.
    const int64_t block_bytes = kShardRowBlock * t.bytes_per_row;
    std::vector<int64_t> rows_of(static_cast<size_t>(n), 0);
    std::vector<int> first_picked;
    int last = 0;  // the owner that takes the tensor's last rows
    for (int64_t row = 0; row < t.rows;) {
      const int owner = loads.least_loaded();
      // While rows are left the placed bytes are below total, so the least-loaded owner holds less
      // than the ideal share.
      PARAMD_CHECK(loads.bytes(owner) <= share);
      const int64_t blocks = std::max<int64_t>((share - loads.bytes(owner)) / block_bytes, 1);
      const int64_t end =
          t.rows - row <= blocks * kShardRowBlock ? t.rows : row + blocks * kShardRowBlock;
      if (rows_of[static_cast<size_t>(owner)] == 0) first_picked.push_back(owner);
      rows_of[static_cast<size_t>(owner)] += end - row;
      loads.Add(owner, (end - row) * t.bytes_per_row);
      row = end;
      last = owner;
    }
    // One piece per owner, in the order of first picks, the owner of the last rows last: every
    // other piece is whole 128-row blocks, so each piece starts at a multiple of 128 rows.
    std::stable_partition(first_picked.begin(), first_picked.end(),
                          [last](int owner) { return owner != last; });
    int64_t begin = 0;
    for (const int owner : first_picked) {
      const int64_t end = begin + rows_of[static_cast<size_t>(owner)];
      pieces.push_back({owner, begin, end});
      begin = end;
    }
  }
  map.owner_bytes = loads.Release();
  return map;
}

std::vector<TensorShape> JobTensorShapes(
    const google::protobuf::RepeatedPtrField<v1::TensorSpec>& tensors) {
  std::vector<TensorShape> shapes;
  shapes.reserve(tensors.size());
  for (const v1::TensorSpec& t : tensors) shapes.push_back({t.name(), t.rows(), 4 * t.cols()});
  return shapes;
}

absl::StatusOr<int> BackendDevice(std::string_view backend) {
  if (!IsBackendName(backend)) {
    return absl::InvalidArgumentError(
        absl::StrCat("backend ", Quoted(backend), " is not \"cpu\", \"cpu:K\" or \"cuda:N\""));
  }
  int device = kCpuDevice;
  if (backend.substr(0, 5) == "cuda:") {
    const std::string_view index = backend.substr(5);
    PARAMD_CHECK(absl::SimpleAtoi(absl::string_view(index.data(), index.size()), &device));
  }
  return device;
}

}  // namespace paramd
