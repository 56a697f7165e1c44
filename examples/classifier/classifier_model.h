// A small classifier (32 -> 64 ReLU -> 10, softmax cross-entropy) on generated data with 20 %
// label noise, so its loss has a floor well above zero: the model the low-precision training test
// trains through the daemon and, for comparison, with local FP32 AdamW on the same seeds.
#pragma once

#include <cstdint>
#include <vector>

namespace paramd::classifier {

inline constexpr int kInputs = 32;
inline constexpr int kHidden = 64;
inline constexpr int kClasses = 10;
inline constexpr int kBatch = 128;

struct TensorShape {
  const char* name;
  int64_t rows, cols;
};
inline constexpr TensorShape kShapes[] = {
    {"w1", kHidden, kInputs}, {"b1", 1, kHidden}, {"w2", kClasses, kHidden}, {"b2", 1, kClasses}};
inline constexpr int kNumTensors = 4;

// Parameters (or gradients) in registration order.
struct Params {
  std::vector<float> t[kNumTensors];
};

Params InitialParams(uint64_t seed);
Params ZeroParams();

struct Batch {
  std::vector<float> x;  // [n, kInputs]
  std::vector<int> label;
};
// The training batch of a step (a pure function of seed and step).
Batch TrainBatch(uint64_t seed, int64_t step);
// A fixed held-out set of `n` samples.
Batch EvalSet(uint64_t seed, int n);

// Mean cross-entropy over the batch; the gradient when `grad` is not null.
float Loss(const Params& params, const Batch& batch, Params* grad);

}  // namespace paramd::classifier
