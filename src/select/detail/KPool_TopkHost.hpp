#ifndef KPOOL_SELECT_DETAIL_TOPK_HOST_HPP
#define KPOOL_SELECT_DETAIL_TOPK_HOST_HPP

// SelectFunctor's host path: host_select and its helpers, members of
// SelectFunctor (KPool_TopkTeam.hpp) defined out of line.
//
// The host path (one-thread teams without device shapes): the same radix
// select, the same (prefix, rem) states and so the same selection, done
// sequentially (docs/indexer.md, "Top-k"). The first pass counts every
// key (key 0 is taken out of bin 0 when the scan gets there); a row
// whose threshold bin does not fit the candidates has its range [lo, hi]
// read once, and from then on the bits every key on the prefix shares
// (narrow) are resolved without a pass, and every histogram zeroes and
// scans only the bins that range reaches. The partition compacts ids
// from masks of 32 keys where no write can pass the lists' ends; the
// candidates are compacted after each of their digits. A split row
// that its plan left whole (fallback) and whose threshold bin holds more
// keys than fit scratch compacts their ids into its own region (its
// counts summed already, so free), instead of reading the row again.

#include <common/detail/KPool_KokkosExt.hpp>
#include <common/detail/KPool_Scoring.hpp>
#include <select/detail/KPool_TopkCore.hpp>
#include <select/detail/KPool_TopkTeam.hpp>

#include <cstdint>

