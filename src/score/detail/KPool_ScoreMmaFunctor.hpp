#ifndef KPOOL_SCORE_DETAIL_SCORE_MMA_FUNCTOR_HPP
#define KPOOL_SCORE_DETAIL_SCORE_MMA_FUNCTOR_HPP

// The tensor-core scoring engine (ScoreEngine::tensor_cores): scores as
// keys, one launch on the caller's execution space instance, the products
// on warp-level MMA (score/detail/KPool_ScoreMmaFragments.hpp).
//
// Inputs are prepared query values and effective per-head weights:
//  - exact profile: the rotated f32 query split into `terms` MMA operands
//    (bf16: q = q1 + q2 + q3, each the nearest bf16 of what the earlier
//    terms left, which represents every f32 exactly; one term when the
//    query already is the operand type), the weight w_h; per head
//    w_h * relu(s_p * (q_h . k_p)), as the other engines;
//  - serving profile (E4M3 MMA): the query's E4M3 codes and w_h * s_q,h;
//    s_p * sum_h w_h s_q,h relu(q8_h . k8_p) (docs/indexer.md).
// The work is row groups x splits "virtual teams": a group of
// `rows_per_team` query rows of one request and every `splits`-th tile of
// 16 pools. A launch of that many teams gives each one; a persistent
// launch (as many teams as are resident, launch_score_mma) gives each team
// a contiguous share of them, which may cross groups, and the team walks
// each group's part of its share as one pipeline. Its `warps` warps take
// the team's tiles in turn. The team stages a group's queries once
// (operands in team scratch, rows padded by 16 bytes so that fragment
// loads hit 32 distinct banks); a warp
// stages a tile's keys as MMA operands in its own scratch, multiplies
// 16 pools x 8 heads at a time (A = keys, row-major pools x channels; B =
// query heads), and folds relu, weights and the head sum in registers: a
// lane holds pools g and g + 8 for heads 2t, 2t + 1 of each 8-head tile,
// sums its heads, then the four lanes of its group by two xor shuffles.
// Every pool goes through the same operations wherever it sits, so
// identical pools score identically.
//
// The warp code is written once for a thread holding `Lanes` lanes: one on
// CUDA (the PTX MMA, shuffles), 32 elsewhere (the MMA emulated, shuffles as
// array reads), so a host runs the very tile logic the device does.

#include <common/KPool_Float8.hpp>
#include <common/KPool_Types.hpp>
#include <common/detail/KPool_ServingQuant.hpp>
#include <common/detail/KPool_KokkosExt.hpp>
#include <common/detail/KPool_Strided.hpp>
#include <score/detail/KPool_ScoreMmaFragments.hpp>
#include <common/detail/KPool_Scoring.hpp>

#include <cstdint>
#include <type_traits>

namespace KPool {
namespace Details {

// Lanes one thread of the engine holds: one on CUDA, a whole warp elsewhere.
template <class ExecutionSpace>
struct mma_lanes {
  static constexpr int value = 32;
};
#if defined(KOKKOS_ENABLE_CUDA)
template <>
struct mma_lanes<Kokkos::Cuda> {
  static constexpr int value = 1;
};
#endif

// Warps of a team on a CUDA device.
constexpr int mma_team_warps = 4;
// Pools of a warp's tile (the MMA's M).
constexpr int mma_tile_pools = 16;
// Teams an SM the launch bounds keep resident on CUDA, and the register cap
// that implies (168 a thread; the kernels take 136-158 without it), so that
// the persistent launch (persistent_teams) knows its teams are resident.
constexpr int mma_min_teams_an_sm = 3;
constexpr int mma_register_cap = 65536 / (mma_min_teams_an_sm * 32 * mma_team_warps) / 8 * 8;

// Serving: the serving profile's scores (prepared E4M3 codes, the pool's
// scale after the head sum), on the E4M3 MMA or, with
// KPOOL_SERVING_MMA_BF16, on the bf16 MMA (the codes exact in bf16).
template <class ExecutionSpace, class T, class C, MmaKind Kind,
          bool Serving = (Kind == MmaKind::e4m3)>
struct ScoreMmaFunctor : ScoreTeamInputs<ExecutionSpace, T, C> {
  KPOOL_IMPL_SCORE_TEAM_INPUTS(ExecutionSpace, T, C);
  static_assert(std::is_same<A, float>::value, "the tensor-core engine scores in f32");
  int terms;  // query operand terms, 1 to 3
  int warps;  // warps a team
  // The call's work: `virtual_teams` = row groups x splits (group v /
  // splits, split v % splits). A league of that size takes one each; a
  // persistent one, fewer teams, gives team t the contiguous share
  // [t V / P, (t + 1) V / P), which may cross groups.
  std::uint64_t virtual_teams = 0;
  using launch_bounds = Kokkos::LaunchBounds<32 * mma_team_warps, mma_min_teams_an_sm>;
  using S = MmaShape<Kind>;
  static constexpr int L = mma_lanes<ExecutionSpace>::value;
  static constexpr int TM = mma_tile_pools;
  static constexpr bool serving = Serving;

