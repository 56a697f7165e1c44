// A job sharded over three real daemons against the same job on one daemon, over real RPCs: the
// parts shared by tests/integration/sharded_job_test.cc (cpu daemons) and
// tests/gpu/cuda_sharded_test.cc (cuda:0 daemons).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "common/shard_map.h"
#include "server/registration.h"
#include "server/rpc/server.h"
#include "tests/unit/server/reference_job.h"

namespace paramd::sharded_run {

using namespace std::chrono_literals;
using testing::ForRank;
using testing::MakeSpec;
using testing::RandomGradients;
using testing::RandomWeights;
using testing::ServeFormatOf;
using testing::StepGradients;
using testing::ToBytes;

inline constexpr char kJob[] = "sharded";
inline constexpr int kWorld = 2;

// "embed" (600 x 16) weighs 3/4 of the job and is split over the three daemons; the others stay
// whole, one on each daemon. fp8 exp_avg rounded stochastically, fp16 exp_avg_sq, clipping on.
// `embed_cols`: 16 takes the GPU kernels' flat path, 128 their tile path.
inline v1::RegisterRequest Spec(v1::MasterType master = v1::MASTER_TYPE_FP32,
                                int64_t embed_cols = 16) {
  v1::RegisterRequest spec = MakeSpec(kJob, kWorld,
                                      {{"embed", 600, embed_cols, v1::ELEMENT_TYPE_FP32},
                                       {"w", 64, 32, v1::ELEMENT_TYPE_BF16},
                                       {"v", 130, 8, v1::ELEMENT_TYPE_FP32},
                                       {"b", 1, 10, v1::ELEMENT_TYPE_FP32}});
  v1::StatePolicy* policy = spec.mutable_state_policy();
  policy->set_master(master);
  policy->set_exp_avg(v1::MOMENT_TYPE_FP8);
  policy->set_exp_avg_rounding(v1::ROUNDING_STOCHASTIC);
  policy->set_exp_avg_sq(v1::MOMENT_TYPE_FP16);
  policy->set_exp_avg_sq_rounding(v1::ROUNDING_STOCHASTIC);
  spec.set_max_grad_norm(0.05);
  spec.clear_serve();
  *spec.add_serve() = ServeFormatOf(v1::RECIPE_FP32, v1::DIRECTION_ROWWISE);
  *spec.add_serve() = ServeFormatOf(v1::RECIPE_BF16, v1::DIRECTION_ROWWISE);
  *spec.add_serve() = ServeFormatOf(v1::RECIPE_FP8_TENSOR, v1::DIRECTION_ROWWISE);
  *spec.add_serve() = ServeFormatOf(v1::RECIPE_FP8_TENSOR, v1::DIRECTION_COLUMNWISE);
  *spec.add_serve() = ServeFormatOf(v1::RECIPE_FP8_DELAYED, v1::DIRECTION_ROWWISE);
  *spec.add_serve() = ServeFormatOf(v1::RECIPE_FP8_BLOCK, v1::DIRECTION_COLUMNWISE);
  *spec.add_serve() = ServeFormatOf(v1::RECIPE_MXFP8, v1::DIRECTION_ROWWISE);
  return spec;
}

// A daemon on 127.0.0.1 port 0 with `backend`, checkpointing under `checkpoint_dir` and taking the
// tokens of `token_file` where they are given.
inline std::unique_ptr<Server> StartDaemon(int peer_timeout_ms,
                                           const std::string& checkpoint_dir = "",
                                           const std::string& backend = "cpu",
                                           const std::string& token_file = "") {
  v1::DaemonConfig config;
  config.set_listen("127.0.0.1:0");
  config.set_backend(backend);
  config.set_metrics_listen("");
  config.set_step_threads(1);
  config.set_peer_timeout_ms(peer_timeout_ms);
  config.set_log_level("error");
  if (!checkpoint_dir.empty()) config.set_checkpoint_dir(checkpoint_dir);
  config.set_token_file(token_file);
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(config);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

// The daemons of a comparison: `single` for the one-daemon job, and one per (backend,
// peer_timeout_ms) of `sharded` for the sharded job, with their advertised addresses sorted (the
// job's daemon list); shut down when it goes.
struct ShardedDaemons {
  ShardedDaemons() = default;
  ShardedDaemons(const ShardedDaemons&) = delete;
  ShardedDaemons& operator=(const ShardedDaemons&) = delete;
  ~ShardedDaemons() {
    for (auto& d : sharded) {
      if (d != nullptr) d->Shutdown();
    }
    if (single != nullptr) single->Shutdown();
  }
  // False where a daemon did not start (the failure that says why is already reported).
  bool Start(const std::string& single_backend,
             const std::vector<std::pair<std::string, int>>& backends) {
    single = StartDaemon(30000, "", single_backend);
    if (single == nullptr) return false;
    for (const auto& [backend, peer_timeout_ms] : backends) {
      sharded.push_back(StartDaemon(peer_timeout_ms, "", backend));
      if (sharded.back() == nullptr) return false;
      names.push_back(sharded.back()->daemon().advertised_address());
    }
    std::sort(names.begin(), names.end());
    return true;
  }

  std::unique_ptr<Server> single;
  std::vector<std::unique_ptr<Server>> sharded;
  std::vector<std::string> names;
};

inline std::unique_ptr<Client> Connect(const std::string& address, std::vector<std::string> daemons,
                                       int attempts, const std::string& transport = "inline") {
  ClientOptions options;
  options.address = address;
  options.daemons = std::move(daemons);
  options.transport = transport;
  options.rpc_timeout = 20s;
  options.max_attempts = attempts;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

inline std::span<const std::byte> AsBytes(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

// One job on a set of daemons, driven by one client per rank.
class Trainers {
 public:
  // `attempts`: ClientOptions::max_attempts. A split tensor's version 0 is made after its upload
  // returns: a push before it is UNAVAILABLE, and retried.
  Trainers(const v1::RegisterRequest& spec, const std::string& address,
           const std::vector<std::string>& daemons, int attempts = 20,
           const std::string& transport = "inline")
      : spec_(spec) {
    for (int r = 0; r < kWorld; ++r) {
      clients_.push_back(Connect(address, daemons, attempts, transport));
      if (clients_.back() == nullptr) return;
      absl::StatusOr<v1::RegisterResponse> registered = clients_.back()->Register(ForRank(spec, r));
      EXPECT_TRUE(registered.ok()) << registered.status();
    }
  }
  bool ok() const { return clients_.size() == kWorld && clients_.back() != nullptr; }
  Client& rank(int r) { return *clients_[static_cast<size_t>(r)]; }

  std::vector<PushItem> Items(const std::vector<std::string>& per_tensor) const {
    std::vector<PushItem> items;
    for (int i = 0; i < spec_.tensors_size(); ++i) {
      items.push_back({spec_.tensors(i).name(), AsBytes(per_tensor[static_cast<size_t>(i)])});
    }
    return items;
  }
  absl::Status Upload(const std::vector<std::string>& weights) {
    return rank(0).UploadInitialWeights(kJob, Items(weights));
  }
  // Every rank pushes its gradients of `step`, then commits it; each call is made even where an
  // earlier one failed (a dead daemon's part fails, the others' go on). The first error.
  absl::Status Step(int64_t step, const StepGradients& grads) {
    absl::Status status;
    for (int r = 0; r < kWorld; ++r) {
      std::vector<std::string> mine;
      for (int i = 0; i < spec_.tensors_size(); ++i) mine.push_back(grads[i][r]);
      status.Update(rank(r).PushGradients(kJob, r, step, Items(mine)));
    }
    for (int r = 0; r < kWorld; ++r) status.Update(rank(r).Commit(kJob, r, step).status());
    return status;
  }
  // Rank 1's pull of every tensor at `version` in `format`.
  absl::StatusOr<std::vector<Pulled>> Pull(const v1::ServeFormat& format, int64_t version) {
    PullManyTarget target{kJob, {}, format, version};
    for (const v1::TensorSpec& t : spec_.tensors()) target.tensors.push_back(t.name());
    std::vector<Pulled> pulled;
    if (absl::Status s = rank(1).PullMany(target, 20s, &pulled); !s.ok()) return s;
    return pulled;
  }

 private:
  v1::RegisterRequest spec_;
  std::vector<std::unique_ptr<Client>> clients_;
};

// Trains `steps` steps of `spec` on the daemon at `single` and on the daemons `names` (sorted,
// reached first at `address`), and checks every served format of every tensor, byte for byte,
// after every step. `status_of` gives a daemon's Status of the job: the one-daemon job's clip, the
// sharded daemons' skipped steps.
inline void ExpectShardedRunMatchesOneDaemon(
    const v1::RegisterRequest& spec, const std::string& single, const std::string& address,
    const std::vector<std::string>& names, int steps,
    const std::function<absl::StatusOr<v1::JobStatus>(const std::string&)>& status_of) {
  // The layout this test means: "embed" in three pieces, one per daemon.
  v1::RegisterRequest listed = spec;
  listed.mutable_daemons()->Assign(names.begin(), names.end());
  const absl::StatusOr<ShardMap> map = JobShardMap(listed, "", kCpuDevice);
  ASSERT_TRUE(map.ok()) << map.status();
  ASSERT_EQ(map->tensors[0].size(), 3u);

  Trainers one(spec, single, {});
  Trainers three(spec, address, names);
  ASSERT_TRUE(one.ok() && three.ok());
  EXPECT_EQ(three.rank(0).transport_name(),
            absl::StrCat(names[0], "=inline,", names[1], "=inline,", names[2], "=inline"));
  // Each daemon holds its part alone: no daemon holds every tensor.
  for (const std::string& name : names) {
    const absl::StatusOr<v1::JobStatus> status = status_of(name);
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_LT(status->tensors_size(), spec.tensors_size());
  }

  std::vector<std::string> weights;
  for (const std::vector<float>& w : RandomWeights(spec, 5)) weights.push_back(ToBytes(w));
  const absl::Status uploaded_one = one.Upload(weights);
  ASSERT_TRUE(uploaded_one.ok()) << uploaded_one;
  const absl::Status uploaded = three.Upload(weights);
  ASSERT_TRUE(uploaded.ok()) << uploaded;

  constexpr int kSkipped = 4;
  int clipped = 0;
  for (int64_t step = 0; step <= steps; ++step) {
    SCOPED_TRACE(absl::StrCat("version ", step));
    for (const v1::ServeFormat& format : spec.serve()) {
      absl::StatusOr<std::vector<Pulled>> want = one.Pull(format, step);
      absl::StatusOr<std::vector<Pulled>> got = three.Pull(format, step);
      ASSERT_TRUE(want.ok()) << want.status();
      ASSERT_TRUE(got.ok()) << got.status();
      for (size_t i = 0; i < want->size(); ++i) {
        SCOPED_TRACE(
            absl::StrCat(spec.tensors(static_cast<int>(i)).name(), " ", format.ShortDebugString()));
        const Pulled& w = (*want)[i];
        const Pulled& g = (*got)[i];
        EXPECT_EQ(g.header.version(), step);
        EXPECT_EQ(g.header.skipped(), w.header.skipped());
        EXPECT_EQ(g.header.rows(), w.header.rows());
        EXPECT_EQ(g.header.data_bytes(), w.header.data_bytes());
        EXPECT_EQ(g.header.scale_bytes(), w.header.scale_bytes());
        ASSERT_EQ(g.data.size(), w.data.size());
        ASSERT_TRUE(std::memcmp(g.data.data(), w.data.data(), w.data.size()) == 0);
      }
    }
    if (step > 0) {
      // The step that made this version has run: a pull of every tensor of it sees the step in
      // Status (read right after the commit, it may not have run yet).
      const absl::StatusOr<v1::JobStatus> status = status_of(single);
      ASSERT_TRUE(status.ok()) << status.status();
      if (status->last_clip() < 1.0) ++clipped;
    }
    if (step == steps) break;
    StepGradients grads = RandomGradients(spec, 100 + static_cast<uint64_t>(step));
    if (step == kSkipped) {
      // Rank 1's "embed" row 590: the last piece's rows, on one daemon only.
      std::vector<float> g = testing::FromBytes<float>(grads[0][1]);
      g[590 * spec.tensors(0).cols() + 3] = std::numeric_limits<float>::infinity();
      grads[0][1] = ToBytes(g);
    }
    ASSERT_TRUE(one.Step(step, grads).ok());
    ASSERT_TRUE(three.Step(step, grads).ok());
  }
  EXPECT_GT(clipped, steps / 2);  // the clip was in effect on most steps
  for (const std::string& name : names) {
    const absl::StatusOr<v1::JobStatus> status = status_of(name);
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_EQ(status->skipped_steps(), 1);
  }
}

// A daemon's Status of the job, over RPC.
inline absl::StatusOr<v1::JobStatus> StatusOf(const std::string& address) {
  std::unique_ptr<Client> client = Connect(address, {}, 5);
  if (client == nullptr) return absl::UnavailableError(absl::StrCat("no daemon at ", address));
  absl::StatusOr<v1::StatusResponse> status = client->Status(kJob);
  if (!status.ok()) return status.status();
  if (status->jobs_size() != 1) return absl::NotFoundError("no job");
  return status->jobs(0);
}

}  // namespace paramd::sharded_run
