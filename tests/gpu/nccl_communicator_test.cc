// The nccl transport's communicator on one GPU (label gpu; skips without a usable device): a
// communicator of one rank sends 64 MiB to itself in one group, byte for byte; a rank whose peer
// never joins is answered DEADLINE_EXCEEDED by its deadline, the communicator aborted, and nothing
// hangs. Two ranks need two GPUs (NCCL refuses two ranks on one): the transport's own tests.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda_step.h"
#include "transport/nccl/communicator.h"

namespace paramd {
namespace {

using namespace std::chrono_literals;

class NcclCommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!kernels::CudaDeviceAvailable(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  }
};

TEST_F(NcclCommunicatorTest, OneRankSendsToItselfByteForByte) {
  const absl::StatusOr<std::string> id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> comm =
      NcclCommunicator::Create(*id, 1, 0, 0, 30s);
  ASSERT_TRUE(comm.ok()) << comm.status();
  constexpr size_t kBytes = 64 << 20;
  std::vector<uint8_t> host(kBytes);
  for (size_t i = 0; i < kBytes; ++i) host[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
  void* send = nullptr;
  void* recv = nullptr;
  ASSERT_EQ(cudaMalloc(&send, kBytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&recv, kBytes), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(send, host.data(), kBytes, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(recv, 0, kBytes), cudaSuccess);
  const absl::Status queued = (*comm)->SendRecv(send, kBytes, recv, kBytes, 0, stream);
  ASSERT_TRUE(queued.ok()) << queued;
  const absl::Status waited = (*comm)->Wait(stream, 30s);
  ASSERT_TRUE(waited.ok()) << waited;
  std::vector<uint8_t> back(kBytes);
  ASSERT_EQ(cudaMemcpy(back.data(), recv, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_TRUE(back == host);
  EXPECT_EQ((*comm)->SendRecv(send, kBytes, recv, kBytes, 1, stream).code(),
            absl::StatusCode::kInvalidArgument);
  comm->reset();
  cudaStreamDestroy(stream);
  cudaFree(send);
  cudaFree(recv);
}

TEST_F(NcclCommunicatorTest, APeerThatNeverJoinsEndsTheMakingByTheDeadline) {
  const absl::StatusOr<std::string> id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  const auto started = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> comm =
      NcclCommunicator::Create(*id, 2, 0, 0, 2s);
  const auto took = std::chrono::steady_clock::now() - started;
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded) << comm.status();
  EXPECT_NE(comm.status().message().find("rank 0"), std::string::npos) << comm.status();
  EXPECT_GE(took, 2s);
  EXPECT_LT(took, 15s) << "the abort did not end the making promptly";
}

}  // namespace
}  // namespace paramd