  int scratch_level;
  // Every pool's row starts 16-byte aligned and D is a multiple of a
  // packet: the key tiles are staged in 16-byte packets.
  bool packets = false;
  static constexpr int packet = static_cast<int>(16 / sizeof(C));
  // A lane's share of a key tile held in registers while the warp scores
  // the tile before it (the copy's double buffer): up to 4 packets, 64
  // bytes a lane, so a tile of up to 128 packets (16 pools of 128 fp8
  // channels or 64 bf16 ones).
  static constexpr int prefetch_packets = 4;
  KOKKOS_INLINE_FUNCTION bool prefetching(int D) const {
    return register_prefetch && packets && TM * (D / packet) <= 32 * prefetch_packets;
  }
  // Key tiles a warp keeps in flight in its scratch ring (the key
  // pipeline, score_ring): 1 is the paths above (a tile staged, or the
  // next one's packets in registers); 2 to max_depth, the ring of that
  // many tiles, each copied asynchronously (KokkosExt::async_copy) while
  // the warp scores the tiles before it. The launcher takes a ring only
  // for packets whose bytes are the MMA's operand words (direct_keys) and
  // the deepest that fits the team's fast scratch.
  int depth = 1;
  static constexpr int max_depth = 3;
  static constexpr bool direct_keys =
      !(std::is_same<C, float8_e4m3>::value && Kind != MmaKind::e4m3);
  // Which pipelines a kernel compiles (each holds registers of its own,
  // and a kernel's registers are its costliest path's): the ring where
  // keys are taken as they are (a call whose ring does not fit, or
  // key_pipeline_depth 1, stages each tile, then scores it); the register
  // prefetch where keys are converted. The serving kernel compiled both
  // until its ring always fit: at its cap of 168 registers (202 unbounded)
  // it then spilled 92 bytes once it counted the rows' first digits; with
  // the ring alone it takes 148 (nvcc 13, sm_90).
  static constexpr bool register_prefetch = !direct_keys;
  // Which pipeline counts the rows' first digits where the launch builds
  // histograms (row_hist): the ring where keys are taken as they are (the
  // launcher then takes a ring), else the one-tile pipeline.
  static constexpr bool counts_one_tile = !direct_keys;
  // Places and scales of a warp's tiles: double-buffered, or one a tile of
  // the ring.
  KOKKOS_INLINE_FUNCTION static int slots_for(int depth) { return depth < 2 ? 2 : depth; }
  // Held as 32-bit words (a byte array would take a register a byte).
  struct KeyPackets {
    std::uint32_t w[L][prefetch_packets][4];
  };

  // Heads padded to the MMA's N, channels to its K, and a scratch row of
  // operands in 32-bit words with 16 bytes of padding.
  KOKKOS_INLINE_FUNCTION static int padded_heads(int H) { return (H + 7) / 8 * 8; }
  KOKKOS_INLINE_FUNCTION static int padded_dim(int D) { return (D + S::k - 1) / S::k * S::k; }
  KOKKOS_INLINE_FUNCTION static int row_words(int D) { return padded_dim(D) / S::per_reg + 4; }

  KOKKOS_INLINE_FUNCTION static std::size_t query_words(int rows, int terms, int H, int D) {
    return static_cast<std::size_t>(rows) * terms * padded_heads(H) * row_words(D);
  }
  // Byte offsets of the team's scratch regions, each 16-byte aligned.
  struct Layout {
    std::size_t entry, q, w, k, meta, hist, total;
  };
  KOKKOS_INLINE_FUNCTION static std::size_t align16(std::size_t b) { return (b + 15) / 16 * 16; }
  // hist: the row's first-digit counts (row_hist), 16 bits a bin.
  KOKKOS_INLINE_FUNCTION static Layout layout(int rows, int terms, int H, int D, int warps,
                                               int depth, bool hist = false) {
    Layout l;
    std::size_t o = 0;
    std::size_t const slots = static_cast<std::size_t>(slots_for(depth));
    l.entry = o;
    o += align16(static_cast<std::size_t>(warps) * slots * TM * sizeof(std::int64_t));
    l.q = o;
    o += align16(query_words(rows, terms, H, D) * 4);
    l.w = o;
    o += align16(static_cast<std::size_t>(rows) * padded_heads(H) * 4);
    l.k = o;
    o += align16(static_cast<std::size_t>(warps) * depth * TM * row_words(D) * 4);
    l.meta = o;
    o += align16(static_cast<std::size_t>(warps) * slots * 2 * TM * 4);
    l.hist = o;
    o += hist ? static_cast<std::size_t>(score_hist_bins) * 2 : 0;
    l.total = o;
    return l;
  }
  static std::size_t scratch_bytes(int rows, int terms, int H, int D, int warps, int depth,
                                   bool hist = false) {
    return layout(rows, terms, H, D, warps, depth, hist).total + 16;
  }

  struct Tiles {
    std::uint32_t* q;      // [rows][terms][HP][RW]
    float* w;              // [rows][HP]: effective weights, 0 past H
    std::uint32_t* k;      // [warps][depth][TM][RW]: a warp's key tiles
    // A slot a tile in flight (slots_for(depth): the one scored, the ones
    // whose keys are in flight):
    float* meta;           // [warps][slots][2][TM]: scale, usable (1 or 0)
    std::int64_t* entry;   // [warps][slots][TM]: offset of each pool's values in the cache
  };

  // Where the launch builds histograms (row_hist set): the row's
  // first-digit counts of the team's current part, [score_hist_bins / 2]
  // words right after the scales, two 16-bit bins a word (bin d in word
  // d / 2, its high half for odd d). Computed where used, from the scales'
  // place and the launch's constants, rather than held through the tiles.
  KOKKOS_INLINE_FUNCTION std::uint32_t* hist_words(Tiles const& s) const {
    std::size_t const meta_bytes =
        align16(static_cast<std::size_t>(warps) * slots_for(depth) * 2 * TM * 4);
    return reinterpret_cast<std::uint32_t*>(reinterpret_cast<char*>(s.meta) + meta_bytes);
  }

  KOKKOS_INLINE_FUNCTION void operator()(member_type const& member) const {
    Tiles const tiles = tiles_of(member);
    walk(member, [&](std::uint64_t group, int s0, int s1) {
      score_part(member, tiles, group, s0, s1);
    });
  }

  // The team's scratch regions (taken once a team).
  KOKKOS_INLINE_FUNCTION Tiles tiles_of(member_type const& member) const {
    Layout const lay =
        layout(rows_per_team, terms, heads, cache.head_dim(), warps, depth, row_hist != nullptr);
    // One block of scratch, taken at a level fixed per call site (a level
    // read at run time costs a local-memory stack frame on CUDA).
    char* const base = static_cast<char*>(
        scratch_level == 0 ? member.team_scratch(0).get_shmem_aligned(lay.total, 16)
                           : member.team_scratch(1).get_shmem_aligned(lay.total, 16));
    return Tiles{reinterpret_cast<std::uint32_t*>(base + lay.q),
                 reinterpret_cast<float*>(base + lay.w),
                 reinterpret_cast<std::uint32_t*>(base + lay.k),
                 reinterpret_cast<float*>(base + lay.meta),
                 reinterpret_cast<std::int64_t*>(base + lay.entry)};
  }

