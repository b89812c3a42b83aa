#ifndef KPOOL_SELECT_DETAIL_SELECT_CALL_HPP
#define KPOOL_SELECT_DETAIL_SELECT_CALL_HPP

// What score_select and select_tokens share between their signature and
// their launches: the checks (KPool_SelectChecks.hpp: the shapes always,
// the data under Options::validate), the selection's plan and launch, and
// the chunk loop that scores (score/detail/KPool_ScoreLaunch.hpp) and
// selects.

#include <cache/KPool_PagedCache.hpp>
#include <common/KPool_Batch.hpp>
#include <common/KPool_Float8.hpp>
#include <common/KPool_Options.hpp>
#include <common/KPool_Types.hpp>
#include <common/detail/KPool_CacheFunctors.hpp>
#include <common/detail/KPool_Launch.hpp>
#include <common/detail/KPool_Validate.hpp>
#include <common/detail/KPool_Views.hpp>
#include <select/detail/KPool_SelectChecks.hpp>
#include <score/KPool_ScoreEngines.hpp>
#include <common/detail/KPool_Scoring.hpp>
#include <select/detail/KPool_TopkCore.hpp>
#include <select/detail/KPool_TopkFused.hpp>
#include <select/detail/KPool_TopkSplit.hpp>
#include <select/detail/KPool_TopkTeam.hpp>
#include <select/detail/KPool_TopkWide.hpp>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

