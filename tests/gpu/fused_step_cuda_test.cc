// FusedStepCuda against FusedStepCpu + ServeQuantizeCpu, bit for bit: every state policy (master x
// exp_avg x exp_avg_sq) x rounding mode, every recipe x direction served, fp32 and bf16 slots with
// one to three ranks, clipping, two consecutive steps, and shapes that take every path (1x1,
// primes, cols not a multiple of 32 or 128, rows not a multiple of 8, 32 or 128, 1-D tensors), all
// tensors of a case in ONE plan (one launch per pass).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda_step.h"
#include "kernels/formats.h"
#include "kernels/fused_step.h"
#include "kernels/recipes.h"
#include "tests/gpu/gpu_test_util.h"

namespace paramd::kernels {
namespace {

using testing::CompareBytes;
using testing::CudaParamTest;
using testing::CudaTest;
using testing::DeviceBuffer;
using testing::GradValue;

struct Shape {
  int64_t rows, cols;
};

// Tile path: cols % 128 == 0 and rows >= 8; the rest take the flat path and pass 2.
constexpr Shape kShapes[] = {{1, 1},     {7, 13},    {1, 1000},  {3, 200},  {31, 128},
                             {128, 128}, {130, 256}, {257, 384}, {64, 640}, {8, 128},
                             {200, 131}, {33, 97},   {1, 256},   {45, 1024}};

int MomentBytes(MomentType t) { return t == MomentType::kFp32 ? 4 : t == MomentType::kFp8 ? 1 : 2; }

template <typename T>
std::vector<unsigned char> AsBytes(const std::vector<T>& v) {
  std::vector<unsigned char> out(v.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// One tensor: its host state (the CPU reference steps it), its device copy and its outputs.
struct TestTensor {
  int64_t rows = 0, cols = 0, n = 0;
  StatePolicy policy;
  SlotType slot_type = SlotType::kFp32;
  int num_slots = 1;
  uint32_t index = 0;
  // Host state.
  std::vector<unsigned char> master, remainder, m, v;
  std::vector<float> m_scale, v_scale;
  float fp8_tensor_scale = 1.0f;
  float fp8_delayed_scale = 1.0f;
  // Device.
  std::vector<DeviceBuffer> d_slots;
  DeviceBuffer d_master, d_remainder, d_m, d_v, d_m_scale, d_v_scale, d_fp8_scale, d_delayed,
      d_amax;
  struct Output {
    Recipe recipe;
    Direction direction;
    ServeBufferLayout layout;
    DeviceBuffer data, scales;
  };
  std::vector<Output> outputs;
};

void RandomState(std::mt19937_64& rng, TestTensor& t) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exp_dist(-4, 12);
  const int64_t n = t.n;
  // Master.
  std::vector<float> p(n);
  for (float& x : p) x = normal(rng) * 0.02f;
  if (t.policy.master == MasterType::kFp32) {
    t.master = AsBytes(p);
  } else if (t.policy.master == MasterType::kBf16Remainder) {
    std::vector<uint16_t> hi(n);
    std::vector<int16_t> lo(n);
    for (int64_t i = 0; i < n; ++i) {
      const Bf16Split s = SplitBf16Remainder(p[i]);
      hi[i] = s.served, lo[i] = s.remainder;
    }
    t.master = AsBytes(hi);
    t.remainder = AsBytes(lo);
  } else {
    std::vector<uint16_t> h(n);
    for (int64_t i = 0; i < n; ++i) h[i] = Fp16FromFloat(p[i]);
    t.master = AsBytes(h);
  }
  // Moments: m signed, v non-negative; scaled types with a random power-of-two scale per chunk.
  auto moment = [&](MomentType type, bool square, std::vector<unsigned char>* codes,
                    std::vector<float>* scale_inv) {
    std::vector<float> x(n);
    for (float& y : x) {
      const float g = normal(rng) * 1e-3f;
      y = square ? g * g : g;
    }
    const int64_t chunks = NumChunks(n);
    scale_inv->assign(HasChunkScales(type) ? chunks : 0, 1.0f);
    switch (type) {
      case MomentType::kFp32:
        *codes = AsBytes(x);
        return;
      case MomentType::kBf16: {
        std::vector<uint16_t> c(n);
        for (int64_t i = 0; i < n; ++i) c[i] = Bf16FromFloat(x[i]);
        *codes = AsBytes(c);
        return;
      }
      case MomentType::kFp16:
      case MomentType::kFp8: {
        codes->assign(n * MomentBytes(type), 0);
        for (int64_t c = 0; c < chunks; ++c) {
          const float s = Pow2(exp_dist(rng) + (square ? 10 : 4));
          (*scale_inv)[c] = 1.0f / s;
          for (int64_t i = c * 128; i < std::min(n, (c + 1) * 128); ++i) {
            if (type == MomentType::kFp16) {
              const uint16_t code = Fp16FromFloat(x[i] * s);
              std::memcpy(codes->data() + 2 * i, &code, 2);
            } else {
              (*codes)[i] = E4m3FromFloat(x[i] * s);
            }
          }
        }
        return;
      }
    }
  };
  moment(t.policy.exp_avg, false, &t.m, &t.m_scale);
  moment(t.policy.exp_avg_sq, true, &t.v, &t.v_scale);
}

std::vector<unsigned char> RandomSlot(std::mt19937_64& rng, SlotType type, int64_t n) {
  std::vector<float> g(n);
  for (float& x : g) x = GradValue(rng, 1e-3f);
  if (type == SlotType::kFp32) return AsBytes(g);
  std::vector<uint16_t> b(n);
  for (int64_t i = 0; i < n; ++i) b[i] = Bf16FromFloat(g[i]);
  return AsBytes(b);
}

DeviceBuffer Upload(const std::vector<unsigned char>& bytes) {
  DeviceBuffer d(bytes.size());
  if (!bytes.empty()) d.Upload(bytes);
  return d;
}

DeviceBuffer UploadFloats(const std::vector<float>& values) {
  DeviceBuffer d(values.size() * 4);
  if (!values.empty()) d.Upload(values);
  return d;
}

// Allocates the device copy of t's state and every recipe x direction output (poisoned).
void ToDevice(TestTensor& t, bool all_outputs) {
  t.d_master = Upload(t.master);
  t.d_remainder = Upload(t.remainder);
  t.d_m = Upload(t.m);
  t.d_v = Upload(t.v);
  t.d_m_scale = UploadFloats(t.m_scale);
  t.d_v_scale = UploadFloats(t.v_scale);
  t.d_fp8_scale = UploadFloats({t.fp8_tensor_scale});
  t.d_delayed = UploadFloats({t.fp8_delayed_scale});
  t.d_amax = DeviceBuffer(4);
  for (int r = 0; r < kNumRecipes; ++r) {
    for (Direction dir : {Direction::kRowwise, Direction::kColumnwise}) {
      const Recipe recipe = static_cast<Recipe>(r);
      if (!all_outputs && recipe != Recipe::kMxfp8) continue;
      TestTensor::Output o{recipe, dir, ServeLayout(recipe, dir, t.rows, t.cols), {}, {}};
      o.data = DeviceBuffer(o.layout.data_bytes);
      o.scales = DeviceBuffer(o.layout.scale_bytes);
      o.data.Poison();
      o.scales.Poison();
      t.outputs.push_back(std::move(o));
    }
  }
}

CudaStepTensor Describe(TestTensor& t) {
  CudaStepTensor c;
  c.rows = t.rows;
  c.cols = t.cols;
  c.policy = t.policy;
  c.tensor_index = t.index;
  c.slot_type = t.slot_type;
  for (DeviceBuffer& s : t.d_slots) c.d_slots.push_back(s.get());
  c.d_master = t.d_master.get();
  c.d_master_remainder = t.remainder.empty() ? nullptr : t.d_remainder.as<int16_t>();
  c.d_exp_avg = t.d_m.get();
  c.d_exp_avg_scale_inv = t.m_scale.empty() ? nullptr : t.d_m_scale.as<float>();
  c.d_exp_avg_sq = t.d_v.get();
  c.d_exp_avg_sq_scale_inv = t.v_scale.empty() ? nullptr : t.d_v_scale.as<float>();
  for (TestTensor::Output& o : t.outputs) {
    c.outputs.push_back(
        {o.recipe, o.direction, o.data.get(), o.layout.scale_bytes > 0 ? o.scales.get() : nullptr});
  }
  c.d_fp8_tensor_scale = t.d_fp8_scale.as<float>();
  c.d_fp8_delayed_scale = t.d_delayed.as<float>();
  c.d_master_amax = t.d_amax.as<float>();
  return c;
}

// The CPU reference of one step of t (its host state is updated) and a comparison of everything
// the GPU wrote. Returns the differences found.
std::vector<std::string> StepAndCompare(TestTensor& t,
                                        const std::vector<std::vector<unsigned char>>& slots,
                                        const CudaStepScalars& s) {
  std::vector<std::string> errors;
  auto fail = [&](const std::string& e) {
    if (!e.empty()) errors.push_back(e);
  };
  const int64_t n = t.n;
  std::vector<const void*> slot_ptrs;
  for (const auto& sl : slots) slot_ptrs.push_back(sl.data());
  std::vector<float> served(n);
  std::vector<uint16_t> bf16(n), fp16(n);
  FusedStepArgs a;
  a.slots = slot_ptrs.data();
  a.num_slots = static_cast<int>(slot_ptrs.size());
  a.slot_type = t.slot_type;
  a.grad_scale = s.grad_scale;
  a.clip = s.clip;
  a.scalars = s.adamw;
  a.policy = t.policy;
  a.rng = {s.seed, s.k, t.index};
  a.numel = n;
  a.master = t.master.data();
  a.master_remainder =
      t.remainder.empty() ? nullptr : reinterpret_cast<int16_t*>(t.remainder.data());
  a.exp_avg = t.m.data();
  a.exp_avg_scale_inv = t.m_scale.empty() ? nullptr : t.m_scale.data();
  a.exp_avg_sq = t.v.data();
  a.exp_avg_sq_scale_inv = t.v_scale.empty() ? nullptr : t.v_scale.data();
  a.out_fp32 = served.data();
  a.out_bf16 = bf16.data();
  a.out_fp16 = fp16.data();
  float amax = 0.0f;
  const KStatus st = FusedStepCpu(a, 0, n, CpuPath::kAuto, &amax);
  if (!st.ok()) return {"FusedStepCpu: " + st.message()};
  const float new_tensor_scale = NextFp8TensorScale(amax, t.fp8_tensor_scale).scale;

  const std::string name = "[" + std::to_string(t.rows) + "x" + std::to_string(t.cols) + "] ";
  const bool fp32_master = t.policy.master == MasterType::kFp32;
  fail(CompareBytes(t.d_master.Download<unsigned char>(t.master.size()).data(), t.master.data(),
                    t.master.size(), fp32_master, name + "master"));
  if (!t.remainder.empty()) {
    fail(CompareBytes(t.d_remainder.Download<unsigned char>(t.remainder.size()).data(),
                      t.remainder.data(), t.remainder.size(), false, name + "remainder"));
  }
  fail(CompareBytes(t.d_m.Download<unsigned char>(t.m.size()).data(), t.m.data(), t.m.size(),
                    t.policy.exp_avg == MomentType::kFp32, name + "exp_avg"));
  fail(CompareBytes(t.d_v.Download<unsigned char>(t.v.size()).data(), t.v.data(), t.v.size(),
                    t.policy.exp_avg_sq == MomentType::kFp32, name + "exp_avg_sq"));
  fail(CompareBytes(t.d_m_scale.Download<float>(t.m_scale.size()).data(), t.m_scale.data(),
                    t.m_scale.size() * 4, true, name + "exp_avg scales"));
  fail(CompareBytes(t.d_v_scale.Download<float>(t.v_scale.size()).data(), t.v_scale.data(),
                    t.v_scale.size() * 4, true, name + "exp_avg_sq scales"));
  const float gpu_amax = t.d_amax.Download<float>(1)[0];
  fail(CompareBytes(&gpu_amax, &amax, 4, false, name + "master amax"));
  const float gpu_scale = t.d_fp8_scale.Download<float>(1)[0];
  fail(CompareBytes(&gpu_scale, &new_tensor_scale, 4, false, name + "fp8_tensor scale"));

  for (TestTensor::Output& o : t.outputs) {
    const ServeBufferLayout& l = o.layout;
    std::vector<unsigned char> data(l.data_bytes), scales(l.scale_bytes);
    if (o.recipe == Recipe::kBf16 && t.policy.master == MasterType::kBf16Remainder) {
      // The stored served halves, as the daemon serves them.
      const auto* hi = reinterpret_cast<const uint16_t*>(t.master.data());
      auto* out = reinterpret_cast<uint16_t*>(data.data());
      for (int64_t r = 0; r < t.rows; ++r) {
        for (int64_t c = 0; c < t.cols; ++c) {
          out[o.direction == Direction::kRowwise ? r * t.cols + c : c * t.rows + r] =
              hi[r * t.cols + c];
        }
      }
    } else {
      ServeArgs sa;
      sa.master = served.data();
      sa.rows = t.rows;
      sa.cols = t.cols;
      sa.recipe = o.recipe;
      sa.direction = o.direction;
      sa.tensor_scale = o.recipe == Recipe::kFp8Tensor ? new_tensor_scale : t.fp8_delayed_scale;
      sa.data = data.data();
      sa.scales = scales.data();
      const KStatus qs = ServeQuantizeCpu(sa, 0, t.rows);
      if (!qs.ok()) return {"ServeQuantizeCpu: " + qs.message()};
    }
    const std::string what = name + RecipeName(o.recipe) + " " + DirectionName(o.direction);
    fail(CompareBytes(o.data.Download<unsigned char>(l.data_bytes).data(), data.data(),
                      l.data_bytes, o.recipe == Recipe::kFp32, what + " data"));
    fail(CompareBytes(o.scales.Download<unsigned char>(l.scale_bytes).data(), scales.data(),
                      l.scale_bytes, false, what + " scales"));
    // Poison again, so the next step must write everything again.
    o.data.Poison(0x5A);
    o.scales.Poison(0x5A);
  }
  t.fp8_tensor_scale = new_tensor_scale;
  return errors;
}

struct Case {
  StatePolicy policy;
  int num_slots;
};

std::string PolicyName(const StatePolicy& p) {
  auto m = [](MomentType t) {
    switch (t) {
      case MomentType::kFp32:
        return "fp32";
      case MomentType::kBf16:
        return "bf16";
      case MomentType::kFp16:
        return "fp16";
      default:
        return "fp8";
    }
  };
  const char* master = p.master == MasterType::kFp32            ? "fp32"
                       : p.master == MasterType::kBf16Remainder ? "bf16rem"
                                                                : "fp16";
  return std::string("master ") + master + ", m " + m(p.exp_avg) +
         (p.exp_avg_rounding == Rounding::kStochastic ? "/sr" : "") + ", v " + m(p.exp_avg_sq) +
         (p.exp_avg_sq_rounding == Rounding::kStochastic ? "/sr" : "");
}

// Runs `steps` steps of the given tensors on both backends, comparing after each.
void RunCase(cudaStream_t stream, std::vector<std::unique_ptr<TestTensor>>& tensors, uint64_t seed,
             int steps, const CudaStepTuning& tuning, const std::string& label) {
  std::mt19937_64 rng(seed);
  std::vector<CudaStepTensor> described;
  for (auto& t : tensors) described.push_back(Describe(*t));
  CudaStepPlan plan;
  KStatus st = CudaStepPlan::Create(described, &plan);
  ASSERT_TRUE(st.ok()) << st.message();
  DeviceBuffer workspace(plan.workspace_bytes());
  st = plan.Bind(workspace.get(), plan.workspace_bytes(), stream);
  ASSERT_TRUE(st.ok()) << st.message();
  AdamwHyper hyper;
  hyper.lr = 1e-3;
  hyper.weight_decay = 0.01;
  for (int step = 1; step <= steps; ++step) {
    // Fresh gradients every step.
    std::vector<std::vector<std::vector<unsigned char>>> slots(tensors.size());
    for (size_t j = 0; j < tensors.size(); ++j) {
      TestTensor& t = *tensors[j];
      for (int r = 0; r < t.num_slots; ++r) {
        slots[j].push_back(RandomSlot(rng, t.slot_type, t.n));
        PARAMD_CUDA_OK(t.d_slots[r].Upload(slots[j].back()));
      }
    }
    CudaStepScalars s;
    s.adamw = MakeAdamwScalars(hyper, step);
    s.grad_scale = step == 1 ? 0.5f : 1.0f / 3.0f;
    s.clip = step == 1 ? 1.0f : 0.75f;
    s.seed = 0x1234567887654321ull ^ seed;
    s.k = static_cast<uint32_t>(step);
    st = FusedStepCuda(plan, s, stream, tuning);
    ASSERT_TRUE(st.ok()) << st.message();
    PARAMD_CUDA_OK(cudaStreamSynchronize(stream));
    PARAMD_CUDA_OK(cudaGetLastError());
    for (size_t j = 0; j < tensors.size(); ++j) {
      const std::vector<std::string> errors = StepAndCompare(*tensors[j], slots[j], s);
      for (const std::string& e : errors) {
        ADD_FAILURE() << label << ", step " << step << ", tensor " << j << " "
                      << (tensors[j]->slot_type == SlotType::kFp32 ? "fp32" : "bf16") << " slots x"
                      << tensors[j]->num_slots << ": " << e;
      }
      if (!errors.empty()) return;
    }
  }
}

// Slot types alternate and slot counts vary between tensors, unless `uniform_slots` is given: then
// every tensor has one slot of that type (the launch then runs a kernel compiled for its policy
// where one exists).
std::vector<std::unique_ptr<TestTensor>> MakeTensors(const StatePolicy& policy, int num_slots,
                                                     uint64_t seed, bool all_outputs,
                                                     const std::vector<Shape>& shapes,
                                                     const SlotType* uniform_slots = nullptr) {
  std::mt19937_64 rng(seed);
  std::vector<std::unique_ptr<TestTensor>> tensors;
  for (size_t j = 0; j < shapes.size(); ++j) {
    auto t = std::make_unique<TestTensor>();
    t->rows = shapes[j].rows;
    t->cols = shapes[j].cols;
    t->n = t->rows * t->cols;
    t->policy = policy;
    t->slot_type = j % 2 == 0 ? SlotType::kBf16 : SlotType::kFp32;
    t->num_slots = 1 + static_cast<int>((j + num_slots) % 3);
    if (uniform_slots != nullptr) {
      t->slot_type = *uniform_slots;
      t->num_slots = 1;
    }
    t->index = static_cast<uint32_t>(j * 7 + 3);
    t->fp8_delayed_scale = 0.75f * static_cast<float>(j + 1);
    RandomState(rng, *t);
    for (int r = 0; r < t->num_slots; ++r) {
      t->d_slots.emplace_back(t->n * (t->slot_type == SlotType::kFp32 ? 4 : 2));
    }
    ToDevice(*t, all_outputs);
    tensors.push_back(std::move(t));
  }
  return tensors;
}

std::vector<Case> CasesFor(MasterType master) {
  std::vector<Case> cases;
  const MomentType types[] = {MomentType::kFp32, MomentType::kBf16, MomentType::kFp16,
                              MomentType::kFp8};
  int k = 0;
  for (MomentType m : types) {
    for (MomentType v : types) {
      for (int rounding = 0; rounding < 3; ++rounding) {
        StatePolicy p = MakeStatePolicy(master, m, v);
        if (rounding == 0) {
          p.exp_avg_rounding = p.exp_avg_sq_rounding = Rounding::kNearest;
        } else if (rounding == 2) {
          if (m == MomentType::kFp32 && v == MomentType::kFp32) continue;
          if (m != MomentType::kFp32) p.exp_avg_rounding = Rounding::kStochastic;
          if (v != MomentType::kFp32) p.exp_avg_sq_rounding = Rounding::kStochastic;
        } else if (p.exp_avg_sq_rounding == Rounding::kNearest) {
          continue;  // the default is rounding 0 here
        }
        cases.push_back({p, 1 + (k++ % 3)});
      }
    }
  }
  return cases;
}

class FusedStepCudaTest : public CudaParamTest<MasterType> {};

TEST_P(FusedStepCudaTest, EveryPolicyAndRecipeMatchesTheCpuBitForBit) {
  uint64_t seed = 1000 + static_cast<uint64_t>(GetParam()) * 100;
  const std::vector<Shape> shapes(std::begin(kShapes), std::end(kShapes));
  for (const Case& c : CasesFor(GetParam())) {
    auto tensors = MakeTensors(c.policy, c.num_slots, ++seed, true, shapes);
    RunCase(stream_, tensors, seed, 2, {}, PolicyName(c.policy));
    if (HasFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Masters, FusedStepCudaTest,
                         ::testing::Values(MasterType::kFp32, MasterType::kBf16Remainder,
                                           MasterType::kFp16),
                         [](const ::testing::TestParamInfo<MasterType>& info) {
                           return std::string(info.param == MasterType::kFp32 ? "Fp32"
                                              : info.param == MasterType::kBf16Remainder
                                                  ? "Bf16Remainder"
                                                  : "Fp16");
                         });

class FusedStepCudaLaunchTest : public CudaTest {};

// The benchmark's policy over 300 tensors of random shapes (mostly tile path) in one launch.
TEST_F(FusedStepCudaLaunchTest, ThreeHundredTensorsInOneLaunchMatchTheCpu) {
  std::mt19937_64 rng(77);
  std::uniform_int_distribution<int> rows(1, 300), tiles(1, 4), odd(1, 400);
  std::vector<Shape> shapes;
  for (int j = 0; j < 300; ++j) {
    const int64_t cols = j % 5 == 4 ? odd(rng) : 128 * tiles(rng);
    shapes.push_back({rows(rng), cols});
  }
  const SlotType bf16 = SlotType::kBf16;
  auto tensors =
      MakeTensors(MakeStatePolicy(MasterType::kFp32, MomentType::kFp8, MomentType::kFp16), 1, 78,
                  false, shapes, &bf16);
  RunCase(stream_, tensors, 79, 2, {}, "300 tensors (the kernel compiled for this policy)");
  if (HasFailure()) return;
  auto again = MakeTensors(MakeStatePolicy(MasterType::kFp32, MomentType::kFp8, MomentType::kFp16),
                           1, 78, false, shapes, &bf16);
  RunCase(stream_, again, 79, 2, CudaStepTuning{0, 0, 0, true}, "300 tensors (generic kernel)");
}

// The benchmark's states with one fp32 slot per tensor (a trainer with fp32 parameters) run their
// own compiled kernel, at every rows-per-warp: the same bits as the CPU and the generic kernel.
TEST_F(FusedStepCudaLaunchTest, Fp32GradientsWithFp8MomentsKernelMatchesTheCpu) {
  const std::vector<Shape> shapes = {{300, 256}, {129, 128}, {64, 384},  {9, 640},
                                     {40, 128},  {8, 128},   {161, 512}, {3, 77}};
  const SlotType fp32 = SlotType::kFp32;
  const StatePolicy policy =
      MakeStatePolicy(MasterType::kFp32, MomentType::kFp8, MomentType::kFp16);
  for (const CudaStepTuning tuning :
       {CudaStepTuning{}, CudaStepTuning{2, 4, 1}, CudaStepTuning{2, 4, 2}, CudaStepTuning{2, 4, 4},
        CudaStepTuning{2, 4, 0, true}}) {
    auto tensors = MakeTensors(policy, 1, 82, true, shapes, &fp32);
    RunCase(stream_, tensors, 83, 2, tuning,
            "fp8 moments, fp32 slots, rows/warp " + std::to_string(tuning.rows_per_warp) +
                (tuning.generic ? ", generic" : ""));
    if (HasFailure()) return;
  }
}

// The fp32 policy with one fp32 slot per tensor runs its own compiled kernel: the same bits.
TEST_F(FusedStepCudaLaunchTest, Fp32PolicyKernelMatchesTheCpu) {
  const SlotType fp32 = SlotType::kFp32;
  const std::vector<Shape> shapes(std::begin(kShapes), std::end(kShapes));
  auto tensors = MakeTensors(StatePolicy{}, 1, 80, true, shapes, &fp32);
  RunCase(stream_, tensors, 81, 2, {}, "fp32 policy");
}

// Every pipeline depth, grid size and rows-per-warp gives the same bits (the tile walk and its
// counters do not depend on them), for the kernel compiled for the benchmark's policy and for the
// generic one.
TEST_F(FusedStepCudaLaunchTest, TuningDoesNotChangeTheBits) {
  const std::vector<Shape> shapes = {{300, 256}, {129, 128}, {64, 384}, {9, 640}, {40, 128}};
  const SlotType bf16 = SlotType::kBf16;
  const StatePolicy policy =
      MakeStatePolicy(MasterType::kFp32, MomentType::kFp8, MomentType::kFp16);
  for (const CudaStepTuning tuning :
       {CudaStepTuning{1, 2, 1}, CudaStepTuning{2, 3, 2}, CudaStepTuning{3, 8, 4},
        CudaStepTuning{2, 5, 0}, CudaStepTuning{3, 2, 4}, CudaStepTuning{2, 4, 0, true}}) {
    auto tensors = MakeTensors(policy, 1, 90, true, shapes, &bf16);
    RunCase(stream_, tensors, 91, 2, tuning,
            "blocks/SM " + std::to_string(tuning.blocks_per_sm) + ", stages " +
                std::to_string(tuning.stages) + ", rows/warp " +
                std::to_string(tuning.rows_per_warp) + (tuning.generic ? ", generic" : ""));
    if (HasFailure()) return;
  }
}

// The benchmark's outputs alone (mxfp8 rowwise and columnwise): with 4 rows per warp the
// columnwise blocks are cast from registers and no shared-memory tile is kept, a layout that the
// all-outputs cases above (fp8_block keeps the tile) do not reach.
TEST_F(FusedStepCudaLaunchTest, MxfpOnlyOutputsMatchTheCpuAtEveryTuning) {
  const std::vector<Shape> shapes = {{300, 256}, {129, 128}, {64, 384}, {9, 640},
                                     {40, 128},  {8, 128},   {161, 512}};
  const SlotType bf16 = SlotType::kBf16;
  const StatePolicy policy =
      MakeStatePolicy(MasterType::kFp32, MomentType::kFp8, MomentType::kFp16);
  for (const CudaStepTuning tuning :
       {CudaStepTuning{}, CudaStepTuning{2, 2, 4}, CudaStepTuning{1, 3, 2}, CudaStepTuning{3, 4, 1},
        CudaStepTuning{2, 3, 0, true}}) {
    auto tensors = MakeTensors(policy, 1, 95, false, shapes, &bf16);
    RunCase(stream_, tensors, 96, 3, tuning,
            "mxfp8 only, blocks/SM " + std::to_string(tuning.blocks_per_sm) + ", stages " +
                std::to_string(tuning.stages) + ", rows/warp " +
                std::to_string(tuning.rows_per_warp) + (tuning.generic ? ", generic" : ""));
    if (HasFailure()) return;
  }
}

TEST_F(FusedStepCudaLaunchTest, RejectsMissingBuffers) {
  CudaStepTensor t;
  t.rows = 4;
  t.cols = 4;
  CudaStepPlan plan;
  EXPECT_EQ(CudaStepPlan::Create(std::span<const CudaStepTensor>(&t, 1), &plan).code(),
            Code::kInvalidArgument);
}

}  // namespace
}  // namespace paramd::kernels