  // The fused decode selection (select/detail/KPool_TopkFused.hpp) walks
  // the same shares, a group's part at a time.
  static constexpr bool walks_shares = true;

  // part(group, s0, s1) for each group's part of this team's share of the
  // virtual teams, in order: splits [s0, s1) of the group.
  template <class Part>
  KOKKOS_INLINE_FUNCTION void walk(member_type const& member, Part const& part) const {
    std::uint64_t const rank = static_cast<std::uint64_t>(member.league_rank());
    std::uint64_t const teams = static_cast<std::uint64_t>(member.league_size());
    std::uint64_t const V = virtual_teams;
    std::uint64_t v = teams >= V ? rank : rank * V / teams;
    std::uint64_t const v_end = teams >= V ? rank + 1 : (rank + 1) * V / teams;
    while (v < v_end) {
      std::uint64_t const group = v / splits;
      int const s0 = static_cast<int>(v % splits);
      std::uint64_t const left = v_end - v;
      int const s1 = left < static_cast<std::uint64_t>(splits - s0)
                         ? s0 + static_cast<int>(left)
                         : splits;
      part(group, s0, s1);
      v += static_cast<std::uint64_t>(s1 - s0);
    }
  }

  // Splits [s0, s1) of a group, walked as one pipeline, the group's
  // queries staged once.
  KOKKOS_INLINE_FUNCTION void score_part(member_type const& member, Tiles const& tiles,
                                         std::uint64_t group, int s0, int s1) const {
    batch.for_each_run(group, rows_per_team,
                       [&](int r, SelectRequest const& req, std::uint64_t t0, std::uint64_t t1) {
                         score_rows(member, tiles, r, req, t0, t1, s0, s1);
                       });
  }


  KOKKOS_INLINE_FUNCTION int warp_of(member_type const& member) const {
    return L == 1 ? member.team_rank() / 32 : member.team_rank();
  }
  KOKKOS_INLINE_FUNCTION static int lane_of(member_type const& member, int l) {
    return L == 1 ? member.team_rank() % 32 : l;
  }
  KOKKOS_FORCEINLINE_FUNCTION static void warp_sync() {
#if defined(__CUDA_ARCH__)
    __syncwarp();
#endif
  }

  // Query operands of rows [t0, t1) into scratch from the prepared rows.
  // The E4M3 MMA takes the serving profile's prepared E4M3 bytes as they
  // are (stage_query_codes; its launcher refuses a call without them).
  // The 16-bit MMAs' (bf16, f16) terms: the team's threads take a (row,
  // head)'s steps in turn, a step 4 channels, read as one 16-byte packet
  // of prepared values where D is a multiple of 4 (every (row, head)'s
  // values then start 16-byte aligned), a value at a time otherwise; each
  // value is split into its terms once (operand_terms), and each term's 2
  // operand words are written as one 8-byte store. Channels past D (to
  // the MMA's K) and heads past H are zero.
  KOKKOS_INLINE_FUNCTION void stage_queries(member_type const& member, Tiles const& s,
                                            std::uint64_t t0, int nrows) const {
    if constexpr (Kind == MmaKind::e4m3) {
      stage_query_codes(member, s, t0, nrows);
    } else {
      static_assert(S::per_reg == 2, "the 16-bit MMAs' words hold 2 channels");
      int const H = heads;
      int const D = cache.head_dim();
      int const HP = padded_heads(H);
      int const RW = row_words(D);
      constexpr int chans = 4;                  // channels a step: 2 words of a term
      bool const wide = D % chans == 0;
      int const steps = padded_dim(D) / chans;  // the MMA's K is a multiple of a step
      std::size_t const term_words = static_cast<std::size_t>(HP) * RW;
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, nrows * HP * steps), [&](int idx) {
        int const ih = idx / steps;
        int const h = ih % HP;
        int const c0 = (idx % steps) * chans;
        if (c0 == 0) s.w[ih] = h < H ? prepared_weight(t0 + ih / HP, h) : 0.0f;
        std::uint32_t* const out = s.q + static_cast<std::size_t>(ih / HP) * terms * term_words +
                                   static_cast<std::size_t>(h) * RW + c0 / 2;
        // The step's values as 32-bit words (held in registers: no array's
        // address is taken on a device).
        alignas(16) std::uint32_t v[4];
        float const* const x = h < H ? prepared_row(t0 + ih / HP, h) : nullptr;
        if (h < H && wide && c0 < D) {
          load_packet_words(v, x + c0);
        } else {
          KPOOL_IMPL_UNROLL
          for (int e = 0; e < chans; ++e)
            v[e] = KokkosExt::bit_cast<std::uint32_t>((h < H && c0 + e < D) ? x[c0 + e] : 0.0f);
        }
        alignas(8) std::uint32_t word[3][2];
        KPOOL_IMPL_UNROLL
        for (int e = 0; e < chans; ++e) {
          std::uint32_t bits[3];
          operand_terms(KokkosExt::bit_cast<float>(v[e]), terms, bits);
          KPOOL_IMPL_UNROLL
          for (int term = 0; term < 3; ++term) {
            if (e % 2 == 0)
              word[term][e / 2] = bits[term];
            else
              word[term][e / 2] |= bits[term] << 16;
          }
        }
        // Unrolled, so that no term's words are indexed at run time (an
        // array in local memory on a device).
        KPOOL_IMPL_UNROLL
        for (int term = 0; term < 3; ++term)
          if (term < terms) store_word_pair(out + term * term_words, word[term]);
      });
      member.team_barrier();
    }
  }

