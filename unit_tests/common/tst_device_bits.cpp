// <cstring> comes FIRST, before <KPool.hpp>, on purpose: under HIP a
// std::memcpy declared by it before KPool is the host function, and a
// KPool bit cast through it in device code did not compile (docs/api.md,
// "Building"). Every compiler the suite is built with compiles this file;
// the conversions run inside a kernel on the default execution space (the
// GPU on a device build) and must give the host's bits, and the decoders
// the values the formats define (KPoolCacheReference.hpp, KPoolReference.hpp).
#include <cstring>

#include <KPool.hpp>
#include <common/detail/KPool_CacheWrite.hpp>

#include <KPoolCacheReference.hpp>
#include <KPoolReference.hpp>
#include <KPoolTestUtils.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <set>
#include <vector>

namespace {

using E = Kokkos::DefaultExecutionSpace;
using KPool::Details::KokkosExt::bit_cast;

#if KPOOL_IMPL_BUILTIN_BIT_CAST
// With the builtin, the cast is usable in constant expressions.
static_assert(bit_cast<std::uint32_t>(1.0f) == 0x3F800000u, "bit_cast of 1.0f");
static_assert(bit_cast<std::uint64_t>(-2.0) == 0xC000000000000000ull, "bit_cast of -2.0");
#endif

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Every 16-bit pattern: decoded as bf16, f16 and (low byte) fp8 on the
// device, the float bits back on the host.
struct DecodeAll {
  Kokkos::View<std::uint32_t* [3], E::memory_space> out;
  KOKKOS_INLINE_FUNCTION void operator()(int i) const {
    auto const b = static_cast<std::uint16_t>(i);
    out(i, 0) = bit_cast<std::uint32_t>(static_cast<float>(KPool::bfloat16::from_bits(b)));
    out(i, 1) = bit_cast<std::uint32_t>(static_cast<float>(KPool::float16::from_bits(b)));
    out(i, 2) = bit_cast<std::uint32_t>(static_cast<float>(
        KPool::float8_e4m3::from_bits(static_cast<std::uint8_t>(b & 0xFF))));
  }
};

// Floats (given as bits) encoded on the device into bf16, f16 and fp8.
struct EncodeAll {
  Kokkos::View<const std::uint32_t*, E::memory_space> in;
  Kokkos::View<std::uint32_t* [3], E::memory_space> out;
  KOKKOS_INLINE_FUNCTION void operator()(int i) const {
    float const f = bit_cast<float>(in(i));
    out(i, 0) = KPool::bfloat16(f).bits;
    out(i, 1) = KPool::float16(f).bits;
    out(i, 2) = KPool::float8_e4m3(f).bits;
  }
};

// A decoded value against the format's definition: NaN with its sign for
// NaN patterns, else the exact value.
::testing::AssertionResult same_value(float got, double want, int pattern) {
  if (std::isnan(want)) {
    if (std::isnan(got)) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "pattern " << pattern << ": " << got
                                         << ", expected NaN";
  }
  if (static_cast<double>(got) == want && std::signbit(got) == std::signbit(want))
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "pattern " << pattern << ": " << got
                                       << ", expected " << want;
}

TEST(DeviceBits, DecodingOnTheDeviceGivesTheHostsBitsAndTheFormatsValues) {
  int const n = 1 << 16;
  Kokkos::View<std::uint32_t* [3], E::memory_space> out("out", n);
  Kokkos::parallel_for("decode", Kokkos::RangePolicy<E>(0, n), DecodeAll{out});
  auto const h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
  for (int i = 0; i < n; ++i) {
    auto const b = static_cast<std::uint16_t>(i);
    float const bf = static_cast<float>(KPool::bfloat16::from_bits(b));
    float const hf = static_cast<float>(KPool::float16::from_bits(b));
    float const f8 =
        static_cast<float>(KPool::float8_e4m3::from_bits(static_cast<std::uint8_t>(i & 0xFF)));
    ASSERT_EQ(h(i, 0), bits_of(bf)) << "bf16 pattern " << i;
    ASSERT_EQ(h(i, 1), bits_of(hf)) << "f16 pattern " << i;
    ASSERT_EQ(h(i, 2), bits_of(f8)) << "fp8 pattern " << (i & 0xFF);
    ASSERT_TRUE(same_value(bf, KPoolRef::bf16_value(b), i));
    ASSERT_TRUE(same_value(hf, KPoolRef::f16_value(b), i));
    ASSERT_TRUE(same_value(f8, KPoolCacheRef::e4m3_value(static_cast<std::uint8_t>(i & 0xFF)),
                           i & 0xFF));
  }
}

TEST(DeviceBits, EncodingOnTheDeviceGivesTheHostsBits) {
  // Specials, format boundaries, and random bit patterns of every kind.
  std::vector<std::uint32_t> in = {
      0x00000000u, 0x80000000u, 0x3F800000u, 0xBF800000u, 0x7F800000u, 0xFF800000u,
      0x7FC00000u, 0xFFC00001u, 0x7F800001u, 0x00000001u, 0x807FFFFFu, 0x477FEFFFu,
      0x477FF000u, 0x33000000u, 0x33000001u, 0x38800000u, 0x43E00000u, 0x43F00000u,
      0x43E80000u, 0x3B000000u, 0x3AFFFFFFu, 0x3F808000u, 0x3F818000u};
  KPoolTest::Rng rng(20261201);
  for (int i = 0; i < 4096; ++i) in.push_back(static_cast<std::uint32_t>(rng.next()));
  int const n = static_cast<int>(in.size());
  Kokkos::View<std::uint32_t*, E::memory_space> d_in("in", n);
  Kokkos::View<std::uint32_t* [3], E::memory_space> out("out", n);
  Kokkos::deep_copy(d_in, Kokkos::View<std::uint32_t*, Kokkos::HostSpace,
                                       Kokkos::MemoryTraits<Kokkos::Unmanaged>>(in.data(), n));
  Kokkos::parallel_for("encode", Kokkos::RangePolicy<E>(0, n),
                       EncodeAll{d_in, out});
  auto const h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
  for (int i = 0; i < n; ++i) {
    float f;
    std::memcpy(&f, &in[i], sizeof f);
    ASSERT_EQ(h(i, 0), KPool::bfloat16(f).bits) << std::hex << "bf16 of 0x" << in[i];
    ASSERT_EQ(h(i, 1), KPool::float16(f).bits) << std::hex << "f16 of 0x" << in[i];
    ASSERT_EQ(h(i, 2), KPool::float8_e4m3(f).bits) << std::hex << "fp8 of 0x" << in[i];
  }
}

// The hardware E4M3 conversion (cvt.rn.satfinite.e4m3x2.f32), where the
// default execution space has it: CUDA devices of compute capability 8.9
// and newer. Its code for every finite and infinite float must be the
// contract's (software_e4m3_bits): round to nearest even, subnormals,
// saturation at +-448 for overflow and infinities, signed zeros. NaN is
// reported, not compared: KPool converts NaN in software either way.
struct HardwareProbe {
  Kokkos::View<int*, E::memory_space> out;
  KOKKOS_INLINE_FUNCTION void operator()(int i) const {
    float const probes[] = {1.0f, 448.0f, 1e30f, -INFINITY, 1e-30f, -1e-30f,
                            0.001953125f, NAN, -NAN};
    out(i) = KPool::Details::hardware_e4m3_bits(probes[i]);
  }
};

// Mismatches between the hardware and the contract's conversion over
// floats given by a mapping of the index: all 2^32 bit patterns, or a view
// of chosen ones.
struct AllFloats {
  KOKKOS_INLINE_FUNCTION std::uint32_t operator()(std::int64_t i) const {
    return static_cast<std::uint32_t>(i);
  }
};
struct ChosenFloats {
  Kokkos::View<const std::uint32_t*, E::memory_space> bits;
  KOKKOS_INLINE_FUNCTION std::uint32_t operator()(std::int64_t i) const { return bits(i); }
};

template <class Floats>
struct HardwareMismatches {
  Floats floats;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i, std::uint64_t& count,
                                         std::int64_t& first) const {
    std::uint32_t const u = floats(i);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return;  // NaN
    float const f = bit_cast<float>(u);
    if (KPool::Details::hardware_e4m3_bits(f) != KPool::Details::software_e4m3_bits(f)) {
      ++count;
      if (i < first) first = i;
    }
  }
};

