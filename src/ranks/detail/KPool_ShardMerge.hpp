#ifndef KPOOL_RANKS_DETAIL_SHARD_MERGE_HPP
#define KPOOL_RANKS_DETAIL_SHARD_MERGE_HPP

// The merge of a sharded selection (docs/ranks.md): every rank's local
// top-k of a query row (its local pool ids, ascending, -1 after them, and
// their keys) gathered into one buffer, rank after rank; a team a row
// picks the row's global top-k with KPool's rule (higher key first, ties
// to the lower pool id of the sequence) and writes the ids ascending, -1
// after them. A pool's key depends only on the query and the pool, so the
// union of the ranks' local top-k holds the global one, and the merge
// selects exactly what one rank selects over the whole cache.
//
// Per row, over the m = ranks * topk gathered entries (the valid ones:
// id >= 0; every valid key is nonzero, as key 0 is never selected):
//   1. n valid entries, k = min(topk, n);
//   2. the k-th largest key `thr`, bit by bit from the top (a count of the
//      keys >= a candidate a bit: exact integers, any team size);
//   3. among the keys equal to thr, the `rem` lowest ids: the rem-th
//      lowest id `gthr`, bit by bit likewise; an entry is picked when its
//      key is above thr, or equal to it with an id <= gthr (exactly k);
//   4. one team scan over the entries, rank by rank, counts the picks
//      before each; a pick's column is its rank's picks before it plus, for
//      every other rank, its picks of lower id (a binary search in that
//      rank's ascending list): the ids come out ascending.
// With Expand (select_tokens), each column is written as its K token
// positions and the tail after them (expanded_column, as select_tokens
// and expand_topk write them), from each row's positions count
// (ShardRowPositions).

#include <common/KPool_Shard.hpp>
#include <common/detail/KPool_KokkosExt.hpp>
#include <common/detail/KPool_Strided.hpp>
#include <common/detail/KPool_Views.hpp>
#include <common/detail/KPool_Scoring.hpp>
#include <select/KPool_ExpandTopk.hpp>

#include <cstdint>

namespace KPool {
namespace Details {

// A rank's part of the exchange for a call of `rows` rows: the local ids
// [rows][topk] int32, then from keys_offset on their keys [rows][topk].
struct ShardPayload {
  std::uint64_t keys_offset = 0;
  std::uint64_t bytes = 0;
};
template <class Key>
ShardPayload shard_payload(std::uint64_t rows, int topk) {
  std::uint64_t const entries = rows * static_cast<std::uint64_t>(topk);
  ShardPayload p;
  p.keys_offset = (entries * 4 + 7) / 8 * 8;
  p.bytes = p.keys_offset + entries * sizeof(Key);
  return p;
}

// A row no request owns: its entries are this, on every rank, from the
// local stage's fill; the merge leaves its output row untouched.
constexpr std::int32_t shard_dead_row = -2;

// Each row's positions count (its position + 1: what the expansion
// reads), or -1 for a row no live request owns: from a ragged batch
// (next_n = 0) or a decode batch's positions (entry (r, i) at base_r + i,
// base_r = p - j for the row's first real entry (r, j) at p, 0 without
// one: as the decode selection's rows).
template <class ExecutionSpace>
struct ShardRowPositions {
  using M = typename ExecutionSpace::memory_space;
  SelectBatch ragged;
  View2<const std::int32_t, M> positions;
  int next_n = 0;
  int num_requests = 0;
  std::int64_t* out = nullptr;

  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t t) const {
    if (next_n == 0) {
      SelectRequest req;
      out[t] = ragged.owner(static_cast<std::uint64_t>(t), req) < 0
                   ? -1
                   : static_cast<std::int64_t>(req.cache_length + (t - req.begin) + 1);
      return;
    }
    std::int64_t const r = t / next_n, i = t % next_n;
    if (r >= num_requests) {
      out[t] = -1;
      return;
    }
    out[t] = static_cast<std::int64_t>(decode_row_base(positions, r, next_n)) + i + 1;
  }
};

template <class ExecutionSpace, class Key, bool Expand = false>
struct ShardMergeFunctor {
  using member_type = typename KokkosExt::TeamPolicy<ExecutionSpace>::member_type;

  unsigned char const* recv = nullptr;  // ranks payloads, payload.bytes apart
  ShardPayload payload;
  std::int32_t* counts = nullptr;  // [rows][ranks * topk + 1]: picks before each entry
  // pool_ids [rows, topk], or with Expand the token rows [rows, topk * K + K - 1].
  Strided<std::int32_t, 2> out;
  std::int64_t const* row_positions = nullptr;  // Expand: [rows] (ShardRowPositions)
  int out_columns = 0;
  int kpool = 1;
  int ranks = 1;
  int interleave = 1;
  int topk = 1;

