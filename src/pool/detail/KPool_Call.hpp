#ifndef KPOOL_POOL_DETAIL_CALL_HPP
#define KPOOL_POOL_DETAIL_CALL_HPP

// What every ragged entry point does between its signature and its launch:
// the normalized views, the shape checks (free, always on), and the path
// choice from strides and alignment.

#include <common/KPool_Options.hpp>
#include <common/KPool_Types.hpp>
#include <common/detail/KPool_Launch.hpp>
#include <common/detail/KPool_Validate.hpp>
#include <common/detail/KPool_Views.hpp>
#include <pool/KPool_Ring.hpp>
#include <pool/detail/KPool_OffsetsFunctor.hpp>
#include <pool/detail/KPool_RaggedWriter.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace KPool {
namespace Details {

// The views of a call, checked at compile time: the one list the writers
// and the steps share. key and gate are [rows, D] (Rank 2) or [B, next_n,
// D] (Rank 3) of T; ragged_views_ok adds row_offsets [B + 1] and
// cache_lengths [B] of uint32, decode_views_ok positions [B, next_n] of
// int32 and slot_idx [B] of uint32. Each returns whether every check holds.
template <class ExecutionSpace, class T, int Rank, class KeyView, class GateView>
constexpr bool key_gate_ok() {
  static_assert(is_storage_type<T>::value,
                "KPool: key must hold float, double, KPool::bfloat16 or "
                "KPool::float16");
  return KPOOL_IMPL_VIEW_OK(KeyView, T, Rank, ExecutionSpace, "key") &&
         KPOOL_IMPL_VIEW_OK(GateView, T, Rank, ExecutionSpace, "gate");
}

template <class ExecutionSpace, class T, class KeyView, class GateView, class IndexView,
          class RowView, bool Decode = false>
constexpr bool ragged_views_ok() {
  if constexpr (Decode)
    return key_gate_ok<ExecutionSpace, T, 3, KeyView, GateView>() &&
           KPOOL_IMPL_VIEW_OK(IndexView, std::int32_t, 2, ExecutionSpace, "positions") &&
           KPOOL_IMPL_VIEW_OK(RowView, std::uint32_t, 1, ExecutionSpace, "slot_idx");
  else
    return key_gate_ok<ExecutionSpace, T, 2, KeyView, GateView>() &&
           KPOOL_IMPL_VIEW_OK(IndexView, std::uint32_t, 1, ExecutionSpace, "row_offsets") &&
           KPOOL_IMPL_VIEW_OK(RowView, std::uint32_t, 1, ExecutionSpace, "cache_lengths");
}
template <class ExecutionSpace, class T, class KeyView, class GateView, class PositionsView,
          class SlotView>
constexpr bool decode_views_ok() {
  return ragged_views_ok<ExecutionSpace, T, KeyView, GateView, PositionsView, SlotView, true>();
}

// The views of a ring writer with a ragged batch (seed_tail, ring_close):
// those of ragged_views_ok, slot_idx [B] of uint32 and the tail
// [max_slots, 2, R, D] of T, written unless TailRead (ring_close only
// reads the ring).
template <class ExecutionSpace, class T, bool TailRead, class KeyView, class GateView,
          class RowOffsetsView, class CacheLengthsView, class SlotView, class TailView>
constexpr bool ragged_ring_views_ok() {
  bool const views_ok =
      ragged_views_ok<ExecutionSpace, T, KeyView, GateView, RowOffsetsView, CacheLengthsView>() &&
      KPOOL_IMPL_VIEW_OK(SlotView, std::uint32_t, 1, ExecutionSpace, "slot_idx");
  if constexpr (TailRead)
    return views_ok && KPOOL_IMPL_VIEW_OK(TailView, T, 4, ExecutionSpace, "tail");
  else
    return views_ok && KPOOL_IMPL_OUTPUT_VIEW_OK(TailView, T, 4, ExecutionSpace, "tail");
}

// The views the ring writers (ring_close, tail_update) take besides the
// batch's and the ring's: ape [K, D] of float, then pooled and
// closed_pool, written: [B, D] of T and [B] of int32 for a ragged batch,
// [B, max_closed, D] and [B, max_closed] for a decode batch (Decode).
template <class ExecutionSpace, class T, bool Decode, class ApeView, class PooledView,
          class ClosedView>
constexpr bool pooled_views_ok() {
  bool const ape_ok = KPOOL_IMPL_VIEW_OK(ApeView, float, 2, ExecutionSpace, "ape");
  if constexpr (Decode)
    return ape_ok && KPOOL_IMPL_OUTPUT_VIEW_OK(PooledView, T, 3, ExecutionSpace, "pooled") &&
           KPOOL_IMPL_OUTPUT_VIEW_OK(ClosedView, std::int32_t, 2, ExecutionSpace,
                                     "closed_pool");
  else
    return ape_ok && KPOOL_IMPL_OUTPUT_VIEW_OK(PooledView, T, 2, ExecutionSpace, "pooled") &&
           KPOOL_IMPL_OUTPUT_VIEW_OK(ClosedView, std::int32_t, 1, ExecutionSpace,
                                     "closed_pool");
}

template <class ExecutionSpace, class T>
struct RaggedCall {
  using memory_space = typename ExecutionSpace::memory_space;
  RaggedBatch batch;
  View2<const T, memory_space> key;
  View2<const T, memory_space> gate;
  View2<const float, memory_space> ape;
  int batch_size;  // B
  int head_dim;    // D

