#ifndef KPOOL_SCORE_DETAIL_SCORE_MMA_HPP
#define KPOOL_SCORE_DETAIL_SCORE_MMA_HPP

// Which calls the tensor-core scoring engine takes, and with which MMA
// (docs/indexer.md, "The tensor-core engine"). Its kernel is
// score/detail/KPool_ScoreMmaFunctor.hpp, its launch launch_score_mma
// (select/detail/KPool_SelectCall.hpp).
//
// Every operand must be exact in the MMA's input type, so that the products
// are the exact products the contract sums in f32:
//  - fp8 cache: an E4M3 key is exact in bf16; the f32 query is split into
//    bf16 terms q1 + q2 + q3 (each the nearest bf16 of the rest), which
//    represent every f32 exactly: three terms for f32 or rotated queries,
//    one for a bf16 query as it is, two for an f16 query as it is (11
//    significant bits; f16's exponent range lies inside bf16's);
//  - bf16 cache (bf16 queries): the key as it is; the query likewise, or
//    three terms when rotated;
//  - f16 cache (f16 queries), not rotated: f16 MMA, both as they are. A
//    rotated f16 query would need f16 terms, whose exponent range loses
//    small values: such calls keep team_gemm;
//  - f32 and f64 caches keep the portable engines;
//  - the serving profile: E4M3 codes of key and query on the E4M3 MMA (or,
//    built with KPOOL_SERVING_MMA_BF16, on the bf16 MMA: exact there too).

#include <KPool_Config.hpp>
#include <common/KPool_Float8.hpp>
#include <common/KPool_Types.hpp>
#include <common/detail/KPool_KokkosExt.hpp>
#include <score/detail/KPool_ScoreMmaFragments.hpp>
#include <score/detail/KPool_ScoreMmaFunctor.hpp>

#include <type_traits>

namespace KPool {
namespace Details {

// Storage types the engine is compiled for.
template <class T, class C>
struct mma_types {
  static constexpr bool value =
      (std::is_same<C, float8_e4m3>::value && !std::is_same<T, double>::value) ||
      (std::is_same<C, T>::value &&
       (std::is_same<T, bfloat16>::value || std::is_same<T, float16>::value));
};

struct MmaPlan {
  bool usable = false;     // the engine takes the call
  bool on_device = false;  // ... with the hardware MMA (else the emulation)
  MmaKind kind = MmaKind::bf16;
  int terms = 1;           // query operand terms
  char const* why = "";    // when not usable
};

template <class ExecutionSpace, class T, class C>
MmaPlan mma_plan(bool rotated, bool serving = false) {
  MmaPlan p;
  constexpr bool fp8 = std::is_same<C, float8_e4m3>::value;
  if (!mma_types<T, C>::value) {
    p.why = "an f32 or f64 cache";
    return p;
  }
  if (serving) {
    if (!fp8) {
      p.why = "the serving profile needs an fp8 cache";
      return p;
    }
    // E4M3 codes on the E4M3 MMA, or (KPOOL_SERVING_MMA_BF16) on the bf16
    // MMA, where they are exact operands.
    p.kind = KPOOL_SERVING_MMA_BF16 ? MmaKind::bf16 : MmaKind::e4m3;
    p.terms = 1;
  } else if (fp8 || std::is_same<T, bfloat16>::value) {
    p.kind = MmaKind::bf16;
    p.terms = rotated || std::is_same<T, float>::value ? 3
              : std::is_same<T, float16>::value     ? 2
                                                    : 1;
  } else {
    if (rotated) {
      p.why = "a rotated f16 cache";
      return p;
    }
    p.kind = MmaKind::f16;
    p.terms = 1;
  }
  if constexpr (KokkosExt::is_device_backend<ExecutionSpace>::value) {
    if (mma_lanes<ExecutionSpace>::value != 1) {
      p.why = "a device backend other than CUDA";
      return p;
    }
    bool const arch = p.kind == MmaKind::e4m3 ? mma_device_supported<MmaKind::e4m3>::value
                                              : mma_device_supported<MmaKind::bf16>::value;
    if (!arch) {
      p.why = p.kind == MmaKind::e4m3
                  ? "the build's CUDA architecture is below sm_89, or its CUDA below 12.4"
                  : "the build's CUDA architecture is below sm_80";
      return p;
    }
    p.on_device = true;
  }
  p.usable = true;
  return p;
}

// Whether the engine's plan for the call is the E4M3 MMA, which takes the
// serving profile's queries prepared as E4M3 bytes (PrepareQueriesFunctor's
// codes) rather than as f32 values.
template <class ExecutionSpace, class T, class C>
bool mma_query_codes(bool rotated, bool serving) {
  MmaPlan const p = mma_plan<ExecutionSpace, T, C>(rotated, serving);
  return p.usable && p.kind == MmaKind::e4m3;
}

}  // namespace Details
}  // namespace KPool

#endif
