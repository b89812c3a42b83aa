#ifndef KPOOL_SCORE_DETAIL_SCORE_MMA_FRAGMENTS_HPP
#define KPOOL_SCORE_DETAIL_SCORE_MMA_FRAGMENTS_HPP

// The warp-level matrix multiply-accumulate of the tensor-core scoring
// engine (ScoreEngine::tensor_cores): which lane holds which element of the
// A, B and C/D tiles (the PTX ISA's fragment tables for mma.sync, "Matrix
// Fragments for mma.m16n8k16" and "... mma.m16n8k32"), as one piece of
// code that the CUDA kernel and a host emulation of a warp's MMA both use.
//
// Shapes (D = A * B + C, A row-major M x K, B column-major K x N, f32 C/D):
//   MmaKind::bf16  m16n8k16, A and B bf16 (sm_80)
//   MmaKind::f16   m16n8k16, A and B f16  (sm_80)
//   MmaKind::e4m3  m16n8k32, A and B E4M3 (sm_89)
// A lane holds its A and B elements in 32-bit registers, element i in
// register i / per_reg, the lower-indexed element in the lower bits; its
// four C/D elements in four f32 registers. groupID = lane >> 2 and
// threadID_in_group = lane % 4, as the PTX ISA names them.
//
// mma_warp() is the MMA of a whole warp as one call of the engine's warp
// code: on a CUDA device each thread passes its own lane's fragments
// (Lanes = 1) and the call is the inline PTX instruction; elsewhere one
// thread holds all 32 lanes' fragments (Lanes = 32) and the call gathers the
// tiles through the mapping and computes D in f32 as the instruction's
// contract states it: every product exact (the inputs' significands fit
// f32's), accumulated in f32, here in k order.

#include <common/KPool_Float8.hpp>
#include <common/KPool_Types.hpp>
#include <common/detail/KPool_KokkosExt.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>

namespace KPool {
namespace Details {

enum class MmaKind { bf16, f16, e4m3 };

template <MmaKind Kind>
struct MmaShape;

// The A and B fragments of m16n8k(8 * per_reg), per_reg = 1 << Shift
// inputs to a 32-bit register: 4 * per_reg A elements (4 registers),
// 2 * per_reg B elements (2 registers), 4 C/D elements a lane. In the
// PTX ISA's tables, with P = per_reg:
//   A element i: row groupID (+8 where bit Shift of i is set), column
//     P * threadID_in_group + (i % P) (+4 * P for i >= 2 * P);
//   B element i: row (k) P * threadID_in_group + (i % P) (+4 * P for
//     i >= P), column (n) groupID.
template <int Shift>
struct MmaFragmentShape {
  static constexpr int m = 16;
  static constexpr int n = 8;
  static constexpr int per_reg = 1 << Shift;
  static constexpr int k = 8 * per_reg;
  static constexpr int a_regs = 4;
  static constexpr int b_regs = 2;
  static constexpr int a_elems = a_regs * per_reg;
  static constexpr int b_elems = b_regs * per_reg;
  KOKKOS_FORCEINLINE_FUNCTION static int a_row(int lane, int i) {
    return (lane >> 2) + ((i >> Shift) & 1) * 8;
  }
  KOKKOS_FORCEINLINE_FUNCTION static int a_col(int lane, int i) {
    return k_index(lane, i, Shift + 1);
  }
  KOKKOS_FORCEINLINE_FUNCTION static int b_row(int lane, int i) {
    return k_index(lane, i, Shift);
  }
  KOKKOS_FORCEINLINE_FUNCTION static int b_col(int lane, int) { return lane >> 2; }

