// The shard map (common/shard_map.h): a golden map written out, so that a change of the rule (which
// would set clients and daemons of different versions at odds) fails here; on 500 random LLM-like
// jobs and 500 jobs of arbitrary shapes over 1 to 8 owners: every row placed once, split
// boundaries on multiples of 128 rows, the balance bound, the same map whatever the owners' order
// and whatever constant scales the bytes; one owner holds the job whole; bad input.
#include "common/shard_map.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace paramd {

// How a failing expectation prints owners and pieces.
void PrintTo(const Owner& owner, std::ostream* os) {
  *os << "(" << owner.daemon << ", " << owner.device << ")";
}
void PrintTo(const ShardPiece& piece, std::ostream* os) {
  *os << "{" << piece.owner << ", " << piece.row_begin << ", " << piece.row_end << "}";
}

namespace {

std::vector<Owner> Owners(int n) {
  std::vector<Owner> owners;
  // Two GPUs per node, so that owners share a daemon.
  for (int i = 0; i < n; ++i) owners.push_back({absl::StrCat("node", i / 2, ":50051"), i % 2});
  return owners;
}

ShardMap MapOf(const std::vector<TensorShape>& tensors, std::vector<Owner> owners) {
  absl::StatusOr<ShardMap> map = ComputeShardMap(tensors, std::move(owners));
  EXPECT_TRUE(map.ok()) << map.status();
  return map.ok() ? *std::move(map) : ShardMap{};
}

int64_t Bytes(const TensorShape& t) { return t.rows * t.bytes_per_row; }

int64_t Total(const std::vector<TensorShape>& tensors) {
  int64_t total = 0;
  for (const TensorShape& t : tensors) total += Bytes(t);
  return total;
}

// Whether the rule may split the tensor: at least 256 rows and more than the ideal share.
bool Splittable(const TensorShape& t, int64_t total, int owners) {
  return t.rows >= kMinSplitRows && Bytes(t) * owners > total;
}

// The largest unit of the bound: an unsplit tensor's bytes, or 128 rows of a split one.
int64_t LargestUnit(const std::vector<TensorShape>& tensors, int owners) {
  const int64_t total = Total(tensors);
  int64_t unit = 0;
  for (const TensorShape& t : tensors) {
    unit =
        std::max(unit, Splittable(t, total, owners) ? kShardRowBlock * t.bytes_per_row : Bytes(t));
  }
  return unit;
}

// Every row of every tensor held once, in pieces that start on 128-row boundaries; a tensor the
// rule keeps whole in one piece; no owner with two pieces of a tensor; the owners' bytes the sum of
// their pieces, within the bound.
::testing::AssertionResult IsValid(const std::vector<TensorShape>& tensors, const ShardMap& map) {
  const int n = static_cast<int>(map.owners.size());
  if (n == 0 || !std::is_sorted(map.owners.begin(), map.owners.end()) ||
      std::adjacent_find(map.owners.begin(), map.owners.end()) != map.owners.end()) {
    return ::testing::AssertionFailure() << "owners not sorted and distinct";
  }
  if (map.tensors.size() != tensors.size() || map.owner_bytes.size() != map.owners.size()) {
    return ::testing::AssertionFailure() << "wrong number of tensors or owner totals";
  }
  const int64_t total = Total(tensors);
  std::vector<int64_t> held(n, 0);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorShape& t = tensors[i];
    const std::vector<ShardPiece>& pieces = map.tensors[i];
    if (pieces.empty()) return ::testing::AssertionFailure() << t.name << " has no piece";
    if (!Splittable(t, total, n) && pieces.size() != 1) {
      return ::testing::AssertionFailure() << t.name << " is split but should be whole";
    }
    int64_t row = 0;
    std::vector<bool> holds(n, false);
    for (const ShardPiece& p : pieces) {
      if (p.owner < 0 || p.owner >= n) {
        return ::testing::AssertionFailure() << t.name << ": owner " << p.owner << " out of range";
      }
      if (holds[p.owner]) {
        return ::testing::AssertionFailure()
               << t.name << ": owner " << p.owner << " holds two pieces";
      }
      holds[p.owner] = true;
      if (p.row_begin != row || p.row_end <= p.row_begin || p.row_end > t.rows) {
        return ::testing::AssertionFailure()
               << t.name << ": piece [" << p.row_begin << ", " << p.row_end << ") after row " << row
               << " of " << t.rows;
      }
      if (p.row_begin % kShardRowBlock != 0 ||
          (p.row_end % kShardRowBlock != 0 && p.row_end != t.rows)) {
        return ::testing::AssertionFailure() << t.name << ": piece [" << p.row_begin << ", "
                                             << p.row_end << ") not on 128-row boundaries";
      }
      held[p.owner] += (p.row_end - p.row_begin) * t.bytes_per_row;
      row = p.row_end;
    }
    if (row != t.rows) {
      return ::testing::AssertionFailure()
             << t.name << ": rows " << row << ".." << t.rows << " not placed";
    }
  }
  if (held != map.owner_bytes) return ::testing::AssertionFailure() << "owner_bytes is not held";
  // max <= total / n + unit, in integers.
  const int64_t max = *std::max_element(held.begin(), held.end());
  const int64_t unit = LargestUnit(tensors, n);
  if (max * n > total + unit * n) {
    return ::testing::AssertionFailure() << "an owner holds " << max << " bytes; the bound is "
                                         << total << " / " << n << " + " << unit;
  }
  return ::testing::AssertionSuccess();
}

