#ifndef KPOOL_SCORE_DETAIL_SCORE_PREPARE_HPP
#define KPOOL_SCORE_DETAIL_SCORE_PREPARE_HPP

// Queries prepared once (docs/indexer.md, "Scoring"): before a chunk of
// query rows is scored, one launch prepares every (row, head) of the chunk
// exactly once into the workspace, as prepare_query_row defines it (exact
// profile: R(q) times the nearest 1/sqrt(D), the weight as given; serving
// profile: the E4M3 codes of bf16(R(q)) as values, the weight times the
// query's scale s_q), and every scoring team of every engine reads the
// prepared row and weight instead of preparing them again for each split
// of the row's pools.
//
// With device shapes the launch's teams are warps_per_team warps (team
// threads of 32 vector lanes), each warp one (row, head): its lanes share
// the row, the butterflies a stage at a time over the channel pairs (a
// warp sync between stages), the serving amax as a max of integer
// magnitudes over the lanes, the rounding and E4M3 codes a channel a lane.
// The fused decode selection's prologue prepares with its whole team the
// same way (prepare: a team barrier between stages). Every value goes
// through the same operations as in prepare_query_row (a stage's pairs are
// independent; the max of integers is exact in any order), so the prepared
// bytes are the same whatever the group; the unit suite compares them with
// prepare_query_row on every profile. On a host a team is one thread and
// runs prepare_query_row itself.
//
// Operand codes (`codes`, the serving profile on the tensor-core engine's
// E4M3 MMA, docs/indexer.md): each (row, head) is written as the E4M3 bytes
// its scoring multiplies (float_to_e4m3_bits of its code values, which the
// engine used to take from the f32 values as it staged them), D bytes at
// the start of the (row, head)'s own region of `prepared` (its D values'
// place): 4 KiB a row for H = 32, D = 128 instead of 16, read by the
// scoring teams with 16-byte loads and no conversion. Only the bytes
// change place; every code is the one the values held.

#include <common/detail/KPool_ServingQuant.hpp>
#include <common/detail/KPool_KokkosExt.hpp>
#include <common/detail/KPool_Launch.hpp>
#include <common/detail/KPool_Strided.hpp>
#include <common/detail/KPool_Scoring.hpp>

#include <cstdint>
#include <string>
#include <type_traits>

namespace KPool {
namespace Details {

template <class ExecutionSpace, class T, class A>
struct PrepareQueriesFunctor {
  using member_type = typename KokkosExt::TeamPolicy<ExecutionSpace>::member_type;
  using scratch_space = typename ExecutionSpace::scratch_memory_space;
  using Row = Kokkos::View<A*, scratch_space,
                           Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  static constexpr bool team_rows = device_shapes<ExecutionSpace>::value;

  Strided<const T, 3> q;            // [T, H, D]
  Strided<const float, 2> weights;  // [T, H]
  QueryPrep<A> prep;
  A* prepared;           // [chunk rows][H][D]
  A* prepared_weights;   // [chunk rows][H]
  std::uint64_t row0;    // the chunk's first query row
  int heads;
  int head_dim;

  std::uint64_t items = 0;  // the chunk's (row, head)s (the launch's)
  // Serving profile: the E4M3 bytes instead of the values (above).
  bool codes = false;
  // [chunk rows][score_hist_bins], or null: the rows' histograms built
  // while scoring (ScoreTeamInputs::row_hist), zeroed here with each row's
  // head 0, before any team scores the row.
  std::uint32_t* row_hist = nullptr;
  // Warps a team of the launch (with device shapes), each one (row, head).
  static constexpr int warps_per_team = 4;
  static constexpr int warp_lanes = 32;
  // 16 teams of 4 warps an SM on CUDA, the most an SM's 64 warps hold: a
  // cap of 32 registers, which the kernel meets without a spill (38
  // without bounds since it writes E4M3 bytes and zeroes histograms, 12
  // teams an SM; nvcc 13, sm_90).
  using launch_bounds = Kokkos::LaunchBounds<warps_per_team * warp_lanes, 16>;

  // The fused prologue's need (a row for its team).
  static std::size_t scratch_bytes(int head_dim) {
    return team_rows ? Row::shmem_size(static_cast<std::size_t>(head_dim)) : 0;
  }
  // The launch's: a row a warp (warps_per_team at most), each 16-byte
  // aligned, and 16 bytes for the block's own alignment. Plain arithmetic:
  // the kernel calls it (View::shmem_size checks its arguments with an
  // assertion, which costs a kernel a stack frame on CUDA).
  KOKKOS_INLINE_FUNCTION static std::size_t warp_row_bytes(int head_dim) {
    return (static_cast<std::size_t>(head_dim) * sizeof(A) + 15) / 16 * 16;
  }
  KOKKOS_INLINE_FUNCTION static std::size_t launch_scratch_bytes(int head_dim) {
    return team_rows ? warps_per_team * warp_row_bytes(head_dim) + 16 : 0;
  }

