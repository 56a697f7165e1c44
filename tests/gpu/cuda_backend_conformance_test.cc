// The backend conformance suite on cuda:0 (label gpu): the same bits as the independent reference,
// so the same as the cpu backend. Skips with the reason where no GPU can be used.
#include "common/config.h"
#include "server/backend/backends.h"
#include "tests/conformance/backend_conformance.h"

namespace paramd::testing {

INSTANTIATE_TEST_SUITE_P(Cuda, BackendConformanceTest,
                         ::testing::Values(BackendCase{
                             "cuda0",
                             []() -> absl::StatusOr<std::unique_ptr<Backend>> {
                               v1::DaemonConfig config;
                               config.set_backend("cuda:0");
                               return MakeBackend(WithDefaults(config));
                             }}),
                         [](const auto& info) { return info.param.name; });

}  // namespace paramd::testing
