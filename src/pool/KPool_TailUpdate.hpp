#ifndef KPOOL_POOL_TAIL_UPDATE_HPP
#define KPOOL_POOL_TAIL_UPDATE_HPP

#include <common/KPool_Batch.hpp>
#include <common/KPool_Options.hpp>
#include <common/KPool_Types.hpp>
#include <pool/detail/KPool_Call.hpp>
#include <pool/detail/KPool_TailUpdateFunctor.hpp>

#include <cstdint>
#include <type_traits>
#include <vector>

namespace KPool {

namespace Details {

// Shapes of a decode call, checked whatever Options::validate says.
template <class KeyView, class GateView, class ApeView, class PositionsView,
          class TailView>
void check_decode_shapes(Checker const& chk, KeyView const& key,
                         GateView const& gate, ApeView const& ape,
                         PositionsView const& positions, TailView const& tail,
                         int num_requests) {
  std::size_t const K = ape.extent(0), D = ape.extent(1);
  chk.pool_shape(K, D);
  check_tail(chk, tail, static_cast<int>(K), static_cast<int>(D));
  std::size_t const B = positions.extent(0), next_n = positions.extent(1);
  if (B > 0x7FFFFFFE)
    chk.fail("positions", "extent 0", -1, std::to_string(B),
             "is too many requests (B at most 2^31 - 2)");
  if (next_n < 1)
    chk.fail("positions", "extent 1", -1, "0",
             "is not a valid next_n (at least 1 token per row)");
  if (next_n > 0x7FFFFFFF)
    chk.fail("positions", "extent 1", -1, std::to_string(next_n),
             "is too large a next_n");
  chk.extent_is("key", 0, key.extent(0), B, "the batch size B (positions is [B, next_n])");
  chk.extent_is("key", 1, key.extent(1), next_n, "next_n (positions is [B, next_n])");
  chk.extent_is("key", 2, key.extent(2), D, "head_dim");
  chk.extent_is("gate", 0, gate.extent(0), B, "the batch size B (positions is [B, next_n])");
  chk.extent_is("gate", 1, gate.extent(1), next_n, "next_n (positions is [B, next_n])");
  chk.extent_is("gate", 2, gate.extent(2), D, "head_dim");
  chk.num_requests_within(num_requests, B);
}

template <class ExecutionSpace, class T, class M>
bool decode_aligned(View3<const T, M> const& key, View3<const T, M> const& gate,
                    View2<const float, M> const& ape, View4<T, M> const& ring) {
  constexpr int W = packet_width<ExecutionSpace, T>();
  return rows_aligned(key.data(), key.stride(1), 16) && (key.stride(0) * sizeof(T)) % 16 == 0 &&
         rows_aligned(gate.data(), gate.stride(1), 16) && (gate.stride(0) * sizeof(T)) % 16 == 0 &&
         rows_aligned(ape.data(), ape.stride(0), W * sizeof(float)) && ring_aligned(ring);
}

// tail_update's checks and launch, for its every form; `slots` given (the
// ring form) checks each live row's start against its slot's state and
// moves the state past the row's real positions.
template <class ExecutionSpace, class TailView, class KeyView, class GateView,
          class ApeView, class PositionsView, class SlotView, class PooledView,
          class ClosedView>
void tail_update_impl(ExecutionSpace const& space, TailView const& tail,
                      KeyView const& key, GateView const& gate, ApeView const& ape,
                      PositionsView const& positions, SlotView const& slot_idx,
                      int num_requests, PooledView const& pooled,
                      ClosedView const& closed_pool, Options const& options,
                      RingSlots<typename ExecutionSpace::memory_space> const& slots) {
  using T = typename KeyView::non_const_value_type;
  static_cast<void>(Details::decode_views_ok<ExecutionSpace, T, KeyView, GateView,
                                              PositionsView, SlotView>());
  KPOOL_IMPL_CHECK_OUTPUT_VIEW(TailView, T, 4, ExecutionSpace, "tail");
  static_cast<void>(
      Details::pooled_views_ok<ExecutionSpace, T, /*Decode=*/true, ApeView, PooledView,
                               ClosedView>());
  using M = typename ExecutionSpace::memory_space;

  Details::Entry const chk("KPool::tail_update");
  Details::check_decode_shapes(chk, key, gate, ape, positions, tail,
                               num_requests);
  int const K = static_cast<int>(ape.extent(0));
  int const D = static_cast<int>(ape.extent(1));
  std::size_t const B = positions.extent(0);
  std::size_t const next_n = positions.extent(1);
  std::size_t const max_closed = (next_n + K - 1) / K;
  chk.extent_is("slot_idx", 0, slot_idx.extent(0), B,
                "the batch size B (positions is [B, next_n])");
  chk.extent_is("pooled", 0, pooled.extent(0), B, "the batch size B");
  chk.extent_at_least("pooled", 1, pooled.extent(1), max_closed,
                      "pools a row of next_n tokens can close (ceil(next_n / K))");
  chk.extent_is("pooled", 2, pooled.extent(2), D, "head_dim");
  chk.extent_is("closed_pool", 0, closed_pool.extent(0), B, "the batch size B");
  chk.extent_is("closed_pool", 1, closed_pool.extent(1), pooled.extent(1),
                "the extent 1 of pooled");
  if (slots.given() && slots.kpool != K)
    chk.fail("ring", "kpool", -1, std::to_string(slots.kpool),
             "does not match the kpool of ape = " + std::to_string(K));
  int const max_slots = static_cast<int>(tail.extent(0));
  if (options.validate) {
    std::vector<RingRestart> restarts;
    Details::check_decode_batch(chk, space, positions, slot_idx, num_requests,
                                K, max_slots, nullptr, slots.given() ? &restarts : nullptr);
    if (slots.given())
      check_slot_starts(chk, space, slots.state, K, slots.ring_length, restarts, "positions");
  }

  Details::View4<T, M> const ring = tail;
  Details::View3<const T, M> const k = key;
  Details::View3<const T, M> const g = gate;
  Details::View2<const float, M> const a = ape;
  Details::View3<T, M> const out = pooled;
  bool const contiguous = k.stride(2) == 1 && g.stride(2) == 1 &&
                          a.stride(1) == 1 && ring.stride(3) == 1 &&
                          out.stride(2) == 1;
  bool const aligned = Details::decode_aligned<ExecutionSpace, T, M>(k, g, a, ring) &&
                       Details::rows_aligned(out.data(), out.stride(1), 16) &&
                       (out.stride(0) * sizeof(T)) % 16 == 0;
  Details::dispatch_path<ExecutionSpace, T>(K, D, contiguous, aligned,
                                            [&](auto path) {
    using P = decltype(path);
    Details::TailUpdateFunctor<ExecutionSpace, T, P, false> f;
    f.tail = ring;
    f.key = k;
    f.gate = g;
    f.ape = Details::ape_source(a);
    f.positions = positions;
    f.slot_idx = slot_idx;
    f.out.pooled = out;
    f.out.closed_pool = closed_pool;
    f.out.max_closed = static_cast<int>(closed_pool.extent(1));
    f.num_requests = num_requests;
    f.next_n = static_cast<int>(next_n);
    f.kpool = K;
    f.head_dim = D;
    f.max_slots = max_slots;
    f.ring_length = static_cast<int>(tail.extent(2));
    f.ring_state = slots.words();
    Details::launch_rows<P>(chk, space, f, num_requests, D, options);
  });
}

}  // namespace Details

/// The decode writer, next_n tokens a row (docs/writers.md,
/// "tail_update"). Row r's tokens are taken in order: a real token
/// (positions(r, i) >= 0, an absolute position) is stashed at ring index
/// pos % R of slot slot_idx(r), and when pos % K == K - 1, pool p = pos / K
/// closes from ring indices (p * K + m) % R, m < K (its earlier members
/// stashed by earlier calls or this one). Closed pools go to pooled(r, j)
/// and closed_pool(r, j), j = 0, 1, ... in order; the rest of
/// closed_pool(r) is -1. Rows at and past num_requests are not touched. A
/// row's first real position may rewind below the sequence's length
/// (re-sent drafts, within the ring's depth: docs/ring.md, "Rewinds"), never
/// start past what its slot holds (docs/ring.md, "No gaps"): a pool whose
/// last member is re-sent is emitted again. Each row's real positions move
/// its slot's state on the device.
///
/// Every View is a Kokkos::View in ExecutionSpace::memory_space, of any
/// layout Kokkos can view as LayoutStride (LayoutRight, LayoutLeft,
/// LayoutStride); ranks and element types are checked at compile time.
///
/// @tparam ExecutionSpace a Kokkos execution space.
/// @param space the execution space instance the work is queued on.
/// @param ring the layer's ring (the one the steps use), built for ape's
/// K; its entries and its slots' state are written.
/// @param key [B, next_n, D] T (padding entries unread).
/// @param gate [B, next_n, D] T.
/// @param ape [K, D] float; K and D are taken from it.
/// @param batch a decode batch with each row's ring slot
/// (KPool::decode_batch(positions, slot_idx, num_requests)): positions
/// [B, next_n] int32, negative for padding, a row's real positions
/// consecutive.
/// @param pooled [B, M, D] T, written, M >= ceil(next_n / K).
/// @param closed_pool [B, M] int32, written for every live row.
/// @param options `validate` (data checks) and `team_size`; `fused` unused.
/// @throws KPool::InvalidArgument (argument "batch") for a ragged batch or
/// one without slot_idx; for mismatched shapes, next_n = 0, M <
/// ceil(next_n / K) or a ring of another K (always); with
/// options.validate, a slot out of range or shared, real positions not
/// consecutive, or a start its slot cannot serve ("positions", naming the
/// slot, c and what the slot holds). Nothing has been written then.
/// @par Launches and synchronization
/// One launch on `space`. With options.validate, first fences `space` and
/// copies slot_idx and positions (live rows) and the ring's slot state to
/// the host.
template <class ExecutionSpace, class T, class MemorySpace, class KeyView, class GateView,
          class ApeView, class PooledView, class ClosedView>
void tail_update(ExecutionSpace const& space, Ring<T, MemorySpace>& ring, KeyView const& key,
                 GateView const& gate, ApeView const& ape, Batch<MemorySpace> const& batch,
                 PooledView const& pooled, ClosedView const& closed_pool,
                 Options const& options = Options()) {
  Details::writer_batch_ok("KPool::tail_update", batch, Batch<MemorySpace>::Kind::decode, true);
  Details::tail_update_impl(space, ring.tail(), key, gate, ape, batch.positions, batch.slot_idx,
                            batch.num_requests, pooled, closed_pool, options,
                            Details::ring_slots(ring));
}

}  // namespace KPool

#endif