 private:
  // The k index of an A or B element: P * threadID_in_group + (i % P),
  // +4 * P for each step of i >> high (high: the bit of i that selects
  // the upper half of k).
  KOKKOS_FORCEINLINE_FUNCTION static int k_index(int lane, int i, int high) {
    return (lane & 3) * per_reg + (i & (per_reg - 1)) + (i >> high) * (4 * per_reg);
  }
};

// m16n8k16 with 16-bit inputs: 8 A elements, 4 B elements. A element i:
// row groupID (+8 for i in {2, 3, 6, 7}), column 2 * threadID_in_group +
// (i & 1) (+8 for i >= 4); B element i: row (k) 2 * threadID_in_group +
// (i & 1) (+8 for i >= 2), column (n) groupID.
using MmaShape16 = MmaFragmentShape<1>;

// m16n8k32 with 8-bit inputs: 16 A elements, 8 B elements. A element i:
// row groupID (+8 for i in [4, 8) and [12, 16)), column 4 *
// threadID_in_group + (i & 3) (+16 for i >= 8); B element i: row (k) 4 *
// threadID_in_group + (i & 3) (+16 for i >= 4), column (n) groupID.
using MmaShape8 = MmaFragmentShape<2>;

// C and D (f32) of both shapes: element i at row groupID (+8 for i >= 2),
// column 2 * threadID_in_group + (i & 1).
struct MmaAccumulator {
  static constexpr int elems = 4;
  KOKKOS_FORCEINLINE_FUNCTION static int c_row(int lane, int i) {
    return (lane >> 2) + (i >> 1) * 8;
  }
  KOKKOS_FORCEINLINE_FUNCTION static int c_col(int lane, int i) {
    return (lane & 3) * 2 + (i & 1);
  }
};

template <>
struct MmaShape<MmaKind::bf16> : MmaShape16, MmaAccumulator {
  // An element's bits as its value (exact).
  KOKKOS_FORCEINLINE_FUNCTION static float value(std::uint32_t bits) {
    return bf16_bits_to_float(static_cast<std::uint16_t>(bits));
  }
};
template <>
struct MmaShape<MmaKind::f16> : MmaShape16, MmaAccumulator {
  KOKKOS_FORCEINLINE_FUNCTION static float value(std::uint32_t bits) {
    return to_accumulator(float16::from_bits(static_cast<std::uint16_t>(bits)));
  }
};
template <>
struct MmaShape<MmaKind::e4m3> : MmaShape8, MmaAccumulator {
  KOKKOS_FORCEINLINE_FUNCTION static float value(std::uint32_t bits) {
    return to_accumulator(float8_e4m3::from_bits(static_cast<std::uint8_t>(bits)));
  }
};

// Element i of a lane's registers `regs` as its bit pattern.
template <class S>
KOKKOS_FORCEINLINE_FUNCTION std::uint32_t mma_element(std::uint32_t const* regs, int i) {
  constexpr int bits = 32 / S::per_reg;
  constexpr std::uint32_t mask = bits == 32 ? 0xFFFFFFFFu : (1u << bits) - 1u;
  return (regs[i / S::per_reg] >> ((i % S::per_reg) * bits)) & mask;
}

// The MMA of one warp, emulated: d = a * b + c from the 32 lanes'
// fragments, products exact, f32 sums in k order. d may alias c.
template <MmaKind Kind>
KOKKOS_INLINE_FUNCTION void mma_emulate(float (&d)[32][4], std::uint32_t const (&a)[32][4],
                                        std::uint32_t const (&b)[32][2],
                                        float const (&c)[32][4]) {
  using S = MmaShape<Kind>;
  float am[S::m][S::k];
  float bm[S::k][S::n];
  for (int l = 0; l < 32; ++l) {
    for (int i = 0; i < S::a_elems; ++i)
      am[S::a_row(l, i)][S::a_col(l, i)] = S::value(mma_element<S>(a[l], i));
    for (int i = 0; i < S::b_elems; ++i)
      bm[S::b_row(l, i)][S::b_col(l, i)] = S::value(mma_element<S>(b[l], i));
  }
  for (int l = 0; l < 32; ++l)
    for (int i = 0; i < 4; ++i) {
      int const row = S::c_row(l, i);
      int const col = S::c_col(l, i);
      float acc = c[l][i];
      for (int kk = 0; kk < S::k; ++kk) acc += am[row][kk] * bm[kk][col];
      d[l][i] = acc;
    }
}

// The E4M3 mma.sync (m16n8k32 with e4m3 operands) needs PTX ISA 8.4 for
// sm_89 and sm_90, which nvcc emits from CUDA 12.4 on; older ptxas rejects
// the kernel even when the engine never runs. Below 12.4 (or with another
// CUDA compiler) the instruction is not compiled, mma_device_supported
// says false for E4M3 and the serving profile scores with tiles.
// KPOOL_CUDA_COMPILER_VERSION (major * 1000 + minor * 10, as CUDART_VERSION
// counts) is nvcc's own; a test build may define it lower to compile the
// guard's other side with this nvcc.
#if !defined(KPOOL_CUDA_COMPILER_VERSION)
#if defined(__NVCC__) && defined(__CUDACC_VER_MAJOR__)
#define KPOOL_CUDA_COMPILER_VERSION (__CUDACC_VER_MAJOR__ * 1000 + __CUDACC_VER_MINOR__ * 10)
#else
#define KPOOL_CUDA_COMPILER_VERSION 0
#endif
#endif
#if KPOOL_CUDA_COMPILER_VERSION >= 12040
#define KPOOL_IMPL_E4M3_MMA 1
#else
#define KPOOL_IMPL_E4M3_MMA 0
#endif

// The architectures whose instructions mma_warp emits: bf16 and f16 from
// sm_80, E4M3 from sm_89 (with CUDA 12.4 or newer, above). On the host side
// of a CUDA build the arch macros of Kokkos' configuration tell (the
// engine's automatic choice uses them).
template <MmaKind Kind>
struct mma_device_supported {
#if defined(KOKKOS_ARCH_ADA89) || defined(KOKKOS_ARCH_HOPPER90) || \
    defined(KOKKOS_ARCH_BLACKWELL100) || defined(KOKKOS_ARCH_BLACKWELL120)
  static constexpr bool value = Kind != MmaKind::e4m3 || KPOOL_IMPL_E4M3_MMA;
#elif defined(KOKKOS_ARCH_AMPERE80) || defined(KOKKOS_ARCH_AMPERE86) || \
    defined(KOKKOS_ARCH_AMPERE87)
  static constexpr bool value = Kind != MmaKind::e4m3;
#else
  static constexpr bool value = false;
#endif
};

// One lane's MMA on a CUDA device: the PTX instruction, d = a * b + d.
template <MmaKind Kind>
KOKKOS_FORCEINLINE_FUNCTION void mma_lane(float (&d)[4], std::uint32_t const (&a)[4],
                                          std::uint32_t const (&b)[2]) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
  if constexpr (Kind == MmaKind::bf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else if constexpr (Kind == MmaKind::f16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
#if __CUDA_ARCH__ >= 890 && KPOOL_IMPL_E4M3_MMA
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    (void)d, (void)a, (void)b;
    Kokkos::abort("KPool: the E4M3 tensor-core MMA needs sm_89 or newer and CUDA 12.4 or newer");
#endif
  }
#else
  (void)d, (void)a, (void)b;
  Kokkos::abort("KPool: the tensor-core MMA needs a CUDA device of sm_80 or newer");
#endif
}

// The warp's MMA, acc = a * b + acc, from the fragments this thread holds:
// its own lane's (Lanes = 1, CUDA) or all 32 (Lanes = 32, emulation).
template <MmaKind Kind, int Lanes>
KOKKOS_FORCEINLINE_FUNCTION void mma_warp(float (&acc)[Lanes][4],
                                          std::uint32_t const (&a)[Lanes][4],
                                          std::uint32_t const (&b)[Lanes][2]) {
  if constexpr (Lanes == 32) {
    mma_emulate<Kind>(acc, a, b, acc);
  } else {
    static_assert(Lanes == 1, "KPool: a thread holds one lane or a whole warp");
    mma_lane<Kind>(acc[0], a[0], b[0]);
  }
}

// bf16 operand term `term` of x (0, 1, 2): the nearest bf16 of what the
// earlier terms left (each rest exact in f32); three terms represent every
// f32 of magnitude 2^-110 or more exactly. A non-finite first term leaves
// nothing for the others (x itself carries inf or NaN).
KOKKOS_INLINE_FUNCTION std::uint32_t bf16_term(float x, int term) {
  float r = x;
  std::uint16_t b = 0;
  for (int j = 0; j <= term; ++j) {
    b = float_to_bf16_bits(r);
    float const v = bf16_bits_to_float(b);
    r = (v - v == 0.0f) ? r - v : 0.0f;  // v finite
  }
  return b;
}

// The first `terms` bf16 terms of x (bf16_term's), zeros after: each term
// from what the ones before it left, one conversion a term. Unrolled, so
// that out is not indexed at run time (an array in local memory on a
// device).
KOKKOS_FORCEINLINE_FUNCTION void split_bf16(float x, int terms, std::uint32_t (&out)[3]) {
  out[0] = out[1] = out[2] = 0u;
  float r = x;
  KPOOL_IMPL_UNROLL
  for (int j = 0; j < 3; ++j) {
    if (j >= terms) break;
    std::uint16_t const b = float_to_bf16_bits(r);
    float const v = bf16_bits_to_float(b);
    r = (v - v == 0.0f) ? r - v : 0.0f;  // v finite
    out[j] = b;
  }
}

}  // namespace Details
}  // namespace KPool

#endif
