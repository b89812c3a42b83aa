#ifndef KPOOL_DETAILS_SEED_TAIL_FUNCTOR_HPP
#define KPOOL_DETAILS_SEED_TAIL_FUNCTOR_HPP

#include <details/KPool_DetailsBatch.hpp>
#include <details/KPool_DetailsPool.hpp>

#include <cstdint>

namespace KPool {
namespace Details {

// seed_tail: stash the call's last R positions, [seed_start, end), at ring
// index pos % R. One work item is one request; nothing else in the ring is
// written.
template <class ExecutionSpace, class T, class P>
struct SeedTailFunctor {
  using memory_space = typename ExecutionSpace::memory_space;
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;

  RaggedBatch<memory_space> batch;
  View4<T, memory_space> tail;
  View2<const T, memory_space> key;
  View2<const T, memory_space> gate;
  int head_dim;
  int items_per_team = 1;

  KOKKOS_INLINE_FUNCTION void operator()(member_type const& member) const {
    int const begin = member.league_rank() * items_per_team;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, items_per_team),
                         [&](int i) { seed(member, begin + i); });
  }

  KOKKOS_INLINE_FUNCTION void seed(member_type const& member, int r) const {
    if (r >= batch.num_requests) return;
    Request const q = batch.request(r);
    if (!q.valid || !q.slot_ok) return;
    for (std::uint64_t pos = q.g.seed_start; pos < q.g.end; ++pos) {
      std::uint64_t const row = q.row_begin + (pos - q.g.cache_length);
      int const idx = ring_index(pos, batch.ring_length);
      thread_vector_copy<ExecutionSpace, P>(member, head_dim, &key(row, 0),
                                            key.stride(1),
                                            &tail(q.slot, 0, idx, 0),
                                            tail.stride(3));
      thread_vector_copy<ExecutionSpace, P>(member, head_dim, &gate(row, 0),
                                            gate.stride(1),
                                            &tail(q.slot, 1, idx, 0),
                                            tail.stride(3));
    }
  }
};

}  // namespace Details
}  // namespace KPool

#endif
