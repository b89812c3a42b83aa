#ifndef KPOOL_SELECT_EXPAND_TOPK_HPP
#define KPOOL_SELECT_EXPAND_TOPK_HPP

#include <cache/KPool_PoolCache.hpp>
#include <common/KPool_Batch.hpp>
#include <common/KPool_Options.hpp>
#include <common/detail/KPool_Launch.hpp>
#include <common/detail/KPool_Validate.hpp>
#include <select/detail/KPool_ExpandTopkFunctor.hpp>

#include <cstdint>

namespace KPool {

/// The output width of expand_topk.
/// @param pool_topk pools selected per token (the columns of pool_ids).
/// @param kpool K, tokens per pool.
/// @param tail_always whether the K - 1 tail columns are added.
/// @return pool_topk * K, plus K - 1 when tail_always.
inline int expand_topk_width(int pool_topk, int kpool, bool tail_always) {
  return static_cast<int>(Details::expanded_width(
      static_cast<std::uint64_t>(pool_topk), kpool, tail_always));
}

namespace Details {

// expand_topk's checks and launch, for its every form.
template <class ExecutionSpace, class PoolIdsView, class RowOffsetsView,
          class CacheLengthsView, class OutView>
void expand_topk_impl(ExecutionSpace const& space, PoolIdsView const& pool_ids,
                 RowOffsetsView const& row_offsets,
                 CacheLengthsView const& cache_lengths, int num_requests,
                 int kpool, bool tail_always, OutView const& out,
                 Options const& options) {
  KPOOL_IMPL_CHECK_VIEW(PoolIdsView, std::int32_t, 2, ExecutionSpace,
                        "pool_ids");
  KPOOL_IMPL_CHECK_VIEW(RowOffsetsView, std::uint32_t, 1, ExecutionSpace,
                        "row_offsets");
  KPOOL_IMPL_CHECK_VIEW(CacheLengthsView, std::uint32_t, 1, ExecutionSpace,
                        "cache_lengths");
  KPOOL_IMPL_CHECK_OUTPUT_VIEW(OutView, std::int32_t, 2, ExecutionSpace,
                               "out");

  Entry const chk("KPool::expand_topk");
  if (kpool < 1)
    chk.fail_scalar("kpool", kpool,
                    "is not a valid kpool (K must be at least 1)");
  std::size_t const topk = pool_ids.extent(1);
  std::uint64_t const width = expanded_width(topk, kpool, tail_always);
  if (width > 0x7FFFFFFF)
    chk.fail("pool_ids", "extent 1", -1, std::to_string(topk),
             "times kpool is too wide an output");
  chk.extent_is("out", 0, out.extent(0), pool_ids.extent(0),
                "the token rows of pool_ids");
  chk.extent_is("out", 1, out.extent(1), width,
                "pool_topk * K (+ K - 1 with tail_always)");
  chk.batch_shape(row_offsets, cache_lengths, num_requests);
  if (options.validate)
    check_ragged_batch(chk, space, row_offsets, cache_lengths,
                                static_cast<RowOffsetsView const*>(nullptr),
                                num_requests, pool_ids.extent(0), kpool, 0);
  if (width == 0) return;

  using M = typename ExecutionSpace::memory_space;
  ExpandTopkFunctor<ExecutionSpace> f;
  f.pool_ids = View2<const std::int32_t, M>(pool_ids);
  f.row_offsets = row_offsets;
  f.cache_lengths = cache_lengths;
  f.out = View2<std::int32_t, M>(out);
  f.num_requests = num_requests;
  f.kpool = kpool;
  f.tail_always = tail_always;
  LaunchShape const shape = items_shape(
      chk, "pool_ids", space, f, pool_ids.extent(0), static_cast<int>(width), 1,
      options.team_size);
  launch_items(space, "KPool::expand_topk", shape, f);
}

}  // namespace Details

/// Selected pool ids back to the token positions sparse attention reads
/// (docs/writers.md, "expand_topk"). Token row t = row_offsets(b) + i of
/// request b is position cache_lengths(b) + i and sees
/// visible = cache_lengths(b) + i + 1 positions. Column j < pool_topk * K
/// holds pid * K + j % K for pid = pool_ids(t, j / K), or -1 when pid < 0
/// or the pool is not complete within visible ((pid + 1) * K > visible): a
/// stale or garbage id never becomes an attention index. With tail_always,
/// tail column j (0 <= j < K - 1, after the pool columns) holds
/// visible - visible % K + j when j < visible % K, else -1: the members of
/// the token's own pending pool. Rows outside the live requests are not
/// touched. K is the cache's: the one its pool ids come from. A decode
/// batch's tokens come from select_tokens, which takes either form.
///
/// @tparam ExecutionSpace a Kokkos execution space.
/// @param space the execution space instance the work is queued on.
/// @param pool_ids [T_q, pool_topk] int32: per query token, the selected
/// pool ids, -1 for none.
/// @param tail_always whether to append the K - 1 tail columns.
/// @param batch a ragged batch (slot_idx not read): request b owns query
/// rows [row_offsets(b), row_offsets(b + 1)) at positions
/// cache_lengths(b) + i.
/// @param cache the pool cache the ids are of (its K; nothing is read).
/// @param out [T_q, expand_topk_width(pool_topk, K, tail_always)] int32,
/// written for the live requests' rows.
/// @param options `validate` (data checks of row_offsets and
/// cache_lengths) and `team_size`.
/// @throws KPool::InvalidArgument (argument "batch") for a decode batch,
/// ("cache") a cache built without its K; an output too wide for int32 or
/// mismatched extents (always), or bad row_offsets or cache_lengths (with
/// options.validate). Nothing has been written then.
/// @par Launches and synchronization
/// One launch on `space` (none when the width is 0). With
/// options.validate, first fences `space` and copies row_offsets and
/// cache_lengths (live rows) to the host.
template <class ExecutionSpace, class PoolIdsView, class MemorySpace, class C, class OutView>
void expand_topk(ExecutionSpace const& space, PoolIdsView const& pool_ids, bool tail_always,
                 Batch<MemorySpace> const& batch, PoolCache<C, MemorySpace> const& cache,
                 OutView const& out, Options const& options = Options()) {
  Details::Checker const chk("KPool::expand_topk");
  Details::batch_kind_is(chk, batch, Batch<MemorySpace>::Kind::ragged,
                         "is not the ragged batch the call takes (select_tokens takes "
                         "a decode batch)");
  if (cache.kpool() < 1)
    chk.fail("cache", "kpool", -1, std::to_string(cache.kpool()),
             "is a cache built without its K (construct it with kpool), which expand_topk "
             "takes K from");
  Details::expand_topk_impl(space, pool_ids, batch.row_offsets, batch.cache_lengths,
                            batch.num_requests, cache.kpool(), tail_always, out, options);
}

}  // namespace KPool

#endif
