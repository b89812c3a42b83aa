// KPool::float8_e4m3 (OCP E4M3FN) against KPoolCacheReference.hpp's
// decoder (written from the format definition with ldexp) and encoder (a
// search over the decoded values), exhaustively where the domain allows.

#include <KPoolCacheReference.hpp>
#include <KPoolTestUtils.hpp>
#include <common/detail/KPool_CacheVectors.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace {

using KPoolTest::Rng;

float from_bits32(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::uint8_t encode(float f) { return KPool::float8_e4m3(f).bits; }
float decode(std::uint8_t b) {
  return static_cast<float>(KPool::float8_e4m3::from_bits(b));
}
bool is_nan_pattern(std::uint8_t b) { return (b & 0x7F) == 0x7F; }

// Every pattern decodes to the value the format defines.
TEST(Float8E4M3, EveryPatternDecodesAsTheFormatDefines) {
  for (int b = 0; b < 256; ++b) {
    auto const u = static_cast<std::uint8_t>(b);
    double const ref = KPoolCacheRef::e4m3_value(u);
    float const got = decode(u);
    if (std::isnan(ref)) {
      ASSERT_TRUE(std::isnan(got)) << "pattern " << b;
      ASSERT_EQ(std::signbit(got), (b & 0x80) != 0) << "pattern " << b;
    } else {
      ASSERT_EQ(static_cast<double>(got), ref) << "pattern " << b;
      ASSERT_EQ(std::signbit(got), (b & 0x80) != 0) << "pattern " << b;
    }
  }
  // Landmarks of the format (OCP FP8, E4M3FN).
  EXPECT_EQ(decode(0x7E), 448.0f);
  EXPECT_EQ(decode(0x38), 1.0f);
  EXPECT_EQ(decode(0x08), 0.015625f);        // 2^-6, smallest normal
  EXPECT_EQ(decode(0x01), 0.001953125f);     // 2^-9, smallest subnormal
  EXPECT_EQ(decode(0x07), 0.013671875f);     // 7 * 2^-9, largest subnormal
  EXPECT_EQ(decode(0xFE), -448.0f);
  EXPECT_TRUE(std::isnan(decode(0x7F)) && std::isnan(decode(0xFF)));
  EXPECT_EQ(decode(0x78), 256.0f);           // 1111.000: no infinity
}

// Every pattern's value converts back to the same pattern (-0 included);
// NaN patterns give NaN with their sign.
TEST(Float8E4M3, EveryPatternRoundTrips) {
  for (int b = 0; b < 256; ++b) {
    auto const u = static_cast<std::uint8_t>(b);
    ASSERT_EQ(encode(decode(u)), u) << "pattern " << b;
  }
}

// The midpoint between every two neighbouring values (exact in f32), the
// floats just below and above it, and the values themselves, for both
// signs: below rounds down, above rounds up, the midpoint to the even
// pattern (even mantissa).
TEST(Float8E4M3, EveryRoundingBoundaryRoundsToNearestEven) {
  int checked = 0;
  for (int k = 0; k < 0x7E; ++k) {
    auto const lo = static_cast<std::uint8_t>(k), hi = static_cast<std::uint8_t>(k + 1);
    double const vlo = KPoolCacheRef::e4m3_value(lo), vhi = KPoolCacheRef::e4m3_value(hi);
    float const mid = static_cast<float>((vlo + vhi) / 2);
    ASSERT_EQ(static_cast<double>(mid), (vlo + vhi) / 2) << "midpoint exact in f32";
    float const below = std::nextafter(mid, 0.0f);
    float const above = std::nextafter(mid, 1000.0f);
    std::uint8_t const even = (k % 2 == 0) ? lo : hi;
    for (int sign = 0; sign < 2; ++sign) {
      std::uint8_t const s = sign ? 0x80 : 0x00;
      float const m = sign ? -1.0f : 1.0f;
      ASSERT_EQ(encode(m * static_cast<float>(vlo)), s | lo) << "value " << vlo;
      ASSERT_EQ(encode(m * below), s | lo) << "just below " << mid;
      ASSERT_EQ(encode(m * mid), s | even) << "midpoint " << mid;
      ASSERT_EQ(encode(m * above), s | hi) << "just above " << mid;
      ASSERT_EQ(KPoolCacheRef::e4m3_bits(m * mid), s | even) << "reference at " << mid;
      checked += 4;
    }
  }
  EXPECT_EQ(checked, 0x7E * 8);
}

// Saturation: 448 and everything beyond it, infinities included, give the
// largest finite value of the same sign.
TEST(Float8E4M3, SaturatesAtLargestFinite) {
  float const big[] = {448.0f, std::nextafter(448.0f, 1e9f), 460.0f,
                       464.0f, 479.9f, 480.0f, 512.0f, 1e6f, 3.0e38f,
                       std::numeric_limits<float>::max(),
                       std::numeric_limits<float>::infinity()};
  for (float f : big) {
    EXPECT_EQ(encode(f), 0x7E) << f;
    EXPECT_EQ(encode(-f), 0xFE) << -f;
  }
  // Just below 448's lower midpoint (432) still rounds down.
  EXPECT_EQ(encode(std::nextafter(432.0f, 0.0f)), 0x7D);
  EXPECT_EQ(encode(432.0f), 0x7E);  // tie: 0x7E is even
}

// Subnormals and underflow: at most half the smallest subnormal (2^-10)
// rounds to a signed zero, above it to the smallest subnormal; the largest
// subnormal rounds up into the smallest normal at its midpoint's tie.
TEST(Float8E4M3, SubnormalsAndUnderflow) {
  float const half_min = 0.0009765625f;  // 2^-10
  EXPECT_EQ(encode(half_min), 0x00);
  EXPECT_EQ(encode(-half_min), 0x80);
  EXPECT_EQ(encode(std::nextafter(half_min, 1.0f)), 0x01);
  EXPECT_EQ(encode(-std::nextafter(half_min, 1.0f)), 0x81);
  EXPECT_EQ(encode(std::numeric_limits<float>::denorm_min()), 0x00);
  EXPECT_EQ(encode(-std::numeric_limits<float>::denorm_min()), 0x80);
  EXPECT_EQ(encode(std::numeric_limits<float>::min()), 0x00);
  EXPECT_EQ(encode(0.0f), 0x00);
  EXPECT_EQ(encode(-0.0f), 0x80);
  // 7.5 * 2^-9 is the tie between 0x07 and 0x08 (2^-6): 0x08 is even.
  EXPECT_EQ(encode(7.5f * 0.001953125f), 0x08);
  EXPECT_EQ(encode(std::nextafter(7.5f * 0.001953125f, 0.0f)), 0x07);
  // 1.5 * 2^-9 ties 0x01 and 0x02: 0x02.
  EXPECT_EQ(encode(1.5f * 0.001953125f), 0x02);
  EXPECT_EQ(encode(2.5f * 0.001953125f), 0x02);
}

// NaN, quiet or signalling, any payload, stays NaN with its sign.
TEST(Float8E4M3, NaNStaysNaN) {
  std::uint32_t const payloads[] = {0x7FC00000u, 0x7F800001u, 0x7FFFFFFFu,
                                    0x7FA00000u, 0x7F800100u};
  for (std::uint32_t p : payloads) {
    EXPECT_EQ(encode(from_bits32(p)), 0x7F) << std::hex << p;
    EXPECT_EQ(encode(from_bits32(p | 0x80000000u)), 0xFF) << std::hex << p;
  }
}

// Random floats, against the reference's search encoder: most of them in
// the format's range (every exponent from 2^-12 to 2^9, random mantissas),
// the rest any bit pattern at all.
TEST(Float8E4M3, RandomFloatsMatchTheReferenceEncoder) {
  Rng rng(20240611);
  int const n = 2000000;
  for (int i = 0; i < n; ++i) {
    std::uint32_t u;
    if (i % 4 == 3) {
      u = static_cast<std::uint32_t>(rng.next());
    } else {
      std::uint32_t const e = 127 - 12 + static_cast<std::uint32_t>(rng.below(22));
      u = (static_cast<std::uint32_t>(rng.below(2)) << 31) | (e << 23) |
          (static_cast<std::uint32_t>(rng.next()) & 0x007FFFFFu);
    }
    float const f = from_bits32(u);
    std::uint8_t const got = encode(f), ref = KPoolCacheRef::e4m3_bits(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(is_nan_pattern(got)) << std::hex << u;
      continue;
    }
    ASSERT_EQ(got, ref) << "bits 0x" << std::hex << u << " (" << f << ")";
  }
}

// A functor rather than a lambda: nvcc rejects extended lambdas in a TEST
// body (a private member function).
template <class M>
struct DeviceConversions {
  Kokkos::View<float*, M> in;
  Kokkos::View<std::uint8_t*, M> bits;
  Kokkos::View<float*, M> back;
  KOKKOS_FUNCTION void operator()(int i) const {
    bits(i) = KPool::float8_e4m3(in(i)).bits;
    back(i) = static_cast<float>(
        KPool::float8_e4m3::from_bits(static_cast<std::uint8_t>(i & 0xFF)));
  }
};

// The same conversions in device code give the same bytes as on the host.
TEST(Float8E4M3, DeviceConversionsMatchTheHost) {
  using E = Kokkos::DefaultExecutionSpace;
  int const n = 1 << 16;
  std::vector<float> inputs(n);
  Rng rng(99);
  for (int i = 0; i < n; ++i) {
    std::uint32_t const e = 127 - 12 + static_cast<std::uint32_t>(rng.below(22));
    inputs[i] = i < 256 ? decode(static_cast<std::uint8_t>(i))
                        : from_bits32((static_cast<std::uint32_t>(rng.below(2)) << 31) |
                                      (e << 23) |
                                      (static_cast<std::uint32_t>(rng.next()) & 0x007FFFFFu));
  }
  Kokkos::View<float*, E::memory_space> in("in", n), back("back", n);
  Kokkos::View<std::uint8_t*, E::memory_space> bits("bits", n);
  auto h = Kokkos::create_mirror_view(in);
  for (int i = 0; i < n; ++i) h(i) = inputs[i];
  Kokkos::deep_copy(in, h);
  Kokkos::parallel_for("tst_float8", Kokkos::RangePolicy<E>(0, n),
                       DeviceConversions<E::memory_space>{in, bits, back});
  auto const hb = KPoolTest::on_host(bits);
  auto const hf = KPoolTest::on_host(back);
  for (int i = 0; i < n; ++i) {
    if (std::isnan(inputs[i]))
      ASSERT_TRUE(is_nan_pattern(hb(i)));
    else
      ASSERT_EQ(hb(i), encode(inputs[i])) << inputs[i];
    float const d = decode(static_cast<std::uint8_t>(i & 0xFF));
    ASSERT_TRUE(std::memcmp(&d, &hf(i), 4) == 0 || (std::isnan(d) && std::isnan(hf(i))));
  }
}

}  // namespace

