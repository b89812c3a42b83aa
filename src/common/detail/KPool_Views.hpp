#ifndef KPOOL_COMMON_DETAIL_VIEWS_HPP
#define KPOOL_COMMON_DETAIL_VIEWS_HPP

// Views as the entry points normalize them, arrays as the kernels see them,
// and one request of a ragged batch as the kernels load it (every stage
// reads the batch the same way). Public entry
// points accept any layout; internally every view is LayoutStride and every
// kernel array a Strided pointer, so one functor instantiation serves
// LayoutRight, LayoutLeft and strided inputs alike, and the contiguous fast
// path is a run-time choice made from the strides.

#include <common/detail/KPool_KokkosExt.hpp>
#include <common/detail/KPool_Request.hpp>
#include <common/detail/KPool_Strided.hpp>

#include <cstdint>

namespace KPool {
namespace Details {

template <class T, class M>
using View1 = Kokkos::View<T*, Kokkos::LayoutStride, M>;
template <class T, class M>
using View2 = Kokkos::View<T**, Kokkos::LayoutStride, M>;
template <class T, class M>
using View3 = Kokkos::View<T***, Kokkos::LayoutStride, M>;
template <class T, class M>
using View4 = Kokkos::View<T****, Kokkos::LayoutStride, M>;

// One live request as every kernel sees it. `valid` is false when the
// request's rows or length are out of range (only possible with validation
// off); such a request closes, compresses and seeds nothing. `slot_ok` is
// false when its ring slot is out of range; then it reads and writes no
// ring entry.
struct Request {
  RequestGeometry g;
  std::uint64_t row_begin;
  int slot;
  bool valid;
  bool slot_ok;
  // ring_close and the step's count agree on this: a close needs the ring.
  KOKKOS_INLINE_FUNCTION bool closes() const { return valid && slot_ok && g.closes; }
  KOKKOS_INLINE_FUNCTION std::uint64_t full() const { return valid ? g.full : 0; }
};

// The batch description shared by the ragged writers. slot_idx may be
// null (compress does not use the ring).
struct RaggedBatch {
  Strided<const std::uint32_t, 1> row_offsets;
  Strided<const std::uint32_t, 1> cache_lengths;
  Strided<const std::uint32_t, 1> slot_idx;
  std::uint64_t total_rows;  // rows of key/gate
  int num_requests;
  int kpool;
  int max_slots;
  int ring_length;  // R, the ring's extent 2 (kpool when no ring is used)

  KOKKOS_INLINE_FUNCTION Request request(int r) const {
    Request q;
    std::uint64_t const b = row_offsets(r);
    std::uint64_t const e = row_offsets(r + 1);
    std::uint64_t const c = cache_lengths(r);
    q.valid = b <= e && e <= total_rows && c + (e - b) <= max_sequence_length;
    q.row_begin = b;
    q.g = request_geometry(c, q.valid ? e - b : 0, kpool, ring_length);
    std::uint32_t const s = slot_idx.data() ? slot_idx(r) : 0u;
    q.slot_ok = s < static_cast<std::uint32_t>(max_slots);
    q.slot = static_cast<int>(s);
    return q;
  }
};

// Largest r in [0, n] with offsets(r) <= value: the request owning output
// row `value` when offsets is an exclusive prefix sum (empty requests share
// their offset with the next one and are skipped).
template <class OffsetsView>
KOKKOS_INLINE_FUNCTION int owner_of(OffsetsView const& offsets, int n,
                                    std::uint64_t value) {
  int lo = 0, hi = n;  // offsets(lo) <= value holds for lo = 0
  while (lo < hi) {
    int const mid = lo + (hi - lo + 1) / 2;
    if (static_cast<std::uint64_t>(offsets(mid)) <= value)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

}  // namespace Details
}  // namespace KPool

#endif