  bool contiguous() const {
    return key.stride(1) == 1 && gate.stride(1) == 1 && ape.stride(1) == 1;
  }
  // Every row start 16-byte aligned, ape rows aligned for W floats.
  bool aligned() const {
    constexpr int W = packet_width<ExecutionSpace, T>();
    return rows_aligned(key.data(), key.stride(0), 16) &&
           rows_aligned(gate.data(), gate.stride(0), 16) &&
           rows_aligned(ape.data(), ape.stride(0), W * sizeof(float));
  }
};

// Shapes of a ragged call, checked whatever Options::validate says: they
// cost nothing, and with them the kernels never index past an index array.
// K and D are ape's extents.
template <class ExecutionSpace, class T, class KeyView, class GateView,
          class ApeView, class Offsets, class Lengths>
RaggedCall<ExecutionSpace, T> ragged_call(Checker const& chk, KeyView const& key,
                                          GateView const& gate, ApeView const& ape,
                                          Offsets const& row_offsets,
                                          Lengths const& cache_lengths, int num_requests) {
  chk.pool_shape(ape.extent(0), ape.extent(1));
  int const kpool = static_cast<int>(ape.extent(0));
  int const head_dim = static_cast<int>(ape.extent(1));
  chk.extent_is("key", 1, key.extent(1), head_dim, "head_dim");
  chk.extent_is("gate", 0, gate.extent(0), key.extent(0), "the rows of key");
  chk.extent_is("gate", 1, gate.extent(1), head_dim, "head_dim");
  std::size_t const B = chk.batch_shape(row_offsets, cache_lengths, num_requests);

  RaggedCall<ExecutionSpace, T> call;
  call.key = key;
  call.gate = gate;
  call.ape = ape;
  call.batch.row_offsets = row_offsets;
  call.batch.cache_lengths = cache_lengths;
  call.batch.num_requests = num_requests;
  call.batch.kpool = kpool;
  call.batch.total_rows = key.extent(0);
  call.batch.max_slots = 0;
  call.batch.ring_length = kpool;
  call.batch_size = static_cast<int>(B);
  call.head_dim = head_dim;
  return call;
}

// The ring [max_slots, 2, R, D]: R, the ring length, a multiple of kpool
// and at least kpool (docs/ring.md).
template <class Tail>
void check_tail(Checker const& chk, Tail const& tail, int kpool, int head_dim) {
  chk.extent_is("tail", 1, tail.extent(1), 2, "2 (keys and gate scores)");
  std::size_t const R = tail.extent(2), K = static_cast<std::size_t>(kpool);
  if (R < K)
    chk.fail("tail", "extent 2", -1, std::to_string(R),
             "is not a valid ring length (less than kpool = " +
                 std::to_string(K) + ")");
  if (R % K != 0)
    chk.fail("tail", "extent 2", -1, std::to_string(R),
             "is not a valid ring length (not a multiple of kpool = " +
                 std::to_string(K) + ")");
  if (R > 0x7FFFFFFF)
    chk.fail("tail", "extent 2", -1, std::to_string(R),
             "is too long a ring");
  chk.extent_is("tail", 3, tail.extent(3), head_dim, "head_dim");
  if (tail.extent(0) > 0x7FFFFFFF)
    chk.fail("tail", "extent 0", -1, std::to_string(tail.extent(0)),
             "is too many slots");
}

// The ring a ragged writer or step uses: its tail's shape (check_tail),
// its slots and its length R.
template <class ExecutionSpace, class T, class Slots, class Tail>
void attach_ring(Checker const& chk, RaggedCall<ExecutionSpace, T>& call,
                 Slots const& slot_idx, Tail const& tail) {
  check_tail(chk, tail, call.batch.kpool, call.head_dim);
  chk.extent_is("slot_idx", 0, slot_idx.extent(0),
                static_cast<std::size_t>(call.batch_size),
                "the batch size B (row_offsets has B + 1 entries)");
  call.batch.slot_idx = slot_idx;
  call.batch.max_slots = static_cast<int>(tail.extent(0));
  call.batch.ring_length = static_cast<int>(tail.extent(2));
}

// The slots' state a writer moves and checks when it is given the ring
// itself (Ring::state(), its K and R); empty for a writer given the
// ring's view only, which neither checks nor moves it.
template <class M>
struct RingSlots {
  Kokkos::View<std::uint32_t* [slot_state_words], Kokkos::LayoutRight, M> state;
  int kpool = 0;
  int ring_length = 0;

