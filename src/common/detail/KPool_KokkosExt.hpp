#ifndef KPOOL_COMMON_DETAIL_KOKKOS_EXT_HPP
#define KPOOL_COMMON_DETAIL_KOKKOS_EXT_HPP

// The one place where Kokkos version and backend differences live. Kernels
// call these names and never test KOKKOS_VERSION themselves.

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#ifndef KOKKOS_VERSION
#error "KPool needs a Kokkos that defines KOKKOS_VERSION (3.4 or newer)"
#endif
#if KOKKOS_VERSION < 30400
#error "KPool needs Kokkos 3.4 or newer"
#endif

// The pool cache's contract is byte-exact (docs/indexer.md, "The pool
// cache"): the same pool has the same bits from every writer, on host and
// device. Fast math lets the compiler reassociate, contract, flush
// subnormals and assume no NaN or infinity, so those bits would depend on
// inlining and vector width, and a NaN score could rank as a number.
// GCC, Clang and hipcc say so with __FAST_MATH__ (-ffast-math, also
// nvcc's host pass under -Xcompiler=-ffast-math) and __FINITE_MATH_ONLY__
// (-ffinite-math-only). nvcc's --use_fast_math defines no macro at all
// (CUDA 13.0): KPool's CMake refuses that flag instead (docs/api.md,
// "Building"). There is no opt-out: a build that wants fast math for its
// own code compiles KPool's translation units without it.
#if defined(__FAST_MATH__)
#error "KPool refuses fast-math builds (-ffast-math): the pool cache's byte-exact contract and the NaN rules of the selection need IEEE arithmetic; compile the translation units that include KPool without it"
#endif
#if defined(__FINITE_MATH_ONLY__) && __FINITE_MATH_ONLY__
#error "KPool refuses -ffinite-math-only builds: the selection ranks NaN and infinite scores by the contract's rules, which need IEEE arithmetic; compile the translation units that include KPool without it"
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

// Whether an execution space is a GPU-style backend (CUDA, HIP, SYCL,
// OpenMPTarget, OpenACC), decided by the backend, never by where its memory
// lives: CUDA with UVM or on a GH200 and HIP on an MI300A reach host memory
// and still need device launch shapes. Kokkos Tools' backend tag names the
// backend in every release from 3.4 on, even those that moved HIP and SYCL
// out of Kokkos::Experimental.
template <class ExecutionSpace>
struct is_device_backend {
 private:
  using device_type = Kokkos::Tools::Experimental::DeviceType;
  static constexpr device_type id =
      Kokkos::Tools::Experimental::DeviceTypeTraits<ExecutionSpace>::id;

 public:
  static constexpr bool value = id == device_type::Cuda ||
                                id == device_type::HIP ||
                                id == device_type::SYCL ||
#if defined(KOKKOS_ENABLE_OPENACC)
                                id == device_type::OpenACC ||
#endif
                                id == device_type::OpenMPTarget;
};

// The most vector lanes one team thread takes: the lanes that run in
// lock-step on the backend, a CUDA warp (32) or an AMD wavefront (64), so
// a vector range never spans two of them and its reductions stay in
// registers. Other backends (SYCL sub-groups are 16 or 32 wide; host
// backends under KPool_TEST_DEVICE_SHAPES mimic CUDA) take 32. Decided by
// Kokkos Tools' backend tag like is_device_backend. docs/building.md
// ("Vector lanes per team thread") argues the choice.
template <class ExecutionSpace>
struct max_vector_lanes {
  static constexpr int value =
      Kokkos::Tools::Experimental::DeviceTypeTraits<ExecutionSpace>::id ==
              Kokkos::Tools::Experimental::DeviceType::HIP
          ? 64
          : 32;
};

// Backend names, where releases moved them.
#if defined(KOKKOS_ENABLE_HIP) && KOKKOS_VERSION >= 40000
using HIP = Kokkos::HIP;
#elif defined(KOKKOS_ENABLE_HIP)
using HIP = Kokkos::Experimental::HIP;
#endif
#if defined(KOKKOS_ENABLE_SYCL) && KOKKOS_VERSION >= 40500
using SYCL = Kokkos::SYCL;
#elif defined(KOKKOS_ENABLE_SYCL)
using SYCL = Kokkos::Experimental::SYCL;
#endif

