#ifndef KPOOL_SCORE_DETAIL_SCORE_TEAM_GEMM_HPP
#define KPOOL_SCORE_DETAIL_SCORE_TEAM_GEMM_HPP

// The team-GEMM scoring engine (ScoreEngine::team_gemm): scores as keys,
// one launch, everything on the caller's execution space instance.
//
// A team owns a group of `rows_per_team` consecutive query rows and every
// `splits`-th tile of `tile_pools` pools they can see. It rotates its
// queries once into team scratch, then per tile dequantizes the cached keys
// into scratch, multiplies them with KokkosBatched::TeamGemm
// ([rows * H, D] x [D, tile]^T) and folds the products into one key per
// (row, pool): sum_h w_h relu(s_p * (R(q_h) . v_p)). A group that straddles
// two requests handles each part with its own block table row.

#include <KPool_Config.hpp>
#include <common/KPool_Types.hpp>
#include <common/detail/KPool_ServingQuant.hpp>
#include <common/detail/KPool_KokkosExt.hpp>
#include <common/detail/KPool_Strided.hpp>
#include <common/detail/KPool_Scoring.hpp>

#if KPOOL_HAS_KOKKOSKERNELS
#include <KokkosBatched_Gemm_Decl.hpp>
#endif

#include <cstdint>
#include <type_traits>

#if KPOOL_HAS_KOKKOSKERNELS
namespace KPool {
namespace Details {

// Level: the team scratch level, a template argument so that no scratch
// pointer is chosen at run time (which keeps a stack frame on devices).
template <class ExecutionSpace, class T, class C, int Level = 0>
struct ScoreTeamGemmFunctor : ScoreTeamInputs<ExecutionSpace, T, C> {
  KPOOL_IMPL_SCORE_TEAM_INPUTS(ExecutionSpace, T, C);
  int tile_pools;
  using Tile = Kokkos::View<A**, Kokkos::LayoutRight, scratch_space,
                            Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using Column = Kokkos::View<A*, scratch_space,
                              Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using Flags = Kokkos::View<int*, scratch_space,
                             Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  // Register-blocked products where a team is one host thread; with
  // device shapes the unblocked form spreads (row, pool) products over the
  // team.
  using Algo = typename std::conditional<
      device_shapes<ExecutionSpace>::value,
      KokkosBatched::Algo::Gemm::Unblocked,
      KokkosBatched::Algo::Gemm::Blocked>::type;


  static std::size_t scratch_bytes(int rows, int tile, int heads, int D) {
    return Tile::shmem_size(rows * heads, D) + Tile::shmem_size(rows, heads) +
           Tile::shmem_size(tile, D) + Tile::shmem_size(rows * heads, tile) +
           Column::shmem_size(tile) + Flags::shmem_size(tile);
  }

  KOKKOS_INLINE_FUNCTION void operator()(member_type const& member) const {
    int const H = heads;
    int const D = cache.head_dim();
    int const TQ = rows_per_team;
    int const TP = tile_pools;
    Tile qs(member.team_scratch(Level), TQ * H, D);
    Tile ws(member.team_scratch(Level), TQ, H);
    Tile ks(member.team_scratch(Level), TP, D);
    Tile cs(member.team_scratch(Level), TQ * H, TP);
    Column sc(member.team_scratch(Level), TP);
    Flags ok(member.team_scratch(Level), TP);

    std::uint64_t const group = member.league_rank() / splits;
    int const split = member.league_rank() % splits;
    batch.for_each_run(group, TQ, [&](int r, SelectRequest const& req, std::uint64_t t0,
                                          std::uint64_t t1) {
      score_rows(member, qs, ws, ks, cs, sc, ok, r, req, t0, t1, split);
    });
  }

  // Rows [t0, t1) of request r, every splits-th tile from `split`.
  KOKKOS_INLINE_FUNCTION void score_rows(member_type const& member,
                                         Tile const& qs, Tile const& ws,
                                         Tile const& ks, Tile const& cs,
                                         Column const& sc, Flags const& ok,
                                         int r, SelectRequest const& req,
                                         std::uint64_t t0, std::uint64_t t1,
                                         int split) const {
    int const H = heads;
    int const D = cache.head_dim();
    int const TP = tile_pools;
    int const nrows = static_cast<int>(t1 - t0);
    // Visible counts grow with the row, so the last row sees the most.
    std::uint64_t const vis_hi = batch.visible(req, t1 - 1);
    if (vis_hi <= static_cast<std::uint64_t>(split) * TP) return;

    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, nrows * H), [&](int ih) {
      int const i = ih / H;
      int const h = ih % H;
      A const* x = prepared_row(t0 + i, h);
      for (int c = 0; c < D; ++c) qs(ih, c) = x[c];
      ws(i, h) = prepared_weight(t0 + i, h);
    });
    member.team_barrier();

    auto const q_tile =
        Kokkos::subview(qs, Kokkos::make_pair(0, nrows * H), Kokkos::ALL);
    for (std::uint64_t p0 = static_cast<std::uint64_t>(split) * TP; p0 < vis_hi;
         p0 += static_cast<std::uint64_t>(splits) * TP) {
      int const np = static_cast<int>(vis_hi - p0 < static_cast<std::uint64_t>(TP)
                                          ? vis_hi - p0
                                          : TP);
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, np), [&](int j) {
        CacheSlot const slot = cache.locate(r, static_cast<std::int64_t>(p0 + j));
        bool const usable = slot.block >= 0;
        ok(j) = usable;
        // A bad block is read nowhere: its pools are not visible.
        sc(j) = usable ? static_cast<A>(cache.scale_at(slot)) : A(0);
        A* k = &ks(j, 0);
        if (usable) {
          C const* v = cache.row(slot);
          KPOOL_IMPL_IVDEP
          for (int c = 0; c < D; ++c) k[c] = cache_value<A>(v[c]);
        } else {
          for (int c = 0; c < D; ++c) k[c] = A(0);
        }
      });
      member.team_barrier();
      auto const k_tile = Kokkos::subview(ks, Kokkos::make_pair(0, np), Kokkos::ALL);
      auto const c_tile = Kokkos::subview(cs, Kokkos::make_pair(0, nrows * H),
                                          Kokkos::make_pair(0, np));
      KokkosBatched::TeamGemm<member_type, KokkosBatched::Trans::NoTranspose,
                              KokkosBatched::Trans::Transpose,
                              Algo>::invoke(member, A(1), q_tile, k_tile, A(0),
                                            c_tile);
      member.team_barrier();
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, nrows * np), [&](int ij) {
        int const i = ij / np, j = ij % np;
        write_key(req, t0 + i, p0 + j, ok(j) != 0, [&] {
          A const s = sc(j);
          A score = 0;
          for (int h = 0; h < H; ++h) score += ws(i, h) * relu(s * cs(i * H + h, j));
          return score;
        });
      });
      member.team_barrier();
    }
  }
};

}  // namespace Details
}  // namespace KPool

#endif  // KPOOL_HAS_KOKKOSKERNELS

#endif
