#ifndef KPOOL_COMMON_BATCH_HPP
#define KPOOL_COMMON_BATCH_HPP

#include <common/detail/KPool_Validate.hpp>
#include <common/detail/KPool_Views.hpp>

#include <cstddef>
#include <cstdint>

namespace KPool {

/// The one batch argument every call takes (docs/api.md, "One batch
/// argument"): which tokens of which sequences a call carries, in one of
/// two forms.
///
/// - **ragged** (KPool::ragged_batch): request r owns token rows
///   [row_offsets(r), row_offsets(r + 1)), absolute positions
///   cache_lengths(r) + i of its sequence. Prefill chunks, continuations,
///   zero-token rows and decodes mix freely. Key and query Views are
///   [total_tokens, ...].
/// - **decode** (KPool::decode_batch): row r carries up to next_n tokens at
///   positions(r, i) (negative: padding; a row's real positions
///   consecutive). Key Views are [B, next_n, D]; query row r * next_n + i
///   is entry (r, i).
///
/// slot_idx (each row's ring slot) is needed by the calls that touch a
/// ring (the steps, ring_close, seed_tail, tail_update) and may be left
/// empty for the others. Only the first num_requests rows are live; rows
/// at and past it are neither read nor written. A Batch holds View copies
/// (reference counted, no data copied); its Views are LayoutStride, so any
/// layout converts into it.
///
/// @tparam MemorySpace where the Views live: the execution space's memory
/// space of the calls it goes to (checked at compile time).
template <class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
struct Batch {
  /// Where the Views live.
  using memory_space = MemorySpace;
  /// The form of a batch.
  enum class Kind { ragged, decode };

  /// The form: ragged (row_offsets, cache_lengths) or decode (positions).
  Kind kind = Kind::ragged;
  /// ragged: [B + 1] uint32, request r's rows (empty in a decode batch).
  Kokkos::View<const std::uint32_t*, Kokkos::LayoutStride, MemorySpace> row_offsets;
  /// ragged: [B] uint32, the position of request r's first row.
  Kokkos::View<const std::uint32_t*, Kokkos::LayoutStride, MemorySpace> cache_lengths;
  /// decode: [B, next_n] int32, each token's position, negative: padding.
  Kokkos::View<const std::int32_t**, Kokkos::LayoutStride, MemorySpace> positions;
  /// [B] uint32: each row's ring slot (empty where no ring is touched).
  Kokkos::View<const std::uint32_t*, Kokkos::LayoutStride, MemorySpace> slot_idx;
  /// The live rows, 0 <= num_requests <= B.
  int num_requests = 0;

