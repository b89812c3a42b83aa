#ifndef KPOOL_SCORE_DETAIL_SCORE_TILES_HPP
#define KPOOL_SCORE_DETAIL_SCORE_TILES_HPP

// The portable scoring engine (ScoreEngine::tiles): one Kokkos source for
// every backend, the device default.
//
// A team owns a group of up to `rows_per_team` consecutive query rows of
// one request. It stages and rotates their queries once, into team scratch
// transposed ([row][channel][head], so that a thread's heads of a channel
// are adjacent and every thread of a head block reads the same words),
// then walks its share of the group's pool tiles: tiles split, split +
// active, ... where `active`, the teams that share the group, is computed
// on the device from the group's actual visible pools (at most `splits`,
// at least `min_tiles` tiles a team; teams past it return at once).
//
// A tile of `TP` pools is dequantized into scratch. On devices it is
// transposed ([channel][pool]): a staging thread takes a 16-byte packet of
// one pool's row, and consecutive threads take consecutive pools, so the
// stores of a warp go to consecutive words. Each compute thread then holds
// RH heads x RP pools of accumulators for one query row, its pools RP
// apart by (TP / RP) (consecutive threads read consecutive words: no bank
// conflicts; heads are broadcast). Per pool, the RH heads' w_h relu(s acc)
// are summed in head order into a partial per head block.
//
// On hosts (one thread a team) the heads are the compiler's vector lanes:
// the tile stays pool-major ([pool][channel], each row dequantized in one
// contiguous, vectorized pass, no transposition), and a thread's RP
// adjacent pools x RH heads of accumulators take, per channel, one load of
// the block's RH heads (adjacent in the staged queries) and one broadcast
// key value per pool. Per pool, the RH heads' w_h relu(s acc) are summed
// pairwise (halves, then quarters, ...) into the block's partial.
//
// The partials are summed in head-block order. Every pool goes through the
// same operations wherever it sits in a tile, so identical pools score
// identically and exact ties reach the selection as ties.

#include <common/KPool_Float8.hpp>
#include <common/KPool_Types.hpp>
#include <common/detail/KPool_ServingQuant.hpp>
#include <common/detail/KPool_KokkosExt.hpp>
#include <common/detail/KPool_Strided.hpp>
#include <common/detail/KPool_Scoring.hpp>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace KPool {
namespace Details {

// Tile constants: pools a tile (TP), heads (RH) and pools (RP) a thread's
// accumulators hold. Devices: 8 heads x 2 pools TP / RP apart. Hosts: 32
// heads (the vector lanes) x 2 adjacent pools, 8 accumulator vectors of
// AVX2, which leaves registers for the operands; 4 pools with AVX-512 (8
// accumulator vectors again, of its 32 registers). (A loop of at most 16
// iterations is unrolled into scalars by GCC before it is vectorized: the
// head loop must be longer.)
#if defined(__AVX512F__)
constexpr int tiles_host_pools = 4;
#else
constexpr int tiles_host_pools = 2;
#endif
template <class ExecutionSpace>
struct TilesShape {
  static constexpr bool device = device_shapes<ExecutionSpace>::value;
  static constexpr int TP = 32;
  static constexpr int RH = device ? 8 : 32;
  static constexpr int RP = device ? 2 : tiles_host_pools;
  static constexpr int groups = TP / RP;  // pool groups a tile
};

template <class ExecutionSpace, class T, class C, int Level>
struct ScoreTilesFunctor : ScoreTeamInputs<ExecutionSpace, T, C> {
  KPOOL_IMPL_SCORE_TEAM_INPUTS(ExecutionSpace, T, C);
  using Buffer = Kokkos::View<A*, scratch_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using Shape = TilesShape<ExecutionSpace>;
  static constexpr int TP = Shape::TP;
  static constexpr int RH = Shape::RH;
  static constexpr int RP = Shape::RP;
  static constexpr int NG = Shape::groups;
  static constexpr bool device = Shape::device;
  static constexpr bool fp8 = std::is_same<C, float8_e4m3>::value;
  // Channels a staging thread moves at once: a 16-byte packet of the
  // stored row where it is aligned.
  static constexpr int packet = static_cast<int>(16 / sizeof(C));