  // The prepared E4M3 bytes of rows [t0, t0 + nrows) are the operand words
  // as they are: the team's threads take a row's 16-byte packets in turn
  // (one wide load each, where D is a multiple of 16 and so every (row,
  // head)'s region starts 16-byte aligned) or its words (a byte past D
  // zero); heads past H and channels past D (to the MMA's K) are zero.
  KOKKOS_INLINE_FUNCTION void stage_query_codes(member_type const& member, Tiles const& s,
                                                std::uint64_t t0, int nrows) const {
    int const H = heads;
    int const D = cache.head_dim();
    int const HP = padded_heads(H);
    int const RW = row_words(D);
    int const items = nrows * HP;
    bool const wide = D % 16 == 0;
    int const per = wide ? 4 : 1;  // words a step
    int const steps = padded_dim(D) / S::per_reg / per;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, items * steps), [&](int idx) {
      int const ih = idx / steps;
      int const h = ih % HP;
      int const c0 = (idx % steps) * per * S::per_reg;
      // The (row, head)'s weight with its first step (0 past H).
      if (c0 == 0) s.w[ih] = h < H ? prepared_weight(t0 + ih / HP, h) : 0.0f;
      std::uint32_t* const out = s.q + static_cast<std::size_t>(ih) * RW + c0 / S::per_reg;
      if (h >= H || c0 >= D) {
        for (int w = 0; w < per; ++w) out[w] = 0;
        return;
      }
      std::uint8_t const* const x = prepared_code_row(t0 + ih / HP, h) + c0;
      if (wide) {
        KokkosExt::copy_aligned_bytes<16>(out, x);
      } else {
        std::uint32_t word = 0;
        for (int e = 0; e < S::per_reg && c0 + e < D; ++e)
          word |= static_cast<std::uint32_t>(x[e]) << (8 * e);
        out[0] = word;
      }
    });
    member.team_barrier();
  }

  // Query value v's first n operand terms of a 16-bit MMA, in order
  // (bf16: split_bf16's, one conversion a term; f16: one term), zeros
  // after them.
  KOKKOS_FORCEINLINE_FUNCTION static void operand_terms(float v, int n,
                                                        std::uint32_t (&bits)[3]) {
    if constexpr (Kind == MmaKind::bf16) {
      split_bf16(v, n, bits);
    } else {
      bits[0] = float16(v).bits;
      bits[1] = bits[2] = 0u;
    }
  }

  // A cache element as an operand's bits (exact: the engine takes only
  // caches whose elements are operands of its MMA).
  KOKKOS_FORCEINLINE_FUNCTION static std::uint32_t key_bits(C v) {
    if constexpr (std::is_same<C, float8_e4m3>::value) {
      if constexpr (Kind == MmaKind::e4m3)
        return v.bits;
      else
        return KokkosExt::bit_cast<std::uint32_t>(cache_value<float>(v)) >> 16;
    } else {
      return v.bits;
    }
  }

  // Channels v[0, count) (count up to per_reg) as one operand word, the
  // first in the low bits; the rest of the word zero.
  KOKKOS_FORCEINLINE_FUNCTION static std::uint32_t key_word(C const* v, int count) {
    std::uint32_t word = 0;
    for (int e = 0; e < count; ++e) word |= key_bits(v[e]) << (e * (32 / S::per_reg));
    return word;
  }

  // Rows [t0, t1) of request r, the tiles of splits [s0, s1): tile j's
  // split is j % splits, so the k-th tile of the set, in order, is
  // (k / n) * splits + s0 + k % n for n = s1 - s0, and warp w takes k = w,
  // w + warps, ... (with one split, every splits-th tile from s0, warp w
  // from s0 + w * splits). A warp's tiles are a pipeline: while it scores
  // one tile, the packets of its next tile are loaded into registers
  // (prefetching: 16-byte rows, a tile of at most 32 * prefetch_packets
  // packets), and written to the warp's scratch tile once the scoring has
  // read it; the pools' places and scales are double-buffered in scratch.
  // Otherwise each tile is staged, then scored.
  KOKKOS_INLINE_FUNCTION void score_rows(member_type const& member, Tiles const& s, int r,
                                         SelectRequest const& req, std::uint64_t t0,
                                         std::uint64_t t1, int s0, int s1) const {
    int const nrows = static_cast<int>(t1 - t0);
    std::uint64_t const vis_hi = batch.visible(req, t1 - 1);
    if (vis_hi <= static_cast<std::uint64_t>(s0) * TM) return;
    std::uint64_t const n = static_cast<std::uint64_t>(s1 - s0);
    auto const tile_of = [&](std::uint64_t k) {
      return (k / n) * static_cast<std::uint64_t>(splits) + static_cast<std::uint64_t>(s0) + k % n;
    };
    if (row_hist != nullptr) {  // ordered before the counts by stage_queries' barrier
      std::uint32_t* const hist = hist_words(s);
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, score_hist_bins / 2),
                           [&](int w) { hist[w] = 0; });
    }
    stage_queries(member, s, t0, nrows);
    if constexpr (direct_keys) {
      if (depth > 1) {
        score_ring(member, s, r, req, t0, nrows, vis_hi, tile_of);
        member.team_barrier();
        merge_hist(member, s, t0);
        return;
      }
    }
    int const warp = warp_of(member);
    int const D = cache.head_dim();
    int const DP = padded_dim(D);
    int const RW = row_words(D);
    bool const ahead = prefetching(D);
    std::uint32_t* const kt = key_tile(s, warp, 0);
    std::uint64_t k = static_cast<std::uint64_t>(warp);
    if (packets) zero_key_padding(member, kt, D, DP, RW);
    KeyPackets next;
    int buf = 0;
    if (tile_of(k) * TM < vis_hi) {
      locate_tile(member, s, warp, buf, r, tile_of(k) * TM, vis_hi);
      if (ahead) load_key_packets(member, entries(s, warp, buf), D, next);
    }
    for (; tile_of(k) * TM < vis_hi; k += static_cast<std::uint64_t>(warps), buf ^= 1) {
      std::uint64_t const tile = tile_of(k);
      std::int64_t const* const entry = entries(s, warp, buf);
      if (ahead)
        store_key_packets(member, kt, entry, D, RW, next);
      else if (packets)
        stage_key_packets(member, kt, entry, D, RW);
      else
        stage_key_words(member, kt, entry, D, DP, RW);
      std::uint64_t const after = tile_of(k + static_cast<std::uint64_t>(warps));
      if (after * TM < vis_hi) {
        locate_tile(member, s, warp, buf ^ 1, r, after * TM, vis_hi);
        if (ahead) load_key_packets(member, entries(s, warp, buf ^ 1), D, next);
      }
      warp_sync();
      score_tile<counts_one_tile>(member, s, kt, scales(s, warp, buf), req, t0, nrows,
                                  tile * TM);
    }
    // The queries' scratch is restaged for the next rows.
    member.team_barrier();
    merge_hist(member, s, t0);
  }

  // The part's counts of row t (one row a team where the launch builds
  // histograms) added to the row's histogram in the workspace, a global
  // atomic a nonzero bin; then a barrier, before the next part zeroes
  // them. The scores of a row cluster in few bins, so few bins are added.
  KOKKOS_INLINE_FUNCTION void merge_hist(member_type const& member, Tiles const& s,
                                         std::uint64_t t) const {
    if (row_hist == nullptr) return;
    std::uint32_t const* const hist = hist_words(s);
    std::uint32_t* const out =
        row_hist + (t - batch.row_begin) * static_cast<std::uint64_t>(score_hist_bins);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, score_hist_bins / 2), [&](int w) {
      std::uint32_t const pair = hist[w];
      if ((pair & 0xFFFFu) != 0) Kokkos::atomic_add(&out[2 * w], pair & 0xFFFFu);
      if ((pair >> 16) != 0) Kokkos::atomic_add(&out[2 * w + 1], pair >> 16);
    });
    member.team_barrier();
  }

  // The key pipeline (depth > 1): the warp's tiles k = warp, warp + warps,
  // ... through a ring of `depth` key tiles in its scratch. Before scoring
  // the i-th, it locates the (i + depth - 1)-th (place, and its scale
  // copied asynchronously) from the block ids it loaded an iteration
  // before, loads the next tile's block ids (used an iteration later),
  // and copies the located tile's packets asynchronously into the slot
  // the (i - 1)-th left; each tile's copies are one group, an empty group
  // where no tile is left, so that waiting until depth - 1 groups are in
  // flight leaves the i-th complete. So depth - 1 tiles a warp are in
  // flight while it scores one, and no load is waited for as it is
  // issued.
  template <class TileOf>
  KOKKOS_INLINE_FUNCTION void score_ring(member_type const& member, Tiles const& s, int r,
                                         SelectRequest const& req, std::uint64_t t0, int nrows,
                                         std::uint64_t vis_hi, TileOf const& tile_of) const {
    int const warp = warp_of(member);
    int const D = cache.head_dim();
    int const RW = row_words(D);
    std::uint64_t const step = static_cast<std::uint64_t>(warps);
    for (int j = 0; j < depth; ++j) zero_key_padding(member, key_tile(s, warp, j), D, padded_dim(D), RW);
    // A lane's pool's block id and entry of the tile to locate next.
    std::int32_t block[L];
    int entry[L];
    auto const read_ids = [&](std::uint64_t k) {
      for (int l = 0; l < L; ++l) {
        int const lane = lane_of(member, l);
        std::uint64_t const p = tile_of(k) * TM + static_cast<std::uint64_t>(lane);
        entry[l] = 0;
        std::int64_t const at =
            lane < TM && p < vis_hi ? cache.table_index(r, static_cast<std::int64_t>(p), entry[l])
                                    : -1;
        block[l] = at >= 0 ? cache.block_table[at] : -1;
      }
    };
    // Tile k, whose ids read_ids loaded, into slot j, or nothing past the
    // visible pools; the ids of tile `next` loaded; then the group.
    auto const issue = [&](std::uint64_t k, int j, std::uint64_t next) {
      bool const live = tile_of(k) * TM < vis_hi;
      if (live) {
        CacheSlot slot[L];
        for (int l = 0; l < L; ++l) slot[l] = cache.slot(block[l], entry[l]);
        place_tile(member, s, warp, j, slot, true);
      }
      read_ids(next);
      if (live) copy_key_packets(member, key_tile(s, warp, j), entries(s, warp, j), D, RW);
      KokkosExt::async_commit();
    };
    std::uint64_t k = static_cast<std::uint64_t>(warp);
    read_ids(k);
    for (int j = 0; j < depth - 1; ++j)
      issue(k + static_cast<std::uint64_t>(j) * step, j, k + static_cast<std::uint64_t>(j + 1) * step);
    for (int i = 0; tile_of(k) * TM < vis_hi; k += step, i = i + 1 == depth ? 0 : i + 1) {
      int const ahead = i + depth - 1 < depth ? i + depth - 1 : i - 1;
      issue(k + static_cast<std::uint64_t>(depth - 1) * step, ahead,
            k + static_cast<std::uint64_t>(depth) * step);
      static_assert(max_depth == 3, "a wait for each depth");
      if (depth == 2)
        KokkosExt::async_wait<1>();
      else
        KokkosExt::async_wait<max_depth - 1>();
      warp_sync();
      score_tile<true>(member, s, key_tile(s, warp, i), scales(s, warp, i), req, t0, nrows,
                 tile_of(k) * TM);
    }
    // Nothing is left in flight into the scratch the next rows restage.
    KokkosExt::async_wait<0>();
  }

  KOKKOS_INLINE_FUNCTION std::uint32_t* key_tile(Tiles const& s, int warp, int j) const {
    return s.k + static_cast<std::size_t>(warp * depth + j) * TM * row_words(cache.head_dim());
  }
  KOKKOS_INLINE_FUNCTION std::int64_t* entries(Tiles const& s, int warp, int buf) const {
    return s.entry + (warp * slots_for(depth) + buf) * TM;
  }
  KOKKOS_INLINE_FUNCTION float* scales(Tiles const& s, int warp, int buf) const {
    return s.meta + (warp * slots_for(depth) + buf) * 2 * TM;
  }

  // Where pools [p0, p0 + 16) live, into buffer `buf`; pools past the
  // visible ones and bad blocks are read nowhere.
  KOKKOS_INLINE_FUNCTION void locate_tile(member_type const& member, Tiles const& s, int warp,
                                          int buf, int r, std::uint64_t p0,
                                          std::uint64_t vis_hi) const {
    CacheSlot slot[L];
    for (int l = 0; l < L; ++l) {
      int const lane = lane_of(member, l);
      std::uint64_t const p = p0 + static_cast<std::uint64_t>(lane);
      slot[l] = lane < TM && p < vis_hi ? cache.locate(r, static_cast<std::int64_t>(p))
                                        : CacheSlot{-1, 0};
    }
    place_tile(member, s, warp, buf, slot, false);
  }

  // Lane l's pool (lanes below 16) at slot[l] (block < 0: read nowhere),
  // into buffer `buf`. Ends with a warp sync: every lane then reads every
  // pool's place. With `async`, the scales are copied asynchronously (in
  // the group the caller commits next).
  KOKKOS_INLINE_FUNCTION void place_tile(member_type const& member, Tiles const& s, int warp,
                                         int buf, CacheSlot const (&slot)[L], bool async) const {
    std::int64_t* const entry = entries(s, warp, buf);
    float* const scale = scales(s, warp, buf);
    float* const usable = scale + TM;
    for (int l = 0; l < L; ++l) {
      int const lane = lane_of(member, l);
      if (lane < TM) {
        bool const ok = slot[l].block >= 0;
        entry[lane] = ok ? static_cast<std::int64_t>(cache.row(slot[l]) - cache.values) : -1;
        if (ok && async)
          KokkosExt::async_copy<4>(scale + lane, &cache.scale_at(slot[l]));
        else
          scale[lane] = ok ? cache.scale_at(slot[l]) : 0.0f;
        usable[lane] = ok ? 1.0f : 0.0f;
      }
    }
    warp_sync();
  }

  // One warp: pools [p0, p0 + 16) for the team's rows, their keys staged
  // in the warp's tile kt, their scales and usability in `scale`.
  // Count: the pipeline counts the keys' first digits where row_hist is set
  // (compiled only into the pipeline a histogram launch takes).
  template <bool Count = false>
  KOKKOS_INLINE_FUNCTION void score_tile(member_type const& member, Tiles const& s,
                                         std::uint32_t const* kt, float const* scale,
                                         SelectRequest const& req, std::uint64_t t0,
                                         int nrows, std::uint64_t p0) const {
    int const H = heads;
    int const D = cache.head_dim();
    int const HP = padded_heads(H);
    int const DP = padded_dim(D);
    int const RW = row_words(D);
    float const* usable = scale + TM;

    for (int i = 0; i < nrows; ++i) {
      std::uint64_t const t = t0 + i;
      std::uint64_t const vis = batch.visible(req, t);
      if (vis <= p0) continue;
      float const* wi = s.w + i * HP;
      // part[l][0]: pool g, part[l][1]: pool g + 8 of lane l's group.
      float part[L][2];
      for (int l = 0; l < L; ++l) part[l][0] = part[l][1] = 0.0f;
      for (int hg = 0; hg < HP; hg += 32) {
        int const ntiles = (HP - hg) / 8 < 4 ? (HP - hg) / 8 : 4;
        float acc[4][L][4];
        for (int nt = 0; nt < 4; ++nt)
          for (int l = 0; l < L; ++l)
            for (int e = 0; e < 4; ++e) acc[nt][l][e] = 0.0f;
        for (int k0 = 0; k0 < DP; k0 += S::k) {
          std::uint32_t a[L][4];
          for (int l = 0; l < L; ++l) {
            int const lane = lane_of(member, l);
            for (int g = 0; g < S::a_regs; ++g) {
              int const e = g * S::per_reg;
              a[l][g] = kt[S::a_row(lane, e) * RW + (k0 + S::a_col(lane, e)) / S::per_reg];
            }
          }
          for (int term = 0; term < terms; ++term) {
            std::uint32_t const* qt =
                s.q + (static_cast<std::size_t>(i) * terms + term) * HP * RW;
            for (int nt = 0; nt < 4; ++nt) {
              if (nt >= ntiles) break;
              std::uint32_t b[L][2];
              for (int l = 0; l < L; ++l) {
                int const lane = lane_of(member, l);
                for (int g = 0; g < S::b_regs; ++g) {
                  int const e = g * S::per_reg;
                  b[l][g] = qt[(hg + nt * 8 + S::b_col(lane, e)) * RW +
                               (k0 + S::b_row(lane, e)) / S::per_reg];
                }
              }
              mma_warp<Kind, L>(acc[nt], a, b);
            }
          }
        }
        // relu, weights and this lane's heads, in head order. Where the
        // group's 32 heads are all the row's (H = 32, the first group of
        // 40, ...), no head is checked and a lane loads each of its 2
        // weights an N tile once for its 4 products: the same sums in the
        // same order, in about half the epilogue's instructions. Otherwise
        // a padded head is skipped, not weighted by 0 (its product may be
        // a NaN).
        if (ntiles == 4 && hg + 32 <= H) {
          for (int nt = 0; nt < 4; ++nt)
            for (int l = 0; l < L; ++l) {
              int const lane = lane_of(member, l);
              float const w0 = wi[hg + nt * 8 + S::c_col(lane, 0)];
              float const w1 = wi[hg + nt * 8 + S::c_col(lane, 1)];
              for (int e = 0; e < 4; ++e) {
                float const x =
                    serving ? acc[nt][l][e] : scale[S::c_row(lane, e)] * acc[nt][l][e];
                part[l][e >> 1] += ((e & 1) ? w1 : w0) * relu(x);
              }
            }
          continue;
        }
        for (int nt = 0; nt < 4; ++nt) {
          if (nt >= ntiles) break;
          for (int l = 0; l < L; ++l) {
            int const lane = lane_of(member, l);
            for (int e = 0; e < 4; ++e) {
              int const h = hg + nt * 8 + S::c_col(lane, e);
              if (h >= H) continue;
              int const pool = S::c_row(lane, e);
              float const x = serving ? acc[nt][l][e] : scale[pool] * acc[nt][l][e];
              part[l][e >> 1] += wi[h] * relu(x);
            }
          }
        }
      }
      group_sum(part);
      if constexpr (serving) {
        // The butterfly leaves the same bits in all four lanes of a group
        // (each sum is of the same two pairs, a + b = b + a), so the
        // group's lane 0 writes pool g and its lane 1 pool g + 8, at once.
        for (int l = 0; l < L; ++l) {
          int const lane = lane_of(member, l);
          int const half = lane & 3;
          if (half > 1) continue;
          int const pool = (lane >> 2) + half * 8;
          std::uint64_t const p = p0 + pool;
          if (p >= vis) continue;
          float const score = scale[pool] * (half != 0 ? part[l][1] : part[l][0]);
          Key const key =
              usable[pool] != 0.0f ? score_key(score) : static_cast<Key>(key_not_visible);
          keys[batch.key_offset(t) + p] = key;
          // The row's first-digit count (one row a team where row_hist is set).
          if (Count && row_hist != nullptr && key != static_cast<Key>(key_not_visible)) {
            int const d = first_digit(key);
            Kokkos::atomic_add(hist_words(s) + (d >> 1), 1u << (16 * (d & 1)));
          }
        }
      } else {
        // The exact kernels write both from lane 0, this loop as it was
        // before the serving kernel's above: the bf16 keys' kernel holds
        // 166 registers of its cap of 168, and nvcc 13 spills 52 to 100
        // bytes there with the loop in any other form tried (two lanes
        // writing, a shared helper).
        for (int l = 0; l < L; ++l) {
          int const lane = lane_of(member, l);
          if ((lane & 3) != 0) continue;
          for (int half = 0; half < 2; ++half) {
            int const pool = (lane >> 2) + half * 8;
            std::uint64_t const p = p0 + pool;
            if (p >= vis) continue;
            float const score = part[l][half];
            Key const key =
                usable[pool] != 0.0f ? score_key(score) : static_cast<Key>(key_not_visible);
            keys[batch.key_offset(t) + p] = key;
            if (Count && row_hist != nullptr && key != static_cast<Key>(key_not_visible)) {
              int const d = first_digit(key);
              Kokkos::atomic_add(hist_words(s) + (d >> 1), 1u << (16 * (d & 1)));
            }
          }
        }
      }
    }
    // The warp's tile scratch is restaged for its next tile.
    warp_sync();
  }

  // f(l, i, j, pk) for each packet a thread holds of a tile of npk
  // packets a row: lane l's i-th is packet l + 32 i of the tile, packet
  // pk of row j.
  template <class F>
  KOKKOS_FORCEINLINE_FUNCTION static void for_each_held_packet(member_type const& member,
                                                               int npk, F const& f) {
    for (int l = 0; l < L; ++l) {
      int const lane = lane_of(member, l);
      KPOOL_IMPL_UNROLL
      for (int i = 0; i < prefetch_packets; ++i) {
        int const idx = lane + 32 * i;
        if (idx >= TM * npk) break;
        f(l, i, idx / npk, idx % npk);
      }
    }
  }

  // The next tile's packets into registers; rows read nowhere are left
  // alone (store_key_packets writes zeros for them).
  KOKKOS_INLINE_FUNCTION void load_key_packets(member_type const& member,
                                               std::int64_t const* entry, int D,
                                               KeyPackets& regs) const {
    for_each_held_packet(member, D / packet, [&](int l, int i, int j, int pk) {
      if (entry[j] >= 0) load_packet_words(regs.w[l][i], cache.values + entry[j] + pk * packet);
    });
  }

  // One 16-byte packet as four words: one wide load on GPUs.
  KOKKOS_FORCEINLINE_FUNCTION static void load_packet_words(std::uint32_t (&w)[4],
                                                            void const* src) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
    uint4 const u = *static_cast<uint4 const*>(src);
    w[0] = u.x;
    w[1] = u.y;
    w[2] = u.z;
    w[3] = u.w;
