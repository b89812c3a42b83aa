#ifndef KPOOL_DETAILS_COMPRESS_FUNCTOR_HPP
#define KPOOL_DETAILS_COMPRESS_FUNCTOR_HPP

#include <details/KPool_DetailsBatch.hpp>
#include <details/KPool_DetailsPool.hpp>

#include <cstdint>

namespace KPool {
namespace Details {

// Pooled rows and, in a step, what each row is. offsets(r) is where
// request r's rows start; offsets(num_requests) is how many there are.
template <class T, class MemorySpace>
struct PoolSink {
  View2<T, MemorySpace> pooled;
  View1<std::int32_t, MemorySpace> batch_row;  // step only
  View1<std::int32_t, MemorySpace> pool_id;    // step only
  View1<const std::uint32_t, MemorySpace> offsets;

  KOKKOS_INLINE_FUNCTION bool holds(std::uint64_t o) const {
    return o < pooled.extent(0);
  }
  KOKKOS_INLINE_FUNCTION T* row(std::uint64_t o) const { return &pooled(o, 0); }
  KOKKOS_INLINE_FUNCTION std::ptrdiff_t channel_stride() const {
    return static_cast<std::ptrdiff_t>(pooled.stride(1));
  }
  template <class Member>
  KOKKOS_INLINE_FUNCTION void label(Member const& member, std::uint64_t o,
                                    int r, std::int64_t pool) const {
    KokkosExt::single_per_thread(member, [&]() {
      batch_row(o) = r;
      pool_id(o) = static_cast<std::int32_t>(pool);
    });
  }
};

// compress: every pool made entirely of this call's rows. One work item is
// one output row; its request is found by binary search over the offsets.
// In a step (StepMode) a request's first row belongs to its ring_close pool
// when it has one, and compress skips it.
template <class ExecutionSpace, class T, class P, bool StepMode>
struct CompressFunctor {
  using memory_space = typename ExecutionSpace::memory_space;
  using member_type = typename Kokkos::TeamPolicy<ExecutionSpace>::member_type;

  RaggedBatch<memory_space> batch;
  View2<const T, memory_space> key;
  View2<const T, memory_space> gate;
  View2<const float, memory_space> ape;
  PoolSink<T, memory_space> out;
  int head_dim;
  int items_per_team = 1;

  KOKKOS_INLINE_FUNCTION void operator()(member_type const& member) const {
    std::uint64_t const begin =
        static_cast<std::uint64_t>(member.league_rank()) * items_per_team;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, items_per_team),
                         [&](int i) { pool_row(member, begin + i); });
  }

  KOKKOS_INLINE_FUNCTION void pool_row(member_type const& member,
                                       std::uint64_t o) const {
    int const n = batch.num_requests;
    if (o >= out.offsets(n) || !out.holds(o)) return;
    int const r = owner_of(out.offsets, n, o);
    Request const q = batch.request(r);
    std::int64_t const j = static_cast<std::int64_t>(o - out.offsets(r)) -
                           ((StepMode && q.closes()) ? 1 : 0);
    if (j < 0 || static_cast<std::uint64_t>(j) >= q.full()) return;
    int const K = batch.kpool;
    PoolSource<T> const src = rows_source(
        key, gate, q.row_begin + q.g.align + static_cast<std::uint64_t>(j) * K);
    thread_vector_pool<ExecutionSpace, P>(member, K, head_dim, ape_source(ape),
                                          src, out.row(o),
                                          out.channel_stride());
    if constexpr (StepMode) out.label(member, o, r, q.g.first + j);
  }
};

}  // namespace Details
}  // namespace KPool

#endif
