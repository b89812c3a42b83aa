#ifndef KPOOL_POOL_RING_CLOSE_HPP
#define KPOOL_POOL_RING_CLOSE_HPP

#include <common/KPool_Batch.hpp>
#include <common/KPool_Options.hpp>
#include <common/KPool_Types.hpp>
#include <pool/detail/KPool_Call.hpp>
#include <pool/detail/KPool_WriterFunctors.hpp>

#include <cstdint>
#include <type_traits>

namespace KPool {

namespace Details {

// ring_close's checks and launch, for its every form; `slots` given (the
// ring form) checks each live row's start against its slot's state.
template <class ExecutionSpace, class TailView, class KeyView, class GateView,
          class ApeView, class RowOffsetsView, class CacheLengthsView,
          class SlotView, class PooledView, class ClosedView>
void ring_close_impl(ExecutionSpace const& space, TailView const& tail,
                     KeyView const& key, GateView const& gate, ApeView const& ape,
                     RowOffsetsView const& row_offsets,
                     CacheLengthsView const& cache_lengths,
                     SlotView const& slot_idx, int num_requests,
                     PooledView const& pooled, ClosedView const& closed_pool,
                     Options const& options,
                     RingSlots<typename ExecutionSpace::memory_space> const& slots) {
  using T = typename KeyView::non_const_value_type;
  static_cast<void>(Details::ragged_ring_views_ok<ExecutionSpace, T, /*TailRead=*/true, KeyView,
                                                   GateView, RowOffsetsView, CacheLengthsView,
                                                   SlotView, TailView>());
  static_cast<void>(
      Details::pooled_views_ok<ExecutionSpace, T, /*Decode=*/false, ApeView, PooledView,
                               ClosedView>());
  using M = typename ExecutionSpace::memory_space;

  Details::Entry const chk("KPool::ring_close");
  auto call = Details::ragged_call<ExecutionSpace, T>(chk, key, gate, ape, row_offsets,
                                                      cache_lengths, num_requests);
  int const K = call.batch.kpool, D = call.head_dim;
  if (slots.given() && slots.kpool != K)
    chk.fail("ring", "kpool", -1, std::to_string(slots.kpool),
             "does not match the kpool of ape = " + std::to_string(K));
  Details::attach_ring(chk, call, slot_idx, tail);
  chk.extent_is("pooled", 0, pooled.extent(0), call.batch_size, "B");
  chk.extent_is("pooled", 1, pooled.extent(1), D, "head_dim");
  chk.extent_is("closed_pool", 0, closed_pool.extent(0), call.batch_size, "B");
  if (options.validate) {
    HostBatch const hb = Details::check_ragged_batch(
        chk, space, row_offsets, cache_lengths, &slot_idx, num_requests, key.extent(0), K,
        static_cast<int>(tail.extent(0)));
    if (slots.given())
      check_slot_starts(chk, space, slots.state, K, slots.ring_length,
                        ragged_restarts(hb), "cache_lengths");
  }

  Details::View4<const T, M> const ring = tail;
  Details::View2<T, M> const out = pooled;
  bool const contiguous =
      call.contiguous() && out.stride(1) == 1 && ring.stride(3) == 1;
  bool const aligned = call.aligned() &&
                       Details::rows_aligned(out.data(), out.stride(0), 16) &&
                       Details::ring_aligned(ring);
  Details::dispatch_path<ExecutionSpace, T>(K, D, contiguous, aligned,
                                            [&](auto path) {
    using P = decltype(path);
    using Writer = Details::RaggedWriter<ExecutionSpace, T, P, false, T const>;
    Details::RingCloseFunctor<Writer> f{Details::ragged_writer<Writer>(call)};
    f.writer.tail = ring;
    f.writer.out.set_pooled(out);
    f.writer.closed_pool = closed_pool;
    Details::launch_rows<P>(chk, space, f, num_requests, D, options);
  });
}

}  // namespace Details

/// The one pending pool the ring already partly holds (docs/writers.md,
/// "ring_close"). For request r with c = cache_lengths(r), have = c % K and
/// n rows: when have > 0 and have + n >= K, pool p = c / K closes from its
/// members m < have at ring indices (p * K + m) % R of slot slot_idx(r) and
/// the request's rows [0, K - have); pooled(r) is its value and
/// closed_pool(r) = p. Otherwise closed_pool(r) = -1 and pooled(r) is not
/// written. The ring is only read (run it before seed_tail, which
/// overwrites those entries). Rows at and past num_requests are not
/// touched. c may be below the sequence's length (a rewind, within the
/// ring's depth: docs/ring.md, "Rewinds"), never past what the slot holds
/// (docs/ring.md, "No gaps"): with options.validate each live row's start
/// is checked against its slot's state.
///
/// Every View is a Kokkos::View in ExecutionSpace::memory_space, of any
/// layout Kokkos can view as LayoutStride (LayoutRight, LayoutLeft,
/// LayoutStride); ranks and element types are checked at compile time.
///
/// @tparam ExecutionSpace a Kokkos execution space.
/// @param space the execution space instance the work is queued on.
/// @param ring the layer's ring (the one the steps use), built for ape's
/// K; only read.
/// @param key [total_tokens, D] T.
/// @param gate [total_tokens, D] T.
/// @param ape [K, D] float; K and D are taken from it.
/// @param batch a ragged batch with each row's ring slot
/// (KPool::ragged_batch(row_offsets, cache_lengths, slot_idx, num_requests)).
/// @param pooled [B, D] T, written where a pool closes.
/// @param closed_pool [B] int32, written for every live row: the closed
/// pool's id, or -1.
/// @param options `validate` (data checks) and `team_size`; `fused` unused.
/// @throws KPool::InvalidArgument (argument "batch") for a decode batch or
/// one without slot_idx; for mismatched shapes or a ring of another K
/// (always); with options.validate, bad index data or slots, or a start
/// its slot cannot serve ("cache_lengths", naming the slot, c and what the
/// slot holds). Nothing has been written then.
/// @par Launches and synchronization
/// One launch on `space`. With options.validate, first fences `space` and
/// copies row_offsets, cache_lengths and slot_idx (live rows) and the
/// ring's slot state to the host.
template <class ExecutionSpace, class T, class MemorySpace, class KeyView, class GateView,
          class ApeView, class PooledView, class ClosedView>
void ring_close(ExecutionSpace const& space, Ring<T, MemorySpace> const& ring,
                KeyView const& key, GateView const& gate, ApeView const& ape,
                Batch<MemorySpace> const& batch, PooledView const& pooled,
                ClosedView const& closed_pool, Options const& options = Options()) {
  Details::writer_batch_ok("KPool::ring_close", batch, Batch<MemorySpace>::Kind::ragged, true);
  Details::ring_close_impl(space, ring.tail(), key, gate, ape, batch.row_offsets,
                           batch.cache_lengths, batch.slot_idx, batch.num_requests, pooled,
                           closed_pool, options, Details::ring_slots(ring));
}

}  // namespace KPool

#endif
