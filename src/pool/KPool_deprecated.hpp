#ifndef KPOOL_POOL_DEPRECATED_HPP
#define KPOOL_POOL_DEPRECATED_HPP

/// @file
/// The pool wing's retired forms (CHANGELOG.md; docs/api.md, "Migrating
/// from the positional forms"): each a thin wrapper over its replacement,
/// marked [[deprecated]] with the replacement's name, and gone from a build
/// with -DKPool_ENABLE_DEPRECATED=OFF. The umbrella header includes this
/// last.

#include <KPool_Config.hpp>

#if KPOOL_ENABLE_DEPRECATED

#include <cache/KPool_PagedCache.hpp>
#include <common/KPool_Batch.hpp>
#include <pool/KPool_Compress.hpp>
#include <pool/KPool_RingClose.hpp>
#include <pool/KPool_SeedTail.hpp>
#include <pool/KPool_Step.hpp>
#include <pool/KPool_StorePools.hpp>
#include <pool/KPool_TailUpdate.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace KPool {

template <class ExecutionSpace, class T, class MemorySpace, class KeyView, class GateView,
          class ApeView, class RowOffsetsView, class CacheLengthsView, class SlotView>
[[deprecated("use KPool::step(space, ring, key, gate, ape, KPool::ragged_batch(row_offsets, "
             "cache_lengths, slot_idx, num_requests), out)")]] void
step(ExecutionSpace const& space, Ring<T, MemorySpace>& ring, KeyView const& key,
     GateView const& gate, ApeView const& ape, RowOffsetsView const& row_offsets,
     CacheLengthsView const& cache_lengths, SlotView const& slot_idx, int num_requests,
     StepOutput<T, MemorySpace>& out, Options const& options = Options()) {
  KPool::step(space, ring, key, gate, ape,
              KPool::ragged_batch(row_offsets, cache_lengths, slot_idx, num_requests), out,
              options);
}

template <class ExecutionSpace, class T, class MemorySpace, class KeyView, class GateView,
          class ApeView, class RowOffsetsView, class CacheLengthsView, class SlotView, class C,
          class BlockTableView>
[[deprecated("use KPool::step(space, ring, key, gate, ape, KPool::ragged_batch(row_offsets, "
             "cache_lengths, slot_idx, num_requests), KPool::paged(cache, block_table), "
             "out)")]] void
step(ExecutionSpace const& space, Ring<T, MemorySpace>& ring, KeyView const& key,
     GateView const& gate, ApeView const& ape, RowOffsetsView const& row_offsets,
     CacheLengthsView const& cache_lengths, SlotView const& slot_idx, int num_requests,
     StepOutput<T, MemorySpace>& out, PoolCache<C, MemorySpace>& cache,
     BlockTableView const& block_table, Options const& options = Options()) {
  KPool::step(space, ring, key, gate, ape,
              KPool::ragged_batch(row_offsets, cache_lengths, slot_idx, num_requests),
              KPool::paged(cache, block_table), out, options);
}

template <class ExecutionSpace, class T, class MemorySpace, class KeyView, class GateView,
          class ApeView, class C>
[[deprecated("the cache goes before the output: use KPool::step(space, ring, key, gate, ape, "
             "batch, KPool::paged(cache, block_table), out)")]] void
step(ExecutionSpace const& space, Ring<T, MemorySpace>& ring, KeyView const& key,
     GateView const& gate, ApeView const& ape, Batch<MemorySpace> const& batch,
     StepOutput<T, MemorySpace>& out, PagedCache<C, MemorySpace> const& cache,
     Options const& options = Options()) {
  KPool::step(space, ring, key, gate, ape, batch, PagedCache<C, MemorySpace>(cache), out,
              options);
}

template <class ExecutionSpace, class T, class MemorySpace, class KeyView, class GateView,
          class ApeView, class PositionsView, class SlotView>
[[deprecated("use KPool::step(space, ring, key, gate, ape, KPool::decode_batch(positions, "
             "slot_idx, num_requests), out)")]] void
decode_step(ExecutionSpace const& space, Ring<T, MemorySpace>& ring, KeyView const& key,
            GateView const& gate, ApeView const& ape, PositionsView const& positions,
            SlotView const& slot_idx, int num_requests, StepOutput<T, MemorySpace>& out,
            Options const& options = Options()) {
  KPool::step(space, ring, key, gate, ape, KPool::decode_batch(positions, slot_idx, num_requests),
              out, options);
}

template <class ExecutionSpace, class T, class MemorySpace, class KeyView, class GateView,
          class ApeView, class PositionsView, class SlotView, class C, class BlockTableView>
[[deprecated("use KPool::step(space, ring, key, gate, ape, KPool::decode_batch(positions, "
             "slot_idx, num_requests), KPool::paged(cache, block_table), out)")]] void
decode_step(ExecutionSpace const& space, Ring<T, MemorySpace>& ring, KeyView const& key,
            GateView const& gate, ApeView const& ape, PositionsView const& positions,
            SlotView const& slot_idx, int num_requests, StepOutput<T, MemorySpace>& out,
            PoolCache<C, MemorySpace>& cache, BlockTableView const& block_table,
            Options const& options = Options()) {
  KPool::step(space, ring, key, gate, ape, KPool::decode_batch(positions, slot_idx, num_requests),
              KPool::paged(cache, block_table), out, options);
}

