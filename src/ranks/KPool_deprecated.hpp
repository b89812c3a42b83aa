#ifndef KPOOL_RANKS_DEPRECATED_HPP
#define KPOOL_RANKS_DEPRECATED_HPP

/// @file
/// The ranks wing's retired argument orders (CHANGELOG.md): the paged
/// cache went after the batch (and after topk in the merges), as in every
/// entry point. Each a thin wrapper over its replacement, marked
/// [[deprecated]], and gone with -DKPool_ENABLE_DEPRECATED=OFF.

#include <KPool_Config.hpp>

#if KPOOL_ENABLE_DEPRECATED

#include <ranks/KPool_ShardSelect.hpp>

namespace KPool {

template <class ExecutionSpace, class C, class MemorySpace, class QView, class WeightsView,
          class T>
[[deprecated("use KPool::shard_select_local(space, q, weights, topk, batch, paged, workspace, "
             "exchange)")]] void
shard_select_local(ExecutionSpace const& space, PagedCache<C, MemorySpace> const& cache,
                   QView const& q, WeightsView const& weights, int topk,
                   Batch<MemorySpace> const& batch, SelectWorkspace<T, MemorySpace>& workspace,
                   ShardWorkspace<T, MemorySpace>& exchange, Options const& options = Options()) {
  KPool::shard_select_local(space, q, weights, topk, batch, cache, workspace, exchange, options);
}

template <class ExecutionSpace, class C, class MemorySpace, class PoolIdsView, class T>
[[deprecated("use KPool::shard_select_merge(space, topk, paged, pool_ids, exchange)")]] void
shard_select_merge(ExecutionSpace const& space, PagedCache<C, MemorySpace> const& cache,
                   int topk, PoolIdsView const& pool_ids, ShardWorkspace<T, MemorySpace>& exchange,
                   Options const& options = Options()) {
  KPool::shard_select_merge(space, topk, cache, pool_ids, exchange, options);
}

template <class ExecutionSpace, class C, class MemorySpace, class TokensView, class T>
[[deprecated("use KPool::shard_select_merge_tokens(space, topk, batch, paged, tokens, "
             "exchange)")]] void
shard_select_merge_tokens(ExecutionSpace const& space, PagedCache<C, MemorySpace> const& cache,
                          int topk, Batch<MemorySpace> const& batch, TokensView const& tokens,
                          ShardWorkspace<T, MemorySpace>& exchange,
                          Options const& options = Options()) {
  KPool::shard_select_merge_tokens(space, topk, batch, cache, tokens, exchange, options);
}

template <class ExecutionSpace, class C, class MemorySpace, class QView, class WeightsView,
          class PoolIdsView, class T>
[[deprecated("use KPool::score_select(space, q, weights, topk, batch, paged, pool_ids, "
             "workspace, exchange, comm)")]] void
score_select(ExecutionSpace const& space, PagedCache<C, MemorySpace> const& cache,
             QView const& q, WeightsView const& weights, int topk,
             Batch<MemorySpace> const& batch, PoolIdsView const& pool_ids,
             SelectWorkspace<T, MemorySpace>& workspace, ShardWorkspace<T, MemorySpace>& exchange,
             Communicator<ExecutionSpace>& comm, Options const& options = Options()) {
  KPool::score_select(space, q, weights, topk, batch, cache, pool_ids, workspace, exchange,
                      comm, options);
}

template <class ExecutionSpace, class C, class MemorySpace, class QView, class WeightsView,
          class TokensView, class T>
[[deprecated("use KPool::select_tokens(space, q, weights, topk, batch, paged, tokens, "
             "workspace, exchange, comm)")]] void
select_tokens(ExecutionSpace const& space, PagedCache<C, MemorySpace> const& cache,
              QView const& q, WeightsView const& weights, int topk,
              Batch<MemorySpace> const& batch, TokensView const& tokens,
              SelectWorkspace<T, MemorySpace>& workspace, ShardWorkspace<T, MemorySpace>& exchange,
              Communicator<ExecutionSpace>& comm, Options const& options = Options()) {
  KPool::select_tokens(space, q, weights, topk, batch, cache, tokens, workspace, exchange, comm,
                       options);
}

}  // namespace KPool

#endif  // KPOOL_ENABLE_DEPRECATED

#endif