#if defined(KOKKOS_ENABLE_CUDA)
static_assert(is_device_backend<Kokkos::Cuda>::value, "CUDA is a device backend");
#endif
#if defined(KOKKOS_ENABLE_HIP)
static_assert(is_device_backend<HIP>::value, "HIP is a device backend");
#endif
#if defined(KOKKOS_ENABLE_SYCL)
static_assert(is_device_backend<SYCL>::value, "SYCL is a device backend");
#endif
#if defined(KOKKOS_ENABLE_OPENMPTARGET)
static_assert(is_device_backend<Kokkos::Experimental::OpenMPTarget>::value,
              "OpenMPTarget is a device backend");
#endif
#if defined(KOKKOS_ENABLE_SERIAL)
static_assert(!is_device_backend<Kokkos::Serial>::value, "Serial is a host backend");
#endif
#if defined(KOKKOS_ENABLE_OPENMP)
static_assert(!is_device_backend<Kokkos::OpenMP>::value, "OpenMP is a host backend");
#endif
#if defined(KOKKOS_ENABLE_THREADS)
static_assert(!is_device_backend<Kokkos::Threads>::value, "Threads is a host backend");
#endif
#if defined(KOKKOS_ENABLE_HPX)
static_assert(!is_device_backend<Kokkos::Experimental::HPX>::value,
              "HPX is a host backend");
#endif

// The team policy of every KPool launch. HintLightWeight asks CUDA to pass
// the functor as a kernel argument (up to 4 KB) rather than through constant
// memory, whose copy waits on the host for the previous such launch and
// cannot be captured in a CUDA graph. Other backends ignore the hint.
template <class ExecutionSpace>
using TeamPolicy =
    Kokkos::TeamPolicy<ExecutionSpace,
                       Kokkos::Experimental::WorkItemProperty::HintLightWeight_t>;

// The same policy with a functor's launch bounds: a functor that declares
// `using launch_bounds = Kokkos::LaunchBounds<MaxThreads, MinBlocks>;`
// (CUDA then caps its registers so that MinBlocks teams of up to
// MaxThreads threads fit an SM; other backends ignore it) launches with
// them. The member type is the policy's without them.
template <class F, class = void>
struct launch_bounds_of {
  using type = Kokkos::LaunchBounds<>;
};
template <class F>
struct launch_bounds_of<F, std::void_t<typename F::launch_bounds>> {
  using type = typename F::launch_bounds;
};
template <class ExecutionSpace, class Functor>
using BoundedTeamPolicy =
    Kokkos::TeamPolicy<ExecutionSpace, Kokkos::Experimental::WorkItemProperty::HintLightWeight_t,
                       typename launch_bounds_of<Functor>::type>;

// The device's multiprocessors (CUDA SMs, HIP compute units) of the
// instance's device, by the runtime's attribute query (no
// synchronization); 0 on other backends. The instance's device is the
// host thread's current one, as Kokkos sets it at initialization.
template <class ExecutionSpace>
int device_multiprocessors(ExecutionSpace const&) {
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (std::is_same<ExecutionSpace, Kokkos::Cuda>::value) {
    int device = 0, count = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
      return 0;
    return count;
  }
#endif
#if defined(KOKKOS_ENABLE_HIP)
  if constexpr (std::is_same<ExecutionSpace, HIP>::value) {
    int device = 0, count = 0;
    if (hipGetDevice(&device) != hipSuccess ||
        hipDeviceGetAttribute(&count, hipDeviceAttributeMultiprocessorCount, device) !=
            hipSuccess)
      return 0;
    return count;
  }
#endif
  return 0;
}

// A fence of one execution space instance, never a global one. Kokkos
// reports instance fences to Kokkos Tools from 3.5 on; 3.4 reports none, so
// KPool reports its own there, as later releases would.
template <class ExecutionSpace>
void fence(ExecutionSpace const& space, std::string const& name) {
#if KOKKOS_VERSION >= 30500
  space.fence(name);
#else
  std::uint64_t handle = 0;
  Kokkos::Tools::beginFence(name, Kokkos::Tools::Experimental::device_id(space),
                            &handle);
  space.fence();
  Kokkos::Tools::endFence(handle);
#endif
}

