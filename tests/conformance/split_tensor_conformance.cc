// Part of the backend conformance suite (backend_conformance.h): a tensor split over owners by rows
// (DESIGN.md §7), each row range stepped by a backend of its own as a tensor of its own
// (TensorInfo::row_offset), equals the whole tensor stepped by one backend, bit for bit: every
// served format (a rowwise format's rows, a columnwise one's column block), the state arrays and
// scalars, over steps with stochastic rounding and clipping from the ranges' block sums; and the
// per-tensor recipes with the ranges' amax combined between the passes (TensorStep::whole_amax),
// as the owners of a sharded job do, where the backend combines it.
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "client/served_pieces.h"
#include "kernels/formats.h"
#include "kernels/step_rules.h"
#include "server/state/state_fields.h"
#include "tests/conformance/backend_conformance.h"

namespace paramd::testing {
namespace {

constexpr int64_t kRows = 677;  // 5 blocks of 128 rows and 37 more
constexpr int64_t kCols = 96;
constexpr int kRanks = 2;

struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t rows() const { return end - begin; }
};

// Every format a row range serves as its part of the whole tensor's: the plain casts and the
// block formats, both directions.
const std::vector<FormatKey> kBlockFormats = {
    {v1::RECIPE_FP32, v1::DIRECTION_ROWWISE},         {v1::RECIPE_BF16, v1::DIRECTION_ROWWISE},
    {v1::RECIPE_FP16, v1::DIRECTION_ROWWISE},         {v1::RECIPE_FP8_BLOCK, v1::DIRECTION_ROWWISE},
    {v1::RECIPE_FP8_BLOCK, v1::DIRECTION_COLUMNWISE}, {v1::RECIPE_MXFP8, v1::DIRECTION_ROWWISE},
    {v1::RECIPE_MXFP8, v1::DIRECTION_COLUMNWISE},
};
// The per-tensor recipes, whose scale comes from the whole tensor's amax.
const std::vector<FormatKey> kPerTensorFormats = {
    {v1::RECIPE_BF16, v1::DIRECTION_ROWWISE},
    {v1::RECIPE_FP8_TENSOR, v1::DIRECTION_ROWWISE},
    {v1::RECIPE_FP8_TENSOR, v1::DIRECTION_COLUMNWISE},
    {v1::RECIPE_FP8_DELAYED, v1::DIRECTION_ROWWISE},
};

// One holder of a tensor or of a row range of it: a backend of its own, as one daemon has.
struct Holder {
  Range range;
  std::vector<FormatKey> formats;
  TensorInfo info;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<TensorState> state;
  std::unique_ptr<ServedTensor> served;
};

std::unique_ptr<ServedTensor> NewServed(const std::vector<FormatKey>& formats, int64_t rows) {
  auto served = std::make_unique<ServedTensor>();
  for (const FormatKey& key : formats) {
    ServedFormat& f = served->formats.emplace_back();
    f.key = key;
    f.layout =
        kernels::ServeLayout(KernelRecipe(key.recipe), KernelDirection(key.direction), rows, kCols);
    f.bytes = HeapBuffer(f.layout.data_bytes + f.layout.scale_bytes);
  }
  return served;
}

TensorInfo InfoOf(const kernels::StatePolicy& policy, Range range) {
  TensorInfo info;
  info.rows = range.rows();
  info.cols = kCols;
  info.index = 3;  // as if three tensors came before it in the job
  info.row_offset = range.begin;
  info.policy = policy;
  info.delayed_history = 4;
  return info;
}

std::unique_ptr<Holder> MakeHolder(std::unique_ptr<Backend> backend,
                                   const std::vector<FormatKey>& formats,
                                   const kernels::StatePolicy& policy, Range range,
                                   const std::vector<float>& initial,
                                   const WholeAmax& whole_amax = nullptr) {
  auto h = std::make_unique<Holder>();
  h->range = range;
  h->formats = formats;
  h->info = InfoOf(policy, range);
  h->backend = std::move(backend);
  h->served = NewServed(formats, range.rows());
  if (h->backend == nullptr) return h;
  absl::StatusOr<std::unique_ptr<TensorState>> state = h->backend->CreateState(
      h->info,
      std::span<const float>(initial).subspan(static_cast<size_t>(range.begin * kCols),
                                              static_cast<size_t>(range.rows() * kCols)),
      h->served.get(), whole_amax);
  EXPECT_TRUE(state.ok()) << state.status();
  if (state.ok()) h->state = *std::move(state);
  return h;
}

TensorStep StepOf(Holder& h, const std::vector<std::vector<float>>& grads) {
  TensorStep t;
  t.state = h.state.get();
  for (const std::vector<float>& g : grads) t.slots.push_back(g.data() + h.range.begin * kCols);
  t.out = h.served.get();
  return t;
}

// Bytes [row_begin, row_end) of every row of a row-major [rows, cols] array of `element` bytes.
std::vector<uint8_t> Columns(const uint8_t* data, int64_t rows, int64_t cols, int64_t element,
                             int64_t col_begin, int64_t col_end) {
  std::vector<uint8_t> out;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = data + (r * cols + col_begin) * element;
    out.insert(out.end(), row, row + (col_end - col_begin) * element);
  }
  return out;
}

