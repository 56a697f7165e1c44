// The element casts of the state pipeline (kernels/cpu/state_codec.h) on every CPU path: nearest
// equals kernels/formats.h, decoding equals it for every code, stochastic rounding equals the
// independent reference for the same random word, and is unbiased.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/fused_step_paths.h"
#include "kernels/formats.h"
#include "kernels/philox.h"
#include "reference/policy_reference.h"
#include "tests/unit/kernels/kernels_test_util.h"

namespace paramd::kernels {
namespace {

using cpu_internal::CodecFormat;

uint32_t NearestByFormats(CodecFormat f, float x) {
  switch (f) {
    case CodecFormat::kE4m3:
      return E4m3FromFloat(x);
    case CodecFormat::kFp16:
      return Fp16FromFloat(x);
    default:
      return Bf16FromFloat(x);
  }
}

float DecodeByFormats(CodecFormat f, uint32_t code) {
  switch (f) {
    case CodecFormat::kE4m3:
      return FloatFromE4m3(static_cast<uint8_t>(code));
    case CodecFormat::kFp16:
      return FloatFromFp16(static_cast<uint16_t>(code));
    default:
      return FloatFromBf16(static_cast<uint16_t>(code));
  }
}

const reference::MiniFormatRef& RefFormat(CodecFormat f) {
  switch (f) {
    case CodecFormat::kE4m3:
      return reference::kE4m3Ref;
    case CodecFormat::kFp16:
      return reference::kFp16Ref;
    default:
      return reference::kBf16Ref;
  }
}

const char* Name(CodecFormat f) {
  return f == CodecFormat::kE4m3 ? "e4m3" : f == CodecFormat::kFp16 ? "fp16" : "bf16";
}

constexpr CodecFormat kFormats[] = {CodecFormat::kE4m3, CodecFormat::kFp16, CodecFormat::kBf16};

// FP32 inputs: a stride through every bit pattern, plus random patterns whose exponent lies in or
// near the format's range (normals, subnormals, the overflow edge), plus ties and edges.
std::vector<float> CastInputs(CodecFormat f) {
  std::vector<float> x;
  for (uint64_t b = 0; b <= 0xFFFFFFFFull; b += 4099)
    x.push_back(std::bit_cast<float>(uint32_t(b)));
  const int lo = f == CodecFormat::kBf16 ? 0 : f == CodecFormat::kFp16 ? 127 - 30 : 127 - 15;
  const int hi = f == CodecFormat::kBf16 ? 255 : f == CodecFormat::kFp16 ? 127 + 17 : 127 + 10;
  std::mt19937_64 rng(static_cast<uint64_t>(f) + 1);
  std::uniform_int_distribution<int> exp(lo, hi);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 300000; ++i) {
    const uint32_t sign = bits(rng) & 0x80000000u;
    const uint32_t mant = i % 3 == 0 ? bits(rng) & 0x7FFFFFu : (bits(rng) & 0x7FF000u) | 0x800u;
    x.push_back(std::bit_cast<float>(sign | static_cast<uint32_t>(exp(rng)) << 23 | mant));
  }
  x.resize((x.size() + 15) / 16 * 16, 0.0f);
  return x;
}

class CodecPathTest : public ::testing::TestWithParam<CpuPath> {
 protected:
  void SetUp() override {
    if (!CpuPathSupported(GetParam())) {
      GTEST_SKIP() << "this CPU cannot run the " << CpuPathName(GetParam()) << " path";
    }
  }
};

TEST_P(CodecPathTest, NearestCastsEqualTheFormatsHeader) {
  for (CodecFormat f : kFormats) {
    const std::vector<float> x = CastInputs(f);
    std::vector<uint32_t> codes(x.size());
    cpu_internal::EncodeForTest(GetParam(), f, x.data(), nullptr, codes.data(),
                                static_cast<int64_t>(x.size()));
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(codes[i], NearestByFormats(f, x[i]))
          << Name(f) << " of 0x" << std::hex << std::bit_cast<uint32_t>(x[i]);
    }
  }
}

