#ifndef KPOOL_COMMON_DETAIL_STRIDED_HPP
#define KPOOL_COMMON_DETAIL_STRIDED_HPP

// What a kernel needs of a View: the pointer and the strides. A
// LayoutStride View also carries its extents and a reference-count handle,
// about twice the bytes, and a CUDA functor of 512 bytes or more launches
// through constant memory, which waits on the host. Functors therefore hold
// Strided arrays and the few extents they test; the entry point keeps the
// Views (and with them the allocations) alive for the call. The names
// (data, stride, operator()) are those of Kokkos::View, so kernel code
// reads the same either way.

#include <common/detail/KPool_KokkosExt.hpp>

#include <cstddef>
#include <type_traits>

namespace KPool {
namespace Details {

template <class T, int Rank>
struct Strided {
  T* ptr = nullptr;
  std::ptrdiff_t strides[Rank] = {};

  Strided() = default;

  // From any View of this rank (host side, at the entry point).
  template <class View, class = std::enable_if_t<Kokkos::is_view<View>::value>>
  Strided(View const& v) : ptr(v.data()) {
    static_assert(static_cast<int>(View::rank) == Rank,
                  "KPool: Strided needs a View of its rank");
    for (int d = 0; d < Rank; ++d)
      strides[d] = static_cast<std::ptrdiff_t>(v.stride(d));
  }

  KOKKOS_FORCEINLINE_FUNCTION T* data() const { return ptr; }
  KOKKOS_FORCEINLINE_FUNCTION std::ptrdiff_t stride(int d) const {
    return strides[d];
  }

  template <class... Index>
  KOKKOS_FORCEINLINE_FUNCTION T& operator()(Index... index) const {
    static_assert(sizeof...(Index) == Rank, "KPool: one index per dimension");
    std::ptrdiff_t const i[] = {static_cast<std::ptrdiff_t>(index)...};
    std::ptrdiff_t offset = 0;
    for (int d = 0; d < Rank; ++d) offset += i[d] * strides[d];
    return ptr[offset];
  }
};

}  // namespace Details
}  // namespace KPool

#endif
