#ifndef KPOOL_COMMON_DETAIL_LANES_HPP
#define KPOOL_COMMON_DETAIL_LANES_HPP

// How a team thread's vector lanes cover a row's channels, shared by every
// stage that moves rows (the pooling writers, the cache writes, the ring
// stash): the kernel variant (Path), the lane packets and their loads and
// stores, and the stage protocol a pooling loop hands its values to.

#include <common/detail/KPool_KokkosExt.hpp>

#include <cstddef>

namespace KPool {
namespace Details {

// A kernel variant. KPool/DPool > 0 fix kpool/head_dim at compile time (the
// checkpoint's K=4, D=128 fast path); Width channels go to one vector lane
// (16 bytes of the storage type on GPUs, 1 on hosts, whose compilers
// vectorize across lanes instead); Contiguous means unit channel stride in
// every view the kernel touches.
template <int KPool_, int DPool_, int Width_, bool Contiguous_>
struct Path {
  static constexpr int kpool = KPool_;
  static constexpr int head_dim = DPool_;
  static constexpr int width = Width_;
  static constexpr bool contiguous = Contiguous_;
};

// Width consecutive values, aligned so one load moves all of them (16 bytes
// for the storage types, up to 32 for the f32 ape row of a 16-bit type).
template <class T, int Width>
struct alignas(sizeof(T) * Width) Packet {
  T v[Width];
};

// Packet loads and stores. Reading T objects through a Packet lvalue that
// no Packet object backs is undefined in C++, so the bytes are copied
// (KokkosExt::copy_aligned_bytes: memcpy on hosts, one wide vector access
// on GPUs). Callers guarantee the alignment (dispatch_path's `aligned`); a
// test build with device shapes checks it in copy_aligned_bytes, since a
// GPU faults on a misaligned vector access where a host would not.
template <int Width, class T>
KOKKOS_FORCEINLINE_FUNCTION Packet<T, Width> load_packet(T const* p) {
  Packet<T, Width> v;
  if constexpr (Width == 1) {
    v.v[0] = *p;
  } else {
    KokkosExt::copy_aligned_bytes<sizeof(Packet<T, Width>)>(&v, p);
  }
  return v;
}

template <int Width, class T>
KOKKOS_FORCEINLINE_FUNCTION void store_packet(T* p,
                                              Packet<T, Width> const& v) {
  if constexpr (Width == 1) {
    *p = v.v[0];
  } else {
    KokkosExt::copy_aligned_bytes<sizeof(Packet<T, Width>)>(p, &v);
  }
}

// Where a pool's values go besides the output row. NoStage: nowhere. A
// cache write passes its team-scratch stage (common/detail/KPool_CacheWrite.hpp),
// which receives each channel's value from the registers that just rounded
// it into T, so the pool never makes a second trip through memory.
// After the pool is complete, thread_vector_pool calls finish(member, out,
// out_c) with the output row it wrote (a host's cache write reads it back
// from there while it is still in the core's L1 cache).
struct NoStage {
  template <class T>
  KOKKOS_FORCEINLINE_FUNCTION void operator()(int, T const&) const {}
  template <class Member, class T>
  KOKKOS_FORCEINLINE_FUNCTION void finish(Member const&, T const*,
                                          std::ptrdiff_t) const {}
};

/// Copies one row of D channels with the lane mapping of
/// thread_vector_pool (used to stash keys and gates in the ring).
template <class ExecutionSpace, class P, class T, class Member>
KOKKOS_INLINE_FUNCTION void thread_vector_copy(Member const& member, int D,
                                               T const* src,
                                               std::ptrdiff_t src_c, T* dst,
                                               std::ptrdiff_t dst_c) {
  constexpr int W = P::width;
  int const head_dim = P::head_dim > 0 ? P::head_dim : D;
  if constexpr (P::contiguous) {
    KokkosExt::vector_for<ExecutionSpace>(member, head_dim / W, [&](int p) {
      store_packet<W>(dst + p * W, load_packet<W>(src + p * W));
    });
  } else {
    KokkosExt::vector_for<ExecutionSpace>(
        member, head_dim, [&](int c) { dst[c * dst_c] = src[c * src_c]; });
  }
}

}  // namespace Details
}  // namespace KPool

#endif