  int min_tiles;  // tiles a team at least
  bool packets;   // rows are 16-byte aligned and D a multiple of `packet`

  KOKKOS_INLINE_FUNCTION static int padded_heads(int heads) { return (heads + RH - 1) / RH * RH; }
  // Queries [rows][D][HP], weights [rows][HP], key tile (D * TP: [D][TP]
  // on devices, [TP][D] on hosts), scales
  // and usable flags [TP], partial scores [HP / RH][rows][TP], a row to
  // rotate in per (row, head) thread.
  KOKKOS_INLINE_FUNCTION static std::size_t scratch_size(int rows, int heads, int D) {
    std::size_t const HP = padded_heads(heads);
    return rows * D * HP + rows * HP + static_cast<std::size_t>(D) * TP + 2 * TP +
           HP / RH * rows * TP;
  }
  static std::size_t scratch_bytes(int rows, int heads, int D) {
    return Buffer::shmem_size(scratch_size(rows, heads, D)) + 64;
  }

  struct Layout {
    A* qt;
    A* w;
    A* kt;
    A* sc;
    A* ok;
    A* part;
  };

  KOKKOS_INLINE_FUNCTION void operator()(member_type const& member) const {
    int const H = heads;
    int const HP = padded_heads(H);
    int const D = cache.head_dim();
    int const TQ = rows_per_team;
    Buffer const all(member.team_scratch(Level), scratch_size(TQ, H, D));
    Layout L;
    L.qt = all.data();
    L.w = L.qt + static_cast<std::size_t>(TQ) * D * HP;
    L.kt = L.w + TQ * HP;
    L.sc = L.kt + static_cast<std::size_t>(D) * TP;
    L.ok = L.sc + TP;
    L.part = L.ok + TP;

    std::uint64_t const group = member.league_rank() / splits;
    int const split = member.league_rank() % splits;
    batch.for_each_run(group, TQ, [&](int r, SelectRequest const& req, std::uint64_t t0,
                                          std::uint64_t t1) {
      score_rows(member, L, r, req, t0, t1, split);
    });
  }

  // The teams sharing a group whose last row sees vis_hi pools.
  KOKKOS_INLINE_FUNCTION int active_splits(std::uint64_t vis_hi) const {
    std::uint64_t const tiles = (vis_hi + TP - 1) / TP;
    std::uint64_t const per = static_cast<std::uint64_t>(min_tiles);
    std::uint64_t a = (tiles + per - 1) / per;
    if (a > static_cast<std::uint64_t>(splits)) a = splits;
    return a < 1 ? 1 : static_cast<int>(a);
  }

  // Rows [t0, t1) of request r: this team's tiles.
  KOKKOS_INLINE_FUNCTION void score_rows(member_type const& member, Layout const& L, int r,
                                         SelectRequest const& req, std::uint64_t t0,
                                         std::uint64_t t1, int split) const {
    int const nrows = static_cast<int>(t1 - t0);
    std::uint64_t const vis_hi = batch.visible(req, t1 - 1);
    int const active = active_splits(vis_hi);
    if (split >= active || vis_hi <= static_cast<std::uint64_t>(split) * TP) return;
    stage_queries(member, L, t0, nrows);
    member.team_barrier();
    for (std::uint64_t p0 = static_cast<std::uint64_t>(split) * TP; p0 < vis_hi;
         p0 += static_cast<std::uint64_t>(active) * TP) {
      stage_keys(member, L, r, p0, vis_hi);
      member.team_barrier();
      score_tile(member, L, nrows);
      member.team_barrier();
      write_keys(member, L, req, t0, nrows, p0);
      member.team_barrier();
    }
  }

