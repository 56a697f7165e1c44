// The transport conformance suite for `nccl`, and what nccl adds (label gpu). The daemon runs in a
// process of its own (NCCL takes one rank per process and GPU): on GPU 1 where the machine has
// two, the trainer on GPU 0; on a machine of one GPU, on GPU 0 too, each process another host to
// NCCL (NCCL_HOSTID), their bytes then going over loopback sockets. Skips with the reason where no
// daemon on a GPU can start.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>

#include "tests/conformance/transport_conformance.h"

namespace paramd::testing {
namespace {

// The daemon's GPU for the suite (TransportConformanceTest::StartDaemonProcess), chosen before
// any test runs.
const bool kBackendChosen = [] {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    count = 0;
  }
  setenv("PARAMD_NCCL_TEST_BACKEND", count >= 2 ? "cuda:1" : "cuda:0", /*overwrite=*/0);
  return true;
}();

using NcclTest = TransportConformanceTest;

// Gradients sent from the trainer's GPU memory where they lie, over three steps of two tensors,
// give the steps of the same gradients from host memory (staged on the device first), bit for bit.
TEST_P(NcclTest, GradientsFromGpuMemoryGiveTheStepsOfHostMemory) {
  constexpr size_t kA = 4099, kB = 640;  // not multiples of any block
  const std::vector<v1::TensorSpec> specs = {Spec("a", 1, kA), Spec("b", 10, kB / 10)};
  Register("dev", specs, 1);
  Register("host", specs, 1);
  const std::vector<float> pa = Random(kA, 1, 0.02f), pb = Random(kB, 2, 0.02f);
  const PushItem init[] = {{"a", Bytes(pa)}, {"b", Bytes(pb)}};
  for (const char* job : {"dev", "host"}) {
    ASSERT_TRUE(transport_->Push({job, 0, 0, v1::PUSH_KIND_INITIAL_WEIGHTS}, init, Soon()).ok());
  }
  std::byte* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), (kA + kB) * sizeof(float)), cudaSuccess);
  for (int64_t step = 0; step < 3; ++step) {
    const std::vector<float> ga = Random(kA, 100 + static_cast<uint32_t>(step), 1e-3f),
                             gb = Random(kB, 200 + static_cast<uint32_t>(step), 1e-3f);
    ASSERT_EQ(cudaMemcpy(d, ga.data(), kA * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d + kA * 4, gb.data(), kB * 4, cudaMemcpyHostToDevice), cudaSuccess);
    const PushItem device[] = {{"a", std::span<const std::byte>(d, kA * 4)},
                               {"b", std::span<const std::byte>(d + kA * 4, kB * 4)}};
    const PushItem host[] = {{"a", Bytes(ga)}, {"b", Bytes(gb)}};
    ASSERT_TRUE(transport_->Push({"dev", 0, step}, device, Soon()).ok());
    ASSERT_TRUE(transport_->Push({"host", 0, step}, host, Soon()).ok());
    ASSERT_TRUE(Commit("dev", 0, step).ok());
    ASSERT_TRUE(Commit("host", 0, step).ok());
    for (const char* tensor : {"a", "b"}) {
      Pulled a, b;
      ASSERT_TRUE(transport_->Pull(Target("dev", tensor, step + 1), Soon(), &a).ok());
      ASSERT_TRUE(transport_->Pull(Target("host", tensor, step + 1), Soon(), &b).ok());
      EXPECT_EQ(a.header.version(), step + 1);
      EXPECT_EQ(a.data, b.data) << "tensor " << tensor << ", step " << step;
    }
  }
  cudaFree(d);
}

