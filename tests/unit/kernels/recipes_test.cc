// kernels/recipes.h: every recipe x direction against the float64 model of
// reference/quantize_reference.h, bit for bit, on shapes of size 1, primes, non-multiples of 32
// and 128 and a large one, on normal, wide-range, random-bit, special (inf/NaN), all-zero and
// constant data; row ranges composed over panels equal the whole-tensor call on every code path;
// a range writes only its own rows; layouts, scales, the amax history and the dtype table.
#include "kernels/recipes.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/recipes_paths.h"
#include "kernels/formats.h"
#include "kernels/fused_step.h"
#include "reference/quantize_reference.h"
#include "tests/unit/kernels/kernels_test_util.h"

namespace paramd::kernels {

// Readable test parameters in GoogleTest output (found by argument-dependent lookup).
void PrintTo(CpuPath p, std::ostream* os) { *os << CpuPathName(p); }
void PrintTo(Recipe r, std::ostream* os) { *os << RecipeName(r); }
void PrintTo(Direction d, std::ostream* os) { *os << DirectionName(d); }

namespace {

using reference::RecipeRef;
using testing::Tolerances;

constexpr Recipe kAllRecipes[] = {Recipe::kFp32,      Recipe::kBf16,       Recipe::kFp16,
                                  Recipe::kFp8Tensor, Recipe::kFp8Delayed, Recipe::kFp8Block,
                                  Recipe::kMxfp8};
constexpr CpuPath kAllPaths[] = {CpuPath::kScalar, CpuPath::kAvx2, CpuPath::kAvx512};

RecipeRef ToRef(Recipe r) {
  switch (r) {
    case Recipe::kFp32:
      return RecipeRef::kFp32;
    case Recipe::kBf16:
      return RecipeRef::kBf16;
    case Recipe::kFp16:
      return RecipeRef::kFp16;
    case Recipe::kFp8Tensor:
      return RecipeRef::kFp8Tensor;
    case Recipe::kFp8Delayed:
      return RecipeRef::kFp8Delayed;
    case Recipe::kFp8Block:
      return RecipeRef::kFp8Block;
    case Recipe::kMxfp8:
      return RecipeRef::kMxfp8;
  }
  return RecipeRef::kFp32;
}

enum class Data { kNormal, kWideRange, kBitPatterns, kSpecials, kZeros, kConstant };
constexpr Data kAllData[] = {Data::kNormal,   Data::kWideRange, Data::kBitPatterns,
                             Data::kSpecials, Data::kZeros,     Data::kConstant};

const char* DataName(Data d) {
  switch (d) {
    case Data::kNormal:
      return "normal";
    case Data::kWideRange:
      return "wide-range";
    case Data::kBitPatterns:
      return "random bits";
    case Data::kSpecials:
      return "inf/NaN/extremes";
    case Data::kZeros:
      return "zeros";
    case Data::kConstant:
      return "constant";
  }
  return "?";
}

std::vector<float> MakeData(Data kind, int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> x;
  switch (kind) {
    case Data::kNormal:
      return testing::NormalFloats(rng, n, 0.02);
    case Data::kWideRange:
      return testing::RandomFloats(rng, n);
    case Data::kBitPatterns:
      x.resize(n);
      for (float& v : x) v = std::bit_cast<float>(static_cast<uint32_t>(rng()));
      return x;
    case Data::kSpecials: {
      x = testing::NormalFloats(rng, n, 1.0);
      const float specials[] = {std::numeric_limits<float>::infinity(),
                                -std::numeric_limits<float>::infinity(),
                                std::numeric_limits<float>::quiet_NaN(),
                                -std::numeric_limits<float>::quiet_NaN(),
                                std::numeric_limits<float>::max(),
                                -std::numeric_limits<float>::max(),
                                std::numeric_limits<float>::denorm_min(),
                                448.0f,
                                464.0f,
                                -0.0f};
      std::uniform_int_distribution<int64_t> where(0, n - 1);
      for (int64_t k = 0; k < std::max<int64_t>(1, n / 200); ++k) {
        x[where(rng)] = specials[k % std::size(specials)];
      }
      return x;
    }
    case Data::kZeros:
      return std::vector<float>(n, 0.0f);
    case Data::kConstant:
      return std::vector<float>(n, -0.3f);
  }
  return x;
}

struct Shape {
  int64_t rows;
  int64_t cols;
};
// {130, 1100}: fp8_block's rowwise bands of 8 column blocks, the second one partial, its last
// block 76 columns wide.
constexpr Shape kShapes[] = {{1, 1},     {1, 33},   {7, 13},    {31, 129},  {128, 128},
                             {131, 257}, {256, 96}, {300, 200}, {130, 1100}};
constexpr Shape kLargeShape = {1024, 4096};

// The bytes one call (or several) of ServeQuantizeCpu produced.
struct Served {
  std::vector<uint8_t> data;
  std::vector<uint8_t> scales;
};

// A tensor and the arguments that serve it in one recipe and direction. Per-tensor scales come
// from the tensor's amax like the daemon's: fp8_tensor from the amax, fp8_delayed from a history
// holding it with two more entries, margin 1.
class Tensor {
 public:
  Tensor(Recipe recipe, Direction direction, Shape shape, std::vector<float> values)
      : values_(std::move(values)) {
    args_.master = values_.data();
    args_.rows = shape.rows;
    args_.cols = shape.cols;
    args_.recipe = recipe;
    args_.direction = direction;
    const float amax = AmaxCpu(values_.data(), static_cast<int64_t>(values_.size()));
    if (recipe == Recipe::kFp8Tensor) {
      args_.tensor_scale = NextFp8TensorScale(amax, 1.0f).scale;
      ref_scale_ = reference::ScaleFromAmaxRef(
          reference::AmaxRef(values_.data(), static_cast<int64_t>(values_.size())), 448.0, 1.0f);
    } else if (recipe == Recipe::kFp8Delayed) {
      const float history[] = {0.5f, amax, 3.0f};
      args_.tensor_scale = NextFp8DelayedScale(history, 3, 1, 1.0f).scale;
      ref_scale_ = reference::DelayedScaleRef(history, 3, 1, 1.0f);
    }
  }