  // The group's queries, as the call prepared them once (prepared_row):
  // copied transposed into [row][D][HP], consecutive threads consecutive
  // heads, with their weights. Padded heads are zero.
  KOKKOS_INLINE_FUNCTION void stage_queries(member_type const& member, Layout const& L,
                                            std::uint64_t t0, int nrows) const {
    int const H = heads;
    int const HP = padded_heads(H);
    int const D = cache.head_dim();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, nrows * HP), [&](int ih) {
      int const i = ih / HP;
      int const h = ih % HP;
      L.w[ih] = h < H ? prepared_weight(t0 + i, h) : A(0);
    });
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, nrows * D * HP), [&](int y) {
      int const h = y % HP;
      int const c = (y / HP) % D;
      int const i = y / (HP * D);
      L.qt[y] = h < H ? prepared_row(t0 + i, h)[c] : A(0);
    });
    member.team_barrier();
  }

  // Pools [p0, p0 + TP) of request r into kt (transposed on devices, a
  // row a pool on hosts); zeros past vis_hi and for bad blocks (read
  // nowhere).
  // Pool p's slot (block -1 past vis_hi or for a bad block), and its
  // usable flag and scale into the tile's column j.
  KOKKOS_INLINE_FUNCTION CacheSlot stage_pool(Layout const& L, int r, std::uint64_t p,
                                              std::uint64_t vis_hi, int j) const {
    CacheSlot const slot =
        p < vis_hi ? cache.locate(r, static_cast<std::int64_t>(p)) : CacheSlot{-1, 0};
    bool const usable = slot.block >= 0;
    L.ok[j] = usable ? A(1) : A(0);
    L.sc[j] = usable ? static_cast<A>(cache.scale_at(slot)) : A(0);
    return slot;
  }

  KOKKOS_INLINE_FUNCTION void stage_keys(member_type const& member, Layout const& L, int r,
                                         std::uint64_t p0, std::uint64_t vis_hi) const {
    int const D = cache.head_dim();
    if constexpr (!device) {
      // A pool a thread: its row in one contiguous pass.
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, TP), [&](int j) {
        stage_key_row(cache, stage_pool(L, r, p0 + j, vis_hi, j),
                      L.kt + static_cast<std::size_t>(j) * D, D);
      });
      return;
    }
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, TP),
                         [&](int j) { stage_pool(L, r, p0 + j, vis_hi, j); });
    member.team_barrier();
    if (packets) {
      int const npk = D / packet;
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, npk * TP), [&](int y) {
        int const j = y % TP;  // consecutive threads, consecutive pools
        int const c0 = (y / TP) * packet;
        A* k = L.kt + j;
        if (L.ok[j] == A(0)) {
          for (int m = 0; m < packet; ++m) k[(c0 + m) * TP] = A(0);
          return;
        }
        CacheSlot const slot = cache.locate(r, static_cast<std::int64_t>(p0 + j));
        alignas(16) C v[packet];
        KokkosExt::copy_aligned_bytes<16>(v, cache.row(slot) + c0);
        KPOOL_IMPL_UNROLL
        for (int m = 0; m < packet; ++m) k[(c0 + m) * TP] = cache_value<A>(v[m]);
      });
    } else {
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, D * TP), [&](int y) {
        int const j = y % TP;
        int const c = y / TP;
        A value = A(0);
        if (L.ok[j] != A(0)) {
          CacheSlot const slot = cache.locate(r, static_cast<std::int64_t>(p0 + j));
          value = cache_value<A>(cache.row(slot)[c]);
        }
        L.kt[c * TP + j] = value;
      });
    }
  }

  // Partial scores: part[hb][i][p] = sum over the block's heads, in order,
  // of w_h relu(s_p * (q_h . k_p)).
  KOKKOS_INLINE_FUNCTION void score_tile(member_type const& member, Layout const& L,
                                         int nrows) const {
    int const HP = padded_heads(heads);
    int const NB = HP / RH;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, nrows * NB * NG), [&](int x) {
      int const g = x % NG;
      int const hb = (x / NG) % NB;
      int const i = x / (NG * NB);
      block_product(L, i, hb, g);
    });
  }

  KOKKOS_INLINE_FUNCTION static int pool_of(int g, int e) {
    return device ? g + e * NG : g * RP + e;
  }

  // Row i's products with the pools of group g for head block hb: the
  // row's queries qi ([D][HP] from head hb * RH), its head weights w and its
  // partials part (the [TP] of head block hb), then the layout's loops.
  KPOOL_IMPL_NOINLINE KOKKOS_FUNCTION void block_product(Layout const& L, int i, int hb,
                                                         int g) const {
    int const HP = padded_heads(heads);
    int const D = cache.head_dim();
    A const* qi = L.qt + static_cast<std::size_t>(i) * D * HP + hb * RH;
    A const* w = L.w + i * HP + hb * RH;
    A* part = L.part + (static_cast<std::size_t>(hb) * rows_per_team + i) * TP;
    if constexpr (device)
      block_product_pool_lanes(L, g, D, HP, qi, w, part);
    else
      block_product_head_lanes(L, g, D, HP, qi, w, part + g * RP);
  }

  // Devices: acc[head][pool], the pools TP / RP apart in the [D][TP] tile.
  KOKKOS_INLINE_FUNCTION void block_product_pool_lanes(Layout const& L, int g, int D, int HP,
                                                       A const* qi, A const* w,
                                                       A* part) const {
    A acc[RH][RP] = {};
    A const* kg = L.kt + pool_of(g, 0);
    for (int c = 0; c < D; ++c) {
      A const* qc = qi + static_cast<std::size_t>(c) * HP;
      A const* kc = kg + c * TP;
      A kv[RP];
      KPOOL_IMPL_UNROLL
      for (int e = 0; e < RP; ++e) kv[e] = kc[pool_of(0, e)];
      KPOOL_IMPL_UNROLL
      for (int h = 0; h < RH; ++h) {
        A const qv = qc[h];
        KPOOL_IMPL_IVDEP
        for (int e = 0; e < RP; ++e) acc[h][e] = KokkosExt::fmadd(qv, kv[e], acc[h][e]);
      }
    }
    A s[RP];
    KPOOL_IMPL_UNROLL
    for (int e = 0; e < RP; ++e) s[e] = A(0);
    KPOOL_IMPL_UNROLL
    for (int h = 0; h < RH; ++h) {
      A const wh = w[h];
      KPOOL_IMPL_IVDEP
      for (int e = 0; e < RP; ++e) s[e] += wh * relu(L.sc[pool_of(g, e)] * acc[h][e]);
    }
    KPOOL_IMPL_UNROLL
    for (int e = 0; e < RP; ++e) part[pool_of(g, e)] = s[e];
  }

  // Hosts: acc[pool][head], the heads the vector lanes, the RP pools
  // adjacent rows of the [TP][D] tile; part starts at group g's first pool.
  KOKKOS_INLINE_FUNCTION void block_product_head_lanes(Layout const& L, int g, int D, int HP,
                                                       A const* qi, A const* w,
                                                       A* part) const {
    A acc[RP][RH] = {};
    A const* kg = L.kt + static_cast<std::size_t>(g) * RP * D;
    for (int c = 0; c < D; ++c) {
      A const* qc = qi + static_cast<std::size_t>(c) * HP;
      KPOOL_IMPL_UNROLL
      for (int e = 0; e < RP; ++e) {
        A const kv = kg[e * D + c];
        KPOOL_IMPL_IVDEP
        for (int h = 0; h < RH; ++h) acc[e][h] = KokkosExt::fmadd(kv, qc[h], acc[e][h]);
      }
    }
    KPOOL_IMPL_UNROLL
    for (int e = 0; e < RP; ++e) {
      A const se = L.sc[g * RP + e];
      A t[RH];
      KPOOL_IMPL_IVDEP
      for (int h = 0; h < RH; ++h) t[h] = w[h] * relu(se * acc[e][h]);
      // Pairwise, the same tree for every pool.
      KPOOL_IMPL_UNROLL
      for (int n = RH / 2; n > 0; n /= 2) {
        KPOOL_IMPL_IVDEP
        for (int h = 0; h < n; ++h) t[h] += t[h + n];
      }
      part[e] = t[0];
    }
  }

  // The head blocks' partials, in order, into one key per (row, pool).
  KOKKOS_INLINE_FUNCTION void write_keys(member_type const& member, Layout const& L,
                                         SelectRequest const& req, std::uint64_t t0,
                                         int nrows, std::uint64_t p0) const {
    int const NB = padded_heads(heads) / RH;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, nrows * TP), [&](int x) {
      int const i = x / TP, j = x % TP;
      write_key(req, t0 + i, p0 + j, L.ok[j] != A(0), [&] {
        A score = A(0);
        for (int hb = 0; hb < NB; ++hb)
          score += L.part[(static_cast<std::size_t>(hb) * rows_per_team + i) * TP + j];
        return score;
      });
    });
  }
};

}  // namespace Details
}  // namespace KPool

#endif
