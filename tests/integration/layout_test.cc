// GetLayout over real RPCs (DESIGN.md §5, §7): a real daemon on 127.0.0.1 port 0 with the cpu
// backend answers the job's shard map, one placement per piece. With the daemon as the job's only
// owner every tensor is one piece [0, rows) at the daemon's address with device -1, the tensor and
// daemon fields filled as for clients older than the pieces, and the map a client computes itself
// from the job's tensors is the same.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "client/client.h"
#include "common/shard_map.h"
#include "server/rpc/server.h"
#include "tests/unit/server/reference_job.h"

namespace paramd {
namespace {

using testing::ForRank;
using testing::MakeSpec;

constexpr char kJob[] = "layout";

v1::DaemonConfig TestConfig() {
  v1::DaemonConfig config;
  config.set_listen("127.0.0.1:0");
  config.set_metrics_listen("");
  config.set_step_threads(1);
  config.set_log_level("error");
  return config;
}

// Panels of 128 rows and a partial one, a tensor of more than 256 rows, a 1-D tensor, one element.
v1::RegisterRequest Spec() {
  return MakeSpec(kJob, 2,
                  {{"embed", 1000, 64, v1::ELEMENT_TYPE_BF16},
                   {"w", 300, 17, v1::ELEMENT_TYPE_FP32},
                   {"b", 1, 5, v1::ELEMENT_TYPE_FP32},
                   {"s", 1, 1, v1::ELEMENT_TYPE_FP32}});
}

class LayoutTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(TestConfig());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ClientOptions options;
    options.address = server_->address();
    options.rpc_timeout = std::chrono::seconds(20);
    options.max_attempts = 1;
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    for (int r = 0; r < spec_.world_size(); ++r) {
      absl::StatusOr<v1::RegisterResponse> registered = client_->Register(ForRank(spec_, r));
      ASSERT_TRUE(registered.ok()) << registered.status();
    }
  }

  void TearDown() override {
    client_.reset();
    if (server_ != nullptr) server_->Shutdown();
  }

  const v1::RegisterRequest spec_ = Spec();
  std::unique_ptr<Server> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(LayoutTest, PlacesEveryTensorWholeOnThisDaemon) {
  absl::StatusOr<v1::GetLayoutResponse> layout = client_->GetLayout(kJob);
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->placements_size(), spec_.tensors_size());
  for (int i = 0; i < spec_.tensors_size(); ++i) {
    const v1::GetLayoutResponse::Placement& p = layout->placements(i);
    SCOPED_TRACE(p.ShortDebugString());
    EXPECT_EQ(p.tensor(), spec_.tensors(i).name());
    EXPECT_EQ(p.daemon(), server_->address());
    EXPECT_EQ(p.device(), kCpuDevice);
    EXPECT_EQ(p.row_begin(), 0);
    EXPECT_EQ(p.row_end(), spec_.tensors(i).rows());
  }
}

TEST_F(LayoutTest, AnswersTheShardMapAClientComputes) {
  absl::StatusOr<v1::GetLayoutResponse> layout = client_->GetLayout(kJob);
  ASSERT_TRUE(layout.ok()) << layout.status();
  absl::StatusOr<ShardMap> map =
      ComputeShardMap(JobTensorShapes(spec_.tensors()), {Owner{server_->address(), kCpuDevice}});
  ASSERT_TRUE(map.ok()) << map.status();
  int placement = 0;
  for (int i = 0; i < spec_.tensors_size(); ++i) {
    for (const ShardPiece& piece : map->tensors[i]) {
      ASSERT_LT(placement, layout->placements_size());
      const v1::GetLayoutResponse::Placement& p = layout->placements(placement++);
      EXPECT_EQ(p.tensor(), spec_.tensors(i).name());
      EXPECT_EQ(p.daemon(), map->owners[piece.owner].daemon);
      EXPECT_EQ(p.device(), map->owners[piece.owner].device);
      EXPECT_EQ(p.row_begin(), piece.row_begin);
      EXPECT_EQ(p.row_end(), piece.row_end);
    }
  }
  EXPECT_EQ(placement, layout->placements_size());
}

}  // namespace
}  // namespace paramd
