// kernels/cpu_step.h: the composed tensor step (panels over a pool, cut formats per panel, the
// per-tensor second pass) equals the plain sequence of its kernels on one thread, whatever the
// thread count and however many panels the tensor has.
#include "kernels/cpu_step.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <random>
#include <vector>

#include "kernels/fused_step.h"
#include "kernels/recipes.h"
#include "tests/unit/kernels/kernels_test_util.h"

namespace paramd::kernels {
namespace {

// One fp32-master tensor with fp8 moments (chunk-scaled) and its outputs; the FP32 served copy is
// what the cut formats read.
struct Tensor {
  Tensor(int64_t rows, int64_t cols, uint32_t seed)
      : rows(rows),
        cols(cols),
        n(rows * cols),
        grad(n),
        master(n),
        m(n),
        v(n),
        m_scale(NumChunks(n), 1.0f),
        v_scale(NumChunks(n), 1.0f),
        fp32(n) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    for (int64_t i = 0; i < n; ++i) {
      // Each 128 x 128 block at its own power of two, so that a block amax taken from the wrong
      // rows or columns gives another fp8_block scale.
      const int64_t block = i / cols / 128 * 3 + i % cols / 128;
      master[i] = std::ldexp(normal(gen), static_cast<int>(block % 7) - 3);
      grad[i] = 0.1f * normal(gen);
    }
    AddOutput(Recipe::kFp8Block, Direction::kRowwise, &cut);
    AddOutput(Recipe::kMxfp8, Direction::kColumnwise, &cut);
    AddOutput(Recipe::kBf16, Direction::kColumnwise, &cut);
    AddOutput(Recipe::kFp8Tensor, Direction::kRowwise, &per_tensor);
    AddOutput(Recipe::kFp8Delayed, Direction::kRowwise, &per_tensor);
    per_tensor.back().tensor_scale = 64.0f;
  }

  void AddOutput(Recipe recipe, Direction direction, std::vector<ServeArgs>* into) {
    const ServeBufferLayout layout = ServeLayout(recipe, direction, rows, cols);
    bytes.emplace_back(static_cast<size_t>(layout.data_bytes + layout.scale_bytes), 0xA5);
    ServeArgs a;
    a.master = fp32.data();
    a.rows = rows;
    a.cols = cols;
    a.recipe = recipe;
    a.direction = direction;
    a.data = bytes.back().data();
    a.scales = layout.scale_bytes > 0 ? bytes.back().data() + layout.data_bytes : nullptr;
    into->push_back(a);
  }

  FusedStepArgs Step() {
    FusedStepArgs a;
    slot = grad.data();
    a.slots = &slot;
    a.num_slots = 1;
    a.scalars = MakeAdamwScalars(testing::AccuracySetupHyper(), 3);
    a.policy.exp_avg = MomentType::kFp8;
    a.policy.exp_avg_sq = MomentType::kFp8;
    a.numel = n;
    a.master = master.data();
    a.exp_avg = m.data();
    a.exp_avg_scale_inv = m_scale.data();
    a.exp_avg_sq = v.data();
    a.exp_avg_sq_scale_inv = v_scale.data();
    a.out_fp32 = fp32.data();
    return a;
  }

