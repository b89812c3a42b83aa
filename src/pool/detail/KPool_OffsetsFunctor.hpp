#ifndef KPOOL_POOL_DETAIL_OFFSETS_FUNCTOR_HPP
#define KPOOL_POOL_DETAIL_OFFSETS_FUNCTOR_HPP

// Exclusive prefix sums of pools per request, on the device, with no host
// synchronization: scanning B + 1 entries leaves the total in the last.
// One team does the whole scan, so it is exactly one launch on every
// backend (Kokkos' own device-wide scan may take several), which keeps the
// steps at two launches.

#include <common/detail/KPool_Launch.hpp>
#include <common/detail/KPool_Request.hpp>
#include <common/detail/KPool_Views.hpp>

#include <algorithm>
#include <cstdint>
#include <string>

namespace KPool {
namespace Details {

// Pools per ragged request. compress counts its own pools; a step
// (StepMode) counts the ring_close pool too.
template <bool StepMode>
struct RaggedPoolCount {
  RaggedBatch batch;
  KOKKOS_INLINE_FUNCTION std::uint32_t operator()(int r) const {
    if (r >= batch.num_requests) return 0;
    Request const q = batch.request(r);
    return static_cast<std::uint32_t>(q.full()) +
           ((StepMode && q.closes()) ? 1u : 0u);
  }
};

// Pools per decode row: one per real position that ends a pool.
template <class MemorySpace>
struct DecodePoolCount {
  View2<const std::int32_t, MemorySpace> positions;
  View1<const std::uint32_t, MemorySpace> slot_idx;
  int num_requests;
  int kpool;
  int max_slots;
  KOKKOS_INLINE_FUNCTION std::uint32_t operator()(int r) const {
    if (r >= num_requests || slot_idx(r) >= static_cast<std::uint32_t>(max_slots))
      return 0;
    std::uint32_t count = 0;
    for (int i = 0; i < static_cast<int>(positions.extent(1)); ++i)
      count += closes_pool(positions(r, i), kpool) ? 1u : 0u;
    return count;
  }
};

template <class ExecutionSpace, class Count>
struct OffsetsScanFunctor {
  using member_type =
      typename KokkosExt::TeamPolicy<ExecutionSpace>::member_type;
  Count count;
  View1<std::uint32_t, typename ExecutionSpace::memory_space> offsets;
  int rows;  // offsets(0..rows) are written

  KOKKOS_INLINE_FUNCTION void operator()(member_type const& member) const {
    Kokkos::parallel_scan(Kokkos::TeamThreadRange(member, rows + 1),
                          [&](int r, std::uint32_t& prefix, bool final) {
                            std::uint32_t const c = r < rows ? count(r) : 0u;
                            if (final) offsets(r) = prefix;
                            prefix += c;
                          });
  }
};

// Threads of the single scanning team: no more than `limit` (what the
// backend allows and recommends for the functor) and than the rows need,
// rounded up to a warp, and a power of two: Kokkos before 3.7 aborts a
// CUDA team_scan over any other team size (96 or 160 threads, say).
inline int scan_team_size(int limit, int rows) {
  std::int64_t const need = (static_cast<std::int64_t>(rows) + 1 + 31) / 32 * 32;
  return power_of_two_floor(
      static_cast<int>(std::min<std::int64_t>(std::max(limit, 1), need)));
}

// One team scans rows + 1 entries, on the caller's instance. rows is a
// batch size B, an int, so the scan's indices fit.
template <class ExecutionSpace, class Count, class OffsetsView>
void launch_offsets_scan(ExecutionSpace const& space, std::string const& label,
                         Count const& count, OffsetsView const& offsets,
                         int rows) {
  OffsetsScanFunctor<ExecutionSpace, Count> f{count, offsets, rows};
  LaunchShape shape;
  shape.league = 1;
  if constexpr (device_shapes<ExecutionSpace>::value) {
    KokkosExt::TeamPolicy<ExecutionSpace> const probe(space, 1, 1, 1);
    int const max = probe.team_size_max(f, Kokkos::ParallelForTag());
    int limit = max;
    if constexpr (KokkosExt::is_device_backend<ExecutionSpace>::value)
      limit = std::min(max, probe.team_size_recommended(f, Kokkos::ParallelForTag()));
    shape.team_size = scan_team_size(limit, rows);
  }
  launch(space, label, shape, f);
}

}  // namespace Details
}  // namespace KPool

#endif
