#ifndef KPOOL_POOL_SEED_TAIL_HPP
#define KPOOL_POOL_SEED_TAIL_HPP

#include <common/KPool_Batch.hpp>
#include <common/KPool_Options.hpp>
#include <common/KPool_Types.hpp>
#include <pool/detail/KPool_Call.hpp>
#include <pool/detail/KPool_WriterFunctors.hpp>

#include <cstdint>
#include <type_traits>

namespace KPool {

namespace Details {

// seed_tail's checks and launch, for its every form; `slots` given (the
// ring form) moves each live row's slot state past the positions it
// stashes.
template <class ExecutionSpace, class TailView, class KeyView, class GateView,
          class RowOffsetsView, class CacheLengthsView, class SlotView>
void seed_tail_impl(ExecutionSpace const& space, TailView const& tail, KeyView const& key,
                    GateView const& gate, RowOffsetsView const& row_offsets,
                    CacheLengthsView const& cache_lengths, SlotView const& slot_idx,
                    int num_requests, Options const& options,
                    RingSlots<typename ExecutionSpace::memory_space> const& slots) {
  using T = typename KeyView::non_const_value_type;
  static_cast<void>(Details::ragged_ring_views_ok<ExecutionSpace, T, /*TailRead=*/false, KeyView,
                                                   GateView, RowOffsetsView, CacheLengthsView,
                                                   SlotView, TailView>());
  using M = typename ExecutionSpace::memory_space;

  Details::Entry const chk("KPool::seed_tail");
  // Only R matters here; it stands in for K in the shared checks.
  int const K = static_cast<int>(tail.extent(2));
  int const D = static_cast<int>(tail.extent(3));
  chk.pool_shape(tail.extent(2), tail.extent(3), "tail", 2);
  // seed_tail reads no ape; a stand-in of the right shape keeps one set of
  // shape checks.
  Kokkos::View<const float**, Kokkos::LayoutRight, M,
               Kokkos::MemoryTraits<Kokkos::Unmanaged>> const no_ape(
      static_cast<float const*>(nullptr), K, D);
  auto call = Details::ragged_call<ExecutionSpace, T>(chk, key, gate, no_ape, row_offsets,
                                                      cache_lengths, num_requests);
  Details::attach_ring(chk, call, slot_idx, tail);
  if (options.validate)
    Details::check_ragged_batch(chk, space, row_offsets, cache_lengths,
                                &slot_idx, num_requests, key.extent(0), K,
                                static_cast<int>(tail.extent(0)));

  Details::View4<T, M> const ring = tail;
  bool const contiguous =
      key.stride(1) == 1 && gate.stride(1) == 1 && ring.stride(3) == 1;
  bool const aligned =
      Details::rows_aligned(call.key.data(), call.key.stride(0), 16) &&
      Details::rows_aligned(call.gate.data(), call.gate.stride(0), 16) &&
      Details::ring_aligned(ring);
  Details::dispatch_path<ExecutionSpace, T>(K, D, contiguous, aligned,
                                            [&](auto path) {
    using P = decltype(path);
    using Writer = Details::RaggedWriter<ExecutionSpace, T, P, false>;
    Details::SeedTailFunctor<Writer> f{Details::ragged_writer<Writer>(call)};
    f.writer.tail = ring;
    f.writer.ring_state = slots.words();
    Details::launch_rows<P>(chk, space, f, num_requests, D, options);
  });
}

}  // namespace Details

/// Stashes the call's last R positions in the ring (docs/writers.md,
/// "seed_tail"). For request r with c = cache_lengths(r) and end = c + n,
/// every position pos in [max(end - R, c), end) has its key and gate rows
/// copied to ring index pos % R of slot slot_idx(r). Nothing else is
/// written, so a chunked prefill leaves the same ring as a single one, and
/// a later call may rewind into any of those positions. Run it after
/// ring_close. Each live row that sends positions moves its slot's state
/// on the device: the slot then holds them, after what it held when they
/// continue it (docs/ring.md, "What a slot holds"). This is also how a
/// sequence starts mid-pool in a fresh or reset slot (a prefix-cache hit
/// at c, c % K != 0): seed_tail the pending pool's earlier members
/// [floor(c/K)*K, c) with cache_lengths = floor(c/K)*K, then step from c.
///
/// Every View is a Kokkos::View in ExecutionSpace::memory_space, of any
/// layout Kokkos can view as LayoutStride (LayoutRight, LayoutLeft,
/// LayoutStride); ranks and element types are checked at compile time.
///
/// @tparam ExecutionSpace a Kokkos execution space.
/// @param space the execution space instance the work is queued on.
/// @param ring the layer's ring (the one the steps use); its entries and
/// its slots' state are written. R and D are the ring's.
/// @param key [total_tokens, D] T.
/// @param gate [total_tokens, D] T.
/// @param batch a ragged batch with each row's ring slot
/// (KPool::ragged_batch(row_offsets, cache_lengths, slot_idx, num_requests)).
/// @param options `validate` (data checks) and `team_size`; `fused` unused.
/// @throws KPool::InvalidArgument (argument "batch") for a decode batch or
/// one without slot_idx; for mismatched shapes (always) or bad index data
/// or slots (with options.validate). Nothing has been written then.
/// @par Launches and synchronization
/// One launch on `space`. With options.validate, first fences `space` and
/// copies row_offsets, cache_lengths and slot_idx (live rows) to the host.
template <class ExecutionSpace, class T, class MemorySpace, class KeyView, class GateView>
void seed_tail(ExecutionSpace const& space, Ring<T, MemorySpace>& ring, KeyView const& key,
               GateView const& gate, Batch<MemorySpace> const& batch,
               Options const& options = Options()) {
  Details::writer_batch_ok("KPool::seed_tail", batch, Batch<MemorySpace>::Kind::ragged, true);
  Details::seed_tail_impl(space, ring.tail(), key, gate, batch.row_offsets,
                          batch.cache_lengths, batch.slot_idx, batch.num_requests, options,
                          Details::ring_slots(ring));
}

}  // namespace KPool

#endif
