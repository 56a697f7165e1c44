// The `cuda:N` backend: master weights, moments and served formats live in GPU memory; a step is
// the kernels' multi-tensor launches (kernels/cuda_step.h) over all tensors of the job. Gradients
// pushed in data chunks arrive in host slots and are copied up; served bytes are copied down into
// the host buffers the transports read. Both host sides are allocated page-locked (the backend's
// HostAllocator), so the copies run at the link's speed. For trainers on its node (DESIGN.md §6)
// the backend also exports GPU memory (exported_memory.h): each job's few allocations, carved into
// its gradient slots and served bytes, whose IPC handles the job's trainers open once; a slot a
// trainer wrote there is read in place, and the step writes each version's served bytes there
// (besides the host copy).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "kernels/cuda_step.h"
#include "kernels/step_rules.h"
#include "server/backend/backends.h"
#include "server/backend/cuda/exported_memory.h"
#include "server/backend/cuda/lent_memory.h"
#include "server/backend/initial_state.h"
#include "server/backend/kernel_status.h"

namespace paramd {
namespace {

// Page-locked host memory (cudaHostAlloc) for the jobs' slots and served bytes: the copies to and
// from the GPU need no staging. A failed allocation leaves the job a heap buffer (slower copies).
class PinnedAllocator final : public BufferAllocator {
 public:
  explicit PinnedAllocator(int device) : device_(device) {}

  absl::StatusOr<HostBuffer> Allocate(int64_t bytes) override {
    if (bytes == 0) return HostBuffer();
    PARAMD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));  // the backend's device, on any thread
    void* data = nullptr;
    if (cudaHostAlloc(&data, static_cast<size_t>(bytes), cudaHostAllocPortable) != cudaSuccess) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", bytes, " bytes of page-locked host memory"));
    }
    std::memset(data, 0, static_cast<size_t>(bytes));
    return Make(static_cast<uint8_t*>(data), bytes, Place{});
  }
  bool shared() const override { return false; }

 protected:
  // On whatever thread drops the last reference: the backend's device, then the thread's own.
  void Free(uint8_t* data, int64_t, Place) override {
    const DeviceScope scope(device_);
    cudaFreeHost(data);
    cudaGetLastError();
  }

 private:
  const int device_;
};

// One per device, for the process's life: a buffer (a lease's, say) may outlive its backend.
BufferAllocator* PinnedAllocatorOf(int device) {
  static std::mutex mu;
  static auto* allocators = new std::map<int, std::unique_ptr<PinnedAllocator>>();
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<PinnedAllocator>& a = (*allocators)[device];
  if (a == nullptr) a = std::make_unique<PinnedAllocator>(device);
  return a.get();
}

