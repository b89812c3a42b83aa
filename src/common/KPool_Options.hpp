#ifndef KPOOL_COMMON_OPTIONS_HPP
#define KPOOL_COMMON_OPTIONS_HPP

#include <KPool_Config.hpp>

namespace KPool {

/// How KPool::score_select and KPool::select_tokens multiply queries by
/// cached keys (docs/performance.md, "The selection stage"). Every engine selects by the
/// same rule and differs only in summation order (docs/indexer.md's tolerance);
/// register_tiles, tiles and team_gemm also score identical pools
/// identically, so exact ties go to the lower id.
enum class ScoreEngine {
  /// register_tiles on host execution spaces; on devices tensor_cores
  /// where it takes the call (Kokkos::Cuda, sm_80 and newer, and a cache
  /// type and profile it serves), else tiles, else (a query row's tile
  /// past a team's fast scratch: f64 with 32 heads of 128 channels)
  /// team_gemm. All but team_gemm and blas are KPool's own code.
  automatic,
  /// Hosts: per team, tiles of 32 pools dequantized transposed into team
  /// scratch, multiplied by a hand-written register-blocked kernel (one
  /// vector lane a pool). One launch to score, one to select.
  register_tiles,
  /// Every execution space: per team, queries and a tile of dequantized
  /// keys in team scratch, multiplied by KokkosBatched::TeamGemm. One
  /// launch to score, one to select. Needs Kokkos Kernels (refused by name
  /// without it); the devices' fallback, no host's choice.
  team_gemm,
  /// Every execution space, one Kokkos source (the device default): per
  /// team, a group of query rows staged and rotated once, then tiles of 32
  /// pools dequantized transposed into team scratch, register-blocked over
  /// 8 heads x several pools per thread, the teams of a group splitting
  /// its tiles by the visible pools. One launch to score, one to select.
  tiles,
  /// Hosts: per request and chunk of pools, dequantize into the workspace,
  /// one KokkosBlas::gemm (the BLAS Kokkos Kernels was built with; refused
  /// by name without Kokkos Kernels), then a relu / weights pass. Runs on the calling thread and fences the
  /// execution space instance. An optimized BLAS computes edge rows and
  /// columns with other kernels than the rest, so identical pools may
  /// score a rounding apart: exact ties are then not guaranteed to go to
  /// the lower id (the selection still meets docs/indexer.md's tolerance).
  blas,
  /// CUDA devices (sm_80 and newer): the products on tensor cores
  /// (mma.sync), tiles of 16 pools x 8 heads a warp, relu, weights and the
  /// head sum in registers. Takes fp8 caches (bf16 MMA, the f32 query split
  /// into exact bf16 terms), bf16 caches, and f16 caches that are not
  /// rotated (f16 MMA); automatic chooses it on Kokkos::Cuda for those. On
  /// other execution spaces the same tile code runs with the MMA emulated
  /// (for tests: slow). One launch to score, one to select.
  tensor_cores
};

/// How a decode selection (KPool::score_select or KPool::select_tokens with
/// a decode Batch) launches its scoring and its top-k (docs/indexer.md,
/// "One launch for a decode selection"). Both give the same bits.
enum class DecodeSelection {
  /// The faster of the two on an H200 by perf_tests/gpu/cost_model.py
  /// (docs/performance.md), where the call allows it: on a device fused
  /// for the tensor-core engine in the serving profile, separate
  /// otherwise; separate on hosts. A device run may overturn it.
  automatic,
  /// One launch: each group of rows is scored by its teams, and the team
  /// that finishes last selects the group's rows. Refused by name where
  /// the call does not allow it: the blas engine, a workspace for rows
  /// longer than 65536 pools (max_visible), or a topk past the level-0
  /// team scratch.
  fused,
  /// Two launches: the scoring, then the top-k (a team a row).
  separate
};

/// Per-call settings, the optional last argument of every entry point.
///
/// A plain aggregate; in C++17 set fields one by one:
/// `KPool::Options o; o.validate = false;`.
struct Options {
  /// Check the arguments' data, not only their shapes, before launching
  /// anything (docs/validation.md): row_offsets, cache_lengths, slot_idx
  /// and decode positions. These checks fence the execution space instance
  /// and copy the small per-request arrays to the host, one host
  /// synchronization per call. Turn off where inputs are validated
  /// upstream (and to capture calls in a CUDA graph); device code still
  /// never writes outside the ring or the outputs. Defaults to
  /// KPOOL_VALIDATE_BY_DEFAULT (the CMake option KPool_ENABLE_VALIDATION).
  bool validate = KPOOL_VALIDATE_BY_DEFAULT != 0;
  /// Threads per team; 0 lets KPool choose (Kokkos' recommendation for
  /// the functor on devices, 1 on hosts). Capped at what the execution
  /// space allows. Never changes results.
  int team_size = 0;
  /// Teams of the tensor-core engine's scoring launch (the selection's,
  /// KPool::score's and the fused decode selection's), a persistent
  /// launch whose teams each take an equal, contiguous share of the call's
  /// (row group, pool split) work: 0 lets KPool choose (on CUDA as many as
  /// are resident: the SMs times the teams an SM holds; on a host one a
  /// share, as if not persistent), a positive count takes at most that
  /// many, for example to leave SMs to other streams. Negative is refused
  /// by name. Never changes results.
  int scoring_teams = 0;
  /// Key tiles each warp of the tensor-core engine keeps in flight while
  /// it scores (the key pipeline: a ring of tiles in team scratch, each
  /// copied asynchronously, cp.async on CUDA): 0 lets KPool choose (the
  /// deepest, up to 3, that fits the team's fast scratch beside its query
  /// rows and warps, where the cache's rows are 16-byte packets the MMA
  /// takes as they are), 1 takes no ring (each tile staged, then scored),
  /// 2 or more caps the ring. Keys converted as they are staged (the exact
  /// profile's fp8 keys) take no ring and keep the next tile's packets in
  /// registers whatever it says. Negative is refused by name. Never
  /// changes results.
  int key_pipeline_depth = 0;
  /// Whether the tensor-core engine builds each query row's first-digit
  /// histogram while it scores (true, the default), so that the top-k
  /// starts from it instead of a pass over the row's keys. It applies on
  /// devices and in device-shapes builds, to selections (not KPool::score)
  /// whose teams score one query row (decode-shaped calls), whose rows
  /// have fewer than 2^16 pools and whose cache is not sharded, where the
  /// counts fit the team's fast scratch; elsewhere the top-k counts
  /// itself. false always lets the top-k count. Never changes results.
  bool score_histograms = true;
  /// KPool::step only: one launch for ring_close, compress and seed_tail
  /// (true, the default) or three (false). Both give the same bits.
  bool fused = true;
#if KPOOL_ENABLE_DEPRECATED
  /// Retired: the scoring engine is the selection workspace's, chosen when
  /// it is built (SelectWorkspace's `engine`). This may only repeat it, or
  /// choose one where the workspace was built for ScoreEngine::automatic; a
  /// contradiction is refused by name. Gone with KPool_ENABLE_DEPRECATED=OFF.
  ScoreEngine score_engine = ScoreEngine::automatic;
#endif
  /// KPool::score_select and KPool::select_tokens with a decode Batch
  /// only: the scoring and the top-k in one launch or two (see
  /// DecodeSelection).
  DecodeSelection decode_selection = DecodeSelection::automatic;
};

}  // namespace KPool

#endif
