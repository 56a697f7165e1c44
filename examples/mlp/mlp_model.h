// A small 2-layer MLP regression (16 -> 32 tanh -> 1, mean squared error) on generated data, in
// plain FP32 C++ with no dependency on paramd: the model the example trainers fit through the
// daemon, and the same model the local reference replays.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace paramd::mlp {

inline constexpr int kInputs = 16;
inline constexpr int kHidden = 32;
inline constexpr int kBatch = 64;  // samples per rank per step

// Parameters (or their gradients), in registration order: w1 [32,16], b1 [1,32], w2 [1,32],
// b2 [1,1].
struct Params {
  std::vector<float> w1, b1, w2, b2;
  std::vector<float>* tensor(int i);
  const std::vector<float>* tensor(int i) const;
};

struct TensorShape {
  const char* name;
  int64_t rows, cols;
};
inline constexpr TensorShape kShapes[] = {
    {"w1", kHidden, kInputs}, {"b1", 1, kHidden}, {"w2", 1, kHidden}, {"b2", 1, 1}};
inline constexpr int kNumTensors = 4;

Params InitialParams(uint64_t seed);
Params ZeroParams();

// The batch rank `rank` trains on at `step`: a pure function of (seed, step, rank).
struct Batch {
  std::vector<float> x;  // [kBatch, kInputs]
  std::vector<float> y;  // [kBatch]
};
Batch MakeBatch(uint64_t seed, int64_t step, int rank);

// Mean squared error over the batch, and its gradient with respect to every parameter.
float LossAndGradient(const Params& params, const Batch& batch, Params* grad);

// Learning rate of a step: linear decay from `base` to base / 2 over `steps`.
double LearningRate(double base, int64_t step, int64_t steps);

}  // namespace paramd::mlp
