#ifndef KPOOL_SELECT_TOKENS_HPP
#define KPOOL_SELECT_TOKENS_HPP

#include <KPool_ExpandTopk.hpp>
#include <KPool_ScoreSelect.hpp>

#include <cstdint>

namespace KPool {

/// Width of select_tokens' token rows: topk * K pool columns and the K - 1
/// tail columns.
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
  Details::KokkosExt::ScopedProfileRegion region("KPool::select_tokens");
  Details::Checker const chk("KPool::select_tokens");
  Details::score_select_call<true>(chk, space, row_offsets, cache_lengths,
                                   block_table, num_requests, kpool, q,
                                   weights, cache, topk, "tokens", tokens,
                                   workspace, options);
}

}  // namespace KPool

#endif
