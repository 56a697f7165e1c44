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
#include <map>
#include <memory>
#include <string>
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
