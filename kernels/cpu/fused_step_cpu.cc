// FusedStepCpu: argument checks, per-step scalars, run-time choice of the code path, and the
// portable scalar path. The vector paths live in fused_step_avx2.cc and fused_step_avx512.cc.
#include <cmath>
#include <string>

#include "kernels/cpu/fused_step_paths.h"
#include "kernels/fused_step.h"

namespace paramd::kernels {
namespace {

CpuPath DetectBestPath() {
  if (CpuPathSupported(CpuPath::kAvx512)) return CpuPath::kAvx512;
  if (CpuPathSupported(CpuPath::kAvx2)) return CpuPath::kAvx2;
  return CpuPath::kScalar;
}

KStatus Invalid(const std::string& what) {
  return KStatus(Code::kInvalidArgument, "FusedStepCpu: " + what);
}

KStatus Validate(const FusedStepArgs& a, int64_t begin, int64_t end) {
  if (begin < 0 || end < begin) {
    return Invalid("bad element range [" + std::to_string(begin) + ", " + std::to_string(end) +
                   ")");
  }
  if (a.num_slots < 1 || a.slots == nullptr) return Invalid("needs at least one gradient slot");
  for (int r = 0; r < a.num_slots; ++r) {
    if (a.slots[r] == nullptr) return Invalid("slot " + std::to_string(r) + " is null");
  }
  if (a.slot_type != SlotType::kFp32 && a.slot_type != SlotType::kBf16) {
    return Invalid("unknown slot type");
  }
  if (a.master == nullptr || a.exp_avg == nullptr || a.exp_avg_sq == nullptr) {
    return Invalid("master, exp_avg and exp_avg_sq are required");
  }
  return KStatus::Ok();
}

}  // namespace

AdamwScalars MakeAdamwScalars(const AdamwHyper& hyper, int64_t k) {
  // beta^k through std::pow in double: the one definition every backend's host code shares.
  const double kd = static_cast<double>(k);
  AdamwScalars s;
  s.beta1 = static_cast<float>(hyper.beta1);
  s.beta2 = static_cast<float>(hyper.beta2);
  s.c1 = static_cast<float>(1.0 - hyper.beta1);
  s.c2 = static_cast<float>(1.0 - hyper.beta2);
  s.eps = static_cast<float>(hyper.eps);
  s.decay = static_cast<float>(1.0 - hyper.lr * hyper.weight_decay);
  s.step_size = static_cast<float>(hyper.lr / (1.0 - std::pow(hyper.beta1, kd)));
  s.bc2 = static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(hyper.beta2, kd)));
  return s;
}

bool CpuPathSupported(CpuPath path) {
  // Idempotent; needed when this runs from another translation unit's static initializer.
  __builtin_cpu_init();
  switch (path) {
    case CpuPath::kAuto:
    case CpuPath::kScalar:
      return true;
    case CpuPath::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case CpuPath::kAvx512:
      // The AVX-512 path also uses AVX2/FMA-encoded 256-bit helpers.
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") &&
             __builtin_cpu_supports("fma");
  }
  return false;
}

CpuPath BestCpuPath() {
  static const CpuPath best = DetectBestPath();
  return best;
}

const char* CpuPathName(CpuPath path) {
  switch (path) {
    case CpuPath::kAuto:
      return "auto";
    case CpuPath::kScalar:
      return "scalar";
    case CpuPath::kAvx2:
      return "avx2";
    case CpuPath::kAvx512:
      return "avx512";
  }
  return "unknown";
}

KStatus FusedStepCpu(const FusedStepArgs& args, int64_t begin, int64_t end, CpuPath path) {
  if (KStatus st = Validate(args, begin, end); !st.ok()) return st;
  if (path == CpuPath::kAuto) path = BestCpuPath();
  if (!CpuPathSupported(path)) {
    return KStatus(Code::kUnimplemented, std::string("FusedStepCpu: this CPU cannot run the ") +
                                             CpuPathName(path) + " path");
  }
  if (begin == end) return KStatus::Ok();
  switch (path) {
    case CpuPath::kAvx512:
      cpu_internal::FusedStepAvx512(args, begin, end);
      break;
    case CpuPath::kAvx2:
      cpu_internal::FusedStepAvx2(args, begin, end);
      break;
    default:
      cpu_internal::FusedStepScalar(args, begin, end);
      break;
  }
  return KStatus::Ok();
}

namespace cpu_internal {

void FusedStepScalar(const FusedStepArgs& args, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) StepElement(args, i);
}

}  // namespace cpu_internal
}  // namespace paramd::kernels