// What of the whole tensor's served format `f` the range's must equal: its rows for a rowwise
// layout ([rows, cols] data, row blocks of scales), its column block for a transposed one.
void ExpectRangeOfWhole(const ServedFormat& whole, const ServedFormat& range, Range r,
                        const std::string& where) {
  const kernels::ServeBufferLayout& wl = whole.layout;
  const kernels::ServeBufferLayout& rl = range.layout;
  const int64_t element = wl.data_bytes / (wl.data_rows * wl.data_cols);
  const bool transposed = wl.data_rows == kCols && wl.data_cols == kRows;
  std::vector<uint8_t> expect, got(range.bytes.data(), range.bytes.data() + rl.data_bytes);
  if (transposed) {
    expect = Columns(whole.bytes.data(), wl.data_rows, wl.data_cols, element, r.begin, r.end);
  } else {
    const uint8_t* from = whole.bytes.data() + r.begin * wl.data_cols * element;
    expect.assign(from, from + rl.data_bytes);
  }
  EXPECT_EQ(got, expect) << where << ": data";
  if (wl.scale_count == 0) return;
  const uint8_t* ws = whole.bytes.data() + wl.data_bytes;
  const uint8_t* rs = range.bytes.data() + rl.data_bytes;
  const int64_t scale_element = wl.scale_bytes / wl.scale_count;
  got.assign(rs, rs + rl.scale_bytes);
  if (wl.scale_count == 1) {  // per tensor: the whole tensor's scale
    expect.assign(ws, ws + wl.scale_bytes);
  } else if (wl.scale_cols == rl.scale_cols && wl.scale_rows != rl.scale_rows) {
    // A scale per block of `block` rows (the range starts at a multiple of 128): fp8_block's 128,
    // mxfp8's 1 along a row and 32 down a column.
    const int64_t block = whole.key.recipe == v1::RECIPE_FP8_BLOCK          ? 128
                          : whole.key.direction == v1::DIRECTION_COLUMNWISE ? 32
                                                                            : 1;
    const int64_t first = r.begin / block;
    expect.assign(ws + first * wl.scale_cols * scale_element,
                  ws + (first + rl.scale_rows) * wl.scale_cols * scale_element);
  } else {  // transposed blocks of 128 rows: a column block of the scales
    expect = Columns(ws, wl.scale_rows, wl.scale_cols, scale_element, r.begin / 128,
                     r.begin / 128 + rl.scale_cols);
  }
  EXPECT_EQ(got, expect) << where << ": scales";
}

void ExpectStateRangeOfWhole(Holder& whole, Holder& range, const std::string& where) {
  const std::vector<StateFieldSpec> wf = TensorStateFields(whole.info, whole.formats);
  const std::vector<StateFieldSpec> rf = TensorStateFields(range.info, range.formats);
  ASSERT_EQ(wf.size(), rf.size());
  for (size_t i = 0; i < wf.size(); ++i) {
    if (!wf[i].array.has_value()) continue;
    const int64_t element = wf[i].bytes() / wf[i].elements();
    const bool chunk_scales = wf[i].kind == StateFieldKind::kExpAvgScales ||
                              wf[i].kind == StateFieldKind::kExpAvgSqScales;
    const int64_t first =
        chunk_scales ? range.range.begin * kCols / 128 : range.range.begin * kCols;
    std::vector<uint8_t> expect(static_cast<size_t>(rf[i].bytes()));
    std::vector<uint8_t> got(expect.size());
    ASSERT_TRUE(
        whole.backend->ReadStateArray(*whole.state, *wf[i].array, first * element, expect).ok());
    ASSERT_TRUE(range.backend->ReadStateArray(*range.state, *rf[i].array, 0, got).ok());
    EXPECT_EQ(got, expect) << where << ": " << wf[i].name;
  }
  // The per-tensor scalars, where the job's formats make them part of the state.
  absl::StatusOr<TensorScalars> ws = whole.backend->ReadStateScalars(*whole.state);
  absl::StatusOr<TensorScalars> rs = range.backend->ReadStateScalars(*range.state);
  ASSERT_TRUE(ws.ok() && rs.ok());
  for (const StateFieldSpec& field : wf) {
    if (field.kind == StateFieldKind::kFp8TensorScale) {
      EXPECT_EQ(rs->fp8_tensor_scale, ws->fp8_tensor_scale) << where;
    } else if (field.kind == StateFieldKind::kFp8DelayedScale) {
      EXPECT_EQ(rs->fp8_delayed_scale, ws->fp8_delayed_scale) << where;
    } else if (field.kind == StateFieldKind::kFp8DelayedHistory) {
      EXPECT_EQ(rs->delayed_history, ws->delayed_history) << where;
    }
  }
}

