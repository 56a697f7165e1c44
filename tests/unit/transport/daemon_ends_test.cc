// The label a daemon counts moved bytes under (/metrics' paramd_pushed_bytes_total and
// paramd_pulled_bytes_total): the transport the trainer uses where its memory is the bytes', so
// nccl's bytes, which lie in the device memory cuda_ipc maps too, are nccl's. Daemon ends of fake
// transports, one of them a second device-memory transport.
#include <gtest/gtest.h>

#include "transport/daemon_end.h"

namespace paramd {
namespace {

class FakeEnd final : public DaemonEnd {
 public:
  explicit FakeEnd(std::optional<Memory> memory) : memory_(memory) {}
  std::string why_not_offered() const override { return std::string(); }
  std::optional<Memory> memory() const override { return memory_; }
  absl::Status Attach(const v1::AttachRequest&, v1::AttachResponse*) override {
    return absl::OkStatus();
  }

 private:
  const std::optional<Memory> memory_;
};

DaemonEnds TableOfFakes() {
  std::vector<DaemonEnds::End> ends;
  ends.push_back({"cuda_ipc", std::make_unique<FakeEnd>(Memory::kDevice)});
  ends.push_back({"shm", std::make_unique<FakeEnd>(Memory::kHost)});
  ends.push_back({"inline", std::make_unique<FakeEnd>(std::nullopt)});
  ends.push_back({"nccl", std::make_unique<FakeEnd>(Memory::kDevice)});
  return DaemonEnds::Of(std::move(ends));
}

TEST(DaemonEndsTest, BytesAreCountedUnderTheTransportTheTrainerUsesWhereItsMemoryIsTheirs) {
  const DaemonEnds ends = TableOfFakes();
  EXPECT_EQ(ends.LabelFor("nccl", Memory::kDevice), "nccl");
  EXPECT_EQ(ends.LabelFor("cuda_ipc", Memory::kDevice), "cuda_ipc");
  EXPECT_EQ(ends.LabelFor("shm", Memory::kHost), "shm");
  EXPECT_EQ(ends.LabelFor("inline", std::nullopt), "inline");
}

TEST(DaemonEndsTest, WithoutADeclaredTransportOrOneOfOtherMemoryTheMemorysFirstTransportCounts) {
  const DaemonEnds ends = TableOfFakes();
  EXPECT_EQ(ends.LabelFor("", Memory::kDevice), "cuda_ipc");
  EXPECT_EQ(ends.LabelFor("nope", Memory::kHost), "shm");
  // A rank on nccl whose bytes came in a message (initial weights, a chunk without a place).
  EXPECT_EQ(ends.LabelFor("nccl", std::nullopt), "inline");
  EXPECT_EQ(ends.LabelFor("shm", Memory::kDevice), "cuda_ipc");
}

}  // namespace
}  // namespace paramd
