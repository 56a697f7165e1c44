#include "examples/mlp/mlp_model.h"

#include <cmath>

namespace paramd::mlp {
namespace {

// splitmix64: a tiny deterministic generator, the same bits everywhere.
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(Mix(seed)) {}
  // Uniform in [-1, 1).
  float Uniform() {
    state_ = Mix(state_);
    return static_cast<float>(static_cast<double>(state_ >> 40) / (1 << 23) - 1.0);
  }

 private:
  uint64_t state_;
};

void Fill(Rng& rng, float scale, std::vector<float>* v, size_t n) {
  v->resize(n);
  for (float& x : *v) x = scale * rng.Uniform();
}

}  // namespace

std::vector<float>* Params::tensor(int i) {
  std::vector<float>* all[] = {&w1, &b1, &w2, &b2};
  return all[i];
}

const std::vector<float>* Params::tensor(int i) const {
  return const_cast<Params*>(this)->tensor(i);
}

Params ZeroParams() {
  Params p;
  for (int i = 0; i < kNumTensors; ++i) {
    p.tensor(i)->assign(static_cast<size_t>(kShapes[i].rows * kShapes[i].cols), 0.0f);
  }
  return p;
}

Params InitialParams(uint64_t seed) {
  Rng rng(seed);
  Params p;
  Fill(rng, 1.0f / 4.0f, &p.w1, kHidden * kInputs);  // 1 / sqrt(fan_in)
  Fill(rng, 0.1f, &p.b1, kHidden);
  Fill(rng, 1.0f / 5.657f, &p.w2, kHidden);
  Fill(rng, 0.1f, &p.b2, 1);
  return p;
}

Batch MakeBatch(uint64_t seed, int64_t step, int rank) {
  // The teacher: a fixed random 16 -> 8 tanh -> 1 network the student learns to imitate.
  Rng teacher_rng(seed ^ 0x7EAC4E5ull);
  std::vector<float> t1, t2;
  Fill(teacher_rng, 0.6f, &t1, 8 * kInputs);
  Fill(teacher_rng, 1.0f, &t2, 8);
  Rng rng(seed + 1000003ull * static_cast<uint64_t>(step) + 7919ull * static_cast<uint64_t>(rank));
  Batch batch;
  Fill(rng, 1.0f, &batch.x, kBatch * kInputs);
  batch.y.resize(kBatch);
  for (int b = 0; b < kBatch; ++b) {
    float y = 0;
    for (int j = 0; j < 8; ++j) {
      float z = 0;
      for (int i = 0; i < kInputs; ++i) z += t1[j * kInputs + i] * batch.x[b * kInputs + i];
      y += t2[j] * std::tanh(z);
    }
    batch.y[b] = y + 0.05f * rng.Uniform();  // label noise: the loss has a floor
  }
  return batch;
}

float LossAndGradient(const Params& p, const Batch& batch, Params* grad) {
  *grad = ZeroParams();
  float loss = 0;
  const float inv_batch = 1.0f / kBatch;
  std::vector<float> h(kHidden);
  for (int b = 0; b < kBatch; ++b) {
    const float* x = &batch.x[b * kInputs];
    for (int j = 0; j < kHidden; ++j) {
      float z = p.b1[j];
      for (int i = 0; i < kInputs; ++i) z += p.w1[j * kInputs + i] * x[i];
      h[j] = std::tanh(z);
    }
    float out = p.b2[0];
    for (int j = 0; j < kHidden; ++j) out += p.w2[j] * h[j];
    const float err = out - batch.y[b];
    loss += err * err * inv_batch;
    const float dout = 2.0f * err * inv_batch;
    grad->b2[0] += dout;
    for (int j = 0; j < kHidden; ++j) {
      grad->w2[j] += dout * h[j];
      const float dz = dout * p.w2[j] * (1.0f - h[j] * h[j]);
      grad->b1[j] += dz;
      for (int i = 0; i < kInputs; ++i) grad->w1[j * kInputs + i] += dz * x[i];
    }
  }
  return loss;
}

double LearningRate(double base, int64_t step, int64_t steps) {
  return base * (1.0 - 0.5 * static_cast<double>(step) / static_cast<double>(steps));
}

}  // namespace paramd::mlp
