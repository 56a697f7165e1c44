// The element dtypes paramd stores and serves (DESIGN.md §3), listed once. Everything else — the
// enum, sizes, names, storage types and the dispatcher — is generated from PARAMD_DTYPE_LIST, so
// adding a dtype is one line here (STYLE.md habit 10). Which dtypes a recipe or state policy
// accepts is an explicit short list where that recipe or policy is defined, not a product of
// this one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace paramd::kernels {

// X(enumerator, name, storage type). The storage type holds one code; its size is the dtype's.
#define PARAMD_DTYPE_LIST(X) \
  X(kFp32, "fp32", float)    \
  X(kBf16, "bf16", uint16_t) \
  X(kFp16, "fp16", uint16_t) \
  X(kE4m3, "e4m3", uint8_t)  \
  X(kE5m2, "e5m2", uint8_t)  \
  X(kE8m0, "e8m0", uint8_t)

enum class DType : uint8_t {
#define PARAMD_DTYPE_ENUMERATOR(id, name, storage) id,
  PARAMD_DTYPE_LIST(PARAMD_DTYPE_ENUMERATOR)
#undef PARAMD_DTYPE_ENUMERATOR
};

struct DTypeInfo {
  DType dtype;
  const char* name;
  size_t size;  // bytes per element
};

// Indexed by the enum's value.
inline constexpr DTypeInfo kDTypes[] = {
#define PARAMD_DTYPE_INFO(id, name, storage) {DType::id, name, sizeof(storage)},
    PARAMD_DTYPE_LIST(PARAMD_DTYPE_INFO)
#undef PARAMD_DTYPE_INFO
};
inline constexpr int kNumDTypes = static_cast<int>(sizeof(kDTypes) / sizeof(kDTypes[0]));

constexpr const DTypeInfo& DTypeInfoOf(DType d) { return kDTypes[static_cast<int>(d)]; }
constexpr size_t DTypeSize(DType d) { return DTypeInfoOf(d).size; }
constexpr const char* DTypeName(DType d) { return DTypeInfoOf(d).name; }

// The dtype of a name as DTypeName spells it ("fp32", "e4m3", ...); nullopt for anything else.
constexpr std::optional<DType> DTypeFromName(std::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (name == info.name) return info.dtype;
  }
  return std::nullopt;
}

// A dtype as a type: DTypeTag<DType::kBf16>::Storage is uint16_t, ::kDType is DType::kBf16.
template <DType kD>
struct DTypeTag;
#define PARAMD_DTYPE_TAG(id, name, storage)    \
  template <>                                  \
  struct DTypeTag<DType::id> {                 \
    using Storage = storage;                   \
    static constexpr DType kDType = DType::id; \
    static constexpr const char* kName = name; \
  };
PARAMD_DTYPE_LIST(PARAMD_DTYPE_TAG)
#undef PARAMD_DTYPE_TAG

// The one dispatcher from a run-time dtype to compile-time code: calls f(DTypeTag<d>{}) and
// returns its result (every instantiation must return the same type). A value outside the enum is
// a broken invariant and traps.
template <typename F>
constexpr decltype(auto) VisitDType(DType d, F&& f) {
  switch (d) {
#define PARAMD_DTYPE_CASE(id, name, storage) \
  case DType::id:                            \
    return f(DTypeTag<DType::id>{});
    PARAMD_DTYPE_LIST(PARAMD_DTYPE_CASE)
#undef PARAMD_DTYPE_CASE
  }
  __builtin_trap();
}

}  // namespace paramd::kernels