// One device allocation, freed with its owner.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      Free();
      ptr_ = std::exchange(other.ptr_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  ~DeviceBuffer() { Free(); }
  void Free() {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  absl::Status Allocate(size_t bytes) {
    if (bytes == 0) return absl::OkStatus();
    if (cudaMalloc(&ptr_, bytes) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error state of a failed allocation
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", bytes, " bytes of GPU memory (the GPU is full)"));
    }
    bytes_ = bytes;
    return absl::OkStatus();
  }
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Where the step writes a served format straight into the version's exported bytes: there when
// its scales (which follow the data) stay 16-byte aligned for the kernels' vector stores.
double Ms(std::chrono::steady_clock::time_point from, std::chrono::steady_clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

bool WritesInPlace(const ServedFormat& f) {
  return !f.device.empty() && f.layout.data_bytes % 16 == 0;
}

struct DeviceOutput {
  FormatKey key;
  kernels::ServeBufferLayout layout;
  DeviceBuffer data;
  DeviceBuffer scales;
};

class CudaTensorState : public TensorState {
 public:
  explicit CudaTensorState(const TensorInfo& info) : info(info), n(info.rows * info.cols) {}
  StateBytes state_bytes() const override { return PolicyStateBytes(info); }

  const TensorInfo info;
  const int64_t n;
  DeviceBuffer master, remainder, exp_avg, exp_avg_scale_inv, exp_avg_sq, exp_avg_sq_scale_inv;
  DeviceBuffer scalars;  // [fp8_tensor scale, fp8_delayed scale, master amax]
  // In the served tensor's format order; a format the step writes in place (WritesInPlace) gets
  // these buffers only when a version has no exported bytes.
  std::vector<DeviceOutput> outputs;
  std::vector<DeviceBuffer> slots;  // host slots' copies, one per rank, allocated when first used
  kernels::AmaxHistory history{16};
  float delayed_scale = 1.0f;
};

class CudaBackend : public Backend {
 public:
  CudaBackend(int device, int host_threads) : device_(device), pool_(host_threads) {}
  ~CudaBackend() override {
    cudaSetDevice(device_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (copy_stream_ != nullptr) cudaStreamDestroy(copy_stream_);
    if (step_done_ != nullptr) cudaEventDestroy(step_done_);
    for (cudaEvent_t e : kernel_timing_) {
      if (e != nullptr) cudaEventDestroy(e);
    }
  }

  absl::Status Init() {
    std::string why;
    if (!kernels::CudaDeviceAvailable(&why)) {
      return absl::FailedPreconditionError(
          absl::StrCat("backend cuda:", device_, " is not available: ", why));
    }
    int count = 0;
    PARAMD_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
    if (device_ >= count) {
      return absl::FailedPreconditionError(absl::StrCat(
          "backend cuda:", device_, " is not available: this machine has ", count, " GPU(s)"));
    }
    PARAMD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    PARAMD_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&step_done_, cudaEventDisableTiming | cudaEventInterprocess));
    cudaIpcEventHandle_t handle;
    PARAMD_CUDA_RETURN_IF_ERROR(cudaIpcGetEventHandle(&handle, step_done_));
    for (cudaEvent_t& e : kernel_timing_) PARAMD_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
    step_event_.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
    cudaDeviceProp prop;
    PARAMD_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device_));
    uuid_.assign(prop.uuid.bytes, sizeof(prop.uuid.bytes));
    exported_ = std::make_unique<ExportedMemories>(device_);
    PARAMD_LOG(INFO) << "backend cuda:" << device_ << ": " << prop.name << ", "
                     << prop.totalGlobalMem / (1 << 30) << " GiB";
    return absl::OkStatus();
  }

  std::string name() const override { return absl::StrCat("cuda:", device_); }
  BufferAllocator* HostAllocator() override { return PinnedAllocatorOf(device_); }

  std::optional<DeviceExports> Exports(const std::string& job) const override {
    DeviceExports exports;
    exports.device = device_;
    exports.uuid = uuid_;
    exported_->Describe(job, &exports);
    exports.step_event = step_event_;
    exports.step_event_local = reinterpret_cast<uint64_t>(step_done_);
    return exports;
  }
  std::shared_ptr<ExportedMemory> ExportedMemoryFor(const std::string& job) override {
    return exported_->For(job);
  }
  absl::StatusOr<std::shared_ptr<const void>> MapLent(const v1::LentMemory& lent,
                                                      int64_t bytes) override {
    return lent_.Map(lent, bytes);
  }

  absl::Status CopyServedOnDevice(const ServedTensor& from, ServedTensor* to) override {
    std::lock_guard<std::mutex> lock(mu_);
    const absl::Status status = [&]() -> absl::Status {
      PARAMD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
      for (size_t f = 0; f < from.formats.size() && f < to->formats.size(); ++f) {
        const DeviceBytes& src = from.formats[f].device;
        const DeviceBytes& dst = to->formats[f].device;
        if (src.empty() || dst.empty()) continue;
        PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst.get(), src.get(),
                                                    static_cast<size_t>(dst.size()),
                                                    cudaMemcpyDeviceToDevice, stream_));
      }
      PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
      return absl::OkStatus();
    }();
    if (!status.ok()) NoticeFailure(status);
    return status;
  }

  absl::StatusOr<std::unique_ptr<TensorState>> CreateState(const TensorInfo& info,
                                                           std::span<const float> initial,
                                                           ServedTensor* out,
                                                           const WholeAmax& whole_amax) override {
    std::lock_guard<std::mutex> lock(mu_);
    PARAMD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    InitialState init;
    if (absl::Status s = MakeInitialState(info, initial, pool_, &init, out, whole_amax); !s.ok()) {
      return s;
    }
    absl::StatusOr<std::unique_ptr<CudaTensorState>> allocated = Allocate(info, *out);
    if (!allocated.ok()) return allocated.status();
    std::unique_ptr<CudaTensorState> state = *std::move(allocated);
    CudaTensorState& s = *state;
    s.delayed_scale = init.delayed_scale;
    const size_t chunks = static_cast<size_t>(kernels::NumChunks(s.n));
    PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        s.master.get(), init.master.data(), init.master.size(), cudaMemcpyHostToDevice, stream_));
    if (!init.remainder.empty()) {
      PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s.remainder.get(), init.remainder.data(),
                                                  s.remainder.bytes(), cudaMemcpyHostToDevice,
                                                  stream_));
    }
    PARAMD_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(s.exp_avg.get(), 0, s.exp_avg.bytes(), stream_));
    PARAMD_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(s.exp_avg_sq.get(), 0, s.exp_avg_sq.bytes(), stream_));
    const std::vector<float> ones(chunks, 1.0f);  // a new tensor's chunk scales
    for (DeviceBuffer* scales : {&s.exp_avg_scale_inv, &s.exp_avg_sq_scale_inv}) {
      if (scales->bytes() == 0) continue;
      PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(scales->get(), ones.data(), scales->bytes(),
                                                  cudaMemcpyHostToDevice, stream_));
    }
    const float scalars[3] = {init.fp8_tensor_scale, init.delayed_scale, 0.0f};
    PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s.scalars.get(), scalars, sizeof(scalars),
                                                cudaMemcpyHostToDevice, stream_));
    if (absl::Status st = UploadServed(*out); !st.ok()) return st;
    {
      std::lock_guard<std::mutex> host_lock(out->host_mu);
      out->host_stale = false;  // computed on the host, then uploaded
    }
    PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return state;
  }

  absl::Status ReadStateArray(const TensorState& state, StateArray array, int64_t offset,
                              std::span<uint8_t> out) override {
    std::lock_guard<std::mutex> lock(mu_);
    PARAMD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    const auto& s = static_cast<const CudaTensorState&>(state);
    const DeviceBuffer* buffer = nullptr;
    switch (array) {
      case StateArray::kMaster:
        buffer = &s.master;
        break;
      case StateArray::kMasterRemainder:
        buffer = &s.remainder;
        break;
      case StateArray::kExpAvg:
        buffer = &s.exp_avg;
        break;
      case StateArray::kExpAvgScaleInv:
        buffer = &s.exp_avg_scale_inv;
        break;
      case StateArray::kExpAvgSq:
        buffer = &s.exp_avg_sq;
        break;
      case StateArray::kExpAvgSqScaleInv:
        buffer = &s.exp_avg_sq_scale_inv;
        break;
    }
    if (offset < 0 ||
        offset + static_cast<int64_t>(out.size()) > static_cast<int64_t>(buffer->bytes())) {
      return absl::InternalError(absl::StrCat("state read [", offset, ", +", out.size(),
                                              ") outside an array of ", buffer->bytes(), " bytes"));
    }
    if (out.empty()) return absl::OkStatus();
    // A chunk at a time into the caller's (pageable) buffer: the export is bounded by the link,
    // not by this copy.
    PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out.data(),
                                                static_cast<const uint8_t*>(buffer->get()) + offset,
                                                out.size(), cudaMemcpyDeviceToHost, stream_));
    PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }

  absl::StatusOr<TensorScalars> ReadStateScalars(const TensorState& state) override {
    std::lock_guard<std::mutex> lock(mu_);
    PARAMD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    const auto& s = static_cast<const CudaTensorState&>(state);
    TensorScalars scalars;
    // The fp8_tensor scale lives on the device (the step computes it there); fp8_delayed's and
    // the history on the host.
    PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&scalars.fp8_tensor_scale, s.scalars.get(),
                                                sizeof(float), cudaMemcpyDeviceToHost, stream_));
    PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    scalars.fp8_delayed_scale = s.delayed_scale;
    scalars.delayed_history = s.history.Entries();
    return scalars;
  }

  absl::StatusOr<std::unique_ptr<TensorState>> ImportState(const TensorInfo& info,
                                                           HostTensorState host,
                                                           ServedTensor* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    PARAMD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    // The served bytes on the host, as CreateState's version 0: the device's outputs are written
    // by the next step before they are read.
    if (absl::Status st = ServeImportedMaster(info, host, pool_, out); !st.ok()) return st;
    absl::StatusOr<std::unique_ptr<CudaTensorState>> allocated = Allocate(info, *out);
    if (!allocated.ok()) return allocated.status();
    std::unique_ptr<CudaTensorState> state = *std::move(allocated);
    CudaTensorState& s = *state;
    s.delayed_scale = host.scalars.fp8_delayed_scale;
    s.history.Restore(host.scalars.delayed_history);
    const std::pair<DeviceBuffer*, const void*> uploads[] = {
        {&s.master, host.master.data()},
        {&s.remainder, host.remainder.data()},
        {&s.exp_avg, host.exp_avg.data()},
        {&s.exp_avg_scale_inv, host.exp_avg_scale_inv.data()},
        {&s.exp_avg_sq, host.exp_avg_sq.data()},
        {&s.exp_avg_sq_scale_inv, host.exp_avg_sq_scale_inv.data()}};
    for (const auto& [device, bytes] : uploads) {
      if (device->bytes() == 0) continue;
      PARAMD_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(device->get(), bytes, device->bytes(), cudaMemcpyHostToDevice, stream_));
    }
    const float scalars[3] = {host.scalars.fp8_tensor_scale, host.scalars.fp8_delayed_scale, 0.0f};
    PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s.scalars.get(), scalars, sizeof(scalars),
                                                cudaMemcpyHostToDevice, stream_));
    if (absl::Status st = UploadServed(*out); !st.ok()) return st;
    {
      std::lock_guard<std::mutex> host_lock(out->host_mu);
      out->host_stale = false;  // computed on the host, then uploaded
    }
    PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return state;
  }

  absl::StatusOr<GradientCheck> CheckGradients(std::span<TensorStep> tensors, float grad_scale,
                                               bool norms) override {
    std::lock_guard<std::mutex> lock(mu_);
    absl::StatusOr<GradientCheck> check = CheckGradientsLocked(tensors, grad_scale, norms);
    if (!check.ok()) NoticeFailure(check.status());
    return check;
  }

  absl::Status Step(std::span<TensorStep> tensors, const StepScalars& scalars,
                    const std::function<void(size_t)>& tensor_done = nullptr) override {
    std::lock_guard<std::mutex> lock(mu_);
    absl::Status status = StepLocked(tensors, scalars, tensor_done);
    if (!status.ok()) NoticeFailure(status);
    return status;
  }

  // A step decided on the device does not stop between its passes: a split tensor's amax round
  // (TensorStep::whole_amax) needs the host-decided Step, which the job of a sharded job takes.
  static absl::Status CheckNoWholeAmax(std::span<const TensorStep> tensors) {
    for (const TensorStep& t : tensors) {
      if (t.whole_amax) {
        return absl::InternalError(
            "a split tensor's amax round needs a step decided on the host (Backend::Step)");
      }
    }
    return absl::OkStatus();
  }

  bool DecidesOnDevice() const override { return true; }
  absl::StatusOr<StepOutcome> StepOnDevice(std::span<TensorStep> tensors,
                                           const StepScalars& scalars, double max_grad_norm,
                                           const std::function<void()>& queued) override {
    if (absl::Status s = CheckNoWholeAmax(tensors); !s.ok()) return s;
    std::lock_guard<std::mutex> lock(mu_);
    absl::StatusOr<StepOutcome> outcome =
        StepOnDeviceLocked(tensors, scalars, max_grad_norm, queued);
    if (!outcome.ok()) NoticeFailure(outcome.status());
    return outcome;
  }
  absl::StatusOr<const void*> LentReadyEvent(const v1::LentMemory& lent) override {
    return lent_.ReadyEvent(lent);
  }

  bool keeps_state_on_device() const override { return true; }

  absl::Status ReadyHostBytes(const ServedTensor& served) override {
    std::lock_guard<std::mutex> host_lock(served.host_mu);
    const bool pending = served.outcome_pending();
    if (!served.host_stale && !pending) return absl::OkStatus();
    const DeviceScope scope(device_);
    PARAMD_RETURN_IF_ERROR(scope.status());
    // Its own stream, which waits for the steps queued so far (a version is published once its
    // step is queued: step_done_), but not for later ones. Its host bytes are written only here,
    // under host_mu, before any host reader reads them.
    PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_stream_, step_done_, 0));
    if (!served.host_stale) {
      // Only the outcome: its flag came down before the step's event.
      PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(copy_stream_));
      ResolveFromFlag(served);
      return absl::OkStatus();
    }
    for (const ServedFormat& f : served.formats) {
      if (f.device.empty()) continue;
      auto* host = const_cast<uint8_t*>(f.bytes.data());
      PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host, f.device.get(),
                                                  static_cast<size_t>(f.bytes.size()),
                                                  cudaMemcpyDeviceToHost, copy_stream_));
    }
    PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(copy_stream_));
    served.host_stale = false;
    host_copies_.fetch_add(1);
    ResolveFromFlag(served);
    return absl::OkStatus();
  }

  // A version whose step has run (the caller synchronized with step_done_ after it was
  // published): its outcome from the flag the step copied down, where it is still pending. The
  // job resolves it to the same when the step returns; a host reader woken on the step's own
  // thread cannot wait for that.
  static void ResolveFromFlag(const ServedTensor& served) {
    if (served.decision_flag == nullptr || !served.outcome_pending()) return;
    const int all_finite = *reinterpret_cast<const volatile int*>(served.decision_flag);
    const_cast<ServedTensor&>(served).ResolveOutcome(all_finite == 0);
  }
  int64_t host_copies() const override { return host_copies_.load(); }
  int64_t plans_made() const override { return plans_made_.load(); }

  absl::StatusOr<int64_t> FreeDeviceMemory() override {
    const DeviceScope scope(device_);
    PARAMD_RETURN_IF_ERROR(scope.status());
    size_t free = 0, total = 0;
    PARAMD_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free, &total));
    return static_cast<int64_t>(free);
  }

  absl::Status Health() override {
    std::lock_guard<std::mutex> lock(health_mu_);
    return unusable_;
  }

 private:
  // After a failed call: an error the context keeps (an illegal address, a kernel fault) is
  // returned by every later synchronization, and then nothing on this GPU can run in this
  // process again. An allocation that failed leaves the context usable.
  void NoticeFailure(const absl::Status& failed) {
    if (cudaDeviceSynchronize() == cudaSuccess) return;
    cudaGetLastError();
    const cudaError_t sticky = cudaDeviceSynchronize();
    if (sticky == cudaSuccess) return;
    std::lock_guard<std::mutex> lock(health_mu_);
    if (!unusable_.ok()) return;
    unusable_ = absl::InternalError(absl::StrCat(
        "backend cuda:", device_, " is unusable: its CUDA context failed (",
        cudaGetErrorString(sticky), ", after ", failed.message(),
        "), which no call in this process can clear; every job of it failed. Restart the "
        "daemon and restore the jobs from their exports or checkpoints"));
  }

  // The stream waits, on the device, for the events the lent gradients' marks named: the work the
  // trainer queued before lending them (backward, writing them) runs before anything reads them.
  absl::Status WaitForLentGradients(std::span<const TensorStep> tensors) {
    std::vector<const void*> waited;
    for (const TensorStep& t : tensors) {
      for (const void* event : t.ready_events) {
        if (event == nullptr || std::find(waited.begin(), waited.end(), event) != waited.end()) {
          continue;
        }
        waited.push_back(event);
        PARAMD_CUDA_RETURN_IF_ERROR(
            cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(const_cast<void*>(event)), 0));
      }
    }
    return absl::OkStatus();
  }

  // The host-decided path's first reader of the gradients (a sharded job's): it waits for them as
  // StepOnDeviceLocked does, and Step's launches follow it on the same stream.
  absl::StatusOr<GradientCheck> CheckGradientsLocked(std::span<TensorStep> tensors,
                                                     float grad_scale, bool norms) {
    PARAMD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    const auto start = std::chrono::steady_clock::now();
    if (absl::Status s = Upload(tensors); !s.ok()) return s;
    if (absl::Status s = Plan(tensors, /*wait=*/true); !s.ok()) return s;
    const auto planned = std::chrono::steady_clock::now();
    const size_t blocks = static_cast<size_t>(plan().num_norm_blocks());
    if (absl::Status s = CheckBuffers(norms); !s.ok()) return s;
    if (absl::Status s = WaitForLentGradients(tensors); !s.ok()) return s;
    absl::Status st = FromKernel(kernels::GradCheckCuda(
        plan(), grad_scale, norms ? static_cast<double*>(norm_sums_.get()) : nullptr,
        static_cast<int*>(finite_.get()), stream_));
    if (!st.ok()) return st;
    int all_finite = 0;
    std::vector<double> flat(norms ? blocks : 0);
    PARAMD_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(&all_finite, finite_.get(), sizeof(int), cudaMemcpyDeviceToHost, stream_));
    if (norms && blocks > 0) {
      PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
          flat.data(), norm_sums_.get(), blocks * sizeof(double), cudaMemcpyDeviceToHost, stream_));
    }
    PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    PARAMD_LOG(DEBUG) << "cuda:" << device_ << " gradient check of " << tensors.size()
                      << " tensors: upload and plan " << Ms(start, planned) << " ms, check "
                      << Ms(planned, std::chrono::steady_clock::now()) << " ms";
    GradientCheck check;
    check.finite = all_finite != 0;
    size_t next = 0;
    for (const TensorStep& t : tensors) {
      const auto& s = *static_cast<const CudaTensorState*>(t.state);
      const size_t count = norms ? static_cast<size_t>(kernels::NumNormBlocks(s.info.rows)) : 0;
      check.block_sums.emplace_back(flat.begin() + static_cast<std::ptrdiff_t>(next),
                                    flat.begin() + static_cast<std::ptrdiff_t>(next + count));
      next += count;
    }
    return check;
  }

  // One launch over all tensors (kernels/cuda_step.h). Every tensor is reported done as soon as the
  // step's work is queued, with step_done_ recorded after it: a trainer's pull of the new version
  // answers then, and its stream waits for the event (cuda_ipc), so its next forward is queued
  // behind the step on the GPU while the step runs. The state is final when this returns.
  absl::Status StepLocked(std::span<TensorStep> tensors, const StepScalars& scalars,
                          const std::function<void(size_t)>& tensor_done) {
    PARAMD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    const auto start = std::chrono::steady_clock::now();
    // The slots went up and the plan was made in CheckGradients, which the job always calls first
    // with the same tensors; the check's launches used its counters.
    if (absl::Status s = FromKernel(plan().ResetCounters(stream_)); !s.ok()) return s;
    if (absl::Status s = QueueStep(tensors, KernelScalars(scalars)); !s.ok()) return s;
    if (absl::Status s = ServeSplitPerTensor(tensors); !s.ok()) return s;
    auto each_done = [&] {
      if (!tensor_done) return;
      for (size_t i = 0; i < tensors.size(); ++i) tensor_done(i);
    };
    if (absl::Status s = Publish(tensors, start, each_done); !s.ok()) return s;
    const float* amax = HostScalars() + tensors.size();
    for (size_t i = 0; i < tensors.size(); ++i) {
      static_cast<CudaTensorState*>(tensors[i].state)->history.Append(amax[i]);
    }
    return absl::OkStatus();
  }

  // The step rules and the step queued together, the host waiting for nothing before the step is
  // published (Backend::StepOnDevice): the reads wait for the lent gradients' ready events on the
  // device, the kernels read the clip and the found-inf flag the check and StepDecisionCuda wrote
  // there, and a skipped step's copies put the previous version's bytes into the new one.
  absl::StatusOr<StepOutcome> StepOnDeviceLocked(std::span<TensorStep> tensors,
                                                 const StepScalars& scalars, double max_grad_norm,
                                                 const std::function<void()>& queued) {
    PARAMD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    const auto start = std::chrono::steady_clock::now();
    if (absl::Status s = Upload(tensors); !s.ok()) return s;
    if (absl::Status s = Plan(tensors, /*wait=*/false); !s.ok()) return s;
    const bool clipping = max_grad_norm > 0;
    if (absl::Status s = CheckBuffers(clipping); !s.ok()) return s;
    if (clip_.get() == nullptr) {
      if (absl::Status s = clip_.Allocate(sizeof(float)); !s.ok()) return s;
    }
    if (decision_flags_.data() == nullptr) {
      absl::StatusOr<HostBuffer> pinned = HostAllocator()->Allocate(kDecisionFlags * sizeof(int));
      if (!pinned.ok()) return pinned.status();
      decision_flags_ = *std::move(pinned);
    }
    // Only now, every allocation made (freeing device memory synchronizes the device, which would
    // make this host wait for backward), the stream waits for the lent gradients' events.
    if (absl::Status s = WaitForLentGradients(tensors); !s.ok()) return s;
    auto* finite = static_cast<int*>(finite_.get());
    auto* sums = static_cast<double*>(norm_sums_.get());
    auto* clip = static_cast<float*>(clip_.get());
    if (absl::Status s = FromKernel(kernels::GradCheckCuda(
            plan(), scalars.grad_scale, clipping ? sums : nullptr, finite, stream_));
        !s.ok()) {
      return s;
    }
    if (clipping) {
      if (absl::Status s = FromKernel(kernels::StepDecisionCuda(sums, plan().num_norm_blocks(),
                                                                max_grad_norm, clip, stream_));
          !s.ok()) {
        return s;
      }
    }
    if (absl::Status s = FromKernel(plan().ResetCounters(stream_)); !s.ok()) return s;
    std::vector<float> delayed_before;
    for (const TensorStep& t : tensors) {
      delayed_before.push_back(static_cast<const CudaTensorState*>(t.state)->delayed_scale);
    }
    kernels::CudaStepScalars k = KernelScalars(scalars);
    k.d_clip = clipping ? clip : nullptr;
    k.d_all_finite = finite;
    if (absl::Status s = QueueStep(tensors, k); !s.ok()) return s;
    std::vector<kernels::CudaSkipCopy> copies;
    for (const TensorStep& t : tensors) {
      if (t.previous == nullptr) continue;
      for (size_t f = 0; f < t.out->formats.size() && f < t.previous->formats.size(); ++f) {
        const DeviceBytes& from = t.previous->formats[f].device;
        const DeviceBytes& to = t.out->formats[f].device;
        if (from.empty() || to.empty()) continue;
        copies.push_back({to.get(), from.get(), to.size()});
      }
    }
    if (absl::Status s = FromKernel(kernels::CopyIfSkippedCuda(copies, finite, stream_)); !s.ok()) {
      return s;
    }
    // The outcome comes down behind the step: the flag, into a slot of a ring that host readers
    // of this step's versions resolve their outcome from (ReadyHostBytes; a slot comes round
    // again only steps after the job resolved them), then the clip.
    int* flag = reinterpret_cast<int*>(decision_flags_.data()) + decided_steps_++ % kDecisionFlags;
    PARAMD_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(flag, finite, sizeof(int), cudaMemcpyDeviceToHost, stream_));
    auto* clip_bytes = reinterpret_cast<uint8_t*>(HostScalars() + 2 * tensors.size());
    if (clipping) {
      PARAMD_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(clip_bytes, clip, sizeof(float), cudaMemcpyDeviceToHost, stream_));
    }
    for (TensorStep& t : tensors) t.out->decision_flag = flag;
    if (absl::Status s = Publish(tensors, start, queued); !s.ok()) return s;
    StepOutcome outcome;
    outcome.skipped = *reinterpret_cast<const volatile int*>(flag) == 0;
    if (clipping) std::memcpy(&outcome.clip, clip_bytes, sizeof(float));
    const float* amax = HostScalars() + tensors.size();
    for (size_t i = 0; i < tensors.size(); ++i) {
      auto& st = *static_cast<CudaTensorState*>(tensors[i].state);
      if (!outcome.skipped) {
        st.history.Append(amax[i]);
        continue;
      }
      // Skipped: the served scale stays the previous version's, and so do the host bytes of the
      // formats that lie in host memory alone.
      st.delayed_scale = delayed_before[i];
      ServedTensor& out = *tensors[i].out;
      if (tensors[i].previous == nullptr) continue;
      for (size_t f = 0; f < out.formats.size() && f < tensors[i].previous->formats.size(); ++f) {
        if (!out.formats[f].device.empty()) continue;
        const HostBuffer& from = tensors[i].previous->formats[f].bytes;
        std::memcpy(out.formats[f].bytes.data(), from.data(), static_cast<size_t>(from.size()));
      }
    }
    return outcome;
  }

  static kernels::CudaStepScalars KernelScalars(const StepScalars& scalars) {
    kernels::CudaStepScalars k;
    k.adamw = scalars.adamw;
    k.grad_scale = scalars.grad_scale;
    k.clip = scalars.clip;
    k.seed = scalars.seed;
    k.k = static_cast<uint32_t>(scalars.k);
    return k;
  }

  // The check's flag and (with norms) block sums, kept from step to step (grown for a bigger job
  // only), so a step of a job whose buffers exist allocates nothing and still runs when another
  // job filled the GPU.
  absl::Status CheckBuffers(bool norms) {
    if (finite_.get() == nullptr) {
      if (absl::Status s = finite_.Allocate(sizeof(int)); !s.ok()) return s;
    }
    const size_t blocks = static_cast<size_t>(plan().num_norm_blocks());
    if (norms && norm_sums_.bytes() < blocks * sizeof(double)) {
      norm_sums_.Free();
      if (absl::Status s = norm_sums_.Allocate(blocks * sizeof(double)); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // Queues a bound plan's step: the fp8_delayed scales from the host's histories (one copy from
  // page-locked memory), the kernel, the served bytes into the version's exported GPU bytes where
  // the step did not write them there (they stay on the GPU: a host reader copies them down once,
  // ReadyHostBytes), into host buffers for formats without exported bytes, and the masters' amaxes
  // down into HostScalars() + n, all in one stream.
  absl::Status QueueStep(std::span<TensorStep> tensors, const kernels::CudaStepScalars& k) {
    const size_t n = tensors.size();
    float* delayed = HostScalars();  // [0, n): the fp8_delayed scales, [n, 2n): the amaxes
    for (size_t i = 0; i < n; ++i) {
      auto& s = *static_cast<CudaTensorState*>(tensors[i].state);
      delayed[i] = s.history.NextScale(s.info.delayed_margin, s.delayed_scale).scale;
      s.delayed_scale = delayed[i];
    }
    if (n > 0) {
      PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(step_scalars_.get(), delayed, n * sizeof(float),
                                                  cudaMemcpyHostToDevice, stream_));
    }
    // The kernel's own time, for --log_level=debug (what the step's device time is made of).
    const bool timed = GetLogLevel() == LogLevel::kDebug;
    if (timed) PARAMD_CUDA_RETURN_IF_ERROR(cudaEventRecord(kernel_timing_[0], stream_));
    if (absl::Status s = FromKernel(kernels::FusedStepCuda(plan(), k, stream_)); !s.ok()) return s;
    if (timed) PARAMD_CUDA_RETURN_IF_ERROR(cudaEventRecord(kernel_timing_[1], stream_));
    for (size_t i = 0; i < tensors.size(); ++i) {
      auto& s = *static_cast<CudaTensorState*>(tensors[i].state);
      bool on_device = false;
      for (size_t f = 0; f < s.outputs.size(); ++f) {
        ServedFormat& host = tensors[i].out->formats[f];
        on_device = on_device || !host.device.empty();
        if (AfterAmaxRound(tensors[i], s.outputs[f])) continue;  // ServeSplitPerTensor's
        if (absl::Status st = CopyOutput(s.outputs[f], host); !st.ok()) return st;
      }
      std::lock_guard<std::mutex> host_lock(tensors[i].out->host_mu);
      tensors[i].out->host_stale = on_device;  // no reader holds a version being written
    }
    if (n > 0) {
      PARAMD_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(HostScalars() + n, static_cast<float*>(step_scalars_.get()) + n,
                          n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    }
    return absl::OkStatus();
  }

  // A split tensor's fp8_tensor output waits for the whole tensor's amax (TensorStep::whole_amax):
  // the step's launch leaves it out, and ServeSplitPerTensor writes it after the owners' round.
  // Its fp8_delayed output is cast with a scale known before the step, in the launch.
  static bool AfterAmaxRound(const TensorStep& t, const DeviceOutput& o) {
    return t.whole_amax && o.key.recipe == v1::RECIPE_FP8_TENSOR;
  }

  // A served format the step wrote into the state's own buffers, on to where the version keeps
  // it: its exported GPU bytes, else its host bytes (queued on stream_).
  absl::Status CopyOutput(const DeviceOutput& d, ServedFormat& host) {
    if (WritesInPlace(host)) return absl::OkStatus();
    if (!host.device.empty()) {
      auto* exported = static_cast<uint8_t*>(host.device.get());
      PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(exported, d.data.get(), d.data.bytes(),
                                                  cudaMemcpyDeviceToDevice, stream_));
      if (d.scales.bytes() > 0) {
        PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(exported + host.layout.data_bytes,
                                                    d.scales.get(), d.scales.bytes(),
                                                    cudaMemcpyDeviceToDevice, stream_));
      }
      return absl::OkStatus();
    }
    PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host.data(), d.data.get(), d.data.bytes(),
                                                cudaMemcpyDeviceToHost, stream_));
    if (d.scales.bytes() > 0) {
      PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host.scales(), d.scales.get(), d.scales.bytes(),
                                                  cudaMemcpyDeviceToHost, stream_));
    }
    return absl::OkStatus();
  }

  // The split tensors' round between their passes (DESIGN.md §7), after the queued step: each
  // offers the amax of its rows' new master (down in HostScalars() + n once the stream has run)
  // and gets the whole tensor's, which replaces it there for the fp8_delayed history. Its
  // fp8_tensor scale comes from that amax, as one daemon's step would make it, and its fp8_tensor
  // outputs are cast with it in one serve launch. The host waits for the device here, as the
  // host-decided step does at its end anyway.
  absl::Status ServeSplitPerTensor(std::span<TensorStep> tensors) {
    const size_t n = tensors.size();
    if (std::none_of(tensors.begin(), tensors.end(),
                     [](const TensorStep& t) { return static_cast<bool>(t.whole_amax); })) {
      return absl::OkStatus();
    }
    PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    float* amax = HostScalars() + n;
    std::vector<kernels::CudaServeArgs> serve;
    std::vector<std::pair<size_t, size_t>> served;  // (tensor, format) of each serve
    std::vector<float> scales(n);                   // alive until the stream has run
    for (size_t i = 0; i < n; ++i) {
      TensorStep& t = tensors[i];
      if (!t.whole_amax) continue;
      absl::StatusOr<float> whole = t.whole_amax(amax[i]);
      if (!whole.ok()) return whole.status();
      amax[i] = *whole;
      auto& s = *static_cast<CudaTensorState*>(t.state);
      for (size_t f = 0; f < s.outputs.size(); ++f) {
        DeviceOutput& o = s.outputs[f];
        if (!AfterAmaxRound(t, o)) continue;
        if (served.empty() || served.back().first != i) {
          float previous = 0;
          PARAMD_CUDA_RETURN_IF_ERROR(
              cudaMemcpy(&previous, s.scalars.get(), sizeof(float), cudaMemcpyDeviceToHost));
          scales[i] = kernels::NextFp8TensorScale(*whole, previous).scale;
          PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s.scalars.get(), &scales[i], sizeof(float),
                                                      cudaMemcpyHostToDevice, stream_));
        }
        const ServedFormat& out = t.out->formats[f];
        void* data = nullptr;
        void* scale_inv = nullptr;
        if (WritesInPlace(out)) {
          data = out.device.get();
          scale_inv = static_cast<uint8_t*>(data) + o.layout.data_bytes;
        } else {
          if (absl::Status st = OwnOutput(o); !st.ok()) return st;
          data = o.data.get();
          scale_inv = o.scales.get();
        }
        serve.push_back({s.info.policy.master, s.master.get(),
                         static_cast<const int16_t*>(s.remainder.get()), s.info.rows, s.info.cols,
                         kernels::Recipe::kFp8Tensor, KernelDirection(o.key.direction),
                         static_cast<const float*>(s.scalars.get()), data, scale_inv});
        served.emplace_back(i, f);
      }
    }
    if (!serve.empty()) {
      const size_t bytes = kernels::ServeQuantizeCudaWorkspaceBytes(serve.size());
      if (serve_workspace_.bytes() < bytes) {
        serve_workspace_.Free();
        if (absl::Status st = serve_workspace_.Allocate(bytes); !st.ok()) return st;
      }
      if (absl::Status st = FromKernel(kernels::ServeQuantizeCuda(
              serve, serve_workspace_.get(), serve_workspace_.bytes(), stream_));
          !st.ok()) {
        return st;
      }
      for (const auto& [i, f] : served) {
        auto& s = *static_cast<CudaTensorState*>(tensors[i].state);
        if (absl::Status st = CopyOutput(s.outputs[f], tensors[i].out->formats[f]); !st.ok()) {
          return st;
        }
      }
    }
    PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }

  // Records step_done_ after the queued step, reports it queued (every tensor done), and waits for
  // the step.
  absl::Status Publish(std::span<TensorStep> tensors, std::chrono::steady_clock::time_point start,
                       const std::function<void()>& queued) {
    PARAMD_CUDA_RETURN_IF_ERROR(cudaEventRecord(step_done_, stream_));
    const auto enqueued = std::chrono::steady_clock::now();
    if (queued) queued();
    const auto published = std::chrono::steady_clock::now();
    PARAMD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    if (GetLogLevel() == LogLevel::kDebug) {
      float kernel_ms = 0;
      PARAMD_CUDA_RETURN_IF_ERROR(
          cudaEventElapsedTime(&kernel_ms, kernel_timing_[0], kernel_timing_[1]));
      PARAMD_LOG(DEBUG) << "cuda:" << device_ << " step of " << tensors.size()
                        << " tensors: enqueue " << Ms(start, enqueued) << " ms, publish "
                        << Ms(enqueued, published) << " ms, then the device "
                        << Ms(published, std::chrono::steady_clock::now()) << " ms (the kernel "
                        << kernel_ms << " ms); plans made " << plans_made_.load() << " for "
                        << plan_uses_ << " uses";
    }
    return absl::OkStatus();
  }

  // A tensor's device buffers for its policy (contents undefined) and its served formats' device
  // outputs, laid out as `out`'s.
  absl::StatusOr<std::unique_ptr<CudaTensorState>> Allocate(const TensorInfo& info,
                                                            const ServedTensor& out) {
    auto state = std::make_unique<CudaTensorState>(info);
    CudaTensorState& s = *state;
    s.history = kernels::AmaxHistory(info.delayed_history);
    const StateBytes bytes = PolicyStateBytes(info);
    const bool scaled_m = kernels::HasChunkScales(info.policy.exp_avg);
    const bool scaled_v = kernels::HasChunkScales(info.policy.exp_avg_sq);
    const bool split = info.policy.master == kernels::MasterType::kBf16Remainder;
    const size_t n = static_cast<size_t>(s.n);
    const size_t chunks = static_cast<size_t>(kernels::NumChunks(s.n));
    const size_t master = info.policy.master == kernels::MasterType::kFp32 ? 4 * n : 2 * n;
    for (absl::Status st :
         {s.master.Allocate(master), s.remainder.Allocate(split ? n * sizeof(int16_t) : 0),
          s.exp_avg.Allocate(static_cast<size_t>(bytes.exp_avg)),
          s.exp_avg_scale_inv.Allocate(scaled_m ? chunks * 4 : 0),
          s.exp_avg_sq.Allocate(static_cast<size_t>(bytes.exp_avg_sq)),
          s.exp_avg_sq_scale_inv.Allocate(scaled_v ? chunks * 4 : 0),
          s.scalars.Allocate(3 * sizeof(float))}) {
      if (!st.ok()) return st;
    }
    for (const ServedFormat& f : out.formats) {
      DeviceOutput& o = s.outputs.emplace_back();
      o.key = f.key;
      o.layout = f.layout;
      if (WritesInPlace(f)) continue;
      if (absl::Status st = OwnOutput(o); !st.ok()) return st;
    }
    return state;
  }

  // The state's own buffers of a served format (for versions the step cannot write in place).
  static absl::Status OwnOutput(DeviceOutput& o) {
    if (o.data.get() != nullptr) return absl::OkStatus();
    if (absl::Status st = o.data.Allocate(static_cast<size_t>(o.layout.data_bytes)); !st.ok()) {
      return st;
    }
    return o.scales.Allocate(static_cast<size_t>(o.layout.scale_bytes));
  }

  // Version 0 (or an imported version), computed on the host, into its exported GPU bytes.
  absl::Status UploadServed(const ServedTensor& out) {
    for (const ServedFormat& f : out.formats) {
      if (f.device.empty()) continue;
      PARAMD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(f.device.get(), f.bytes.data(),
                                                  static_cast<size_t>(f.bytes.size()),
                                                  cudaMemcpyHostToDevice, stream_));
    }
    return absl::OkStatus();
  }

  // Copies every rank's gradient slots up to the device.
  absl::Status Upload(std::span<TensorStep> tensors) {
    for (TensorStep& t : tensors) {
      auto& s = *static_cast<CudaTensorState*>(t.state);
      const size_t bytes =
          static_cast<size_t>(s.n) * (t.slot_type == kernels::SlotType::kBf16 ? 2 : 4);
      if (s.slots.size() != t.slots.size()) s.slots = std::vector<DeviceBuffer>(t.slots.size());
      for (size_t r = 0; r < t.slots.size(); ++r) {
        // A slot a trainer wrote into exported GPU memory (cuda_ipc) is read where it lies.
        if (r < t.device_slots.size() && t.device_slots[r] != nullptr) continue;
        if (s.slots[r].get() == nullptr) {
          if (absl::Status st = s.slots[r].Allocate(bytes); !st.ok()) return st;
        }
        const void* host = t.slots[r];
        PARAMD_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(s.slots[r].get(), host, bytes, cudaMemcpyHostToDevice, stream_));
      }
    }
    return absl::OkStatus();
  }

  // The kernels' descriptors of this step's tensors, bound to a device workspace; without `wait`
  // through page-locked staging, the host waiting for nothing (the previous step has run: every
  // step ends synchronized).
  absl::Status Plan(std::span<TensorStep> tensors, bool wait) {
    // Kept from step to step (grown for a bigger job only).
    if (step_scalars_.bytes() < 2 * tensors.size() * sizeof(float)) {
      step_scalars_.Free();
      if (absl::Status s = step_scalars_.Allocate(2 * tensors.size() * sizeof(float)); !s.ok()) {
        return s;
      }
    }
    // The fp8_delayed scales and the amaxes, then a step decided on the device's flag and clip.
    const int64_t host_bytes = static_cast<int64_t>((2 * tensors.size() + 2) * sizeof(float));
    if (host_scalars_.size() < host_bytes) {
      absl::StatusOr<HostBuffer> pinned = HostAllocator()->Allocate(host_bytes);
      if (!pinned.ok()) return pinned.status();
      host_scalars_ = *std::move(pinned);
    }
    std::vector<kernels::CudaStepTensor> descs;
    for (TensorStep& t : tensors) {
      auto& s = *static_cast<CudaTensorState*>(t.state);
      kernels::CudaStepTensor& d = descs.emplace_back();
      d.rows = s.info.rows;
      d.cols = s.info.cols;
      d.policy = s.info.policy;
      d.tensor_index = s.info.index;
      d.index_offset = s.info.first_element();
      d.slot_type = t.slot_type;
      for (size_t r = 0; r < s.slots.size(); ++r) {
        const bool on_device = r < t.device_slots.size() && t.device_slots[r] != nullptr;
        d.d_slots.push_back(on_device ? t.device_slots[r] : s.slots[r].get());
      }
      d.d_master = s.master.get();
      d.d_master_remainder = static_cast<int16_t*>(s.remainder.get());
      d.d_exp_avg = s.exp_avg.get();
      d.d_exp_avg_scale_inv = static_cast<float*>(s.exp_avg_scale_inv.get());
      d.d_exp_avg_sq = s.exp_avg_sq.get();
      d.d_exp_avg_sq_scale_inv = static_cast<float*>(s.exp_avg_sq_scale_inv.get());
      for (size_t f = 0; f < s.outputs.size(); ++f) {
        DeviceOutput& o = s.outputs[f];
        if (AfterAmaxRound(t, o)) continue;
        const ServedFormat& served = t.out->formats[f];
        void* data = nullptr;
        void* scales = nullptr;
        if (WritesInPlace(served)) {
          data = served.device.get();
          if (o.layout.scale_bytes > 0) {
            scales = static_cast<uint8_t*>(served.device.get()) + o.layout.data_bytes;
          }
        } else {
          if (absl::Status st = OwnOutput(o); !st.ok()) return st;
          data = o.data.get();
          scales = o.scales.get();
        }
        d.outputs.push_back(
            {KernelRecipe(o.key.recipe), KernelDirection(o.key.direction), data, scales});
      }
      // The fp8_tensor scale stays with the tensor (the next step starts from it); the
      // fp8_delayed scale and the amax are the step's, in one array for all tensors.
      // A split tensor's scale waits for the owners' amax (ServeSplitPerTensor).
      d.d_fp8_tensor_scale = t.whole_amax ? nullptr : static_cast<float*>(s.scalars.get());
      auto* step_scalars = static_cast<float*>(step_scalars_.get());
      d.d_fp8_delayed_scale = step_scalars + descs.size() - 1;
      d.d_master_amax = step_scalars + tensors.size() + descs.size() - 1;
    }
    return UsePlan(std::move(descs), wait);
  }

  // Makes the plan of `descs` the step's: a kept one made from the same descriptors (bound
  // already: only its counters are zeroed), else one made now into the least recently used place,
  // bound without waiting unless `wait`. A place's workspace is allocated only when it is too
  // small; where that fails (another job filled the GPU) a kept workspace large enough is taken
  // over, so a job whose steps ran before still steps.
  absl::Status UsePlan(std::vector<kernels::CudaStepTensor> descs, bool wait) {
    ++plan_uses_;
    for (KeptPlan& kept : plans_) {
      if (kept.bound && kept.descs == descs) {
        kept.used = plan_uses_;
        plan_ = &kept;
        return FromKernel(kept.plan.ResetCounters(stream_));
      }
    }
    kernels::CudaStepPlan made;
    if (absl::Status s = FromKernel(kernels::CudaStepPlan::Create(descs, &made)); !s.ok()) {
      return s;
    }
    plans_made_.fetch_add(1);
    KeptPlan* place =
        &*std::min_element(plans_.begin(), plans_.end(),
                           [](const KeptPlan& a, const KeptPlan& b) { return a.used < b.used; });
    if (place->workspace.bytes() < made.workspace_bytes()) {
      place->bound = false;
      place->workspace.Free();
      if (absl::Status s = place->workspace.Allocate(made.workspace_bytes()); !s.ok()) {
        KeptPlan* roomy = nullptr;
        for (KeptPlan& kept : plans_) {
          if (kept.workspace.bytes() >= made.workspace_bytes()) roomy = &kept;
        }
        if (roomy == nullptr) return s;
        place = roomy;
      }
    }
    place->bound = false;
    place->descs = std::move(descs);
    place->plan = std::move(made);
    place->used = plan_uses_;
    plan_ = place;
    if (wait) {
      PARAMD_RETURN_IF_ERROR(
          FromKernel(place->plan.Bind(place->workspace.get(), place->workspace.bytes(), stream_)));
      place->bound = true;
      return absl::OkStatus();
    }
    const auto staging_bytes = static_cast<int64_t>(place->plan.workspace_bytes());
    if (place->staging.size() < staging_bytes) {
      absl::StatusOr<HostBuffer> pinned = HostAllocator()->Allocate(staging_bytes);
      if (!pinned.ok()) return pinned.status();
      place->staging = *std::move(pinned);
    }
    PARAMD_RETURN_IF_ERROR(FromKernel(place->plan.BindAsync(
        place->workspace.get(), place->workspace.bytes(), place->staging.data(), stream_)));
    place->bound = true;
    return absl::OkStatus();
  }

  // A step's plan kept across steps, with the workspace its descriptors are bound in.
  struct KeptPlan {
    std::vector<kernels::CudaStepTensor> descs;  // what it was made from
    kernels::CudaStepPlan plan;
    bool bound = false;  // its descriptors are in `workspace`
    DeviceBuffer workspace;
    HostBuffer staging;  // page-locked: the descriptors on their way up (BindAsync)
    uint64_t used = 0;   // the plan_uses_ count of its last step (the least recent is replaced)
  };
  kernels::CudaStepPlan& plan() { return plan_->plan; }

  const int device_;
  kernels::ThreadPool pool_;  // version 0 on the host
  std::mutex mu_;             // one step (or state creation) at a time on the stream
  cudaStream_t stream_ = nullptr;
  cudaStream_t copy_stream_ = nullptr;  // host readers' copies down (ReadyHostBytes)
  // Recorded on stream_ after each step's work (interprocess: cuda_ipc trainers wait for it).
  cudaEvent_t step_done_ = nullptr;
  cudaEvent_t kernel_timing_[2] = {nullptr, nullptr};  // around the fused kernel (debug log)
  std::string step_event_;                             // its cudaIpcEventHandle_t bytes
  std::atomic<int64_t> host_copies_{0};
  // Steps' plans, kept: a job's steps cycle through a few sets of buffers (its served versions, its
  // slot sets or the trainers' lent gradients: 6 combinations at most for a job of kSlotSets slot
  // sets and 2 served versions in use), so a step's descriptors are most often a step's of a few
  // steps back, and its plan is reused instead of made and sent up again.
  static constexpr size_t kKeptPlans = 8;
  std::array<KeptPlan, kKeptPlans> plans_;
  KeptPlan* plan_ = nullptr;  // the step's (UsePlan)
  uint64_t plan_uses_ = 0;
  std::atomic<int64_t> plans_made_{0};  // plans made, not kept ones reused (plans_made())
  static constexpr int kDecisionFlags = 16;
  HostBuffer decision_flags_;  // page-locked ring: steps decided on the device, their flags
  uint64_t decided_steps_ = 0;
  DeviceBuffer finite_;           // the gradient check's flag
  DeviceBuffer clip_;             // a step decided on the device: its clip (StepDecisionCuda)
  DeviceBuffer norm_sums_;        // the gradient check's block sums, as many as the biggest job's
  DeviceBuffer step_scalars_;     // a step's fp8_delayed scales, then its masters' amaxes
  DeviceBuffer serve_workspace_;  // split tensors' fp8_tensor serve (ServeSplitPerTensor)
  // The same on the host, page-locked: one asynchronous copy each way, where pageable memory would
  // make every copy wait for the device. Grown for a bigger job only.
  HostBuffer host_scalars_;
  float* HostScalars() { return reinterpret_cast<float*>(host_scalars_.data()); }
  std::mutex health_mu_;
  absl::Status unusable_;  // not OK once the context failed (Health)
  std::string uuid_;       // the GPU's UUID bytes (trainers mapping its memory match it)
  std::unique_ptr<ExportedMemories> exported_;  // each job's exported GPU memory
  LentMemory lent_{device_};                    // trainers' lent gradients, opened here
};

}  // namespace

absl::StatusOr<int> CudaDeviceCount() {
  std::string why;
  if (!kernels::CudaDeviceAvailable(&why)) return absl::FailedPreconditionError(why);
  int count = 0;
  PARAMD_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  return count;
}

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device,
                                                         const v1::DaemonConfig& config) {
  auto backend = std::make_unique<CudaBackend>(device, config.step_threads());
  if (absl::Status s = backend->Init(); !s.ok()) return s;
  return backend;
}

}  // namespace paramd