  /// @return whether this is a decode batch.
  bool is_decode() const { return kind == Kind::decode; }
  /// @return B, the batch's rows (live or not).
  std::size_t size() const {
    if (is_decode()) return positions.extent(0);
    return row_offsets.extent(0) == 0 ? 0 : row_offsets.extent(0) - 1;
  }
  /// @return next_n of a decode batch (0 for a ragged one).
  std::size_t next_n() const { return is_decode() ? positions.extent(1) : 0; }
  /// @return the name of the form, as errors print it.
  char const* kind_name() const { return is_decode() ? "decode" : "ragged"; }
};

namespace Details {

// A stand-in execution space for the batch's compile-time checks: the
// memory space the first View lives in.
template <class M>
struct SpaceOf {
  using memory_space = M;
};

}  // namespace Details

/// A ragged batch for the calls that touch no ring (compress,
/// expand_topk, store_pools, the selections).
/// @param row_offsets [B + 1] uint32, any layout: request r's rows.
/// @param cache_lengths [B] uint32: the position of request r's first row.
/// @param num_requests live rows.
/// @return the batch, in row_offsets' memory space.
template <class RowOffsetsView, class CacheLengthsView>
auto ragged_batch(RowOffsetsView const& row_offsets, CacheLengthsView const& cache_lengths,
                  int num_requests) {
  using M = typename Details::view_facts<RowOffsetsView>::memory_space;
  using S = Details::SpaceOf<M>;
  KPOOL_IMPL_CHECK_VIEW(RowOffsetsView, std::uint32_t, 1, S, "row_offsets");
  KPOOL_IMPL_CHECK_VIEW(CacheLengthsView, std::uint32_t, 1, S, "cache_lengths");
  Batch<M> b;
  b.kind = Batch<M>::Kind::ragged;
  // Past a wrong type only the assertion above speaks (no cascade).
  if constexpr (Details::view_ok<RowOffsetsView, std::uint32_t, 1, S>() &&
                Details::view_ok<CacheLengthsView, std::uint32_t, 1, S>()) {
    b.row_offsets = row_offsets;
    b.cache_lengths = cache_lengths;
  }
  b.num_requests = num_requests;
  return b;
}

/// A ragged batch with each row's ring slot, for the steps and the ring
/// writers.
/// @param row_offsets [B + 1] uint32, any layout: request r's rows.
/// @param cache_lengths [B] uint32: the position of request r's first row.
/// @param slot_idx [B] uint32: each row's ring slot.
/// @param num_requests live rows.
/// @return the batch, in row_offsets' memory space.
template <class RowOffsetsView, class CacheLengthsView, class SlotView>
auto ragged_batch(RowOffsetsView const& row_offsets, CacheLengthsView const& cache_lengths,
                  SlotView const& slot_idx, int num_requests) {
  using M = typename Details::view_facts<RowOffsetsView>::memory_space;
  KPOOL_IMPL_CHECK_VIEW(SlotView, std::uint32_t, 1, Details::SpaceOf<M>, "slot_idx");
  auto b = ragged_batch(row_offsets, cache_lengths, num_requests);
  if constexpr (Details::view_ok<SlotView, std::uint32_t, 1, Details::SpaceOf<M>>())
    b.slot_idx = slot_idx;
  return b;
}

/// A decode batch for the selections (no ring slot).
/// @param positions [B, next_n] int32, any layout: each token's position,
/// negative for padding; a row's real positions consecutive.
/// @param num_requests live rows.
/// @return the batch, in positions' memory space.
template <class PositionsView>
auto decode_batch(PositionsView const& positions, int num_requests) {
  using M = typename Details::view_facts<PositionsView>::memory_space;
  KPOOL_IMPL_CHECK_VIEW(PositionsView, std::int32_t, 2, Details::SpaceOf<M>, "positions");
  Batch<M> b;
  b.kind = Batch<M>::Kind::decode;
  if constexpr (Details::view_ok<PositionsView, std::int32_t, 2, Details::SpaceOf<M>>())
    b.positions = positions;
  b.num_requests = num_requests;
  return b;
}

/// A decode batch with each row's ring slot, for the steps and
/// tail_update.
/// @param positions [B, next_n] int32, any layout.
/// @param slot_idx [B] uint32: each row's ring slot.
/// @param num_requests live rows.
/// @return the batch, in positions' memory space.
template <class PositionsView, class SlotView>
auto decode_batch(PositionsView const& positions, SlotView const& slot_idx, int num_requests) {
  using M = typename Details::view_facts<PositionsView>::memory_space;
  KPOOL_IMPL_CHECK_VIEW(SlotView, std::uint32_t, 1, Details::SpaceOf<M>, "slot_idx");
  auto b = decode_batch(positions, num_requests);
  if constexpr (Details::view_ok<SlotView, std::uint32_t, 1, Details::SpaceOf<M>>())
    b.slot_idx = slot_idx;
  return b;
}

namespace Details {

// The batch's form is the one the call takes: named error otherwise.
template <class M>
void batch_kind_is(Checker const& chk, Batch<M> const& batch, typename Batch<M>::Kind want,
                   char const* why) {
  if (batch.kind != want)
    chk.fail("batch", "kind", -1, batch.kind_name(), why);
}

// The calls that touch a ring need each row's slot.
template <class M>
void batch_has_slots(Checker const& chk, Batch<M> const& batch) {
  if (batch.slot_idx.extent(0) == 0 && batch.size() > 0)
    chk.fail("batch", "slot_idx", -1, "empty",
             "is needed by a call that reads or writes the ring: build the batch "
             "with each row's slot (KPool::ragged_batch(row_offsets, cache_lengths, "
             "slot_idx, n) or KPool::decode_batch(positions, slot_idx, n))");
}

// A writer's batch: the form the writer takes and, for a writer of the
// ring, each row's slot; named errors otherwise.
template <class M>
void writer_batch_ok(char const* entry, Batch<M> const& batch, typename Batch<M>::Kind want,
                     bool needs_slots) {
  Checker const chk(entry);
  batch_kind_is(chk, batch, want,
                want == Batch<M>::Kind::ragged ? "is not the ragged batch the call takes"
                                               : "is not the decode batch the call takes");
  if (needs_slots) batch_has_slots(chk, batch);
}

}  // namespace Details

}  // namespace KPool

#endif