TEST_P(CodecPathTest, DecodingEqualsTheFormatsHeaderForEveryCode) {
  for (CodecFormat f : kFormats) {
    const uint32_t count = f == CodecFormat::kE4m3 ? 256 : 65536;
    std::vector<uint32_t> codes(count);
    for (uint32_t c = 0; c < count; ++c) codes[c] = c;
    std::vector<float> out(count);
    cpu_internal::DecodeForTest(GetParam(), f, codes.data(), out.data(), count);
    for (uint32_t c = 0; c < count; ++c) {
      ASSERT_EQ(std::bit_cast<uint32_t>(out[c]), std::bit_cast<uint32_t>(DecodeByFormats(f, c)))
          << Name(f) << " code 0x" << std::hex << c;
    }
  }
}

// Casts x[i] with the word r[i] on `path` and compares each code with the reference's.
void ExpectStochasticCastsEqualTheReference(CpuPath path, CodecFormat f,
                                            const std::vector<float>& x,
                                            const std::vector<uint32_t>& r) {
  std::vector<uint32_t> codes(x.size());
  cpu_internal::EncodeForTest(path, f, x.data(), r.data(), codes.data(),
                              static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(codes[i], reference::RoundToCodeRef(RefFormat(f), x[i], &r[i]))
        << Name(f) << " of 0x" << std::hex << std::bit_cast<uint32_t>(x[i]) << " r=0x" << r[i];
  }
}

TEST_P(CodecPathTest, StochasticCastsEqualTheReference) {
  std::mt19937_64 rng(4);
  for (CodecFormat f : kFormats) {
    std::vector<float> x = CastInputs(f);
    std::vector<uint32_t> r(x.size());
    for (size_t i = 0; i < r.size(); ++i) {
      // Random words, and the extremes 0 and 2^32 - 1.
      r[i] = i % 7 == 0 ? 0u : i % 7 == 1 ? 0xFFFFFFFFu : static_cast<uint32_t>(rng());
    }
    ExpectStochasticCastsEqualTheReference(GetParam(), f, x, r);
  }
}

// Random words decide few inputs by one unit of the word: here each input (every 8th of the cast
// inputs) is cast with the words on either side of its own threshold, the smallest word the
// reference rounds down with (found by bisection), so a cast whose comparison is off by one in
// the word fails.
TEST_P(CodecPathTest, StochasticCastsEqualTheReferenceAtTheirThresholds) {
  for (CodecFormat f : kFormats) {
    const std::vector<float> all = CastInputs(f);
    std::vector<float> x;
    std::vector<uint32_t> r;
    for (size_t i = 0; i < all.size(); i += 8) {
      const uint32_t max_word = 0xFFFFFFFFu;
      const uint32_t down = reference::RoundToCodeRef(RefFormat(f), all[i], &max_word);
      uint64_t lo = 0, hi = max_word;  // the threshold lies in [lo, hi]
      while (lo < hi) {
        const uint32_t mid = static_cast<uint32_t>((lo + hi) / 2);
        if (reference::RoundToCodeRef(RefFormat(f), all[i], &mid) == down) {
          hi = mid;
        } else {
          lo = uint64_t{mid} + 1;
        }
      }
      for (int64_t w = static_cast<int64_t>(lo) - 1; w <= static_cast<int64_t>(lo) + 1; ++w) {
        if (w < 0 || w > max_word) continue;
        x.push_back(all[i]);
        r.push_back(static_cast<uint32_t>(w));
      }
    }
    while (x.size() % 16 != 0) {
      x.push_back(0.0f);
      r.push_back(0);
    }
    ExpectStochasticCastsEqualTheReference(GetParam(), f, x, r);
  }
}

TEST_P(CodecPathTest, NearestCastsEqualTheReference) {
  for (CodecFormat f : kFormats) {
    const std::vector<float> x = CastInputs(f);
    std::vector<uint32_t> codes(x.size());
    cpu_internal::EncodeForTest(GetParam(), f, x.data(), nullptr, codes.data(),
                                static_cast<int64_t>(x.size()));
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(codes[i], reference::RoundToCodeRef(RefFormat(f), x[i], nullptr))
          << Name(f) << " of 0x" << std::hex << std::bit_cast<uint32_t>(x[i]);
    }
  }
}

