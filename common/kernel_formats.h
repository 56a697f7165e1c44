// The protocol's serve-format enums (paramd.v1 Recipe, Direction) as the kernels name them
// (kernels/recipes.h), for the daemon's backends and the client's assembly of split tensors alike.
// Header only: the kernels' enums, no kernel code.
#pragma once

#include "kernels/recipes.h"
#include "paramd/v1/types.pb.h"

namespace paramd {

// RECIPE_UNSPECIFIED (and values this build does not know) mean FP32, as in a pull.
inline kernels::Recipe KernelRecipe(v1::Recipe recipe) {
  switch (recipe) {
    case v1::RECIPE_BF16:
      return kernels::Recipe::kBf16;
    case v1::RECIPE_FP16:
      return kernels::Recipe::kFp16;
    case v1::RECIPE_FP8_TENSOR:
      return kernels::Recipe::kFp8Tensor;
    case v1::RECIPE_FP8_DELAYED:
      return kernels::Recipe::kFp8Delayed;
    case v1::RECIPE_FP8_BLOCK:
      return kernels::Recipe::kFp8Block;
    case v1::RECIPE_MXFP8:
      return kernels::Recipe::kMxfp8;
    default:
      return kernels::Recipe::kFp32;
  }
}

// DIRECTION_UNSPECIFIED means rowwise.
inline kernels::Direction KernelDirection(v1::Direction direction) {
  return direction == v1::DIRECTION_COLUMNWISE ? kernels::Direction::kColumnwise
                                               : kernels::Direction::kRowwise;
}

}  // namespace paramd
