// A job sharded over three daemons on cuda:0 (DESIGN.md §7) against the same job on one cpu daemon,
// over real RPCs: every step's served bytes of every tensor, in every format, put together from the
// pieces, are bit-identical. The split tensor served fp8_tensor takes its scale from the whole
// tensor's amax, which its owners agree on between the step's launch and the serve launch of its
// fp8_tensor outputs (CudaBackend::ServeSplitPerTensor); fp8_delayed keeps the whole tensor's amax
// history. The split tensor takes the kernels' flat path (16 columns) and their tile path (128).
// One daemon of several backends (cpu:0, cpu:1 and cuda:0) serves the same bytes, and "cuda:all"
// holds one backend per GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "kernels/cuda_step.h"
#include "tests/integration/sharded_run.h"

namespace paramd {
namespace {

using namespace sharded_run;

struct Case {
  v1::MasterType master;
  int64_t embed_cols;
};

class CudaShardedTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    std::string why;
    if (!kernels::CudaDeviceAvailable(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
    ASSERT_TRUE(d_.Start("cpu", {{"cuda:0", 30000}, {"cuda:0", 30000}, {"cuda:0", 30000}}));
  }

  ShardedDaemons d_;
};

TEST_P(CudaShardedTest, EveryStepServesTheCpuDaemonsBytesInEveryFormat) {
  ExpectShardedRunMatchesOneDaemon(Spec(GetParam().master, GetParam().embed_cols),
                                   d_.single->address(), d_.sharded[1]->address(), d_.names, 12,
                                   StatusOf);
}

INSTANTIATE_TEST_SUITE_P(
    Masters, CudaShardedTest,
    ::testing::Values(Case{v1::MASTER_TYPE_FP32, 16}, Case{v1::MASTER_TYPE_FP32, 128},
                      Case{v1::MASTER_TYPE_BF16_REMAINDER, 128}, Case{v1::MASTER_TYPE_FP16, 128}),
    [](const ::testing::TestParamInfo<Case>& info) {
      return absl::StrCat(v1::MasterType_Name(info.param.master), "_cols", info.param.embed_cols);
    });

// One job over a cpu daemon and two cuda:0 daemons: the same bytes again, and every daemon's
// GetLayout gives each owner its own device.
TEST(CudaShardedMixedTest, ACpuDaemonAndTwoCudaDaemonsServeTheCpuDaemonsBytes) {
  std::string why;
  if (!kernels::CudaDeviceAvailable(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  ShardedDaemons d;
  ASSERT_TRUE(d.Start("cpu", {{"cpu", 30000}, {"cuda:0", 30000}, {"cuda:0", 30000}}));
  std::map<std::string, int> devices;
  for (const std::unique_ptr<Server>& server : d.sharded) {
    devices[server->daemon().advertised_address()] =
        server->daemon().config().backend() == "cpu" ? -1 : 0;
  }
  ExpectShardedRunMatchesOneDaemon(Spec(v1::MASTER_TYPE_FP32, 128), d.single->address(),
                                   d.sharded[0]->address(), d.names, 12, StatusOf);
  for (const std::unique_ptr<Server>& server : d.sharded) {
    std::unique_ptr<Client> client = Connect(server->address(), {}, 5);
    ASSERT_NE(client, nullptr);
    absl::StatusOr<v1::GetLayoutResponse> layout = client->GetLayout(kJob);
    ASSERT_TRUE(layout.ok()) << layout.status();
    for (const v1::GetLayoutResponse::Placement& p : layout->placements()) {
      EXPECT_EQ(p.device(), devices.at(p.daemon())) << p.ShortDebugString();
    }
  }
}

// One daemon of three backends, two cpu ones and cuda:0 (DaemonConfig.backend), a job on its
// address alone sharded over them: the cpu daemon's bytes again, and each owner's own device in
// GetLayout.
TEST(CudaShardedMixedTest, ADaemonOfCpuAndCudaBackendsServesTheCpuDaemonsBytes) {
  std::string why;
  if (!kernels::CudaDeviceAvailable(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  std::unique_ptr<Server> single = StartDaemon(30000);
  std::unique_ptr<Server> daemon = StartDaemon(30000, "", "cpu:0,cpu:1,cuda:0");
  ASSERT_TRUE(single != nullptr && daemon != nullptr);
  ASSERT_EQ(daemon->backends(), 3u);
  std::vector<std::string> names = daemon->daemon().backend_addresses();
  std::sort(names.begin(), names.end());
  ExpectShardedRunMatchesOneDaemon(Spec(v1::MASTER_TYPE_FP32, 128), single->address(),
                                   daemon->address(), names, 12, StatusOf);
  std::unique_ptr<Client> client = Connect(daemon->address(), {}, 5);
  ASSERT_NE(client, nullptr);
  absl::StatusOr<v1::GetLayoutResponse> layout = client->GetLayout(kJob);
  ASSERT_TRUE(layout.ok()) << layout.status();
  for (const v1::GetLayoutResponse::Placement& p : layout->placements()) {
    EXPECT_EQ(p.device(), absl::EndsWith(p.daemon(), "/cuda:0") ? 0 : -1) << p.ShortDebugString();
  }
  daemon->Shutdown();
  single->Shutdown();
}

// Lent gradients (ClientOptions::lend_gradients) whose bytes the trainer's stream writes only after
// a 300 ms wait, lent at once: the step reads them only once that stream's work ran, on one cuda:0
// daemon (the step decided on the device) and on a job sharded over two (decided on the host, the
// daemons agreeing first), so every step serves a cpu daemon's bytes of the same gradients. Each
// step's memory first holds other bytes, which a read that did not wait would take.
TEST(CudaLentGradientsTest, AStepReadsLentGradientsOnlyOnceTheTrainersStreamWroteThem) {
  std::string why;
  if (!kernels::CudaDeviceAvailable(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  ShardedDaemons d;
  ASSERT_TRUE(d.Start("cpu", {{"cuda:0", 30000}, {"cuda:0", 30000}}));
  const v1::RegisterRequest spec = testing::MakeSpec(
      "late", 1, {{"a", 512, 64, v1::ELEMENT_TYPE_FP32}, {"b", 300, 16, v1::ELEMENT_TYPE_FP32}});
  const std::vector<std::vector<float>> weights = RandomWeights(spec, 7);
  const std::vector<std::vector<std::string>> sharded_list = {{}, d.names};
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (const std::vector<std::string>& daemons : sharded_list) {
    SCOPED_TRACE(daemons.empty() ? "one cuda:0 daemon" : "sharded over two cuda:0 daemons");
    std::unique_ptr<Client> reference = Connect(d.single->address(), {}, 5);
    ClientOptions options;
    options.address = d.sharded[0]->address();
    options.daemons = daemons;
    options.transport = "cuda_ipc";
    options.rpc_timeout = 20s;
    options.cuda_stream = reinterpret_cast<uintptr_t>(stream);
    options.lend_gradients = true;
    absl::StatusOr<std::unique_ptr<Client>> lending = Client::Connect(options);
    ASSERT_TRUE(lending.ok()) << lending.status();
    ASSERT_NE(reference, nullptr);
    std::vector<PushItem> initial;
    for (int i = 0; i < spec.tensors_size(); ++i) {
      initial.push_back({spec.tensors(i).name(),
                         std::as_bytes(std::span<const float>(weights[static_cast<size_t>(i)]))});
    }
    for (Client* client : {reference.get(), lending->get()}) {
      absl::StatusOr<v1::RegisterResponse> registered = client->Register(ForRank(spec, 0));
      ASSERT_TRUE(registered.ok()) << registered.status();
      ASSERT_TRUE(client->UploadInitialWeights("late", initial).ok());
    }
    EXPECT_EQ((*lending)->transport_name().find("inline"), std::string::npos)
        << (*lending)->transport_name();
    // Per tensor, its gradient's device memory and the pinned host bytes the stream copies in.
    std::vector<void*> device(2, nullptr), pinned(2, nullptr);
    for (int i = 0; i < 2; ++i) {
      const size_t bytes = static_cast<size_t>(spec.tensors(i).rows() * spec.tensors(i).cols()) * 4;
      ASSERT_EQ(cudaMalloc(&device[static_cast<size_t>(i)], bytes), cudaSuccess);
      ASSERT_EQ(cudaMallocHost(&pinned[static_cast<size_t>(i)], bytes), cudaSuccess);
    }
    for (int64_t step = 0; step < 3; ++step) {
      SCOPED_TRACE(absl::StrCat("step ", step));
      const StepGradients grads = RandomGradients(spec, 300 + static_cast<uint64_t>(step));
      const StepGradients stale = RandomGradients(spec, 900 + static_cast<uint64_t>(step));
      std::vector<PushItem> lent, copied;
      for (int i = 0; i < 2; ++i) {
        const size_t k = static_cast<size_t>(i);
        const std::string& bytes = grads[k][0];
        ASSERT_EQ(cudaMemcpy(device[k], stale[k][0].data(), bytes.size(), cudaMemcpyHostToDevice),
                  cudaSuccess);
        std::memcpy(pinned[k], bytes.data(), bytes.size());
        lent.push_back(
            {spec.tensors(i).name(),
             std::span<const std::byte>(static_cast<const std::byte*>(device[k]), bytes.size())});
        copied.push_back({spec.tensors(i).name(), AsBytes(bytes)});
      }
      // The trainer's stream writes the gradients 300 ms from now (backward, late).
      ASSERT_EQ(cudaLaunchHostFunc(
                    stream, [](void*) { std::this_thread::sleep_for(300ms); }, nullptr),
                cudaSuccess);
      for (int i = 0; i < 2; ++i) {
        const size_t k = static_cast<size_t>(i);
        ASSERT_EQ(cudaMemcpyAsync(device[k], pinned[k], grads[k][0].size(), cudaMemcpyHostToDevice,
                                  stream),
                  cudaSuccess);
      }
      ASSERT_TRUE((*lending)->PushGradients("late", 0, step, lent).ok());
      ASSERT_TRUE((*lending)->Commit("late", 0, step).ok());
      ASSERT_TRUE(reference->PushGradients("late", 0, step, copied).ok());
      ASSERT_TRUE(reference->Commit("late", 0, step).ok());
      for (int i = 0; i < 2; ++i) {
        PullTarget target{"late", spec.tensors(i).name(), ServeFormatOf(v1::RECIPE_FP32), step + 1};
        Pulled want, got;
        ASSERT_TRUE(reference->Pull(target, 20s, &want).ok());
        ASSERT_TRUE((*lending)->Pull(target, 20s, &got).ok());
        EXPECT_EQ(got.header.version(), step + 1);
        ASSERT_EQ(got.data.size(), want.data.size());
        EXPECT_TRUE(std::memcmp(got.data.data(), want.data.data(), want.data.size()) == 0)
            << "tensor " << spec.tensors(i).name() << ": the step read other bytes than the "
            << "gradients the trainer's stream wrote";
      }
      // The pull ordered nothing on this test's host: the lent memory is reused once the stream
      // ran.
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    }
    ASSERT_TRUE((*lending)->DeleteJob("late").ok());
    ASSERT_TRUE(reference->DeleteJob("late").ok());
    for (void* p : device) cudaFree(p);
    for (void* p : pinned) cudaFreeHost(p);
  }
  cudaStreamDestroy(stream);
}

// "cuda:all": one cuda:N backend per GPU the process sees.
TEST(CudaAllGpusTest, ADaemonOfEveryGpuHoldsABackendPerGpu) {
  std::string why;
  if (!kernels::CudaDeviceAvailable(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  std::unique_ptr<Server> daemon = StartDaemon(30000, "", "cuda:all");
  ASSERT_NE(daemon, nullptr);
  ASSERT_EQ(daemon->backends(), static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    EXPECT_EQ(daemon->daemon(static_cast<size_t>(i)).backend_name(), absl::StrCat("cuda:", i));
  }
  daemon->Shutdown();
}

}  // namespace
}  // namespace paramd