int64_t Pick(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
}

// A decoder-only language model: an embedding, layers of norms, attention (grouped key/value
// heads) and an MLP (gated or not, biases or not), a final norm, maybe an untied head; the state
// costs 2 to 16 bytes per element.
std::vector<TensorShape> RandomLanguageModel(std::mt19937_64& rng) {
  const int64_t d = 64 * Pick(rng, 1, 128);
  const int64_t vocab = Pick(rng, 1000, 160000);
  const int64_t kv = d / (int64_t{1} << Pick(rng, 0, 3));
  const int64_t ffn = d * Pick(rng, 2, 4) + 64 * Pick(rng, 0, 3);
  const bool gated = Pick(rng, 0, 1) == 1;
  const bool biases = Pick(rng, 0, 1) == 1;
  const int64_t element = std::vector<int64_t>{2, 4, 8, 12, 16}[Pick(rng, 0, 4)];
  std::vector<TensorShape> job;
  auto add = [&](std::string name, int64_t rows, int64_t cols) {
    job.push_back({std::move(name), rows, cols * element});
  };
  add("embed", vocab, d);
  for (int64_t l = 0, layers = Pick(rng, 1, 24); l < layers; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    add(p + "attn_norm", 1, d);
    add(p + "q", d, d);
    add(p + "k", kv, d);
    add(p + "v", kv, d);
    add(p + "o", d, d);
    add(p + "mlp_norm", 1, d);
    add(p + "up", ffn, d);
    if (gated) add(p + "gate", ffn, d);
    if (biases) add(p + "up_bias", 1, ffn);
    add(p + "down", d, ffn);
  }
  add("final_norm", 1, d);
  if (Pick(rng, 0, 1) == 1) add("head", vocab, d);
  return job;
}

// 1 to 40 tensors of 1 to 3000 rows, 1 to 5000 bytes a row.
std::vector<TensorShape> RandomShapes(std::mt19937_64& rng) {
  std::vector<TensorShape> job;
  for (int64_t i = 0, n = Pick(rng, 1, 40); i < n; ++i) {
    job.push_back({absl::StrCat("t", i), Pick(rng, 1, 3000), Pick(rng, 1, 5000)});
  }
  return job;
}

// Checks the map of `job` over 1 to 8 owners: valid, the same for shuffled owners and for bytes
// scaled by 3. Counts the maps with a split tensor.
void CheckJob(const std::vector<TensorShape>& job, std::mt19937_64& rng, int* maps_with_splits) {
  std::vector<TensorShape> scaled = job;
  for (TensorShape& t : scaled) t.bytes_per_row *= 3;
  for (int n = 1; n <= 8; ++n) {
    SCOPED_TRACE(absl::StrCat(job.size(), " tensors over ", n, " owners"));
    const ShardMap map = MapOf(job, Owners(n));
    ASSERT_TRUE(IsValid(job, map));
    std::vector<Owner> shuffled = Owners(n);
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    ASSERT_EQ(MapOf(job, shuffled), map);
    ASSERT_EQ(MapOf(scaled, Owners(n)).tensors, map.tensors);
    if (std::any_of(map.tensors.begin(), map.tensors.end(),
                    [](const std::vector<ShardPiece>& p) { return p.size() > 1; })) {
      ++*maps_with_splits;
    }
  }
}

