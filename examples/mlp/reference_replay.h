// The local reference of the example: the whole training replayed in one process, every rank's
// gradient computed here, summed in rank order and stepped by paramd::reference (which shares no
// code with kernels/). The daemon's final weights must equal these bit for bit.
#pragma once

#include <cstdint>

#include "examples/mlp/mlp_model.h"

namespace paramd::mlp {

struct TrainSettings {
  uint64_t seed = 1;
  int world_size = 2;
  int64_t steps = 100;
  double lr = 1e-2;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

// The parameters after `settings.steps` steps.
Params ReplayReference(const TrainSettings& settings);

}  // namespace paramd::mlp
