// The behaviour every transport shares, written once against paramd::Transport and instantiated
// per transport in a few lines (see inline_test.cc). A real daemon runs in-process on a free
// loopback port; the transport under test moves the bytes; Commit travels over gRPC as always.
// A transport that is not viable here skips with its reason.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "paramd/v1/control.grpc.pb.h"
#include "paramd/v1/data.grpc.pb.h"
#include "server/rpc/server.h"
#include "tests/integration/daemon_process.h"
#include "transport/transport.h"

namespace paramd::testing {

// The suite's inputs, for the transports' own tests too.
inline v1::TensorSpec Spec(const std::string& name, int64_t rows, int64_t cols,
                           v1::ElementType type = v1::ELEMENT_TYPE_FP32) {
  v1::TensorSpec spec;
  spec.set_name(name);
  spec.set_rows(rows);
  spec.set_cols(cols);
  spec.set_grad_type(type);
  return spec;
}

inline std::vector<float> Random(size_t n, uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

inline std::span<const std::byte> Bytes(const std::vector<float>& v) {
  return std::as_bytes(std::span<const float>(v));
}

inline PullTarget Target(const std::string& job, const std::string& tensor, int64_t version,
                         v1::Recipe recipe = v1::RECIPE_FP32) {
  PullTarget target{job, tensor, {}, version};
  target.format.set_recipe(recipe);
  return target;
}

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
  // The daemon's /metrics ("127.0.0.1:port").
  std::string metrics_address_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Control::Stub> control_;
  std::unique_ptr<v1::Data::Stub> data_;
  std::unique_ptr<Transport> transport_;
  v1::AdamwHyperparams hyper_;
};

}  // namespace paramd::testing
