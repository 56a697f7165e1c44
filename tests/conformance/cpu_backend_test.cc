// The backend conformance suite on the cpu backend.
#include "server/backend/cpu_backend.h"

#include "tests/conformance/backend_conformance.h"

namespace paramd::testing {

INSTANTIATE_TEST_SUITE_P(Cpu, BackendConformanceTest,
                         ::testing::Values(BackendCase{
                             "cpu",
                             []() -> absl::StatusOr<std::unique_ptr<Backend>> {
                               return std::make_unique<CpuBackend>(2);
                             }}),
                         [](const auto& info) { return info.param.name; });

}  // namespace paramd::testing
