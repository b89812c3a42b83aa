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

namespace Details {

// The steps by the batch's form: a [T, D] key takes a ragged batch (the
// general step), a [B, next_n, D] key a decode batch (the decode step);
// `arg` the cache and its block table (CacheArg) or none (NoCacheArg).
template <class ExecutionSpace, class T, class M, class KeyView, class GateView,
          class ApeView, class Arg>
void step_batch(ExecutionSpace const& space, Ring<T, M>& ring, KeyView const& key,
                GateView const& gate, ApeView const& ape, Batch<M> const& batch,
                StepOutput<T, M>& out, Arg const& arg, Options const& options) {
  Checker const chk("KPool::step");
  using Index = Kokkos::View<const std::uint32_t*, Kokkos::LayoutStride, M>;
  using Positions = Kokkos::View<const std::int32_t**, Kokkos::LayoutStride, M>;
  if constexpr (view_facts<KeyView>::rank == 3) {
    batch_kind_is(chk, batch, Batch<M>::Kind::decode,
                  "is not a decode batch: a [B, next_n, D] key takes KPool::decode_batch");
    batch_has_slots(chk, batch);
    if constexpr (check_decode_views<ExecutionSpace, M, T, KeyView, GateView, ApeView,
                                     Positions, Index>())
      decode_step_impl(space, ring, key, gate, ape, batch.positions, batch.slot_idx,
                       batch.num_requests, out, arg, options);
  } else {
    batch_kind_is(chk, batch, Batch<M>::Kind::ragged,
                  "is not a ragged batch: a [total_tokens, D] key takes KPool::ragged_batch");
    batch_has_slots(chk, batch);
    if constexpr (check_step_views<ExecutionSpace, M, T, KeyView, GateView, ApeView, Index,
                                   Index, Index>())
      step_impl(space, ring, key, gate, ape, batch.row_offsets, batch.cache_lengths,
                batch.slot_idx, batch.num_requests, out, arg, options);
  }
}

}  // namespace Details

/// The serving step (docs/writers.md, "The steps"), for either form of the
/// one batch argument (docs/api.md, "One batch argument"). Every pool whose
/// last member arrives in this call lands in `out`, compacted (see
/// StepOutput), and the ring keeps what later calls need; pools do not
/// depend on how a sequence was split across calls.
///
/// - A **ragged batch** with a [total_tokens, D] key: per request
///   ring_close, then compress, then seed_tail, for a batch mixing fresh
///   prefills, chunk continuations, zero-token rows and single-token
///   decodes. Request r (r < num_requests) owns token rows
///   [row_offsets(r), row_offsets(r + 1)) of key and gate, at absolute
///   positions cache_lengths(r) + i of the sequence in ring slot
///   slot_idx(r).
/// - A **decode batch** with a [B, next_n, D] key: tail_update for every
///   live row, which carries up to next_n tokens at positions(r, i)
///   (negative: padding; a row's real positions consecutive), speculative
///   decoding's next token and drafts; request r's pools in position order.
///
/// A sequence may move between the two forms from one call to the next and
/// gets the same pools. A row may restart its sequence below its length,
/// re-sending rejected drafts (docs/ring.md, "Rewinds"): re-sent positions
/// replace their ring entries and a pool whose last member is re-sent is
/// emitted again. A row may not start past what its slot holds
/// (docs/ring.md, "No gaps"). Rows at and past num_requests are neither read
/// nor written.
///
/// Every View is a Kokkos::View in ExecutionSpace::memory_space, of any
/// layout Kokkos can view as LayoutStride; ranks and element types are
/// checked at compile time. Unit channel stride (and 16-byte aligned rows
/// on GPUs) selects the fast kernels.
///
/// @tparam ExecutionSpace a Kokkos execution space; MemorySpace must be its
/// memory space.
/// @tparam T the storage type (float, double, bfloat16, float16).
/// @param space the execution space instance all work is queued on.
/// @param ring the layer's ring, [max_slots, 2, R, D]; read and written
/// (its entries and its slots' state). K is the ring's (and ape's).
/// @param key [total_tokens, D] (ragged) or [B, next_n, D] (decode) T: the
/// tokens' keys (padding entries unread).
/// @param gate the same shape as key: their gate scores (the two halves of
/// one [total_tokens, 2D] buffer work).
/// @param ape [K, D] float: the position embedding within a pool.
/// @param batch a ragged or decode batch with each row's ring slot
/// (KPool::ragged_batch, KPool::decode_batch).
/// @param out the compacted pools, written: max_batch >= B and capacity >=
/// floor(total_tokens / K) + num_requests (ragged), num_requests *
/// ceil(next_n / K) (decode); StepOutput::capacity_for gives both.
/// @param options `validate` (data checks), `team_size`, and `fused` (a
/// ragged batch: one launch for the three writers, or three; same bits).
/// @throws KPool::InvalidArgument (entry point "KPool::step") for a batch
/// of the other form or without slot_idx, mismatched shapes or a ring
/// built for another K (always), or bad index data (with
/// options.validate): row_offsets not starting at 0, decreasing or past the
/// key rows, a sequence passing 2^31 - 1 positions, a slot out of range or
/// shared, a decode row's real positions not consecutive, a start past
/// what its slot holds or deeper than the ring holds. Nothing has been
/// written then.
/// @par Launches and synchronization
/// Ragged: two launches on `space` (the offset scan, then the fused
/// writers), four with fused = false (the scan, ring_close, compress,
/// seed_tail). Decode: two (the offset scan, tail_update). With
/// options.validate, first fences `space` and copies the batch's index
/// arrays (live rows) and the ring's slot state to the host; otherwise
/// nothing waits for the host, and the step can be captured in a CUDA
/// graph.
template <class ExecutionSpace, class T, class MemorySpace, class KeyView,
          class GateView, class ApeView>