TEST(ShardMapTest, MatchesTheGoldenMap) {
  // Owners given out of order; sorted they are 0 = (10.0.0.1, 0), 1 = (10.0.0.1, 1),
  // 2 = (10.0.0.2, 0). The job weighs 132632 bytes; the ideal share is 44210.67.
  const std::vector<TensorShape> job = {
      {"embed", 1000, 64},  // 64000 bytes, split in 8192-byte blocks of 128 rows
      {"w1", 300, 100},     // 30000
      {"w2", 200, 150},     // 30000, too few rows to split
      {"norm", 1, 400},     // 400
      {"head", 512, 16},    // 8192
      {"bias", 1, 40},      // 40
  };
  const ShardMap map =
      MapOf(job, {{"10.0.0.2:50051", 0}, {"10.0.0.1:50051", 1}, {"10.0.0.1:50051", 0}});
  const std::vector<Owner> owners = {
      {"10.0.0.1:50051", 0}, {"10.0.0.1:50051", 1}, {"10.0.0.2:50051", 0}};
  EXPECT_EQ(map.owners, owners);
  // Whole tensors first: w1 -> 0, w2 -> 1, head, norm and bias -> 2 (8632 bytes). Then embed
  // fills up to the share: 4 blocks to 2, one to 0, one to 1, and one more each to 0 and 1 (the
  // last 104 rows), as the least loaded, when no whole block fits under the share. Each owner's
  // rows are one piece, in the order of first picks (2, 0, 1), 1 (the last rows' owner) last.
  const std::vector<std::vector<ShardPiece>> tensors = {
      {{2, 0, 512}, {0, 512, 768}, {1, 768, 1000}},
      {{0, 0, 300}},
      {{1, 0, 200}},
      {{2, 0, 1}},
      {{2, 0, 512}},
      {{2, 0, 1}},
  };
  EXPECT_EQ(map.tensors, tensors);
  EXPECT_EQ(map.owner_bytes, (std::vector<int64_t>{46384, 44848, 41400}));
  EXPECT_TRUE(IsValid(job, map));
}

TEST(ShardMapTest, HoldsOnRandomLanguageModels) {
  std::mt19937_64 rng(20240601);
  int maps_with_splits = 0;
  for (int job = 0; job < 500; ++job) {
    SCOPED_TRACE(absl::StrCat("job ", job));
    CheckJob(RandomLanguageModel(rng), rng, &maps_with_splits);
    if (HasFatalFailure()) return;
  }
  // The split path ran (small models over many owners split their embedding).
  EXPECT_GT(maps_with_splits, 100);
}

