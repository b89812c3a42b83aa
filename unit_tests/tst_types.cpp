// Storage types and the pooling exp: KPool's conversions against the
// reference's independent ones, exhaustively where the domain allows.

#include <KPoolTestUtils.hpp>

#include <cmath>
#include <limits>

namespace {

using namespace KPoolTest;

float from_bits32(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Every 16-bit pattern decodes as the reference decodes it.
TEST(StorageTypes, SixteenBitDecodingMatchesReferenceForAllPatterns) {
  for (std::uint32_t b = 0; b <= 0xFFFF; ++b) {
    auto const h = static_cast<std::uint16_t>(b);
    float const bf = static_cast<float>(KPool::bfloat16::from_bits(h));
    float const hf = static_cast<float>(KPool::float16::from_bits(h));
    float const rb = KPoolRef::bf16_value(h), rh = KPoolRef::f16_value(h);
    if (std::isnan(rb))
      ASSERT_TRUE(std::isnan(bf)) << "bf16 " << b;
    else
      ASSERT_EQ(bf, rb) << "bf16 " << b;
    if (std::isnan(rh))
      ASSERT_TRUE(std::isnan(hf)) << "f16 " << b;
    else
      ASSERT_EQ(hf, rh) << "f16 " << b;
  }
}

// Rounding from f32 to nearest even, on every float whose 16 low bits are
// one of the interesting patterns (ties, just above and below them, zero,
// all ones), across all exponents and signs: every rounding boundary.
TEST(StorageTypes, RoundingFromFloatMatchesReferenceAtEveryBoundary) {
  std::uint32_t const lows[] = {0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001,
                                0x2000, 0x3000, 0x7FFF, 0x8000, 0x8001,
                                0xBFFF, 0xC000, 0xFFFF, 0x5A5A};
  std::size_t checked = 0;
  for (std::uint32_t high = 0; high <= 0xFFFF; ++high)
    for (std::uint32_t low : lows) {
      float const f = from_bits32((high << 16) | low);
      std::uint16_t const b = KPool::bfloat16(f).bits;
      std::uint16_t const h = KPool::float16(f).bits;
      if (std::isnan(f)) {
        ASSERT_TRUE(std::isnan(KPoolRef::bf16_value(b)));
        ASSERT_TRUE(std::isnan(KPoolRef::f16_value(h)));
        continue;
      }
      ASSERT_EQ(b, KPoolRef::bf16_bits(f)) << "bf16 of " << f;
      ASSERT_EQ(h, KPoolRef::f16_bits(f)) << "f16 of " << f;
      ++checked;
    }
  EXPECT_GT(checked, 900000u);
}

TEST(StorageTypes, RandomFloatsRoundLikeTheReference) {
  Rng rng(42);
  for (int i = 0; i < 2000000; ++i) {
    float const f = from_bits32(static_cast<std::uint32_t>(rng.next()));
    if (std::isnan(f)) continue;
    ASSERT_EQ(KPool::bfloat16(f).bits, KPoolRef::bf16_bits(f)) << f;
    ASSERT_EQ(KPool::float16(f).bits, KPoolRef::f16_bits(f)) << f;
  }
}

TEST(StorageTypes, AreTwoBytesAndNameThemselves) {
  EXPECT_EQ(sizeof(KPool::bfloat16), 2u);
  EXPECT_EQ(sizeof(KPool::float16), 2u);
  EXPECT_STREQ(KPool::storage_name<KPool::bfloat16>(), "bf16");
  EXPECT_STREQ(KPool::storage_name<KPool::float16>(), "f16");
  EXPECT_STREQ(KPool::storage_name<float>(), "f32");
  EXPECT_STREQ(KPool::storage_name<double>(), "f64");
}

// The softmax only feeds exp arguments <= 0; the f32 tolerance of the spec
// (1e-5 relative) needs far less than the 4 ulp held here
// (with FMA or without).
TEST(PoolExp, WithinFourUlpOfExpOnTheSoftmaxRange) {
  double worst = 0;
  for (int i = 0; i <= 2000000; ++i) {
    float const x = static_cast<float>(-87.0 * i / 2000000.0);
    double const want = std::exp(static_cast<double>(x));
    double const got = KPool::Details::pool_exp(x);
    double const ulp = std::ldexp(1.0, std::ilogb(want) - 23);
    worst = std::max(worst, std::fabs(got - want) / ulp);
  }
  EXPECT_LE(worst, 4.0);
}

TEST(PoolExp, ClampsFarBelowZeroAndIsExactAtZero) {
  EXPECT_GT(KPool::Details::pool_exp(-1000.0f), 0.0f);
  EXPECT_LT(KPool::Details::pool_exp(-1000.0f), 1e-37f);
  EXPECT_GT(KPool::Details::pool_exp(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_LT(KPool::Details::pool_exp(-std::numeric_limits<float>::infinity()), 1e-37f);
  EXPECT_EQ(KPool::Details::pool_exp(0.0f), 1.0f);
}

}  // namespace
