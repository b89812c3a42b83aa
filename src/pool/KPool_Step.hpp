#ifndef KPOOL_POOL_STEP_HPP
#define KPOOL_POOL_STEP_HPP

#include <cache/KPool_PagedCache.hpp>
#include <cache/KPool_PoolCache.hpp>
#include <common/KPool_Batch.hpp>
#include <common/KPool_Float8.hpp>
#include <common/KPool_Options.hpp>
#include <common/KPool_Types.hpp>
#include <pool/KPool_Ring.hpp>
#include <pool/KPool_StepOutput.hpp>
#include <pool/KPool_TailUpdate.hpp>
#include <pool/detail/KPool_StepCall.hpp>

#include <cstdint>

namespace KPool {

/// The general serving step (docs/writers.md, "The steps"): per request
/// ring_close, then compress, then seed_tail, for a ragged batch mixing
/// fresh prefills, chunk continuations, zero-token rows and single-token
/// decodes. Every pool whose last member arrived in this call lands in
/// `out`, compacted (see StepOutput), and the ring keeps what later calls
/// need. Pools do not depend on how a sequence was split across calls.
/// cache_lengths(r) may be below the sequence's length: the row re-sends
/// rejected drafts (docs/ring.md, "Rewinds"); re-sent positions replace
/// their ring entries and a pool whose last member is re-sent is emitted
/// again. The ring must be long enough for the rewind (docs/ring.md, "The
/// depth rule"): with options.validate a deeper rewind is refused.
///
/// Request r (r < num_requests) owns token rows [row_offsets(r),
/// row_offsets(r + 1)) of key and gate, which are absolute positions
/// cache_lengths(r) + i of the sequence in ring slot slot_idx(r). Rows at
/// and past num_requests are neither read nor written.
///
/// Every View is a Kokkos::View in ExecutionSpace::memory_space, of any
/// layout Kokkos can view as LayoutStride (LayoutRight, LayoutLeft,
/// LayoutStride); ranks and element types are checked at compile time.
/// Unit channel stride (and 16-byte aligned rows on GPUs) selects the fast
/// kernels.
///
/// @tparam ExecutionSpace a Kokkos execution space; MemorySpace must be its
/// memory space.
/// @tparam T the storage type (float, double, bfloat16, float16).
/// @param space the execution space instance all work is queued on.
/// @param ring the layer's ring, [max_slots, 2, R, D]; read and written.
/// @param key [total_tokens, D] T: the new tokens' keys.
/// @param gate [total_tokens, D] T: their gate scores (the two halves of
/// one [total_tokens, 2D] buffer work).
/// @param ape [K, D] float: the position embedding within a pool; K and D
/// are taken from it.
/// @param row_offsets [B + 1] uint32: starts at 0, never decreases.
/// @param cache_lengths [B] uint32: tokens of each sequence before this call.
/// @param slot_idx [B] uint32: each row's ring slot, below max_slots,
/// distinct among live rows.
/// @param num_requests live rows, 0 <= num_requests <= B.
/// @param out the compacted pools, written: max_batch >= B and capacity >=
/// floor(total_tokens / K) + num_requests.
/// @param options `validate` (data checks), `team_size`, and `fused`: one
/// launch for the three writers (true) or three (false), same bits.
/// @throws KPool::InvalidArgument for mismatched shapes (always) or bad
/// index data (with options.validate): row_offsets not starting at 0,
/// decreasing or past the key rows, a sequence passing 2^31 - 1 positions,
/// a slot out of range or shared, a rewind deeper than the ring holds.
/// Nothing has been written then.
/// @par Launches and synchronization
/// Two launches on `space` (the offset scan, then the fused writers), four
/// with fused = false (the scan, ring_close, compress, seed_tail). With
/// options.validate, first fences `space` and copies row_offsets,
/// cache_lengths and slot_idx (live rows) to the host; otherwise nothing
/// waits for the host, and the step can be captured in a CUDA graph.
template <class ExecutionSpace, class T, class MemorySpace, class KeyView,
          class GateView, class ApeView, class RowOffsetsView,
          class CacheLengthsView, class SlotView>
void step(ExecutionSpace const& space, Ring<T, MemorySpace>& ring,
          KeyView const& key, GateView const& gate, ApeView const& ape,
          RowOffsetsView const& row_offsets,
          CacheLengthsView const& cache_lengths, SlotView const& slot_idx,
          int num_requests, StepOutput<T, MemorySpace>& out,
          Options const& options = Options()) {
  if constexpr (Details::check_step_views<ExecutionSpace, MemorySpace, T, KeyView, GateView,
                                          ApeView, RowOffsetsView,
                                          CacheLengthsView, SlotView>())
    Details::step_impl(space, ring, key, gate, ape, row_offsets, cache_lengths,
                       slot_idx, num_requests, out, Details::NoCacheArg(),
                       options);
}

/// KPool::step writing every pool it emits into a pool cache as well
/// (docs/indexer.md, "The pool cache"): cached = Q(R(x)) of pool p of
/// batch row r goes to block block_table(r, p / block_pools), entry p %
/// block_pools. A pool re-emitted after a rewind overwrites its entry.
/// On a GPU (and with device shapes) in the same launches: each pool goes
/// from the registers that made it into team scratch, is rotated and
/// quantized there. On a host, by whichever path measured cheaper
/// (src/common/detail/KPool_CachePath.hpp; docs/performance.md, "Writing
/// the pool cache"): in the step, or one more launch on `space` over the
/// output's rows, store_pools' (the count read on the device). Same bytes
/// either way. Everything else is KPool::step's.
///
/// @tparam C the cache element type: T (a native cache) or
/// KPool::float8_e4m3 (T not f64).
/// @param cache the layer's cache, head_dim D; written.
/// @param block_table [>= num_requests, max_blocks] int32, any layout: row
/// r's blocks (the rule score_select and select_tokens take it by).
/// @throws KPool::InvalidArgument as KPool::step, and for a cache without
/// storage, of another head_dim, built for another K than the ring's, fp8
/// for f64 pools, or a block table with fewer rows than num_requests
/// (always); with options.validate, a pool this call
/// emits whose block table column is missing, negative (unassigned) or
/// not below num_blocks. Nothing has been written then (the ring, the
/// output and the cache are unchanged). With validation off such a pool
/// still reaches `out` and is left out of the cache.
/// @par Launches and synchronization
/// As KPool::step, plus the cache's launch where a host writes it in a
/// second pass; nothing more waits for the host. With options.validate the
/// block table's live rows are copied to the host too.
template <class ExecutionSpace, class T, class MemorySpace, class KeyView,
          class GateView, class ApeView, class RowOffsetsView,
          class CacheLengthsView, class SlotView, class C,
          class BlockTableView>
void step(ExecutionSpace const& space, Ring<T, MemorySpace>& ring,
          KeyView const& key, GateView const& gate, ApeView const& ape,
          RowOffsetsView const& row_offsets,
          CacheLengthsView const& cache_lengths, SlotView const& slot_idx,
          int num_requests, StepOutput<T, MemorySpace>& out,
          PoolCache<C, MemorySpace>& cache, BlockTableView const& block_table,
          Options const& options = Options()) {
  if constexpr (Details::check_step_views<ExecutionSpace, MemorySpace, T, KeyView, GateView, ApeView,
                                RowOffsetsView, CacheLengthsView, SlotView>() &&
                Details::check_cache_arg<ExecutionSpace, T, C, BlockTableView>()) {
    if constexpr (is_cache_type<C, T>::value) {
      Details::step_impl(
          space, ring, key, gate, ape, row_offsets, cache_lengths, slot_idx,
          num_requests, out,
          Details::CacheArg<C, MemorySpace, BlockTableView>{&cache, &block_table},
          options);
    } else {
      // fp8 of f64 pools: refused, before anything runs.
      Details::check_cache_shapes<ExecutionSpace, T>(
          Details::Checker("KPool::step"), space, cache, block_table,
          static_cast<int>(ape.extent(1)), block_table.extent(0));
    }
  }
}

/// The decode step (docs/writers.md, "The steps"): tail_update for every
/// live row, with the closed pools compacted into `out` like KPool::step's
/// (request r's at rows [offsets(r), offsets(r + 1)), in position order;
/// the count on the device). Row r carries up to next_n tokens of the
/// sequence in ring slot slot_idx(r) (speculative decoding sends the next
/// token and drafts); a sequence may alternate between step and
/// decode_step and gets the same pools. A row's first real position may
/// rewind, as in KPool::step (the next token plus S drafts a row, re-sent
/// from the first rejected one, needs a ring of at least K + S:
/// Ring::serving_length).
///
/// Views as for KPool::step: in ExecutionSpace::memory_space, any layout
/// Kokkos can view as LayoutStride.
///
/// @tparam ExecutionSpace a Kokkos execution space; MemorySpace must be its
/// memory space.
/// @tparam T the storage type (float, double, bfloat16, float16).
/// @param space the execution space instance all work is queued on.
/// @param ring the layer's ring, [max_slots, 2, R, D]; read and written.
/// @param key [B, next_n, D] T: the tokens' keys (padding entries unread).
/// @param gate [B, next_n, D] T: their gate scores.
/// @param ape [K, D] float; K and D are taken from it.
/// @param positions [B, next_n] int32: each token's absolute position in
/// its sequence; negative marks padding. A row's real positions, left to
/// right, are consecutive.
/// @param slot_idx [B] uint32: each row's ring slot, below max_slots,
/// distinct among live rows.
/// @param num_requests live rows, 0 <= num_requests <= B.
/// @param out the compacted pools, written: max_batch >= B and capacity >=
/// num_requests * ceil(next_n / K) (StepOutput::capacity_for(B * next_n,
/// B, K) suffices).
/// @param options `validate` (data checks) and `team_size`; `fused` unused.
/// @throws KPool::InvalidArgument for mismatched shapes, next_n = 0 or a
/// ring built for another K (always), or, with options.validate, a slot out
/// of range or shared, or a row whose real positions are not consecutive.
/// Nothing has been written then.
/// @par Launches and synchronization
/// Two launches on `space`: the offset scan and tail_update. With
/// options.validate, first fences `space` and copies slot_idx and
/// positions (live rows) to the host; otherwise nothing waits for the host.
template <class ExecutionSpace, class T, class MemorySpace, class KeyView,
          class GateView, class ApeView, class PositionsView, class SlotView>
void decode_step(ExecutionSpace const& space, Ring<T, MemorySpace>& ring,
                 KeyView const& key, GateView const& gate, ApeView const& ape,
                 PositionsView const& positions, SlotView const& slot_idx,
                 int num_requests, StepOutput<T, MemorySpace>& out,
                 Options const& options = Options()) {
  if constexpr (Details::check_decode_views<ExecutionSpace, MemorySpace, T, KeyView,
                                            GateView, ApeView, PositionsView,
                                            SlotView>())
    Details::decode_step_impl(space, ring, key, gate, ape, positions, slot_idx,
                              num_requests, out, Details::NoCacheArg(),
                              options);
}

/// KPool::decode_step writing every pool it closes into a pool cache as
/// well, as the cache overload of KPool::step does (docs/indexer.md, "The
/// pool cache"): in its launch on a GPU, by the cheaper path on a host
/// (one more launch when that is the second pass). Everything else is
/// KPool::decode_step's.
///
/// @param cache the layer's cache, head_dim D; written.
/// @param block_table [>= num_requests, max_blocks] int32, any layout: row
/// r's blocks.
/// @throws KPool::InvalidArgument as KPool::decode_step, and as the cache
/// overload of KPool::step for the cache and the block table. Nothing has
/// been written then.
template <class ExecutionSpace, class T, class MemorySpace, class KeyView,
          class GateView, class ApeView, class PositionsView, class SlotView,
          class C, class BlockTableView>
void decode_step(ExecutionSpace const& space, Ring<T, MemorySpace>& ring,
                 KeyView const& key, GateView const& gate, ApeView const& ape,
                 PositionsView const& positions, SlotView const& slot_idx,
                 int num_requests, StepOutput<T, MemorySpace>& out,
                 PoolCache<C, MemorySpace>& cache,
                 BlockTableView const& block_table,
                 Options const& options = Options()) {
  if constexpr (Details::check_decode_views<ExecutionSpace, MemorySpace, T, KeyView, GateView,
                                  ApeView, PositionsView, SlotView>() &&
                Details::check_cache_arg<ExecutionSpace, T, C, BlockTableView>()) {
    if constexpr (is_cache_type<C, T>::value) {
      Details::decode_step_impl(
          space, ring, key, gate, ape, positions, slot_idx, num_requests, out,
          Details::CacheArg<C, MemorySpace, BlockTableView>{&cache, &block_table},
          options);
    } else {
      Details::check_cache_shapes<ExecutionSpace, T>(
          Details::Checker("KPool::decode_step"), space, cache, block_table,
          static_cast<int>(ape.extent(1)), block_table.extent(0));
    }
  }
}

namespace Details {

// The Batch forms of the steps: a [T, D] key takes a ragged batch (KPool::
// step's positional form), a [B, next_n, D] key a decode batch
// (KPool::decode_step's); `write` gets the batch's views and runs the
// positional form.
template <class KeyView, class M, class Ragged, class Decode>
void step_by_batch(Batch<M> const& batch, Ragged const& ragged, Decode const& decode) {
  Checker const chk("KPool::step");
  if constexpr (view_facts<KeyView>::rank == 3) {
    batch_kind_is(chk, batch, Batch<M>::Kind::decode,
                  "is not a decode batch: a [B, next_n, D] key takes KPool::decode_batch");
    batch_has_slots(chk, batch);
    decode(batch.positions, batch.slot_idx, batch.num_requests);
  } else {
    batch_kind_is(chk, batch, Batch<M>::Kind::ragged,
                  "is not a ragged batch: a [total_tokens, D] key takes KPool::ragged_batch");
    batch_has_slots(chk, batch);
    ragged(batch.row_offsets, batch.cache_lengths, batch.slot_idx, batch.num_requests);
  }
}

}  // namespace Details

/// The serving step with one batch argument (docs/api.md, "One batch
/// argument"): state, inputs, batch, outputs, options. With a ragged batch
/// and a [total_tokens, D] key it is KPool::step's positional form; with a
/// decode batch and a [B, next_n, D] key, KPool::decode_step's. Same
/// pools, rules, launches and errors; K is the ring's (and ape's).
/// @param space the execution space instance all work is queued on.
/// @param ring the layer's ring; read and written.
/// @param key [total_tokens, D] or [B, next_n, D] T.
/// @param gate the same shape as key.
/// @param ape [K, D] float.
/// @param batch a ragged or decode batch with each row's ring slot
/// (KPool::ragged_batch, KPool::decode_batch).
/// @param out the compacted pools, written.
/// @param options as the positional forms.
/// @throws KPool::InvalidArgument (argument "batch") for a batch of the
/// other form or without slot_idx, and as the positional forms.
template <class ExecutionSpace, class T, class MemorySpace, class KeyView,
          class GateView, class ApeView>
void step(ExecutionSpace const& space, Ring<T, MemorySpace>& ring,
          KeyView const& key, GateView const& gate, ApeView const& ape,
          Batch<MemorySpace> const& batch, StepOutput<T, MemorySpace>& out,
          Options const& options = Options()) {
  Details::step_by_batch<KeyView>(
      batch,
      [&](auto const& ro, auto const& cl, auto const& slots, int n) {
        KPool::step(space, ring, key, gate, ape, ro, cl, slots, n, out, options);
      },
      [&](auto const& positions, auto const& slots, int n) {
        KPool::decode_step(space, ring, key, gate, ape, positions, slots, n, out, options);
      });
}

/// The serving step with one batch argument, writing every pool it emits
/// into the paged cache as well (the cache overloads of KPool::step and
/// KPool::decode_step, by the batch's form).
/// @param cache the layer's cache with the block table of the batch's
/// rows (KPool::paged); the cache is written.
/// @throws KPool::InvalidArgument as the step above and the cache
/// overloads.
template <class ExecutionSpace, class T, class MemorySpace, class KeyView,
          class GateView, class ApeView, class C>
void step(ExecutionSpace const& space, Ring<T, MemorySpace>& ring,
          KeyView const& key, GateView const& gate, ApeView const& ape,
          Batch<MemorySpace> const& batch, StepOutput<T, MemorySpace>& out,
          PagedCache<C, MemorySpace> const& cache, Options const& options = Options()) {
  PoolCache<C, MemorySpace> written = cache.cache;  // a handle on the same storage
  Details::step_by_batch<KeyView>(
      batch,
      [&](auto const& ro, auto const& cl, auto const& slots, int n) {
        KPool::step(space, ring, key, gate, ape, ro, cl, slots, n, out, written,
                    cache.block_table, options);
      },
      [&](auto const& positions, auto const& slots, int n) {
        KPool::decode_step(space, ring, key, gate, ape, positions, slots, n, out, written,
                           cache.block_table, options);
      });
}

}  // namespace KPool

#endif
