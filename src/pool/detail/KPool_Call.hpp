#ifndef KPOOL_DETAILS_CALL_HPP
#define KPOOL_DETAILS_CALL_HPP

// What every ragged entry point does between its signature and its launch:
// the normalized views, the shape checks (free, always on), and the path
// choice from strides and alignment.

#include <common/KPool_Types.hpp>
#include <common/detail/KPool_Launch.hpp>
#include <common/detail/KPool_Validate.hpp>
#include <common/detail/KPool_Views.hpp>
#include <pool/detail/KPool_OffsetsFunctor.hpp>
#include <pool/detail/KPool_RaggedWriter.hpp>

#include <cstdint>
#include <string>

namespace KPool {
namespace Details {

// The views of a ragged batch, checked at compile time: the one list the
// writers and the steps share. Prefill-shaped (compress, ring_close,
// seed_tail, step): key and gate [rows, D] of T, row_offsets [B + 1] and
// cache_lengths [B] of uint32. Decode-shaped (tail_update, decode_step):
// key and gate [B, next_n, D] of T, positions [B, next_n] of int32,
// slot_idx [B] of uint32. Each returns whether every check holds.
template <class ExecutionSpace, class T, class KeyView, class GateView,
          class RowOffsetsView, class CacheLengthsView>
constexpr bool ragged_views_ok() {
  static_assert(is_storage_type<T>::value,
                "KPool: key must hold float, double, KPool::bfloat16 or "
                "KPool::float16");
  return KPOOL_IMPL_VIEW_OK(KeyView, T, 2, ExecutionSpace, "key") &&
         KPOOL_IMPL_VIEW_OK(GateView, T, 2, ExecutionSpace, "gate") &&
         KPOOL_IMPL_VIEW_OK(RowOffsetsView, std::uint32_t, 1, ExecutionSpace,
                            "row_offsets") &&
         KPOOL_IMPL_VIEW_OK(CacheLengthsView, std::uint32_t, 1, ExecutionSpace,
                            "cache_lengths");
}

template <class ExecutionSpace, class T, class KeyView, class GateView,
          class PositionsView, class SlotView>
constexpr bool decode_views_ok() {
  static_assert(is_storage_type<T>::value,
                "KPool: key must hold float, double, KPool::bfloat16 or "
                "KPool::float16");
  return KPOOL_IMPL_VIEW_OK(KeyView, T, 3, ExecutionSpace, "key") &&
         KPOOL_IMPL_VIEW_OK(GateView, T, 3, ExecutionSpace, "gate") &&
         KPOOL_IMPL_VIEW_OK(PositionsView, std::int32_t, 2, ExecutionSpace,
                            "positions") &&
         KPOOL_IMPL_VIEW_OK(SlotView, std::uint32_t, 1, ExecutionSpace,
                            "slot_idx");
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
template <class ExecutionSpace, class T, class KeyView, class GateView,
          class ApeView, class Offsets, class Lengths>
RaggedCall<ExecutionSpace, T> ragged_call(Checker const& chk,
                                          KeyView const& key,
                                          GateView const& gate,
                                          ApeView const& ape,
                                          Offsets const& row_offsets,
                                          Lengths const& cache_lengths,
                                          int num_requests, int kpool,
                                          int head_dim) {
  chk.pool_shape(static_cast<std::size_t>(kpool),
                 static_cast<std::size_t>(head_dim));
  chk.extent_is("ape", 0, ape.extent(0), kpool, "kpool");
  chk.extent_is("ape", 1, ape.extent(1), head_dim, "head_dim");
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

// The ring a ragged writer uses: its slots and its length R (a tail
// already passed check_tail).
template <class ExecutionSpace, class T, class Slots, class Tail>
void attach_slots(Checker const& chk, RaggedCall<ExecutionSpace, T>& call,
                  Slots const& slot_idx, Tail const& tail) {
  chk.extent_is("slot_idx", 0, slot_idx.extent(0),
                static_cast<std::size_t>(call.batch_size),
                "the batch size B (row_offsets has B + 1 entries)");
  call.batch.slot_idx = slot_idx;
  call.batch.max_slots = static_cast<int>(tail.extent(0));
  call.batch.ring_length = static_cast<int>(tail.extent(2));
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

}  // namespace Details
}  // namespace KPool

#endif
