#ifndef KPOOL_SEED_TAIL_HPP
#define KPOOL_SEED_TAIL_HPP

#include <KPool_Options.hpp>
#include <KPool_Types.hpp>
#include <details/KPool_DetailsCall.hpp>
#include <details/KPool_DetailsSeedTailFunctor.hpp>

#include <cstdint>

namespace KPool {

/// seed_tail (SEMANTICS.md): stash what stays incomplete after this call.
/// For request r with c = cache_lengths(r) and end = c + n, every position
/// pos in [max(floor(end / K) * K, c), end) has its key and gate row copied
/// to tail(slot_idx(r), 0 / 1, pos % K). Nothing else is written, so a
/// chunked prefill leaves the same ring as a single one.
///
/// tail [max_slots, 2, K, D] T, written; key, gate [T, D]; row_offsets
/// [B + 1], cache_lengths [B], slot_idx [B] uint32. K and D come from tail.
/// One launch.
template <class ExecutionSpace, class TailView, class KeyView, class GateView,
          class RowOffsetsView, class CacheLengthsView, class SlotView>
void seed_tail(ExecutionSpace const& space, TailView const& tail,
               KeyView const& key, GateView const& gate,
               RowOffsetsView const& row_offsets,
               CacheLengthsView const& cache_lengths, SlotView const& slot_idx,
               int num_requests, Options const& options = Options()) {
  using T = typename KeyView::non_const_value_type;
  static_assert(is_storage_type<T>::value,
                "KPool: key must hold float, double, KPool::bfloat16 or "
                "KPool::float16");
  KPOOL_IMPL_CHECK_OUTPUT_VIEW(TailView, T, 4, ExecutionSpace, "tail");
  KPOOL_IMPL_CHECK_VIEW(KeyView, T, 2, ExecutionSpace, "key");
  KPOOL_IMPL_CHECK_VIEW(GateView, T, 2, ExecutionSpace, "gate");
  KPOOL_IMPL_CHECK_VIEW(RowOffsetsView, std::uint32_t, 1, ExecutionSpace,
                        "row_offsets");
  KPOOL_IMPL_CHECK_VIEW(CacheLengthsView, std::uint32_t, 1, ExecutionSpace,
                        "cache_lengths");
  KPOOL_IMPL_CHECK_VIEW(SlotView, std::uint32_t, 1, ExecutionSpace,
                        "slot_idx");
  using M = typename ExecutionSpace::memory_space;

  Details::KokkosExt::ScopedProfileRegion region("KPool::seed_tail");
  Details::Checker const chk("KPool::seed_tail");
  int const K = static_cast<int>(tail.extent(2));
  int const D = static_cast<int>(tail.extent(3));
  chk.pool_shape(tail.extent(2), tail.extent(3), "tail", 2);
  // seed_tail reads no ape; a stand-in of the right shape keeps one set of
  // shape checks.
  Kokkos::View<const float**, Kokkos::LayoutRight, M,
               Kokkos::MemoryTraits<Kokkos::Unmanaged>> const no_ape(
      static_cast<float const*>(nullptr), K, D);
  auto call = Details::ragged_call<ExecutionSpace, T>(
      chk, key, gate, no_ape, row_offsets, cache_lengths, num_requests, K, D);
  Details::check_tail(chk, tail, K, D);
  Details::attach_slots(chk, call, slot_idx, static_cast<int>(tail.extent(0)));
  if (options.validate)
    Details::check_ragged_batch(chk, space, row_offsets, cache_lengths,
                                &slot_idx, num_requests, key.extent(0), K,
                                static_cast<int>(tail.extent(0)));

  Details::View4<T, M> const ring = tail;
  bool const contiguous =
      key.stride(1) == 1 && gate.stride(1) == 1 && ring.stride(3) == 1;
  bool const aligned =
      Details::rows_aligned(call.key.data(), call.key.stride(0), 16) &&
      Details::rows_aligned(call.gate.data(), call.gate.stride(0), 16) &&
      Details::ring_aligned(ring);
  Details::dispatch_path<ExecutionSpace, T>(K, D, contiguous, aligned,
                                            [&](auto path) {
    using P = decltype(path);
    using Writer = Details::RaggedWriter<ExecutionSpace, T, P, false>;
    Details::SeedTailFunctor<Writer> f{Details::ragged_writer<Writer>(call)};
    f.writer.tail = ring;
    Details::LaunchShape const shape = Details::items_shape(
        chk, "num_requests", space, f, static_cast<std::uint64_t>(num_requests),
        D, P::width, options.team_size);
    Details::launch_items(space, "KPool::seed_tail", shape, f);
  });
}

}  // namespace KPool

#endif