  const ServeArgs& args() const { return args_; }
  float tensor_scale() const { return args_.tensor_scale; }
  float ref_scale() const { return ref_scale_; }
  ServeBufferLayout layout() const {
    return ServeLayout(args_.recipe, args_.direction, args_.rows, args_.cols);
  }

  // Calls ServeQuantizeCpu on each range, in the order given, into buffers filled with `fill`.
  Served Serve(const std::vector<std::pair<int64_t, int64_t>>& ranges, CpuPath path,
               uint8_t fill = 0xA5) const {
    Served out;
    out.data.assign(layout().data_bytes, fill);
    out.scales.assign(layout().scale_bytes, fill);
    ServeArgs a = args_;
    a.data = out.data.data();
    a.scales = out.scales.data();
    for (const auto& [begin, end] : ranges) {
      const KStatus st = ServeQuantizeCpu(a, begin, end, path);
      EXPECT_TRUE(st.ok()) << st.message();
    }
    return out;
  }

  Served ServeWhole(CpuPath path) const { return Serve({{0, args_.rows}}, path); }

  // Every 128-row panel, last panel first.
  Served ServePanels(CpuPath path) const {
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (int64_t r = 0; r < args_.rows; r += kServePanelRows) {
      ranges.emplace_back(r, std::min(r + kServePanelRows, args_.rows));
    }
    std::reverse(ranges.begin(), ranges.end());
    return Serve(ranges, path);
  }

  reference::ServedRef Reference() const {
    return reference::ServeRef(ToRef(args_.recipe), args_.direction == Direction::kColumnwise,
                               values_.data(), args_.rows, args_.cols, args_.tensor_scale);
  }

 private:
  std::vector<float> values_;
  ServeArgs args_;
  float ref_scale_ = 1.0f;
};

std::string FirstDifference(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
  if (got.size() != want.size()) {
    return "size " + std::to_string(got.size()) + ", want " + std::to_string(want.size());
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      return "byte " + std::to_string(i) + ": got " + std::to_string(got[i]) + ", want " +
             std::to_string(want[i]);
    }
  }
  return "";
}

class RecipeTest : public ::testing::TestWithParam<std::tuple<Recipe, Direction>> {
 protected:
  Recipe recipe() const { return std::get<0>(GetParam()); }
  Direction direction() const { return std::get<1>(GetParam()); }

  // The whole-tensor call on the best path equals the reference; the panels composed on every
  // path this CPU runs equal the whole-tensor call.
  void ExpectMatchesReference(Shape shape, Data data, uint64_t seed) {
    ExpectMatchesReference(shape, data, MakeData(data, shape.rows * shape.cols, seed));
  }

