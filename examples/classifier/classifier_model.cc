#include "examples/classifier/classifier_model.h"

#include <algorithm>
#include <cmath>

namespace paramd::classifier {
namespace {

uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(Mix(seed)) {}
  uint64_t Next() { return state_ = Mix(state_); }
  // Uniform in [-1, 1).
  float Uniform() {
    return static_cast<float>(static_cast<double>(Next() >> 40) / (1 << 23) - 1.0);
  }

 private:
  uint64_t state_;
};

// The teacher that labels the data: a fixed random 32 -> 16 tanh -> 10 network.
struct Teacher {
  explicit Teacher(uint64_t seed) {
    Rng rng(seed ^ 0x7EAC4E5ull);
    for (float& w : t1) w = 0.5f * rng.Uniform();
    for (float& w : t2) w = rng.Uniform();
  }
  int Label(const float* x) const {
    float h[16];
    for (int j = 0; j < 16; ++j) {
      float z = 0;
      for (int i = 0; i < kInputs; ++i) z += t1[j * kInputs + i] * x[i];
      h[j] = std::tanh(2.0f * z);
    }
    int best = 0;
    float best_logit = -1e30f;
    for (int c = 0; c < kClasses; ++c) {
      float z = 0;
      for (int j = 0; j < 16; ++j) z += t2[c * 16 + j] * h[j];
      if (z > best_logit) best_logit = z, best = c;
    }
    return best;
  }
  float t1[16 * kInputs];
  float t2[kClasses * 16];
};

Batch Sample(uint64_t seed, uint64_t stream, int n) {
  const Teacher teacher(seed);
  Rng rng(seed * 1000003ull + stream);
  Batch b;
  b.x.resize(static_cast<size_t>(n) * kInputs);
  b.label.resize(static_cast<size_t>(n));
  for (int s = 0; s < n; ++s) {
    for (int i = 0; i < kInputs; ++i) b.x[s * kInputs + i] = rng.Uniform();
    b.label[s] = teacher.Label(&b.x[s * kInputs]);
    if ((rng.Next() % 5) == 0) b.label[s] = static_cast<int>(rng.Next() % kClasses);  // noise
  }
  return b;
}

}  // namespace

Params ZeroParams() {
  Params p;
  for (int i = 0; i < kNumTensors; ++i) {
    p.t[i].assign(static_cast<size_t>(kShapes[i].rows * kShapes[i].cols), 0.0f);
  }
  return p;
}

Params InitialParams(uint64_t seed) {
  Params p = ZeroParams();
  Rng rng(seed);
  for (float& w : p.t[0]) w = rng.Uniform() * 0.30f;  // ~ sqrt(3 / fan_in)
  for (float& w : p.t[2]) w = rng.Uniform() * 0.21f;
  return p;
}

Batch TrainBatch(uint64_t seed, int64_t step) {
  return Sample(seed, static_cast<uint64_t>(step) + 1, kBatch);
}

Batch EvalSet(uint64_t seed, int n) { return Sample(seed, 0, n); }

float Loss(const Params& p, const Batch& batch, Params* grad) {
  if (grad) *grad = ZeroParams();
  const int n = static_cast<int>(batch.label.size());
  const float inv_n = 1.0f / static_cast<float>(n);
  double loss = 0;
  float h[kHidden], logits[kClasses];
  for (int s = 0; s < n; ++s) {
    const float* x = &batch.x[s * kInputs];
    for (int j = 0; j < kHidden; ++j) {
      float z = p.t[1][j];
      for (int i = 0; i < kInputs; ++i) z += p.t[0][j * kInputs + i] * x[i];
      h[j] = std::max(z, 0.0f);
    }
    float top = -1e30f;
    for (int c = 0; c < kClasses; ++c) {
      float z = p.t[3][c];
      for (int j = 0; j < kHidden; ++j) z += p.t[2][c * kHidden + j] * h[j];
      logits[c] = z;
      top = std::max(top, z);
    }
    float sum = 0;
    for (int c = 0; c < kClasses; ++c) sum += std::exp(logits[c] - top);
    const int y = batch.label[s];
    loss += std::log(sum) - (logits[y] - top);
    if (!grad) continue;
    float dh[kHidden] = {};
    for (int c = 0; c < kClasses; ++c) {
      const float d = (std::exp(logits[c] - top) / sum - (c == y ? 1.0f : 0.0f)) * inv_n;
      grad->t[3][c] += d;
      for (int j = 0; j < kHidden; ++j) {
        grad->t[2][c * kHidden + j] += d * h[j];
        dh[j] += d * p.t[2][c * kHidden + j];
      }
    }
    for (int j = 0; j < kHidden; ++j) {
      if (h[j] <= 0) continue;
      grad->t[1][j] += dh[j];
      for (int i = 0; i < kInputs; ++i) grad->t[0][j * kInputs + i] += dh[j] * x[i];
    }
  }
  return static_cast<float>(loss / n);
}

}  // namespace paramd::classifier