#if defined(KPOOL_IMPL_GNU_VECTORS)
// The host cache write's vector rounding (common/detail/KPool_CacheVectors.hpp)
// gives float_to_e4m3_bits' byte for every f32 it accepts: every bit
// pattern of magnitude below 464, both signs, NaN excluded (2^31.1
// inputs), 16 at a time as the cache write calls it.
TEST(Float8E4M3, HostVectorRoundingMatchesOnEveryAcceptedInput) {
  std::uint32_t const end = 0x43E80000u;  // 464
  // Every group of 16 in an optimized build (seconds); an unoptimized build
  // (the sanitized device-shapes build, where this takes minutes) checks
  // every 61st group, which still visits every exponent and, across the
  // groups, every low-bit pattern (61 is odd, so base / 16 mod 2^k cycles).
#if defined(__OPTIMIZE__)
  std::uint32_t const step = 16;
#else
  std::uint32_t const step = 16 * 61;
#endif
  std::uint64_t mismatches = 0;
  std::uint32_t first_bad = 0;
  for (std::uint32_t sign = 0; sign <= 1; ++sign) {
    for (std::uint32_t base = 0; base < end; base += step) {
      KPool::Details::f32x16 q;
      std::uint8_t want[16], got[16];
      for (int l = 0; l < 16; ++l) {
        std::uint32_t const u = (sign << 31) | (base + static_cast<std::uint32_t>(l));
        q[l] = from_bits32(u);
        want[l] = KPool::Details::float_to_e4m3_bits(q[l]);
      }
      KPool::Details::e4m3_store16(q, got);
      if (std::memcmp(want, got, 16) != 0) {
        if (mismatches == 0) first_bad = (sign << 31) | base;
        ++mismatches;
      }
    }
  }
  EXPECT_EQ(mismatches, 0u) << "first differing group at bits 0x" << std::hex
                            << first_bad;
}
#endif