  void ExpectMatchesReference(Shape shape, Data data, std::vector<float> values) {
    const Tensor t(recipe(), direction(), shape, std::move(values));
    const std::string where = std::string(DataName(data)) + " " + std::to_string(shape.rows) + "x" +
                              std::to_string(shape.cols);
    EXPECT_EQ(std::bit_cast<uint32_t>(t.tensor_scale()), std::bit_cast<uint32_t>(t.ref_scale()))
        << where << ": tensor scale " << t.tensor_scale() << ", reference " << t.ref_scale();
    const reference::ServedRef want = t.Reference();
    const Served whole = t.ServeWhole(CpuPath::kAuto);
    EXPECT_EQ(FirstDifference(whole.data, want.data), "") << where << " data";
    EXPECT_EQ(FirstDifference(whole.scales, want.scales), "") << where << " scales";
    for (const CpuPath path : kAllPaths) {
      if (!CpuPathSupported(path)) continue;
      const Served panels = t.ServePanels(path);
      EXPECT_EQ(FirstDifference(panels.data, whole.data), "") << where << " " << CpuPathName(path);
      EXPECT_EQ(FirstDifference(panels.scales, whole.scales), "")
          << where << " " << CpuPathName(path);
    }
  }
};

TEST_P(RecipeTest, MatchesTheFloat64ReferenceOnEveryShapeAndData) {
  uint64_t seed = 1;
  for (const Shape shape : kShapes) {
    for (const Data data : kAllData) ExpectMatchesReference(shape, data, seed++);
  }
}

TEST_P(RecipeTest, MatchesTheFloat64ReferenceOnALargeTensor) {
  // Drawn once for every recipe and direction.
  static const std::vector<float> values =
      MakeData(Data::kNormal, kLargeShape.rows * kLargeShape.cols, 99);
  ExpectMatchesReference(kLargeShape, Data::kNormal, values);
}

// Whether byte-element `i` of the data (or of the scales) belongs to rows [rb, re).
bool BelongsToRows(const ServeArgs& a, bool scales, int64_t i, int64_t rb, int64_t re) {
  const ServeBufferLayout l = ServeLayout(a.recipe, a.direction, a.rows, a.cols);
  const bool col = a.direction == Direction::kColumnwise;
  if (!scales) {
    const int64_t row = (col && a.recipe != Recipe::kMxfp8) ? i % l.data_cols : i / l.data_cols;
    return row >= rb && row < re;
  }
  switch (RecipeInfoOf(a.recipe).scale_kind) {
    case ScaleKind::kTensor:
      return rb == 0;
    case ScaleKind::kBlock128: {
      const int64_t br = col ? i % l.scale_cols : i / l.scale_cols;
      return br >= rb / 128 && br < (re + 127) / 128;
    }
    case ScaleKind::kMx32: {
      const int64_t r = i / l.scale_cols;
      return col ? (r >= rb / 32 && r < (re + 31) / 32) : (r >= rb && r < re);
    }
    case ScaleKind::kNone:
      break;
  }
  return false;
}

TEST_P(RecipeTest, ARowRangeWritesOnlyItsOwnRows) {
  const Tensor t(recipe(), direction(), {300, 200}, MakeData(Data::kNormal, 300 * 200, 5));
  for (const auto& [rb, re] : {std::pair<int64_t, int64_t>{128, 256}, {256, 300}, {0, 128}}) {
    // A byte the call wrote is the same whatever the buffer held before; one it left is not.
    const Served a = t.Serve({{rb, re}}, CpuPath::kAuto, 0xA5);
    const Served b = t.Serve({{rb, re}}, CpuPath::kAuto, 0x5A);
    const Served whole = t.ServeWhole(CpuPath::kAuto);
    const size_t dsize = DTypeSize(t.layout().data_dtype);
    const size_t ssize = DTypeSize(t.layout().scale_dtype);
    for (size_t i = 0; i < a.data.size(); ++i) {
      const bool written = a.data[i] == b.data[i];
      const bool own = BelongsToRows(t.args(), false, static_cast<int64_t>(i / dsize), rb, re);
      ASSERT_EQ(written, own) << "data byte " << i << " of range [" << rb << ", " << re << ")";
      if (own) {
        ASSERT_EQ(a.data[i], whole.data[i]) << "data byte " << i;
      }
    }
    for (size_t i = 0; i < a.scales.size(); ++i) {
      const bool written = a.scales[i] == b.scales[i];
      const bool own = BelongsToRows(t.args(), true, static_cast<int64_t>(i / ssize), rb, re);
      ASSERT_EQ(written, own) << "scale byte " << i << " of range [" << rb << ", " << re << ")";
      if (own) {
        ASSERT_EQ(a.scales[i], whole.scales[i]) << "scale byte " << i;
      }
    }
  }
}

// An independent sanity check of the conventions (scale multiplies, scale_inv dequantizes): every
// served FP8 value, times its scale_inv, is within half an E4M3 step of the master.
using Fp8RecipeTest = RecipeTest;

TEST_P(Fp8RecipeTest, DataTimesScaleInvIsWithinHalfAStepOfTheMaster) {
  const Shape shape = {257, 160};
  std::vector<float> x = MakeData(Data::kWideRange, shape.rows * shape.cols, 6);
  const Tensor t(recipe(), direction(), shape, x);
  const Served s = t.ServeWhole(CpuPath::kAuto);
  const bool col = direction() == Direction::kColumnwise;
  const bool transposed = col && recipe() != Recipe::kMxfp8;
  for (int64_t r = 0; r < shape.rows; ++r) {
    for (int64_t c = 0; c < shape.cols; ++c) {
      const uint8_t q = s.data[transposed ? c * shape.rows + r : r * shape.cols + c];
      double scale_inv;
      switch (RecipeInfoOf(recipe()).scale_kind) {
        case ScaleKind::kTensor:
          scale_inv = reinterpret_cast<const float*>(s.scales.data())[0];
          break;
        case ScaleKind::kBlock128: {
          const int64_t brows = (shape.rows + 127) / 128, bcols = (shape.cols + 127) / 128;
          const int64_t i = col ? (c / 128) * brows + r / 128 : (r / 128) * bcols + c / 128;
          scale_inv = reinterpret_cast<const float*>(s.scales.data())[i];
          break;
        }
        default: {
          const int64_t i = col ? (r / 32) * shape.cols + c : r * ((shape.cols + 31) / 32) + c / 32;
          scale_inv = FloatFromE8m0(s.scales[i]);
          break;
        }
      }
      const double master = x[r * shape.cols + c];
      const double got = FloatFromE4m3(q) * scale_inv;
      const double bound = Tolerances::kE4m3HalfStepRelative * std::fabs(master) +
                           Tolerances::kE4m3HalfSubnormalStep * scale_inv;
      ASSERT_LE(std::fabs(got - master), bound) << "element (" << r << ", " << c << ")";
    }
  }
}

std::string RecipeParamName(const ::testing::TestParamInfo<std::tuple<Recipe, Direction>>& info) {
  return std::string(RecipeName(std::get<0>(info.param))) + "_" +
         DirectionName(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(EveryRecipeAndDirection, RecipeTest,
                         ::testing::Combine(::testing::ValuesIn(kAllRecipes),
                                            ::testing::Values(Direction::kRowwise,
                                                              Direction::kColumnwise)),
                         RecipeParamName);

INSTANTIATE_TEST_SUITE_P(
    EveryFp8RecipeAndDirection, Fp8RecipeTest,
    ::testing::Combine(::testing::Values(Recipe::kFp8Tensor, Recipe::kFp8Delayed, Recipe::kFp8Block,
                                         Recipe::kMxfp8),
                       ::testing::Values(Direction::kRowwise, Direction::kColumnwise)),
    RecipeParamName);

TEST(ServeLayoutTest, GivesTheShapesOfDesignSection3) {
  const ServeBufferLayout block_col =
      ServeLayout(Recipe::kFp8Block, Direction::kColumnwise, 300, 200);
  EXPECT_EQ(block_col.data_rows, 200);
  EXPECT_EQ(block_col.data_cols, 300);
  EXPECT_EQ(block_col.data_bytes, 60000);
  EXPECT_EQ(block_col.scale_dtype, DType::kFp32);
  EXPECT_EQ(block_col.scale_rows, 2);
  EXPECT_EQ(block_col.scale_cols, 3);
  EXPECT_EQ(block_col.scale_bytes, 24);
  const ServeBufferLayout mx_row = ServeLayout(Recipe::kMxfp8, Direction::kRowwise, 300, 200);
  EXPECT_EQ(mx_row.scale_dtype, DType::kE8m0);
  EXPECT_EQ(mx_row.scale_rows, 300);
  EXPECT_EQ(mx_row.scale_cols, 7);
  const ServeBufferLayout mx_col = ServeLayout(Recipe::kMxfp8, Direction::kColumnwise, 300, 200);
  EXPECT_EQ(mx_col.data_rows, 300) << "mxfp8 columnwise data is not transposed";
  EXPECT_EQ(mx_col.scale_rows, 10);
  EXPECT_EQ(mx_col.scale_cols, 200);
  const ServeBufferLayout tensor = ServeLayout(Recipe::kFp8Tensor, Direction::kColumnwise, 3, 5);
  EXPECT_EQ(tensor.data_rows, 5);
  EXPECT_EQ(tensor.scale_count, 1);
  const ServeBufferLayout bf16 = ServeLayout(Recipe::kBf16, Direction::kRowwise, 3, 5);
  EXPECT_EQ(bf16.data_bytes, 30);
  EXPECT_EQ(bf16.scale_count, 0);
  EXPECT_EQ(ServeLayout(Recipe::kFp32, Direction::kRowwise, 0, 7).data_bytes, 0);
}

TEST(ServeQuantizeTest, RejectsBadRangesBuffersAndScales) {
  std::vector<float> x(300 * 4, 1.0f);
  std::vector<uint8_t> data(300 * 4), scales(300);
  ServeArgs a;
  a.master = x.data();
  a.rows = 300;
  a.cols = 4;
  a.recipe = Recipe::kFp8Tensor;
  a.data = data.data();
  a.scales = scales.data();
  EXPECT_TRUE(ServeQuantizeCpu(a, 0, 300).ok());
  EXPECT_TRUE(ServeQuantizeCpu(a, 256, 300).ok());
  EXPECT_TRUE(ServeQuantizeCpu(a, 128, 128).ok()) << "an empty range is fine";
  EXPECT_EQ(ServeQuantizeCpu(a, 64, 128).code(), Code::kInvalidArgument) << "misaligned begin";
  EXPECT_EQ(ServeQuantizeCpu(a, 0, 200).code(), Code::kInvalidArgument) << "misaligned end";
  EXPECT_EQ(ServeQuantizeCpu(a, 0, 301).code(), Code::kInvalidArgument) << "past the end";
  EXPECT_EQ(ServeQuantizeCpu(a, 128, 0).code(), Code::kInvalidArgument) << "reversed";
  ServeArgs bad = a;
  bad.tensor_scale = 0.0f;
  EXPECT_EQ(ServeQuantizeCpu(bad, 0, 300).code(), Code::kInvalidArgument);
  bad.tensor_scale = std::numeric_limits<float>::infinity();
  EXPECT_EQ(ServeQuantizeCpu(bad, 0, 300).code(), Code::kInvalidArgument);
  bad.tensor_scale = -2.0f;
  EXPECT_EQ(ServeQuantizeCpu(bad, 0, 300).code(), Code::kInvalidArgument);
  bad = a;
  bad.scales = nullptr;
  EXPECT_EQ(ServeQuantizeCpu(bad, 0, 300).code(), Code::kInvalidArgument);
  bad = a;
  bad.data = nullptr;
  EXPECT_EQ(ServeQuantizeCpu(bad, 0, 300).code(), Code::kInvalidArgument);
  bad = a;
  bad.rows = -1;
  EXPECT_EQ(ServeQuantizeCpu(bad, 0, 0).code(), Code::kInvalidArgument);
  bad = a;
  bad.recipe = Recipe::kBf16;
  bad.scales = nullptr;
  EXPECT_TRUE(ServeQuantizeCpu(bad, 0, 128).ok()) << "plain casts need no scale buffer";
}

TEST(ServeQuantizeTest, Fp8BlockFromTheStepsChunkAmaxesEqualsFromTheMaster) {
  // 300 x 256: two whole 128-row panels and a partial one, each 128 x 128 block at its own power
  // of two, a NaN in one block and an infinity in another.
  const int64_t rows = 300, cols = 256;
  std::vector<float> x(rows * cols);
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < rows * cols; ++i) {
    x[i] = std::ldexp(normal(rng), static_cast<int>((i / cols / 128 * 2 + i % cols / 128) % 5) - 2);
  }
  x[5 * cols + 200] = std::numeric_limits<float>::quiet_NaN();
  x[140 * cols + 3] = -std::numeric_limits<float>::infinity();
  // The chunk amaxes as FusedStepCpu gives them: magnitude bits per 128 elements.
  std::vector<uint32_t> chunks(rows * cols / kChunkElements, 0);
  for (int64_t i = 0; i < rows * cols; ++i) {
    uint32_t& c = chunks[i / kChunkElements];
    c = std::max(c, std::bit_cast<uint32_t>(x[i]) & 0x7FFFFFFFu);
  }
  for (const Direction direction : {Direction::kRowwise, Direction::kColumnwise}) {
    const ServeBufferLayout layout = ServeLayout(Recipe::kFp8Block, direction, rows, cols);
    for (const CpuPath path : kAllPaths) {
      if (!CpuPathSupported(path)) continue;
      std::vector<uint8_t> want(layout.data_bytes + layout.scale_bytes, 0xA5), got = want;
      for (int64_t r = 0; r < rows; r += kServePanelRows) {
        const int64_t r1 = std::min(rows, r + kServePanelRows);
        ServeArgs a;
        a.master = x.data();
        a.rows = rows;
        a.cols = cols;
        a.recipe = Recipe::kFp8Block;
        a.direction = direction;
        a.data = want.data();
        a.scales = want.data() + layout.data_bytes;
        ASSERT_TRUE(ServeQuantizeCpu(a, r, r1, path).ok());
        a.data = got.data();
        a.scales = got.data() + layout.data_bytes;
        a.chunk_amax_bits = chunks.data() + r * cols / kChunkElements;
        ASSERT_TRUE(ServeQuantizeCpu(a, r, r1, path).ok());
      }
      EXPECT_EQ(FirstDifference(got, want), "")
          << DirectionName(direction) << " " << CpuPathName(path);
    }
  }
  // Chunk amaxes serve whole 128-column blocks of fp8_block only.
  ServeArgs a;
  a.master = x.data();
  a.rows = rows;
  a.cols = cols;
  std::vector<uint8_t> out(
      ServeLayout(Recipe::kMxfp8, Direction::kRowwise, rows, cols).data_bytes +
      ServeLayout(Recipe::kMxfp8, Direction::kRowwise, rows, cols).scale_bytes);
  a.data = out.data();
  a.scales = out.data();
  a.recipe = Recipe::kMxfp8;
  a.chunk_amax_bits = chunks.data();
  EXPECT_EQ(ServeQuantizeCpu(a, 0, 128).code(), Code::kInvalidArgument);
  a.recipe = Recipe::kFp8Block;
  a.cols = 200;
  a.rows = rows * cols / 200;
  EXPECT_EQ(ServeQuantizeCpu(a, 0, 128).code(), Code::kInvalidArgument);
}

class AmaxPathTest : public ::testing::TestWithParam<CpuPath> {
 protected:
  void SetUp() override {
    if (!CpuPathSupported(GetParam())) {
      GTEST_SKIP() << "this CPU cannot run the " << CpuPathName(GetParam()) << " path";
    }
  }
};

TEST_P(AmaxPathTest, IsNaNIfAnyIsNaNElseTheLargestMagnitudeAtEveryPosition) {
  std::mt19937_64 rng(8);
  for (const int64_t n : {1, 7, 16, 33, 64, 100, 1000}) {
    std::vector<float> x = testing::NormalFloats(rng, n, 1.0);
    const double want = reference::AmaxRef(x.data(), n);
    EXPECT_EQ(AmaxCpu(x.data(), n, GetParam()), static_cast<float>(want)) << n;
    for (int64_t at = 0; at < n; ++at) {
      for (const float special : {-std::numeric_limits<float>::infinity(),
                                  std::numeric_limits<float>::quiet_NaN(), -1e30f}) {
        std::vector<float> y = x;
        y[at] = special;
        const float got = AmaxCpu(y.data(), n, GetParam());
        const double ref = reference::AmaxRef(y.data(), n);
        if (std::isnan(ref)) {
          ASSERT_EQ(std::bit_cast<uint32_t>(got), kCanonicalNaNBits) << n << " at " << at;
        } else {
          ASSERT_EQ(got, static_cast<float>(ref)) << n << " at " << at;
        }
      }
    }
  }
  EXPECT_EQ(AmaxCpu(nullptr, 0, GetParam()), 0.0f);
  std::vector<float> rows = testing::NormalFloats(rng, 300 * 5, 1.0);
  EXPECT_EQ(AmaxCombine(AmaxRowsCpu(rows.data(), 5, 0, 128, GetParam()),
                        AmaxRowsCpu(rows.data(), 5, 128, 300, GetParam())),
            AmaxCpu(rows.data(), 300 * 5, GetParam()));
}

// The vector paths cast to E4M3 in a short form of their own (an integer round at and above 2^-6,
// an FP32 add below it): every FP32 input of the exponents where its cases meet or end (FP32
// subnormals, E4M3's whole subnormal range and the normal boundary, the overflow edge, infinity and
// NaN), both signs, gives kernels/formats.h's code in each path's scaled casts and MX rows.
TEST_P(AmaxPathTest, E4m3CastsEqualTheFormatsHeaderOverWholeExponents) {
  const cpu_internal::ServeKernels& k =
      GetParam() == CpuPath::kAvx512 ? cpu_internal::Avx512ServeKernels()
      : GetParam() == CpuPath::kAvx2 ? cpu_internal::Avx2ServeKernels()
                                     : cpu_internal::ScalarServeKernels();
  constexpr uint32_t kExponents[] = {0,       127 - 11, 127 - 10, 127 - 9, 127 - 8, 127 - 7,
                                     127 - 6, 127 - 5,  127 + 8,  127 + 9, 255};
  constexpr int64_t kMantissas = int64_t{1} << 23;
  std::vector<float> x(kMantissas);
  const std::vector<float> ones(kMantissas, 1.0f);
  std::vector<uint8_t> codes(kMantissas), each(kMantissas);
  for (uint32_t e : kExponents) {
    for (uint32_t sign : {0u, 0x80000000u}) {
      for (int64_t m = 0; m < kMantissas; ++m) {
        x[m] = std::bit_cast<float>(sign | e << 23 | static_cast<uint32_t>(m));
      }
      k.e4m3_scaled(x.data(), kMantissas, 1.0f, codes.data());
      k.e4m3_scaled_each(x.data(), kMantissas, ones.data(), each.data());
      for (int64_t m = 0; m < kMantissas; ++m) {
        ASSERT_EQ(codes[m], E4m3FromFloat(x[m]))
            << "e4m3 of 0x" << std::hex << std::bit_cast<uint32_t>(x[m]);
        ASSERT_EQ(each[m], codes[m]) << "e4m3 of 0x" << std::hex << std::bit_cast<uint32_t>(x[m]);
      }
    }
  }
  // MX rows: blocks of 32 with their own power-of-two scales, against the scalar block.
  std::mt19937_64 rng(9);
  std::uniform_int_distribution<uint32_t> bits;
  std::vector<float> row(4096 + 17);
  for (float& v : row) v = std::bit_cast<float>(bits(rng) & 0xBFFFFFFFu);  // no inf or NaN
  std::vector<uint8_t> out(row.size()), want(row.size());
  std::vector<uint8_t> scales((row.size() + 31) / 32), want_scales(scales.size());
  k.mx_row(row.data(), static_cast<int64_t>(row.size()), out.data(), scales.data());
  for (size_t b = 0; b < scales.size(); ++b) {
    const int64_t n = std::min<int64_t>(32, static_cast<int64_t>(row.size() - 32 * b));
    want_scales[b] = cpu_internal::MxBlockScalar(row.data() + 32 * b, n, want.data() + 32 * b);
  }
  EXPECT_EQ(out, want);
  EXPECT_EQ(scales, want_scales);
}

INSTANTIATE_TEST_SUITE_P(EveryPath, AmaxPathTest, ::testing::ValuesIn(kAllPaths),
                         [](const ::testing::TestParamInfo<CpuPath>& info) {
                           return std::string(CpuPathName(info.param));
                         });

TEST(TensorScaleTest, Fp8TensorScaleKeepsThePreviousScaleOnZeroOrNonFiniteAmax) {
  EXPECT_EQ(NextFp8TensorScale(0.0f, 2.0f).scale, 2.0f);
  EXPECT_EQ(NextFp8TensorScale(0.0f, 2.0f).scale_inv, 0.5f);
  EXPECT_EQ(NextFp8TensorScale(std::numeric_limits<float>::quiet_NaN(), 2.0f).scale, 2.0f);
  EXPECT_EQ(NextFp8TensorScale(7.0f, 2.0f).scale, 64.0f);
  EXPECT_EQ(NextFp8TensorScale(3.0f, 1.0f).scale_inv, 1.0f / (448.0f / 3.0f));
}

TEST(TensorScaleTest, Fp8DelayedScaleUsesTheHistorysMaxMarginAndEmptyGivesOne) {
  const float history[] = {1.0f, 7.0f, 0.0f};
  EXPECT_EQ(NextFp8DelayedScale(history, 3, 0, 5.0f).scale, 64.0f);
  EXPECT_EQ(NextFp8DelayedScale(history, 3, 2, 5.0f).scale, 16.0f);
  EXPECT_EQ(NextFp8DelayedScale(history, 0, 0, 5.0f).scale, 1.0f);
  const float zeros[] = {0.0f, 0.0f};
  EXPECT_EQ(NextFp8DelayedScale(zeros, 2, 0, 5.0f).scale, 5.0f);
  const float with_nan[] = {1.0f, std::numeric_limits<float>::quiet_NaN()};
  EXPECT_EQ(NextFp8DelayedScale(with_nan, 2, 0, 5.0f).scale, 5.0f);
  std::mt19937_64 rng(9);
  for (int i = 0; i < 10000; ++i) {
    float h[4];
    for (float& v : h) v = std::bit_cast<float>(static_cast<uint32_t>(rng()) & 0x7FFFFFFFu);
    const int margin = static_cast<int>(rng() % 8);
    EXPECT_EQ(std::bit_cast<uint32_t>(NextFp8DelayedScale(h, 4, margin, 3.0f).scale),
              std::bit_cast<uint32_t>(reference::DelayedScaleRef(h, 4, margin, 3.0f)));
  }
}

TEST(AmaxHistoryTest, KeepsTheLastLenEntriesOldestFirst) {
  AmaxHistory h(3);
  EXPECT_EQ(h.NextScale(0, 9.0f).scale, 1.0f) << "empty history: scale 1";
  h.Append(7.0f);
  EXPECT_EQ(h.NextScale(0, 9.0f).scale, 64.0f);
  h.Append(1.0f);
  h.Append(2.0f);
  h.Append(3.0f);  // drops 7
  EXPECT_EQ(h.size(), 3);
  EXPECT_EQ(h.Entries(), (std::vector<float>{1.0f, 2.0f, 3.0f}));
  EXPECT_EQ(h.NextScale(0, 9.0f).scale, 448.0f / 3.0f);
  AmaxHistory restored(2);
  restored.Restore(h.Entries());
  EXPECT_EQ(restored.Entries(), (std::vector<float>{2.0f, 3.0f}));
}

TEST(DTypeTest, ListsEveryDtypeOnceWithItsSizeAndName) {
  EXPECT_EQ(kNumDTypes, 6);
  for (int i = 0; i < kNumDTypes; ++i) {
    const DType d = kDTypes[i].dtype;
    EXPECT_EQ(static_cast<int>(d), i);
    EXPECT_EQ(DTypeFromName(DTypeName(d)), d);
    const size_t size =
        VisitDType(d, [](auto tag) { return sizeof(typename decltype(tag)::Storage); });
    EXPECT_EQ(size, DTypeSize(d));
    const char* name = VisitDType(d, [](auto tag) { return decltype(tag)::kName; });
    EXPECT_STREQ(name, DTypeName(d));
  }
  EXPECT_EQ(DTypeSize(DType::kFp32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBf16), 2u);
  EXPECT_EQ(DTypeSize(DType::kE8m0), 1u);
  EXPECT_FALSE(DTypeFromName("fp64").has_value());
}

TEST(RecipeTableTest, NamesRoundTripAndAreListedInEnumOrder) {
  for (int i = 0; i < kNumRecipes; ++i) {
    EXPECT_EQ(static_cast<int>(kRecipes[i].recipe), i);
    EXPECT_EQ(RecipeFromName(RecipeName(kRecipes[i].recipe)), kRecipes[i].recipe);
  }
  EXPECT_EQ(DirectionFromName("columnwise"), Direction::kColumnwise);
  EXPECT_FALSE(RecipeFromName("fp8").has_value());
}

}  // namespace
}  // namespace paramd::kernels
