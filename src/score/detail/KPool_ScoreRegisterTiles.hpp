#ifndef KPOOL_SCORE_DETAIL_SCORE_REGISTER_TILES_HPP
#define KPOOL_SCORE_DETAIL_SCORE_REGISTER_TILES_HPP

// The register-tile scoring engine (ScoreEngine::register_tiles), for host
// execution spaces: the same teams, rows and tiles as the team-GEMM engine,
// with a hand-written product. A tile of `pool_lanes` pools is dequantized
// transposed ([D][pools]) into scratch, so that one vector lane is one pool;
// `HB` heads of a query multiply it at once with HB x pools accumulators
// the compiler keeps in vector registers, one fused multiply-add per channel
// in channel order. Every pool therefore goes through exactly the same
// operations wherever it sits in a tile (a padded tile has no remainder
// loop), so identical pools score identically and exact ties reach the
// selection as ties. (An optimized BLAS picks different kernels for edge
// rows and columns, which is why ScoreEngine::blas cannot promise that.)

#include <common/KPool_Types.hpp>
#include <common/detail/KPool_ServingQuant.hpp>
#include <common/detail/KPool_KokkosExt.hpp>
#include <common/detail/KPool_Strided.hpp>
#include <common/detail/KPool_Scoring.hpp>

#include <cstdint>
#include <type_traits>

namespace KPool {
namespace Details {

constexpr int register_tile_pools = 32;

template <class ExecutionSpace, class T, class C, int HB>
struct ScoreRegisterFunctor : ScoreTeamInputs<ExecutionSpace, T, C> {
  KPOOL_IMPL_SCORE_TEAM_INPUTS(ExecutionSpace, T, C);
  using Buffer = Kokkos::View<A*, scratch_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  static constexpr int PT = register_tile_pools;

  int scratch_level;

  KOKKOS_INLINE_FUNCTION static constexpr int padded_heads(int heads) { return (heads + HB - 1) / HB * HB; }
  // Queries [rows][D][padded heads], weights [rows][heads], the key tile
  // [D][PT], its scales and usable flags, one query's scores, and a row
  // to rotate in.
  static constexpr bool fp8 = std::is_same<C, float8_e4m3>::value;
  KOKKOS_INLINE_FUNCTION static constexpr std::size_t scratch_size(int rows, int heads,
                                                               int D) {
    return static_cast<std::size_t>(rows) * D * padded_heads(heads) +
           static_cast<std::size_t>(rows) * heads + static_cast<std::size_t>(D) * PT +
           3 * PT + D + (fp8 ? 256 : 0);
  }
  static std::size_t scratch_bytes(int rows, int heads, int D) {
    return Buffer::shmem_size(scratch_size(rows, heads, D)) + 64;
  }

  KOKKOS_INLINE_FUNCTION void operator()(member_type const& member) const {
    // Team scratch is a bump allocator: take it once per team.
    Buffer const all(member.team_scratch(scratch_level),
                     scratch_size(rows_per_team, heads, cache.head_dim()));
    std::uint64_t const group = member.league_rank() / splits;
    int const split = member.league_rank() % splits;
    batch.for_each_run(group, rows_per_team, [&](int r, SelectRequest const& req, std::uint64_t t0,
                                          std::uint64_t t1) {
      score_rows(member, all.data(), r, req, t0, t1, split);
    });
  }

