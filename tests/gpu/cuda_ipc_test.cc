// What `cuda_ipc` does beyond the conformance suite: gradients pushed from GPU memory, in-place
// reads of served bytes in GPU memory under a lease that later steps respect, and the automatic
// choice. A daemon on cuda:0 runs in this process (label gpu; skips with the reason without one).
#include "transport/cuda_ipc/cuda_ipc.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "common/in_process_key.h"
#include "paramd/v1/data.grpc.pb.h"
#include "tests/conformance/transport_conformance.h"

namespace paramd::testing {
namespace {

using CudaIpcTest = TransportConformanceTest;

// The bytes of a device view, copied to the host.
std::vector<std::byte> HostCopy(const PulledView& view) {
  std::vector<std::byte> host(view.data.size());
  EXPECT_EQ(cudaMemcpy(host.data(), view.data.data(), host.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return host;
}

TEST_P(CudaIpcTest, GradientsFromGpuMemoryGiveTheSameStepAsFromHostMemory) {
  constexpr size_t kN = 4099;  // not a multiple of any block
  Register("dev", {Spec("t", 1, kN)}, 1);
  Register("host", {Spec("t", 1, kN)}, 1);
  const std::vector<float> p = Random(kN, 1, 0.02f), g = Random(kN, 2, 1e-3f);
  const PushItem init[] = {{"t", Bytes(p)}};
  for (const char* job : {"dev", "host"}) {
    ASSERT_TRUE(transport_->Push({job, 0, 0, v1::PUSH_KIND_INITIAL_WEIGHTS}, init, Soon()).ok());
  }
  void* d_grad = nullptr;
  ASSERT_EQ(cudaMalloc(&d_grad, kN * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_grad, g.data(), kN * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  const PushItem from_device[] = {
      {"t", std::span<const std::byte>(static_cast<const std::byte*>(d_grad), kN * 4)}};
  const PushItem from_host[] = {{"t", Bytes(g)}};
  ASSERT_TRUE(transport_->Push({"dev", 0, 0, v1::PUSH_KIND_GRADIENT}, from_device, Soon()).ok());
  // A retry of the same device bytes is acknowledged.
  ASSERT_TRUE(transport_->Push({"dev", 0, 0, v1::PUSH_KIND_GRADIENT}, from_device, Soon()).ok());
  ASSERT_TRUE(transport_->Push({"host", 0, 0, v1::PUSH_KIND_GRADIENT}, from_host, Soon()).ok());
  ASSERT_TRUE(Commit("dev", 0, 0).ok());
  ASSERT_TRUE(Commit("host", 0, 0).ok());
  Pulled a, b;
  ASSERT_TRUE(transport_->Pull(Target("dev", "t", 1), Soon(), &a).ok());
  ASSERT_TRUE(transport_->Pull(Target("host", "t", 1), Soon(), &b).ok());
  EXPECT_EQ(a.header.version(), 1);
  EXPECT_EQ(a.data, b.data);
  EXPECT_NE(std::memcmp(a.data.data(), p.data(), a.data.size()), 0);
  cudaFree(d_grad);
}

TEST_P(CudaIpcTest, InPlaceViewIsInGpuMemoryAndStaysUnchangedUnderItsLease) {
  constexpr size_t kN = 1 << 12;
  v1::ServeFormat fp8;
  fp8.set_recipe(v1::RECIPE_FP8_BLOCK);
  Register("lease", {Spec("t", 64, 64)}, 1, {fp8});
  const std::vector<float> p = Random(kN, 3, 0.02f);
  const PushItem init[] = {{"t", Bytes(p)}};
  ASSERT_TRUE(transport_->Push({"lease", 0, 0, v1::PUSH_KIND_INITIAL_WEIGHTS}, init, Soon()).ok());
  auto step = [&](int64_t s) {
    const std::vector<float> g = Random(kN, 10 + static_cast<uint32_t>(s), 1e-2f);
    const PushItem items[] = {{"t", Bytes(g)}};
    ASSERT_TRUE(transport_->Push({"lease", 0, s, v1::PUSH_KIND_GRADIENT}, items, Soon()).ok());
    ASSERT_TRUE(Commit("lease", 0, s).ok());
  };
  step(0);
  PulledView view;
  ASSERT_TRUE(transport_
                  ->PullInPlace(Target("lease", "t", 1, v1::RECIPE_FP8_BLOCK), Soon(),
                                std::chrono::seconds(60), &view)
                  .ok());
  cudaPointerAttributes attributes;
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, view.data.data()), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeDevice);
  const std::vector<std::byte> before = HostCopy(view);
  Pulled copy;
  ASSERT_TRUE(transport_->Pull(Target("lease", "t", 1, v1::RECIPE_FP8_BLOCK), Soon(), &copy).ok());
  EXPECT_EQ(copy.data, before) << "the in-place view and the copy of version 1 differ";
  for (int64_t s = 1; s < 4; ++s) step(s);
  Pulled newest;
  ASSERT_TRUE(
      transport_->Pull(Target("lease", "t", 4, v1::RECIPE_FP8_BLOCK), Soon(), &newest).ok());
  EXPECT_NE(newest.data, before);
  EXPECT_EQ(HostCopy(view), before) << "a later step overwrote leased bytes";
  ASSERT_TRUE(transport_->Release(view.lease, Soon()).ok());
}

// ClientOptions::lend_gradients: the daemon reads gradients in the trainer's own GPU memory (two
// tensors at offsets inside one allocation, two ranks) with no slot of its own, and the steps match
// those of gradients copied into its slots, bit for bit.
TEST_P(CudaIpcTest, LentGradientsAreReadWhereTheyLieAndGiveTheSameSteps) {
  constexpr size_t kA = 4099, kB = 640;  // not multiples of any block
  const std::vector<v1::TensorSpec> specs = {Spec("a", 1, kA), Spec("b", 10, kB / 10)};
  Register("lent", specs, 2);
  Register("copied", specs, 2);
  TransportContext context{channel_, kChunkBytes, "lent", 0};
  context.lend_gradients = true;
  absl::StatusOr<std::unique_ptr<Transport>> lending = MakeCudaIpcTransport(context);
  ASSERT_TRUE(lending.ok()) << lending.status();
  const std::vector<float> pa = Random(kA, 1, 0.02f), pb = Random(kB, 2, 0.02f);
  const PushItem init[] = {{"a", Bytes(pa)}, {"b", Bytes(pb)}};
  for (const char* job : {"lent", "copied"}) {
    ASSERT_TRUE(transport_->Push({job, 0, 0, v1::PUSH_KIND_INITIAL_WEIGHTS}, init, Soon()).ok());
  }
  // One allocation per rank holding both gradients, "b" at an offset.
  constexpr size_t kOffsetB = 8192;
  std::byte* d_grads[2] = {nullptr, nullptr};
  for (std::byte*& d : d_grads) {
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), (kOffsetB + kB) * sizeof(float)),
              cudaSuccess);
  }
  for (int64_t step = 0; step < 3; ++step) {
    for (int32_t rank = 0; rank < 2; ++rank) {
      const uint32_t seed = static_cast<uint32_t>(10 * step + rank);
      const std::vector<float> ga = Random(kA, 100 + seed, 1e-3f),
                               gb = Random(kB, 200 + seed, 1e-3f);
      std::byte* d = d_grads[rank];
      ASSERT_EQ(cudaMemcpy(d, ga.data(), kA * 4, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(d + kOffsetB * 4, gb.data(), kB * 4, cudaMemcpyHostToDevice),
                cudaSuccess);
      const PushItem lent[] = {{"a", std::span<const std::byte>(d, kA * 4)},
                               {"b", std::span<const std::byte>(d + kOffsetB * 4, kB * 4)}};
      ASSERT_TRUE((*lending)->Push({"lent", rank, step}, lent, Soon()).ok());
      // A retry lends the same memory again: acknowledged. Other memory for it is refused.
      ASSERT_TRUE((*lending)->Push({"lent", rank, step}, lent, Soon()).ok());
      const PushItem elsewhere[] = {{"a", std::span<const std::byte>(d + 4, kA * 4)}};
      const absl::Status moved = (*lending)->Push({"lent", rank, step}, elsewhere, Soon());
      EXPECT_EQ(moved.code(), absl::StatusCode::kFailedPrecondition) << moved;
      const PushItem copied[] = {{"a", Bytes(ga)}, {"b", Bytes(gb)}};
      ASSERT_TRUE(transport_->Push({"copied", rank, step}, copied, Soon()).ok());
    }
    for (int32_t rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE(Commit("lent", rank, step, 0.5).ok());
      ASSERT_TRUE(Commit("copied", rank, step, 0.5).ok());
    }
    // The pull waits for the step, which read the lent memory: the next step may overwrite it.
    for (const char* tensor : {"a", "b"}) {
      Pulled lent, copied;
      ASSERT_TRUE(transport_->Pull(Target("lent", tensor, step + 1), Soon(), &lent).ok());
      ASSERT_TRUE(transport_->Pull(Target("copied", tensor, step + 1), Soon(), &copied).ok());
      EXPECT_EQ(lent.header.version(), step + 1);
      EXPECT_EQ(lent.data, copied.data) << "tensor " << tensor << ", step " << step;
    }
  }
  v1::StatusRequest request;
  request.set_job("lent");
  grpc::ClientContext status_context;
  v1::StatusResponse status;
  ASSERT_TRUE(control_->Status(&status_context, request, &status).ok());
  ASSERT_EQ(status.jobs_size(), 1);
  EXPECT_EQ(status.jobs(0).slot_bytes(), 0) << "the daemon kept slots for lent gradients";
  lending->reset();
  for (std::byte* d : d_grads) cudaFree(d);
}

// A lent gradient is read at the address a mark names only where the mark carries this process's
// key (common/in_process_key.h: a trainer in the daemon's own process), never because it names the
// daemon's pid: without the key the mark is read by its IPC handle (here it has none: refused),
// and nothing is stored; with it, the same mark is read where it lies.
TEST_P(CudaIpcTest, ALentMarkNamingTheDaemonsPidIsReadByAddressOnlyWithTheProcesssKey) {
  constexpr size_t kN = 1024;
  Register("pid", {Spec("t", 1, kN)}, 1);
  const std::vector<float> p = Random(kN, 1, 0.02f), g = Random(kN, 2, 1e-3f);
  const PushItem init[] = {{"t", Bytes(p)}};
  ASSERT_TRUE(transport_->Push({"pid", 0, 0, v1::PUSH_KIND_INITIAL_WEIGHTS}, init, Soon()).ok());
  void* d_grad = nullptr;
  ASSERT_EQ(cudaMalloc(&d_grad, kN * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_grad, g.data(), kN * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  v1::PushChunk chunk;
  chunk.set_job("pid");
  chunk.set_tensor("t");
  chunk.set_kind(v1::PUSH_KIND_GRADIENT);
  chunk.set_last(true);
  v1::InPlaceMark* mark = chunk.mutable_in_place();
  mark->set_bytes(kN * sizeof(float));
  mark->set_memory(v1::PLACE_MEMORY_DEVICE);
  mark->mutable_lent()->set_address(reinterpret_cast<uint64_t>(d_grad));
  mark->mutable_lent()->set_pid(static_cast<int64_t>(getpid()));
  const std::unique_ptr<v1::Data::Stub> data = v1::Data::NewStub(channel_);
  auto push = [&](v1::PushResponse* response) {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientWriter<v1::PushChunk>> writer = data->Push(&context, response);
    writer->Write(chunk);
    writer->WritesDone();
    return writer->Finish();
  };
  v1::PushResponse refused;
  const grpc::Status without_key = push(&refused);
  EXPECT_EQ(without_key.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << without_key.error_message();
  EXPECT_NE(without_key.error_message().find("IPC handle"), std::string::npos)
      << without_key.error_message();
  mark->mutable_lent()->set_in_process_key(InProcessKey());
  v1::PushResponse stored;
  const grpc::Status with_key = push(&stored);
  ASSERT_TRUE(with_key.ok()) << with_key.error_message();
  EXPECT_EQ(stored.chunks_stored(), 1) << "the refused mark was stored";
  ASSERT_TRUE(Commit("pid", 0, 0).ok());
  Pulled pulled;
  ASSERT_TRUE(transport_->Pull(Target("pid", "t", 1), Soon(), &pulled).ok());
  EXPECT_EQ(pulled.header.version(), 1);
  cudaFree(d_grad);
}

// Each job's slots and served bytes lie in exported allocations of its own: an Attach names a job's
// handles alone (a probe none), and both jobs step exactly through one transport.
TEST_P(CudaIpcTest, EachJobIsToldOfItsOwnGpuAllocationsAlone) {
  constexpr size_t kN = 4099;
  for (const char* job : {"mine", "theirs"}) {
    Register(job, {Spec("t", 1, kN)}, 1);
    const std::vector<float> w = Random(kN, 1, 0.02f), g = Random(kN, 2, 1e-3f);
    const PushItem init[] = {{"t", Bytes(w)}};
    const PushItem grad[] = {{"t", Bytes(g)}};
    ASSERT_TRUE(transport_->Push({job, 0, 0, v1::PUSH_KIND_INITIAL_WEIGHTS}, init, Soon()).ok());
    ASSERT_TRUE(transport_->Push({job, 0, 0}, grad, Soon()).ok());
    ASSERT_TRUE(Commit(job, 0, 0).ok());
    Pulled pulled;
    ASSERT_TRUE(transport_->Pull(Target(job, "t", 1), Soon(), &pulled).ok());
    EXPECT_EQ(pulled.header.version(), 1);
  }
  const auto regions = [&](const std::string& job) {
    v1::AttachRequest request;
    request.set_transport("cuda_ipc");
    if (job.empty()) {
      request.mutable_probe();
    } else {
      request.set_job(job);
      request.mutable_regions();
    }
    v1::AttachResponse response;
    grpc::ClientContext context;
    context.set_deadline(Soon());
    EXPECT_TRUE(data_->Attach(&context, request, &response).ok());
    return response.cuda_ipc();
  };
  const v1::CudaIpcRegions mine = regions("mine"), theirs = regions("theirs");
  ASSERT_GT(mine.ipc_handles_size(), 0);
  ASSERT_GT(theirs.ipc_handles_size(), 0);
  for (const std::string& handle : mine.ipc_handles()) {
    EXPECT_EQ(std::count(theirs.ipc_handles().begin(), theirs.ipc_handles().end(), handle), 0);
  }
  for (uint64_t base : mine.ipc_bases()) {
    EXPECT_EQ(std::count(theirs.ipc_bases().begin(), theirs.ipc_bases().end(), base), 0);
  }
  EXPECT_EQ(regions("").ipc_handles_size(), 0) << "a probe is told of a job's memory";
}

TEST_P(CudaIpcTest, IsTheAutomaticChoiceOnAGpuDaemon) {
  TransportContext context{channel_, kChunkBytes, "", 0};
  std::string reason;
  absl::StatusOr<std::unique_ptr<Transport>> chosen = ChooseTransport("auto", context, &reason);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  EXPECT_EQ((*chosen)->name(), "cuda_ipc") << reason;
}

INSTANTIATE_TEST_SUITE_P(Gpu, CudaIpcTest, ::testing::Values("cuda_ipc"));

}  // namespace
}  // namespace paramd::testing