// The nearest E4M3 cast has a short form of its own (an integer round at and above the smallest
// normal, an FP32 add below it), and the vector paths cast to FP16 in hardware with fix-ups:
// every FP32 input of the exponents where their cases meet or end (FP32 subnormals; E4M3's whole
// subnormal range and normal boundary; FP16's smallest subnormal, half of it and its normal
// boundary; each overflow edge; infinity and NaN) gives the code of kernels/formats.h, both signs.
TEST_P(CodecPathTest, NearestShortFormsEqualTheFormatsHeaderOverWholeExponents) {
  struct Case {
    CodecFormat format;
    std::vector<uint32_t> exponents;
  };
  const Case cases[] = {
      {CodecFormat::kE4m3,
       {0, 127 - 11, 127 - 10, 127 - 9, 127 - 8, 127 - 7, 127 - 6, 127 - 5, 127 + 8, 127 + 9, 255}},
      {CodecFormat::kFp16,
       {0, 127 - 26, 127 - 25, 127 - 24, 127 - 15, 127 - 14, 127 - 13, 127 + 15, 127 + 16, 255}},
  };
  constexpr int64_t kMantissas = int64_t{1} << 23;
  std::vector<float> x(kMantissas);
  std::vector<uint32_t> codes(kMantissas);
  for (const Case& c : cases) {
    for (uint32_t e : c.exponents) {
      for (uint32_t sign : {0u, 0x80000000u}) {
        for (int64_t m = 0; m < kMantissas; ++m) {
          x[m] = std::bit_cast<float>(sign | e << 23 | static_cast<uint32_t>(m));
        }
        cpu_internal::EncodeForTest(GetParam(), c.format, x.data(), nullptr, codes.data(),
                                    kMantissas);
        for (int64_t m = 0; m < kMantissas; ++m) {
          ASSERT_EQ(codes[m], NearestByFormats(c.format, x[m]))
              << Name(c.format) << " of 0x" << std::hex << std::bit_cast<uint32_t>(x[m]);
        }
      }
    }
  }
}

// The mean of many stochastic roundings of x (random words from Philox at distinct counters) is x,
// within a few standard errors of a two-point draw between the neighbouring codes.
TEST_P(CodecPathTest, StochasticRoundingIsUnbiased) {
  constexpr int kDraws = 8192;
  std::mt19937_64 rng(6);
  std::vector<uint32_t> words(kDraws), codes(kDraws);
  std::vector<float> xs(kDraws);
  for (CodecFormat f : kFormats) {
    const reference::MiniFormatRef& ref = RefFormat(f);
    // Normal values at several exponents, and values in the subnormal range.
    const float max = reference::CodeValueRef(ref, ref.max_code);
    const float min_normal = std::ldexp(1.0f, ref.min_exp);
    std::vector<float> values;
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    for (int i = 0; i < 12; ++i) values.push_back(static_cast<float>(max * unit(rng) * 0.9));
    for (int i = 0; i < 6; ++i) values.push_back(static_cast<float>(min_normal * unit(rng)));
    values.push_back(-static_cast<float>(min_normal * 37.3));
    for (size_t v = 0; v < values.size(); ++v) {
      const float x = values[v];
      std::fill(xs.begin(), xs.end(), x);
      cpu_internal::PhiloxForTest(GetParam(), 77, RoundingStream::kExpAvgSq,
                                  static_cast<uint32_t>(v), 1, 0, kDraws, words.data());
      cpu_internal::EncodeForTest(GetParam(), f, xs.data(), words.data(), codes.data(), kDraws);
      double sum = 0.0;
      for (uint32_t c : codes) sum += DecodeByFormats(f, c);
      const double mean = sum / kDraws;
      const uint32_t down = 0xFFFFFFFFu;  // never below the threshold: truncation
      const double lo = std::fabs(DecodeByFormats(f, reference::RoundToCodeRef(ref, x, &down)));
      const uint32_t up_code = reference::RoundToCodeRef(ref, std::fabs(x), &down) + 1;
      const double step = DecodeByFormats(f, up_code) - lo;
      const double p = (std::fabs(x) - lo) / step;
      const double standard_error = step * std::sqrt(p * (1.0 - p) / kDraws);
      EXPECT_LE(std::fabs(mean - x),
                testing::Tolerances::kUnbiasedStandardErrors * standard_error + 1e-12 * step)
          << Name(f) << " x=" << x << " mean=" << mean << " p=" << p;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllPaths, CodecPathTest,
                         ::testing::Values(CpuPath::kScalar, CpuPath::kAvx2, CpuPath::kAvx512),
                         [](const ::testing::TestParamInfo<CpuPath>& info) {
                           return std::string(CpuPathName(info.param));
                         });

}  // namespace
}  // namespace paramd::kernels