  int64_t rows, cols, n;
  std::vector<float> grad, master;
  std::vector<uint8_t> m, v;
  std::vector<float> m_scale, v_scale, fp32;
  std::vector<std::vector<uint8_t>> bytes;  // each output's data and scales: ServeArgs point in
  std::vector<ServeArgs> cut, per_tensor;
  const void* slot = nullptr;
};

std::vector<std::vector<uint8_t>> StepOnce(int64_t rows, int64_t cols, int threads, bool composed,
                                           CpuTensorStepResult* result) {
  Tensor t(rows, cols, 11);
  const float previous = 32.0f;
  if (composed) {
    ThreadPool pool(threads);
    CpuTensorStepArgs args;
    args.step = t.Step();
    args.rows = rows;
    args.cols = cols;
    args.cut = t.cut;
    args.per_tensor = t.per_tensor;
    args.previous_tensor_scale = previous;
    EXPECT_TRUE(CpuTensorStep(args, pool, result).ok());
  } else {
    // The plain sequence on one thread: the step over everything, each format over every row.
    float amax = 0.0f;
    EXPECT_TRUE(FusedStepCpu(t.Step(), 0, t.n, CpuPath::kAuto, &amax).ok());
    for (const ServeArgs& f : t.cut) EXPECT_TRUE(ServeQuantizeCpu(f, 0, rows).ok());
    result->amax = amax;
    result->tensor_scale = NextFp8TensorScale(amax, previous).scale;
    for (ServeArgs f : t.per_tensor) {
      if (f.recipe == Recipe::kFp8Tensor) f.tensor_scale = result->tensor_scale;
      EXPECT_TRUE(ServeQuantizeCpu(f, 0, rows).ok());
    }
  }
  std::vector<std::vector<uint8_t>> out = t.bytes;
  out.emplace_back(reinterpret_cast<const uint8_t*>(t.master.data()),
                   reinterpret_cast<const uint8_t*>(t.master.data() + t.n));
  out.push_back(t.m);
  out.push_back(t.v);
  return out;
}

TEST(CpuTensorStepTest, EqualsItsKernelsInSequenceAtEveryThreadCountAndShape) {
  // Many panels with a partial last one; exactly two; one (element blocks); a 1-D tensor; and
  // whole 128-column blocks, where fp8_block takes its amaxes from the step's chunk amaxes.
  const int64_t shapes[][2] = {{300, 200}, {256, 64}, {100, 96}, {1, 5000}, {300, 256}, {384, 384}};
  for (const auto& shape : shapes) {
    CpuTensorStepResult plain;
    const auto want = StepOnce(shape[0], shape[1], 1, false, &plain);
    for (int threads : {1, 3}) {
      SCOPED_TRACE(::testing::Message()
                   << shape[0] << "x" << shape[1] << ", " << threads << " threads");
      CpuTensorStepResult got;
      EXPECT_EQ(StepOnce(shape[0], shape[1], threads, true, &got), want);
      EXPECT_EQ(got.amax, plain.amax);
      EXPECT_EQ(got.tensor_scale, plain.tensor_scale);
      EXPECT_GT(got.amax, 0.0f);
    }
  }
}

TEST(CpuTensorStepTest, WithNothingCutStepsEveryShapeAsOneThreadDoes) {
  // Nothing cut from the master (every format in the pass, as the host tier serves bf16): element
  // blocks, however many panels the tensor has; small tensors in blocks under the default grain.
  const int64_t shapes[][2] = {{256, 2048}, {2048, 384}, {300, 200}, {1, 5000}};
  for (const auto& shape : shapes) {
    Tensor want(shape[0], shape[1], 5);
    float want_amax = 0.0f;
    ASSERT_TRUE(FusedStepCpu(want.Step(), 0, want.n, CpuPath::kAuto, &want_amax).ok());
    for (int threads : {1, 3, 14}) {
      SCOPED_TRACE(::testing::Message()
                   << shape[0] << "x" << shape[1] << ", " << threads << " threads");
      Tensor got(shape[0], shape[1], 5);
      ThreadPool pool(threads);
      CpuTensorStepArgs args;
      args.step = got.Step();
      args.rows = got.rows;
      args.cols = got.cols;
      CpuTensorStepResult result;
      ASSERT_TRUE(CpuTensorStep(args, pool, &result).ok());
      EXPECT_EQ(result.amax, want_amax);
      EXPECT_EQ(got.master, want.master);
      EXPECT_EQ(got.fp32, want.fp32);
      EXPECT_EQ(got.m, want.m);
      EXPECT_EQ(got.v, want.v);
      EXPECT_EQ(got.m_scale, want.m_scale);
      EXPECT_EQ(got.v_scale, want.v_scale);
    }
  }
}

// A state mid-training: finite E4M3 codes (v's non-negative) and power-of-two scales, from `seed`.
void FillMoments(Tensor* t, uint32_t seed) {
  std::mt19937 gen(seed);
  for (int64_t i = 0; i < t->n; ++i) {
    t->m[i] = static_cast<uint8_t>(gen() % 0x7F) | static_cast<uint8_t>(gen() & 0x80);
    t->v[i] = static_cast<uint8_t>(gen() % 0x7F);
  }
  for (int64_t c = 0; c < NumChunks(t->n); ++c) {
    t->m_scale[c] = std::ldexp(1.0f, -static_cast<int>(gen() % 20));
    t->v_scale[c] = std::ldexp(1.0f, -static_cast<int>(gen() % 30));
  }
}

// Everything a step writes: its outputs and its state.
std::vector<std::vector<uint8_t>> Written(const Tensor& t) {
  auto bytes = [](const auto& v) {
    const uint8_t* p = reinterpret_cast<const uint8_t*>(v.data());
    return std::vector<uint8_t>(p, p + v.size() * sizeof(v[0]));
  };
  std::vector<std::vector<uint8_t>> out = t.bytes;
  for (const auto& b : {bytes(t.fp32), bytes(t.master), bytes(t.m), bytes(t.v), bytes(t.m_scale),
                        bytes(t.v_scale)}) {
    out.push_back(b);
  }
  return out;
}

// Out of place (FusedStepArgs' *_in) through the composed step, on every path and over panels or
// element blocks: the destination gets the bytes an in-place step gives (state, scales, the cut
// formats and the per-tensor fp8 ones), whatever it held, and the source is left as it was.
TEST(CpuTensorStepTest, OutOfPlaceWritesTheInPlaceBytesAndLeavesTheSource) {
  const int64_t shapes[][2] = {{300, 200}, {100, 96}};
  for (const auto& shape : shapes) {
    for (const CpuPath path : {CpuPath::kScalar, CpuPath::kAvx2, CpuPath::kAvx512}) {
      if (!CpuPathSupported(path)) continue;
      SCOPED_TRACE(::testing::Message()
                   << shape[0] << "x" << shape[1] << ", " << CpuPathName(path));
      const int64_t rows = shape[0], cols = shape[1];
      Tensor in_place(rows, cols, 11), source(rows, cols, 11), dest(rows, cols, 11);
      FillMoments(&in_place, 5);
      FillMoments(&source, 5);
      FillMoments(&dest, 6);  // stale state, unlike the source's
      for (float& x : dest.master) x = -x;
      const auto source_before = Written(source);
      ThreadPool pool(3);
      auto run = [&](const FusedStepArgs& step, Tensor& t) {
        CpuTensorStepArgs args;
        args.step = step;
        args.rows = rows;
        args.cols = cols;
        args.cut = t.cut;
        args.per_tensor = t.per_tensor;
        args.previous_tensor_scale = 32.0f;
        args.path = path;
        CpuTensorStepResult result;
        EXPECT_TRUE(CpuTensorStep(args, pool, &result).ok());
        return result;
      };
      const CpuTensorStepResult want = run(in_place.Step(), in_place);
      FusedStepArgs step = dest.Step();
      step.master_in = source.master.data();
      step.exp_avg_in = source.m.data();
      step.exp_avg_scale_inv_in = source.m_scale.data();
      step.exp_avg_sq_in = source.v.data();
      step.exp_avg_sq_scale_inv_in = source.v_scale.data();
      const CpuTensorStepResult got = run(step, dest);
      EXPECT_EQ(Written(dest), Written(in_place));
      EXPECT_EQ(Written(source), source_before) << "a source was written";
      EXPECT_EQ(got.amax, want.amax);
      EXPECT_EQ(got.tensor_scale, want.tensor_scale);
    }
  }
}

// A buffer of n T on a 64-byte boundary: the vector paths' non-temporal stores need whole aligned
// vectors, which std::vector's 16-byte alignment does not promise.
template <class T>
struct Aligned64 {
  explicit Aligned64(int64_t n)
      : n(n), p(static_cast<T*>(::operator new[](n * sizeof(T), std::align_val_t(64)))) {}
  ~Aligned64() { ::operator delete[](p, std::align_val_t(64)); }
  Aligned64(const Aligned64&) = delete;
  Aligned64& operator=(const Aligned64&) = delete;
  std::vector<uint8_t> Bytes() const {
    const auto* b = reinterpret_cast<const uint8_t*>(p);
    return std::vector<uint8_t>(b, b + n * sizeof(T));
  }
  int64_t n;
  T* p;
};

// The host tier's policy out of place, with nothing cut from the new master (only the in-pass
// bf16 copy served): CpuTensorStep streams the master (FusedStepArgs::stream_master) over aligned
// panels, and the destination still gets the in-place step's bytes on every path, the source
// untouched.
TEST(CpuTensorStepTest, OutOfPlaceWithNothingCutFromTheMasterWritesTheInPlaceBytes) {
  const int64_t rows = 384, cols = 256, n = rows * cols;  // three panels of 32 Ki elements
  for (const CpuPath path : {CpuPath::kScalar, CpuPath::kAvx2, CpuPath::kAvx512}) {
    if (!CpuPathSupported(path)) continue;
    SCOPED_TRACE(CpuPathName(path));
    std::mt19937_64 rng(21);
    const std::vector<float> grad = testing::NormalFloats(rng, n, 0.01);
    const std::vector<float> master = testing::NormalFloats(rng, n, 0.02);
    const std::vector<float> m = testing::NormalFloats(rng, n, 0.001);
    std::vector<float> v = testing::NormalFloats(rng, n, 1e-6);
    for (float& x : v) x = std::fabs(x);
    struct Set {
      explicit Set(int64_t n) : master(n), m(n), v(n), bf16(n) {}
      Aligned64<float> master, m, v;
      Aligned64<uint16_t> bf16;
    };
    Set in_place(n), source(n), dest(n);
    for (Set* s : {&in_place, &source}) {
      std::memcpy(s->master.p, master.data(), n * sizeof(float));
      std::memcpy(s->m.p, m.data(), n * sizeof(float));
      std::memcpy(s->v.p, v.data(), n * sizeof(float));
    }
    std::memset(dest.master.p, 0x5A, n * sizeof(float));  // stale, unlike the source
    std::memset(dest.m.p, 0x5A, n * sizeof(float));
    std::memset(dest.v.p, 0x5A, n * sizeof(float));
    const auto source_master = source.master.Bytes(), source_m = source.m.Bytes(),
               source_v = source.v.Bytes();
    const void* slot = grad.data();
    ThreadPool pool(3);
    auto run = [&](Set& into, const Set* from) {
      CpuTensorStepArgs args;
      args.step.slots = &slot;
      args.step.num_slots = 1;
      args.step.scalars = MakeAdamwScalars(testing::AccuracySetupHyper(), 3);
      args.step.numel = n;
      args.step.master = into.master.p;
      args.step.exp_avg = into.m.p;
      args.step.exp_avg_sq = into.v.p;
      args.step.out_bf16 = into.bf16.p;
      if (from != nullptr) {
        args.step.master_in = from->master.p;
        args.step.exp_avg_in = from->m.p;
        args.step.exp_avg_sq_in = from->v.p;
      }
      args.rows = rows;
      args.cols = cols;
      args.path = path;
      CpuTensorStepResult result;
      EXPECT_TRUE(CpuTensorStep(args, pool, &result).ok());
      return result.amax;
    };
    const float want_amax = run(in_place, nullptr);
    EXPECT_EQ(run(dest, &source), want_amax);
    EXPECT_EQ(dest.master.Bytes(), in_place.master.Bytes());
    EXPECT_EQ(dest.m.Bytes(), in_place.m.Bytes());
    EXPECT_EQ(dest.v.Bytes(), in_place.v.Bytes());
    EXPECT_EQ(dest.bf16.Bytes(), in_place.bf16.Bytes());
    EXPECT_EQ(source.master.Bytes(), source_master) << "the source's master was written";
    EXPECT_EQ(source.m.Bytes(), source_m);
    EXPECT_EQ(source.v.Bytes(), source_v);
  }
}

TEST(CpuTensorStepTest, RefusesAShapeThatIsNotTheStepsElements) {
  Tensor t(4, 8, 3);
  ThreadPool pool(1);
  CpuTensorStepArgs args;
  args.step = t.Step();
  args.rows = 4;
  args.cols = 9;
  CpuTensorStepResult result;
  EXPECT_EQ(CpuTensorStep(args, pool, &result).code(), Code::kInvalidArgument);
}

// A bf16+remainder master serves its stored halves as they are: rowwise a copy, columnwise the
// transpose, with no master values needed.
TEST(ServeBf16HalvesTest, CopiesOrTransposesTheStoredHalves) {
  const int64_t rows = 130, cols = 7;
  std::vector<uint16_t> halves(rows * cols);
  for (size_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<uint16_t>(i * 2654435761u);
  for (Direction direction : {Direction::kRowwise, Direction::kColumnwise}) {
    std::vector<uint16_t> out(halves.size(), 0);
    ServeArgs a;
    a.rows = rows;
    a.cols = cols;
    a.recipe = Recipe::kBf16;
    a.direction = direction;
    a.data = out.data();
    a.bf16_halves = halves.data();
    ASSERT_TRUE(ServeQuantizeCpu(a, 0, 128).ok());
    ASSERT_TRUE(ServeQuantizeCpu(a, 128, rows).ok());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const uint16_t got =
            direction == Direction::kRowwise ? out[r * cols + c] : out[c * rows + r];
        ASSERT_EQ(got, halves[r * cols + c]) << r << "," << c;
      }
    }
  }
}

}  // namespace
}  // namespace paramd::kernels