// A host view laid out like v, not initialized; v itself when v lives in
// host memory. The argument order changed in 3.7.
template <class View>
auto create_host_mirror_view_uninitialized(View const& v) {
#if KOKKOS_VERSION >= 30700
  return Kokkos::create_mirror_view(Kokkos::WithoutInitializing,
                                    Kokkos::HostSpace(), v);
#else
  return Kokkos::create_mirror_view(Kokkos::HostSpace(), v,
                                    Kokkos::WithoutInitializing);
#endif
}

// The bits of `from` as a To (C++20's std::bit_cast). Never std::memcpy:
// under HIP, a <cstring> included before KPool resolves std::memcpy to
// the host function, which a host-device function cannot call. The
// compiler builtin where there is one (GCC 11, Clang 9, nvcc 11.7 and
// later, hipcc), which is also usable in constant expressions; else a copy
// of the object representation byte by byte, which is valid everywhere
// and which compilers fold into one move.
#if defined(__has_builtin)
#if __has_builtin(__builtin_bit_cast) && \
    !(defined(__NVCC__) && (__CUDACC_VER_MAJOR__ < 11 ||                  \
                            (__CUDACC_VER_MAJOR__ == 11 && __CUDACC_VER_MINOR__ < 7)))
#define KPOOL_IMPL_BUILTIN_BIT_CAST 1
#endif
#endif
#ifndef KPOOL_IMPL_BUILTIN_BIT_CAST
#define KPOOL_IMPL_BUILTIN_BIT_CAST 0
#endif

template <class To, class From>
KOKKOS_FORCEINLINE_FUNCTION
#if KPOOL_IMPL_BUILTIN_BIT_CAST
    constexpr
#endif
    To
    bit_cast(From const& from) {
  static_assert(sizeof(To) == sizeof(From), "bit_cast needs equal sizes");
  static_assert(std::is_trivially_copyable<To>::value &&
                    std::is_trivially_copyable<From>::value,
                "bit_cast needs trivially copyable types");
#if KPOOL_IMPL_BUILTIN_BIT_CAST
  return __builtin_bit_cast(To, from);
#else
  To to{};
  unsigned char* dst = reinterpret_cast<unsigned char*>(&to);
  unsigned char const* src = reinterpret_cast<unsigned char const*>(&from);
  for (std::size_t i = 0; i < sizeof(To); ++i) dst[i] = src[i];
  return to;
#endif
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

// a * b + c, fused where the target has FMA (f32 and f64).
template <class F>
KOKKOS_FORCEINLINE_FUNCTION F fmadd(F a, F b, F c) {
  static_assert(std::is_same<F, float>::value || std::is_same<F, double>::value,
                "fmadd: float or double");
  constexpr bool f32 = std::is_same<F, float>::value;
#if KPOOL_IMPL_HAS_FMA && (defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__))
  if constexpr (f32) return ::fmaf(a, b, c);
  else return ::fma(a, b, c);
#elif KPOOL_IMPL_HAS_FMA
  if constexpr (f32) return __builtin_fmaf(a, b, c);
  else return __builtin_fma(a, b, c);
#else
  (void)f32;
  return a * b + c;
#endif
}

// The index of the lowest set bit of m, which is not 0.
KOKKOS_FORCEINLINE_FUNCTION int lowest_set_bit(std::uint32_t m) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __ffs(static_cast<int>(m)) - 1;
#elif defined(__GNUC__) || defined(__clang__)
  return __builtin_ctz(m);
#else
  int i = 0;
  while ((m & 1u) == 0) {
    m >>= 1;
    ++i;
  }
  return i;
#endif
}

#if defined(KPOOL_TEST_DEVICE_SHAPES) && !defined(__CUDACC__) && !defined(__HIPCC__)
// Device-shapes builds (host backends taking a GPU's launch shapes) check
// every wide copy's alignment, as a GPU would fault on it; launch() names
// the kernel it runs here, so that the abort says which one.
#define KPOOL_IMPL_CHECK_WIDE_COPIES 1
inline std::string& running_kernel() {
  static std::string name = "(outside any KPool launch)";
  return name;
}

