// The behaviour every backend shares (server/backend/backend.h), written once and instantiated per
// backend in a few lines (cpu_backend_test.cc; tests/gpu/cuda_backend_conformance_test.cc on the
// GPU machine): a job registered on the backend serves every format of every version bit for bit as
// the independent scalar model (paramd_reference), for state policies of every kind; skipped and
// clipped steps follow DESIGN.md §2; an export imported into a second job continues bit for bit;
// a bad read of the state is a status; a tensor split in row ranges over backends equals the whole
// (split_tensor_conformance.cc). A backend that cannot be made here skips with the reason.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/backend/backend.h"

namespace paramd::testing {

struct BackendCase {
  std::string name;
  std::function<absl::StatusOr<std::unique_ptr<Backend>>()> make;
};
inline void PrintTo(const BackendCase& c, std::ostream* os) { *os << c.name; }

class BackendConformanceTest : public ::testing::TestWithParam<BackendCase> {
 protected:
  void SetUp() override;
  // A fresh backend of the case's kind (one per job, as one daemon has one).
  std::unique_ptr<Backend> MakeBackend();

 private:
  std::string why_not_;
};

}  // namespace paramd::testing