// A session whose trainer never joins: a transfer on it ends by its deadline with
// DEADLINE_EXCEEDED (no hang), the daemon drops the session (NOT_FOUND after), and the transport
// under test goes on working over its own session.
TEST_P(NcclTest, ATransferWithAPeerThatNeverJoinsEndsByItsDeadlineAndTheDaemonGoesOn) {
  // A job's weights give the daemon exported GPU memory to name.
  Register("first", {Spec("t", 1, 256)}, 1);
  const std::vector<float> w = Random(256, 5, 0.02f);
  const PushItem weights[] = {{"t", Bytes(w)}};
  ASSERT_TRUE(
      transport_->Push({"first", 0, 0, v1::PUSH_KIND_INITIAL_WEIGHTS}, weights, Soon()).ok());
  v1::AttachRequest open;
  open.set_transport("nccl");
  open.set_job("first");
  open.mutable_nccl_open();
  v1::AttachResponse opened;
  {
    grpc::ClientContext context;
    context.set_deadline(Soon());
    const grpc::Status status = data_->Attach(&context, open, &opened);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  ASSERT_NE(opened.nccl().session(), 0u);
  ASSERT_GT(opened.nccl().bases_size(), 0);
  v1::AttachRequest transfer;
  transfer.set_transport("nccl");
  transfer.set_job("first");
  v1::NcclTransfer* call = transfer.mutable_nccl_transfer();
  call->set_session(opened.nccl().session());
  call->set_to_daemon(true);
  call->set_timeout_ms(2000);
  v1::NcclSpan* span = call->add_spans();
  span->set_address(opened.nccl().bases(0));
  span->set_bytes(4096);
  const auto started = std::chrono::steady_clock::now();
  {
    grpc::ClientContext context;
    context.set_deadline(Soon());
    v1::AttachResponse response;
    const grpc::Status status = data_->Attach(&context, transfer, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(15));
  {
    grpc::ClientContext context;
    context.set_deadline(Soon());
    v1::AttachResponse response;
    const grpc::Status status = data_->Attach(&context, transfer, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << status.error_message();
  }
  // A span outside the exported memory is refused before anything moves.
  span->set_address(1);
  {
    grpc::ClientContext context;
    context.set_deadline(Soon());
    v1::AttachResponse response;
    const grpc::Status status = data_->Attach(&context, transfer, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  }
  Register("after", {Spec("t", 1, 256)}, 1);
  const std::vector<float> p = Random(256, 3, 0.02f), g = Random(256, 4, 1e-3f);
  const PushItem init[] = {{"t", Bytes(p)}};
  const PushItem grad[] = {{"t", Bytes(g)}};
  ASSERT_TRUE(transport_->Push({"after", 0, 0, v1::PUSH_KIND_INITIAL_WEIGHTS}, init, Soon()).ok());
  {
    // Job "after"'s memory is its own: no session of "first" reaches it, nor a session of
    // "first" named as "after"'s.
    v1::AttachRequest ask = open;
    ask.set_job("after");
    ask.mutable_regions();  // in place of nccl_open: one purpose
    v1::AttachResponse after;
    grpc::ClientContext context;
    context.set_deadline(Soon());
    ASSERT_TRUE(data_->Attach(&context, ask, &after).ok());
    ASSERT_GT(after.nccl().bases_size(), 0);
    for (uint64_t base : after.nccl().bases()) {
      for (uint64_t mine : opened.nccl().bases()) EXPECT_NE(base, mine) << "an allocation shared";
    }
  }
  {
    grpc::ClientContext context;
    context.set_deadline(Soon());
    v1::AttachResponse reopened;
    ASSERT_TRUE(data_->Attach(&context, open, &reopened).ok());
    span->set_address(reopened.nccl().bases(0));
    call->set_session(reopened.nccl().session());
    transfer.set_job("after");
    grpc::ClientContext across;
    across.set_deadline(Soon());
    v1::AttachResponse response;
    const grpc::Status status = data_->Attach(&across, transfer, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  }
  ASSERT_TRUE(transport_->Push({"after", 0, 0}, grad, Soon()).ok());
  ASSERT_TRUE(Commit("after", 0, 0).ok());
  Pulled pulled;
  ASSERT_TRUE(transport_->Pull(Target("after", "t", 1), Soon(), &pulled).ok());
  EXPECT_EQ(pulled.header.version(), 1);
}

}  // namespace

INSTANTIATE_TEST_SUITE_P(Nccl, TransportConformanceTest, ::testing::Values("nccl"));
INSTANTIATE_TEST_SUITE_P(Nccl, NcclTest, ::testing::Values("nccl"));

}  // namespace paramd::testing
