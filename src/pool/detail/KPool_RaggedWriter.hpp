#ifndef KPOOL_POOL_DETAIL_RAGGED_WRITER_HPP
#define KPOOL_POOL_DETAIL_RAGGED_WRITER_HPP

// The ragged writers' device code: one struct holding every array a
// ragged call touches, each once, and the three per-item device functions
// (close a request's ring pool, build one compress pool, seed a request's
// ring slot). The functors that launch them (RingCloseFunctor,
// CompressFunctor, SeedTailFunctor, FusedStepFunctor) only hold this struct
// and their team layout, so even the fused step stays far below the 512
// bytes at which CUDA launches through constant memory, and the fused and
// three-launch steps call the same code.

#include <common/detail/KPool_Strided.hpp>
#include <common/detail/KPool_Views.hpp>
#include <pool/detail/KPool_Pool.hpp>

#include <cstdint>

namespace KPool {
namespace Details {

// Pooled rows and, in a step, what each row is. offsets(r) is where
// request r's rows start; offsets(num_requests) is how many there are.
template <class T>
struct PoolSink {
  Strided<T, 2> pooled;
  std::uint64_t rows = 0;                   // pooled.extent(0)
  Strided<std::int32_t, 1> batch_row;       // step only
  Strided<std::int32_t, 1> pool_id;         // step only
  Strided<const std::uint32_t, 1> offsets;  // step and compress

  template <class PooledView>
  void set_pooled(PooledView const& v) {
    pooled = v;
    rows = v.extent(0);
  }

  KOKKOS_INLINE_FUNCTION bool holds(std::uint64_t o) const { return o < rows; }
  KOKKOS_INLINE_FUNCTION T* row(std::uint64_t o) const { return &pooled(o, 0); }
  KOKKOS_INLINE_FUNCTION std::ptrdiff_t channel_stride() const {
    return pooled.stride(1);
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

// StepMode: pools go to the step's compacted output (a request's ring_close
// pool at row offsets(r), its compress pools after it) and are labelled.
// Writer mode: ring_close writes pooled(r) and closed_pool(r), compress
// writes rows offsets(r) + j. RingValue is T, or T const for ring_close,
// which only reads the ring.
template <class ExecutionSpace, class T, class P, bool StepMode,
          class RingValue = T>
struct RaggedWriter {
  using execution_space = ExecutionSpace;
  using value_type = T;
  using member_type =
      typename KokkosExt::TeamPolicy<ExecutionSpace>::member_type;

  RaggedBatch batch;
  Strided<const T, 2> key;
  Strided<const T, 2> gate;
  ApeSource ape;
  Strided<RingValue, 4> tail;
  PoolSink<T> out;
  Strided<std::int32_t, 1> closed_pool;  // ring_close writer only
  // The slots' state (Ring::state), which seed moves; null for the
  // seed_tail writer given the ring's view only.
  std::uint32_t* ring_state = nullptr;
  int head_dim;

  // ring_close: the pending pool whose first `have` members the ring holds.
  // The ring is only read. `hook` routes the pool into a step's cache
  // (common/detail/KPool_CacheWrite.hpp, NoCacheHook without one).
  template <class Hook>
  KOKKOS_INLINE_FUNCTION void close(member_type const& member, int r,
                                    Hook const& hook) const {
    if (r >= batch.num_requests) return;
    Request const q = batch.request(r);
    std::uint64_t const o =
        StepMode ? out.offsets(r) : static_cast<std::uint64_t>(r);
    if (!q.closes() || !out.holds(o)) {
      if constexpr (!StepMode)
        KokkosExt::single_per_thread(member, [&]() { closed_pool(r) = -1; });
      return;
    }
    PoolSource<T> src = rows_source(key, gate, q.row_begin);
    attach_ring(src, tail, q.slot, q.g.have, q.g.cache_length - q.g.have,
                batch.ring_length);
    std::int64_t const pool =
        static_cast<std::int64_t>(q.g.cache_length / batch.kpool);
    thread_vector_pool<ExecutionSpace, P>(member, batch.kpool, head_dim, ape,
                                          src, out.row(o),
                                          out.channel_stride(),
                                          hook.open(member, r, pool));
    if constexpr (StepMode) {
      out.label(member, o, r, pool);
    } else {
      KokkosExt::single_per_thread(
          member, [&]() { closed_pool(r) = static_cast<std::int32_t>(pool); });
    }
  }

  // compress: output row o, one pool made entirely of this call's rows. Its
  // request is found by binary search over the offsets. In a step a
  // request's first row belongs to its ring_close pool when it has one.
  template <class Hook>
  KOKKOS_INLINE_FUNCTION void pool_row(member_type const& member,
                                       std::uint64_t o, Hook const& hook) const {
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
    std::int64_t const pool = static_cast<std::int64_t>(q.g.first) + j;
    thread_vector_pool<ExecutionSpace, P>(member, K, head_dim, ape, src,
                                          out.row(o), out.channel_stride(),
                                          hook.open(member, r, pool));
    if constexpr (StepMode) out.label(member, o, r, pool);
  }

  // seed_tail: stash the call's last R positions, [seed_start, end), at
  // ring index pos % R. Nothing else in the ring is written. Given the
  // ring's state (a step, seed_tail's ring form) it also moves the slot's
  // state (in a step after the close, which the same thread ran).
  KOKKOS_INLINE_FUNCTION void seed(member_type const& member, int r) const {
    if (r >= batch.num_requests) return;
    Request const q = batch.request(r);
    if (!q.valid || !q.slot_ok) return;
    if (ring_state != nullptr && q.g.end > q.g.cache_length)
      KokkosExt::single_per_thread(member, [&]() {
        advance_slot(ring_state + static_cast<std::size_t>(q.slot) * slot_state_words,
                     q.g.cache_length, q.g.end);
      });
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