// The owners' amax exchange of one step: each range gives its amax and gets the whole tensor's.
class AmaxExchange {
 public:
  explicit AmaxExchange(size_t owners) : amax_(owners) {}
  float Combine(size_t owner, float amax) {
    std::unique_lock<std::mutex> lock(mu_);
    amax_[owner] = amax;
    ++count_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return count_ == amax_.size(); });
    float whole = 0.0f;
    for (float a : amax_) whole = kernels::AmaxCombine(whole, a);
    return whole;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<float> amax_;
  size_t count_ = 0;
};

// The trainer's side (client/served_pieces.h): the ranges' served bytes, each put in its place,
// are the whole tensor's, byte for byte.
void ExpectPlacedRangesAreTheWhole(const Holder& whole,
                                   const std::vector<std::unique_ptr<Holder>>& ranges,
                                   const std::string& where) {
  for (size_t f = 0; f < whole.formats.size(); ++f) {
    const ServedFormat& w = whole.served->formats[f];
    std::vector<uint8_t> placed(static_cast<size_t>(w.bytes.size()), 0xA5);
    for (const auto& r : ranges) {
      const HostBuffer& bytes = r->served->formats[f].bytes;
      const absl::Status s = PlaceServedRange(
          KernelRecipe(w.key.recipe), KernelDirection(w.key.direction), kRows, kCols,
          r->range.begin, r->range.end, bytes.span(), std::span<uint8_t>(placed));
      ASSERT_TRUE(s.ok()) << where << ": " << s;
    }
    EXPECT_TRUE(std::equal(placed.begin(), placed.end(), w.bytes.data()))
        << where << ", " << FormatName(w.key) << ": the placed ranges differ from the whole";
  }
}

struct PolicyCase {
  const char* name;
  kernels::StatePolicy policy;
};

std::vector<PolicyCase> SplitPolicies() {
  using kernels::MasterType;
  using kernels::MomentType;
  using kernels::Rounding;
  auto policy = [](MasterType master, MomentType m, MomentType v, Rounding mr, Rounding vr) {
    kernels::StatePolicy p;
    p.master = master;
    p.exp_avg = m;
    p.exp_avg_sq = v;
    p.exp_avg_rounding = mr;
    p.exp_avg_sq_rounding = vr;
    return p;
  };
  return {
      {"fp32", policy(MasterType::kFp32, MomentType::kFp32, MomentType::kFp32, Rounding::kNearest,
                      Rounding::kNearest)},
      {"fp8 both stochastic", policy(MasterType::kFp32, MomentType::kFp8, MomentType::kFp8,
                                     Rounding::kStochastic, Rounding::kStochastic)},
      {"bf16+remainder, fp16, fp8",
       policy(MasterType::kBf16Remainder, MomentType::kFp16, MomentType::kFp8, Rounding::kNearest,
              Rounding::kStochastic)},
      {"fp16 master, bf16 stochastic, fp16",
       policy(MasterType::kFp16, MomentType::kBf16, MomentType::kFp16, Rounding::kStochastic,
              Rounding::kNearest)},
  };
}

const std::vector<Range>& Cuts() {
  static const std::vector<Range> cuts = {{0, 128}, {128, 384}, {384, kRows}};
  return cuts;
}

// Runs `owner(i)` for every range at once, each on a thread of its own, as the owners do.
void AtOnce(size_t n, const std::function<void(size_t)>& owner) {
  std::vector<std::thread> threads;
  for (size_t i = 0; i < n; ++i) threads.emplace_back(owner, i);
  for (std::thread& t : threads) t.join();
}