  KOKKOS_INLINE_FUNCTION void operator()(member_type const& member) const {
    if constexpr (!team_rows) {
      prepare(member, member.team_scratch(0), static_cast<std::uint64_t>(member.league_rank()));
    } else {
      // A row of scratch each warp, taken before any warp leaves.
      A* const rows = static_cast<A*>(member.team_scratch(0).get_shmem_aligned(
          launch_scratch_bytes(head_dim) - 16, 16));
      std::uint64_t const item =
          static_cast<std::uint64_t>(member.league_rank()) *
              static_cast<std::uint64_t>(member.team_size()) +
          static_cast<std::uint64_t>(member.team_rank());
      if (item >= items) return;  // no barrier follows: only warp syncs
      Row const v(rows + static_cast<std::size_t>(member.team_rank()) *
                             warp_row_bytes(head_dim) / sizeof(A),
                  head_dim);
      prepare_by(
          v, item, [&](int n) { return Kokkos::ThreadVectorRange(member, n); },
          [&]() { warp_sync(); },
          [&](auto const& f) { Kokkos::single(Kokkos::PerThread(member), f); });
    }
  }

  // The histogram of (row, head) `item`'s row.
  KOKKOS_INLINE_FUNCTION std::uint32_t* hist_of(std::uint64_t item) const {
    return row_hist + item / static_cast<std::uint64_t>(heads) * score_hist_bins;
  }

  // Whether the serving values are written as E4M3 bytes.
  KOKKOS_INLINE_FUNCTION bool codes_out() const {
    if constexpr (std::is_same<A, float>::value)
      return codes && prep.serving;
    else
      return false;
  }

  KOKKOS_FORCEINLINE_FUNCTION static void warp_sync() {
#if defined(__CUDA_ARCH__)
    __syncwarp();
#endif
  }

  // (Row, head) `item` of the chunk ([rows][H] order), by the whole team;
  // its scratch row (with device shapes) from `scratch`, a level-0 scratch
  // space the caller may copy (the fused decode selection's prologue,
  // select/detail/KPool_TopkFused.hpp, prepares with its own team).
  KOKKOS_INLINE_FUNCTION void prepare(member_type const& member, scratch_space const& scratch,
                                      std::uint64_t item) const {
    if constexpr (!team_rows) {
      std::uint64_t const t = row0 + item / static_cast<std::uint64_t>(heads);
      int const h = static_cast<int>(item % static_cast<std::uint64_t>(heads));
      int const D = head_dim;
      A* const out = prepared + item * static_cast<std::uint64_t>(D);
      // A host team of several threads (a fused call's) prepares it once.
      Kokkos::single(Kokkos::PerTeam(member), [&]() {
        if (row_hist != nullptr && h == 0)
          for (int d = 0; d < score_hist_bins; ++d) hist_of(item)[d] = 0;
        for (int c = 0; c < D; ++c) out[c] = to_accumulator(q(t, h, c));
        prepared_weights[item] = prepare_query_row(out, D, prep, weights(t, h));
        // In place, in order: byte c lands in value c / 4, already read.
        if (codes_out())
          for (int c = 0; c < D; ++c)
            reinterpret_cast<std::uint8_t*>(out)[c] = float_to_e4m3_bits(static_cast<float>(out[c]));
      });
      (void)scratch;
    } else {
      prepare_by(
          Row(scratch, head_dim), item,
          [&](int n) { return Kokkos::TeamThreadRange(member, n); },
          [&]() { member.team_barrier(); },
          [&](auto const& f) { Kokkos::single(Kokkos::PerTeam(member), f); });
    }
  }

