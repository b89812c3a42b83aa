#ifndef KPOOL_POOL_COMPRESS_HPP
#define KPOOL_POOL_COMPRESS_HPP

#include <common/KPool_Batch.hpp>
#include <common/KPool_Options.hpp>
#include <common/KPool_Types.hpp>
#include <pool/detail/KPool_Call.hpp>
#include <pool/detail/KPool_OffsetsFunctor.hpp>
#include <pool/detail/KPool_WriterFunctors.hpp>

#include <algorithm>
#include <cstdint>
#include <string>

namespace KPool {
namespace Details {

// compute_pool_row_offsets' and compress's checks and launches, for
// their every form.

template <class ExecutionSpace, class RowOffsetsView, class CacheLengthsView,
          class PoolRowOffsetsView>
void compute_pool_row_offsets_impl(ExecutionSpace const& space,
                              RowOffsetsView const& row_offsets,
                              CacheLengthsView const& cache_lengths,
                              int num_requests, int kpool,
                              std::size_t key_rows,
                              PoolRowOffsetsView const& pool_row_offsets,
                              Options const& options) {
  KPOOL_IMPL_CHECK_VIEW(RowOffsetsView, std::uint32_t, 1, ExecutionSpace,
                        "row_offsets");
  KPOOL_IMPL_CHECK_VIEW(CacheLengthsView, std::uint32_t, 1, ExecutionSpace,
                        "cache_lengths");
  KPOOL_IMPL_CHECK_OUTPUT_VIEW(PoolRowOffsetsView, std::uint32_t, 1,
                               ExecutionSpace, "pool_row_offsets");
  using M = typename ExecutionSpace::memory_space;
  KokkosExt::ScopedProfileRegion region(
      "KPool::compute_pool_row_offsets");
  Checker const chk("KPool::compute_pool_row_offsets");
  if (kpool < 1)
    chk.fail_scalar("kpool", kpool,
                    "is not a valid kpool (K must be at least 1)");
  RaggedCall<ExecutionSpace, float> call;
  std::size_t const B = chk.batch_shape(row_offsets, cache_lengths, num_requests);
  chk.extent_is("pool_row_offsets", 0, pool_row_offsets.extent(0), B + 1,
                "B + 1 (the extent of row_offsets)");
  if (options.validate)
    check_ragged_batch(chk, space, row_offsets, cache_lengths,
                                static_cast<RowOffsetsView const*>(nullptr),
                                num_requests, key_rows, kpool, 0);
  call.batch.row_offsets = row_offsets;
  call.batch.cache_lengths = cache_lengths;
  call.batch.num_requests = num_requests;
  call.batch.kpool = kpool;
  call.batch.total_rows = key_rows;
  call.batch.max_slots = 0;
  call.batch.ring_length = kpool;  // no ring: the seed range is unused
  call.batch_size = static_cast<int>(B);
  launch_ragged_offsets<false>(
      space, "KPool::compute_pool_row_offsets", call,
      View1<std::uint32_t, M>(pool_row_offsets));
}

template <class ExecutionSpace, class KeyView, class GateView, class ApeView,
          class RowOffsetsView, class CacheLengthsView,
          class PoolRowOffsetsView, class PooledView>
void compress_impl(ExecutionSpace const& space, KeyView const& key,
              GateView const& gate, ApeView const& ape,
              RowOffsetsView const& row_offsets,
              CacheLengthsView const& cache_lengths, int num_requests,
              PoolRowOffsetsView const& pool_row_offsets,
              PooledView const& pooled, Options const& options) {
  using T = typename KeyView::non_const_value_type;
  static_cast<void>(ragged_views_ok<ExecutionSpace, T, KeyView, GateView,
                                              RowOffsetsView, CacheLengthsView>());
  KPOOL_IMPL_CHECK_VIEW(ApeView, float, 2, ExecutionSpace, "ape");
  KPOOL_IMPL_CHECK_OUTPUT_VIEW(PoolRowOffsetsView, std::uint32_t, 1,
                               ExecutionSpace, "pool_row_offsets");
  KPOOL_IMPL_CHECK_OUTPUT_VIEW(PooledView, T, 2, ExecutionSpace, "pooled");
  using M = typename ExecutionSpace::memory_space;

  Entry const chk("KPool::compress");
  auto call = ragged_call<ExecutionSpace, T>(chk, key, gate, ape, row_offsets,
                                                      cache_lengths, num_requests);
  int const K = call.batch.kpool, D = call.head_dim;
  chk.extent_is("pool_row_offsets", 0, pool_row_offsets.extent(0),
                call.batch_size + 1, "B + 1 (the extent of row_offsets)");
  chk.extent_is("pooled", 1, pooled.extent(1), D, "head_dim");
  if (options.validate) {
    auto const hb = check_ragged_batch(
        chk, space, row_offsets, cache_lengths,
        static_cast<RowOffsetsView const*>(nullptr), num_requests,
        key.extent(0), K, 0);
    chk.extent_at_least("pooled", 0, pooled.extent(0), hb.full_pools,
                        "pools this call produces");
  }

  View1<std::uint32_t, M> const offsets = pool_row_offsets;
  View2<T, M> const out = pooled;
  bool const contiguous = call.contiguous() && out.stride(1) == 1;
  bool const aligned =
      call.aligned() && rows_aligned(out.data(), out.stride(0), 16);
  dispatch_path<ExecutionSpace, T>(K, D, contiguous, aligned,
                                            [&](auto path) {
    using P = decltype(path);
    using Writer = RaggedWriter<ExecutionSpace, T, P, false>;
    CompressFunctor<Writer> f{ragged_writer<Writer>(call)};
    f.writer.out.set_pooled(out);
    f.writer.out.offsets = offsets;
    LaunchShape const shape = items_shape(
        chk, "key", space, f,
        std::min<std::size_t>(key.extent(0) / K, pooled.extent(0)), D,
        P::width, options.team_size);
    launch_ragged_offsets<false>(space, "KPool::compress::offsets",
                                          call, offsets);
    launch_items(space, "KPool::compress", shape, f);
  });
}

}  // namespace Details

/// Where compress puts each request's pools, computed alone, on the
/// device: the exclusive prefix sum over the requests of `full`, the pools
/// made entirely of the request's rows (docs/writers.md, "compress"), into
/// pool_row_offsets. pool_row_offsets(B) is the total; nothing waits for
/// the host, so deep_copy it if the host needs it (to size compress's
/// output, say). Requests at and past num_requests count zero, and so does
/// a request whose rows run past the key's (possible only with validation
/// off). K is ape's, as compress takes it.
///
/// @tparam ExecutionSpace a Kokkos execution space.
/// @param space the execution space instance the work is queued on.
/// @param key [total_tokens, D] T: the call's keys (only its rows are
/// read, as a count).
/// @param ape [K, D] float: K is its extent 0.
/// @param batch a ragged batch (slot_idx not read): request r owns token
/// rows [row_offsets(r), row_offsets(r + 1)) at positions
/// cache_lengths(r) + i.
/// @param pool_row_offsets [B + 1] uint32, written.
/// @param options `validate` (data checks of row_offsets and
/// cache_lengths) and `team_size`.
/// @throws KPool::InvalidArgument (argument "batch") for a decode batch;
/// for mismatched extents (always), or bad row_offsets or cache_lengths
/// (with options.validate). Nothing has been written then.
/// @par Launches and synchronization
/// One launch on `space`. With options.validate, first fences `space` and
/// copies row_offsets and cache_lengths (live rows) to the host.
template <class ExecutionSpace, class KeyView, class ApeView, class MemorySpace,
          class PoolRowOffsetsView>
void compute_pool_row_offsets(ExecutionSpace const& space, KeyView const& key,
                              ApeView const& ape, Batch<MemorySpace> const& batch,
                              PoolRowOffsetsView const& pool_row_offsets,
                              Options const& options = Options()) {
  KPOOL_IMPL_CHECK_VIEW(ApeView, float, 2, ExecutionSpace, "ape");
  static_assert(Details::view_facts<KeyView>::is_view && Details::view_facts<KeyView>::rank == 2,
                "KPool: 'key' must be a [total_tokens, D] View (rank 2)");
  Details::writer_batch_ok("KPool::compute_pool_row_offsets", batch,
                           Batch<MemorySpace>::Kind::ragged, false);
  Details::compute_pool_row_offsets_impl(space, batch.row_offsets, batch.cache_lengths,
                                         batch.num_requests, static_cast<int>(ape.extent(0)),
                                         key.extent(0), pool_row_offsets, options);
}

/// Every pool made entirely of this call's rows (docs/writers.md,
/// "compress"). For request r with c = cache_lengths(r) and n rows, the
/// pools first = ceil(c / K) up to floor((c + n) / K) - 1, each from K
/// consecutive rows starting (K - c % K) % K rows in; request r's pool
/// first + j goes to row pool_row_offsets(r) + j of pooled. The ring is
/// neither read nor written, so compress alone serves a one-shot prefill
/// (or a reference for the steps).
///
/// Every View is a Kokkos::View in ExecutionSpace::memory_space, of any
/// layout Kokkos can view as LayoutStride (LayoutRight, LayoutLeft,
/// LayoutStride); ranks and element types are checked at compile time.
///
/// @tparam ExecutionSpace a Kokkos execution space.
/// @param space the execution space instance the work is queued on.
/// @param key [total_tokens, D] T (float, double, bfloat16, float16).
/// @param gate [total_tokens, D] T (the two halves of one
/// [total_tokens, 2D] buffer work).
/// @param ape [K, D] float; K and D are taken from it.
/// @param batch a ragged batch (slot_idx not read): request r owns token
/// rows [row_offsets(r), row_offsets(r + 1)) at positions
/// cache_lengths(r) + i.
/// @param pool_row_offsets [B + 1] uint32, written: where request r's pools
/// start; pool_row_offsets(B) is their number.
/// @param pooled [>= pools, D] T, written: the pools, request by request.
/// floor(total_tokens / K) rows always suffice. With validation off, pools
/// past its rows are dropped, never written out of bounds.
/// @param options `validate` (data checks, including that pooled has a row
/// for every pool) and `team_size`; `fused` unused.
/// @throws KPool::InvalidArgument (argument "batch") for a decode batch;
/// for mismatched shapes (always) or bad index data, a sequence passing
/// 2^31 - 1 positions, or too few rows in pooled (with options.validate).
/// Nothing has been written then.
/// @par Launches and synchronization
/// Two launches on `space`: the offset scan, then the pools. With
/// options.validate, first fences `space` and copies row_offsets and
/// cache_lengths (live rows) to the host.
template <class ExecutionSpace, class KeyView, class GateView, class ApeView,
          class MemorySpace, class PoolRowOffsetsView, class PooledView>
void compress(ExecutionSpace const& space, KeyView const& key, GateView const& gate,
              ApeView const& ape, Batch<MemorySpace> const& batch,
              PoolRowOffsetsView const& pool_row_offsets, PooledView const& pooled,
              Options const& options = Options()) {
  Details::writer_batch_ok("KPool::compress", batch, Batch<MemorySpace>::Kind::ragged, false);
  Details::compress_impl(space, key, gate, ape, batch.row_offsets, batch.cache_lengths,
                         batch.num_requests, pool_row_offsets, pooled, options);
}

}  // namespace KPool

#endif
