#ifndef KPOOL_COMMON_FLOAT8_HPP
#define KPOOL_COMMON_FLOAT8_HPP

// KPool's own 8-bit cache element type, OCP FP8 E4M3FN (docs/indexer.md, "The
// pool cache"): 1 sign, 4 exponent bits with bias 7, 3 mantissa bits,
// subnormals, largest finite value 448, no infinity, NaN is S.1111.111.
// Like bfloat16 and float16 it is one byte of bits handled by the same bit
// manipulation on every backend, so host and device store the same bytes.
//
// From f32: round to nearest, ties to even, saturating: every finite value
// of magnitude above 448 and both infinities become +-448 (the format has no
// infinity, and a saturating cache keeps an overflowing key as large as it
// can rather than turning it into NaN). NaN stays NaN (S.1111.111, the sign
// kept). Signs are always kept: -0 and negative values that round to zero
// give 0x80.

#include <KPool_Config.hpp>
#include <common/KPool_Types.hpp>
#include <common/detail/KPool_KokkosExt.hpp>

#include <cstdint>
#include <type_traits>

namespace KPool {
namespace Details {

// The hardware conversion of CUDA devices of compute capability 8.9 and
// newer (the H200 is 9.0): PTX `cvt.rn.satfinite.e4m3x2.f32` rounds to
// nearest even and takes finite overflow and infinities to +-448, which is
// the contract's rule; what it does with a NaN is left to the hardware.
// The code of f in the low byte (the instruction's second operand), or -1
// where the instruction does not exist (hosts, other devices, older
// architectures). DeviceBits.HardwareE4M3* in the unit suite compares it
// with software_e4m3_bits on all 2^32 floats on such a device.
KOKKOS_INLINE_FUNCTION int hardware_e4m3_bits(float f) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 890)
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(f));
  return static_cast<int>(r & 0xFFu);
#else
  (void)f;
  return -1;
#endif
}

// Straight-line code (every case computed, one selected) so that a channel
// loop of conversions vectorizes; the cache quantizer runs it on every
// value it stores.
KOKKOS_INLINE_FUNCTION std::uint8_t software_e4m3_bits(float f) {
  std::uint32_t const u = KokkosExt::bit_cast<std::uint32_t>(f);
  std::uint32_t const sign = (u >> 24) & 0x80u;
  std::uint32_t const a = u & 0x7FFFFFFFu;
  // |f| rounded onto the E4M3 grid of its binade: adding c = 2^(e + 20),
  // e the binade's exponent (at least -6, where the subnormals' fixed
  // step 2^-9 begins), leaves exactly the E4M3 step 2^(e - 3) as the f32
  // sum's last place, so the f32 addition rounds to nearest even on that
  // grid (the sum's last bit is the E4M3 mantissa's), and subtracting c
  // again is exact. A carry into the next binade gives its power of two,
  // as it should; f32 subnormals round to 0.
  std::uint32_t const e = a & 0x7F800000u;
  float const c =
      KokkosExt::bit_cast<float>((e > 0x3C800000u ? e : 0x3C800000u) + (20u << 23));
  float const r = (KokkosExt::bit_cast<float>(a) + c) - c;
  std::uint32_t const rb = KokkosExt::bit_cast<std::uint32_t>(r);
  // Normal results (2^-6 and up): rebias the exponent (127 -> 7) and keep
  // the three mantissa bits, which are all that is left. Subnormal ones:
  // the value in units of 2^-9, exact.
  std::uint32_t const normal = (rb - 0x3C000000u) >> 20;
  std::uint32_t const subnormal = static_cast<std::uint32_t>(r * 512.0f);
  // 448 and above, infinity included, saturate: (448, 464) would round to
  // 448 anyway, and 464 (the midpoint to the missing 480) and up would
  // round to the NaN pattern.
  std::uint32_t const code = a > 0x7F800000u    ? 0x7Fu
                             : a >= 0x43E00000u ? 0x7Eu
                             : rb >= 0x3C800000u ? normal
                                                 : subnormal;
  return static_cast<std::uint8_t>(sign | code);
}

// The conversion every KPool type and cache write uses: software_e4m3_bits,
// or, built with KPool_ENABLE_HW_E4M3=ON, in device code of compute
// capability 8.9 and newer, the hardware instruction for every non-NaN
// value (NaN keeps the rule above: S.1111.111, the sign kept).
KOKKOS_INLINE_FUNCTION std::uint8_t float_to_e4m3_bits(float f) {
#if KPOOL_USE_HW_E4M3 && defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 890)
  std::uint32_t const u = KokkosExt::bit_cast<std::uint32_t>(f);
  if ((u & 0x7FFFFFFFu) <= 0x7F800000u)
    return static_cast<std::uint8_t>(hardware_e4m3_bits(f));
  return static_cast<std::uint8_t>(((u >> 24) & 0x80u) | 0x7Fu);
#else
  return software_e4m3_bits(f);
#endif
}

KOKKOS_INLINE_FUNCTION float e4m3_bits_to_float(std::uint8_t b) {
  std::uint32_t const sign = static_cast<std::uint32_t>(b & 0x80u) << 24;
  std::uint32_t const e = (b >> 3) & 0xFu;
  std::uint32_t const m = b & 0x7u;
  if (e == 0xFu && m == 0x7u) return KokkosExt::bit_cast<float>(sign | 0x7FC00000u);
  return small_float_fields_to_float<3, 7>(sign, e, m);
}

}  // namespace Details

/// OCP FP8 E4M3FN, the fp8 pool cache's element type. From float: round to
/// nearest even, saturating at +-448 (infinities too); NaN stays NaN.
struct float8_e4m3 : Details::SmallFloat<float8_e4m3, Details::SmallFormat::e4m3> {
  using SmallFloat::SmallFloat;
};

static_assert(sizeof(float8_e4m3) == 1 && alignof(float8_e4m3) == 1,
              "float8_e4m3 must be one byte");
static_assert(std::is_trivially_copyable<float8_e4m3>::value,
              "float8_e4m3 must be trivially copyable");

/// Exact.
KOKKOS_INLINE_FUNCTION float to_accumulator(float8_e4m3 x) {
  return static_cast<float>(x);
}

/// True for the element types a pool cache may hold: the storage types and
/// float8_e4m3.
template <class C>
struct is_cache_element_type
    : std::integral_constant<bool, is_storage_type<C>::value ||
                                       std::is_same<C, float8_e4m3>::value> {};

namespace Details {

// holds_storage_type's check for a pool cache's element type C (PoolCache).
template <class C, class Holder>
constexpr bool holds_cache_element_type() {
  static_assert(is_cache_element_type<C>::value,
                "KPool: C must be float, double, KPool::bfloat16, KPool::float16 or "
                "KPool::float8_e4m3");
  return true;
}

}  // namespace Details

/// True when a cache of element type C can hold pools of storage type T
/// (docs/indexer.md): native (C = T) for every storage type, fp8 for every
/// storage type but f64.
template <class C, class T>
struct is_cache_type
    : std::integral_constant<
          bool, is_storage_type<T>::value &&
                    (std::is_same<C, T>::value ||
                     (std::is_same<C, float8_e4m3>::value &&
                      !std::is_same<T, double>::value))> {};

/// The name docs/trace.md and error messages use for a cache element type.
template <class C>
constexpr char const* cache_element_name() {
  return std::is_same<C, float8_e4m3>::value ? "fp8_e4m3" : storage_name<C>();
}

}  // namespace KPool

#endif