namespace KPool {
namespace Details {

// Extends the prefix by the bits that every key on it within [lo, hi]
// shares (all of them: the prefix becomes a whole key, resolved).
template <class ExecutionSpace, class Key, bool Expand, bool Staged>
KOKKOS_INLINE_FUNCTION void SelectFunctor<ExecutionSpace, Key, Expand, Staged>::narrow(
    State& s, Key lo, Key hi) {
  if (s.resolved) return;
  Key const top = s.prefix | static_cast<Key>(~s.mask);
  Key const a = lo > s.prefix ? lo : s.prefix;
  Key const z = hi < top ? hi : top;
  if (a > z) return;
  Key const x = a ^ z;
  int sh = 0;
  while (sh < s.shift && (x >> sh) != 0) ++sh;
  if (sh >= s.shift) return;
  Key const keep = static_cast<Key>(~((Key(1) << sh) - 1));
  s.prefix = a & keep;
  s.mask = keep;
  s.shift = sh;
  s.resolved = sh == 0;
}

// The nonzero keys on the prefix within [lo, hi]: [a, a + span].
template <class ExecutionSpace, class Key, bool Expand, bool Staged>
KOKKOS_INLINE_FUNCTION void SelectFunctor<ExecutionSpace, Key, Expand, Staged>::on_prefix(
    State const& s, Key lo, Key hi, Key& a, Key& span) {
  Key const top = s.prefix | static_cast<Key>(~s.mask);
  a = lo > s.prefix ? lo : s.prefix;
  if (a == key_not_visible) a = 1;
  Key const z = hi < top ? hi : top;
  span = z >= a ? static_cast<Key>(z - a) : Key(0);
}

// The threshold bin among hist[dlo, dhi], scanned from the top: the
// state takes its digit and `count` its keys; false when the bins hold
// fewer than rem keys.
template <class ExecutionSpace, class Key, bool Expand, bool Staged>
KOKKOS_INLINE_FUNCTION bool SelectFunctor<ExecutionSpace, Key, Expand, Staged>::host_scan(
    Buffers const& b, int dlo, int dhi, int shift, int bits, State& s, std::uint64_t& count) {
  std::uint64_t const want = s.rem;
  std::uint64_t above = 0;
  for (int d = dhi; d >= dlo; --d) {
    std::uint64_t const c = b.hist(d);
    if (above + c >= want) {
      s.rem = want - above;
      count = c;
      advance(s, d, shift, bits, c);
      return true;
    }
    above += c;
  }
  return false;
}

// The next digit (up to digit_bits) over the m keys key_of(j) in [lo,
// hi] (those on the prefix count), and its threshold bin.
template <class ExecutionSpace, class Key, bool Expand, bool Staged>
template <class KeyOf>
KOKKOS_INLINE_FUNCTION void SelectFunctor<ExecutionSpace, Key, Expand, Staged>::host_digit(
    Buffers const& b, KeyOf const& key_of, std::uint64_t m, State& s, Key lo, Key hi,
    std::uint64_t& count, int digit_bits) {
  int const bits = s.shift < digit_bits ? s.shift : digit_bits;
  int const shift = s.shift - bits;
  Key const low = static_cast<Key>((Key(1) << bits) - 1);
  Key a, span;
  on_prefix(s, lo, hi, a, span);
  int const dlo = static_cast<int>((a >> shift) & low);
  int const dhi = static_cast<int>((static_cast<Key>(a + span) >> shift) & low);
  std::uint32_t* h = b.hist.data();
  for (int d = dlo; d <= dhi; ++d) h[d] = 0;
  for (std::uint64_t j = 0; j < m; ++j) {
    Key const key = key_of(j);
    if (static_cast<Key>(key - a) <= span) ++h[static_cast<int>((key >> shift) & low)];
  }
  host_scan(b, dlo, dhi, shift, bits, s, count);
}

// Keeps the m candidates (ids id_of(j), keys key_of(j)) that are on the
// prefix or above it (chosen by choose_ties), in order, through put(c,
// id, key, keep) (c: those kept before; put may write whatever `keep`
// is, when c never passes j); the range of those on the prefix into lo,
// hi; returns how many are kept.
template <class ExecutionSpace, class Key, bool Expand, bool Staged>
template <class IdOf, class KeyOf, class Put>
KOKKOS_INLINE_FUNCTION int SelectFunctor<ExecutionSpace, Key, Expand, Staged>::host_keep(
    IdOf const& id_of, KeyOf const& key_of, Put const& put, int m, State const& s, Key& lo,
    Key& hi) {
  Key a, span;
  on_prefix(s, lo, hi, a, span);
  Key nlo = static_cast<Key>(~Key(0)), nhi = 0;
  int c = 0;
  for (int j = 0; j < m; ++j) {
    Key const key = key_of(j);
    bool const on = static_cast<Key>(key - a) <= span;
    bool const keep = key >= a;
    put(c, id_of(j), key, keep);
    c += keep ? 1 : 0;
    nlo = on && key < nlo ? key : nlo;
    nhi = on && key > nhi ? key : nhi;
  }
  lo = nlo;
  hi = nhi;
  return c;
}

// The host path: the row passes (host_row_passes), the partition, the
// candidate passes (host_candidates), and the lists merged and written.
template <class ExecutionSpace, class Key, bool Expand, bool Staged>
KOKKOS_INLINE_FUNCTION void SelectFunctor<ExecutionSpace, Key, Expand, Staged>::host_select(
    member_type const& member, Buffers const& b, std::uint64_t t, SelectRequest const& req,
    std::uint64_t i, Key const* row, std::uint64_t n, bool split) const {
  std::uint64_t const k = n < static_cast<std::uint64_t>(topk) ? n : topk;
  State s = State::start(k);
  bool all = n <= static_cast<std::uint64_t>(topk);
  std::uint64_t count = 0;
  // A split row's region: its segments' suffix counts, [segs][bins]
  // 16-bit words (split_counts), then, once summed, its candidates' ids.
  std::uint32_t* const big = split ? seg_hist + i * split_region_words(segs) : nullptr;
  std::uint64_t const big_cap = split ? static_cast<std::uint64_t>(segs) * bins : 0;
  if (!all) host_row_passes(b, row, n, k, split, big, big_cap, s, all, count);

  // Partition: sure ids above the prefix; the ids on it into the
  // candidates (scratch, or the split row's buffer), or, resolved, the
  // first rem into chosen. With `all`, every nonzero key is sure.
  bool const to_big = !all && !s.resolved && count > static_cast<std::uint64_t>(cap);
  Key const first = all ? Key(1) : (s.prefix > 1 ? s.prefix : Key(1));
  Key const top = all ? Key(0) : static_cast<Key>(s.prefix | static_cast<Key>(~s.mask));
  bool const resolved = !all && s.resolved;
  std::uint64_t const rem = s.rem;
  std::uint64_t ns = 0, nc = 0;
  Key clo = static_cast<Key>(~Key(0)), chi = 0;
  auto one = [&](std::uint64_t p) {
    Key const key = row[p];
    if (key < first) return;
    std::int32_t const id = static_cast<std::int32_t>(p);
    if (key > top) {
      b.sure(static_cast<int>(ns++)) = id;
    } else if (resolved) {
      if (nc < rem) b.chosen(static_cast<int>(nc)) = id;
      ++nc;
    } else {
      if (to_big) {
        big[nc] = static_cast<std::uint32_t>(id);
      } else {
        b.cand_ids(static_cast<int>(nc)) = id;
        b.cand_keys(static_cast<int>(nc)) = key;
      }
      ++nc;
      clo = key < clo ? key : clo;
      chi = key > chi ? key : chi;
    }
  };
  // Ids are compacted from masks, without a branch a key, when no write
  // can pass the lists' ends: fewer than k keys are above the prefix,
  // fewer than the buffer holds on it.
  bool const flat = !all && !resolved &&
                    count < (to_big ? big_cap : static_cast<std::uint64_t>(cap));
  Key const span = static_cast<Key>(top - first);
  std::int32_t* const sure = b.sure.data();
  std::int32_t* const cand_ids =
      to_big ? reinterpret_cast<std::int32_t*>(big) : b.cand_ids.data();
  Key* const cand_keys = b.cand_keys.data();
  std::uint64_t p = 0;
  if (flat) {
    // Blocks of keys: the masks of the sure keys and of the candidates,
    // then a store for each set bit only; the candidates' keys are read
    // again after.
    for (; p + host_block <= n; p += host_block) {
      std::uint32_t ms, mc;
      host_block_masks(row + p, top, first, span, ms, mc);
      for (; ms != 0; ms &= ms - 1)
        sure[ns++] = static_cast<std::int32_t>(p + KokkosExt::lowest_set_bit(ms));
      for (; mc != 0; mc &= mc - 1)
        cand_ids[nc++] = static_cast<std::int32_t>(p + KokkosExt::lowest_set_bit(mc));
    }
  }
  for (; p < n; ++p) one(p);
  if (flat && !to_big)
    for (std::uint64_t j = 0; j < nc; ++j) {
      Key const key = row[cand_ids[j]];
      cand_keys[j] = key;
      clo = key < clo ? key : clo;
      chi = key > chi ? key : chi;
    }
  if (flat && to_big) {
    // The candidates' range is not tracked: the prefix's.
    clo = first;
    chi = top;
  }

  std::uint64_t n_chosen = 0;
  if (resolved) {
    n_chosen = nc < rem ? nc : rem;
  } else if (!all) {
    n_chosen = host_candidates(member, b, row, big, to_big, static_cast<int>(nc), s, clo, chi);
  }
  write(member, b, t, req, static_cast<int>(ns), static_cast<int>(n_chosen));
}

// The row passes of host_select (a row of more than k visible pools):
// the first digit (every key counted, or a split row's summed counts)
// and its threshold bin, then, while that bin does not fit a candidate
// buffer (nor a split row's region `big`, big_cap ids), the range of
// the row's nonzero keys and the next digits. `all` becomes true when
// no more than k keys are nonzero.
template <class ExecutionSpace, class Key, bool Expand, bool Staged>
KOKKOS_INLINE_FUNCTION void SelectFunctor<ExecutionSpace, Key, Expand, Staged>::host_row_passes(
    Buffers const& b, Key const* row, std::uint64_t n, std::uint64_t k, bool split,
    std::uint32_t const* big, std::uint64_t big_cap, State& s, bool& all,
    std::uint64_t& count) const {
  Key lo = 1, hi = static_cast<Key>(~Key(0));  // the nonzero keys' range
  std::uint32_t* h = b.hist.data();
  int const shift = key_bits - select_digit_bits;
  int dhi = bins - 1;
  if (split) {
    // The segments' suffix counts, summed, then differenced.
    std::uint64_t const used = (n + segment - 1) / segment;
    std::uint16_t const* const cum = split_counts(big);
    for (int d = 0; d < bins; ++d) h[d] = cum[d];
    for (std::uint64_t g = 1; g < used; ++g) {
      std::uint16_t const* src = cum + g * bins;
      for (int d = 0; d < bins; ++d) h[d] += src[d];
    }
    for (int d = 0; d + 1 < bins; ++d) h[d] -= h[d + 1];
  } else {
    // Every key counted, key 0 too (in bin 0, taken out below when the
    // scan gets there): the loop is a load and an increment a key.
    for (int d = 0; d < bins; ++d) h[d] = 0;
    std::uint64_t p = 0;
    for (; p + 4 <= n; p += 4) {
      int const d0 = static_cast<int>(row[p] >> shift);
      int const d1 = static_cast<int>(row[p + 1] >> shift);
      int const d2 = static_cast<int>(row[p + 2] >> shift);
      int const d3 = static_cast<int>(row[p + 3] >> shift);
      ++h[d0];
      ++h[d1];
      ++h[d2];
      ++h[d3];
    }
    for (; p < n; ++p) ++h[static_cast<int>(row[p] >> shift)];
    std::uint64_t above = 0;
    for (int d = 1; d < bins; ++d) above += h[d];
    for (dhi = bins - 1; dhi > 0 && h[dhi] == 0; --dhi) {
    }
    if (above < k) {
      std::uint32_t zeros = 0;
      for (std::uint64_t p = 0; p < n; ++p) zeros += row[p] == key_not_visible ? 1u : 0u;
      h[0] -= zeros;
    }
  }
  // No threshold: no more than k nonzero keys, all selected.
  all = !host_scan(b, 0, dhi, shift, select_digit_bits, s, count);
  // Row passes while the threshold bin does not fit a candidate
  // buffer, after one pass for the range of the row's nonzero keys.
  if (!all && !s.resolved && count > static_cast<std::uint64_t>(cap) &&
      count > big_cap && !split) {
    Key mx = 0, mn1 = static_cast<Key>(~Key(0));  // min(key - 1): 0 wraps
    for (std::uint64_t p = 0; p < n; ++p) {
      Key const key = row[p];
      mx = key > mx ? key : mx;
      Key const k1 = static_cast<Key>(key - 1);
      mn1 = k1 < mn1 ? k1 : mn1;
    }
    lo = static_cast<Key>(mn1 + 1);
    hi = mx;
  }
  if (!all) narrow(s, lo, hi);
  while (!all && !s.resolved && count > static_cast<std::uint64_t>(cap) &&
         count > big_cap) {
    host_digit(b, [&](std::uint64_t p) { return row[p]; }, n, s, lo, hi, count);
    narrow(s, lo, hi);
  }
}

// The candidate passes of host_select: the remaining digits over its m
// candidates (in scratch; with to_big, their ids in the split row's
// region `big`), their keys in [lo, hi], each digit followed by a
// compaction; then the tie rule into chosen. Returns how many are
// chosen.
template <class ExecutionSpace, class Key, bool Expand, bool Staged>
KOKKOS_INLINE_FUNCTION std::uint64_t
SelectFunctor<ExecutionSpace, Key, Expand, Staged>::host_candidates(
    member_type const& member, Buffers const& b, Key const* row, std::uint32_t* big,
    bool to_big, int m, State& s, Key lo, Key hi) const {
  narrow(s, lo, hi);
  if (to_big) {
    return host_list_tail(
        b, [&](int j) { return static_cast<std::int32_t>(big[j]); },
        [&](std::uint64_t j) { return row[big[j]]; },
        [&](int c, std::int32_t id, Key) { big[c] = static_cast<std::uint32_t>(id); }, m,
        s, lo, hi);
  }
  auto cand_id = [&](int j) { return b.cand_ids(j); };
  auto cand_key = [&](std::uint64_t j) { return b.cand_keys(static_cast<int>(j)); };
  std::uint64_t count = 0;
  while (!s.resolved) {
    // At most cap candidates: 256 bins a digit.
    host_digit(b, cand_key, static_cast<std::uint64_t>(m), s, lo, hi, count, 8);
    m = host_keep(cand_id, cand_key,
                  [&](int c, std::int32_t id, Key key, bool) {
                    b.cand_ids(c) = id;
                    b.cand_keys(c) = key;
                  },
                  m, s, lo, hi);
    narrow(s, lo, hi);
  }
  return choose_ties(member, b, m, s);
}

// The remaining digits over the m candidates in global memory (ids
// id_at(j) ascending, keys key_at(j) in [lo, hi]), compacted through
// put(c, id, key) after each; then the tie rule over them into chosen.
// Returns how many are chosen.
template <class ExecutionSpace, class Key, bool Expand, bool Staged>
template <class IdAt, class KeyAt, class Put>
KOKKOS_INLINE_FUNCTION std::uint64_t
SelectFunctor<ExecutionSpace, Key, Expand, Staged>::host_list_tail(
    Buffers const& b, IdAt const& id_at, KeyAt const& key_at, Put const& put, int m,
    State& s, Key lo, Key hi) {
  std::uint64_t count = 0;
  while (!s.resolved) {
    host_digit(b, key_at, static_cast<std::uint64_t>(m), s, lo, hi, count);
    m = host_keep(id_at, key_at,
                  [&](int c, std::int32_t id, Key key, bool) { put(c, id, key); }, m, s,
                  lo, hi);
    narrow(s, lo, hi);
  }
  Key const thr = s.prefix;
  std::uint64_t eq = 0, n_chosen = 0;
  for (int j = 0; j < m; ++j) {
    Key const key = static_cast<Key>(key_at(j) & s.mask);
    if (key > thr || (key == thr && eq++ < s.rem))
      b.chosen(static_cast<int>(n_chosen++)) = id_at(j);
  }
  return n_chosen;
}

}  // namespace Details
}  // namespace KPool

#endif
