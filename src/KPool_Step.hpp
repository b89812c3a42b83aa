#ifndef KPOOL_STEP_HPP
#define KPOOL_STEP_HPP

#include <KPool_Options.hpp>
#include <KPool_Ring.hpp>
#include <KPool_TailUpdate.hpp>
#include <KPool_Types.hpp>
#include <details/KPool_DetailsCall.hpp>
#include <details/KPool_DetailsCompressFunctor.hpp>
#include <details/KPool_DetailsFusedStepFunctor.hpp>
#include <details/KPool_DetailsOffsetsFunctor.hpp>
#include <details/KPool_DetailsRingCloseFunctor.hpp>
#include <details/KPool_DetailsSeedTailFunctor.hpp>
#include <details/KPool_DetailsTailUpdateFunctor.hpp>

#include <algorithm>
#include <cstdint>
#include <string>

namespace KPool {

/// Every pool a step closed, compacted on the device. Allocate once, at the
/// largest call you will make, and reuse: the steps allocate nothing.
/// After a step with batch size B, rows [0, count) hold the pools, request
/// r's at rows [offsets(r), offsets(r + 1)) in pool order (its ring_close
/// pool first); count is offsets(B), on the device, so nothing waits for
/// the host.
template <class T, class MemorySpace =
                       Kokkos::DefaultExecutionSpace::memory_space>
class StepOutput {
 public:
  using pooled_type = Kokkos::View<T**, Kokkos::LayoutRight, MemorySpace>;
  using index_type = Kokkos::View<std::int32_t*, MemorySpace>;
  using offsets_type = Kokkos::View<std::uint32_t*, MemorySpace>;
  using count_type = Kokkos::Subview<offsets_type, std::size_t>;

  /// Rows a call can need, known without reading device data: at most
  /// floor(total_tokens / K) pools are made of new rows only, plus one
  /// ring_close pool per request (SEMANTICS.md).
  static std::size_t capacity_for(std::size_t total_tokens, int batch,
                                  int kpool) {
    return total_tokens / static_cast<std::size_t>(kpool) +
           static_cast<std::size_t>(batch);
  }

  StepOutput() = default;

  template <class ExecutionSpace>
  StepOutput(ExecutionSpace const& space, std::size_t capacity, int max_batch,
             int head_dim)
      : pooled_(Kokkos::view_alloc(space, Kokkos::WithoutInitializing,
                                   "KPool::StepOutput::pooled"),
                capacity, head_dim),
        batch_row_(Kokkos::view_alloc(space, Kokkos::WithoutInitializing,
                                      "KPool::StepOutput::batch_row"),
                   capacity),
        pool_id_(Kokkos::view_alloc(space, Kokkos::WithoutInitializing,
                                    "KPool::StepOutput::pool_id"),
                 capacity),
        offsets_(Kokkos::view_alloc(space, "KPool::StepOutput::offsets"),
                 static_cast<std::size_t>(max_batch) + 1),
        count_(Kokkos::subview(offsets_, std::size_t(0))) {}

  /// [capacity, D]: the pooled keys.
  pooled_type const& pooled() const { return pooled_; }
  /// [capacity]: the batch row each pool came from.
  index_type const& batch_row() const { return batch_row_; }
  /// [capacity]: each pool's id (its first position / K).
  index_type const& pool_id() const { return pool_id_; }
  /// [max_batch + 1]: where each request's pools start.
  offsets_type const& offsets() const { return offsets_; }
  /// 0-d: how many pools the last call closed, on the device.
  count_type const& count() const { return count_; }

  std::size_t capacity() const { return pooled_.extent(0); }
  int max_batch() const { return static_cast<int>(offsets_.extent(0)) - 1; }
  int head_dim() const { return static_cast<int>(pooled_.extent(1)); }

  // Used by the steps: the call's offsets [0, B] and where its count lands.
  offsets_type begin_call(int batch) {
    count_ = Kokkos::subview(offsets_, static_cast<std::size_t>(batch));
    return Kokkos::subview(
        offsets_, std::make_pair(std::size_t(0), static_cast<std::size_t>(batch) + 1));
  }

