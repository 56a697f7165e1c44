// The transport conformance suite for `cuda_ipc`, against a daemon on cuda:0 in this process
// (label gpu): it skips with the reason where no GPU can be used.
#include "tests/conformance/transport_conformance.h"

namespace paramd::testing {

INSTANTIATE_TEST_SUITE_P(CudaIpc, TransportConformanceTest, ::testing::Values("cuda_ipc"));

}  // namespace paramd::testing
