// The nccl transport's communicator without a GPU: a unique id of another size and ranks out of
// range are INVALID_ARGUMENT before any device is touched, and NVLink SHARP is off by default
// while a user's NCCL_NVLS_ENABLE is kept. (tests/gpu/nccl_communicator_test.cc makes
// communicators on a GPU.)
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <string>

#include "transport/nccl/communicator.h"

namespace paramd {
namespace {

using namespace std::chrono_literals;

TEST(NcclSetupTest, AUniqueIdOfAnotherSizeOrARankOutOfRangeIsInvalidArgument) {
  const std::string id(sizeof(ncclUniqueId::internal), '\0');
  const auto short_id = NcclCommunicator::Create(id.substr(1), 2, 0, 0, 1s);
  EXPECT_EQ(short_id.status().code(), absl::StatusCode::kInvalidArgument) << short_id.status();
  EXPECT_NE(short_id.status().message().find("127"), std::string::npos) << short_id.status();
  for (auto [nranks, rank] : {std::pair{2, 2}, {2, -1}, {0, 0}}) {
    const auto out = NcclCommunicator::Create(id, nranks, rank, 0, 1s);
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << nranks << " " << rank;
  }
}

TEST(NcclSetupTest, NvlinkSharpIsOffUnlessTheUserSetIt) {
  unsetenv("NCCL_NVLS_ENABLE");
  DefaultNcclEnvironment();
  ASSERT_NE(getenv("NCCL_NVLS_ENABLE"), nullptr);
  EXPECT_STREQ(getenv("NCCL_NVLS_ENABLE"), "0");
  setenv("NCCL_NVLS_ENABLE", "1", 1);
  DefaultNcclEnvironment();
  EXPECT_STREQ(getenv("NCCL_NVLS_ENABLE"), "1");
  unsetenv("NCCL_NVLS_ENABLE");
}

}  // namespace
}  // namespace paramd
