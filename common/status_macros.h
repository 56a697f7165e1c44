// The two status macros Abseil 20220623 lacks.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define PARAMD_CONCAT_INNER_(a, b) a##b
#define PARAMD_CONCAT_(a, b) PARAMD_CONCAT_INNER_(a, b)

// Returns the status of `expr` from the enclosing function when it is not OK.
#define PARAMD_RETURN_IF_ERROR(expr)            \
  do {                                          \
    if (absl::Status _st = (expr); !_st.ok()) { \
      return _st;                               \
    }                                           \
  } while (0)

// `lhs = value of expr`, or returns its status from the enclosing function.
#define PARAMD_ASSIGN_OR_RETURN(lhs, expr) \
  PARAMD_ASSIGN_OR_RETURN_IMPL_(PARAMD_CONCAT_(_statusor_, __LINE__), lhs, expr)
#define PARAMD_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return std::move(tmp).status();      \
  lhs = std::move(tmp).value()