[[noreturn]] inline void misaligned_wide_copy(std::size_t bytes, void const* dst,
                                              void const* src) {
  std::fprintf(stderr,
               "KPool: misaligned %zu-byte copy in kernel %s: from %p to %p "
               "(a GPU would fault here)\n",
               bytes, running_kernel().c_str(), src, dst);
  std::fflush(stderr);
  Kokkos::abort("KPool: misaligned wide copy (a GPU would fault here)");
  std::abort();
}
#endif

// Copies Bytes bytes between addresses aligned to the wide access (8 bytes
// for Bytes 8, 16 for multiples of 16) in one wide access. Host compilers
// turn the memcpy into one vector load or store; nvcc turns it into byte
// accesses, so device code goes through CUDA's / HIP's 16- and 8-byte
// vector types, the documented idiom for one wide load.
template <std::size_t Bytes>
KOKKOS_FORCEINLINE_FUNCTION void copy_aligned_bytes(void* dst, void const* src) {
  static_assert(Bytes == 8 || Bytes % 16 == 0,
                "wide copies are 8 or a multiple of 16 bytes");
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  if constexpr (Bytes % 16 == 0) {
    for (std::size_t i = 0; i < Bytes / 16; ++i)
      static_cast<uint4*>(dst)[i] = static_cast<uint4 const*>(src)[i];
  } else {
    *static_cast<uint2*>(dst) = *static_cast<uint2 const*>(src);
  }
#else
#if defined(KPOOL_IMPL_CHECK_WIDE_COPIES)
  constexpr std::uintptr_t align = Bytes % 16 == 0 ? 16 : 8;
  if (reinterpret_cast<std::uintptr_t>(dst) % align != 0 ||
      reinterpret_cast<std::uintptr_t>(src) % align != 0)
    misaligned_wide_copy(Bytes, dst, src);
#endif
  std::memcpy(dst, src, Bytes);
#endif
}

// Asynchronous copies into team scratch, for a pipeline that keeps several
// loads in flight without holding them in registers (the tensor-core
// scoring's key ring, score/detail/KPool_ScoreMmaFunctor.hpp). On CUDA
// sm_80+ a copy into shared memory is a cp.async (16 bytes bypassing L1,
// 4 bytes through it); async_commit closes this thread's group of copies
// and async_wait<N> waits until at most N of its groups are in flight.
// Only the thread's own copies are waited for: a warp reads another lane's
// after the wait and a __syncwarp. A copy into anything but shared memory
// (level-1 scratch) and every copy elsewhere is a plain one, done on
// return, and commit and wait are no-ops. Sources and destinations are
// aligned to the copy's size.
template <std::size_t Bytes>
KOKKOS_FORCEINLINE_FUNCTION void async_copy(void* dst, void const* src) {
  static_assert(Bytes == 4 || Bytes == 16, "asynchronous copies are 4 or 16 bytes");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (__isShared(dst)) {
    unsigned const to = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    if constexpr (Bytes == 16)
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to), "l"(src) : "memory");
    else
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(to), "l"(src) : "memory");
    return;
  }
#endif
  if constexpr (Bytes == 16) {
    copy_aligned_bytes<16>(dst, src);
  } else {
    *static_cast<std::uint32_t*>(dst) = *static_cast<std::uint32_t const*>(src);
  }
}

KOKKOS_FORCEINLINE_FUNCTION void async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int N>
KOKKOS_FORCEINLINE_FUNCTION void async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
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

}  // namespace KokkosExt

/// Whether kernels on ExecutionSpace take device launch shapes: 16-byte
/// channel packets per vector lane, up to KokkosExt::max_vector_lanes
/// lanes, one work item per team thread, device-like team sizes,
/// ThreadVectorRange channel loops. True for device backends. A build with the CMake option
/// KPool_TEST_DEVICE_SHAPES (which defines KPOOL_TEST_DEVICE_SHAPES for
/// KPool's own programs) makes it true for host backends too, so the host
/// test suite runs the code paths a GPU runs. Every launch-shape decision
/// asks this trait and nothing else.
template <class ExecutionSpace>
struct device_shapes {
#if defined(KPOOL_TEST_DEVICE_SHAPES)
  static constexpr bool value = true;
#else
  static constexpr bool value = KokkosExt::is_device_backend<ExecutionSpace>::value;
#endif
};