  KOKKOS_INLINE_FUNCTION void score_rows(member_type const& member, A* buffer, int r,
                                         SelectRequest const& req, std::uint64_t t0,
                                         std::uint64_t t1, int split) const {
    int const H = heads;
    int const HP = padded_heads(H);
    int const D = cache.head_dim();
    int const nrows = static_cast<int>(t1 - t0);
    std::uint64_t const vis_hi = batch.visible(req, t1 - 1);
    if (vis_hi <= static_cast<std::uint64_t>(split) * PT) return;

    std::size_t const nq = static_cast<std::size_t>(rows_per_team) * D * HP;
    A* qt = buffer;                      // [rows][D][HP]
    A* w = qt + nq;                      // [rows][H]
    A* kt = w + rows_per_team * H;       // [D][PT]
    A* sc = kt + static_cast<std::size_t>(D) * PT;  // [PT]
    A* ok = sc + PT;                     // [PT]: 1 usable, 0 bad block
    A* score = ok + PT;                  // [PT]
    A* rot = score + PT;                 // [D]
    // fp8 values by code: staging a tile is then a load a value, which
    // keeps it small next to the tile's products even for one query.
    A* lut = rot + D;                    // [256] (fp8 only)

    Kokkos::single(Kokkos::PerTeam(member), [&]() {
      if (fp8)
        for (int b = 0; b < 256; ++b)
          lut[b] = cache_value<A>(float8_e4m3::from_bits(static_cast<std::uint8_t>(b)));
      for (int i = 0; i < nrows; ++i) {
        A* qi = qt + static_cast<std::size_t>(i) * D * HP;
        for (int h = 0; h < HP; ++h) {
          if (h < H) {
            A const* x = prepared_row(t0 + i, h);
            for (int c = 0; c < D; ++c) qi[c * HP + h] = x[c];
            w[i * H + h] = prepared_weight(t0 + i, h);
          } else {
            for (int c = 0; c < D; ++c) qi[c * HP + h] = A(0);
          }
        }
      }
    });
    member.team_barrier();

    for (std::uint64_t p0 = static_cast<std::uint64_t>(split) * PT; p0 < vis_hi;
         p0 += static_cast<std::uint64_t>(splits) * PT) {
      int const np = vis_hi - p0 < static_cast<std::uint64_t>(PT)
                         ? static_cast<int>(vis_hi - p0)
                         : PT;
      Kokkos::single(Kokkos::PerTeam(member), [&]() {
        stage_keys(r, p0, np, kt, sc, ok, lut);
        for (int i = 0; i < nrows; ++i) {
          std::uint64_t const t = t0 + i;
          std::uint64_t const vis = batch.visible(req, t);
          if (vis <= p0) continue;
          score_tile(qt + static_cast<std::size_t>(i) * D * HP, w + i * H, kt, sc, score);
          int const n = vis - p0 < static_cast<std::uint64_t>(np) ? static_cast<int>(vis - p0) : np;
          Key* out = keys + batch.key_offset(t) + p0;
          for (int j = 0; j < n; ++j)
            out[j] = ok[j] != A(0) ? score_key(score[j]) : static_cast<Key>(key_not_visible);
        }
      });
      member.team_barrier();
    }
  }

  // Pools [p0, p0 + np) of request r, transposed, zeros past np and for
  // bad blocks (read nowhere).
  KOKKOS_INLINE_FUNCTION void stage_keys(int r, std::uint64_t p0, int np, A* kt, A* sc,
                                         A* ok, A const* lut) const {
    int const D = cache.head_dim();
    for (int j = 0; j < PT; ++j) {
      CacheSlot const slot = j < np ? cache.locate(r, static_cast<std::int64_t>(p0 + j))
                                    : CacheSlot{-1, 0};
      int const b = slot.block;
      ok[j] = b >= 0 ? A(1) : A(0);
      if (b < 0) {
        sc[j] = A(0);
        for (int c = 0; c < D; ++c) kt[c * PT + j] = A(0);
        continue;
      }
      sc[j] = static_cast<A>(cache.scale_at(slot));
      C const* v = cache.row(slot);
      if constexpr (fp8) {
        for (int c = 0; c < D; ++c) kt[c * PT + j] = lut[v[c].bits];
      } else {
        for (int c = 0; c < D; ++c) kt[c * PT + j] = cache_value<A>(v[c]);
      }
    }
  }

  // score[p] = sum_h w_h relu(s_p * (q_h . k_p)) for the PT pools of the
  // tile, heads in order, channels in order.
  KPOOL_IMPL_NOINLINE KOKKOS_FUNCTION void score_tile(A const* qi, A const* w, A const* kt, A const* sc,
                                         A* score) const {
    int const H = heads;
    int const HP = padded_heads(H);
    int const D = cache.head_dim();
    KPOOL_IMPL_IVDEP
    for (int p = 0; p < PT; ++p) score[p] = A(0);
    for (int hb = 0; hb < HP; hb += HB) {
      A acc[HB][PT];
      KPOOL_IMPL_UNROLL
      for (int h = 0; h < HB; ++h) {
        KPOOL_IMPL_IVDEP
        for (int p = 0; p < PT; ++p) acc[h][p] = A(0);
      }
      for (int c = 0; c < D; ++c) {
        A const* kc = kt + c * PT;
        A const* qc = qi + c * HP + hb;
        KPOOL_IMPL_UNROLL
        for (int h = 0; h < HB; ++h) {
          A const qv = qc[h];
          KPOOL_IMPL_IVDEP
          for (int p = 0; p < PT; ++p) acc[h][p] = KokkosExt::fmadd(qv, kc[p], acc[h][p]);
        }
      }
      int const hn = H - hb < HB ? H - hb : HB;
      for (int h = 0; h < hn; ++h) {
        A const wh = w[hb + h];
        KPOOL_IMPL_IVDEP
        for (int p = 0; p < PT; ++p) score[p] += wh * relu(sc[p] * acc[h][p]);
      }
    }
  }
};

}  // namespace Details
}  // namespace KPool

#endif
