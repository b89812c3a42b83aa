#ifndef KPOOL_POOL_DETAIL_TAIL_UPDATE_FUNCTOR_HPP
#define KPOOL_POOL_DETAIL_TAIL_UPDATE_FUNCTOR_HPP

#include <common/detail/KPool_CacheWrite.hpp>
#include <common/detail/KPool_Request.hpp>
#include <common/detail/KPool_Strided.hpp>
#include <common/detail/KPool_Views.hpp>
#include <pool/detail/KPool_Pool.hpp>
#include <pool/detail/KPool_RaggedWriter.hpp>

#include <cstdint>
#include <type_traits>

namespace KPool {
namespace Details {

// The writer's outputs: closed pools at pooled(r, j), their ids at
// closed_pool(r, j), j < max_closed.
template <class T>
struct TailUpdateOutput {
  Strided<T, 3> pooled;                  // [B, M, D]
  Strided<std::int32_t, 2> closed_pool;  // [B, M]
  int max_closed;                        // M
};

// tail_update: next_n decode tokens per row, taken in order. Each real
// token is stashed at ring index pos % R; when it is a pool's last member
// the pool closes from its K ring entries. The first real position may
// rewind below the sequence's length (re-sent drafts): nothing here assumes
// positions grow from call to call. A later token of the same row may
// overwrite an index this pool reads, so the order matters: one team
// thread walks the row's tokens, and its lanes stash and read back the same
// channels (thread_vector_copy and thread_vector_pool share the mapping),
// so each lane sees its own writes in program order.
// Writer mode: closed pools go to out.pooled(r, j) / out.closed_pool(r, j),
// the rest of out.closed_pool(r) is -1. StepMode: to rows offsets(r) + j of
// the step's output.
// With a cache (StepMode only; Cache a CacheTarget) each row has
// cache_slots scratch slots, ceil(next_n / K), as many pools as a row of
// consecutive positions closes; its pools go to the cache from there
// (team_items). A row with more (positions not consecutive, possible only
// with validation off) writes the rest to the output only.
template <class ExecutionSpace, class T, class P, bool StepMode,
          class Cache = NoCache>
struct TailUpdateFunctor {
  using member_type =
      typename KokkosExt::TeamPolicy<ExecutionSpace>::member_type;

  Strided<T, 4> tail;
  Strided<const T, 3> key;   // [B, next_n, D]
  Strided<const T, 3> gate;  // [B, next_n, D]
  ApeSource ape;
  Strided<const std::int32_t, 2> positions;  // [B, next_n]
  Strided<const std::uint32_t, 1> slot_idx;
  std::conditional_t<StepMode, PoolSink<T>, TailUpdateOutput<T>> out;
  int num_requests;
  int next_n;
  int kpool;
  int head_dim;
  int max_slots;
  int ring_length;  // R, the tail's extent 2
  int items_per_team = 1;
  Cache cache{};
  int cache_slots = 1;  // scratch slots a row, with a cache
  // The slots' state (Ring::state), moved by each row's real positions;
  // null for the tail_update writer given the ring's view only.
  std::uint32_t* ring_state = nullptr;

  KOKKOS_INLINE_FUNCTION void operator()(member_type const& member) const {
    int const begin = member.league_rank() * items_per_team;
    team_items<ExecutionSpace, void>(
        member, cache, items_per_team, cache_slots,
        [&](int i, auto const& hook) { update(member, begin + i, hook); });
  }

  template <class Hook>
  KOKKOS_INLINE_FUNCTION void update(member_type const& member, int r,
                                     Hook const& hook) const {
    if (r >= num_requests) return;
    std::uint32_t const slot = slot_idx(r);
    int closed = 0;
    if (slot < static_cast<std::uint32_t>(max_slots)) {
      T* const ring_key = &tail(slot, 0, 0, 0);
      T* const ring_gate = &tail(slot, 1, 0, 0);
      PoolSource<T> src;
      src.row_key = src.row_gate = nullptr;
      src.key_r = src.key_c = src.gate_r = src.gate_c = 0;
      std::int32_t first = -1, last = -1;
      for (int i = 0; i < next_n; ++i) {
        std::int32_t const pos = positions(r, i);
        if (pos < 0) continue;
        if (first < 0) first = pos;
        last = pos;
        int const idx = ring_index(static_cast<std::uint64_t>(pos), ring_length);
        thread_vector_copy<ExecutionSpace, P>(
            member, head_dim, &key(r, i, 0), key.stride(2),
            ring_key + idx * tail.stride(2), tail.stride(3));
        thread_vector_copy<ExecutionSpace, P>(
            member, head_dim, &gate(r, i, 0), gate.stride(2),
            ring_gate + idx * tail.stride(2), tail.stride(3));
        if (!closes_pool(pos, kpool)) continue;
        std::int32_t const pool = pos / kpool;
        attach_ring(src, tail, static_cast<int>(slot), kpool,
                    static_cast<std::uint64_t>(pool) * kpool, ring_length);
        if constexpr (StepMode) {
          std::uint64_t const o = out.offsets(r) + closed;
          if (o < out.offsets(r + 1) && out.holds(o)) {
            if (Hook::enabled && hook.holds(closed))
              thread_vector_pool<ExecutionSpace, P>(
                  member, kpool, head_dim, ape, src, out.row(o),
                  out.channel_stride(), hook.open(member, r, pool, closed));
            else
              thread_vector_pool<ExecutionSpace, P>(member, kpool, head_dim,
                                                    ape, src, out.row(o),
                                                    out.channel_stride());
            out.label(member, o, r, pool);
          }
        } else if (closed < out.max_closed) {
          thread_vector_pool<ExecutionSpace, P>(
              member, kpool, head_dim, ape, src,
              &out.pooled(r, closed, 0), out.pooled.stride(2));
          KokkosExt::single_per_thread(
              member, [&]() { out.closed_pool(r, closed) = pool; });
        }
        ++closed;
      }
      if (ring_state != nullptr && first >= 0)
        KokkosExt::single_per_thread(member, [&]() {
          advance_slot(ring_state + static_cast<std::size_t>(slot) * slot_state_words,
                       static_cast<std::uint64_t>(first), static_cast<std::uint64_t>(last) + 1);
        });
    }
    if constexpr (!StepMode) {
      KokkosExt::single_per_thread(member, [&]() {
        for (int j = closed; j < out.max_closed; ++j) out.closed_pool(r, j) = -1;
      });
    }
  }
};

}  // namespace Details
}  // namespace KPool

#endif