// Whether the default execution space converts in hardware; the format's
// own values and the NaN codes are checked on the way.
bool hardware_e4m3() {
  Kokkos::View<int*, E::memory_space> probe("probe", 9);
  Kokkos::parallel_for("probe", Kokkos::RangePolicy<E>(0, 9), HardwareProbe{probe});
  auto const p = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), probe);
  if (p(0) < 0) return false;
  // The format's own values first (KPoolCacheReference's decoder).
  EXPECT_EQ(p(0), 0x38) << "1.0";
  EXPECT_EQ(p(1), 0x7E) << "448";
  EXPECT_EQ(p(2), 0x7E) << "1e30 saturates";
  EXPECT_EQ(p(3), 0xFE) << "-inf saturates";
  EXPECT_EQ(p(4), 0x00) << "1e-30 rounds to +0";
  EXPECT_EQ(p(5), 0x80) << "-1e-30 rounds to -0";
  EXPECT_EQ(p(6), 0x01) << "2^-9, the least subnormal";
  std::cout << "hardware E4M3 of NaN: 0x" << std::hex << p(7) << ", of -NaN: 0x"
            << p(8) << std::dec << " (KPool stores S.1111.111 in software)\n";
  return true;
}

#define KPOOL_SKIP_WITHOUT_HARDWARE_E4M3()                                      \
  if (!hardware_e4m3())                                                        \
  GTEST_SKIP() << "no hardware E4M3 conversion on " << E::name()               \
               << " (CUDA compute capability 8.9 and newer only): "            \
                  "perf_tests/gpu/run_device.sh runs this on the H200"