// Six steps of the whole tensor on one backend and of its row ranges on one backend each, every
// served format and the state compared after each: UNIMPLEMENTED from a range's step comes back
// (a backend that does not combine amax), any other failure fails the test.
absl::Status ExpectRangesEqualTheWhole(const std::function<std::unique_ptr<Backend>()>& make,
                                       const std::vector<FormatKey>& formats,
                                       const PolicyCase& policy_case, bool combine_amax) {
  const std::string policy_name = policy_case.name;
  const kernels::StatePolicy& policy = policy_case.policy;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> initial(static_cast<size_t>(kRows * kCols));
  for (float& w : initial) w = 0.02f * normal(rng);
  std::unique_ptr<Holder> whole = MakeHolder(make(), formats, policy, {0, kRows}, initial);
  // Each owner makes its range's version 0 at once, meeting for the fp8_tensor amax.
  std::vector<std::unique_ptr<Holder>> ranges(Cuts().size());
  {
    AmaxExchange exchange(Cuts().size());
    AtOnce(Cuts().size(), [&](size_t i) {
      WholeAmax combine = [&exchange, i](float amax) -> absl::StatusOr<float> {
        return exchange.Combine(i, amax);
      };
      ranges[i] =
          MakeHolder(make(), formats, policy, Cuts()[i], initial, combine_amax ? combine : nullptr);
    });
  }
  if (whole->state == nullptr) return absl::InternalError("no state");
  for (auto& r : ranges) {
    if (r->state == nullptr) return absl::InternalError("no state");
  }
  for (auto& r : ranges) {
    for (size_t f = 0; f < formats.size(); ++f) {
      ExpectRangeOfWhole(whole->served->formats[f], r->served->formats[f], r->range,
                         policy_name + ", version 0, " + FormatName(formats[f]));
    }
  }
  ExpectPlacedRangesAreTheWhole(*whole, ranges, policy_name + ", version 0");
  const kernels::AdamwHyper hyper{1e-2, 0.9, 0.999, 1e-8, 0.01};
  for (int64_t k = 1; k <= 6; ++k) {
    const std::string where = policy_name + ", step " + std::to_string(k);
    std::vector<std::vector<float>> grads(kRanks, std::vector<float>(initial.size()));
    for (auto& g : grads) {
      for (float& x : g) x = (k % 2 == 0 ? 1e-1f : 1e-3f) * normal(rng);
    }
    // The job-wide check: the ranges' block sums, one after another, are the whole tensor's.
    std::vector<TensorStep> whole_step = {StepOf(*whole, grads)};
    absl::StatusOr<GradientCheck> whole_check =
        whole->backend->CheckGradients(whole_step, 0.5f, /*norms=*/true);
    if (!whole_check.ok()) return whole_check.status();
    std::vector<double> blocks;
    bool finite = true;
    for (auto& r : ranges) {
      std::vector<TensorStep> step = {StepOf(*r, grads)};
      absl::StatusOr<GradientCheck> check = r->backend->CheckGradients(step, 0.5f, true);
      if (!check.ok()) return check.status();
      finite = finite && check->finite;
      blocks.insert(blocks.end(), check->block_sums[0].begin(), check->block_sums[0].end());
    }
    EXPECT_EQ(blocks, whole_check->block_sums[0]) << where;
    EXPECT_EQ(finite, whole_check->finite) << where;
    StepScalars scalars;
    scalars.adamw = kernels::MakeAdamwScalars(hyper, k);
    scalars.grad_scale = 0.5f;
    scalars.seed = 0x1234567890abcdefULL;
    scalars.k = k;
    scalars.clip = kernels::ClipFactor(
        kernels::SumInOrder(blocks.data(), static_cast<int64_t>(blocks.size())), 1.0);
    if (k % 2 == 0) {
      EXPECT_LT(scalars.clip, 1.0f) << where << " should clip";
    }
    whole->served = NewServed(formats, kRows);
    whole_step[0].out = whole->served.get();
    if (absl::Status s = whole->backend->ApplyStep(whole_step, scalars); !s.ok()) return s;
    AmaxExchange exchange(ranges.size());
    std::vector<absl::Status> results(ranges.size());
    AtOnce(ranges.size(), [&](size_t i) {
      Holder& r = *ranges[i];
      r.served = NewServed(formats, r.range.rows());
      std::vector<TensorStep> step = {StepOf(r, grads)};
      if (combine_amax) {
        step[0].whole_amax = [&exchange, i](float amax) -> absl::StatusOr<float> {
          return exchange.Combine(i, amax);
        };
      }
      results[i] = r.backend->ApplyStep(step, scalars);
    });
    for (size_t i = 0; i < ranges.size(); ++i) {
      if (!results[i].ok()) return results[i];
      for (size_t f = 0; f < formats.size(); ++f) {
        ExpectRangeOfWhole(whole->served->formats[f], ranges[i]->served->formats[f],
                           ranges[i]->range,
                           where + ", range " + std::to_string(i) + ", " + FormatName(formats[f]));
      }
      ExpectStateRangeOfWhole(*whole, *ranges[i], where);
    }
    ExpectPlacedRangesAreTheWhole(*whole, ranges, where);
  }
  return absl::OkStatus();
}

}  // namespace

