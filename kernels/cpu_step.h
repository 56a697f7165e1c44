// One tensor's whole step on the CPU, composed once for everyone who runs it: the daemon's cpu
// backend (server/backend/cpu_backend.cc) and the kernel benchmark (bench/kernels) call this, so
// the benchmark measures what the daemon runs.
//
// The composition (DESIGN.md §10):
//   1. the fused step (FusedStepCpu) spread over the pool's threads: with cut formats (block,
//      mxfp8, columnwise: ServeQuantizeCpu) over 128-row panels, each panel's formats written
//      right after the panel is stepped, while its new master is in cache (fp8_block cut from the
//      step's FP32 values takes its blocks' amaxes from the step's chunk amaxes,
//      FusedStepCpu's chunk_amax_bits, so it reads the panel once); without (every format
//      in the pass, or none), and for a tensor of fewer than two panels, in element blocks small
//      enough to give every thread several (a panel per block left threads idle: a 2048 x 2048
//      tensor is 16 panels for 14 threads, a 256 x 2048 one 2), the formats cut after;
//   2. the amax of the new stored master, combined over the panels (AmaxCombine: any order, same
//      bits);
//   3. the per-tensor formats in a second, lighter pass: fp8_tensor with the scale of this step's
//      amax (NextFp8TensorScale), fp8_delayed with the scale the caller took from its history.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "kernels/cpu/thread_pool.h"
#include "kernels/fused_step.h"
#include "kernels/recipes.h"
#include "kernels/status.h"

namespace paramd::kernels {

struct CpuTensorStepArgs {
  // step.numel == rows * cols; its out_* are the in-pass outputs. Its stream_master is set here:
  // on where neither `cut` nor `per_tensor` has a format (nothing reads the new master after the
  // pass).
  FusedStepArgs step;
  int64_t rows = 0;
  int64_t cols = 0;
  // Formats cut from the FP32 values after each panel (their `master`: the served FP32 bytes, an
  // FP32 master, or a working copy the step writes through out_fp32).
  std::span<const ServeArgs> cut;
  // Per-tensor formats of the second pass. fp8_tensor's tensor_scale is ignored (this step's amax
  // gives it); fp8_delayed's is the scale used.
  std::span<const ServeArgs> per_tensor;
  float previous_tensor_scale = 1.0f;  // fp8_tensor: the scale of the previous step
  CpuPath path = CpuPath::kAuto;
  // A row range of a tensor split over owners (RngStream::index_offset): turns the amax of this
  // range's new master into the whole tensor's, every owner's combined (AmaxCombine), between the
  // two passes (DESIGN.md §3), so the per-tensor formats and the result's amax are the whole
  // tensor's. Its error fails the step. Null for a whole tensor.
  std::function<KStatus(float range_amax, float* whole_amax)> whole_amax;
};

struct CpuTensorStepResult {
  float amax = 0.0f;          // of the new stored master (for an fp8_delayed history)
  float tensor_scale = 1.0f;  // fp8_tensor: the scale this step served with
};

// Cuts every format of `formats` from rows [0, rows) of their FP32 values on `pool`'s threads,
// 128-row panel by panel, a panel's formats one after another while its values are in cache.
// `as_guest`: the caller is a thread that only borrows the pool (ThreadPool::ParallelForAsGuest).
// Returns the first error of a format.
KStatus CpuCutPanels(std::span<const ServeArgs> formats, int64_t rows, ThreadPool& pool,
                     bool as_guest = false, CpuPath path = CpuPath::kAuto);

// Runs the whole step of one tensor on `pool`'s threads. Returns the first error of a kernel
// (nothing is published on error: the caller fails the step).
KStatus CpuTensorStep(const CpuTensorStepArgs& args, ThreadPool& pool, CpuTensorStepResult* result);

}  // namespace paramd::kernels