// The floats every rounding decision of an E4M3 conversion turns on, for
// each of the 256 exponents and both signs: around every bit position of
// the mantissa (the rounding point moves with the exponent in E4M3's
// subnormal range), the halfway points of the 3-bit mantissa above each
// of E4M3's 8 codes an exponent, and their neighbours, so the saturation
// edge (448, 464, 480) and the subnormal edges (2^-9, 2^-10) are among
// them; about 60,000 floats.
std::vector<std::uint32_t> e4m3_edge_floats() {
  std::set<std::uint32_t> mantissas = {0, 1, 2, 0x7FFFFF, 0x7FFFFE};
  for (int b = 0; b < 23; ++b)
    for (std::int64_t d : {-1, 0, 1}) {
      std::int64_t const m = (std::int64_t(1) << b) + d;
      if (m >= 0 && m <= 0x7FFFFF) mantissas.insert(static_cast<std::uint32_t>(m));
    }
  for (std::uint32_t j = 0; j < 8; ++j)
    for (std::uint32_t half : {0u, 1u << 19})
      for (std::int64_t d : {-1, 0, 1}) {
        std::int64_t const m = static_cast<std::int64_t>((j << 20) | half) + d;
        if (m >= 0 && m <= 0x7FFFFF) mantissas.insert(static_cast<std::uint32_t>(m));
      }
  std::vector<std::uint32_t> v;
  for (std::uint32_t sign : {0u, 0x80000000u})
    for (std::uint32_t e = 0; e < 256; ++e)
      for (std::uint32_t m : mantissas) v.push_back(sign | (e << 23) | m);
  return v;
}

std::uint64_t hardware_mismatches_on(std::vector<std::uint32_t> const& floats,
                                     std::int64_t& first_index) {
  Kokkos::View<std::uint32_t*, E::memory_space> bits("floats", floats.size());
  auto const h = Kokkos::create_mirror_view(bits);
  for (std::size_t i = 0; i < floats.size(); ++i) h(i) = floats[i];
  Kokkos::deep_copy(bits, h);
  std::uint64_t count = 0;
  first_index = static_cast<std::int64_t>(floats.size());
  Kokkos::parallel_reduce(
      "edge floats",
      Kokkos::RangePolicy<E, Kokkos::IndexType<std::int64_t>>(
          0, static_cast<std::int64_t>(floats.size())),
      HardwareMismatches<ChosenFloats>{ChosenFloats{bits}}, count,
      Kokkos::Min<std::int64_t>(first_index));
  return count;
}

// The sample the device run's first tier takes (a fraction of a second).
TEST(DeviceBits, HardwareE4M3ConversionOnEveryExponentsEdges) {
  std::vector<std::uint32_t> const floats = e4m3_edge_floats();
  // The sample holds the edges it is for, whatever the hardware.
  for (float f : {448.0f, 464.0f, 480.0f, 0x1.0p-9f, 0x1.0p-10f, 0x1.8p-10f})
    EXPECT_NE(std::find(floats.begin(), floats.end(), bits_of(f)), floats.end()) << f;
  KPOOL_SKIP_WITHOUT_HARDWARE_E4M3();
  std::int64_t first = 0;
  std::uint64_t const count = hardware_mismatches_on(floats, first);
  EXPECT_EQ(count, 0u) << "first differing float: 0x" << std::hex
                       << (count ? floats[static_cast<std::size_t>(first)] : 0u);
  std::cout << "measured: hardware E4M3 conversion on " << floats.size()
            << " edge floats, " << count << " differ from the contract\n";
}

