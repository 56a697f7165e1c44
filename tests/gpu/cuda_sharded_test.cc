// A job sharded over three daemons on cuda:0 (DESIGN.md §7) against the same job on one cpu daemon,
// over real RPCs: every step's served bytes of every tensor, in every format, put together from the
// pieces, are bit-identical. The split tensor served fp8_tensor takes its scale from the whole
// tensor's amax, which its owners agree on between the step's launch and the serve launch of its
// fp8_tensor outputs (CudaBackend::ServeSplitPerTensor); fp8_delayed keeps the whole tensor's amax
// history. The split tensor takes the kernels' flat path (16 columns) and their tile path (128).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

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

}  // namespace
}  // namespace paramd
