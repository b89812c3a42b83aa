#ifndef KPOOL_SELECT_SELECT_TOKENS_HPP
#define KPOOL_SELECT_SELECT_TOKENS_HPP

#include <select/KPool_ExpandTopk.hpp>
#include <select/KPool_ScoreSelect.hpp>

#include <cstdint>

namespace KPool {

/// Width of select_tokens' token rows: topk * K pool columns and the K - 1
/// tail columns.
/// @param topk pools selected per query row.
/// @param kpool K.
/// @return topk * kpool + kpool - 1.
inline int select_tokens_width(int topk, int kpool) {
  return expand_topk_width(topk, kpool, true);
}

/// The indexer's whole selection for sparse attention: score_select, then
/// expand_topk with the always-selected tail, in one call. Row t of
/// `tokens` ([T, topk * K + K - 1] int32) holds the token positions of
/// pool_ids(t, :) as expand_topk writes them (pool p gives p * K .. p * K +
/// K - 1, -1 for the columns of an unused pool slot), then the positions of
/// the incomplete pool at the end of the row's visible tokens, then -1.
/// Same arguments, rules and errors as score_select otherwise; the pool ids
/// never leave team scratch, so the selection and the expansion are one
/// launch.
/// @param space the execution space instance everything is queued on.
/// @param row_offsets [B + 1] uint32: request r's query rows.
/// @param cache_lengths [B] uint32: the position of request r's first
/// query row.
/// @param block_table [>= num_requests, max_blocks] int32: request r's
/// blocks.
/// @param num_requests the live rows of the batch.
/// @param kpool K.
/// @param q [T, H, D]: the indexer queries.
/// @param weights [T, H] float: per-head weights.
/// @param cache the layer's pool cache, read only.
/// @param topk the pools selected per query row, at least 1.
/// @param tokens [T, select_tokens_width(topk, K)] int32, written for the
/// live requests' rows.
/// @param workspace at least T rows of max_visible pools, H heads, D.
/// @param options validate, team_size, score_engine.
/// @throws KPool::InvalidArgument as score_select.
template <class ExecutionSpace, class RowOffsetsView, class CacheLengthsView,
          class BlockTableView, class QView, class WeightsView, class C,
          class MemorySpace, class TokensView, class T>
void select_tokens(ExecutionSpace const& space,
                   RowOffsetsView const& row_offsets,
                   CacheLengthsView const& cache_lengths,
                   BlockTableView const& block_table, int num_requests,
                   int kpool, QView const& q, WeightsView const& weights,
                   PoolCache<C, MemorySpace> const& cache, int topk,
                   TokensView const& tokens,
                   SelectWorkspace<T, MemorySpace>& workspace,
                   Options const& options = Options()) {
  KPOOL_IMPL_CHECK_OUTPUT_VIEW(TokensView, std::int32_t, 2, ExecutionSpace,
                               "tokens");
  if constexpr (Details::view_ok<TokensView, std::int32_t, 2, ExecutionSpace>() &&
                !Details::view_facts<TokensView>::is_const) {
    Details::Entry const chk("KPool::select_tokens");
    Details::score_select_call<true>(chk, space, row_offsets, cache_lengths,
                                     block_table, num_requests, kpool, q,
                                     weights, cache, topk, "tokens", tokens,
                                     workspace, options);
  }
}

/// select_tokens with one batch argument (docs/api.md, "One batch
/// argument"): the arguments, forms and rules of score_select's batch
/// form, and tokens [T, select_tokens_width(topk, K)] int32 as the
/// positional form writes it (K the cache's).
/// @throws KPool::InvalidArgument as score_select.
template <class ExecutionSpace, class C, class MemorySpace, class QView,
          class WeightsView, class TokensView, class T>
void select_tokens(ExecutionSpace const& space, PagedCache<C, MemorySpace> const& cache,
                   QView const& q, WeightsView const& weights, int topk,
                   Batch<MemorySpace> const& batch, TokensView const& tokens,
                   SelectWorkspace<T, MemorySpace>& workspace,
                   Options const& options = Options()) {
  KPOOL_IMPL_CHECK_OUTPUT_VIEW(TokensView, std::int32_t, 2, ExecutionSpace, "tokens");
  if constexpr (Details::view_ok<TokensView, std::int32_t, 2, ExecutionSpace>() &&
                !Details::view_facts<TokensView>::is_const) {
    Details::score_select_batch<true>(Details::Entry("KPool::select_tokens"), space, cache,
                                      q, weights, topk, batch, "tokens", tokens, workspace,
                                      options);
  }
}

}  // namespace KPool

#endif