  // Column `col` of row t selects pool `id` (-1: none).
  KOKKOS_INLINE_FUNCTION void put(std::uint64_t t, int col, std::int64_t id) const {
    if (!Expand) {
      out(t, col) = static_cast<std::int32_t>(id);
      return;
    }
    int const selected = topk * kpool;
    for (int m = 0; m < kpool; ++m)
      out(t, col * kpool + m) =
          expanded_column(col * kpool + m, id, row_positions[t], kpool, selected);
  }

  KOKKOS_INLINE_FUNCTION std::int32_t id_at(std::uint64_t t, int w, int c) const {
    auto const* ids = reinterpret_cast<std::int32_t const*>(recv + w * payload.bytes);
    return ids[t * static_cast<std::uint64_t>(topk) + static_cast<std::uint64_t>(c)];
  }
  KOKKOS_INLINE_FUNCTION Key key_at(std::uint64_t t, int w, int c) const {
    auto const* keys =
        reinterpret_cast<Key const*>(recv + w * payload.bytes + payload.keys_offset);
    return keys[t * static_cast<std::uint64_t>(topk) + static_cast<std::uint64_t>(c)];
  }
  // Rank w's local pool `id` as a pool of the sequence.
  KOKKOS_INLINE_FUNCTION std::int64_t global_id(int w, std::int32_t id) const {
    Shard const s{w, ranks, interleave};
    return static_cast<std::int64_t>(s.global(static_cast<std::uint64_t>(id)));
  }
  // How many entries of rank w's list are valid and of a pool below g (the
  // valid ones come first, ascending).
  KOKKOS_INLINE_FUNCTION int below(std::uint64_t t, int w, std::int64_t g) const {
    int lo = 0, hi = topk;
    while (lo < hi) {
      int const mid = (lo + hi) / 2;
      std::int32_t const id = id_at(t, w, mid);
      if (id >= 0 && global_id(w, id) < g)
        lo = mid + 1;
      else
        hi = mid;
    }
    return lo;
  }
  // Valid entries i (rank i / topk, column i % topk) for which pred holds.
  template <class Pred>
  KOKKOS_INLINE_FUNCTION int count(member_type const& member, std::uint64_t t,
                                   Pred const& pred) const {
    int n = 0;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(member, ranks * topk),
        [&](int i, int& s) {
          int const w = i / topk, c = i % topk;
          std::int32_t const id = id_at(t, w, c);
          if (id >= 0 && pred(w, id, key_at(t, w, c))) ++s;
        },
        n);
    return n;
  }

  KOKKOS_INLINE_FUNCTION void operator()(member_type const& member) const {
    std::uint64_t const t = static_cast<std::uint64_t>(member.league_rank());
    if (id_at(t, 0, 0) == shard_dead_row) return;
    int const m = ranks * topk;
    int const n = count(member, t, [](int, std::int32_t, Key) { return true; });
    int const k = n < topk ? n : topk;
    // Every valid entry is picked unless there are more than k.
    Key thr = 0;
    std::int64_t gthr = 0x7FFFFFFF;
    if (n > k) {
      for (int b = static_cast<int>(8 * sizeof(Key)) - 1; b >= 0; --b) {
        Key const cand = thr | (Key(1) << b);
        if (count(member, t, [&](int, std::int32_t, Key key) { return key >= cand; }) >= k)
          thr = cand;
      }
      int const rem = k - count(member, t, [&](int, std::int32_t, Key key) { return key > thr; });
      gthr = 0;
      for (int b = 30; b >= 0; --b) {
        std::int64_t const cand = gthr | (std::int64_t(1) << b);
        if (count(member, t, [&](int w, std::int32_t id, Key key) {
              return key == thr && global_id(w, id) < cand;
            }) < rem)
          gthr = cand;
      }
    }
    auto const picked = [&](int w, int c) {
      std::int32_t const id = id_at(t, w, c);
      if (id < 0) return false;
      Key const key = key_at(t, w, c);
      return key > thr || (key == thr && global_id(w, id) <= gthr);
    };
    std::int32_t* const before = counts + t * static_cast<std::uint64_t>(m + 1);
    Kokkos::parallel_scan(Kokkos::TeamThreadRange(member, m),
                          [&](int i, int& sum, bool final) {
                            if (final) before[i] = sum;
                            sum += picked(i / topk, i % topk) ? 1 : 0;
                          });
    Kokkos::single(Kokkos::PerTeam(member), [&]() { before[m] = k; });
    member.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, m), [&](int i) {
      int const w = i / topk, c = i % topk;
      if (!picked(w, c)) return;
      std::int64_t const g = global_id(w, id_at(t, w, c));
      int col = before[i] - before[w * topk];
      for (int v = 0; v < ranks; ++v)
        if (v != w) col += before[v * topk + below(t, v, g)] - before[v * topk];
      put(t, col, g);
    });
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, topk - k),
                         [&](int x) { put(t, k + x, -1); });
    if (Expand) {
      int const selected = topk * kpool;
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, out_columns - selected), [&](int x) {
        out(t, selected + x) =
            expanded_column(selected + x, -1, row_positions[t], kpool, selected);
      });
    }
  }
};

}  // namespace Details
}  // namespace KPool

#endif
