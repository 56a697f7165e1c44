// FusedStepCpu: argument checks, per-step scalars, and the run-time choice of the code path. The
// paths themselves are instantiations of step_pipeline.h in fused_step_{scalar,avx2,avx512}.cc.
#include <cpuid.h>

#include <bit>
#include <cmath>
#include <cstdint>
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

bool ValidMoment(MomentType t) {
  return t == MomentType::kFp32 || t == MomentType::kBf16 || t == MomentType::kFp16 ||
         t == MomentType::kFp8;
}

bool ValidRounding(Rounding r) { return r == Rounding::kNearest || r == Rounding::kStochastic; }

KStatus ValidateMoment(const char* name, MomentType type, Rounding rounding, const void* codes,
                       const float* scale_inv) {
  const std::string n = name;
  if (!ValidMoment(type) || !ValidRounding(rounding)) return Invalid("unknown " + n + " type");
  if (codes == nullptr) return Invalid(n + " is required");
  if (HasChunkScales(type) && scale_inv == nullptr) {
    return Invalid(n + " needs its per-chunk scales");
  }
  if (type == MomentType::kFp32 && rounding == Rounding::kStochastic) {
    return Invalid("an fp32 " + n + " has nothing to round stochastically");
  }
  return KStatus::Ok();
}

// The *_in sources (fused_step.h): none set, or every one the policy uses; each its destination's
// own pointer or clear of it over the tensor's extent (numel, or the range's end without it).
KStatus ValidateSources(const FusedStepArgs& a, int64_t end) {
  const StatePolicy& p = a.policy;
  const int64_t extent = a.numel > 0 ? a.numel : end;
  const int64_t chunk_bytes = NumChunks(extent) * 4;
  struct Source {
    const char* name;
    bool used;
    const void* in;
    const void* out;
    int64_t bytes;
  };
  const Source sources[] = {
      {"master_in", true, a.master_in, a.master, extent * (p.master == MasterType::kFp32 ? 4 : 2)},
      {"master_remainder_in", p.master == MasterType::kBf16Remainder, a.master_remainder_in,
       a.master_remainder, extent * 2},
      {"exp_avg_in", true, a.exp_avg_in, a.exp_avg, extent * cpu_internal::MomentBytes(p.exp_avg)},
      {"exp_avg_scale_inv_in", HasChunkScales(p.exp_avg), a.exp_avg_scale_inv_in,
       a.exp_avg_scale_inv, chunk_bytes},
      {"exp_avg_sq_in", true, a.exp_avg_sq_in, a.exp_avg_sq,
       extent * cpu_internal::MomentBytes(p.exp_avg_sq)},
      {"exp_avg_sq_scale_inv_in", HasChunkScales(p.exp_avg_sq), a.exp_avg_sq_scale_inv_in,
       a.exp_avg_sq_scale_inv, chunk_bytes},
  };
  std::string set, missing;
  for (const Source& s : sources) {
    if (!s.used) continue;
    std::string& list = s.in != nullptr ? set : missing;
    list += (list.empty() ? "" : ", ") + std::string(s.name);
  }
  if (set.empty()) return KStatus::Ok();
  if (!missing.empty()) {
    return Invalid("the state's sources are all set or none: " + set + " set but " + missing +
                   " null");
  }
  for (const Source& s : sources) {
    if (!s.used || s.in == s.out) continue;
    const uintptr_t in = reinterpret_cast<uintptr_t>(s.in);
    const uintptr_t out = reinterpret_cast<uintptr_t>(s.out);
    const uintptr_t bytes = static_cast<uintptr_t>(s.bytes);
    if (in < out + bytes && out < in + bytes) {
      return Invalid(std::string(s.name) +
                     " partly overlaps its destination (it must be the destination itself, or "
                     "clear of it)");
    }
  }
  return KStatus::Ok();
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
  const StatePolicy& p = a.policy;
  if (p.master != MasterType::kFp32 && p.master != MasterType::kBf16Remainder &&
      p.master != MasterType::kFp16) {
    return Invalid("unknown master type");
  }
  if (a.master == nullptr) return Invalid("master is required");
  if (p.master == MasterType::kBf16Remainder && a.master_remainder == nullptr) {
    return Invalid("a bf16+remainder master needs its remainders");
  }
  if (KStatus st =
          ValidateMoment("exp_avg", p.exp_avg, p.exp_avg_rounding, a.exp_avg, a.exp_avg_scale_inv);
      !st.ok()) {
    return st;
  }
  if (KStatus st = ValidateMoment("exp_avg_sq", p.exp_avg_sq, p.exp_avg_sq_rounding, a.exp_avg_sq,
                                  a.exp_avg_sq_scale_inv);
      !st.ok()) {
    return st;
  }
  if (a.numel < 0 || (a.numel > 0 && end > a.numel)) {
    return Invalid("range end " + std::to_string(end) + " is past numel " +
                   std::to_string(a.numel));
  }
  if (KStatus st = ValidateSources(a, end); !st.ok()) return st;
  if (HasChunkScales(p.exp_avg) || HasChunkScales(p.exp_avg_sq)) {
    if (a.numel == 0) return Invalid("chunk-scaled moments need numel");
    const bool aligned =
        begin % kChunkElements == 0 && (end % kChunkElements == 0 || end == a.numel);
    if (begin < end && !aligned) {
      return Invalid(
          "with chunk-scaled moments a range must start at a multiple of 128 and end "
          "at one or at numel, not [" +
          std::to_string(begin) + ", " + std::to_string(end) + ")");
    }
  }
  return KStatus::Ok();
}

