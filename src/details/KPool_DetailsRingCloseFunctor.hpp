#ifndef KPOOL_DETAILS_RING_CLOSE_FUNCTOR_HPP
#define KPOOL_DETAILS_RING_CLOSE_FUNCTOR_HPP

#include <details/KPool_DetailsBatch.hpp>
#include <details/KPool_DetailsCompressFunctor.hpp>
#include <details/KPool_DetailsPool.hpp>

#include <cstdint>

namespace KPool {
namespace Details {

// ring_close: the pending pool whose first `have` members the ring holds.
// One work item is one request. The ring is only read.
// Writer mode: pooled(r) / closed_pool(r), -1 when nothing closes.
// StepMode: the pool goes to row offsets(r) of the step's output.
template <class ExecutionSpace, class T, class P, bool StepMode>
struct RingCloseFunctor {
  using memory_space = typename ExecutionSpace::memory_space;
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;

  RaggedBatch<memory_space> batch;
  View4<const T, memory_space> tail;
  View2<const T, memory_space> key;
  View2<const T, memory_space> gate;
  View2<const float, memory_space> ape;
  PoolSink<T, memory_space> out;                 // rows [B] in writer mode
  View1<std::int32_t, memory_space> closed_pool;  // writer mode only
  int head_dim;
  int items_per_team = 1;

  KOKKOS_INLINE_FUNCTION void operator()(member_type const& member) const {
    int const begin = member.league_rank() * items_per_team;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, items_per_team),
                         [&](int i) { close(member, begin + i); });
  }

  KOKKOS_INLINE_FUNCTION void close(member_type const& member, int r) const {
    if (r >= batch.num_requests) return;
    Request const q = batch.request(r);
    std::uint64_t const o = StepMode ? out.offsets(r) : static_cast<std::uint64_t>(r);
    if (!q.closes() || !out.holds(o)) {
      if constexpr (!StepMode)
        KokkosExt::single_per_thread(member, [&]() { closed_pool(r) = -1; });
      return;
    }
    PoolSource<T> src = rows_source(key, gate, q.row_begin);
    attach_ring(src, tail, q.slot, q.g.have, q.g.cache_length - q.g.have);
    thread_vector_pool<ExecutionSpace, P>(member, batch.kpool, head_dim,
                                          ape_source(ape), src, out.row(o),
                                          out.channel_stride());
    std::int64_t const pool = static_cast<std::int64_t>(q.g.cache_length / batch.kpool);
    if constexpr (StepMode) {
      out.label(member, o, r, pool);
    } else {
      KokkosExt::single_per_thread(
          member, [&]() { closed_pool(r) = static_cast<std::int32_t>(pool); });
    }
  }
};

}  // namespace Details
}  // namespace KPool

#endif