 private:
  pooled_type pooled_;
  index_type batch_row_;
  index_type pool_id_;
  offsets_type offsets_;
  count_type count_;
};

namespace Details {

template <class T, class M>
PoolSink<T> step_sink(StepOutput<T, M> const& out,
                      View1<const std::uint32_t, M> const& offsets) {
  PoolSink<T> s;
  s.set_pooled(out.pooled());
  s.batch_row = out.batch_row();
  s.pool_id = out.pool_id();
  s.offsets = offsets;
  return s;
}

template <class T, class M>
void check_step_output(Checker const& chk, StepOutput<T, M> const& out,
                       std::size_t batch, int head_dim, std::size_t needed,
                       std::string const& why) {
  if (out.max_batch() < 0)
    chk.fail("out", "", -1, "an empty StepOutput",
             "has no storage (construct it with a capacity)");
  if (static_cast<std::size_t>(out.max_batch()) < batch)
    chk.fail("out", "max_batch", -1, std::to_string(out.max_batch()),
             "is less than the batch size B = " + std::to_string(batch));
  chk.extent_is("out", 1, out.pooled().extent(1), head_dim, "head_dim");
  chk.extent_at_least("out", 0, out.capacity(), needed, why);
}

}  // namespace Details

/// The general serving step (SEMANTICS.md, "Order within one call"): per
/// request ring_close, then compress, then seed_tail, for a batch mixing
/// fresh prefills, chunk continuations, zero-token rows and single-token
/// decodes. Every pool whose last member arrived in this call lands in
/// `out`, compacted (see StepOutput). All work is queued on `space`; with
/// options.validate off nothing waits for the host, so the step can be
/// captured in a CUDA graph.
///
/// options.fused: one launch for the three writers (the default) or three;
/// both give the same bits. Either way an offset scan runs first.
template <class ExecutionSpace, class T, class MemorySpace, class KeyView,
          class GateView, class ApeView, class RowOffsetsView,
          class CacheLengthsView, class SlotView>
void step(ExecutionSpace const& space, Ring<T, MemorySpace>& ring,
          KeyView const& key, GateView const& gate, ApeView const& ape,
          RowOffsetsView const& row_offsets,
          CacheLengthsView const& cache_lengths, SlotView const& slot_idx,
          int num_requests, StepOutput<T, MemorySpace>& out,
          Options const& options = Options()) {
  static_assert(std::is_same<MemorySpace,
                             typename ExecutionSpace::memory_space>::value,
                "KPool::step: the ring and the output must live in the "
                "execution space's memory space");
  KPOOL_IMPL_CHECK_VIEW(KeyView, T, 2, ExecutionSpace, "key");
  KPOOL_IMPL_CHECK_VIEW(GateView, T, 2, ExecutionSpace, "gate");
  KPOOL_IMPL_CHECK_VIEW(ApeView, float, 2, ExecutionSpace, "ape");
  KPOOL_IMPL_CHECK_VIEW(RowOffsetsView, std::uint32_t, 1, ExecutionSpace,
                        "row_offsets");
  KPOOL_IMPL_CHECK_VIEW(CacheLengthsView, std::uint32_t, 1, ExecutionSpace,
                        "cache_lengths");
  KPOOL_IMPL_CHECK_VIEW(SlotView, std::uint32_t, 1, ExecutionSpace,
                        "slot_idx");
  using M = MemorySpace;

  Details::KokkosExt::ScopedProfileRegion region("KPool::step");
  Details::Checker const chk("KPool::step");
  int const K = static_cast<int>(ape.extent(0));
  int const D = static_cast<int>(ape.extent(1));
  auto call = Details::ragged_call<ExecutionSpace, T>(
      chk, key, gate, ape, row_offsets, cache_lengths, num_requests, K, D);
  Details::check_tail(chk, ring.tail(), K, D);
  Details::attach_slots(chk, call, slot_idx, ring.max_slots());
  std::size_t const bound =
      StepOutput<T, M>::capacity_for(key.extent(0), num_requests, K);
  Details::check_step_output(
      chk, out, static_cast<std::size_t>(call.batch_size), D, bound,
      "rows this step may need (floor(key rows / K) + num_requests)");
  if (options.validate)
    Details::check_ragged_batch(chk, space, row_offsets, cache_lengths,
                                &slot_idx, num_requests, key.extent(0), K,
                                ring.max_slots());

  Details::View1<const std::uint32_t, M> const offsets =
      out.begin_call(call.batch_size);
  auto const sink = Details::step_sink(out, offsets);
  Details::View4<T, M> const tail = ring.tail();
  bool const contiguous = call.contiguous();
  bool const aligned = call.aligned() &&
                       Details::rows_aligned(out.pooled().data(), D, 16) &&
                       Details::ring_aligned(tail);
  std::uint64_t const requests = static_cast<std::uint64_t>(num_requests);
  std::uint64_t const rows = std::min<std::uint64_t>(bound, out.capacity());
  Details::dispatch_path<ExecutionSpace, T>(K, D, contiguous, aligned,
                                            [&](auto path) {
    using P = decltype(path);
    using Writer = Details::RaggedWriter<ExecutionSpace, T, P, true>;
    Writer writer = Details::ragged_writer<Writer>(call);
    writer.tail = tail;
    writer.out = sink;
    // Every launch is planned (and its size checked) before the first is
    // queued, so a call that throws has written nothing.
    if (options.fused) {
      Details::FusedStepFunctor<Writer> f{writer};
      Details::TeamShape const s =
          Details::team_shape(space, f, D, P::width, options.team_size);
      f.items_per_team = s.items_per_team;
      f.request_teams =
          Details::league_for(chk, "num_requests", requests, s.items_per_team);
      std::uint64_t const league =
          static_cast<std::uint64_t>(f.request_teams) +
          static_cast<std::uint64_t>(
              Details::league_for(chk, "out", rows, s.items_per_team));
      if (league > 0x7FFFFFFFull)
        chk.fail("out", "", -1, std::to_string(rows),
                 "rows and num_requests = " + std::to_string(num_requests) +
                     " are more teams together than one launch takes "
                     "(2^31 - 1)");
      Details::LaunchShape shape;
      shape.league = static_cast<int>(league);
      shape.team_size = s.team_size;
      shape.lanes = s.lanes;
      shape.items_per_team = s.items_per_team;
      Details::launch_ragged_offsets<true>(
          space, "KPool::step::offsets", call,
          Details::View1<std::uint32_t, M>(out.offsets()));
      Details::launch(space, "KPool::step::fused", shape, f);
    } else {
      Details::RingCloseFunctor<Writer> close{writer};
      Details::CompressFunctor<Writer> pools{writer};
      Details::SeedTailFunctor<Writer> seed{writer};
      Details::LaunchShape const close_shape = Details::items_shape(
          chk, "num_requests", space, close, requests, D, P::width,
          options.team_size);
      Details::LaunchShape const pools_shape = Details::items_shape(
          chk, "out", space, pools, rows, D, P::width, options.team_size);
      Details::LaunchShape const seed_shape = Details::items_shape(
          chk, "num_requests", space, seed, requests, D, P::width,
          options.team_size);
      Details::launch_ragged_offsets<true>(
          space, "KPool::step::offsets", call,
          Details::View1<std::uint32_t, M>(out.offsets()));
      // ring_close reads ring entries seed_tail overwrites; launches on one
      // execution space instance run in order.
      Details::launch_items(space, "KPool::step::ring_close", close_shape, close);
      Details::launch_items(space, "KPool::step::compress", pools_shape, pools);
      Details::launch_items(space, "KPool::step::seed_tail", seed_shape, seed);
    }
  });
}

/// The decode step: tail_update for every row, with the closed pools
/// compacted into `out` like KPool::step's (request r's at rows
/// [offsets(r), offsets(r + 1)), count on the device). Two launches: the
/// offset scan and tail_update. key, gate [B, next_n, D]; positions
/// [B, next_n] int32, negative marks a padded entry.
template <class ExecutionSpace, class T, class MemorySpace, class KeyView,
          class GateView, class ApeView, class PositionsView, class SlotView>
void decode_step(ExecutionSpace const& space, Ring<T, MemorySpace>& ring,
                 KeyView const& key, GateView const& gate, ApeView const& ape,
                 PositionsView const& positions, SlotView const& slot_idx,
                 int num_requests, StepOutput<T, MemorySpace>& out,
                 Options const& options = Options()) {
  static_assert(std::is_same<MemorySpace,
                             typename ExecutionSpace::memory_space>::value,
                "KPool::decode_step: the ring and the output must live in "
                "the execution space's memory space");
  KPOOL_IMPL_CHECK_VIEW(KeyView, T, 3, ExecutionSpace, "key");
  KPOOL_IMPL_CHECK_VIEW(GateView, T, 3, ExecutionSpace, "gate");
  KPOOL_IMPL_CHECK_VIEW(ApeView, float, 2, ExecutionSpace, "ape");
  KPOOL_IMPL_CHECK_VIEW(PositionsView, std::int32_t, 2, ExecutionSpace,
                        "positions");
  KPOOL_IMPL_CHECK_VIEW(SlotView, std::uint32_t, 1, ExecutionSpace,
                        "slot_idx");
  using M = MemorySpace;

  Details::KokkosExt::ScopedProfileRegion region("KPool::decode_step");
  Details::Checker const chk("KPool::decode_step");
  Details::check_decode_shapes(chk, key, gate, ape, positions, ring.tail(),
                               num_requests);
  int const K = static_cast<int>(ape.extent(0));
  int const D = static_cast<int>(ape.extent(1));
  std::size_t const B = positions.extent(0);
  std::size_t const next_n = positions.extent(1);
  chk.extent_is("slot_idx", 0, slot_idx.extent(0), B,
                "the batch size B (positions is [B, next_n])");
  Details::check_step_output(
      chk, out, B, D,
      static_cast<std::size_t>(num_requests) * ((next_n + K - 1) / K),
      "rows this step may need (num_requests * ceil(next_n / K))");
  if (options.validate)
    Details::check_decode_batch(chk, space, positions, slot_idx, num_requests,
                                K, ring.max_slots());

  Details::View1<const std::uint32_t, M> const offsets =
      out.begin_call(static_cast<int>(B));
  Details::View4<T, M> const tail = ring.tail();
  Details::View3<const T, M> const k = key;
  Details::View3<const T, M> const g = gate;
  Details::View2<const float, M> const a = ape;
  bool const contiguous =
      k.stride(2) == 1 && g.stride(2) == 1 && a.stride(1) == 1;
  bool const aligned =
      Details::decode_aligned<ExecutionSpace, T, M>(k, g, a, tail) &&
      Details::rows_aligned(out.pooled().data(), D, 16);
  Details::dispatch_path<ExecutionSpace, T>(K, D, contiguous, aligned,
                                            [&](auto path) {
    using P = decltype(path);
    Details::TailUpdateFunctor<ExecutionSpace, T, P, true> f;
    f.tail = tail;
    f.key = k;
    f.gate = g;
    f.ape = Details::ape_source(a);
    f.positions = positions;
    f.slot_idx = slot_idx;
    f.out = Details::step_sink(out, offsets);
    f.num_requests = num_requests;
    f.next_n = static_cast<int>(next_n);
    f.kpool = K;
    f.head_dim = D;
    f.max_slots = ring.max_slots();
    Details::LaunchShape const shape = Details::items_shape(
        chk, "num_requests", space, f, static_cast<std::uint64_t>(num_requests),
        D, P::width, options.team_size);
    Details::launch_offsets_scan(
        space, "KPool::decode_step::offsets",
        Details::DecodePoolCount<M>{positions, slot_idx, num_requests, K,
                                    ring.max_slots()},
        Details::View1<std::uint32_t, M>(out.offsets()), static_cast<int>(B));
    Details::launch_items(space, "KPool::decode_step::tail_update", shape, f);
  });
}

}  // namespace KPool

#endif
