// shm with the trainer's GPU (ClientOptions::cuda_device, the host tier): gradients in GPU memory
// go by DMA straight into the daemon's slots and train bit-identically to host gradients; given
// their ready event, their copies go while later work on the trainer's stream is still held; the
// daemon's segments are page-locked once, let go of when the daemon restarts (renewed for the new
// one) and when the client goes; without cuda_device nothing is page-locked. A cpu daemon in this
// process, on cuda:0's host.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "server/rpc/server.h"
#include "tests/gpu/gpu_test_util.h"
#include "transport/shm/gpu_copies.h"

namespace paramd {
namespace {

using std::chrono::milliseconds;
constexpr int kRows = 256;
constexpr int kCols = 512;  // 512 KiB of fp32 a tensor

v1::RegisterRequest JobSpec(const std::string& job) {
  v1::RegisterRequest request;
  request.set_job(job);
  request.set_world_size(1);
  for (const char* name : {"a", "b"}) {
    v1::TensorSpec* t = request.add_tensors();
    t->set_name(name);
    t->set_rows(kRows);
    t->set_cols(kCols);
    t->set_grad_type(v1::ELEMENT_TYPE_FP32);
  }
  v1::AdamwHyperparams* hyper = request.mutable_hyperparams();
  hyper->set_lr(1e-2);
  hyper->set_beta1(0.9);
  hyper->set_beta2(0.999);
  hyper->set_eps(1e-8);
  hyper->set_weight_decay(0.01);
  return request;
}

std::vector<float> Values(int seed) {
  std::vector<float> v(kRows * kCols);
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<float>((static_cast<int>(i * 7919 + seed * 104729) % 2001) - 1000) * 1e-4f;
  }
  return v;
}

class ShmGpuTest : public kernels::testing::CudaTest {
 protected:
  void SetUp() override {
    kernels::testing::CudaTest::SetUp();
    if (IsSkipped()) return;
    ASSERT_NO_FATAL_FAILURE(StartServer("127.0.0.1:0"));
  }
  void TearDown() override {
    clients_.clear();
    if (server_) server_->Shutdown();
    kernels::testing::CudaTest::TearDown();
  }

