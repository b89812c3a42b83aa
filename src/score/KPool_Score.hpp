#ifndef KPOOL_SCORE_SCORE_HPP
#define KPOOL_SCORE_SCORE_HPP

/// @file
/// KPool::score: the indexer's logits, the scores the selection ranks, for
/// an engine with its own top-k or one debugging its scores (as the
/// engines call DeepGEMM's fp8_paged_mqa_logits, then a top-k). It shares
/// the selection's workspace and its chunk loop, so this one public header
/// of the score wing sits above the selection's (select/KPool_ScoreSelect.hpp).

#include <cache/KPool_PagedCache.hpp>
#include <common/KPool_Batch.hpp>
#include <common/KPool_Options.hpp>
#include <select/KPool_ScoreSelect.hpp>

#include <type_traits>

namespace KPool {

/// Every visible pool's score for every query row of a batch
/// (docs/indexer.md, "Scoring"): scores(t, p) = sum_h weights(t, h) *
/// relu(R(q(t, h, :)) . k_p) for the pools p < visible(t) the row sees,
/// computed by the workspace's engine, bit for bit the scores score_select
/// and select_tokens rank (score_key of each is the key they select by);
/// -inf for the columns p >= visible(t), and for a pool the selection would
/// not see (its block unassigned or out of range, validation off). f32
/// scores (f64 for f64 queries). Rows outside the live requests are not
/// touched. The batch's forms, the cache, q, weights and the workspace are
/// score_select's, with the same rules and errors; K is the cache's.
///
/// @param space the execution space instance everything is queued on.
/// @param q [T, H, D]: the indexer queries (T = B * next_n for a decode
/// batch).
/// @param weights [T, H] float: per-head weights.
/// @param batch a ragged or decode batch (slot_idx not read).
/// @param cache the layer's pool cache and the batch rows' block table
/// (KPool::paged), read only.
/// @param scores [T, P] of SelectWorkspace<T>::score_type, P at least the
/// workspace's max_visible: written for the live rows.
/// @param workspace at least one row of max_visible pools, H heads, D; its
/// engine scores.
/// @param options validate, team_size.
/// @throws KPool::InvalidArgument as score_select (argument "scores" for
/// its shape), before anything is written.
/// @par Launches and synchronization
/// Per chunk of the workspace's rows, three on `space` (prepare the
/// queries, score, write the scores); nothing waits for the host without
/// validation.
template <class ExecutionSpace, class QView, class WeightsView, class C, class MemorySpace,
          class ScoresView, class T>
void score(ExecutionSpace const& space, QView const& q, WeightsView const& weights,
           Batch<MemorySpace> const& batch, PagedCache<C, MemorySpace> const& cache,
           ScoresView const& scores, SelectWorkspace<T, MemorySpace>& workspace,
           Options const& options = Options()) {
  using A = typename SelectWorkspace<T, MemorySpace>::score_type;
  KPOOL_IMPL_CHECK_OUTPUT_VIEW(ScoresView, A, 2, ExecutionSpace, "scores");
  if constexpr (Details::view_ok<ScoresView, A, 2, ExecutionSpace>() &&
                !Details::view_facts<ScoresView>::is_const) {
    Details::score_select_batch<false, true>(Details::Entry("KPool::score"), space, cache, q,
                                             weights, 0, batch, "scores", scores, workspace,
                                             options);
  }
}

}  // namespace KPool

#endif
