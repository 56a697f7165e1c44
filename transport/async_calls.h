// Unary calls a transport starts without waiting for their answers (a lease's release, a
// look-ahead), made with gRPC's callback API. Each call's objects live until its callback has
// run; the owner waits for the calls still in flight before it goes away.
#pragma once

#include <grpcpp/client_context.h>

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace paramd {

class AsyncCalls {
 public:
  struct CallBase {
    virtual ~CallBase() = default;
    grpc::ClientContext context;
  };
  template <typename Request, typename Response>
  struct Call : CallBase {
    Request request;
    Response response;
  };

  ~AsyncCalls() { WaitIdle(); }

  // Keeps a new call alive until Finished(call); returns it for the stub's async method.
  template <typename Request, typename Response>
  Call<Request, Response>* Start() {
    auto call = std::make_unique<Call<Request, Response>>();
    Call<Request, Response>* raw = call.get();
    std::lock_guard<std::mutex> lock(mu_);
    finished_.clear();  // calls whose callbacks have returned
    calls_.emplace(raw, std::move(call));
    return raw;
  }

  // Called last by a call's callback. Its objects are freed later (by the next Start or the
  // destructor), not while gRPC may still be returning from the callback.
  void Finished(CallBase* call) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = calls_.find(call);
    finished_.push_back(std::move(it->second));
    calls_.erase(it);
    idle_.notify_all();
  }

  // Blocks until every started call has finished (their deadlines bound the wait).
  void WaitIdle() {
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait(lock, [this] { return calls_.empty(); });
  }

 private:
  std::mutex mu_;
  std::condition_variable idle_;
  std::map<CallBase*, std::unique_ptr<CallBase>> calls_;
  std::vector<std::unique_ptr<CallBase>> finished_;
};

}  // namespace paramd