// Every float (the device run's second tier): its verdict decides whether
// KPool_ENABLE_HW_E4M3 may be turned on.
TEST(DeviceBits, HardwareE4M3ConversionOnAllFloats) {
  KPOOL_SKIP_WITHOUT_HARDWARE_E4M3();
  std::uint64_t count = 0;
  std::int64_t first = std::int64_t(1) << 32;
  Kokkos::parallel_reduce(
      "all floats",
      Kokkos::RangePolicy<E, Kokkos::IndexType<std::int64_t>>(0, std::int64_t(1) << 32),
      HardwareMismatches<AllFloats>{AllFloats{}}, count, Kokkos::Min<std::int64_t>(first));
  EXPECT_EQ(count, 0u) << "first differing float: 0x" << std::hex << first;
  std::cout << "measured: hardware E4M3 conversion on all 2^32 floats, " << count
            << " differ from the contract\n";
}

// The cache write's padded scratch rows (common/detail/KPool_CacheWrite.hpp,
// SlotRow): for the lane mappings a device uses, the 32 lanes of a warp
// reach 32 distinct banks of 4-byte words. Lanes: min(32, D / W) per team
// thread, 32 / lanes team threads a warp, thread t staging slot t (rows
// `columns(D)` words apart); lane p of a thread writes channels
// (i * lanes + p) * W + w, one w at a time, in iteration i.
int worst_conflict(std::vector<int> const& words) {
  int counts[32] = {};
  int worst = 0;
  std::set<int> seen;
  for (int const w : words) {
    if (!seen.insert(w).second) continue;  // the same word: a broadcast
    worst = std::max(worst, ++counts[w % 32]);
  }
  return worst;
}

template <class Row>
int worst_staging_conflict(int D, int W) {
  int const lanes = std::min(32, D / W);
  int const threads = 32 / lanes;
  int worst = 0;
  for (int i = 0; i * lanes * W < D; ++i)
    for (int w = 0; w < W; ++w) {
      std::vector<int> words;
      for (int t = 0; t < threads; ++t)
        for (int p = 0; p < lanes; ++p)
          words.push_back(t * Row::columns(D) + Row::word((i * lanes + p) * W + w));
      worst = std::max(worst, worst_conflict(words));
    }
  return worst;
}

// Lane c reads channel c (the quantizer), lane k channels 2k and 2k + 1 (the
// first butterfly stage), warp by warp.
template <class Row>
int worst_read_conflict(int D, int stride) {
  int worst = 0;
  for (int base = 0; base * stride < D; base += 32)
    for (int off = 0; off < stride; ++off) {
      std::vector<int> words;
      for (int k = base; k < base + 32 && k * stride < D; ++k)
        words.push_back(Row::word(k * stride + off));
      worst = std::max(worst, worst_conflict(words));
    }
  return worst;
}

TEST(DeviceBits, CacheStagingRowsAreConflictFree) {
  using Padded = KPool::Details::SlotRow<float, true>;
  using Plain = KPool::Details::SlotRow<float, false>;
  for (int const D : {64, 128, 256, 512}) {
    for (int const W : {4, 8}) {  // f32 pools, 16-bit pools (16-byte packets)
      EXPECT_EQ(worst_staging_conflict<Padded>(D, W), 1) << "D " << D << ", W " << W;
      // The check sees the conflicts padding removes.
      EXPECT_GE(worst_staging_conflict<Plain>(D, W), W) << "D " << D << ", W " << W;
    }
    EXPECT_EQ(worst_read_conflict<Padded>(D, 1), 1) << "quantizer, D " << D;
    EXPECT_EQ(worst_read_conflict<Padded>(D, 2), 1) << "butterfly h = 1, D " << D;
    EXPECT_EQ(worst_read_conflict<Plain>(D, 2), 2) << "butterfly h = 1, D " << D;
    // Every channel has its own word inside the row.
    std::set<int> words;
    for (int c = 0; c < D; ++c) {
      int const w = Padded::word(c);
      EXPECT_LT(w, Padded::columns(D));
      words.insert(w);
    }
    EXPECT_EQ(static_cast<int>(words.size()), D);
  }
  // The scratch a launch reserves is the layout the rows use.
  using S = KPool::Details::CacheScratch<E, float>;
  EXPECT_EQ(S::padded, KPool::Details::device_shapes<E>::value);
  EXPECT_EQ(S::columns(128), S::row_type::columns(128));
}

}  // namespace
