// The transport conformance suite, instantiated for `shm` (the daemon's shared memory on this
// node).
#include "tests/conformance/transport_conformance.h"

namespace paramd::testing {

INSTANTIATE_TEST_SUITE_P(Shm, TransportConformanceTest, ::testing::Values("shm"));

}  // namespace paramd::testing
