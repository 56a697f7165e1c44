// The transport conformance suite, instantiated for `inline`.
#include "tests/conformance/transport_conformance.h"

namespace paramd::testing {

INSTANTIATE_TEST_SUITE_P(Inline, TransportConformanceTest, ::testing::Values("inline"));

}  // namespace paramd::testing