TEST(ShardMapTest, HoldsOnRandomShapes) {
  std::mt19937_64 rng(7);
  int maps_with_splits = 0;
  for (int job = 0; job < 500; ++job) {
    SCOPED_TRACE(absl::StrCat("job ", job));
    CheckJob(RandomShapes(rng), rng, &maps_with_splits);
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(maps_with_splits, 500);
}

TEST(ShardMapTest, OneOwnerHoldsTheWholeJobWhole) {
  std::mt19937_64 rng(3);
  for (int job = 0; job < 50; ++job) {
    const std::vector<TensorShape> tensors = RandomLanguageModel(rng);
    const ShardMap map = MapOf(tensors, {{"host:1", kCpuDevice}});
    ASSERT_EQ(map.tensors.size(), tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      EXPECT_EQ(map.tensors[i], (std::vector<ShardPiece>{{0, 0, tensors[i].rows}}));
    }
    EXPECT_EQ(map.owner_bytes, std::vector<int64_t>{Total(tensors)});
  }
}

TEST(ShardMapTest, SplitsOnlyTensorsOfAtLeast256Rows) {
  const ShardMap whole = MapOf({{"short", 255, 1000}, {"tiny", 1, 1}}, Owners(4));
  EXPECT_EQ(whole.tensors[0], (std::vector<ShardPiece>{{0, 0, 255}}));
  const ShardMap split = MapOf({{"w", 256, 1000}}, Owners(2));
  EXPECT_EQ(split.tensors[0], (std::vector<ShardPiece>{{0, 0, 128}, {1, 128, 256}}));
  EXPECT_EQ(split.owner_bytes, (std::vector<int64_t>{128000, 128000}));
}

TEST(ShardMapTest, SplitsATensorLargerThanTheShareInto128RowRanges) {
  // 1000 rows over 3 owners: a share of 333.3 rows holds 2 blocks; the last 232 rows go one block
  // at a time to the least loaded (0, then 1). Each owner's rows are one piece; 1, which takes the
  // last 104 rows, comes last.
  const ShardMap map = MapOf({{"w", 1000, 8}}, Owners(3));
  EXPECT_EQ(map.tensors[0], (std::vector<ShardPiece>{{0, 0, 384}, {2, 384, 640}, {1, 640, 1000}}));
  EXPECT_EQ(map.owner_bytes, (std::vector<int64_t>{384 * 8, 360 * 8, 256 * 8}));
}

TEST(ShardMapTest, KeepsAJobWithoutTensorsEmpty) {
  const ShardMap map = MapOf({}, Owners(2));
  EXPECT_TRUE(map.tensors.empty());
  EXPECT_EQ(map.owner_bytes, (std::vector<int64_t>{0, 0}));
}

TEST(ShardMapTest, OrdersOwnersByDaemonThenDevice) {
  EXPECT_LT((Owner{"a:1", 5}), (Owner{"b:1", 0}));
  EXPECT_LT((Owner{"a:1", kCpuDevice}), (Owner{"a:1", 0}));
  EXPECT_LT((Owner{"a:1", 1}), (Owner{"a:1", 2}));
}

TEST(ShardMapTest, RefusesBadOwners) {
  const std::vector<TensorShape> job = {{"w", 4, 4}};
  struct Case {
    std::vector<Owner> owners;
    std::string message;
  };
  const Case cases[] = {
      {{}, "at least one owner"},
      {{{"a:1", 0}, {"b:1", 0}, {"a:1", 0}}, "(\"a:1\", device 0) is listed more than once"},
      {{{"", 0}}, "no daemon address"},
      {{{"a:1", -2}}, "device -2 is not -1 (cpu) or a GPU index >= 0"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ShardMap> map = ComputeShardMap(job, c.owners);
    EXPECT_EQ(map.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_TRUE(absl::StrContains(map.status().message(), c.message)) << map.status();
  }
}

TEST(ShardMapTest, RefusesBadTensors) {
  struct Case {
    std::vector<TensorShape> tensors;
    std::string message;
  };
  const Case cases[] = {
      {{{"ok", 1, 1}, {"w", 0, 4}}, "tensor \"w\" (index 1): rows = 0 and bytes_per_row = 4"},
      {{{"w", -3, 4}}, "rows = -3"},
      {{{"w", 4, 0}}, "bytes_per_row = 0 must both be >= 1"},
      {{{"w", int64_t{1} << 40, int64_t{1} << 23}}, "tensor \"w\" (index 0): rows * bytes_per_row"},
      {{{"a", int64_t{1} << 30, int64_t{1} << 31}, {"b", (int64_t{1} << 30) + 1, int64_t{1} << 31}},
       "the tensors' bytes exceed 2^62 from tensor \"b\""},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ShardMap> map = ComputeShardMap(c.tensors, Owners(2));
    EXPECT_EQ(map.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_TRUE(absl::StrContains(map.status().message(), c.message)) << map.status();
  }
}

TEST(ShardMapTest, WeighsAJobsRowsByTheirFp32Bytes) {
  google::protobuf::RepeatedPtrField<v1::TensorSpec> tensors;
  v1::TensorSpec* w = tensors.Add();
  w->set_name("w");
  w->set_rows(300);
  w->set_cols(7);
  v1::TensorSpec* b = tensors.Add();
  b->set_name("b");
  b->set_rows(1);
  b->set_cols(1000);
  const std::vector<TensorShape> shapes = JobTensorShapes(tensors);
  ASSERT_EQ(shapes.size(), 2u);
  EXPECT_EQ(shapes[0].name, "w");
  EXPECT_EQ(shapes[0].rows, 300);
  EXPECT_EQ(shapes[0].bytes_per_row, 28);
  EXPECT_EQ(shapes[1].name, "b");
  EXPECT_EQ(shapes[1].rows, 1);
  EXPECT_EQ(shapes[1].bytes_per_row, 4000);
}

TEST(ShardMapTest, ReadsTheDeviceOfABackend) {
  EXPECT_EQ(BackendDevice("cpu").value_or(-9), kCpuDevice);
  EXPECT_EQ(BackendDevice("cuda:0").value_or(-9), 0);
  EXPECT_EQ(BackendDevice("cuda:3").value_or(-9), 3);
  EXPECT_EQ(BackendDevice("cpu:2").value_or(-9), kCpuDevice);
  for (const char* bad : {"", "gpu", "cuda:", "cuda:-1", "cuda:x", "cpu:", "cpu:x", "cuda:all"}) {
    EXPECT_EQ(BackendDevice(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace paramd
