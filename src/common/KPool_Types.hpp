#ifndef KPOOL_COMMON_TYPES_HPP
#define KPOOL_COMMON_TYPES_HPP

/// @file
/// Storage types. key, gate, the ring and the pooled output share one of
/// float, double, KPool::bfloat16 and KPool::float16 (docs/pools.md,
/// "Storage types"). The 16-bit types are KPool's own (two bytes, trivially
/// copyable, usable in host and device code), so nothing depends on whether
/// the Kokkos in use has half types. Conversions from float round to
/// nearest, ties to even; the same bit manipulation runs on every backend,
/// so every backend stores the same bits.

#include <common/detail/KPool_KokkosExt.hpp>

#include <cstdint>
#include <type_traits>

namespace KPool {
namespace Details {

KOKKOS_INLINE_FUNCTION std::uint16_t float_to_bf16_bits(float f) {
  std::uint32_t const u = KokkosExt::bit_cast<std::uint32_t>(f);
  // Adding 0x7FFF plus the lowest kept bit rounds to nearest even, carrying
  // into the exponent when the mantissa overflows (up to infinity, as it
  // should). NaN must stay NaN: keep its top bits and force a quiet bit.
  std::uint32_t const rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  std::uint32_t const nan = (u >> 16) | 0x0040u;
  bool const is_nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  return static_cast<std::uint16_t>(is_nan ? nan : rounded);
}

KOKKOS_INLINE_FUNCTION float bf16_bits_to_float(std::uint16_t h) {
  return KokkosExt::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

KOKKOS_INLINE_FUNCTION std::uint16_t float_to_f16_bits(float f) {
  std::uint32_t u = KokkosExt::bit_cast<std::uint32_t>(f);
  std::uint32_t const sign = (u >> 16) & 0x8000u;
  u &= 0x7FFFFFFFu;
  if (u > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u);
  // 65520 is halfway between the largest half (65504) and 2^16: it and
  // everything above round to infinity.
  if (u >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);
  if (u >= 0x38800000u) {
    // Normal half: rebias the exponent (127 -> 15), then round away the 13
    // low mantissa bits to nearest even.
    std::uint32_t const r = u - 0x38000000u;
    return static_cast<std::uint16_t>(
        sign | ((r + 0x0FFFu + ((r >> 13) & 1u)) >> 13));
  }
  // At or below half of the smallest subnormal (2^-25) rounds to zero.
  if (u <= 0x33000000u) return static_cast<std::uint16_t>(sign);
  // Subnormal half: the value in units of 2^-24 is the full mantissa shifted
  // right by 126 - exponent (between 14 and 24 here).
  std::uint32_t const e = u >> 23;
  std::uint32_t const m = (u & 0x007FFFFFu) | 0x00800000u;
  std::uint32_t const s = 126u - e;
  std::uint32_t const q = m >> s;
  std::uint32_t const rem = m & ((1u << s) - 1u);
  std::uint32_t const half = 1u << (s - 1u);
  std::uint32_t const up = (rem > half || (rem == half && (q & 1u))) ? 1u : 0u;
  return static_cast<std::uint16_t>(sign | (q + up));
}

// A finite value of a small float format (MBits mantissa bits, exponent
// bias Bias) from its sign (already at bit 31), exponent and mantissa
// fields: subnormals (e == 0) are m * 2^(1 - Bias - MBits), exact in float;
// normals are rebiased to f32's 127.
template <unsigned MBits, unsigned Bias>
KOKKOS_INLINE_FUNCTION float small_float_fields_to_float(std::uint32_t sign, std::uint32_t e,
                                                         std::uint32_t m) {
  if (e == 0) {
    float const step = KokkosExt::bit_cast<float>((128u - Bias - MBits) << 23);
    float const mag = static_cast<float>(m) * step;
    return KokkosExt::bit_cast<float>(sign | KokkosExt::bit_cast<std::uint32_t>(mag));
  }
  return KokkosExt::bit_cast<float>(sign | ((e + 127u - Bias) << 23) | (m << (23u - MBits)));
}

KOKKOS_INLINE_FUNCTION float f16_bits_to_float(std::uint16_t h) {
  std::uint32_t const sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t const e = (h >> 10) & 0x1Fu;
  std::uint32_t const m = h & 0x03FFu;
  if (e == 0x1Fu) return KokkosExt::bit_cast<float>(sign | 0x7F800000u | (m << 13));
  return small_float_fields_to_float<10, 15>(sign, e, m);
}

// The conversions of KPool_Float8.hpp, declared here for SmallFloat.
KOKKOS_INLINE_FUNCTION std::uint8_t float_to_e4m3_bits(float f);
KOKKOS_INLINE_FUNCTION float e4m3_bits_to_float(std::uint8_t b);

enum class SmallFormat { bf16, f16, e4m3 };

// The body of a storage type holding one value of a small float format in
// its bits: the constructor from float rounds as the format's rule says
// (docs/pools.md and docs/indexer.md), the conversion to float is exact.
// Host and device; trivially copyable. Each type derives from it (and
// inherits its constructors), so it keeps its own name.
template <class Derived, SmallFormat Format>
struct SmallFloat {
  using bits_type = typename std::conditional<Format == SmallFormat::e4m3, std::uint8_t,
                                              std::uint16_t>::type;
  /// The raw bit pattern.
  bits_type bits;

  /// Uninitialized, like a float.
  KOKKOS_DEFAULTED_FUNCTION SmallFloat() = default;
  /// Rounds `f` into the format.
  /// @param f the value to store.
  KOKKOS_INLINE_FUNCTION explicit SmallFloat(float f) {
    if constexpr (Format == SmallFormat::bf16)
      bits = float_to_bf16_bits(f);
    else if constexpr (Format == SmallFormat::f16)
      bits = float_to_f16_bits(f);
    else
      bits = float_to_e4m3_bits(f);
  }
  /// The stored value as a float, exactly.
  KOKKOS_INLINE_FUNCTION explicit operator float() const {
    if constexpr (Format == SmallFormat::bf16)
      return bf16_bits_to_float(bits);
    else if constexpr (Format == SmallFormat::f16)
      return f16_bits_to_float(bits);
    else
      return e4m3_bits_to_float(bits);
  }
  /// The value whose bit pattern is `b`.
  /// @param b a bit pattern of the format.
  /// @return that value.
  KOKKOS_INLINE_FUNCTION static Derived from_bits(bits_type b) {
    Derived h;
    h.bits = b;
    return h;
  }
};

}  // namespace Details

/// Brain floating point: 1 sign, 8 exponent, 7 mantissa bits (the top
/// half of an f32). Host and device; two bytes, trivially copyable. From
/// float: round to nearest, ties to even; overflow gives infinity, NaN
/// stays NaN (quiet).
struct bfloat16 : Details::SmallFloat<bfloat16, Details::SmallFormat::bf16> {
  using SmallFloat::SmallFloat;
};

/// IEEE 754 binary16: 1 sign, 5 exponent, 10 mantissa bits, with
/// subnormals. Host and device; two bytes, trivially copyable. From float:
/// round to nearest, ties to even, into normals or subnormals; 65520 and
/// above give infinity, NaN stays NaN (quiet).
struct float16 : Details::SmallFloat<float16, Details::SmallFormat::f16> {
  using SmallFloat::SmallFloat;
};

static_assert(sizeof(bfloat16) == 2 && alignof(bfloat16) == 2,
              "bfloat16 must be two bytes");
static_assert(sizeof(float16) == 2 && alignof(float16) == 2,
              "float16 must be two bytes");
static_assert(std::is_trivially_copyable<bfloat16>::value &&
                  std::is_trivially_copyable<float16>::value,
              "16-bit storage types must be trivially copyable");

/// True (a std::integral_constant) for the four storage types KPool
/// computes on: float, double, bfloat16, float16.
/// @tparam T any type.
template <class T>
struct is_storage_type
    : std::integral_constant<bool, std::is_same<T, float>::value ||
                                       std::is_same<T, double>::value ||
                                       std::is_same<T, bfloat16>::value ||
                                       std::is_same<T, float16>::value> {};

namespace Details {

// The element-type check of the class templates that hold a storage type
// (Ring, SelectWorkspace, Layer): true, or one compile error that names
// the types allowed. Holder is the class checked, which the error's
// instantiation context names ("required from ... Holder = KPool::Ring<...>").
template <class T, class Holder>
constexpr bool holds_storage_type() {
  static_assert(is_storage_type<T>::value,
                "KPool: T must be float, double, KPool::bfloat16 or KPool::float16");
  return true;
}

}  // namespace Details

/// The arithmetic type of a storage type: double for double, float for the
/// rest (docs/pools.md, "Numerics").
/// @tparam T a storage type.
template <class T>
struct accumulator {
  /// f32 arithmetic for float, bfloat16 and float16.
  using type = float;
};
/// f64 storage computes in f64.
template <>
struct accumulator<double> {
  /// f64 arithmetic.
  using type = double;
};
/// Shorthand for accumulator<T>::type.
/// @tparam T a storage type.
template <class T>
using accumulator_t = typename accumulator<T>::type;

/// Storage to arithmetic type, exact.
/// @param x a stored value. @return x in f32.
KOKKOS_INLINE_FUNCTION float to_accumulator(float x) { return x; }
/// Storage to arithmetic type, exact.
/// @param x a stored value. @return x in f64.
KOKKOS_INLINE_FUNCTION double to_accumulator(double x) { return x; }
/// Storage to arithmetic type, exact.
/// @param x a stored value. @return x in f32.
KOKKOS_INLINE_FUNCTION float to_accumulator(bfloat16 x) {
  return static_cast<float>(x);
}
/// Storage to arithmetic type, exact.
/// @param x a stored value. @return x in f32.
KOKKOS_INLINE_FUNCTION float to_accumulator(float16 x) {
  return static_cast<float>(x);
}

/// Arithmetic to storage type, rounded once, to nearest even.
/// @tparam T the storage type.
/// @param x a value in accumulator_t<T>.
/// @return x rounded into T.
template <class T>
KOKKOS_INLINE_FUNCTION T from_accumulator(accumulator_t<T> x) {
  return T(x);
}

/// The storage type's name as the serving-trace format spells it
/// (docs/trace.md): "f32", "f64", "bf16", "f16", or "unknown".
/// @tparam T a storage type.
/// @return a string literal.
template <class T>
constexpr char const* storage_name() {
  return std::is_same<T, float>::value      ? "f32"
         : std::is_same<T, double>::value   ? "f64"
         : std::is_same<T, bfloat16>::value ? "bf16"
         : std::is_same<T, float16>::value  ? "f16"
                                            : "unknown";
}

}  // namespace KPool

#endif