  bool given() const { return state.data() != nullptr; }
  std::uint32_t* words() const { return state.data(); }
};

// The ring a step or a writer's ring form is given: its tail's shape
// (check_tail) and the kpool it was built for, which must be ape's.
template <class T, class M>
void check_ring(Checker const& chk, Ring<T, M> const& ring, int kpool, int head_dim) {
  check_tail(chk, ring.tail(), kpool, head_dim);
  if (ring.kpool() != kpool)
    chk.fail("ring", "kpool", -1, std::to_string(ring.kpool()),
             "does not match the kpool of ape = " + std::to_string(kpool));
}

template <class T, class M>
RingSlots<M> ring_slots(Ring<T, M> const& ring) {
  RingSlots<M> s;
  s.state = ring.state();
  s.kpool = ring.kpool();
  s.ring_length = ring.ring_length();
  return s;
}

// With validation: each live row that sends a position starts its slot's
// sequence where the slot can serve it (docs/ring.md, "No gaps" and "The
// depth rule"; slot_start), against the slots' state as the launches
// queued before left it: one copy of the ring's state (12 bytes a slot)
// on `space`, within the call's validation. `argument` is what carries c:
// cache_lengths (ragged) or positions (decode).
template <class ExecutionSpace, class State>
void check_slot_starts(Checker const& chk, ExecutionSpace const& space, State const& state,
                       int kpool, int ring_length, std::vector<RingRestart> const& restarts,
                       char const* argument) {
  bool any = false;
  for (RingRestart const& q : restarts) any = any || q.end > q.start;
  if (!any) return;
  auto const h = host_readable(space, state);
  std::uint64_t const K = static_cast<std::uint64_t>(kpool);
  for (std::size_t r = 0; r < restarts.size(); ++r) {
    RingRestart const& q = restarts[r];
    if (q.end <= q.start) continue;  // sends nothing
    SlotState s;
    s.start = h(q.slot, 0);
    s.length = h(q.slot, 1);
    s.high = h(q.slot, 2);
    std::uint64_t const c = q.start, base = c / K * K;
    std::string const slot = "slot " + std::to_string(q.slot);
    std::string const held = s.high == 0 ? slot + " holds nothing (fresh or reset)"
                                         : slot + " holds positions [" +
                                               std::to_string(s.start) + ", " +
                                               std::to_string(s.length) + ")";
    std::string const members =
        "the pending pool's earlier members [" + std::to_string(base) + ", " +
        std::to_string(c) + ")";
    std::string problem;
    switch (slot_start(s, c, kpool, ring_length)) {
      case SlotStart::ok: break;
      case SlotStart::fresh_mid_pool:
        problem = "starts a sequence mid-pool, but " + held + ": " + members +
                  " are not in the ring (start at a pool boundary, or seed_tail them "
                  "into the slot first; docs/ring.md, \"No gaps\")";
        break;
      case SlotStart::gap:
        problem = "starts past what " + slot + " holds: positions [" +
                  std::to_string(s.start) + ", " + std::to_string(s.length) +
                  "), c > L = " + std::to_string(s.length) + " is a gap (" +
                  (c % K != 0 ? members + " would come from stale ring entries; "
                              : std::string()) +
                  "a new sequence takes a reset slot, Ring::reset; docs/ring.md, "
                  "\"No gaps\")";
        break;
      case SlotStart::before_start:
        problem = "needs " + members + ", but " + held + " (docs/ring.md, \"No gaps\")";
        break;
      case SlotStart::too_deep:
        problem = "restarts the sequence in " + slot +
                  " deeper than the ring holds: H - floor(c/K)*K = " +
                  std::to_string(s.high) + " - " + std::to_string(base) + " = " +
                  std::to_string(rewind_depth(s.high, c, kpool)) + " > R = " +
                  std::to_string(ring_length) +
                  " (H: one past the highest position the slot was sent; "
                  "docs/ring.md, \"The depth rule\")";
        break;
    }
    if (!problem.empty())
      chk.fail_row(argument, static_cast<std::int64_t>(r), static_cast<std::int64_t>(c),
                   problem);
  }
}

// A ragged writer reading this call's batch, key, gate and ape; the caller
// adds the ring and the outputs it uses.
template <class Writer, class ExecutionSpace, class T>
Writer ragged_writer(RaggedCall<ExecutionSpace, T> const& call) {
  Writer w;
  w.batch = call.batch;
  w.key = call.key;
  w.gate = call.gate;
  w.ape = ape_source(call.ape);
  w.head_dim = call.head_dim;
  return w;
}

// The device scan that lays out a ragged call's output rows.
template <bool StepMode, class ExecutionSpace, class T, class OffsetsView>
void launch_ragged_offsets(ExecutionSpace const& space, std::string const& label,
                           RaggedCall<ExecutionSpace, T> const& call,
                           OffsetsView const& offsets) {
  launch_offsets_scan(
      space, label,
      RaggedPoolCount<StepMode>{call.batch},
      offsets, call.batch_size);
}

// A writer's one launch: an item a live row (num_requests), on the
// caller's instance, named as its entry point.
template <class P, class ExecutionSpace, class F>
void launch_rows(Checker const& chk, ExecutionSpace const& space, F const& f, int num_requests,
                 int head_dim, Options const& options) {
  LaunchShape const shape =
      items_shape(chk, "num_requests", space, f, static_cast<std::uint64_t>(num_requests),
                  head_dim, P::width, options.team_size);
  launch_items(space, chk.entry_point(), shape, f);
}

}  // namespace Details
}  // namespace KPool

#endif