namespace KPool {
namespace Details {

// The output view of a selection entry point, score_select's pool_ids or
// (Expand) select_tokens' tokens, [rows, width] of int32, written: its
// checks, each naming the argument, then whether it is right, so that the
// entry point skips its body otherwise and the failed check is the one
// error.
template <bool Expand, class ExecutionSpace, class OutView>
constexpr bool selection_output_ok() {
  if constexpr (Expand)
    return KPOOL_IMPL_OUTPUT_VIEW_OK(OutView, std::int32_t, 2, ExecutionSpace, "tokens");
  else
    return KPOOL_IMPL_OUTPUT_VIEW_OK(OutView, std::int32_t, 2, ExecutionSpace, "pool_ids");
}

// The long-row split of a workspace: per-segment counts of rows of more
// than `from` visible pools (segs 0: none), and their plans.
struct SplitArgs {
  // [rows][split_region_words(segs)]: first [segs][select_bins] 16-bit
  // suffix counts (split_counts), then the rows' lists.
  std::uint32_t* seg_hist = nullptr;
  std::uint32_t* plans = nullptr;     // [rows][split_plan_words(segs)]
  // [rows], zero between calls: each long row's ticket of its counted
  // segments (SegmentHistFunctor), the workspace's fused_tickets.
  std::uint32_t* tickets = nullptr;
  int segs = 0;
  std::uint64_t from = 0;
  std::uint64_t segment = 1;
};

// A selection launch: a team per row of the chunk, a power-of-two team
// size (the team scans need one on CUDA before Kokkos 3.7, and
// Options::team_size may ask for any), level-0 scratch always.
template <class ExecutionSpace, class F>
LaunchShape select_shape(ExecutionSpace const& space, F const& f, std::size_t rows,
                         std::size_t scratch_bytes, Options const& options) {
  LaunchShape shape;
  shape.league = static_cast<int>(rows);
  shape.team_size = std::min(power_of_two_floor(team_size_for(space, f, 1, options.team_size)),
                             max_select_team);
  shape.scratch_bytes = scratch_bytes;
  shape.scratch_level = 0;
  return shape;
}

// Which selection kernel a call takes (SelectPlan), and its scratch: the row staged in
// scratch next to the full candidate buffer (device shapes, when every row
// fits); else the buffers alone, with as many candidates as fit; else, for
// a topk whose buffers do not fit level 0, SelectWideFunctor (four reads
// of the row, the same scratch for every topk). Always within the level-0
// scratch a device team has.
template <class ExecutionSpace, class Key, bool Expand>
SelectPlan select_plan(int topk, std::size_t max_visible) {
  using Staged = SelectFunctor<ExecutionSpace, Key, Expand, true>;
  using Fast = SelectFunctor<ExecutionSpace, Key, Expand, false>;
  using Wide = SelectWideFunctor<ExecutionSpace, Key, Expand>;
  std::size_t const max0 = device_shapes<ExecutionSpace>::value
                               ? std::min(scratch_max<ExecutionSpace>(0),
                                          device_scratch0<ExecutionSpace>())
                               : scratch_max<ExecutionSpace>(0);
  SelectPlan p;
  int const staged_cap = Staged::capacity_for(topk, max_visible, max0);
  int const fast_cap = Fast::capacity_for(topk, 0, max0);
  if (device_shapes<ExecutionSpace>::value && staged_cap == candidate_capacity) {
    p.kernel = SelectKernel::staged;
    p.cap = staged_cap;
    p.scratch_bytes = Staged::scratch_bytes(topk, max_visible, staged_cap);
  } else if (fast_cap > 0) {
    p.kernel = SelectKernel::fast;
    p.cap = fast_cap;
    p.scratch_bytes = Fast::scratch_bytes(topk, 0, fast_cap);
  } else {
    p.scratch_bytes = Wide::scratch_bytes();
  }
  return p;
}

// The split launches' teams (SegmentHistFunctor, whose last team a row
// makes its plan, and SegmentPartitionFunctor). Each walks one long
// stretch of memory with only one team a segment or a row (65 teams at
// 2^20 pools, on 132 SMs):
// a segment's 2^14 keys, or the plan's 2048 bins over every segment (64 x
// 4 KiB of 16-bit counts). Their time is rounds of L2 latency a thread,
// so with device shapes they take the largest power of two up to
// split_team_threads that the kernel allows (team_size_max: its
// registers, the backend's limit), not the recommended size (128 on
// CUDA): a quarter of the rounds. Power of two, at most max_select_team:
// their team scans (select_shape). Set Options::team_size, and a host's
// one-thread teams, stay select_shape's.
constexpr int split_team_threads = 512;
template <class ExecutionSpace, class F>
LaunchShape split_shape(ExecutionSpace const& space, F const& f, std::size_t league,
                        std::size_t scratch_bytes, Options const& options) {
  LaunchShape shape = select_shape(space, f, league, scratch_bytes, options);
  if constexpr (device_shapes<ExecutionSpace>::value) {
    if (options.team_size <= 0)
      shape.team_size = std::min(
          power_of_two_floor(team_size_for(space, f, 1, split_team_threads)), max_select_team);
  }
  return shape;
}

template <class ExecutionSpace, class F, class Key, class OutView>
void set_select_args(F& f, SelectBatch const& batch, Key const* keys, OutView const& out,
                     int topk, Key* out_keys) {
  static_cast<SelectTeamInputs<ExecutionSpace, Key>&>(f) = SelectTeamInputs<ExecutionSpace, Key>{
      batch, keys, out, static_cast<int>(out.extent(1)), topk, out_keys};
}

// A split-aware functor's view of the long rows' segments.
template <class F>
void set_split_args(F& f, SplitArgs const& split) {
  f.seg_hist = split.seg_hist;
  f.split_from = split.from;
  f.segment = split.segment;
  f.segs = split.segs;
}

// The selection of rows [row_begin, row_end) from their keys: with split
// rows (and a kernel that reads them in segments), two launches first
// (split_shape's teams): per-segment counts (a team a segment; the last
// team of each split row makes the row's plan), each planned segment's
// partition (a team a segment); then one team a row, in the kernel
// select_plan picks. No launch waits on the host.
// out_keys: a shard's keys of the selected pools (SelectTeamInputs), or null.
// row_hist: the rows' first-digit histograms the scoring built (null:
// none), which the one-team-a-row kernels start from.
template <bool Expand, class ExecutionSpace, class Key, class OutView>
void launch_select(Checker const& chk, ExecutionSpace const& space,
                   SelectBatch const& batch, Key const* keys, OutView const& out,
                   int topk, SplitArgs const& split, Options const& options,
                   Key* out_keys = nullptr, std::uint32_t const* row_hist = nullptr) {
  std::size_t const rows = batch.row_end - batch.row_begin;
  if (rows == 0) return;
  SelectPlan const plan = select_plan<ExecutionSpace, Key, Expand>(topk, batch.max_visible);
  std::string const name = chk.entry_point() + "::select";
  if (plan.kernel == SelectKernel::wide) {
    SelectWideFunctor<ExecutionSpace, Key, Expand> f;
    set_select_args<ExecutionSpace>(f, batch, keys, out, topk, out_keys);
    launch(space, name, select_shape(space, f, rows, plan.scratch_bytes, options), f);
    return;
  }
  if (split.segs > 0) {
    // A segment's suffix counts are 16-bit (split_counts): refused here,
    // on the host before any launch, rather than clamped (the workspace's
    // segs and regions were sized for this segment).
    if (split.segment < 1 || split.segment > split_segment_max)
      chk.fail("split", "segment", -1, std::to_string(split.segment),
               "is not 1 to " + std::to_string(split_segment_max) +
                   " pools (a segment's suffix counts are 16-bit)");
    auto split_args = [&](auto& f) {
      f.batch = batch;
      set_split_args(f, split);
    };
    std::uint64_t const segments = rows * static_cast<std::uint64_t>(split.segs);
    int const segment_teams = league_for(chk, "q", segments, 1);
    if (split.tickets == nullptr || split.plans == nullptr || split.seg_hist == nullptr)
      chk.fail("workspace", "", -1, "split",
               "has no segment counts, plans or tickets for rows past " +
                   std::to_string(split.from) + " pools (an internal error)");
    SegmentHistFunctor<ExecutionSpace, Key> h;
    split_args(h);
    h.keys = keys;
    h.tickets = split.tickets;
    h.planner.plans = split.plans;
    h.planner.topk = topk;
    LaunchShape shape = split_shape(space, h, rows, h.scratch_bytes(), options);
    shape.league = segment_teams;
    launch(space, chk.entry_point() + "::select_segments", shape, h);
    SegmentPartitionFunctor<ExecutionSpace, Key> pa;
    split_args(pa);
    pa.keys = keys;
    pa.plans = split.plans;
    pa.topk = topk;
    LaunchShape pshape = split_shape(space, pa, rows, pa.scratch_bytes(), options);
    pshape.league = segment_teams;
    launch(space, chk.entry_point() + "::select_split_partitions", pshape, pa);
  }
  auto run = [&](auto f) {
    set_select_args<ExecutionSpace>(f, batch, keys, out, topk, out_keys);
    set_split_args(f, split);
    f.cap = plan.cap;
    f.plans = split.plans;
    f.built_hist = row_hist;
    launch(space, name, select_shape(space, f, rows, plan.scratch_bytes, options), f);
  };
  if (plan.kernel == SelectKernel::staged)
    run(SelectFunctor<ExecutionSpace, Key, Expand, true>{});
  else
    run(SelectFunctor<ExecutionSpace, Key, Expand, false>{});
}

// Whether a decode selection scores and selects in one launch
// (Options::decode_selection; select/detail/KPool_TopkFused.hpp): fused
// when asked, where the call allows it; asked for where it does not,
// refused by name before anything runs. The default (automatic) is what
// perf_tests/gpu/cost_model.py finds faster on an H200
// (docs/performance.md), until a device run says otherwise: on a device
// (and with device shapes) fused for the tensor-core engine in the serving
// profile, where the call allows it (23 against 25 us for 64 rows of 8192
// pools), separate otherwise (the exact profile: 43 against 35 us); on a
// host, separate.
template <class ExecutionSpace, class Key, bool Expand, class Workspace>
bool fuse_decode_selection(Checker const& chk, Options const& options, ScoreEngine engine,
                           Workspace const& workspace, int topk, bool serving) {
  DecodeSelection const asked = options.decode_selection;
  if (asked == DecodeSelection::separate) return false;
  if (asked == DecodeSelection::automatic &&
      !(device_shapes<ExecutionSpace>::value && engine == ScoreEngine::tensor_cores && serving))
    return false;
  std::string why;
  if (engine == ScoreEngine::blas)
    why = "the blas engine scores on the calling thread, not in a team kernel";
  else if (workspace.split_segments() > 0)
    why = "the workspace's max_visible = " + std::to_string(workspace.max_visible()) +
          " is past " + std::to_string(workspace.split_from()) +
          " pools, whose rows select in split segments";
  else if (select_plan<ExecutionSpace, Key, Expand>(topk, workspace.max_visible()).kernel ==
           SelectKernel::wide)
    why = "topk = " + std::to_string(topk) +
          " takes the wide selection, whose buffers a fused team does not hold";
  if (why.empty()) return true;
  if (asked == DecodeSelection::automatic) return false;
  chk.fail("options", "decode_selection", -1, "fused", "does not take this call: " + why);
  return false;
}

// score_select (Expand = false, out = pool_ids [T, topk]) and select_tokens
// (Expand = true, out = token indices [T, topk * K + K - 1]); Decode: a
// chunk of a decode batch (the fused selection is compiled for those only).
// shard_keys: a shard's local selection (docs/ranks.md; pool ids only): out
// gets the local pool ids, shard_keys [T, topk] (the Key type of T) their
// keys. A sharded cache is selected from only so. decode (with Decode):
// the chunk's requests, read from the positions (row_offsets and
// cache_lengths are then empty and unread).
struct DecodeRows {
  Strided<const std::int32_t, 2> positions;
  int first = 0;
  int next_n = 0;
};
template <bool Expand, bool Decode = false, bool Scores = false, class ExecutionSpace,
          class RowOffsetsView,
          class CacheLengthsView, class BlockTableView, class QView,
          class WeightsView, class Cache, class OutView, class Workspace>
void score_select_call(Checker const& chk, ExecutionSpace const& space,
                       RowOffsetsView const& row_offsets,
                       CacheLengthsView const& cache_lengths,
                       BlockTableView const& block_table, int num_requests,
                       int kpool, QView const& q, WeightsView const& weights,
                       Cache const& cache, int topk, char const* out_name,
                       OutView const& out, Workspace& workspace,
                       Options const& options, void* shard_keys = nullptr,
                       DecodeRows const& decode = DecodeRows()) {
  using M = typename ExecutionSpace::memory_space;
  using T = typename Workspace::storage_type;
  using C = typename Cache::value_type;
  static_assert(std::is_same<typename Cache::memory_space, M>::value &&
                    std::is_same<typename Workspace::memory_space, M>::value,
                "KPool: the pool cache and the workspace must live in the "
                "execution space's memory space");
  static_assert(std::is_same<C, T>::value || std::is_same<C, float8_e4m3>::value,
                "KPool: a native pool cache must hold the queries' storage "
                "type (or use an fp8 cache)");
  constexpr bool views_ok =
      KPOOL_IMPL_VIEW_OK(RowOffsetsView, std::uint32_t, 1, ExecutionSpace,
                         "row_offsets") &&
      KPOOL_IMPL_VIEW_OK(CacheLengthsView, std::uint32_t, 1, ExecutionSpace,
                         "cache_lengths") &&
      KPOOL_IMPL_VIEW_OK(BlockTableView, std::int32_t, 2, ExecutionSpace,
                         "block_table") &&
      KPOOL_IMPL_VIEW_OK(QView, T, 3, ExecutionSpace, "q") &&
      KPOOL_IMPL_VIEW_OK(WeightsView, float, 2, ExecutionSpace, "weights");
  // After a failed check, nothing else is compiled (one error, no cascade).
  if constexpr (!std::is_same<typename Cache::memory_space, M>::value ||
                !std::is_same<typename Workspace::memory_space, M>::value ||
                !(std::is_same<C, T>::value || std::is_same<C, float8_e4m3>::value) ||
                !views_ok) {
    (void)chk, (void)space, (void)row_offsets, (void)cache_lengths,
        (void)block_table, (void)num_requests, (void)kpool, (void)q,
        (void)weights, (void)cache, (void)topk, (void)out_name, (void)out,
        (void)workspace, (void)options, (void)shard_keys, (void)decode;
  } else {
    using A = accumulator_t<T>;
    using Key = score_key_t<A>;
    check_select_shapes<Expand, T>(chk, row_offsets, cache_lengths, block_table,
                                   num_requests, kpool, q, weights, cache, topk,
                                   out_name, out, workspace, Decode, Scores);
    if (cache.shard().sharded() && shard_keys == nullptr)
      chk.fail("cache", "shard", -1, shard_name(cache.shard()),
               "holds one rank's share of the pools: a selection over it needs the "
               "ranks' exchange (score_select with a Communicator, or "
               "shard_select_local and shard_select_merge, docs/ranks.md)");
    int const D = cache.head_dim();
    std::size_t const rows = q.extent(0);
    int const H = static_cast<int>(q.extent(1));
    // The workspace's engine (built for it): the one place the engine is
    // chosen. The retired Options::score_engine may only repeat it, or
    // choose where the workspace was built for automatic.
    ScoreEngine asked = workspace.engine();
#if KPOOL_ENABLE_DEPRECATED
    ScoreEngine const retired = options.score_engine;
    if (retired != ScoreEngine::automatic) {
      if (asked != ScoreEngine::automatic && asked != retired)
        chk.fail("options", "score_engine", -1, engine_name(retired),
                 std::string("contradicts the workspace's engine, ") + engine_name(asked) +
                     " (the engine is the workspace's: SelectWorkspace(space, max_tokens, "
                     "max_visible, num_heads, head_dim, engine))");
      asked = retired;
    }
#endif
    ScoreEngine const engine = resolve_engine<ExecutionSpace, T, C>(
        chk, asked, cache.rotated(), cache.profile() == CacheProfile::serving, H, D);
    if (options.scoring_teams < 0)
      chk.fail("options", "scoring_teams", -1, std::to_string(options.scoring_teams),
               "is negative (0: as many teams as the device holds at once)");
    if (options.key_pipeline_depth < 0)
      chk.fail("options", "key_pipeline_depth", -1, std::to_string(options.key_pipeline_depth),
               "is negative (0: the deepest key ring the team's fast scratch holds)");
    if (engine == ScoreEngine::blas && workspace.blas_queries() == nullptr)
      chk.fail("options", "score_engine", -1, "blas",
               "needs a workspace built for it: SelectWorkspace(space, max_tokens, "
               "max_visible, num_heads, head_dim, ScoreEngine::blas)");
    bool fuse = false;
    if constexpr (Decode && !Scores)
      fuse = fuse_decode_selection<ExecutionSpace, Key, Expand>(
          chk, options, engine, workspace, topk, cache.profile() == CacheProfile::serving);
    // Without validation, a workspace that may be too short for a row is
    // refused (a decode batch's by its batch form, before its chunks).
    if (!options.validate && !Decode)
      check_workspace_holds_table(chk, cache, block_table, workspace);
    // A decode batch is validated whole, before its first chunk.
    if (options.validate && !Decode)
      check_select_batch(chk, space, row_offsets, cache_lengths, block_table,
                         num_requests, rows, kpool, cache.num_blocks(),
                         cache.block_pools(), workspace.max_visible(), cache.shard());
    if (rows == 0 || num_requests == 0) return;

    ScoreInputs<ExecutionSpace, T, C> in;
    in.batch.row_offsets = row_offsets;
    in.batch.cache_lengths = cache_lengths;
    if constexpr (Decode) {
      in.batch.positions = decode.positions;
      in.batch.first = decode.first;
      in.batch.next_n = decode.next_n;
    }
    in.batch.num_requests = num_requests;
    in.batch.kpool = kpool;
    in.batch.total_rows = rows;
    in.batch.max_visible = workspace.max_visible();
    in.batch.row_begin = 0;
    in.batch.row_end = rows;
    in.cache = cache_target<C, A>(cache, block_table);
    // The engines address a shard's local pools (the batch counts them).
    in.cache.shard = Shard();
    in.batch.shard = cache.shard();
    in.keys = workspace.keys().data();
    in.heads = H;
    in.prepared = workspace.prepared_queries();
    in.prepared_weights = workspace.prepared_weights();
    // The tensor-core engine's E4M3 MMA takes the queries prepared as its
    // operand bytes.
    in.prepared_codes = engine == ScoreEngine::tensor_cores &&
                        mma_query_codes<ExecutionSpace, T, C>(
                            cache.rotated(), cache.profile() == CacheProfile::serving);
    // The rows' first-digit histograms, built while the tensor-core engine
    // scores where its launch takes them (Options::score_histograms): the
    // preparation zeroes a chunk's, and the top-k starts from them. Only
    // where its teams score one row each (rows_per_team_for), so that a
    // prefill call does not zero 8 KiB a row for nothing.
    if constexpr (!Scores)
      if (options.score_histograms && engine == ScoreEngine::tensor_cores &&
          !cache.shard().sharded() && rows_per_team_for(rows, num_requests) == 1)
        in.row_hist = workspace.row_histograms();
    // Where the separate path's scoring launch would decline them (no
    // room for the counts, no key ring, rows too long: launch_score_mma),
    // none: its preparation then zeroes nothing. The launcher plans the
    // same for every chunk; the fused kernel's prologue learns it from
    // the functor it wraps.
    if constexpr (!Scores)
      if (in.row_hist != nullptr && !fuse) {
        std::uint32_t const* planned = nullptr;
        LaunchScore<ExecutionSpace> plan{space, &planned};
        plan.plan_only = true;
        launch_score(chk, space, engine, in, workspace, options, plan);
        if (planned == nullptr) in.row_hist = nullptr;
      }
    // The fused decode selection's launcher (the same for every chunk but
    // its first row): it prepares the chunk's queries itself.
    using Prepare = PrepareQueriesFunctor<ExecutionSpace, T, A>;
    FuseScoreSelect<ExecutionSpace, Prepare, Key, Expand> fused;
    if constexpr (Decode && !Scores) {
      fused.space = space;
      fused.out = View2<std::int32_t, M>(out);
      fused.out_columns = static_cast<int>(out.extent(1));
      fused.topk = topk;
      fused.plan = select_plan<ExecutionSpace, Key, Expand>(topk, workspace.max_visible());
      fused.tickets = workspace.fused_tickets();
      fused.groups_capacity = workspace.max_tokens();
      fused.out_keys = static_cast<Key*>(shard_keys);
      fused.prepare = Prepare{Strided<const T, 3>(q), Strided<const float, 2>(weights),
                              in.cache.query_prep(), workspace.prepared_queries(),
                              workspace.prepared_weights(), 0, H, D};
      fused.prepare.codes = in.prepared_codes;
      fused.prepare.row_hist = in.row_hist;
    }
    SplitArgs split;
    split.seg_hist = workspace.segment_histograms();
    split.plans = workspace.split_plans();
    split.tickets = workspace.fused_tickets();
    split.segs = workspace.split_segments();
    split.from = workspace.split_from();
    split.segment = workspace.split_segment();
    // Chunks of the workspace's max_tokens rows, in order, on the one
    // instance: each chunk's keys are consumed before the next overwrites.
    std::size_t const chunk = workspace.max_tokens();
    for (std::size_t row_begin = 0; row_begin < rows; row_begin += chunk) {
      in.batch.row_begin = row_begin;
      in.batch.row_end = std::min(rows, row_begin + chunk);
      if constexpr (Decode && !Scores) {
        if (fuse) {
          fused.prepare.row0 = in.batch.row_begin;
          launch_score(chk, space, engine, in, workspace, options, fused);
          continue;
        }
      }
      launch_prepare_queries<ExecutionSpace, T, A>(
          chk, space, Strided<const T, 3>(q), Strided<const float, 2>(weights),
          in.cache.query_prep(), in.batch.row_begin,
          in.batch.row_end - in.batch.row_begin, H, D, workspace.prepared_queries(),
          workspace.prepared_weights(), in.prepared_codes, in.row_hist);
      std::uint32_t const* built_hist = nullptr;
      launch_score(chk, space, engine, in, workspace, options,
                   LaunchScore<ExecutionSpace>{space, &built_hist});
      if constexpr (Scores)
        launch_scores(chk, space, in.batch, static_cast<Key const*>(in.keys), out, options);
      else
        launch_select<Expand>(chk, space, in.batch, static_cast<Key const*>(in.keys),
                              View2<std::int32_t, M>(out), topk, split, options,
                              static_cast<Key*>(shard_keys), built_hist);
    }
  }
}

// The Batch forms of score_select and select_tokens: K is the cache's; a
// ragged batch is the positional call; a decode batch runs as calls of up
// to the workspace's max_tokens rows each (one for the usual batch of at
// most max_tokens rows), whose kernels read the requests' rows straight
// from the positions (SelectBatch's decode form: no launch builds them).
template <bool Expand, bool Scores = false, class ExecutionSpace, class C, class M, class QView,
          class WeightsView, class OutView, class Workspace>
void score_select_batch(Checker const& chk, ExecutionSpace const& space,
                        PagedCache<C, M> const& paged, QView const& q,
                        WeightsView const& weights, int topk, Batch<M> const& batch,
                        char const* out_name, OutView const& out, Workspace& workspace,
                        Options const& options, void* shard_keys = nullptr) {
  int const K = paged.cache.kpool();
  if (!batch.is_decode()) {
    score_select_call<Expand, false, Scores>(chk, space, batch.row_offsets, batch.cache_lengths,
                              paged.block_table, batch.num_requests, K, q, weights,
                              paged.cache, topk, out_name, out, workspace, options,
                              shard_keys);
    return;
  }
  if constexpr (Kokkos::is_view<QView>::value && QView::rank == 3 &&
                Kokkos::is_view<WeightsView>::value && WeightsView::rank == 2 &&
                Kokkos::is_view<OutView>::value && OutView::rank == 2) {
    std::size_t const B = batch.size();
    int const next_n = static_cast<int>(batch.next_n());
    chk.num_requests_within(batch.num_requests, B);
    if (next_n == 0) chk.fail("batch", "positions extent 1", -1, "0", "is no token a row");
    chk.extent_is("q", 0, q.extent(0), B * static_cast<std::size_t>(next_n),
                  "B * next_n of the decode batch");
    if (!workspace.is_allocated())
      chk.fail("workspace", "", -1, "an empty SelectWorkspace",
               "has no storage (construct it with a size)");
    chk.extent_at_least("block_table", 0, paged.block_table.extent(0),
                        static_cast<std::size_t>(batch.num_requests),
                        "rows of the live requests");
    if (!options.validate && paged.cache.is_allocated())
      check_workspace_holds_table(chk, paged.cache, paged.block_table, workspace);
    // Validated whole here; the chunks' own calls then check shapes only.
    if (options.validate)
      check_decode_select_batch(chk, space, batch.positions, paged.block_table,
                                batch.num_requests, K, paged.cache.num_blocks(),
                                paged.cache.block_pools(), workspace.max_visible(),
                                paged.cache.shard());
    Options chunk_options = options;
    chunk_options.validate = false;
    // Batch rows a chunk: the workspace's rows hold them, and their queries.
    std::size_t const per =
        std::max<std::size_t>(1, workspace.max_tokens() / static_cast<std::size_t>(next_n));
    std::size_t const n = static_cast<std::size_t>(batch.num_requests);
    std::size_t first = 0;
    do {
      std::size_t const count = std::min(per, n - first);
      auto const rows = std::make_pair(first * next_n, (first + count) * next_n);
      auto const reqs = std::make_pair(first, first + count);
      DecodeRows decode;
      decode.positions = Strided<const std::int32_t, 2>(batch.positions);
      decode.first = static_cast<int>(first);
      decode.next_n = next_n;
      score_select_call<Expand, true, Scores>(
          chk, space, View1<const std::uint32_t, M>(), View1<const std::uint32_t, M>(),
          Kokkos::subview(paged.block_table, reqs, Kokkos::ALL), static_cast<int>(count), K,
          Kokkos::subview(q, rows, Kokkos::ALL, Kokkos::ALL),
          Kokkos::subview(weights, rows, Kokkos::ALL), paged.cache, topk, out_name,
          Kokkos::subview(out, rows, Kokkos::ALL), workspace, chunk_options,
          shard_keys == nullptr
              ? nullptr
              : static_cast<void*>(static_cast<char*>(shard_keys) +
                                   rows.first * static_cast<std::size_t>(topk) *
                                       sizeof(score_key_t<accumulator_t<
                                                  typename Workspace::storage_type>>)),
          decode);
      first += count;
    } while (first < n);
  } else {
    // The positional call names the wrong argument at compile time.
    score_select_call<Expand, false, Scores>(chk, space, batch.row_offsets, batch.cache_lengths,
                              paged.block_table, batch.num_requests, K, q, weights,
                              paged.cache, topk, out_name, out, workspace, options,
                              shard_keys);
  }
}

}  // namespace Details
}  // namespace KPool

#endif
