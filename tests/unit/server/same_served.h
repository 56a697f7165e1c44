// Compares what two jobs of the same registration publish, format by format, for the server tests
// that run one job two ways (with and without a landed check, an early step) and expect the same
// bits.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>

#include "server/backend/backend.h"
#include "server/job/job.h"

namespace paramd::testing {

// Expects version `version` of each of the first `tensors` tensors published by both jobs, with
// the same version, outcome and bytes of every format.
inline void ExpectSameServed(const Job& a, const Job& b, int tensors, int64_t version) {
  for (int i = 0; i < tensors; ++i) {
    SCOPED_TRACE(a.Spec(i).name());
    const std::shared_ptr<const ServedTensor> x = a.Served(i, version);
    const std::shared_ptr<const ServedTensor> y = b.Served(i, version);
    if (x == nullptr || y == nullptr) {
      ADD_FAILURE() << "version " << version << " not published";
      continue;
    }
    EXPECT_EQ(x->version, y->version);
    EXPECT_EQ(x->skipped.load(), y->skipped.load());
    EXPECT_EQ(x->formats.size(), y->formats.size());
    for (size_t f = 0; f < x->formats.size() && f < y->formats.size(); ++f) {
      EXPECT_EQ(x->formats[f].bytes.size(), y->formats[f].bytes.size());
      if (x->formats[f].bytes.size() != y->formats[f].bytes.size()) continue;
      EXPECT_EQ(std::memcmp(x->formats[f].bytes.data(), y->formats[f].bytes.data(),
                            static_cast<size_t>(x->formats[f].bytes.size())),
                0)
          << FormatName(x->formats[f].key);
    }
  }
}

}  // namespace paramd::testing
