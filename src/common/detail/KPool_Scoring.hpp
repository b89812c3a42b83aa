#ifndef KPOOL_COMMON_DETAIL_SCORING_HPP
#define KPOOL_COMMON_DETAIL_SCORING_HPP

// What every part of the selection stage agrees on (docs/indexer.md, "Scoring"
// and "Selection"): which rows and pools a call covers, how a score becomes
// a sortable key, the relu, and the rotation of a query. The scoring
// engines write keys; the selection reads them.

#include <common/KPool_Float8.hpp>
#include <common/KPool_Types.hpp>
#include <common/detail/KPool_CacheWrite.hpp>
#include <common/detail/KPool_KokkosExt.hpp>
#include <common/detail/KPool_Request.hpp>
#include <common/detail/KPool_Strided.hpp>
#include <common/detail/KPool_Views.hpp>

#include <cstdint>
#include <type_traits>

namespace KPool {
namespace Details {

// Scores become unsigned keys whose integer order is the ranking's order:
// higher key, higher rank. Key 0 marks a pool that is not visible (its
// block is bad, validation off); 1 is NaN, below every number; numbers map
// order-preservingly above (-0 and +0 alike, as they are equal). Ties
// between equal keys go to the lower pool id, which the selection settles
// by scanning pools in id order, so the id is not part of the key.
template <class Score>
using score_key_t =
    typename std::conditional<std::is_same<Score, double>::value,
                              std::uint64_t, std::uint32_t>::type;

constexpr unsigned key_not_visible = 0;
constexpr unsigned key_nan = 1;

KOKKOS_INLINE_FUNCTION std::uint32_t score_key(float s) {
  std::uint32_t u = KokkosExt::bit_cast<std::uint32_t>(s);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return key_nan;
  if (u == 0x80000000u) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

KOKKOS_INLINE_FUNCTION std::uint64_t score_key(double s) {
  std::uint64_t u = KokkosExt::bit_cast<std::uint64_t>(s);
  constexpr std::uint64_t sign = 0x8000000000000000ull;
  if ((u & ~sign) > 0x7FF0000000000000ull) return key_nan;
  if (u == sign) u = 0;
  return (u & sign) ? ~u : (u | sign);
}

// The top-k's first radix digit of a key, its top score_hist_bits bits
// (KPool_TopkCore.hpp's select_digit_bits): the bin a row's histogram
// built while scoring counts the key in (docs/indexer.md, "Histograms
// built while scoring").
constexpr int score_hist_bits = 11;
constexpr int score_hist_bins = 1 << score_hist_bits;
template <class Key>
KOKKOS_FORCEINLINE_FUNCTION int first_digit(Key key) {
  return static_cast<int>(key >> (8 * sizeof(Key) - score_hist_bits));
}
// A row's histogram built while scoring holds counts of at most this many
// pools: a scoring team keeps its share in 16-bit counts.
constexpr std::uint64_t score_hist_max_pools = 0xFFFF;

// relu that passes NaN: a NaN product makes the pool's score NaN.
template <class A>
KOKKOS_FORCEINLINE_FUNCTION A relu(A x) {
  return x < A(0) ? A(0) : x;
}

// A cache element as the arithmetic type (no scale). fp8 is decoded without
// branches so that staging loops vectorize; it is exact, as
// KPool::float8_e4m3's own conversion. The choices are bit masks, not
// conditional expressions: GCC turns those into branches, moves the
// subnormal's conversion and product into one, and (floating point may
// trap by default) then cannot make the loop branch-free again.
template <class A>
KOKKOS_FORCEINLINE_FUNCTION A cache_value(float8_e4m3 v) {
  std::uint32_t const b = v.bits;
  std::uint32_t const mag = b & 0x7Fu;
  // Normal: exponent e + 120 in f32, mantissa on top; subnormal: m * 2^-9.
  std::uint32_t const normal = (mag << 20) + (120u << 23);
  std::uint32_t const sub =
      KokkosExt::bit_cast<std::uint32_t>(static_cast<float>(mag & 7u) * 0.001953125f);
  std::uint32_t const is_sub = 0u - static_cast<std::uint32_t>(mag < 8u);
  std::uint32_t const is_nan = 0u - static_cast<std::uint32_t>(mag == 0x7Fu);
  std::uint32_t const m = (sub & is_sub) | (normal & ~is_sub);
  std::uint32_t const bits = (0x7FC00000u & is_nan) | (m & ~is_nan);
  return static_cast<A>(KokkosExt::bit_cast<float>(bits | ((b & 0x80u) << 24)));
}
template <class A, class C>
KOKKOS_FORCEINLINE_FUNCTION A cache_value(C v) {
  return static_cast<A>(to_accumulator(v));
}

// A live request of a selection call, as every kernel sees it. `valid` is
// false when its rows or length are out of range (validation off); such a
// request's rows are neither scored nor written.
struct SelectRequest {
  std::uint64_t begin;
  std::uint64_t end;
  std::uint64_t cache_length;
  bool valid;
};

// The batch of a selection call: rows of q by request, and how many pools
// a row may see (the workspace's row capacity). Where the pools live is
// the cache's CacheTarget (its locate() is the block lookup every engine
// uses). Strided arrays, not views, to keep the functors small.
//
// A ragged batch's requests are row_offsets and cache_lengths. A decode
// batch's (next_n > 0) are read straight from its positions, with no
// array built for them and no launch to build one: request r of the
// call is the batch's row first + r and owns rows [r * next_n,
// (r + 1) * next_n), its cache length decode_row_base.
struct SelectBatch {
  Strided<const std::uint32_t, 1> row_offsets;
  Strided<const std::uint32_t, 1> cache_lengths;
  Strided<const std::int32_t, 2> positions;  // [B, next_n] of a decode batch
  int next_n = 0;                            // 0: a ragged batch
  int first = 0;                             // the call's first row of positions
  int num_requests;
  int kpool;
  std::uint64_t total_rows;   // rows of q
  std::uint64_t max_visible;  // pools a row can hold in the workspace
  // The rows this launch covers (a chunk of the workspace's max_tokens):
  // row t's keys are row t - row_begin of the workspace.
  std::uint64_t row_begin;
  std::uint64_t row_end;
  // A shard's selection (docs/ranks.md): a row's pools are the shard's
  // local pools of the sequence's visible ones.
  Shard shard;

  // Where row t's keys start in the workspace.
  KOKKOS_INLINE_FUNCTION std::uint64_t key_offset(std::uint64_t t) const {
    return (t - row_begin) * max_visible;
  }

  // A scoring team's rows: group `group` of `rows` consecutive rows from
  // row_begin (to row_end), in runs of one live request each, fn(r, req,
  // t0, t1) for each run [t0, t1) of request r; rows of no live request
  // are skipped.
  template <class Fn>
  KOKKOS_INLINE_FUNCTION void for_each_run(std::uint64_t group, int rows, Fn const& fn) const {
    std::uint64_t t = row_begin + group * static_cast<std::uint64_t>(rows);
    std::uint64_t const t_end = t + rows < row_end ? t + rows : row_end;
    while (t < t_end) {
      SelectRequest req;
      int const r = owner(t, req);
      if (r < 0) {
        ++t;
        continue;
      }
      std::uint64_t const sub_end = req.end < t_end ? req.end : t_end;
      fn(r, req, t, sub_end);
      t = sub_end;
    }
  }

  KOKKOS_INLINE_FUNCTION SelectRequest request(int r) const {
    SelectRequest q;
    if (next_n > 0) {
      q.begin = static_cast<std::uint64_t>(r) * static_cast<std::uint64_t>(next_n);
      q.end = q.begin + static_cast<std::uint64_t>(next_n);
      q.cache_length = decode_row_base(positions, static_cast<std::int64_t>(first) + r, next_n);
    } else {
      q.begin = row_offsets(r);
      q.end = row_offsets(r + 1);
      q.cache_length = cache_lengths(r);
    }
    q.valid = q.begin <= q.end && q.end <= total_rows &&
              q.cache_length + (q.end - q.begin) <= max_sequence_length;
    return q;
  }

  // Pools visible to row t of request q: floor((pos + 1) / K) (on a shard,
  // the local pools it holds of those), capped at the workspace's row
  // capacity (only reachable with validation off).
  KOKKOS_INLINE_FUNCTION std::uint64_t visible(SelectRequest const& q,
                                               std::uint64_t t) const {
    std::uint64_t v =
        (q.cache_length + (t - q.begin) + 1) / static_cast<std::uint64_t>(kpool);
    if (shard.ranks > 1) v = shard.local_count(v);
    return v < max_visible ? v : max_visible;
  }

  // The request owning row t, or -1 when no live, valid request does.
  KOKKOS_INLINE_FUNCTION int owner(std::uint64_t t, SelectRequest& q) const {
    int r = num_requests;
    if (next_n == 0)
      r = owner_of(row_offsets, num_requests, t);
    else if (t / static_cast<std::uint64_t>(next_n) < static_cast<std::uint64_t>(num_requests))
      r = static_cast<int>(t / static_cast<std::uint64_t>(next_n));
    if (r >= num_requests) return -1;
    q = request(r);
    if (!q.valid || t < q.begin || t >= q.end) return -1;
    return r;
  }
};

// What the scoring engines read of the cache: its entries through the
// call's block table (locate() gives block -1, "not visible", for a
// missing, unassigned or too large block), the rotation and the A
// nearest 1/sqrt(D).
template <class C, class A, class MemorySpace>
using SelectCache = CacheTarget<C, A, MemorySpace>;

// Pool `slot`'s key row as A values (unscaled) into k[0, D): zeros for a
// bad block (slot.block < 0).
template <class A, class Cache>
KOKKOS_INLINE_FUNCTION void stage_key_row(Cache const& cache, CacheSlot const& slot, A* k,
                                          int D) {
  if (slot.block < 0) {
    for (int c = 0; c < D; ++c) k[c] = A(0);
    return;
  }
  auto const* v = cache.row(slot);
  KPOOL_IMPL_IVDEP
  for (int c = 0; c < D; ++c) k[c] = cache_value<A>(v[c]);
}

// What every scoring engine's team functor reads, and the layout of its
// teams: each engine's functor derives from it (one using-declaration
// line names the members it reads) and its launch fills it from the
// call's ScoreInputs (set_score_inputs). The queries reach the teams only
// as prepared rows; q and weights themselves go to the prepare launch.
template <class ExecutionSpace, class T, class C>
struct ScoreTeamInputs {
  using memory_space = typename ExecutionSpace::memory_space;
  using member_type = typename KokkosExt::TeamPolicy<ExecutionSpace>::member_type;
  using scratch_space = typename ExecutionSpace::scratch_memory_space;
  using A = accumulator_t<T>;
  using Key = score_key_t<A>;

  SelectBatch batch;
  SelectCache<C, A, memory_space> cache;
  Key* keys = nullptr;    // [chunk rows * max_visible]
  int heads = 0;          // H
  int rows_per_team = 0;  // query rows of one request a team scores
  int splits = 0;         // teams a group of rows at most
  // The chunk's queries and weights as prepare_query_row leaves them,
  // prepared once (score/detail/KPool_ScorePrepare.hpp): [chunk rows][H][D]
  // and [chunk rows][H].
  A const* prepared = nullptr;
  A const* prepared_weights = nullptr;
  // The serving values are E4M3 bytes, D at the start of each (row, head)'s
  // region (PrepareQueriesFunctor's codes: the tensor-core engine's E4M3
  // MMA only).
  bool prepared_codes = false;
  // [chunk rows][score_hist_bins], or null: where set (the tensor-core
  // engine, one query row a team), the scoring adds every key it writes
  // but key_not_visible to its row's first-digit histogram (first_digit),
  // zeroed by the chunk's preparation, so that the top-k starts from it.
  std::uint32_t* row_hist = nullptr;

  // Query row t's head h as prepared: its D values, and its weight.
  KOKKOS_INLINE_FUNCTION A const* prepared_row(std::uint64_t t, int h) const {
    return prepared + ((t - batch.row_begin) * static_cast<std::uint64_t>(heads) +
                       static_cast<std::uint64_t>(h)) *
                          static_cast<std::uint64_t>(cache.head_dim());
  }
  KOKKOS_INLINE_FUNCTION std::uint8_t const* prepared_code_row(std::uint64_t t, int h) const {
    return reinterpret_cast<std::uint8_t const*>(prepared_row(t, h));
  }
  KOKKOS_INLINE_FUNCTION A prepared_weight(std::uint64_t t, int h) const {
    return prepared_weights[(t - batch.row_begin) * static_cast<std::uint64_t>(heads) +
                            static_cast<std::uint64_t>(h)];
  }

  // The key of pool p for query row t, where t sees p: score_key of
  // score() for a usable pool, key_not_visible (score() not called) for a
  // pool of a bad block.
  template <class Score>
  KOKKOS_INLINE_FUNCTION void write_key(SelectRequest const& req, std::uint64_t t,
                                        std::uint64_t p, bool usable, Score const& score) const {
    if (p >= batch.visible(req, t)) return;
    keys[batch.key_offset(t) + p] = usable ? score_key(score()) : static_cast<Key>(key_not_visible);
  }
};

// The members of ScoreTeamInputs a derived functor names unqualified.
#define KPOOL_IMPL_SCORE_TEAM_INPUTS(ExecSpace, T, C)                                        \
  using Inputs = ::KPool::Details::ScoreTeamInputs<ExecSpace, T, C>;                        \
  using typename Inputs::memory_space, typename Inputs::member_type,                        \
      typename Inputs::scratch_space, typename Inputs::A, typename Inputs::Key;             \
  using Inputs::batch, Inputs::cache, Inputs::keys, Inputs::heads, \
      Inputs::rows_per_team, Inputs::splits, Inputs::write_key, Inputs::prepared_row, \
      Inputs::prepared_weight, Inputs::prepared_codes, Inputs::prepared_code_row, Inputs::row_hist

}  // namespace Details
}  // namespace KPool

#endif
