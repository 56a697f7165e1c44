#include "examples/mlp/reference_replay.h"

#include <vector>

#include "reference/adamw_reference.h"

namespace paramd::mlp {

Params ReplayReference(const TrainSettings& s) {
  Params p = InitialParams(s.seed);
  Params m = ZeroParams();
  Params v = ZeroParams();
  const float grad_scale = static_cast<float>(1.0 / s.world_size);
  for (int64_t step = 0; step < s.steps; ++step) {
    std::vector<Params> grads(static_cast<size_t>(s.world_size));
    for (int r = 0; r < s.world_size; ++r) {
      LossAndGradient(p, MakeBatch(s.seed, step, r), &grads[static_cast<size_t>(r)]);
    }
    const reference::Hyper hyper{LearningRate(s.lr, step, s.steps), s.beta1, s.beta2, s.eps,
                                 s.weight_decay};
    for (int t = 0; t < kNumTensors; ++t) {
      const size_t n = p.tensor(t)->size();
      std::vector<const float*> slots;
      for (const Params& g : grads) slots.push_back(g.tensor(t)->data());
      std::vector<float> gs(n);
      for (size_t i = 0; i < n; ++i) {
        gs[i] = reference::SumSlotsFp32(slots.data(), s.world_size, i) * grad_scale;
      }
      reference::AdamwStepFp32(hyper, step + 1, gs.data(), p.tensor(t)->data(), m.tensor(t)->data(),
                               v.tensor(t)->data(), n);
    }
  }
  return p;
}

}  // namespace paramd::mlp
