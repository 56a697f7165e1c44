// The shm daemon end offers its transport by what the daemon says of its backend
// (TransportHost::host_memory_backend), not by the backend's name: a fake host stands in for the
// daemon.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "transport/shm/shm.h"

namespace paramd {
namespace {

class FakeHost final : public TransportHost {
 public:
  FakeHost(std::string backend, bool host_memory)
      : backend_(std::move(backend)), host_memory_(host_memory) {
    config_.set_shared_memory(true);
    config_.set_shm_segment_bytes(4 << 20);
  }
  const v1::DaemonConfig& config() const override { return config_; }
  uint64_t instance() const override { return 0x5eed; }
  const std::string& backend_name() const override { return backend_; }
  bool host_memory_backend() const override { return host_memory_; }
  std::optional<DeviceExports> device_exports(const std::string&) const override {
    return std::nullopt;
  }
  absl::StatusOr<SlotPlaces> SlotsForStep(const std::string&, int32_t, int64_t, Memory) override {
    return absl::UnimplementedError("not in this test");
  }
  absl::Status DeclareTransport(const v1::AttachRequest&) override { return absl::OkStatus(); }

 private:
  v1::DaemonConfig config_;
  const std::string backend_;
  const bool host_memory_;
};

TEST(ShmDaemonEndTest, IsOfferedWhereTheBackendKeepsItsBytesInHostMemoryWhateverItsName) {
  FakeHost host("some_host_backend", /*host_memory=*/true);
  const std::unique_ptr<DaemonEnd> end = MakeShmDaemonEnd(host);
  EXPECT_EQ(end->why_not_offered(), "");
  EXPECT_EQ(end->memory(), Memory::kHost);
  EXPECT_NE(end->JobBuffers("job", 1 << 20), nullptr);
}

TEST(ShmDaemonEndTest, IsNotOfferedWhereTheBackendKeepsItsBytesOnAGpuWhateverItsName) {
  FakeHost host("cpu_named_but_on_a_gpu", /*host_memory=*/false);
  const std::unique_ptr<DaemonEnd> end = MakeShmDaemonEnd(host);
  EXPECT_FALSE(end->offered());
  EXPECT_NE(end->why_not_offered().find("cpu_named_but_on_a_gpu"), std::string::npos)
      << end->why_not_offered();
  EXPECT_EQ(end->JobBuffers("job", 1 << 20), nullptr);
}

}  // namespace
}  // namespace paramd
