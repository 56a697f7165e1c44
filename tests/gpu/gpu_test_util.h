// Shared by the GPU tests: the skip rule, device buffers, random data and byte comparisons.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cuda_step.h"

namespace paramd::kernels::testing {

// Every GPU test skips, with the reason, where no CUDA device can be used (STYLE.md habit 12).
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!CudaDeviceAvailable(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
};

template <typename Param>
class CudaParamTest : public CudaTest, public ::testing::WithParamInterface<Param> {};

#define PARAMD_CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

// A device allocation of `bytes` (at least 1), freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes) != cudaSuccess) ptr_ = nullptr;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      if (ptr_ != nullptr) cudaFree(ptr_);
      ptr_ = o.ptr_;
      bytes_ = o.bytes_;
      o.ptr_ = nullptr;
    }
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

  // Host -> device / device -> host, synchronous.
  template <typename T>
  cudaError_t Upload(const std::vector<T>& host) {
    return cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  template <typename T>
  std::vector<T> Download(size_t count) const {
    std::vector<T> out(count);
    if (count > 0) cudaMemcpy(out.data(), ptr_, count * sizeof(T), cudaMemcpyDeviceToHost);
    return out;
  }
  // Fills with a byte pattern, so unwritten outputs show.
  cudaError_t Poison(unsigned char value = 0xA5) { return cudaMemset(ptr_, value, bytes_); }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Bytes a and b are equal, except that FP32 words (fp32 = true) that are both NaN match whatever
// their payloads (cuda_step.h: the GPU's arithmetic has one canonical NaN). Returns "" or where
// they first differ.
inline std::string CompareBytes(const void* got, const void* want, size_t bytes, bool fp32,
                                const std::string& what) {
  const auto* g = static_cast<const unsigned char*>(got);
  const auto* w = static_cast<const unsigned char*>(want);
  if (std::memcmp(g, w, bytes) == 0) return "";
  size_t mismatches = 0, first = bytes;
  const size_t unit = fp32 ? 4 : 1;
  for (size_t i = 0; i + unit <= bytes; i += unit) {
    if (std::memcmp(g + i, w + i, unit) == 0) continue;
    if (fp32) {
      uint32_t a, b;
      std::memcpy(&a, g + i, 4);
      std::memcpy(&b, w + i, 4);
      if ((a & 0x7FFFFFFFu) > 0x7F800000u && (b & 0x7FFFFFFFu) > 0x7F800000u) continue;
    }
    if (first == bytes) first = i;
    ++mismatches;
  }
  if (mismatches == 0) return "";
  std::ostringstream os;
  os << what << ": " << mismatches << " of " << bytes / unit << " " << (fp32 ? "words" : "bytes")
     << " differ, first at byte " << first << ": got 0x" << std::hex;
  for (size_t k = 0; k < unit; ++k) os << static_cast<int>(g[first + unit - 1 - k]);
  os << ", want 0x";
  for (size_t k = 0; k < unit; ++k) os << static_cast<int>(w[first + unit - 1 - k]);
  return os.str();
}

// Gradient-like values: mostly N(0, scale), with zeros, FP32 subnormals, tiny and large values
// (squares stay finite) mixed in.
inline float GradValue(std::mt19937_64& rng, float scale) {
  std::uniform_int_distribution<int> kind(0, 99);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  switch (kind(rng)) {
    case 0:
      return 0.0f;
    case 1:
      return std::bit_cast<float>(static_cast<uint32_t>(rng() & 0x807FFFFFu));  // subnormal
    case 2:
      return normal(rng) * 1e-30f;
    case 3:
      return normal(rng) * 1e15f;
    default:
      return normal(rng) * scale;
  }
}

}  // namespace paramd::kernels::testing