void step(ExecutionSpace const& space, Ring<T, MemorySpace>& ring,
          KeyView const& key, GateView const& gate, ApeView const& ape,
          Batch<MemorySpace> const& batch, StepOutput<T, MemorySpace>& out,
          Options const& options = Options()) {
  Details::step_batch(space, ring, key, gate, ape, batch, out, Details::NoCacheArg(), options);
}

/// The serving step above, writing every pool it emits into the paged
/// cache as well (docs/indexer.md, "The pool cache"): cached = Q(R(x)) of
/// pool p of batch row r goes to block block_table(r, p / block_pools),
/// entry p % block_pools; a pool re-emitted after a rewind overwrites its
/// entry. On a GPU (and with device shapes) in the same launches: each pool
/// goes from the registers that made it into team scratch, is rotated and
/// quantized there. On a host, by whichever path measured cheaper
/// (docs/performance.md, "Writing the pool cache"): in the step, or one
/// more launch on `space` over the output's rows (the count read on the
/// device). Same bytes either way.
///
/// @param cache the layer's cache and the batch rows' block table
/// (KPool::paged): the cache, of the call's head_dim and built for the
/// ring's K (C: T, a native cache, or KPool::float8_e4m3 for pools that
/// are not f64), is written; the table, [>= num_requests, max_blocks]
/// int32, is read.
/// @throws KPool::InvalidArgument as the step above, and for a cache
/// without storage, of another head_dim, built for another K than the
/// ring's, fp8 for f64 pools, or a block table with fewer rows than
/// num_requests (always); with options.validate, a pool this call emits
/// whose block table column is missing, negative (unassigned) or not below
/// num_blocks. Nothing has been written then (the ring, the output and the
/// cache are unchanged). With validation off such a pool still reaches
/// `out` and is left out of the cache.
/// @par Launches and synchronization
/// As the step above, plus the cache's launch where a host writes it in a
/// second pass; nothing more waits for the host. With options.validate the
/// block table's live rows are copied to the host too.
template <class ExecutionSpace, class T, class MemorySpace, class KeyView,
          class GateView, class ApeView, class C>
void step(ExecutionSpace const& space, Ring<T, MemorySpace>& ring,
          KeyView const& key, GateView const& gate, ApeView const& ape,
          Batch<MemorySpace> const& batch, PagedCache<C, MemorySpace>& cache,
          StepOutput<T, MemorySpace>& out, Options const& options = Options()) {
  using Table = decltype(cache.block_table);
  if constexpr (Details::check_cache_arg<ExecutionSpace, T, C, Table>()) {
    if constexpr (is_cache_type<C, T>::value) {
      Details::step_batch(space, ring, key, gate, ape, batch, out,
                          Details::CacheArg<C, MemorySpace, Table>{&cache.cache,
                                                                   &cache.block_table},
                          options);
    } else {
      // fp8 of f64 pools: refused, before anything runs.
      Details::check_cache_shapes<ExecutionSpace, T>(
          Details::Checker("KPool::step"), space, cache.cache, cache.block_table,
          static_cast<int>(ape.extent(1)), cache.block_table.extent(0));
    }
  }
}

/// The same, with the paged cache made in the call (KPool::paged(cache,
/// block_table)): the cache it holds is written.
template <class ExecutionSpace, class T, class MemorySpace, class KeyView,
          class GateView, class ApeView, class C>
void step(ExecutionSpace const& space, Ring<T, MemorySpace>& ring,
          KeyView const& key, GateView const& gate, ApeView const& ape,
          Batch<MemorySpace> const& batch, PagedCache<C, MemorySpace>&& cache,
          StepOutput<T, MemorySpace>& out, Options const& options = Options()) {
  KPool::step(space, ring, key, gate, ape, batch, cache, out, options);
}

}  // namespace KPool

#endif