  void StartServer(const std::string& listen) {
    v1::DaemonConfig config;
    config.set_listen(listen);
    config.set_metrics_listen("");
    config.set_step_threads(2);
    config.set_log_level("warning");
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(config);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  // A client over shm; with `gpu`, the trainer's GPU is cuda:0 and its stream stream_.
  Client* Connect(bool gpu) {
    ClientOptions options;
    options.address = server_->address();
    options.transport = "shm";
    if (gpu) {
      options.cuda_device = 0;
      options.cuda_stream = reinterpret_cast<uintptr_t>(stream_);
    }
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    if (!client.ok()) return nullptr;
    clients_.push_back(*std::move(client));
    return clients_.back().get();
  }

  static void StartJob(Client& client, const std::string& job) {
    absl::StatusOr<v1::RegisterResponse> registered = client.Register(JobSpec(job));
    ASSERT_TRUE(registered.ok()) << registered.status();
    ASSERT_EQ(client.transport_name(), "shm");
    const std::vector<float> a = Values(1), b = Values(2);
    const PushItem items[] = {{"a", std::as_bytes(std::span<const float>(a))},
                              {"b", std::as_bytes(std::span<const float>(b))}};
    ASSERT_TRUE(client.UploadInitialWeights(job, items).ok());
  }

  // Pushes step `step`'s gradients of job `job` from `a` and `b` (host or GPU memory), commits,
  // and returns the served fp32 bytes of version step + 1 of both tensors.
  static std::vector<std::byte> Step(Client& client, const std::string& job, int64_t step,
                                     const void* a, const void* b) {
    const size_t bytes = kRows * kCols * sizeof(float);
    const PushItem items[] = {{"a", {static_cast<const std::byte*>(a), bytes}},
                              {"b", {static_cast<const std::byte*>(b), bytes}}};
    const absl::Status pushed = client.PushGradients(job, 0, step, items);
    EXPECT_TRUE(pushed.ok()) << pushed;
    return CommitAndPull(client, job, step);
  }

  // Commits step `step` of job `job` and returns the served fp32 bytes of version step + 1 of both
  // tensors.
  static std::vector<std::byte> CommitAndPull(Client& client, const std::string& job,
                                              int64_t step) {
    const absl::StatusOr<v1::CommitResponse> committed = client.Commit(job, 0, step);
    EXPECT_TRUE(committed.ok()) << committed.status();
    std::vector<std::byte> out;
    for (const char* name : {"a", "b"}) {
      Pulled pulled;
      const absl::Status s = client.Pull({job, name, {}, step + 1}, milliseconds(30000), &pulled);
      EXPECT_TRUE(s.ok()) << s;
      out.insert(out.end(), pulled.data.begin(), pulled.data.end());
    }
    return out;
  }

  // Gradients of step `step` in GPU memory, written on stream_ by a copy the push must wait for
  // (queued behind a long memset of a scratch buffer, as if backward were still running).
  void GpuGradients(int64_t step, kernels::testing::DeviceBuffer& a,
                    kernels::testing::DeviceBuffer& b, kernels::testing::DeviceBuffer& scratch) {
    const size_t bytes = kRows * kCols * sizeof(float);
    for (int i = 0; i < 8; ++i) {
      PARAMD_CUDA_OK(cudaMemsetAsync(scratch.get(), i, scratch.bytes(), stream_));
    }
    const std::vector<float> ga = Values(10 + static_cast<int>(step));
    const std::vector<float> gb = Values(20 + static_cast<int>(step));
    host_a_ = ga;
    host_b_ = gb;
    PARAMD_CUDA_OK(
        cudaMemcpyAsync(a.get(), host_a_.data(), bytes, cudaMemcpyHostToDevice, stream_));
    PARAMD_CUDA_OK(
        cudaMemcpyAsync(b.get(), host_b_.data(), bytes, cudaMemcpyHostToDevice, stream_));
  }

  std::unique_ptr<Server> server_;
  std::vector<std::unique_ptr<Client>> clients_;
  std::vector<float> host_a_, host_b_;
};

TEST_F(ShmGpuTest, GpuGradientsGoByDmaAndTrainBitIdenticallyToHostOnes) {
  Client* gpu = Connect(true);
  Client* host = Connect(false);
  ASSERT_NE(gpu, nullptr);
  ASSERT_NE(host, nullptr);
  ASSERT_NO_FATAL_FAILURE(StartJob(*gpu, "dma"));
  ASSERT_NO_FATAL_FAILURE(StartJob(*host, "host"));
  ASSERT_EQ(gpu->transport_traits().size(), 1u);
  EXPECT_TRUE(gpu->transport_traits()[0].traits.reads_device_memory);
  EXPECT_FALSE(host->transport_traits()[0].traits.reads_device_memory);
  const size_t bytes = kRows * kCols * sizeof(float);
  kernels::testing::DeviceBuffer a(bytes), b(bytes), scratch(256 << 20);
  for (int64_t step = 0; step < 3; ++step) {
    ASSERT_NO_FATAL_FAILURE(GpuGradients(step, a, b, scratch));
    // Pushed without synchronizing: the DMA waits for stream_ on the device.
    const std::vector<std::byte> by_dma = Step(*gpu, "dma", step, a.get(), b.get());
    const std::vector<std::byte> by_host =
        Step(*host, "host", step, host_a_.data(), host_b_.data());
    ASSERT_EQ(by_dma.size(), 2 * bytes);
    EXPECT_TRUE(by_dma == by_host) << "step " << step;
  }
  // A mixed push: one gradient in GPU memory, one in host memory.
  ASSERT_NO_FATAL_FAILURE(GpuGradients(3, a, b, scratch));
  const std::vector<std::byte> mixed = Step(*gpu, "dma", 3, a.get(), host_b_.data());
  const std::vector<std::byte> by_host = Step(*host, "host", 3, host_a_.data(), host_b_.data());
  EXPECT_TRUE(mixed == by_host);
}

TEST_F(ShmGpuTest, GivenTheGradientsReadyEventTheCopiesDoNotWaitForLaterWorkOnTheStream) {
  // Backward goes on after a gradient was written: here a host function holds the trainer's stream
  // until released. A push given the event recorded right after the gradients copies and marks
  // them meanwhile (paramd.torch records one per bucket in backward), and trains as host
  // gradients do. Waiting for the stream instead, the push would return only at the release.
  Client* gpu = Connect(true);
  Client* host = Connect(false);
  ASSERT_NE(gpu, nullptr);
  ASSERT_NE(host, nullptr);
  ASSERT_NO_FATAL_FAILURE(StartJob(*gpu, "dma"));
  ASSERT_NO_FATAL_FAILURE(StartJob(*host, "host"));
  const size_t bytes = kRows * kCols * sizeof(float);
  kernels::testing::DeviceBuffer a(bytes), b(bytes), scratch(1 << 20);
  ASSERT_NO_FATAL_FAILURE(GpuGradients(0, a, b, scratch));
  cudaEvent_t ready = nullptr;
  PARAMD_CUDA_OK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  PARAMD_CUDA_OK(cudaEventRecord(ready, stream_));
  std::atomic<bool> released{false};
  PARAMD_CUDA_OK(cudaLaunchHostFunc(
      stream_,
      [](void* flag) {
        while (!static_cast<std::atomic<bool>*>(flag)->load()) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      },
      &released));
  // Released after the push returned, or after 20 s if it waits for the stream (so the test
  // fails rather than hangs).
  absl::Notification pushed_note;
  std::thread valve([&] {
    pushed_note.WaitForNotificationWithTimeout(absl::Seconds(20));
    released = true;
  });
  const PushItem items[] = {{"a", {static_cast<const std::byte*>(a.get()), bytes}},
                            {"b", {static_cast<const std::byte*>(b.get()), bytes}}};
  const absl::Status pushed =
      gpu->PushGradients("dma", 0, 0, items, reinterpret_cast<uintptr_t>(ready));
  const bool while_held = !released.load();
  pushed_note.Notify();
  valve.join();
  PARAMD_CUDA_OK(cudaStreamSynchronize(stream_));
  PARAMD_CUDA_OK(cudaEventDestroy(ready));
  ASSERT_TRUE(pushed.ok()) << pushed;
  EXPECT_TRUE(while_held) << "the push waited for the work queued after the ready event";
  const std::vector<std::byte> by_dma = CommitAndPull(*gpu, "dma", 0);
  const std::vector<std::byte> by_host = Step(*host, "host", 0, host_a_.data(), host_b_.data());
  ASSERT_EQ(by_dma.size(), 2 * bytes);
  EXPECT_TRUE(by_dma == by_host);
}

TEST_F(ShmGpuTest, SegmentsArePageLockedOnceRenewedAfterARestartAndLetGoWithTheClient) {
  ASSERT_EQ(GpuCopies::PageLockedBytes(), 0);
  {
    Client* host = Connect(false);
    ASSERT_NO_FATAL_FAILURE(StartJob(*host, "host"));
    const std::vector<float> g = Values(3);
    Step(*host, "host", 0, g.data(), g.data());
    EXPECT_EQ(GpuCopies::PageLockedBytes(), 0) << "without cuda_device nothing is page-locked";
    clients_.clear();
  }
  Client* gpu = Connect(true);
  ASSERT_NO_FATAL_FAILURE(StartJob(*gpu, "j"));
  const size_t bytes = kRows * kCols * sizeof(float);
  kernels::testing::DeviceBuffer a(bytes), b(bytes), scratch(1 << 20);
  ASSERT_NO_FATAL_FAILURE(GpuGradients(0, a, b, scratch));
  const std::vector<std::byte> first = Step(*gpu, "j", 0, a.get(), b.get());
  const int64_t locked = GpuCopies::PageLockedBytes();
  EXPECT_GT(locked, static_cast<int64_t>(2 * bytes)) << "the slots and served bytes' segments";
  // The same step again on a new daemon at the same address: the old segments' pages are let go,
  // the new ones locked, and the step trains as before.
  const std::string address = server_->address();
  server_->Shutdown();
  server_.reset();
  ASSERT_NO_FATAL_FAILURE(StartServer(address));
  ASSERT_NO_FATAL_FAILURE(StartJob(*gpu, "j"));
  const std::vector<std::byte> again = Step(*gpu, "j", 0, a.get(), b.get());
  EXPECT_TRUE(again == first);
  // The new daemon's segments are locked (the probe's segment may or may not be mapped again):
  // never the old ones' pages on top.
  EXPECT_GT(GpuCopies::PageLockedBytes(), static_cast<int64_t>(2 * bytes));
  EXPECT_LE(GpuCopies::PageLockedBytes(), locked) << "the old daemon's segments stayed locked";
  clients_.clear();
  EXPECT_EQ(GpuCopies::PageLockedBytes(), 0) << "page-locked memory outlived its client";
}

}  // namespace
}  // namespace paramd