// F16C, from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports does not know it.
bool HasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
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
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && HasF16c();
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

KStatus FusedStepCpu(const FusedStepArgs& args, int64_t begin, int64_t end, CpuPath path,
                     float* master_amax, uint32_t* chunk_amax_bits) {
  if (KStatus st = Validate(args, begin, end); !st.ok()) return st;
  if (chunk_amax_bits != nullptr && begin % kChunkElements != 0) {
    const std::string what =
        "a range that starts at a multiple of 128, not " + std::to_string(begin);
    return KStatus(Code::kInvalidArgument, "FusedStepCpu: chunk amaxes need " + what);
  }
  if (path == CpuPath::kAuto) path = BestCpuPath();
  if (!CpuPathSupported(path)) {
    return KStatus(Code::kUnimplemented, std::string("FusedStepCpu: this CPU cannot run the ") +
                                             CpuPathName(path) + " path");
  }
  uint32_t amax_bits = 0;
  if (begin < end) {
    switch (path) {
      case CpuPath::kAvx512:
        amax_bits = cpu_internal::FusedStepAvx512(args, begin, end, chunk_amax_bits);
        break;
      case CpuPath::kAvx2:
        amax_bits = cpu_internal::FusedStepAvx2(args, begin, end, chunk_amax_bits);
        break;
      default:
        amax_bits = cpu_internal::FusedStepScalar(args, begin, end, chunk_amax_bits);
        break;
    }
  }
  if (master_amax != nullptr) {
    *master_amax = AmaxFromBits(amax_bits);
  }
  return KStatus::Ok();
}

namespace cpu_internal {

void EncodeForTest(CpuPath path, CodecFormat format, const float* x, const uint32_t* r,
                   uint32_t* codes, int64_t n) {
  if (path == CpuPath::kAvx512) return EncodeForTestAvx512(format, x, r, codes, n);
  if (path == CpuPath::kAvx2) return EncodeForTestAvx2(format, x, r, codes, n);
  EncodeForTestScalar(format, x, r, codes, n);
}

void DecodeForTest(CpuPath path, CodecFormat format, const uint32_t* codes, float* out, int64_t n) {
  if (path == CpuPath::kAvx512) return DecodeForTestAvx512(format, codes, out, n);
  if (path == CpuPath::kAvx2) return DecodeForTestAvx2(format, codes, out, n);
  DecodeForTestScalar(format, codes, out, n);
}

void PhiloxForTest(CpuPath path, uint64_t seed, RoundingStream stream, uint32_t k,
                   uint32_t tensor_index, uint64_t index, int64_t count, uint32_t* words) {
  const PhiloxKey key = RoundingKey(seed);
  if (path == CpuPath::kAvx512) {
    return PhiloxForTestAvx512(key, stream, k, tensor_index, index, count, words);
  }
  if (path == CpuPath::kAvx2) {
    return PhiloxForTestAvx2(key, stream, k, tensor_index, index, count, words);
  }
  PhiloxForTestScalar(key, stream, k, tensor_index, index, count, words);
}

}  // namespace cpu_internal
}  // namespace paramd::kernels
