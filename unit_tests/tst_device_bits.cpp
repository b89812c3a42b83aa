// <cstring> comes FIRST, before <KPool.hpp>, on purpose: under HIP a
// std::memcpy declared by it before KPool is the host function, and a
// KPool bit cast through it in device code did not compile (docs/api.md,
// "Building"). Every compiler the suite is built with compiles this file;
// the conversions run inside a kernel on the default execution space (the
// GPU on a device build) and must give the host's bits, and the decoders
// the values the formats define (KPoolCacheReference.hpp, KPoolReference.hpp).
#include <cstring>

#include <KPool.hpp>

#include <KPoolCacheReference.hpp>
#include <KPoolReference.hpp>
#include <KPoolTestUtils.hpp>

#include <cmath>
#include <cstdint>
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

}  // namespace
