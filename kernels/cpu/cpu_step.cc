#include "kernels/cpu_step.h"

#include <algorithm>
#include <mutex>
#include <vector>

namespace paramd::kernels {
namespace {

// The first error of a parallel loop, kept under a lock, and the amax combined likewise.
class StepOutcome {
 public:
  void Fail(KStatus status) {
    std::lock_guard<std::mutex> lock(mu_);
    if (status_.ok()) status_ = std::move(status);
  }
  void AddAmax(float amax) {
    std::lock_guard<std::mutex> lock(mu_);
    amax_ = AmaxCombine(amax_, amax);
  }
  KStatus status() const { return status_; }
  float amax() const { return amax_; }

 private:
  std::mutex mu_;
  KStatus status_ = KStatus::Ok();
  float amax_ = 0.0f;
};

// Elements per block of a tensor stepped in element blocks: kDefaultGrain, or fewer where that
// would leave the pool's threads fewer than four blocks each, so a small tensor (a 2048 x 256
// projection: 8 blocks of the default for 14 threads) still spreads over every thread. Whole
// spans of 512 elements: blocks start on the moments' 128-element chunks and on 64-byte
// boundaries for the streamed outputs.
int64_t StepGrain(int64_t n, int threads) {
  constexpr int64_t kSpan = 512;
  constexpr int64_t kMinGrain = 16 * kSpan;
  const int64_t blocks = 4 * int64_t{std::max(threads, 1)};
  const int64_t per_block = (n + blocks - 1) / blocks;
  return std::clamp((per_block + kSpan - 1) / kSpan * kSpan, kMinGrain, kDefaultGrain);
}

// Whether fp8_block `f` can take its blocks' amaxes from the step's chunk amaxes: it is cut from
// what the step stores as its new FP32 values (the FP32 master or out_fp32), in whole blocks.
bool TakesChunkAmaxes(const ServeArgs& f, const FusedStepArgs& step) {
  const bool from_step = (step.policy.master == MasterType::kFp32 &&
                          f.master == static_cast<const float*>(step.master)) ||
                         (step.out_fp32 != nullptr && f.master == step.out_fp32);
  return f.recipe == Recipe::kFp8Block && from_step && f.cols % kFp8BlockSize == 0;
}

KStatus CutRows(std::span<const ServeArgs> cut, int64_t row_begin, int64_t row_end, CpuPath path) {
  for (const ServeArgs& f : cut) {
    if (KStatus st = ServeQuantizeCpu(f, row_begin, row_end, path); !st.ok()) return st;
  }
  return KStatus::Ok();
}

}  // namespace

KStatus CpuCutPanels(std::span<const ServeArgs> formats, int64_t rows, ThreadPool& pool,
                     bool as_guest, CpuPath path) {
  if (formats.empty()) return KStatus::Ok();
  StepOutcome outcome;
  const auto cut = [&](int64_t p0, int64_t p1) {
    KStatus st = CutRows(formats, p0 * kServePanelRows, std::min(rows, p1 * kServePanelRows), path);
    if (!st.ok()) outcome.Fail(std::move(st));
  };
  const int64_t panels = (rows + kServePanelRows - 1) / kServePanelRows;
  if (as_guest) {
    pool.ParallelForAsGuest(panels, 1, cut);
  } else {
    pool.ParallelFor(panels, 1, cut);
  }
  return outcome.status();
}

KStatus CpuTensorStep(const CpuTensorStepArgs& args, ThreadPool& pool,
                      CpuTensorStepResult* result) {
  const int64_t rows = args.rows, cols = args.cols;
  if (rows < 0 || cols < 0 || rows * cols != args.step.numel) {
    return KStatus(Code::kInvalidArgument, "CpuTensorStep: rows * cols must be step.numel");
  }
  // Out of place with no format cut from the new master, nothing reads it after the pass.
  FusedStepArgs step = args.step;
  step.stream_master = args.cut.empty() && args.per_tensor.empty();
  StepOutcome outcome;
  const int64_t panels = (rows + kServePanelRows - 1) / kServePanelRows;
  if (panels >= 2 && !args.cut.empty()) {
    // fp8_block cut from the step's values takes its amaxes from the step's chunk amaxes (one
    // read of the panel's new master, for the casts, where there were two).
    const bool chunked = std::any_of(args.cut.begin(), args.cut.end(),
                                     [&](const ServeArgs& f) { return TakesChunkAmaxes(f, step); });
    pool.ParallelFor(panels, 1, [&](int64_t p0, int64_t p1) {
      // Where chunked, this call's buffer for them and the formats pointing into it.
      std::vector<uint32_t> chunk_amax;
      std::vector<ServeArgs> chunked_cut;
      std::span<const ServeArgs> cut = args.cut;
      if (chunked) {
        chunk_amax.resize(kServePanelRows * cols / kChunkElements);
        chunked_cut.assign(args.cut.begin(), args.cut.end());
        for (ServeArgs& f : chunked_cut) {
          if (TakesChunkAmaxes(f, step)) f.chunk_amax_bits = chunk_amax.data();
        }
        cut = chunked_cut;
      }
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t r0 = p * kServePanelRows, r1 = std::min(rows, r0 + kServePanelRows);
        float panel_amax = 0.0f;
        KStatus st = FusedStepCpu(step, r0 * cols, r1 * cols, args.path, &panel_amax,
                                  chunked ? chunk_amax.data() : nullptr);
        if (st.ok()) st = CutRows(cut, r0, r1, args.path);
        if (!st.ok()) return outcome.Fail(std::move(st));
        outcome.AddAmax(panel_amax);
      }
    });
  } else {
    const int64_t grain = StepGrain(args.step.numel, pool.num_threads());
    pool.ParallelFor(args.step.numel, grain, [&](int64_t begin, int64_t end) {
      float block_amax = 0.0f;
      KStatus st = FusedStepCpu(step, begin, end, args.path, &block_amax);
      if (!st.ok()) return outcome.Fail(std::move(st));
      outcome.AddAmax(block_amax);
    });
    if (outcome.status().ok()) {
      if (KStatus st = CutRows(args.cut, 0, rows, args.path); !st.ok()) outcome.Fail(std::move(st));
    }
  }
  if (KStatus st = outcome.status(); !st.ok()) return st;

  float amax = outcome.amax();
  if (args.whole_amax) {
    if (KStatus st = args.whole_amax(amax, &amax); !st.ok()) return st;
  }
  const float current = NextFp8TensorScale(amax, args.previous_tensor_scale).scale;
  std::vector<ServeArgs> per_tensor(args.per_tensor.begin(), args.per_tensor.end());
  for (ServeArgs& serve : per_tensor) {
    if (serve.recipe == Recipe::kFp8Tensor) serve.tensor_scale = current;
  }
  if (KStatus st = CpuCutPanels(per_tensor, rows, pool, false, args.path); !st.ok()) return st;
  result->amax = amax;
  result->tensor_scale = current;
  return KStatus::Ok();
}

}  // namespace paramd::kernels