template <class ExecutionSpace, class KeyView, class GateView, class ApeView,
          class RowOffsetsView, class CacheLengthsView, class PoolRowOffsetsView,
          class PooledView>
[[deprecated("use KPool::compress(space, key, gate, ape, KPool::ragged_batch(row_offsets, "
             "cache_lengths, num_requests), pool_row_offsets, pooled)")]] void
compress(ExecutionSpace const& space, KeyView const& key, GateView const& gate,
         ApeView const& ape, RowOffsetsView const& row_offsets,
         CacheLengthsView const& cache_lengths, int num_requests,
         PoolRowOffsetsView const& pool_row_offsets, PooledView const& pooled,
         Options const& options = Options()) {
  KPool::compress(space, key, gate, ape,
                  KPool::ragged_batch(row_offsets, cache_lengths, num_requests),
                  pool_row_offsets, pooled, options);
}

template <class ExecutionSpace, class RowOffsetsView, class CacheLengthsView,
          class PoolRowOffsetsView>
[[deprecated("K comes from ape: use KPool::compute_pool_row_offsets(space, key, ape, "
             "KPool::ragged_batch(row_offsets, cache_lengths, num_requests), "
             "pool_row_offsets)")]] void
compute_pool_row_offsets(ExecutionSpace const& space, RowOffsetsView const& row_offsets,
                         CacheLengthsView const& cache_lengths, int num_requests, int kpool,
                         std::size_t key_rows, PoolRowOffsetsView const& pool_row_offsets,
                         Options const& options = Options()) {
  Details::compute_pool_row_offsets_impl(space, row_offsets, cache_lengths, num_requests, kpool,
                                         key_rows, pool_row_offsets, options);
}

template <class ExecutionSpace, class MemorySpace, class PoolRowOffsetsView>
[[deprecated("K comes from ape: use KPool::compute_pool_row_offsets(space, key, ape, batch, "
             "pool_row_offsets)")]] void
compute_pool_row_offsets(ExecutionSpace const& space, Batch<MemorySpace> const& batch,
                         int kpool, std::size_t key_rows,
                         PoolRowOffsetsView const& pool_row_offsets,
                         Options const& options = Options()) {
  Details::writer_batch_ok("KPool::compute_pool_row_offsets", batch,
                           Batch<MemorySpace>::Kind::ragged, false);
  Details::compute_pool_row_offsets_impl(space, batch.row_offsets, batch.cache_lengths,
                                         batch.num_requests, kpool, key_rows, pool_row_offsets,
                                         options);
}

// The writers on the ring's view alone: their slots' state is neither
// checked nor moved (the ring forms check and move it).

template <class ExecutionSpace, class TailView, class KeyView, class GateView, class ApeView,
          class RowOffsetsView, class CacheLengthsView, class SlotView, class PooledView,
          class ClosedView>
[[deprecated("use KPool::ring_close(space, ring, key, gate, ape, KPool::ragged_batch("
             "row_offsets, cache_lengths, slot_idx, num_requests), pooled, closed_pool)")]] void
ring_close(ExecutionSpace const& space, TailView const& tail, KeyView const& key,
           GateView const& gate, ApeView const& ape, RowOffsetsView const& row_offsets,
           CacheLengthsView const& cache_lengths, SlotView const& slot_idx, int num_requests,
           PooledView const& pooled, ClosedView const& closed_pool,
           Options const& options = Options()) {
  Details::ring_close_impl(space, tail, key, gate, ape, row_offsets, cache_lengths, slot_idx,
                           num_requests, pooled, closed_pool, options,
                           Details::RingSlots<typename ExecutionSpace::memory_space>());
}

template <class ExecutionSpace, class TailView, class KeyView, class GateView, class ApeView,
          class MemorySpace, class PooledView, class ClosedView,
          std::enable_if_t<Kokkos::is_view<TailView>::value, int> = 0>
[[deprecated("use KPool::ring_close(space, ring, key, gate, ape, batch, pooled, "
             "closed_pool): the ring, not its view")]] void
ring_close(ExecutionSpace const& space, TailView const& tail, KeyView const& key,
           GateView const& gate, ApeView const& ape, Batch<MemorySpace> const& batch,
           PooledView const& pooled, ClosedView const& closed_pool,
           Options const& options = Options()) {
  Details::writer_batch_ok("KPool::ring_close", batch, Batch<MemorySpace>::Kind::ragged, true);
  Details::ring_close_impl(space, tail, key, gate, ape, batch.row_offsets, batch.cache_lengths,
                           batch.slot_idx, batch.num_requests, pooled, closed_pool, options,
                           Details::RingSlots<typename ExecutionSpace::memory_space>());
}

template <class ExecutionSpace, class TailView, class KeyView, class GateView,
          class RowOffsetsView, class CacheLengthsView, class SlotView>
