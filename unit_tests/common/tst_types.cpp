// Storage types and the pooling exp: KPool's conversions against the
// reference's independent ones, exhaustively where the domain allows.

#include <KPoolTestUtils.hpp>

#include <cmath>
#include <cstdlib>
#include <limits>

namespace {

using namespace KPoolTest;

float from_bits32(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::uint32_t to_bits32(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
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

// The accuracy pool/detail/KPool_Exp.hpp states: within 3 ulp of exp(x)
// (computed in f64, rounded to f32) over the softmax range [-87, 0], with
// or without FMA. Dense sampling: every 61st float of the range, about 18
// million arguments (an exhaustive run over all 1.1e9 gives the same 3).
TEST(PoolExp, WithinThreeUlpOfExpOnTheSoftmaxRange) {
  std::uint32_t const lo = 0x80000000u;            // -0
  std::uint32_t const hi = 0xC2AE0000u;            // -87
  std::int64_t worst = 0;
  float worst_x = 0;
  for (std::uint64_t b = lo; b <= hi; b += 61) {
    float const x = from_bits32(static_cast<std::uint32_t>(b));
    float const want = static_cast<float>(std::exp(static_cast<double>(x)));
    float const got = KPool::Details::pool_exp(x);
    // Positive floats are ordered like their bit patterns: the distance of
    // the patterns is the distance in ulps.
    std::int64_t const d =
        std::abs(static_cast<std::int64_t>(to_bits32(got)) -
                 static_cast<std::int64_t>(to_bits32(want)));
    if (d > worst) {
      worst = d;
      worst_x = x;
    }
  }
  EXPECT_LE(worst, 3) << "at x = " << worst_x;
}

// NaN in gives NaN out, whatever the NaN's sign: x86's default NaN (what
// inf - inf gives there) is negative.
TEST(PoolExp, PropagatesNaNOfEitherSign) {
  float const nan = std::numeric_limits<float>::quiet_NaN();
  volatile float inf = std::numeric_limits<float>::infinity();
  float const inf_minus_inf = inf - inf;
  EXPECT_TRUE(std::isnan(KPool::Details::pool_exp(nan)));
  EXPECT_TRUE(std::isnan(KPool::Details::pool_exp(-nan)));
  EXPECT_TRUE(std::isnan(KPool::Details::pool_exp(from_bits32(0xFFC00000u))));
  EXPECT_TRUE(std::isnan(KPool::Details::pool_exp(from_bits32(0xFF800001u))));
  EXPECT_TRUE(std::isnan(KPool::Details::pool_exp(inf_minus_inf)));
  EXPECT_TRUE(std::isnan(KPool::Details::pool_exp(std::numeric_limits<double>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(KPool::Details::pool_exp(-std::numeric_limits<double>::quiet_NaN())));
}

// exp(-inf) = 0, as IEEE arithmetic has it (so a -inf gate on an infinite
// key is NaN, as the contract's formulas give); far below zero the value
// is negligible against a softmax sum of at least 1; exp(0) = 1 exactly.
TEST(PoolExp, IsZeroAtMinusInfinityTinyFarBelowAndExactAtZero) {
  float const inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(KPool::Details::pool_exp(-inf), 0.0f);
  EXPECT_EQ(KPool::Details::pool_exp(-static_cast<double>(inf)), 0.0);
  for (float x : {-87.5f, -88.0f, -100.0f, -1000.0f, -3e38f}) {
    EXPECT_GE(KPool::Details::pool_exp(x), 0.0f) << x;
    EXPECT_LT(KPool::Details::pool_exp(x), 1.3e-38f) << x;
  }
  EXPECT_EQ(KPool::Details::pool_exp(0.0f), 1.0f);
  EXPECT_EQ(KPool::Details::pool_exp(-0.0f), 1.0f);
}

}  // namespace