TEST_P(BackendConformanceTest, RowRangesOfASplitTensorSteppedApartEqualTheWholeBitForBit) {
  for (const PolicyCase& policy : SplitPolicies()) {
    const absl::Status status = ExpectRangesEqualTheWhole(
        [this] { return MakeBackend(); }, kBlockFormats, policy, /*combine_amax=*/false);
    ASSERT_TRUE(status.ok()) << policy.name << ": " << status;
  }
}

TEST_P(BackendConformanceTest, RowRangesServedPerTensorCombineTheirAmaxIntoTheWholeTensors) {
  for (const PolicyCase& policy : SplitPolicies()) {
    const absl::Status status = ExpectRangesEqualTheWhole(
        [this] { return MakeBackend(); }, kPerTensorFormats, policy, /*combine_amax=*/true);
    if (status.code() == absl::StatusCode::kUnimplemented) {
      GTEST_SKIP() << "backend " << GetParam().name << " does not step split tensors served per "
                   << "tensor: " << status;
    }
    ASSERT_TRUE(status.ok()) << policy.name << ": " << status;
  }
}

TEST(PlaceServedRangeTest, ARangeThatNoOwnerServesOrBytesOfAnotherSizeAreInvalidArgument) {
  const auto recipe = kernels::Recipe::kFp8Block;
  const auto dir = kernels::Direction::kColumnwise;
  const kernels::ServeBufferLayout w = kernels::ServeLayout(recipe, dir, kRows, kCols);
  const kernels::ServeBufferLayout p = kernels::ServeLayout(recipe, dir, 128, kCols);
  std::vector<uint8_t> whole(static_cast<size_t>(w.data_bytes + w.scale_bytes), 7);
  const std::vector<uint8_t> before = whole;
  std::vector<uint8_t> range(static_cast<size_t>(p.data_bytes + p.scale_bytes), 1);
  for (auto [begin, end] : std::vector<std::pair<int64_t, int64_t>>{
           {64, 192}, {0, 0}, {kRows - 37, kRows + 91}, {-128, 0}}) {
    EXPECT_EQ(PlaceServedRange(recipe, dir, kRows, kCols, begin, end, range, whole).code(),
              absl::StatusCode::kInvalidArgument)
        << begin << ".." << end;
  }
  range.pop_back();
  EXPECT_EQ(PlaceServedRange(recipe, dir, kRows, kCols, 128, 256, range, whole).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(whole, before) << "a refused range wrote into the whole tensor's bytes";
}

TEST_P(BackendConformanceTest, AFailedAmaxExchangeFailsTheStepWithItsOwnStatus) {
  std::vector<float> initial(static_cast<size_t>(kRows * kCols), 0.01f);
  std::unique_ptr<Holder> range =
      MakeHolder(MakeBackend(), kPerTensorFormats, kernels::StatePolicy{}, {128, 384}, initial,
                 [](float amax) -> absl::StatusOr<float> { return amax; });
  ASSERT_TRUE(range->state != nullptr);
  std::vector<std::vector<float>> grads(kRanks, std::vector<float>(initial.size(), 1e-3f));
  std::vector<TensorStep> step = {StepOf(*range, grads)};
  step[0].whole_amax = [](float) -> absl::StatusOr<float> {
    return absl::UnavailableError("peer 10.0.0.2:50051 did not answer");
  };
  // The job checks the gradients before every step.
  absl::StatusOr<GradientCheck> check = range->backend->CheckGradients(step, 1.0f, false);
  ASSERT_TRUE(check.ok()) << check.status();
  ASSERT_TRUE(check->finite);
  StepScalars scalars;
  scalars.adamw = kernels::MakeAdamwScalars({1e-3, 0.9, 0.999, 1e-8, 0.0}, 1);
  const absl::Status status = range->backend->ApplyStep(step, scalars);
  if (status.code() == absl::StatusCode::kUnimplemented) {
    GTEST_SKIP() << "backend " << GetParam().name << " does not step split tensors served per "
                 << "tensor: " << status;
  }
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_NE(status.message().find("10.0.0.2:50051"), std::string::npos) << status;
}

}  // namespace paramd::testing