[[deprecated("use KPool::seed_tail(space, ring, key, gate, KPool::ragged_batch(row_offsets, "
             "cache_lengths, slot_idx, num_requests))")]] void
seed_tail(ExecutionSpace const& space, TailView const& tail, KeyView const& key,
          GateView const& gate, RowOffsetsView const& row_offsets,
          CacheLengthsView const& cache_lengths, SlotView const& slot_idx, int num_requests,
          Options const& options = Options()) {
  Details::seed_tail_impl(space, tail, key, gate, row_offsets, cache_lengths, slot_idx,
                          num_requests, options,
                          Details::RingSlots<typename ExecutionSpace::memory_space>());
}

template <class ExecutionSpace, class TailView, class KeyView, class GateView,
          class MemorySpace, std::enable_if_t<Kokkos::is_view<TailView>::value, int> = 0>
[[deprecated("use KPool::seed_tail(space, ring, key, gate, batch): the ring, not its "
             "view")]] void
seed_tail(ExecutionSpace const& space, TailView const& tail, KeyView const& key,
          GateView const& gate, Batch<MemorySpace> const& batch,
          Options const& options = Options()) {
  Details::writer_batch_ok("KPool::seed_tail", batch, Batch<MemorySpace>::Kind::ragged, true);
  Details::seed_tail_impl(space, tail, key, gate, batch.row_offsets, batch.cache_lengths,
                          batch.slot_idx, batch.num_requests, options,
                          Details::RingSlots<typename ExecutionSpace::memory_space>());
}

template <class ExecutionSpace, class TailView, class KeyView, class GateView, class ApeView,
          class PositionsView, class SlotView, class PooledView, class ClosedView>
[[deprecated("use KPool::tail_update(space, ring, key, gate, ape, KPool::decode_batch("
             "positions, slot_idx, num_requests), pooled, closed_pool)")]] void
tail_update(ExecutionSpace const& space, TailView const& tail, KeyView const& key,
            GateView const& gate, ApeView const& ape, PositionsView const& positions,
            SlotView const& slot_idx, int num_requests, PooledView const& pooled,
            ClosedView const& closed_pool, Options const& options = Options()) {
  Details::tail_update_impl(space, tail, key, gate, ape, positions, slot_idx, num_requests,
                            pooled, closed_pool, options,
                            Details::RingSlots<typename ExecutionSpace::memory_space>());
}

template <class ExecutionSpace, class TailView, class KeyView, class GateView, class ApeView,
          class MemorySpace, class PooledView, class ClosedView,
          std::enable_if_t<Kokkos::is_view<TailView>::value, int> = 0>
[[deprecated("use KPool::tail_update(space, ring, key, gate, ape, batch, pooled, "
             "closed_pool): the ring, not its view")]] void
tail_update(ExecutionSpace const& space, TailView const& tail, KeyView const& key,
            GateView const& gate, ApeView const& ape, Batch<MemorySpace> const& batch,
            PooledView const& pooled, ClosedView const& closed_pool,
            Options const& options = Options()) {
  Details::writer_batch_ok("KPool::tail_update", batch, Batch<MemorySpace>::Kind::decode, true);
  Details::tail_update_impl(space, tail, key, gate, ape, batch.positions, batch.slot_idx,
                            batch.num_requests, pooled, closed_pool, options,
                            Details::RingSlots<typename ExecutionSpace::memory_space>());
}

template <class ExecutionSpace, class T, class C, class MemorySpace, class BlockTableView>
[[deprecated("use KPool::store_pools(space, out, batch, KPool::paged(cache, "
             "block_table))")]] void
store_pools(ExecutionSpace const& space, StepOutput<T, MemorySpace> const& out,
            int num_requests, BlockTableView const& block_table,
            PoolCache<C, MemorySpace>& cache, Options const& options = Options()) {
  Details::store_pools_impl(space, out, num_requests, block_table, cache, options);
}

template <class ExecutionSpace, class C, class MemorySpace, class BlockTableView,
          class NumPoolsView, class OutView>
[[deprecated("use KPool::load_pools(space, batch, KPool::paged(cache, block_table), out, "
             "domain): a row's pools are those complete before the batch")]] void
load_pools(ExecutionSpace const& space, PoolCache<C, MemorySpace> const& cache,
           BlockTableView const& block_table, NumPoolsView const& num_pools, int num_requests,
           OutView const& out, PoolDomain domain = PoolDomain::cached,
           Options const& options = Options()) {
  KPOOL_IMPL_CHECK_VIEW(NumPoolsView, std::int32_t, 1, ExecutionSpace, "num_pools");
  Details::PoolCounts counts;
  counts.num_pools = num_pools;
  std::size_t const n = num_requests < 0 ? 0 : static_cast<std::size_t>(num_requests);
  Details::load_pools_impl(
      space, cache, block_table, counts, "num_pools", num_pools.extent(0),
      [&] {
        std::vector<std::int32_t> const c = Details::host_copy(space, num_pools, n);
        return std::vector<std::int64_t>(c.begin(), c.end());
      },
      num_requests, out, domain, options);
}

}  // namespace KPool

#endif  // KPOOL_ENABLE_DEPRECATED

#endif
