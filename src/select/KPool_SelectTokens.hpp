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
/// score_select's pool_ids(t, :) as expand_topk writes them (pool p gives
/// p * K .. p * K + K - 1, -1 for the columns of an unused pool slot), then
/// the positions of the incomplete pool at the end of the row's visible
/// tokens, then -1. The arguments, forms, rules and errors of
/// score_select; the pool ids never leave team scratch, so the selection
/// and the expansion are one launch. K is the cache's.
/// @param tokens [T, select_tokens_width(topk, K)] int32, written for the
/// live rows.
template <class ExecutionSpace, class QView, class WeightsView, class C, class MemorySpace,
          class TokensView, class T>
void select_tokens(ExecutionSpace const& space, QView const& q, WeightsView const& weights,
                   int topk, Batch<MemorySpace> const& batch,
                   PagedCache<C, MemorySpace> const& cache, TokensView const& tokens,
                   SelectWorkspace<T, MemorySpace>& workspace,
                   Options const& options = Options()) {
  if constexpr (Details::selection_output_ok<true, ExecutionSpace, TokensView>()) {
    Details::score_select_batch<true>(Details::Entry("KPool::select_tokens"), space, cache,
                                      q, weights, topk, batch, "tokens", tokens, workspace,
                                      options);
  }
}

}  // namespace KPool

#endif
