#ifndef KPOOL_DETAILS_KOKKOS_EXT_HPP
#define KPOOL_DETAILS_KOKKOS_EXT_HPP

// The one place where Kokkos version and backend differences live. Kernels
// call these names and never test KOKKOS_VERSION themselves.

#include <Kokkos_Core.hpp>

#include <cstring>
#include <string>
#include <type_traits>

#ifndef KOKKOS_VERSION
#error "KPool needs a Kokkos that defines KOKKOS_VERSION (3.4 or newer)"
#endif
#if KOKKOS_VERSION < 30400
#error "KPool needs Kokkos 3.4 or newer"
#endif

namespace KPool {
namespace Details {
namespace KokkosExt {

// Kokkos::exp arrived in 3.7; before that it lived in Kokkos::Experimental.
KOKKOS_INLINE_FUNCTION double exp(double x) {
#if KOKKOS_VERSION >= 30700
  return Kokkos::exp(x);
#else
  return Kokkos::Experimental::exp(x);
#endif
}

template <class MemorySpace, class ExecutionSpace>
struct is_accessible_from {
  static constexpr bool value =
      Kokkos::SpaceAccessibility<ExecutionSpace, MemorySpace>::accessible;
};

// A device execution space is one whose memory the host cannot touch.
// Launch shapes (channels per lane, team sizes) follow from this, not from
// a list of backend names.
template <class ExecutionSpace>
struct is_device_space {
  static constexpr bool value = !Kokkos::SpaceAccessibility<
      Kokkos::HostSpace, typename ExecutionSpace::memory_space>::accessible;
};

template <class To, class From>
KOKKOS_FORCEINLINE_FUNCTION To bit_cast(From const& from) {
  static_assert(sizeof(To) == sizeof(From), "bit_cast needs equal sizes");
  To to;
  std::memcpy(&to, &from, sizeof(To));
  return to;
}

// a * b + c, fused where the target has a fused multiply-add and plain
// where it has none. Compilers contract a * b + c on their own (GCC by
// default, nvcc with --fmad=true) but decide per context, vectorized or
// not, inlined here or there: the same pool built by two writers could then
// differ in its last bit. Every multiply-add of the pooling goes through
// here, so the choice is made once, and a pool has the same bits whichever
// writer builds it (and, with FMA on both, on host and device alike).
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define KPOOL_IMPL_HAS_FMA 1
#elif defined(__FMA__) || defined(__aarch64__) || defined(__ARM_FEATURE_FMA)
#define KPOOL_IMPL_HAS_FMA 1
#else
#define KPOOL_IMPL_HAS_FMA 0
#endif

KOKKOS_FORCEINLINE_FUNCTION float fmadd(float a, float b, float c) {
#if KPOOL_IMPL_HAS_FMA && (defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__))
  return ::fmaf(a, b, c);
#elif KPOOL_IMPL_HAS_FMA
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}

KOKKOS_FORCEINLINE_FUNCTION double fmadd(double a, double b, double c) {
#if KPOOL_IMPL_HAS_FMA && (defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__))
  return ::fma(a, b, c);
#elif KPOOL_IMPL_HAS_FMA
  return __builtin_fma(a, b, c);
#else
  return a * b + c;
#endif
}

// Kokkos::Profiling::ScopedRegion only exists in recent releases.
class ScopedProfileRegion {
 public:
  explicit ScopedProfileRegion(std::string const& name) {
    Kokkos::Profiling::pushRegion(name);
  }
  ~ScopedProfileRegion() { Kokkos::Profiling::popRegion(); }
  ScopedProfileRegion(ScopedProfileRegion const&) = delete;
  ScopedProfileRegion& operator=(ScopedProfileRegion const&) = delete;
};

// The loop over channels. On a device it is Kokkos' ThreadVectorRange, so
// consecutive lanes take consecutive channel packets. On the host Kokkos'
// own vector range hides the loop from GCC's vectorizer behind a lambda
// call and an aliasing doubt (outputs and inputs share the storage type),
// so it is written out with an ivdep: iterations of a channel loop never
// depend on each other, which is what every caller promises.
// Clang versions the loop on a run-time alias check by itself (and warns
// when a hinted loop does not vectorize), so it gets no hint.
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__) || defined(__clang__)
#define KPOOL_IMPL_IVDEP
#elif defined(__INTEL_COMPILER) || defined(__INTEL_LLVM_COMPILER)
#define KPOOL_IMPL_IVDEP _Pragma("ivdep")
#elif defined(__GNUC__) && !defined(__NVCC__)
#define KPOOL_IMPL_IVDEP _Pragma("GCC ivdep")
#else
#define KPOOL_IMPL_IVDEP
#endif

// Full unrolling of the short fixed-count loops inside a channel loop (over
// the K members, over a lane's packet). GCC only vectorizes a loop whose
// body has no inner loop left, and it does not unroll these early enough
// on its own.
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__) || defined(__clang__) || \
    defined(__NVCC__)
#define KPOOL_IMPL_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define KPOOL_IMPL_UNROLL _Pragma("GCC unroll 64")
#else
#define KPOOL_IMPL_UNROLL
#endif

// A hot loop nest kept out of line. GCC optimizes a register-blocked kernel
// well on its own and much worse once inlined into a large OpenMP region.
#if defined(__GNUC__) && !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__)
#define KPOOL_IMPL_NOINLINE __attribute__((noinline))
#else
#define KPOOL_IMPL_NOINLINE
#endif

template <class ExecutionSpace, class Member, class Functor>
KOKKOS_FORCEINLINE_FUNCTION void vector_for(Member const& member, int n,
                                            Functor const& f) {
  if constexpr (is_device_space<ExecutionSpace>::value) {
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, n), f);
  } else {
    (void)member;
    KPOOL_IMPL_IVDEP
    for (int i = 0; i < n; ++i) f(i);
  }
}

template <class Member, class Functor>
KOKKOS_FORCEINLINE_FUNCTION void single_per_thread(Member const& member,
                                                   Functor const& f) {
  Kokkos::single(Kokkos::PerThread(member), f);
}

}  // namespace KokkosExt
}  // namespace Details
}  // namespace KPool

#endif
