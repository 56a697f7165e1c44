// The GPU's hardware converts (kernels/cuda/device_vec.cuh, used when PARAMD_CUDA_HW_CASTS is on)
// and its fast paths of the power-of-two scales against kernels/formats.h's definitions on every
// one of the 2^32 FP32 bit patterns, both run on the GPU: the fused step may use them only because
// this holds.
#include <gtest/gtest.h>

#include "kernels/cuda/test_hooks.h"
#include "tests/gpu/gpu_test_util.h"

namespace paramd::kernels {
namespace {

using testing::CudaTest;

class CudaCastsTest : public CudaTest {};

TEST_F(CudaCastsTest, HardwareConvertsEqualTheIntegerCastsOnEveryFloat) {
  cuda_internal::CastCheck check{};
  const KStatus st = cuda_internal::CheckHardwareCasts(&check, stream_);
  ASSERT_TRUE(st.ok()) << st.message();
  // The division's range holds about a quarter of the patterns in each operand: ~2^29 pairs.
  EXPECT_GT(check.fast_divisions, 1ull << 28);
  for (int k = 0; k < cuda_internal::kCastChecks; ++k) {
    EXPECT_EQ(check.mismatches[k], 0u)
        << cuda_internal::kCastCheckNames[k] << ": " << check.mismatches[k]
        << " inputs differ, the smallest bits 0x" << std::hex << check.first[k];
  }
}

}  // namespace
}  // namespace paramd::kernels