#else
    KokkosExt::copy_aligned_bytes<16>(w, src);
#endif
  }
  // Two words as one 8-byte store (8-byte aligned).
  KOKKOS_FORCEINLINE_FUNCTION static void store_word_pair(std::uint32_t* dst,
                                                          std::uint32_t const (&w)[2]) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
    *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
#else
    KokkosExt::copy_aligned_bytes<8>(dst, w);
#endif
  }
  // Element e of a packet held as words (little-endian, as memory).
  KOKKOS_FORCEINLINE_FUNCTION static C packet_element(std::uint32_t const (&w)[4], int e) {
    constexpr int bytes = static_cast<int>(sizeof(C));
    constexpr std::uint32_t mask = bytes == 4 ? ~0u : (1u << (8 * bytes)) - 1u;
    std::uint32_t const raw = (w[(e * bytes) / 4] >> (8 * ((e * bytes) % 4))) & mask;
    return C::from_bits(static_cast<typename C::bits_type>(raw));
  }

  // Those registers as the tile's operand words (zeros for rows read
  // nowhere; the padding past D is zero_key_padding's).
  KOKKOS_INLINE_FUNCTION void store_key_packets(member_type const& member, std::uint32_t* kt,
                                                std::int64_t const* entry, int D, int RW,
                                                KeyPackets const& regs) const {
    constexpr int per_packet = packet / S::per_reg;  // words a packet
    int const npk = D / packet;
    for_each_held_packet(member, npk, [&](int l, int i, int j, int pk) {
      std::uint32_t* out = kt + j * RW + pk * per_packet;
      bool const ok = entry[j] >= 0;
      KPOOL_IMPL_UNROLL
      for (int w = 0; w < per_packet; ++w) {
        std::uint32_t word = 0;
        KPOOL_IMPL_UNROLL
        for (int e = 0; e < S::per_reg; ++e)
          word |= key_bits(packet_element(regs.w[l][i], w * S::per_reg + e))
                  << (e * (32 / S::per_reg));
        out[w] = ok ? word : 0u;
      }
    });
  }

  // A tile's packets copied asynchronously into its slot kt as they are
  // (direct_keys: the bytes are the operand words; stage_key_packets'
  // walk).
  KOKKOS_INLINE_FUNCTION void copy_key_packets(member_type const& member, std::uint32_t* kt,
                                               std::int64_t const* entry, int D, int RW) const {
    static_assert(packet / S::per_reg == 4, "a packet is 4 operand words");
    for_each_tile_packet(member, kt, entry, D, RW, [&](std::uint32_t* out, C const* src) {
      KokkosExt::async_copy<16>(out, src);
    });
  }

  // f(out, src) for each 16-byte packet of a tile's rows, consecutive
  // lanes consecutive packets of a row: its operand words at `out`, its
  // source in the cache; the words of rows read nowhere are zeroed
  // instead (the padding past D is zero_key_padding's).
  template <class F>
  KOKKOS_INLINE_FUNCTION void for_each_tile_packet(member_type const& member, std::uint32_t* kt,
                                                   std::int64_t const* entry, int D, int RW,
                                                   F const& f) const {
    constexpr int per_packet = packet / S::per_reg;  // words a packet
    int const npk = D / packet;
    for (int l = 0; l < L; ++l) {
      int const lane = lane_of(member, l);
      for (int idx = lane; idx < TM * npk; idx += 32) {
        int const j = idx / npk;
        int const pk = idx % npk;
        std::uint32_t* out = kt + j * RW + pk * per_packet;
        if (entry[j] < 0) {
          for (int w = 0; w < per_packet; ++w) out[w] = 0;
        } else {
          f(out, cache.values + entry[j] + pk * packet);
        }
      }
    }
  }

  // The words of a packet-staged tile past D (to the MMA's K) are zero;
  // no packet writes them, so they are zeroed once for a warp's tiles.
  KOKKOS_INLINE_FUNCTION static void zero_key_padding(member_type const& member,
                                                      std::uint32_t* kt, int D, int DP, int RW) {
    constexpr int per_packet = packet / S::per_reg;
    int const npk = D / packet;
    int const pad = DP / S::per_reg - npk * per_packet;
    for (int l = 0; l < L; ++l) {
      int const lane = lane_of(member, l);
      for (int idx = lane; idx < TM * pad; idx += 32)
        kt[(idx / pad) * RW + npk * per_packet + idx % pad] = 0;
    }
  }

  // A warp's key tile as operands, one word (2 or 4 channels) a lane at a
  // time from the channels' own loads (any row alignment, any D).
  KOKKOS_INLINE_FUNCTION void stage_key_words(member_type const& member, std::uint32_t* kt,
                                              std::int64_t const* entry, int D, int DP,
                                              int RW) const {
    int const words = DP / S::per_reg;
    for (int l = 0; l < L; ++l) {
      int const lane = lane_of(member, l);
      for (int idx = lane; idx < TM * words; idx += 32) {
        int const j = idx / words;
        int const wd = idx % words;
        int const c0 = wd * S::per_reg;
        int const count = D - c0 < S::per_reg ? D - c0 : S::per_reg;
        kt[j * RW + wd] =
            entry[j] >= 0 && count > 0 ? key_word(cache.values + entry[j] + c0, count) : 0u;
      }
    }
  }

  // The same words from 16-byte packets (rows 16-byte aligned, D a
  // multiple of `packet`), a tile too wide to be held in registers:
  // consecutive lanes load consecutive packets of a row, one wide load
  // each (the padding past D is zero_key_padding's).
  KOKKOS_INLINE_FUNCTION void stage_key_packets(member_type const& member, std::uint32_t* kt,
                                                std::int64_t const* entry, int D,
                                                int RW) const {
    constexpr int per_packet = packet / S::per_reg;  // words a packet
    for_each_tile_packet(member, kt, entry, D, RW, [&](std::uint32_t* out, C const* src) {
      alignas(16) C v[packet];
      KokkosExt::copy_aligned_bytes<16>(v, src);
      KPOOL_IMPL_UNROLL
      for (int w = 0; w < per_packet; ++w) out[w] = key_word(v + w * S::per_reg, S::per_reg);
    });
  }

  // v[l] = (v[l] + v[l ^ 1]) + (v[l ^ 2] + v[l ^ 3]) over each group of
  // four lanes, the same on every lane of a group.
  KOKKOS_FORCEINLINE_FUNCTION static void group_sum(float (&v)[L][2]) {
    if constexpr (L == 32) {
      for (int m = 1; m <= 2; m <<= 1) {
        float u[32][2];
        for (int l = 0; l < 32; ++l)
          for (int j = 0; j < 2; ++j) u[l][j] = v[l][j] + v[l ^ m][j];
        for (int l = 0; l < 32; ++l)
          for (int j = 0; j < 2; ++j) v[l][j] = u[l][j];
      }
    } else {
#if defined(__CUDA_ARCH__)
      for (int m = 1; m <= 2; m <<= 1)
        for (int j = 0; j < 2; ++j) v[0][j] += __shfl_xor_sync(0xFFFFFFFFu, v[0][j], m);
#else
      (void)v;
#endif
    }
  }
};

}  // namespace Details
}  // namespace KPool

#endif
