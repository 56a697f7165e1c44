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
  explicit FakeEnd(std::optional<Memory> memory, std::string why_not = "")
      : memory_(memory), why_not_(std::move(why_not)) {}
  std::string why_not_offered() const override { return why_not_; }
  std::optional<Memory> memory() const override { return memory_; }
  absl::Status Attach(const v1::AttachRequest&, v1::AttachResponse*) override {
    return absl::OkStatus();
  }

 private:
  const std::optional<Memory> memory_;
  const std::string why_not_;
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

// A transport this daemon does not offer is no fallback, wherever it stands in the table: a build
// without NCCL lists an `nccl` end of no memory before inline, and the bytes a pull streams in
// messages are still inline's. (No rank declares a transport the daemon does not offer: Attach
// refuses it.)
TEST(DaemonEndsTest, ATransportNotOfferedCountsNothing) {
  std::vector<DaemonEnds::End> list;
  list.push_back({"cuda_ipc", std::make_unique<FakeEnd>(Memory::kDevice, "no GPU")});
  list.push_back({"nccl", std::make_unique<FakeEnd>(std::nullopt, "built without NCCL")});
  list.push_back({"shm", std::make_unique<FakeEnd>(Memory::kHost)});
  list.push_back({"inline", std::make_unique<FakeEnd>(std::nullopt)});
  const DaemonEnds ends = DaemonEnds::Of(std::move(list));
  EXPECT_EQ(ends.NameOf(std::nullopt), "inline");
  EXPECT_EQ(ends.LabelFor("", std::nullopt), "inline");
  EXPECT_EQ(ends.LabelFor("shm", std::nullopt), "inline");
  EXPECT_EQ(ends.LabelFor("shm", Memory::kHost), "shm");
}

}  // namespace
}  // namespace paramd
