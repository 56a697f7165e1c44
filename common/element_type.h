// Bytes per element of every v1::ElementType (gradients, initial weights and exported state).
#pragma once

#include <cstdint>

#include "paramd/v1/types.pb.h"

namespace paramd {

// 0 for ELEMENT_TYPE_UNSPECIFIED and values this build does not know.
constexpr int64_t ElementTypeBytes(v1::ElementType type) {
  switch (type) {
    case v1::ELEMENT_TYPE_FP32:
      return 4;
    case v1::ELEMENT_TYPE_BF16:
    case v1::ELEMENT_TYPE_FP16:
    case v1::ELEMENT_TYPE_INT16:
      return 2;
    case v1::ELEMENT_TYPE_FP8_E4M3:
      return 1;
    default:
      return 0;
  }
}

}  // namespace paramd
