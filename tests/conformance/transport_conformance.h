// The behaviour every transport shares, written once against paramd::Transport and instantiated
// per transport in a few lines (see inline_test.cc). A real daemon runs in-process on a free
// loopback port; the transport under test moves the bytes; Commit travels over gRPC as always.
// A transport that is not viable here skips with its reason.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "paramd/v1/control.grpc.pb.h"
#include "paramd/v1/data.grpc.pb.h"
#include "server/server.h"
#include "tests/integration/daemon_process.h"
#include "transport/transport.h"

namespace paramd::testing {

class TransportConformanceTest : public ::testing::TestWithParam<std::string> {
 protected:
  static constexpr int64_t kChunkBytes = 64 << 10;

  void SetUp() override;
  void TearDown() override;
  // nccl: starts the daemon's process, listening at `listen`; address_ is empty where it did not.
  void StartDaemonProcess(const std::string& listen);
  void Connect();  // the channel, stubs and the transport under test, to address_

  // Registers `job` (one rank per entry of `ranks`, world size ranks.size()).
  void Register(const std::string& job, const std::vector<v1::TensorSpec>& tensors, int world_size,
                const std::vector<v1::ServeFormat>& serve = {});
  absl::Status Commit(const std::string& job, int rank, int64_t step, double grad_scale = 1.0);
  Deadline Soon() const;
  // The leases the daemon counts for `job` (-1 when Status fails).
  int64_t Leases(const std::string& job);
  // Waits up to 10 s for the job's lease count to be `count` (a Release is not waited for).
  bool LeasesReach(const std::string& job, int64_t count);
  // Stops the daemon and starts another on the same address (jobs gone, as after a restart
  // without a checkpoint); the channel and the transport under test stay.
  void RestartServer();

  v1::DaemonConfig config_;
  std::unique_ptr<Server> server_;
  // nccl: the daemon runs in a process of its own (its two ends must be two processes).
  std::unique_ptr<DaemonProcess> process_;
  std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Control::Stub> control_;
  std::unique_ptr<v1::Data::Stub> data_;
  std::unique_ptr<Transport> transport_;
  v1::AdamwHyperparams hyper_;
};

}  // namespace paramd::testing