  // (Row, head) `item` by a group of threads sharing the scratch row v:
  // range(n) their range over [0, n) (a team's threads, or a warp's
  // lanes), sync() between stages (a team barrier, or a warp's), one(f)
  // runs f once for the group.
  template <class Range, class Sync, class One>
  KOKKOS_INLINE_FUNCTION void prepare_by(Row const& v, std::uint64_t item, Range const& range,
                                         Sync const& sync, One const& one) const {
    std::uint64_t const t = row0 + item / static_cast<std::uint64_t>(heads);
    int const h = static_cast<int>(item % static_cast<std::uint64_t>(heads));
    int const D = head_dim;
    A* const out = prepared + item * static_cast<std::uint64_t>(D);
    {
      if (row_hist != nullptr && h == 0) {
        std::uint32_t* const hist = hist_of(item);
        Kokkos::parallel_for(range(score_hist_bins), [&](int d) { hist[d] = 0; });
      }
      Kokkos::parallel_for(range(D), [&](int c) { v(c) = to_accumulator(q(t, h, c)); });
      sync();
      if (prep.rotate) {
        for (int s = 1; s < D; s *= 2) {
          Kokkos::parallel_for(range(D / 2), [&](int p) {
            int const lo = (p / s) * 2 * s + p % s;
            A const a = v(lo), b = v(lo + s);
            v(lo) = a + b;
            v(lo + s) = a - b;
          });
          sync();
        }
      }
      A w = static_cast<A>(weights(t, h));
      bool serving = false;
      if constexpr (std::is_same<A, float>::value) serving = prep.serving;
      if (serving) {
        float const factor = prep.rotate ? static_cast<float>(prep.rsqrt) : 1.0f;
        std::uint32_t m = 0;
        Kokkos::parallel_reduce(
            range(D),
            [&](int c, std::uint32_t& local) {
              float const r = round_to_bf16(static_cast<float>(v(c)) * factor);
              v(c) = static_cast<A>(r);
              std::uint32_t const a = serving_magnitude_bits(r);
              local = a > local ? a : local;
            },
            Kokkos::Max<std::uint32_t>(m));
        float const scale = serving_scale(m);
        float const inv = 1.0f / scale;
        if (codes_out()) {
          std::uint8_t* const bytes = reinterpret_cast<std::uint8_t*>(out);
          Kokkos::parallel_for(range(D), [&](int c) {
            bytes[c] = float_to_e4m3_bits(
                static_cast<float>(serving_code(static_cast<float>(v(c)), inv)));
          });
        } else {
          Kokkos::parallel_for(range(D), [&](int c) {
            out[c] = static_cast<A>(static_cast<float>(serving_code(static_cast<float>(v(c)), inv)));
          });
        }
        w = static_cast<A>(static_cast<float>(weights(t, h)) * scale);
      } else {
        Kokkos::parallel_for(range(D), [&](int c) {
          out[c] = prep.rotate ? v(c) * prep.rsqrt : v(c);
        });
      }
      one([&]() { prepared_weights[item] = w; });
    }
  }
};

// Prepares query rows [row0, row0 + rows) of q into `prepared` ([rows][H]
// [D]) and their weights into `prepared_weights` ([rows][H]), one team a
// (row, head), on the caller's instance; `codes`: the serving profile's
// values as E4M3 bytes; `row_hist`: the rows' histograms to zero
// (PrepareQueriesFunctor).
template <class ExecutionSpace, class T, class A>
void launch_prepare_queries(Checker const& chk, ExecutionSpace const& space,
                            Strided<const T, 3> const& q, Strided<const float, 2> const& weights,
                            QueryPrep<A> const& prep, std::uint64_t row0, std::uint64_t rows,
                            int heads, int head_dim, A* prepared, A* prepared_weights,
                            bool codes = false, std::uint32_t* row_hist = nullptr) {
  using F = PrepareQueriesFunctor<ExecutionSpace, T, A>;
  if (rows == 0) return;
  std::uint64_t const items = rows * static_cast<std::uint64_t>(heads);
  F const f{q,     weights, prep,  prepared, prepared_weights, row0,
            heads, head_dim, items, codes,   row_hist};
  LaunchShape shape;
  if constexpr (F::team_rows) {
    // Teams of warps_per_team warps (as many as the backend allows), a
    // (row, head) a warp.
    KokkosExt::BoundedTeamPolicy<ExecutionSpace, F> const probe(space, 1, 1, F::warp_lanes);
    int const max = probe.team_size_max(f, Kokkos::ParallelForTag());
    int const warps = max < F::warps_per_team ? (max < 1 ? 1 : max) : F::warps_per_team;
    shape.league = league_for(chk, "q", items, warps);
    shape.team_size = warps;
    shape.lanes = F::warp_lanes;
  } else {
    shape.league = league_for(chk, "q", items, 1);
  }
  shape.scratch_bytes = F::launch_scratch_bytes(head_dim);
  launch(space, chk.entry_point() + "::prepare_queries", shape, f);
}

}  // namespace Details
}  // namespace KPool

#endif
