#ifndef KPOOL_SELECT_DEPRECATED_HPP
#define KPOOL_SELECT_DEPRECATED_HPP

/// @file
/// The select wing's retired forms (CHANGELOG.md; docs/api.md, "Migrating
/// from the positional forms"): each marked [[deprecated]] with its
/// replacement's name, and gone from a build with
/// -DKPool_ENABLE_DEPRECATED=OFF. The umbrella header includes this last.
/// The positional forms take K as an argument, which the new forms take
/// from the cache: they still refuse a K the cache was not built for.

#include <KPool_Config.hpp>

#if KPOOL_ENABLE_DEPRECATED

#include <cache/KPool_PagedCache.hpp>
#include <common/KPool_Batch.hpp>
#include <select/KPool_ExpandTopk.hpp>
#include <select/KPool_ScoreSelect.hpp>
#include <select/KPool_SelectTokens.hpp>

#include <cstdint>

namespace KPool {

template <class ExecutionSpace, class RowOffsetsView, class CacheLengthsView,
          class BlockTableView, class QView, class WeightsView, class C, class MemorySpace,
          class PoolIdsView, class T>
[[deprecated("use KPool::score_select(space, q, weights, topk, KPool::ragged_batch("
             "row_offsets, cache_lengths, num_requests), KPool::paged(cache, block_table), "
             "pool_ids, workspace)")]] void
score_select(ExecutionSpace const& space, RowOffsetsView const& row_offsets,
             CacheLengthsView const& cache_lengths, BlockTableView const& block_table,
             int num_requests, int kpool, QView const& q, WeightsView const& weights,
             PoolCache<C, MemorySpace> const& cache, int topk, PoolIdsView const& pool_ids,
             SelectWorkspace<T, MemorySpace>& workspace, Options const& options = Options()) {
  if constexpr (Details::selection_output_ok<false, ExecutionSpace, PoolIdsView>())
    Details::score_select_call<false>(Details::Entry("KPool::score_select"), space,
                                      row_offsets, cache_lengths, block_table, num_requests,
                                      kpool, q, weights, cache, topk, "pool_ids", pool_ids,
                                      workspace, options);
}

template <class ExecutionSpace, class C, class MemorySpace, class QView, class WeightsView,
          class PoolIdsView, class T>
[[deprecated("the cache goes after the batch: use KPool::score_select(space, q, weights, "
             "topk, batch, KPool::paged(cache, block_table), pool_ids, workspace)")]] void
score_select(ExecutionSpace const& space, PagedCache<C, MemorySpace> const& cache,
             QView const& q, WeightsView const& weights, int topk,
             Batch<MemorySpace> const& batch, PoolIdsView const& pool_ids,
             SelectWorkspace<T, MemorySpace>& workspace, Options const& options = Options()) {
  KPool::score_select(space, q, weights, topk, batch, cache, pool_ids, workspace, options);
}

template <class ExecutionSpace, class RowOffsetsView, class CacheLengthsView,
          class BlockTableView, class QView, class WeightsView, class C, class MemorySpace,
          class TokensView, class T>
[[deprecated("use KPool::select_tokens(space, q, weights, topk, KPool::ragged_batch("
             "row_offsets, cache_lengths, num_requests), KPool::paged(cache, block_table), "
             "tokens, workspace)")]] void
select_tokens(ExecutionSpace const& space, RowOffsetsView const& row_offsets,
              CacheLengthsView const& cache_lengths, BlockTableView const& block_table,
              int num_requests, int kpool, QView const& q, WeightsView const& weights,
              PoolCache<C, MemorySpace> const& cache, int topk, TokensView const& tokens,
              SelectWorkspace<T, MemorySpace>& workspace, Options const& options = Options()) {
  if constexpr (Details::selection_output_ok<true, ExecutionSpace, TokensView>())
    Details::score_select_call<true>(Details::Entry("KPool::select_tokens"), space,
                                     row_offsets, cache_lengths, block_table, num_requests,
                                     kpool, q, weights, cache, topk, "tokens", tokens,
                                     workspace, options);
}

template <class ExecutionSpace, class C, class MemorySpace, class QView, class WeightsView,
          class TokensView, class T>
[[deprecated("the cache goes after the batch: use KPool::select_tokens(space, q, weights, "
             "topk, batch, KPool::paged(cache, block_table), tokens, workspace)")]] void
select_tokens(ExecutionSpace const& space, PagedCache<C, MemorySpace> const& cache,
              QView const& q, WeightsView const& weights, int topk,
              Batch<MemorySpace> const& batch, TokensView const& tokens,
              SelectWorkspace<T, MemorySpace>& workspace, Options const& options = Options()) {
  KPool::select_tokens(space, q, weights, topk, batch, cache, tokens, workspace, options);
}

template <class ExecutionSpace, class PoolIdsView, class RowOffsetsView,
          class CacheLengthsView, class OutView>
[[deprecated("K comes from the cache: use KPool::expand_topk(space, pool_ids, tail_always, "
             "KPool::ragged_batch(row_offsets, cache_lengths, num_requests), cache, "
             "out)")]] void
expand_topk(ExecutionSpace const& space, PoolIdsView const& pool_ids,
            RowOffsetsView const& row_offsets, CacheLengthsView const& cache_lengths,
            int num_requests, int kpool, bool tail_always, OutView const& out,
            Options const& options = Options()) {
  Details::expand_topk_impl(space, pool_ids, row_offsets, cache_lengths, num_requests, kpool,
                            tail_always, out, options);
}

template <class ExecutionSpace, class PoolIdsView, class MemorySpace, class OutView>
[[deprecated("K comes from the cache: use KPool::expand_topk(space, pool_ids, tail_always, "
             "batch, cache, out)")]] void
expand_topk(ExecutionSpace const& space, PoolIdsView const& pool_ids, int kpool,
            bool tail_always, Batch<MemorySpace> const& batch, OutView const& out,
            Options const& options = Options()) {
  Details::batch_kind_is(Details::Checker("KPool::expand_topk"), batch,
                         Batch<MemorySpace>::Kind::ragged,
                         "is not the ragged batch the call takes (select_tokens takes "
                         "a decode batch)");
  Details::expand_topk_impl(space, pool_ids, batch.row_offsets, batch.cache_lengths,
                            batch.num_requests, kpool, tail_always, out, options);
}

}  // namespace KPool

#endif  // KPOOL_ENABLE_DEPRECATED

#endif
