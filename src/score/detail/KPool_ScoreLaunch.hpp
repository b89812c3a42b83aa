#ifndef KPOOL_SCORE_DETAIL_SCORE_LAUNCH_HPP
#define KPOOL_SCORE_DETAIL_SCORE_LAUNCH_HPP

// The scoring stage's side of a selection call: which engine scores it
// (resolve_engine, docs/indexer.md, "Scoring"), the engines' launch shapes
// and their launches. Every engine writes the same keys (score_key).

#include <KPool_Config.hpp>
#include <common/KPool_Float8.hpp>
#include <common/KPool_Options.hpp>
#include <common/KPool_Types.hpp>
#include <common/detail/KPool_Launch.hpp>
#include <common/detail/KPool_Validate.hpp>
#include <common/detail/KPool_Views.hpp>
#include <score/detail/KPool_ScoreBlas.hpp>
#include <score/detail/KPool_ScoreMma.hpp>
#include <score/detail/KPool_ScoreRegisterTiles.hpp>
#include <score/detail/KPool_ScoreTeamGemm.hpp>
#include <score/detail/KPool_ScoreTiles.hpp>
#include <common/detail/KPool_Scoring.hpp>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

namespace KPool {
namespace Details {

inline char const* engine_name(ScoreEngine e) {
  return e == ScoreEngine::blas             ? "blas"
         : e == ScoreEngine::team_gemm      ? "team_gemm"
         : e == ScoreEngine::tiles          ? "tiles"
         : e == ScoreEngine::register_tiles ? "register_tiles"
         : e == ScoreEngine::tensor_cores   ? "tensor_cores"
                                            : "automatic";
}

// Whether the tiles engine's smallest tile (one query row) fits a device
// team's fast scratch; always on hosts without device shapes.
template <class ExecutionSpace, class T, class C>
bool tiles_fit(int heads, int D) {
  if constexpr (device_shapes<ExecutionSpace>::value)
    return ScoreTilesFunctor<ExecutionSpace, T, C, 0>::scratch_bytes(1, heads, D) <=
           device_scratch0<ExecutionSpace>();
  else
    return true;
}

// The one place that chooses a call's scoring engine. register_tiles and
// blas are host code (one thread a team, a host BLAS) and are refused on
// device backends. The automatic choice follows the launch shapes, so a
// device-shapes build on a host (KPool_TEST_DEVICE_SHAPES) runs the device
// engine: tensor_cores on CUDA where the MMA takes the call (mma_plan: the
// cache's type, rotation and profile), else tiles where one query row's
// tile fits a team's fast scratch, else team_gemm, whose tiles shrink
// further (f64 with 32 heads of 128 channels; team_gemm refuses by name
// past its own limit). tensor_cores on a host runs its emulation; asked for
// where the plan refuses the call, it is an error.
template <class ExecutionSpace, class T, class C>
ScoreEngine resolve_engine(Checker const& chk, ScoreEngine requested, bool rotated,
                           bool serving, int heads, int head_dim) {
  if ((requested == ScoreEngine::blas || requested == ScoreEngine::team_gemm) &&
      !KPOOL_HAS_KOKKOSKERNELS)
    chk.fail("workspace", "engine", -1, engine_name(requested),
             "needs Kokkos Kernels, which this build of KPool was configured "
             "without (KPOOL_HAS_KOKKOSKERNELS is 0; use automatic, tiles, "
             "register_tiles or tensor_cores)");
  if ((requested == ScoreEngine::blas || requested == ScoreEngine::register_tiles) &&
      KokkosExt::is_device_backend<ExecutionSpace>::value)
    chk.fail("workspace", "engine", -1, engine_name(requested),
             "needs a host execution space (use tiles, team_gemm, tensor_cores or "
             "automatic)");
  MmaPlan const plan = mma_plan<ExecutionSpace, T, C>(rotated, serving);
  if (requested == ScoreEngine::tensor_cores && !plan.usable)
    chk.fail("workspace", "engine", -1, engine_name(requested),
             std::string("does not take this call (") + plan.why + ")");
  if (requested == ScoreEngine::automatic) {
    if (plan.usable && plan.on_device) return ScoreEngine::tensor_cores;
    if (!device_shapes<ExecutionSpace>::value) return ScoreEngine::register_tiles;
    if (tiles_fit<ExecutionSpace, T, C>(heads, head_dim)) return ScoreEngine::tiles;
    if (!KPOOL_HAS_KOKKOSKERNELS)
      chk.fail("q", "extent 1", -1, std::to_string(heads),
               "heads of " + std::to_string(head_dim) + " channels of " +
                   storage_name<T>() +
                   " queries do not fit the tiles engine's fast team scratch, and "
                   "its fallback, team_gemm, needs Kokkos Kernels, which this build "
                   "of KPool was configured without");
    return ScoreEngine::team_gemm;
  }
  return requested;
}

// Tile shape of the team engine: rows of q a team takes, pools a tile, and
// the scratch level they fit.
struct TileShape {
  int rows;
  int pools;
  int level;
  std::size_t bytes;
};

// Query rows a scoring team takes: a request's share of the call's rows
// (they share each key tile while it is in cache), 1 to 8.
inline int rows_per_team_for(std::size_t total_rows, int num_requests) {
  std::size_t const per_request =
      total_rows / static_cast<std::size_t>(std::max(1, num_requests));
  return static_cast<int>(std::min<std::size_t>(8, std::max<std::size_t>(1, per_request)));
}

// Groups of `rows` query rows in the batch's chunk.
inline std::size_t row_groups(SelectBatch const& batch, int rows) {
  return (batch.row_end - batch.row_begin + rows - 1) / static_cast<std::size_t>(rows);
}

template <class ExecutionSpace, class F>
TileShape tile_shape(std::size_t total_rows, int num_requests, int heads,
                     int head_dim) {
  bool const device = device_shapes<ExecutionSpace>::value;
  TileShape s;
  s.rows = rows_per_team_for(total_rows, num_requests);
  s.pools = device ? 32 : 64;
  // Devices shrink the tiles into fast scratch, down to one row and one
  // pool; hosts keep them (their level-1 scratch is the same memory).
  if (device) {
    std::size_t const budget = device_scratch0<ExecutionSpace>();
    while (F::scratch_bytes(s.rows, s.pools, heads, head_dim) > budget &&
           (s.rows > 1 || s.pools > 1)) {
      if (s.rows > 1)
        s.rows /= 2;
      else
        s.pools /= 2;
    }
  }
  s.bytes = F::scratch_bytes(s.rows, s.pools, heads, head_dim);
  s.level = s.bytes > scratch_max<ExecutionSpace>(0) ? 1 : 0;
  return s;
}

// The teams of a persistent launch of the tensor-core engine, for `work`
// virtual teams (row groups x splits) of `warps` warps: `asked`
// (Options::scoring_teams) where given; on CUDA as many as are resident,
// the device's SMs times the teams an SM holds under the kernel's register
// cap (mma_register_cap, which the engine's launch bounds guarantee: 3
// teams of 4 warps, 4 of 3; 255 for the fused decode selection's kernel,
// which has none: 2 of 4 warps); with device shapes on a host, two a
// thread of the instance; otherwise (a host) one a virtual team, as
// before. Never more than the work.
template <class ExecutionSpace>
int persistent_teams(ExecutionSpace const& space, std::uint64_t work, int warps, int asked,
                     int register_cap = mma_register_cap) {
  if (work == 0) return 0;  // no launch, as without persistence
  std::uint64_t teams = work;
  if (asked > 0) {
    teams = static_cast<std::uint64_t>(asked);
  } else if constexpr (KokkosExt::is_device_backend<ExecutionSpace>::value) {
    int const sms = KokkosExt::device_multiprocessors(space);
    int const an_sm = 65536 / (register_cap * 32 * (warps > 0 ? warps : 1));
    if (sms > 0 && an_sm > 0) teams = static_cast<std::uint64_t>(sms) * an_sm;
  } else if constexpr (device_shapes<ExecutionSpace>::value) {
    teams = 2 * static_cast<std::uint64_t>(space.concurrency() > 0 ? space.concurrency() : 1);
  }
  return static_cast<int>(teams < work ? teams : work);
}

// Teams a group of rows' tiles are split among: enough teams to fill the
// machine when there are few groups (decode, one long row).
template <class ExecutionSpace>
int tile_splits(ExecutionSpace const& space, std::size_t groups, std::size_t max_visible,
                int tile_pools) {
  std::size_t const tiles = (max_visible + tile_pools - 1) / tile_pools;
  std::size_t const target =
      KokkosExt::is_device_backend<ExecutionSpace>::value
          ? static_cast<std::size_t>(space.concurrency()) / 64
          : static_cast<std::size_t>(space.concurrency()) * 4;
  std::size_t splits = std::max<std::size_t>(1, (target + groups - 1) / groups);
  splits = std::min(splits, std::max<std::size_t>(1, tiles));
  if (groups * splits > static_cast<std::size_t>(INT_MAX))
    splits = std::max<std::size_t>(1, INT_MAX / groups);
  return static_cast<int>(splits);
}

// What every scoring engine reads, built once per call; a functor takes
// it as its base (its launch then sets the team layout).
template <class ExecutionSpace, class T, class C>
using ScoreInputs = ScoreTeamInputs<ExecutionSpace, T, C>;

template <class F, class In>
void set_score_inputs(F& f, In const& in) {
  static_cast<In&>(f) = in;
}

#if KPOOL_HAS_KOKKOSKERNELS
template <class ExecutionSpace, class T, class C, int Level, class Run>
void launch_score_team_gemm_level(Checker const& chk, ExecutionSpace const& space,
                                  ScoreInputs<ExecutionSpace, T, C> const& in,
                                  TileShape const& tiles, Options const& options,
                                  Run const& run) {
  using F = ScoreTeamGemmFunctor<ExecutionSpace, T, C, Level>;
  F f;
  set_score_inputs(f, in);
  f.rows_per_team = tiles.rows;
  f.tile_pools = tiles.pools;
  std::size_t const groups = row_groups(in.batch, tiles.rows);
  f.splits = tile_splits(space, groups, in.batch.max_visible, tiles.pools);
  LaunchShape shape;
  shape.league = static_cast<int>(groups * f.splits);
  shape.team_size = team_size_for(space, f, 1, options.team_size);
  shape.scratch_bytes = tiles.bytes;
  shape.scratch_level = Level;
  run(chk.entry_point() + "::score_team_gemm", shape, f);
}
#endif

// A scoring engine whose tiles do not fit any team scratch: refused by
// name, with the engine to use instead.
[[noreturn]] inline void fail_team_scratch(Checker const& chk, char const* engine, char const* advice,
                              int heads, int D) {
  chk.fail("q", "extent 1", -1, std::to_string(heads),
           "heads of " + std::to_string(D) + " channels do not fit the team scratch of the " +
               engine + " engine (" + advice + ")");
}

// A scoring engine whose smallest tile does not fit a device team's fast
// scratch: refused by name (a device never takes level-1 scratch; on CUDA
// it allocates and fences, breaking graph capture).
template <class ExecutionSpace>
[[noreturn]] void fail_device_scratch(Checker const& chk, char const* engine,
                                      char const* smallest, int heads, int D,
                                      std::size_t bytes) {
  chk.fail("q", "extent 1", -1, std::to_string(heads),
           "heads of " + std::to_string(D) + " channels need " + std::to_string(bytes) +
               " bytes of team scratch for " + smallest + ", more than the " +
               std::to_string(device_scratch0<ExecutionSpace>()) +
               " bytes of fast (level-0) scratch a device team has; the " + engine +
               " engine never takes level-1 scratch on a device (on CUDA it "
               "allocates and fences, breaking graph capture)");
}

#if KPOOL_HAS_KOKKOSKERNELS
template <class ExecutionSpace, class T, class C, class Run>
void launch_score_team_gemm(Checker const& chk, ExecutionSpace const& space,
                            ScoreInputs<ExecutionSpace, T, C> const& in,
                            Options const& options, Run const& run) {
  using F = ScoreTeamGemmFunctor<ExecutionSpace, T, C>;
  int const D = in.cache.head_dim();
  TileShape const tiles = tile_shape<ExecutionSpace, F>(
      in.batch.total_rows, in.batch.num_requests, in.heads, D);
  if (device_shapes<ExecutionSpace>::value &&
      tiles.bytes > device_scratch0<ExecutionSpace>())
    fail_device_scratch<ExecutionSpace>(chk, "team_gemm", "one query row and one pool",
                                        in.heads, D, tiles.bytes);
  if (tiles.bytes > scratch_max<ExecutionSpace>(1))
    fail_team_scratch(chk, "team_gemm", "use the blas engine", in.heads, D);
  if (tiles.level == 0)
    launch_score_team_gemm_level<ExecutionSpace, T, C, 0>(chk, space, in, tiles, options, run);
  else
    launch_score_team_gemm_level<ExecutionSpace, T, C, 1>(chk, space, in, tiles, options, run);
}
#endif

template <class ExecutionSpace, class T, class C, int Level, class Run>
void launch_score_tiles_level(Checker const& chk, ExecutionSpace const& space,
                              ScoreInputs<ExecutionSpace, T, C> const& in, int rows,
                              std::size_t bytes, Options const& options, Run const& run) {
  using F = ScoreTilesFunctor<ExecutionSpace, T, C, Level>;
  F f;
  set_score_inputs(f, in);
  f.rows_per_team = rows;
  int const D = in.cache.head_dim();
  f.packets = D % F::packet == 0 && in.cache.rows_aligned(16);
  std::size_t const groups = row_groups(in.batch, rows);
  f.splits = tile_splits(space, groups, in.batch.max_visible, F::TP);
  // A team takes at least a few tiles, so that staging its queries pays.
  f.min_tiles = device_shapes<ExecutionSpace>::value ? 4 : 2;
  LaunchShape shape;
  shape.league = static_cast<int>(groups * f.splits);
  shape.team_size = team_size_for(space, f, 1, options.team_size);
  shape.scratch_bytes = bytes;
  shape.scratch_level = Level;
  run(chk.entry_point() + "::score_tiles", shape, f);
}

// The portable engine: rows a team as the request sizes allow (up to 8),
// fewer on devices until they fit fast scratch; the level is a template
// argument of the kernel.
template <class ExecutionSpace, class T, class C, class Run>
void launch_score_tiles(Checker const& chk, ExecutionSpace const& space,
                        ScoreInputs<ExecutionSpace, T, C> const& in, Options const& options,
                        Run const& run) {
  using F = ScoreTilesFunctor<ExecutionSpace, T, C, 0>;
  int const D = in.cache.head_dim();
  int rows = rows_per_team_for(in.batch.total_rows, in.batch.num_requests);
  std::size_t const max0 = scratch_max<ExecutionSpace>(0);
  // Device shapes fit a device team's fast scratch (a host under device
  // shapes may then take its own level 1, the same memory).
  if (device_shapes<ExecutionSpace>::value) {
    std::size_t const budget = device_scratch0<ExecutionSpace>();
    while (rows > 1 && F::scratch_bytes(rows, in.heads, D) > budget) rows /= 2;
    if (F::scratch_bytes(rows, in.heads, D) > budget)
      fail_device_scratch<ExecutionSpace>(chk, "tiles", "one query row and a tile of pools",
                                          in.heads, D, F::scratch_bytes(rows, in.heads, D));
  }
  std::size_t const bytes = F::scratch_bytes(rows, in.heads, D);
  if (bytes <= max0)
    launch_score_tiles_level<ExecutionSpace, T, C, 0>(chk, space, in, rows, bytes, options, run);
  else if (bytes <= scratch_max<ExecutionSpace>(1))
    launch_score_tiles_level<ExecutionSpace, T, C, 1>(chk, space, in, rows, bytes, options, run);
  else
    fail_team_scratch(chk, "tiles", "use the blas engine", in.heads, D);
}

// The tensor-core engine (score/detail/KPool_ScoreMmaFunctor.hpp): teams of
// mma_team_warps warps on CUDA (one thread a warp elsewhere), as many query
// rows a team (up to 8 of a request) as fit fast scratch, splits of the
// visible pools to fill the machine. The serving profile takes the E4M3
// MMA on an fp8 cache (queries quantized per row and head by
// prepare_query_row). Level-0 scratch on devices, as every engine.
template <class ExecutionSpace, class T, class C, MmaKind Kind, bool Serving = (Kind == MmaKind::e4m3),
          class Run>
void launch_score_mma_kind(Checker const& chk, ExecutionSpace const& space,
                           ScoreInputs<ExecutionSpace, T, C> const& in,
                           Options const& options, int terms, Run const& run) {
  using F = ScoreMmaFunctor<ExecutionSpace, T, C, Kind, Serving>;
  constexpr bool warp_lanes = mma_lanes<ExecutionSpace>::value == 1;
  int const D = in.cache.head_dim();
  F f;
  set_score_inputs(f, in);
  f.terms = terms;
  f.packets = D % F::packet == 0 && in.cache.rows_aligned(16);
  if (warp_lanes) {
    f.warps = mma_team_warps;
  } else {
    // The launch's own policy (an unbounded one would compile a kernel of
    // its own for the query).
    KokkosExt::BoundedTeamPolicy<ExecutionSpace, F> const probe(space, 1, 1, 1);
    int const max = probe.team_size_max(f, Kokkos::ParallelForTag());
    int const want = options.team_size > 0 ? options.team_size : mma_team_warps;
    f.warps = std::max(1, std::min(want, max));
  }
  f.rows_per_team = rows_per_team_for(in.batch.total_rows, in.batch.num_requests);
  std::size_t const max0 = scratch_max<ExecutionSpace>(0);
  std::size_t const budget =
      device_shapes<ExecutionSpace>::value ? device_scratch0<ExecutionSpace>() : max0;
  // Fewer rows a team, then fewer warps, one at a time (each stages its
  // own key tile), until the team's scratch fits the level-0 scratch the
  // backend reports (40,936 bytes on an H200 with Kokkos 4.6: a rotated
  // fp8 decode call, H = 32, D = 128, takes 3 warps).
  while (f.rows_per_team > 1 &&
         F::scratch_bytes(f.rows_per_team, terms, in.heads, D, f.warps, 1) > budget)
    f.rows_per_team /= 2;
  while (f.warps > 1 && F::scratch_bytes(f.rows_per_team, terms, in.heads, D, f.warps, 1) > budget)
    --f.warps;
  // A launch whose kernel scans over its team (the fused decode
  // selection) takes a power-of-two team.
  if (run.power_of_two_team) f.warps = power_of_two_floor(f.warps);
  // The rows' first-digit histograms built while scoring (in.row_hist):
  // with one query row a team, rows of at most score_hist_max_pools pools
  // (a team's counts are 16-bit) and the counts' 4 KiB of scratch beside
  // the rows and warps; otherwise none, and the top-k counts the rows
  // itself (the caller learns which from the functor's row_hist).
  // Keys taken as they are count in the key ring only
  // (F::counts_one_tile), so those need a ring of 2 beside the counts.
  int const deepest = options.key_pipeline_depth > 0
                          ? std::min(options.key_pipeline_depth, F::max_depth)
                          : F::max_depth;
  bool const ring = f.packets && F::direct_keys;
  int const hist_depth = F::direct_keys ? 2 : 1;
  bool const hist = f.row_hist != nullptr && f.rows_per_team == 1 &&
                    in.batch.max_visible <= score_hist_max_pools &&
                    (!F::direct_keys || (ring && deepest >= 2)) &&
                    F::scratch_bytes(1, terms, in.heads, D, f.warps, hist_depth, true) <= budget;
  if (!hist) f.row_hist = nullptr;
  // Then the deepest key ring (F::score_ring) the same rows and warps fit
  // in fast scratch, where the tiles are copied as they are: 16-byte
  // packets whose bytes are the MMA's operands (Options::key_pipeline_depth
  // caps it; 1 stages each tile, then scores it).
  if (ring)
    while (f.depth < deepest &&
           F::scratch_bytes(f.rows_per_team, terms, in.heads, D, f.warps, f.depth + 1, hist) <=
               budget)
      ++f.depth;
  std::size_t const bytes =
      F::scratch_bytes(f.rows_per_team, terms, in.heads, D, f.warps, f.depth, hist);
  if (device_shapes<ExecutionSpace>::value && bytes > budget)
    fail_device_scratch<ExecutionSpace>(chk, "tensor_cores", "one query row and a warp's tiles",
                                        in.heads, D, bytes);
  f.scratch_level = bytes > max0 ? 1 : 0;
  if (bytes > scratch_max<ExecutionSpace>(1))
    fail_team_scratch(chk, "tensor_cores", "use tiles", in.heads, D);
  std::size_t const groups = row_groups(in.batch, f.rows_per_team);
  f.splits = tile_splits(space, groups, in.batch.max_visible, mma_tile_pools * f.warps);
  f.virtual_teams = static_cast<std::uint64_t>(groups) * static_cast<std::uint64_t>(f.splits);
  LaunchShape shape;
  shape.league = static_cast<int>(f.virtual_teams);
  if (run.persistent)
    shape.league = persistent_teams(space, f.virtual_teams, f.warps, options.scoring_teams,
                                    run.register_cap);
  shape.team_size = warp_lanes ? 32 * f.warps : f.warps;
  shape.scratch_bytes = bytes;
  shape.scratch_level = f.scratch_level;
  shape.exact_team = true;
  run(chk.entry_point() + "::score_tensor_cores", shape, f);
}

// Whether the engine's kernel of Kind can run on ExecutionSpace, so that it
// is compiled only there: on hosts (the 32-lane emulation) and on CUDA
// where the build's architecture and compiler have the instruction; never
// on HIP or another device backend, where no kernel of it would launch.
template <class ExecutionSpace, MmaKind Kind>
constexpr bool mma_kernel_runs() {
  if constexpr (KokkosExt::is_device_backend<ExecutionSpace>::value)
    return mma_lanes<ExecutionSpace>::value == 1 && mma_device_supported<Kind>::value;
  else
    return true;
}

template <class ExecutionSpace, class T, class C, class Run>
void launch_score_mma(Checker const& chk, ExecutionSpace const& space,
                      ScoreInputs<ExecutionSpace, T, C> const& in, Options const& options,
                      Run const& run) {
  if constexpr (mma_types<T, C>::value) {
    MmaPlan const plan = mma_plan<ExecutionSpace, T, C>(in.cache.rotate, in.cache.serving);
    if (!plan.usable)
      chk.fail("workspace", "engine", -1, "tensor_cores",
               std::string("does not take this call (") + plan.why + ")");
    // mma_plan refuses what mma_kernel_runs leaves out.
    if (plan.kind == MmaKind::e4m3) {
      // Its teams stage the queries' E4M3 bytes as they are (the call
      // prepares them so for this engine: mma_query_codes).
      if (!in.prepared_codes)
        chk.fail("workspace", "engine", -1, "tensor_cores",
                 "takes the serving profile's queries prepared as E4M3 bytes, and this call "
                 "prepared values (an internal error)");
      if constexpr (std::is_same<C, float8_e4m3>::value &&
                    mma_kernel_runs<ExecutionSpace, MmaKind::e4m3>())
        launch_score_mma_kind<ExecutionSpace, T, C, MmaKind::e4m3>(chk, space, in, options, 1,
                                                                   run);
    } else if (plan.kind == MmaKind::f16) {
      if constexpr (std::is_same<C, float16>::value &&
                    mma_kernel_runs<ExecutionSpace, MmaKind::f16>())
        launch_score_mma_kind<ExecutionSpace, T, C, MmaKind::f16>(chk, space, in, options,
                                                                  plan.terms, run);
    } else if (in.cache.serving) {
      // The serving profile on the bf16 MMA (KPOOL_SERVING_MMA_BF16).
      if constexpr (std::is_same<C, float8_e4m3>::value && KPOOL_SERVING_MMA_BF16 &&
                    mma_kernel_runs<ExecutionSpace, MmaKind::bf16>())
        launch_score_mma_kind<ExecutionSpace, T, C, MmaKind::bf16, true>(chk, space, in,
                                                                         options, 1, run);
    } else {
      if constexpr (!std::is_same<C, float16>::value &&
                    mma_kernel_runs<ExecutionSpace, MmaKind::bf16>())
        launch_score_mma_kind<ExecutionSpace, T, C, MmaKind::bf16>(chk, space, in, options,
                                                                   plan.terms, run);
    }
  } else {
    (void)space, (void)in, (void)options, (void)run;
    chk.fail("workspace", "engine", -1, "tensor_cores",
             "does not take f32 or f64 caches (use tiles)");
  }
}

template <class ExecutionSpace, class T, class C, int HB, class Run>
void launch_score_registers_hb(Checker const& chk, ExecutionSpace const& space,
                               ScoreInputs<ExecutionSpace, T, C> const& in, Run const& run) {
  using F = ScoreRegisterFunctor<ExecutionSpace, T, C, HB>;
  int const D = in.cache.head_dim();
  F f;
  set_score_inputs(f, in);
  // Queries of one request share each key tile while it is in cache.
  f.rows_per_team = rows_per_team_for(in.batch.total_rows, in.batch.num_requests);
  std::size_t const bytes = F::scratch_bytes(f.rows_per_team, in.heads, D);
  f.scratch_level = bytes > scratch_max<ExecutionSpace>(0) ? 1 : 0;
  if (bytes > scratch_max<ExecutionSpace>(1))
    fail_team_scratch(chk, "register_tiles", "use the blas engine", in.heads, D);
  std::size_t const groups = row_groups(in.batch, f.rows_per_team);
  f.splits = tile_splits(space, groups, in.batch.max_visible, register_tile_pools);
  // One thread a team: the tile kernel is the team's whole work.
  LaunchShape shape;
  shape.league = static_cast<int>(groups * f.splits);
  shape.team_size = 1;
  shape.scratch_bytes = bytes;
  shape.scratch_level = f.scratch_level;
  shape.host_only = true;
  shape.exact_team = true;
  run(chk.entry_point() + "::score_register_tiles", shape, f);
}

// Register blocks of 8 heads (4, 2, 1 for fewer heads; the last block is
// padded with zero heads).
template <class ExecutionSpace, class T, class C, class Run>
void launch_score_registers(Checker const& chk, ExecutionSpace const& space,
                            ScoreInputs<ExecutionSpace, T, C> const& in, Run const& run) {
  if (in.heads >= 8)
    launch_score_registers_hb<ExecutionSpace, T, C, 8>(chk, space, in, run);
  else if (in.heads >= 4)
    launch_score_registers_hb<ExecutionSpace, T, C, 4>(chk, space, in, run);
  else if (in.heads >= 2)
    launch_score_registers_hb<ExecutionSpace, T, C, 2>(chk, space, in, run);
  else
    launch_score_registers_hb<ExecutionSpace, T, C, 1>(chk, space, in, run);
}

// How a scoring kernel is launched: alone (LaunchScore), or wrapped with
// the top-k in the fused decode selection's kernel
// (select/detail/KPool_TopkFused.hpp). run(label, shape, f) launches
// functor f of the shape the engine planned; power_of_two_team asks the
// engines whose layout is their team (tensor_cores) for a power-of-two one;
// persistent lets the tensor-core engine launch fewer teams than its work,
// as many as a kernel of register_cap registers a thread keeps resident.
template <class ExecutionSpace>
struct LaunchScore {
  ExecutionSpace space;
  static constexpr bool power_of_two_team = false;
  // The tensor-core engine launches persistent teams (persistent_teams),
  // as many as its launch bounds keep resident.
  static constexpr bool persistent = true;
  static constexpr int register_cap = mma_register_cap;
  // Where set, told the rows' histograms the launch builds (null: none).
  std::uint32_t const** built_hist = nullptr;
  // Plan only: tell built_hist and launch nothing (the tensor-core engine
  // only, whose planning has no side effect; SelectCall asks before it
  // prepares, so that the preparation zeroes only histograms a launch
  // builds).
  bool plan_only = false;
  template <class F>
  void operator()(std::string const& label, LaunchShape const& shape, F const& f) const {
    if (built_hist != nullptr) *built_hist = f.row_hist;
    if (!plan_only) launch(space, label, shape, f);
  }
};

// Scores rows [in.batch.row_begin, in.batch.row_end) into the workspace's
// keys with the engine resolve_engine chose, on the caller's instance (the
// team engines through `run`; blas is its own launches).
template <class ExecutionSpace, class T, class C, class Workspace, class Run>
void launch_score(Checker const& chk, ExecutionSpace const& space, ScoreEngine engine,
                  ScoreInputs<ExecutionSpace, T, C> const& in, Workspace& workspace,
                  Options const& options, Run const& run) {
  if (engine == ScoreEngine::blas) {
#if KPOOL_HAS_KOKKOSKERNELS
    using M = typename ExecutionSpace::memory_space;
    if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, M>::accessible) {
      score_blas<ExecutionSpace, T, C>(
          chk.entry_point(), space, in.batch, in.prepared, in.prepared_weights, in.cache, in.keys,
          workspace.blas_queries(), workspace.blas_keys(), workspace.blas_products(),
          workspace.blas_weights(), workspace.blas_chunks(), in.heads);
    }
#endif
  } else if (engine == ScoreEngine::register_tiles) {
    if constexpr (!KokkosExt::is_device_backend<ExecutionSpace>::value) {
      launch_score_registers<ExecutionSpace, T, C>(chk, space, in, run);
    }
  } else if (engine == ScoreEngine::tiles) {
    launch_score_tiles<ExecutionSpace, T, C>(chk, space, in, options, run);
  } else if (engine == ScoreEngine::tensor_cores) {
    launch_score_mma<ExecutionSpace, T, C>(chk, space, in, options, run);
  } else {
#if KPOOL_HAS_KOKKOSKERNELS
    launch_score_team_gemm<ExecutionSpace, T, C>(chk, space, in, options, run);
#endif
  }
  (void)workspace, (void)run;
}

}  // namespace Details
}  // namespace KPool

#endif
