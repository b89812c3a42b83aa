#ifndef KPOOL_POOL_DETAIL_STEP_CALL_HPP
#define KPOOL_POOL_DETAIL_STEP_CALL_HPP

// What step and decode_step do between their signatures and their
// launches: the checks of the ring, the output and the cache, the cache
// path, and the launches themselves (step_impl, decode_step_impl).

#include <cache/KPool_PoolCache.hpp>
#include <common/KPool_Float8.hpp>
#include <common/KPool_Options.hpp>
#include <common/KPool_Types.hpp>
#include <pool/KPool_Ring.hpp>
#include <pool/KPool_StepOutput.hpp>
#include <pool/KPool_TailUpdate.hpp>
#include <common/detail/KPool_CacheFunctors.hpp>
#include <common/detail/KPool_CachePath.hpp>
#include <common/detail/KPool_CacheWrite.hpp>
#include <pool/detail/KPool_Call.hpp>
#include <pool/detail/KPool_OffsetsFunctor.hpp>
#include <pool/detail/KPool_TailUpdateFunctor.hpp>
#include <pool/detail/KPool_WriterFunctors.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace KPool {
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

// With validation: each live row that sends a position starts its slot's
// sequence where the slot can serve it (check_slot_starts).
template <class ExecutionSpace, class T, class M>
void check_ring_starts(Checker const& chk, ExecutionSpace const& space, Ring<T, M> const& ring,
                       std::vector<RingRestart> const& restarts, char const* argument) {
  check_slot_starts(chk, space, ring.state(), ring.kpool(), ring.ring_length(), restarts,
                    argument);
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

// The cache a step writes: none (NoCacheArg), or a PoolCache and the
// call's block table. Path: where the pools are written
// (common/detail/KPool_CachePath.hpp); the public steps leave it automatic, tests
// force each path.
struct NoCacheArg {
  static constexpr bool enabled = false;
  static constexpr CacheWritePath path = CacheWritePath::automatic;
};
template <class C, class M, class BlockTable,
          CacheWritePath Path = CacheWritePath::automatic>
struct CacheArg {
  static constexpr bool enabled = true;
  static constexpr CacheWritePath path = Path;
  PoolCache<C, M> const* cache;
  BlockTable const* block_table;
};

// Whether a cached step of ExecutionSpace, pools of T, items Items writes
// its cache by a second launch (false without a cache).
template <class ExecutionSpace, class T, CacheItems Items, class Arg>
constexpr bool cache_second_pass() {
  if constexpr (Arg::enabled)
    return cache_write_path<ExecutionSpace, T, Items, Arg::path>() ==
           CacheWritePath::second_pass;
  else
    return false;
}

// The compile-time checks of the steps' arguments, shared by the overloads
// with and without a cache.
// Each returns whether every check holds; the entry points skip their body
// otherwise (`if constexpr`), so one static_assert is the only error.
// The ring, the output and the cache live in the execution space's memory
// space M.
template <class ExecutionSpace, class M>
constexpr bool step_space_ok() {
  static_assert(std::is_same<M, typename ExecutionSpace::memory_space>::value,
                "KPool::step: the ring, the output and the cache must live in the "
                "execution space's memory space");
  return std::is_same<M, typename ExecutionSpace::memory_space>::value;
}

template <class ExecutionSpace, class M, class T, class KeyView, class GateView,
          class ApeView, class RowOffsetsView, class CacheLengthsView,
          class SlotView>
constexpr bool check_step_views() {
  return step_space_ok<ExecutionSpace, M>() && ragged_views_ok<ExecutionSpace, T, KeyView, GateView, RowOffsetsView,
                         CacheLengthsView>() &&
         KPOOL_IMPL_VIEW_OK(ApeView, float, 2, ExecutionSpace, "ape") &&
         KPOOL_IMPL_VIEW_OK(SlotView, std::uint32_t, 1, ExecutionSpace, "slot_idx");
}

template <class ExecutionSpace, class M, class T, class KeyView, class GateView,
          class ApeView, class PositionsView, class SlotView>
constexpr bool check_decode_views() {
  return step_space_ok<ExecutionSpace, M>() && decode_views_ok<ExecutionSpace, T, KeyView, GateView, PositionsView,
                         SlotView>() &&
         KPOOL_IMPL_VIEW_OK(ApeView, float, 2, ExecutionSpace, "ape");
}

// A cache of element type C for pools of T, and its block table.
template <class ExecutionSpace, class T, class C, class BlockTableView>
constexpr bool check_cache_arg() {
  static_assert(std::is_same<C, T>::value || std::is_same<C, float8_e4m3>::value,
                "KPool: a cache holds the pools' own storage type (native) "
                "or KPool::float8_e4m3");
  return (std::is_same<C, T>::value || std::is_same<C, float8_e4m3>::value) &&
         KPOOL_IMPL_VIEW_OK(BlockTableView, std::int32_t, 2, ExecutionSpace,
                            "block_table");
}

// Shapes of a step's cache, checked always: the cache has storage, D the
// call's, fp8 only for pools that are not f64, rotation only for D a
// power of two, K the ring's, the block table
// a row per live request (as the selections take it), and `slots` pools
// (what one work item may stage) fit a team's scratch.
template <class ExecutionSpace, class T, class Arg>
void check_step_cache(Checker const& chk, ExecutionSpace const& space,
                      Arg const& arg, int kpool, int head_dim,
                      std::size_t live_rows, int slots) {
  if constexpr (Arg::enabled) {
    if (arg.cache->is_allocated() && arg.cache->kpool() != kpool)
      chk.fail("cache", "kpool", -1, std::to_string(arg.cache->kpool()),
               "does not match the kpool of the ring = " +
                   std::to_string(kpool) + " (the K the cache was built for)");
    check_cache_shapes<ExecutionSpace, T>(chk, space, *arg.cache,
                                          *arg.block_table, head_dim, live_rows);
    std::size_t max_bytes = 0;
    if (!cache_scratch_fits<ExecutionSpace, accumulator_t<T>>(
            space, head_dim, slots, &max_bytes))
      chk.fail("cache", "extent 2", -1, std::to_string(head_dim),
               "is a head_dim whose " + std::to_string(slots) +
                   " pools a row does not fit the " + std::to_string(max_bytes) +
                   " bytes of team scratch this execution space offers");
  } else {
    (void)chk, (void)space, (void)arg, (void)kpool, (void)head_dim,
        (void)live_rows, (void)slots;
  }
}

// With validation: every pool [first, end) row r writes has its block
// (docs/indexer.md, "Bad input"), read from the block table on the host.
template <class ExecutionSpace, class Arg>
void check_step_blocks(
    Checker const& chk, ExecutionSpace const& space, Arg const& arg,
    std::vector<std::pair<std::int64_t, std::int64_t>> const& pools) {
  if constexpr (Arg::enabled) {
    HostBlockTable const table =
        host_block_table(space, *arg.block_table, pools.size());
    for (std::size_t r = 0; r < pools.size(); ++r)
      check_pool_blocks(chk, table, static_cast<std::int64_t>(r),
                        pools[r].first, pools[r].second,
                        arg.cache->num_blocks(), arg.cache->block_pools(), "written",
                        arg.cache->shard());
  } else {
    (void)chk, (void)space, (void)arg, (void)pools;
  }
}

// The CacheTarget of a step's cache argument (Arg enabled).
template <class T, class Arg>
auto arg_cache_target(Arg const& arg) {
  return cache_target<typename std::remove_cv_t<
                          std::remove_pointer_t<decltype(arg.cache)>>::value_type,
                      accumulator_t<T>>(*arg.cache, *arg.block_table);
}

// What a step functor carries of the cache: the CacheTarget when it writes
// the cache in the step, NoCache without a cache or when a second pass
// writes it.
template <class T, bool SecondPass, class Arg>
auto step_cache_target(Arg const& arg) {
  if constexpr (Arg::enabled && !SecondPass)
    return arg_cache_target<T>(arg);
  else
    return NoCache();
}

// The second pass of a cached step, planned before anything is queued:
// store_pools' launch over the output's first `rows` rows (the step's
// bound on its count; the count itself read on the device). A no-op
// without one.
struct NoCachePass {
  template <class ExecutionSpace>
  void operator()(ExecutionSpace const&, std::string const&) const {}
};

template <class ExecutionSpace, class T, bool SecondPass, class M, class Arg>
auto plan_cache_pass(Checker const& chk, ExecutionSpace const& space,
                     StepOutput<T, M> const& out, Arg const& arg,
                     std::uint64_t rows, int team_size) {
  if constexpr (SecondPass)
    return plan_store_pools<ExecutionSpace, T>(
        chk, "out", space, out.pooled(), out.batch_row(), out.pool_id(),
        out.count().data(), rows, arg_cache_target<T>(arg), team_size);
  else {
    (void)chk, (void)space, (void)out, (void)arg, (void)rows, (void)team_size;
    return NoCachePass();
  }
}

// A step functor's launch: `items` work items, with `per_item` scratch
// slots each when it writes a cache.
// Stage is the functor's team_items type (T, or void for a decode step).
template <class ExecutionSpace, class T, class Cache, class Functor,
          class Stage = T>
LaunchShape step_items_shape(Checker const& chk, std::string const& argument,
                             ExecutionSpace const& space, Functor const& f,
                             std::uint64_t items, int head_dim, int width,
                             int per_item, int team_size) {
  using A = accumulator_t<T>;
  if constexpr (Cache::enabled && !device_shapes<ExecutionSpace>::value &&
                !host_stages_cache<ExecutionSpace, Stage, A>::value) {
    // A host writing each pool at once: one scratch row a team thread.
    LaunchShape l = items_shape(chk, argument, space, f, items, head_dim,
                                width, team_size);
    l.scratch_bytes = CacheScratch<ExecutionSpace, A>::bytes(l.team_size, head_dim);
    return l;
  } else if constexpr (Cache::enabled)
    return cache_items_shape<ExecutionSpace, accumulator_t<T>>(
        chk, argument, space, f, items, head_dim, width, per_item, team_size);
  else
    return items_shape(chk, argument, space, f, items, head_dim, width,
                       team_size);
}

template <class ExecutionSpace, class T, class M, class KeyView,
          class GateView, class ApeView, class RowOffsetsView,
          class CacheLengthsView, class SlotView, class Arg>
void step_impl(ExecutionSpace const& space, Ring<T, M>& ring,
               KeyView const& key, GateView const& gate, ApeView const& ape,
               RowOffsetsView const& row_offsets,
               CacheLengthsView const& cache_lengths, SlotView const& slot_idx,
               int num_requests, StepOutput<T, M>& out, Arg const& arg,
               Options const& options) {
  Entry const chk("KPool::step");
  auto call = ragged_call<ExecutionSpace, T>(chk, key, gate, ape, row_offsets, cache_lengths,
                                             num_requests);
  int const K = call.batch.kpool, D = call.head_dim;
  check_ring(chk, ring, K, D);
  attach_ring(chk, call, slot_idx, ring.tail());
  std::size_t const bound =
      StepOutput<T, M>::capacity_for(key.extent(0), num_requests, K);
  check_step_output(
      chk, out, static_cast<std::size_t>(call.batch_size), D, bound,
      "rows this step may need (floor(key rows / K) + num_requests)");
  check_step_cache<ExecutionSpace, T>(
      chk, space, arg, K, D, static_cast<std::size_t>(num_requests), 1);
  if (options.validate) {
    HostBatch const hb = check_ragged_batch(
        chk, space, row_offsets, cache_lengths, &slot_idx, num_requests,
        key.extent(0), K, ring.max_slots());
    check_ring_starts(chk, space, ring, ragged_restarts(hb), "cache_lengths");
    if constexpr (Arg::enabled) {
      // A request emits the pools whose last member it sends:
      // [floor(c / K), floor((c + n) / K)).
      std::vector<std::pair<std::int64_t, std::int64_t>> pools;
      for (RequestGeometry const& g : hb.geometry)
        pools.emplace_back(static_cast<std::int64_t>(g.cache_length / K),
                           static_cast<std::int64_t>(g.end / K));
      check_step_blocks(chk, space, arg, pools);
    }
  }

  View1<const std::uint32_t, M> const offsets =
      out.begin_call(call.batch_size);
  auto const sink = step_sink(out, offsets);
  View4<T, M> const tail = ring.tail();
  bool const contiguous = call.contiguous();
  bool const aligned = call.aligned() &&
                       rows_aligned(out.pooled().data(), D, 16) &&
                       ring_aligned(tail);
  std::uint64_t const requests = static_cast<std::uint64_t>(num_requests);
  std::uint64_t const rows = std::min<std::uint64_t>(bound, out.capacity());
  constexpr bool second_pass =
      cache_second_pass<ExecutionSpace, T, CacheItems::step, Arg>();
  auto const cache = step_cache_target<T, second_pass>(arg);
  using Cache = std::remove_const_t<decltype(cache)>;
  auto const cache_pass = plan_cache_pass<ExecutionSpace, T, second_pass>(
      chk, space, out, arg, rows, options.team_size);
  dispatch_path<ExecutionSpace, T>(K, D, contiguous, aligned, [&](auto path) {
    using P = decltype(path);
    using Writer = RaggedWriter<ExecutionSpace, T, P, true>;
    Writer writer = ragged_writer<Writer>(call);
    writer.tail = tail;
    writer.ring_state = ring.state().data();
    writer.out = sink;
    // Every launch is planned (and its size checked) before the first is
    // queued, so a call that throws has written nothing.
    if (options.fused) {
      FusedStepFunctor<Writer, Cache> f{writer, cache};
      // Both kinds of team share one shape: request teams and pool teams
      // each take items_per_team items (and as many scratch slots).
      LaunchShape shape = step_items_shape<ExecutionSpace, T, Cache>(
          chk, "num_requests", space, f, requests, D, P::width, 1,
          options.team_size);
      f.items_per_team = shape.items_per_team;
      f.request_teams = shape.league;
      std::uint64_t const league =
          static_cast<std::uint64_t>(f.request_teams) +
          static_cast<std::uint64_t>(
              league_for(chk, "out", rows, shape.items_per_team));
      if (league > 0x7FFFFFFFull)
        chk.fail("out", "", -1, std::to_string(rows),
                 "rows and num_requests = " + std::to_string(num_requests) +
                     " are more teams together than one launch takes "
                     "(2^31 - 1)");
      shape.league = static_cast<int>(league);
      launch_ragged_offsets<true>(space, "KPool::step::offsets", call,
                                  View1<std::uint32_t, M>(out.offsets()));
      launch(space, "KPool::step::fused", shape, f);
    } else {
      RingCloseFunctor<Writer, Cache> close{writer, cache};
      CompressFunctor<Writer, Cache> pools{writer, cache};
      SeedTailFunctor<Writer> seed{writer};
      LaunchShape const close_shape = step_items_shape<ExecutionSpace, T, Cache>(
          chk, "num_requests", space, close, requests, D, P::width, 1,
          options.team_size);
      LaunchShape const pools_shape = step_items_shape<ExecutionSpace, T, Cache>(
          chk, "out", space, pools, rows, D, P::width, 1, options.team_size);
      LaunchShape const seed_shape = items_shape(
          chk, "num_requests", space, seed, requests, D, P::width,
          options.team_size);
      launch_ragged_offsets<true>(space, "KPool::step::offsets", call,
                                  View1<std::uint32_t, M>(out.offsets()));
      // ring_close reads ring entries seed_tail overwrites; launches on one
      // execution space instance run in order.
      launch_items(space, "KPool::step::ring_close", close_shape, close);
      launch_items(space, "KPool::step::compress", pools_shape, pools);
      launch_items(space, "KPool::step::seed_tail", seed_shape, seed);
    }
  });
  // After the step on the same instance: it reads the rows the step wrote.
  cache_pass(space, "KPool::step::cache");
}

template <class ExecutionSpace, class T, class M, class KeyView,
          class GateView, class ApeView, class PositionsView, class SlotView,
          class Arg>
void decode_step_impl(ExecutionSpace const& space, Ring<T, M>& ring,
                      KeyView const& key, GateView const& gate,
                      ApeView const& ape, PositionsView const& positions,
                      SlotView const& slot_idx, int num_requests,
                      StepOutput<T, M>& out, Arg const& arg,
                      Options const& options) {
  Entry const chk("KPool::step");
  check_decode_shapes(chk, key, gate, ape, positions, ring.tail(),
                      num_requests);
  int const K = static_cast<int>(ape.extent(0));
  int const D = static_cast<int>(ape.extent(1));
  check_ring(chk, ring, K, D);
  std::size_t const B = positions.extent(0);
  std::size_t const next_n = positions.extent(1);
  chk.extent_is("slot_idx", 0, slot_idx.extent(0), B,
                "the batch size B (positions is [B, next_n])");
  check_step_output(
      chk, out, B, D,
      static_cast<std::size_t>(num_requests) * ((next_n + K - 1) / K),
      "rows this step may need (num_requests * ceil(next_n / K))");
  // A row of consecutive positions closes at most ceil(next_n / K) pools.
  int const per_row = static_cast<int>(std::min<std::size_t>(
      (next_n + static_cast<std::size_t>(K) - 1) / static_cast<std::size_t>(K),
      0x7FFFFFFF));
  check_step_cache<ExecutionSpace, T>(
      chk, space, arg, K, D, static_cast<std::size_t>(num_requests), per_row);
  if (options.validate) {
    std::vector<std::pair<std::int64_t, std::int64_t>> pools;
    std::vector<RingRestart> restarts;
    check_decode_batch(chk, space, positions, slot_idx, num_requests, K,
                       ring.max_slots(), Arg::enabled ? &pools : nullptr, &restarts);
    check_ring_starts(chk, space, ring, restarts, "positions");
    check_step_blocks(chk, space, arg, pools);
  }

  View1<const std::uint32_t, M> const offsets =
      out.begin_call(static_cast<int>(B));
  View4<T, M> const tail = ring.tail();
  View3<const T, M> const k = key;
  View3<const T, M> const g = gate;
  View2<const float, M> const a = ape;
  bool const contiguous =
      k.stride(2) == 1 && g.stride(2) == 1 && a.stride(1) == 1;
  bool const aligned = decode_aligned<ExecutionSpace, T, M>(k, g, a, tail) &&
                       rows_aligned(out.pooled().data(), D, 16);
  // The cache's path: on hosts it depends on the call's size
  // (common/detail/KPool_CachePath.hpp), so both are compiled there.
  auto const launch = [&](auto pass) {
    constexpr bool second_pass = decltype(pass)::value;
    auto const cache = step_cache_target<T, second_pass>(arg);
    using Cache = std::remove_const_t<decltype(cache)>;
    auto const cache_pass = plan_cache_pass<ExecutionSpace, T, second_pass>(
        chk, space, out, arg,
        std::min<std::uint64_t>(static_cast<std::uint64_t>(num_requests) *
                                    static_cast<std::uint64_t>(per_row),
                                out.capacity()),
        options.team_size);
    dispatch_path<ExecutionSpace, T>(K, D, contiguous, aligned, [&](auto path) {
      using P = decltype(path);
      TailUpdateFunctor<ExecutionSpace, T, P, true, Cache> f;
      f.tail = tail;
      f.key = k;
      f.gate = g;
      f.ape = ape_source(a);
      f.positions = positions;
      f.slot_idx = slot_idx;
      f.out = step_sink(out, offsets);
      f.num_requests = num_requests;
      f.next_n = static_cast<int>(next_n);
      f.kpool = K;
      f.head_dim = D;
      f.max_slots = ring.max_slots();
      f.ring_length = ring.ring_length();
      f.cache = cache;
      f.cache_slots = per_row;
      f.ring_state = ring.state().data();
      LaunchShape const shape = step_items_shape<ExecutionSpace, T, Cache,
                                                 decltype(f), void>(
          chk, "num_requests", space, f,
          static_cast<std::uint64_t>(num_requests), D, P::width, per_row,
          options.team_size);
      launch_offsets_scan(space, "KPool::step::decode_offsets",
                          DecodePoolCount<M>{positions, slot_idx, num_requests,
                                             K, ring.max_slots()},
                          View1<std::uint32_t, M>(out.offsets()),
                          static_cast<int>(B));
      launch_items(space, "KPool::step::tail_update", shape, f);
    });
    cache_pass(space, "KPool::step::decode_cache");
  };
  if constexpr (Arg::enabled &&
                cache_write_path_by_size<ExecutionSpace, CacheItems::decode, Arg::path>()) {
    if (cache_write_path_for<ExecutionSpace, T, CacheItems::decode>(
            static_cast<std::size_t>(num_requests)) == CacheWritePath::second_pass)
      launch(std::true_type());
    else
      launch(std::false_type());
  } else {
    launch(std::integral_constant<bool, cache_second_pass<ExecutionSpace, T, CacheItems::decode,
                                                          Arg>()>());
  }
}

}  // namespace Details
}  // namespace KPool

#endif
