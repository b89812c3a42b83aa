#ifndef KPOOL_COMPRESS_HPP
#define KPOOL_COMPRESS_HPP

#include <KPool_Options.hpp>
#include <KPool_Types.hpp>
#include <details/KPool_DetailsCall.hpp>
#include <details/KPool_DetailsCompressFunctor.hpp>
#include <details/KPool_DetailsOffsetsFunctor.hpp>

#include <algorithm>
#include <cstdint>
#include <string>

namespace KPool {

/// Exclusive prefix sum of each request's compress pool count (`full`,
/// SEMANTICS.md) into pool_row_offsets [B + 1], computed on the device with
/// no host synchronization; pool_row_offsets(B) is the total. Requests at
/// and past num_requests count zero, and so does a request whose rows run
/// past key_rows (only possible with validation off).
template <class ExecutionSpace, class RowOffsetsView, class CacheLengthsView,
          class PoolRowOffsetsView>
void compute_pool_row_offsets(ExecutionSpace const& space,
                              RowOffsetsView const& row_offsets,
                              CacheLengthsView const& cache_lengths,
                              int num_requests, int kpool,
                              std::size_t key_rows,
                              PoolRowOffsetsView const& pool_row_offsets,
                              Options const& options = Options()) {
  KPOOL_IMPL_CHECK_VIEW(RowOffsetsView, std::uint32_t, 1, ExecutionSpace,
                        "row_offsets");
  KPOOL_IMPL_CHECK_VIEW(CacheLengthsView, std::uint32_t, 1, ExecutionSpace,
                        "cache_lengths");
  KPOOL_IMPL_CHECK_OUTPUT_VIEW(PoolRowOffsetsView, std::uint32_t, 1,
                               ExecutionSpace, "pool_row_offsets");
  using M = typename ExecutionSpace::memory_space;
  Details::KokkosExt::ScopedProfileRegion region(
      "KPool::compute_pool_row_offsets");
  Details::Checker const chk("KPool::compute_pool_row_offsets");
  if (kpool < 1)
    chk.fail_scalar("kpool", kpool,
                    "is not a valid kpool (K must be at least 1)");
  Details::RaggedCall<ExecutionSpace, float> call;
  std::size_t const B = chk.batch_shape(row_offsets, cache_lengths, num_requests);
  chk.extent_is("pool_row_offsets", 0, pool_row_offsets.extent(0), B + 1,
                "B + 1 (the extent of row_offsets)");
  if (options.validate)
    Details::check_ragged_batch(chk, space, row_offsets, cache_lengths,
                                static_cast<RowOffsetsView const*>(nullptr),
                                num_requests, key_rows, kpool, 0);
  call.batch.row_offsets = row_offsets;
  call.batch.cache_lengths = cache_lengths;
  call.batch.num_requests = num_requests;
  call.batch.kpool = kpool;
  call.batch.total_rows = key_rows;
  call.batch.max_slots = 0;
  call.batch_size = static_cast<int>(B);
  Details::launch_ragged_offsets<false>(
      space, "KPool::compute_pool_row_offsets", call,
      Details::View1<std::uint32_t, M>(pool_row_offsets));
}

/// compress (SEMANTICS.md): every pool made entirely of this call's rows.
///
/// key, gate     [T, D] storage type T (float, double, bfloat16, float16),
///               any layout (the two halves of one [T, 2D] buffer work)
/// ape           [K, D] float; K and D are taken from it
/// row_offsets   [B + 1] uint32, cache_lengths [B] uint32
/// pool_row_offsets [B + 1] uint32, written: where request r's pools start
/// pooled        [>= pools, D] T, written: request r's pool j is row
///               pool_row_offsets(r) + j, pool id ceil(c / K) + j
///
/// Two launches on `space` (the offset scan, then the pools); with
/// options.validate, the per-request arrays are first copied to the host.
template <class ExecutionSpace, class KeyView, class GateView, class ApeView,
          class RowOffsetsView, class CacheLengthsView,
          class PoolRowOffsetsView, class PooledView>
void compress(ExecutionSpace const& space, KeyView const& key,
              GateView const& gate, ApeView const& ape,
              RowOffsetsView const& row_offsets,
              CacheLengthsView const& cache_lengths, int num_requests,
              PoolRowOffsetsView const& pool_row_offsets,
              PooledView const& pooled, Options const& options = Options()) {
  using T = typename KeyView::non_const_value_type;
  static_assert(is_storage_type<T>::value,
                "KPool: key must hold float, double, KPool::bfloat16 or "
                "KPool::float16");
  KPOOL_IMPL_CHECK_VIEW(KeyView, T, 2, ExecutionSpace, "key");
  KPOOL_IMPL_CHECK_VIEW(GateView, T, 2, ExecutionSpace, "gate");
  KPOOL_IMPL_CHECK_VIEW(ApeView, float, 2, ExecutionSpace, "ape");
  KPOOL_IMPL_CHECK_VIEW(RowOffsetsView, std::uint32_t, 1, ExecutionSpace,
                        "row_offsets");
  KPOOL_IMPL_CHECK_VIEW(CacheLengthsView, std::uint32_t, 1, ExecutionSpace,
                        "cache_lengths");
  KPOOL_IMPL_CHECK_OUTPUT_VIEW(PoolRowOffsetsView, std::uint32_t, 1,
                               ExecutionSpace, "pool_row_offsets");
  KPOOL_IMPL_CHECK_OUTPUT_VIEW(PooledView, T, 2, ExecutionSpace, "pooled");
  using M = typename ExecutionSpace::memory_space;

  Details::KokkosExt::ScopedProfileRegion region("KPool::compress");
  Details::Checker const chk("KPool::compress");
  int const K = static_cast<int>(ape.extent(0));
  int const D = static_cast<int>(ape.extent(1));
  auto call = Details::ragged_call<ExecutionSpace, T>(
      chk, key, gate, ape, row_offsets, cache_lengths, num_requests, K, D);
  chk.extent_is("pool_row_offsets", 0, pool_row_offsets.extent(0),
                call.batch_size + 1, "B + 1 (the extent of row_offsets)");
  chk.extent_is("pooled", 1, pooled.extent(1), D, "head_dim");
  if (options.validate) {
    auto const hb = Details::check_ragged_batch(
        chk, space, row_offsets, cache_lengths,
        static_cast<RowOffsetsView const*>(nullptr), num_requests,
        key.extent(0), K, 0);
    chk.extent_at_least("pooled", 0, pooled.extent(0), hb.full_pools,
                        "pools this call produces");
  }

  Details::View1<std::uint32_t, M> const offsets = pool_row_offsets;
  Details::View2<T, M> const out = pooled;
  bool const contiguous = call.contiguous() && out.stride(1) == 1;
  bool const aligned =
      call.aligned() && Details::rows_aligned(out.data(), out.stride(0), 16);
  Details::dispatch_path<ExecutionSpace, T>(K, D, contiguous, aligned,
                                            [&](auto path) {
    using P = decltype(path);
    using Writer = Details::RaggedWriter<ExecutionSpace, T, P, false>;
    Details::CompressFunctor<Writer> f{Details::ragged_writer<Writer>(call)};
    f.writer.out.set_pooled(out);
    f.writer.out.offsets = offsets;
    Details::LaunchShape const shape = Details::items_shape(
        chk, "key", space, f,
        std::min<std::size_t>(key.extent(0) / K, pooled.extent(0)), D,
        P::width, options.team_size);
    Details::launch_ragged_offsets<false>(space, "KPool::compress::offsets",
                                          call, offsets);
    Details::launch_items(space, "KPool::compress", shape, f);
  });
}

}  // namespace KPool

#endif