namespace KokkosExt {

// The loop over channels. With device shapes it is Kokkos'
// ThreadVectorRange, so consecutive lanes take consecutive channel packets.
// On a host Kokkos' own vector range hides the loop from GCC's vectorizer
// behind a lambda call and an aliasing doubt (outputs and inputs share the
// storage type), so it is written out with an ivdep: iterations of a
// channel loop never depend on each other, which is what every caller
// promises.
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
  if constexpr (device_shapes<ExecutionSpace>::value) {
    Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, n), f);
  } else {
    (void)member;
    KPOOL_IMPL_IVDEP
    for (int i = 0; i < n; ++i) f(i);
  }
}

// A team's loop over [begin, end), for ranges as long as a row's visible
// pools (up to 2^32 - 1). Kokkos computes a TeamThreadRange's per-thread
// bounds in the index type it is given: with int, begin + rank * chunk and
// i += team_size overflow for ends near 2^31, on hosts and on CUDA alike.
// Every loop over pools of a row goes through here, in 64 bits; the body
// takes a std::int64_t index.
template <class Member>
KOKKOS_FORCEINLINE_FUNCTION auto team_range(Member const& member, std::uint64_t begin,
                                            std::uint64_t end) {
  return Kokkos::TeamThreadRange(member, static_cast<std::int64_t>(begin),
                                 static_cast<std::int64_t>(end));
}

template <class Member, class Functor>
KOKKOS_FORCEINLINE_FUNCTION void single_per_thread(Member const& member,
                                                   Functor const& f) {
  Kokkos::single(Kokkos::PerThread(member), f);
}

// Release and acquire at device scope, for the fused selection's counters
// (select/detail/KPool_TopkFused.hpp). One thread of a team calls these
// after a team barrier: the barrier orders the team's earlier writes
// before the call, and a release is cumulative, so one thread publishes
// the whole team's writes (the pattern of a grid-wide barrier); what a
// team reads after an acquire and a barrier sees what the releases before
// it published. One instruction where the backend has it (CUDA sm_70+:
// atom / ld with .acq_rel / .acquire at .gpu scope; HIP: the agent-scope
// builtins; GCC and clang host code: the __atomic builtins); elsewhere a
// sequentially consistent fence beside Kokkos' own atomic.
KOKKOS_INLINE_FUNCTION std::uint32_t fetch_add_acq_rel(std::uint32_t* p, std::uint32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  std::uint32_t old;
  asm volatile("atom.acq_rel.gpu.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
#elif defined(__HIP_DEVICE_COMPILE__) && defined(__HIP_MEMORY_SCOPE_AGENT)
  return __hip_atomic_fetch_add(p, v, __ATOMIC_ACQ_REL, __HIP_MEMORY_SCOPE_AGENT);
#elif (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDA_ARCH__) && \
    !defined(__HIP_DEVICE_COMPILE__)
  return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL);
#else
  Kokkos::memory_fence();
  std::uint32_t const old = Kokkos::atomic_fetch_add(p, v);
  Kokkos::memory_fence();
  return old;
#endif
}

// *p with acquire ordering at device scope (as fetch_add_acq_rel).
KOKKOS_INLINE_FUNCTION std::uint32_t load_acquire(std::uint32_t* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  std::uint32_t v;
  asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
#elif defined(__HIP_DEVICE_COMPILE__) && defined(__HIP_MEMORY_SCOPE_AGENT)
  return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_AGENT);
#elif (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDA_ARCH__) && \
    !defined(__HIP_DEVICE_COMPILE__)
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#else
  std::uint32_t const v = Kokkos::atomic_fetch_add(p, 0u);
  Kokkos::memory_fence();
  return v;
#endif
}

}  // namespace KokkosExt
}  // namespace Details
}  // namespace KPool

#endif
