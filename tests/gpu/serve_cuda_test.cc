// ServeQuantizeCuda against ServeQuantizeCpu, bit for bit: every recipe x direction, masters of
// every type, shapes 1x1, primes and non-multiples of 32 and 128, and masters holding the edge
// values of the casts (NaN, infinities, FP32 subnormals, values past every format's range), all
// outputs of a case in one launch.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda_step.h"
#include "kernels/formats.h"
#include "kernels/recipes.h"
#include "tests/gpu/gpu_test_util.h"

namespace paramd::kernels {
namespace {

using testing::CompareBytes;
using testing::CudaParamTest;
using testing::DeviceBuffer;

struct Shape {
  int64_t rows, cols;
};
constexpr Shape kShapes[] = {{1, 1},     {1, 33},    {5, 7},     {31, 129}, {32, 32},
                             {127, 131}, {128, 128}, {129, 257}, {300, 96}, {17, 1000}};

float MasterValue(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> kind(0, 199);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  switch (kind(rng)) {
    case 0:
      return std::bit_cast<float>(0x7FC00000u | static_cast<uint32_t>(rng() & 0x803FFFFFu));  // NaN
    case 1:
      return (rng() & 1) ? INFINITY : -INFINITY;
    case 2:
      return std::bit_cast<float>(static_cast<uint32_t>(rng() & 0x807FFFFFu));  // subnormal
    case 3:
      return normal(rng) * 1e30f;
    case 4:
      return normal(rng) * 1e-20f;
    case 5:
      return 0.0f;
    default:
      return normal(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
  }
}

class ServeCudaTest : public CudaParamTest<MasterType> {};

TEST_P(ServeCudaTest, EveryRecipeAndDirectionMatchesTheCpuBitForBit) {
  const MasterType master_type = GetParam();
  std::mt19937_64 rng(500 + static_cast<int>(master_type));
  struct Item {
    Shape shape;
    Recipe recipe;
    Direction direction;
    std::vector<float> served;  // what ServeQuantizeCpu reads
    std::vector<uint16_t> halves;
    float scale;
    ServeBufferLayout layout;
    DeviceBuffer master, remainder, scale_dev, data, scales;
  };
  std::vector<Item> items;
  for (const Shape& shape : kShapes) {
    const int64_t n = shape.rows * shape.cols;
    // The stored master in its type and the FP32 values it stands for.
    std::vector<float> served(n);
    std::vector<unsigned char> stored;
    std::vector<int16_t> remainder;
    std::vector<uint16_t> halves;
    for (int64_t i = 0; i < n; ++i) served[i] = MasterValue(rng);
    if (master_type == MasterType::kFp32) {
      stored.resize(4 * n);
      std::memcpy(stored.data(), served.data(), 4 * n);
    } else if (master_type == MasterType::kFp16) {
      stored.resize(2 * n);
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t code = Fp16FromFloat(served[i]);
        std::memcpy(stored.data() + 2 * i, &code, 2);
        served[i] = FloatFromFp16(code);
      }
    } else {
      stored.resize(2 * n);
      remainder.resize(n);
      halves.resize(n);
      for (int64_t i = 0; i < n; ++i) {
        const Bf16Split s = SplitBf16Remainder(served[i]);
        std::memcpy(stored.data() + 2 * i, &s.served, 2);
        remainder[i] = s.remainder;
        halves[i] = s.served;
        served[i] = MergeBf16Remainder(s.served, s.remainder);
      }
    }
    for (int r = 0; r < kNumRecipes; ++r) {
      for (Direction dir : {Direction::kRowwise, Direction::kColumnwise}) {
        Item it;
        it.shape = shape;
        it.recipe = static_cast<Recipe>(r);
        it.direction = dir;
        it.served = served;
        it.halves = halves;
        it.scale = std::ldexp(1.3f, static_cast<int>(rng() % 20) - 10);
        it.layout = ServeLayout(it.recipe, dir, shape.rows, shape.cols);
        it.master = DeviceBuffer(stored.size());
        PARAMD_CUDA_OK(it.master.Upload(stored));
        it.remainder = DeviceBuffer(remainder.size() * 2);
        if (!remainder.empty()) {
          PARAMD_CUDA_OK(it.remainder.Upload(remainder));
        }
        it.scale_dev = DeviceBuffer(4);
        PARAMD_CUDA_OK(it.scale_dev.Upload(std::vector<float>{it.scale}));
        it.data = DeviceBuffer(it.layout.data_bytes);
        it.scales = DeviceBuffer(it.layout.scale_bytes);
        PARAMD_CUDA_OK(it.data.Poison());
        PARAMD_CUDA_OK(it.scales.Poison());
        items.push_back(std::move(it));
      }
    }
  }
  std::vector<CudaServeArgs> args;
  for (Item& it : items) {
    CudaServeArgs a;
    a.master_type = master_type;
    a.d_master = it.master.get();
    a.d_master_remainder = it.remainder.as<int16_t>();
    a.rows = it.shape.rows;
    a.cols = it.shape.cols;
    a.recipe = it.recipe;
    a.direction = it.direction;
    a.d_tensor_scale = it.scale_dev.as<float>();
    a.d_data = it.data.get();
    a.d_scales = it.layout.scale_bytes > 0 ? it.scales.get() : nullptr;
    args.push_back(a);
  }
  DeviceBuffer workspace(ServeQuantizeCudaWorkspaceBytes(args.size()));
  const KStatus st = ServeQuantizeCuda(args, workspace.get(), workspace.bytes(), stream_);
  ASSERT_TRUE(st.ok()) << st.message();
  PARAMD_CUDA_OK(cudaStreamSynchronize(stream_));

  for (Item& it : items) {
    const ServeBufferLayout& l = it.layout;
    std::vector<unsigned char> data(l.data_bytes), scales(l.scale_bytes);
    if (it.recipe == Recipe::kBf16 && master_type == MasterType::kBf16Remainder) {
      auto* out = reinterpret_cast<uint16_t*>(data.data());
      for (int64_t r = 0; r < it.shape.rows; ++r) {
        for (int64_t c = 0; c < it.shape.cols; ++c) {
          out[it.direction == Direction::kRowwise ? r * it.shape.cols + c : c * it.shape.rows + r] =
              it.halves[r * it.shape.cols + c];
        }
      }
    } else {
      ServeArgs sa;
      sa.master = it.served.data();
      sa.rows = it.shape.rows;
      sa.cols = it.shape.cols;
      sa.recipe = it.recipe;
      sa.direction = it.direction;
      sa.tensor_scale = it.scale;
      sa.data = data.data();
      sa.scales = scales.data();
      const KStatus qs = ServeQuantizeCpu(sa, 0, it.shape.rows);
      ASSERT_TRUE(qs.ok()) << qs.message();
    }
    const std::string what = "[" + std::to_string(it.shape.rows) + "x" +
                             std::to_string(it.shape.cols) + "] " + RecipeName(it.recipe) + " " +
                             DirectionName(it.direction);
    EXPECT_EQ(CompareBytes(it.data.Download<unsigned char>(l.data_bytes).data(), data.data(),
                           l.data_bytes, false, what + " data"),
              "");
    EXPECT_EQ(CompareBytes(it.scales.Download<unsigned char>(l.scale_bytes).data(), scales.data(),
                           l.scale_bytes, false, what + " scales"),
              "");
  }
}

INSTANTIATE_TEST_SUITE_P(Masters, ServeCudaTest,
                         ::testing::Values(MasterType::kFp32, MasterType::kBf16Remainder,
                                           MasterType::kFp16),
                         [](const ::testing::TestParamInfo<MasterType>& info) {
                           return std::string(info.param == MasterType::kFp32 ? "Fp32"
                                              : info.param == MasterType::kBf16Remainder
                                                  ? "Bf16Remainder"
                                                  : "Fp16");
                         });

}  // namespace
}  // namespace paramd::kernels
