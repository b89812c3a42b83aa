#ifndef KPOOL_EXPAND_TOPK_HPP
#define KPOOL_EXPAND_TOPK_HPP

#include <KPool_Options.hpp>
#include <details/KPool_DetailsExpandTopkFunctor.hpp>
#include <details/KPool_DetailsLaunch.hpp>
#include <details/KPool_DetailsValidate.hpp>

#include <cstdint>

namespace KPool {

/// Output width of expand_topk: pool_topk * K, plus K - 1 tail columns when
/// the tail is always selected.
inline int expand_topk_width(int pool_topk, int kpool, bool tail_always) {
  return pool_topk * kpool + (tail_always ? kpool - 1 : 0);
}

/// expand_topk (SEMANTICS.md): selected pool ids back to token positions.
/// For token row t of request b at local index i, visible =
/// cache_lengths(b) + i + 1. Column j < pool_topk * K holds
/// pid * K + j % K for pid = pool_ids(t, j / K), or -1 when pid < 0 or the
/// pool is not complete within visible ((pid + 1) * K > visible): a stale
/// or garbage id never becomes an attention index. Tail column j
/// (0 <= j < K - 1, when tail_always) holds visible - visible % K + j when
/// j < visible % K, else -1. Rows outside the live requests are not
/// touched.
///
/// pool_ids [T, pool_topk] int32; row_offsets [B + 1], cache_lengths [B]
/// uint32; out [T, expand_topk_width(...)] int32, written. One launch.
template <class ExecutionSpace, class PoolIdsView, class RowOffsetsView,
          class CacheLengthsView, class OutView>
void expand_topk(ExecutionSpace const& space, PoolIdsView const& pool_ids,
                 RowOffsetsView const& row_offsets,
                 CacheLengthsView const& cache_lengths, int num_requests,
                 int kpool, bool tail_always, OutView const& out,
                 Options const& options = Options()) {
  KPOOL_IMPL_CHECK_VIEW(PoolIdsView, std::int32_t, 2, ExecutionSpace,
                        "pool_ids");
  KPOOL_IMPL_CHECK_VIEW(RowOffsetsView, std::uint32_t, 1, ExecutionSpace,
                        "row_offsets");
  KPOOL_IMPL_CHECK_VIEW(CacheLengthsView, std::uint32_t, 1, ExecutionSpace,
                        "cache_lengths");
  KPOOL_IMPL_CHECK_OUTPUT_VIEW(OutView, std::int32_t, 2, ExecutionSpace,
                               "out");

  Details::KokkosExt::ScopedProfileRegion region("KPool::expand_topk");
  Details::Checker const chk("KPool::expand_topk");
  if (kpool < 1)
    chk.fail_scalar("kpool", kpool,
                    "is not a valid kpool (K must be at least 1)");
  std::size_t const topk = pool_ids.extent(1);
  std::size_t const width =
      topk * static_cast<std::size_t>(kpool) + (tail_always ? kpool - 1 : 0);
  if (width > 0x7FFFFFFF)
    chk.fail("pool_ids", "extent 1", -1, std::to_string(topk),
             "times kpool is too wide an output");
  chk.extent_is("out", 0, out.extent(0), pool_ids.extent(0),
                "the token rows of pool_ids");
  chk.extent_is("out", 1, out.extent(1), width,
                "pool_topk * K (+ K - 1 with tail_always)");
  chk.batch_shape(row_offsets, cache_lengths, num_requests);
  if (options.validate)
    Details::check_ragged_batch(chk, space, row_offsets, cache_lengths,
                                static_cast<RowOffsetsView const*>(nullptr),
                                num_requests, pool_ids.extent(0), kpool, 0);
  if (width == 0) return;

  using M = typename ExecutionSpace::memory_space;
  Details::ExpandTopkFunctor<ExecutionSpace> f;
  f.pool_ids = Details::View2<const std::int32_t, M>(pool_ids);
  f.row_offsets = row_offsets;
  f.cache_lengths = cache_lengths;
  f.out = Details::View2<std::int32_t, M>(out);
  f.num_requests = num_requests;
  f.kpool = kpool;
  f.tail_always = tail_always;
  Details::LaunchShape const shape = Details::items_shape(
      chk, "pool_ids", space, f, pool_ids.extent(0), static_cast<int>(width), 1,
      options.team_size);
  Details::launch_items(space, "KPool::expand_topk", shape, f);
}

}  // namespace KPool

#endif
