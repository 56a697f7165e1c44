// Many pulls of several tensors at once (PullRequest.tensors) against a daemon that is stepping:
// some wait and succeed, many end at short deadlines while their waiters are registered or have
// just fired, some are pulled in place and released together. The daemon must answer every one
// with a whole, right-versioned set or DEADLINE_EXCEEDED, never crash (the suite runs under ASan
// in scripts/sanitize.sh), and end with no lease held and its steps on time.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "client/client.h"
#include "server/rpc/server.h"

namespace paramd {
namespace {

using std::chrono::milliseconds;

constexpr int kTensors = 8;
constexpr int kSteps = 30;
constexpr int kPullers = 4;

TEST(PullManyStressTest, ConcurrentPullsWithExpiringDeadlinesWhileTheJobSteps) {
  v1::DaemonConfig config;
  config.set_listen("127.0.0.1:0");
  config.set_metrics_listen("");
  config.set_step_threads(2);
  config.set_log_level("warning");
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(config);
  ASSERT_TRUE(server.ok()) << server.status();

  auto connect = [&] {
    ClientOptions options;
    options.address = (*server)->address();
    options.transport = "shm";
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  };
  v1::RegisterRequest request;
  request.set_job("stress");
  request.set_world_size(1);
  std::vector<std::string> names;
  for (int i = 0; i < kTensors; ++i) {
    v1::TensorSpec* t = request.add_tensors();
    t->set_name("t" + std::to_string(i));
    t->set_rows(16 + i);
    t->set_cols(64);
    t->set_grad_type(v1::ELEMENT_TYPE_FP32);
    names.push_back(t->name());
  }
  request.mutable_hyperparams()->set_lr(1e-3);
  request.mutable_hyperparams()->set_beta1(0.9);
  request.mutable_hyperparams()->set_beta2(0.999);
  request.mutable_hyperparams()->set_eps(1e-8);
  std::unique_ptr<Client> trainer = connect();
  ASSERT_NE(trainer, nullptr);
  ASSERT_TRUE(trainer->Register(request).ok());
  std::vector<std::vector<float>> values;
  std::vector<PushItem> items;
  for (int i = 0; i < kTensors; ++i) values.emplace_back((16 + i) * 64, 0.01f * (i + 1));
  for (int i = 0; i < kTensors; ++i) {
    items.push_back({names[i], std::as_bytes(std::span<const float>(values[i]))});
  }
  ASSERT_TRUE(trainer->UploadInitialWeights("stress", items).ok());

  std::atomic<int64_t> published{0};
  std::atomic<bool> done{false};
  std::atomic<int> ok_pulls{0}, expired_pulls{0}, bad{0};
  std::vector<std::thread> pullers;
  for (int p = 0; p < kPullers; ++p) {
    pullers.emplace_back([&, p] {
      std::unique_ptr<Client> client = connect();
      if (client == nullptr) {
        ++bad;
        return;
      }
      ASSERT_TRUE(client->Register(request).ok());  // same description: accepted, same job
      std::mt19937 gen(100 + p);
      while (!done.load()) {
        // A random subset, in a random order; a version that is out, or one or two ahead.
        std::vector<std::string> subset = names;
        std::shuffle(subset.begin(), subset.end(), gen);
        subset.resize(1 + gen() % kTensors);
        const int64_t version = published.load() + static_cast<int64_t>(gen() % 3);
        PullManyTarget target{"stress", subset, {}, version};
        const milliseconds timeout(1 + gen() % 40);
        if (gen() % 3 == 0) {
          absl::StatusOr<std::vector<PulledView>> views =
              client->PullInPlaceMany(target, timeout, milliseconds(5000));
          if (views.ok()) {
            ++ok_pulls;
            for (size_t i = 0; i < views->size(); ++i) {
              if ((*views)[i].header.tensor() != subset[i] ||
                  (*views)[i].header.version() < version) {
                ++bad;
              }
            }
            if (!client->Release(*views).ok()) ++bad;
          } else if (views.status().code() == absl::StatusCode::kDeadlineExceeded) {
            ++expired_pulls;
          } else {
            ADD_FAILURE() << views.status();
            ++bad;
          }
          continue;
        }
        std::vector<Pulled> out;
        const absl::Status status = client->PullMany(target, timeout, &out);
        if (status.ok()) {
          ++ok_pulls;
          for (size_t i = 0; i < out.size(); ++i) {
            const int t = std::stoi(subset[i].substr(1));
            if (out[i].header.tensor() != subset[i] || out[i].header.version() < version ||
                out[i].data.size() != values[t].size() * sizeof(float)) {
              ++bad;
            }
          }
        } else if (status.code() == absl::StatusCode::kDeadlineExceeded) {
          ++expired_pulls;
        } else {
          ADD_FAILURE() << status;
          ++bad;
        }
      }
    });
  }
  std::vector<float> grad;
  for (int64_t step = 0; step < kSteps; ++step) {
    for (int i = 0; i < kTensors; ++i) values[i][0] = 1e-3f * static_cast<float>(step + i);
    ASSERT_TRUE(trainer->PushGradients("stress", 0, step, items).ok());
    ASSERT_TRUE(trainer->Commit("stress", 0, step).ok());
    std::vector<Pulled> all;
    ASSERT_TRUE(trainer->PullMany({"stress", names, {}, step + 1}, milliseconds(30000), &all).ok());
    published.store(step + 1);
    std::this_thread::sleep_for(milliseconds(5));
  }
  done.store(true);
  for (std::thread& t : pullers) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(ok_pulls.load(), 0);
  EXPECT_GT(expired_pulls.load(), 0) << "no pull ended at its deadline: the test lost its edge";
  // Every lease was released or expires within the copy lease; none is left for long.
  absl::StatusOr<v1::StatusResponse> status = trainer->Status("stress");
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->jobs(0).applied_steps(), kSteps);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  int64_t leases = -1;
  while (std::chrono::steady_clock::now() < give_up) {
    leases = trainer->Status("stress")->jobs(0).leases();
    if (leases == 0) break;
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_EQ(leases, 0);
  (*server)->Shutdown();
}

}  // namespace
}  // namespace paramd
