#ifndef KPOOL_SELECT_DETAIL_TOPK_TEAM_HPP
#define KPOOL_SELECT_DETAIL_TOPK_TEAM_HPP

// SelectFunctor: the selection's radix select (KPool_TopkCore.hpp) by one
// team a row. The row is read from global memory once per row pass and
// once for the partition; a Staged kernel copies it into team scratch on
// the first read, when the launch knows every row fits. A row split over
// teams (KPool_TopkSplit.hpp) goes on from its candidates (split_finish),
// or, when they do not fit the row's region, reads the row whole from its
// summed counts.
// Team scratch holds the histogram, 2 * topk ids and the candidates, so it
// grows with topk. A device never takes level-1 scratch (on CUDA it
// allocates and fences, and breaks graph capture): when the buffers do not
// fit level 0 (topk past about 3900 in 40 KB, 4900 in 48 KB), launch_select takes
// SelectWideFunctor (KPool_TopkWide.hpp) instead, whose scratch is the
// same for every topk. The loops over a row's pools are 64-bit
// (KokkosExt::team_range).
// The team scans need a power-of-two team size on CUDA before Kokkos 3.7:
// launch_select rounds it, and a device-shapes build on a host checks it.
// A host's one-thread teams (no device shapes) take host_select
// (KPool_TopkHost.hpp): the same states, sequential, with ranges narrowing
// the digits, branchless compaction, and a split row's candidate ids in
// its region.

#include <common/detail/KPool_KokkosExt.hpp>
#include <common/detail/KPool_Strided.hpp>
#include <common/detail/KPool_Scoring.hpp>
#include <select/detail/KPool_ExpandTopkFunctor.hpp>
#include <select/detail/KPool_TopkCore.hpp>

#include <cstddef>
#include <cstdint>

namespace KPool {
namespace Details {

// Level-0 team scratch always. Staged: every row fits team scratch next to
// the buffers and is copied there on its first read.
template <class ExecutionSpace, class Key, bool Expand, bool Staged = false>
struct SelectFunctor : SelectTeamInputs<ExecutionSpace, Key> {
  KPOOL_IMPL_SELECT_TEAM_INPUTS(ExecutionSpace, Key);

  static constexpr int bins = select_bins;
  static constexpr int key_bits = 8 * static_cast<int>(sizeof(Key));

  // No split rows unless set_split_args says otherwise.
  int segs = 0;  // segments a split row's histograms hold (0: no split rows)
  std::uint64_t split_from = 0;
  std::uint64_t segment = 1;  // pools a segment of a split row
  // [chunk rows][split_region_words(segs)]: the segments' 16-bit suffix
  // counts (split_counts); once planned, a split row's sure ids and
  // candidates (SegmentPartitionFunctor), or on a host its candidate
  // buffer once summed (host_select).
  std::uint32_t* seg_hist = nullptr;
  std::uint32_t const* plans = nullptr;  // [chunk rows][split_plan_words(segs)]

  int cap = 0;  // candidates the buffer holds
  // [chunk rows][bins], or null: each row's first-digit histogram as the
  // scoring built it (ScoreTeamInputs::row_hist); a row not split starts
  // from it instead of a histogram pass over its keys.
  std::uint32_t const* built_hist = nullptr;

  // hist, shared values, sure ids, chosen ids, `cap` candidate ids and
  // keys, and (Staged) the row.
  static std::size_t fixed_bytes(int topk, std::size_t row) {
    return Scratch<std::uint32_t>::shmem_size(bins) + Scratch<std::uint64_t>::shmem_size(8) +
           2 * Scratch<std::int32_t>::shmem_size(topk) +
           (Staged ? Scratch<Key>::shmem_size(row) : 0);
  }
  static std::size_t scratch_bytes(int topk, std::size_t row, int cap) {
    return fixed_bytes(topk, row) + Scratch<std::int32_t>::shmem_size(cap) +
           Scratch<Key>::shmem_size(cap);
  }
  // The largest candidate buffer (up to candidate_capacity) that keeps the
  // scratch within `budget`, or 0 when not even min_candidates fit.
  static constexpr int min_candidates = 128;
  static int capacity_for(int topk, std::size_t row, std::size_t budget) {
    std::size_t const fixed = fixed_bytes(topk, row) + 2 * 64;
    if (fixed >= budget) return 0;
    std::size_t const per = sizeof(Key) + sizeof(std::int32_t);
    std::size_t c = (budget - fixed) / per;
    c = c > static_cast<std::size_t>(candidate_capacity) ? candidate_capacity : c;
    c &= ~std::size_t(7);
    while (c >= static_cast<std::size_t>(min_candidates) &&
           scratch_bytes(topk, row, static_cast<int>(c)) > budget)
      c -= 8;
    return c < static_cast<std::size_t>(min_candidates) ? 0 : static_cast<int>(c);
  }

  // The team's buffers.
  struct Buffers {
    Scratch<std::uint32_t> hist;
    Scratch<std::uint64_t> shared;
    Scratch<std::int32_t> sure, chosen, cand_ids;
    Scratch<Key> cand_keys, row;
  };

  // Where a radix select stands: the keys matching `prefix` under `mask`
  // are in play; `rem` of them are still to take.
  struct State {
    Key prefix;
    Key mask;
    std::uint64_t rem;
    int shift;  // bits below the digits resolved so far
    bool resolved;

    // Before the first digit: the top k of the row are still to be found.
    KOKKOS_INLINE_FUNCTION static State start(std::uint64_t k) {
      State s;
      s.prefix = 0;
      s.mask = 0;
      s.rem = k;
      s.shift = key_bits;
      s.resolved = false;
      return s;
    }
  };

  KOKKOS_INLINE_FUNCTION void operator()(member_type const& member) const {
    SelectRow r{};
    if (!r.find<ExecutionSpace>(member, batch, member.league_rank())) return;
    select_row(member, member.team_scratch(0), r);
  }

  // Row r by the team, its buffers taken from `scratch` (the team's
  // level-0 scratch; the fused decode selection passes it as it stood
  // before the team scored, so that the selection reuses the scoring
  // tiles' bytes).
  KOKKOS_INLINE_FUNCTION void select_row(member_type const& member,
                                         typename ExecutionSpace::scratch_memory_space const& scratch,
                                         SelectRow const& r) const {
    std::uint64_t const i = r.i, t = r.t, n = r.n;
    SelectRequest const& req = r.req;
    Key const* row = keys + i * batch.max_visible;
    bool const split = segs > 0 && n > split_from;

    Buffers b;
    b.hist = Scratch<std::uint32_t>(scratch, bins);
    b.shared = Scratch<std::uint64_t>(scratch, 8);
    b.sure = Scratch<std::int32_t>(scratch, topk);
    b.chosen = Scratch<std::int32_t>(scratch, topk);
    b.cand_ids = Scratch<std::int32_t>(scratch, cap);
    b.cand_keys = Scratch<Key>(scratch, cap);
    if (Staged)
      b.row = Scratch<Key>(scratch, split ? 0 : n);
    // A split row whose ids its segments have partitioned (its plan says
    // so) goes on from its candidates.
    if (split && plans[i * split_plan_words(segs) + SplitPlan::state] != SplitPlan::fallback) {
      split_finish(member, b, t, req, i, n);
      return;
    }
    if constexpr (!device_shapes<ExecutionSpace>::value) {
      // A host's one-thread teams take the sequential path below.
      if (member.team_size() == 1) {
        host_select(member, b, t, req, i, row, n, split);
        return;
      }
    }
    bool const staged = Staged && !split;
    bool in_scratch = false;  // the row has been copied into scratch

    std::uint64_t const k = n < static_cast<std::uint64_t>(topk) ? n : topk;
    State s = State::start(k);
    // all: every nonzero key is selected (no more than k of them).
    bool all = n <= static_cast<std::uint64_t>(topk);
    bool on_row = true;  // the prefix's keys are still only in the row
    if (!all) {
      for (bool first = true; on_row; first = false) {
        int const bits = s.shift < select_digit_bits ? s.shift : select_digit_bits;
        int const shift = s.shift - bits;
        if (first && split) {
          merge_segments(member, b, i, n);
        } else if (first && built_hist != nullptr) {
          // The histogram the scoring built (load_hist).
          Kokkos::parallel_for(Kokkos::TeamThreadRange(member, bins), [&](int d) {
            b.hist(d) = built_hist[i * static_cast<std::uint64_t>(bins) + d];
          });
          member.team_barrier();
        } else {
          if (first && staged) {
            stage_row_hist(member, b, row, n, shift);
            in_scratch = true;
          } else {
            row_hist(member, b, in_scratch ? b.row.data() : row, n, s, shift, bits);
          }
        }
        std::uint64_t count = 0, total = 0;
        int const d = find_digit(member, b, 1 << bits, s.rem, count, total);
        if (first && total <= k) {
          all = true;
          break;
        }
        advance(s, d, shift, bits, count);
        if (s.resolved || count <= static_cast<std::uint64_t>(cap)) on_row = false;
      }
    }

    // Partition: sure ids above the prefix, candidates (or, resolved, the
    // chosen ties) on it.
    std::uint64_t n_sure = 0, n_cand = 0;
    partition(member, b, in_scratch ? b.row.data() : row, n, s, all, n_sure, n_cand);
    std::uint64_t n_chosen = s.resolved ? (n_cand < s.rem ? n_cand : s.rem) : 0;
    if (!all && !s.resolved) {
      int const m = static_cast<int>(n_cand);
      while (!s.resolved) {
        int const bits = s.shift < select_digit_bits ? s.shift : select_digit_bits;
        int const shift = s.shift - bits;
        row_hist(member, b, b.cand_keys.data(), m, s, shift, bits);
        std::uint64_t count = 0, total = 0;
        int const d = find_digit(member, b, 1 << bits, s.rem, count, total);
        advance(s, d, shift, bits, count);
      }
      n_chosen = choose_ties(member, b, m, s);
    }
    if (all) n_chosen = 0;
    write(member, b, t, req, static_cast<int>(n_sure), static_cast<int>(n_chosen));
  }

  // A planned split row: its sure ids, then (threshold) the remaining
  // digits over its candidates' keys and the tie rule over them; merged
  // and written as any row. It does not read the row (KPool_TopkSplit.hpp).
  KOKKOS_INLINE_FUNCTION void split_finish(member_type const& member, Buffers const& b,
                                           std::uint64_t t, SelectRequest const& req,
                                           std::uint64_t i, std::uint64_t n) const;

  // ---------------------------------------------------------------- host
  // The host path (one-thread teams without device shapes), defined in
  // KPool_TopkHost.hpp.
  KOKKOS_INLINE_FUNCTION static void narrow(State& s, Key lo, Key hi);
  KOKKOS_INLINE_FUNCTION static void on_prefix(State const& s, Key lo, Key hi, Key& a, Key& span);
  KOKKOS_INLINE_FUNCTION static bool host_scan(Buffers const& b, int dlo, int dhi, int shift,
                                               int bits, State& s, std::uint64_t& count);
  template <class KeyOf>
  KOKKOS_INLINE_FUNCTION static void host_digit(Buffers const& b, KeyOf const& key_of,
                                                std::uint64_t m, State& s, Key lo, Key hi,
                                                std::uint64_t& count,
                                                int digit_bits = select_digit_bits);
  template <class IdOf, class KeyOf, class Put>
  KOKKOS_INLINE_FUNCTION static int host_keep(IdOf const& id_of, KeyOf const& key_of,
                                              Put const& put, int m, State const& s, Key& lo,
                                              Key& hi);
  KOKKOS_INLINE_FUNCTION void host_select(member_type const& member, Buffers const& b,
                                          std::uint64_t t, SelectRequest const& req,
                                          std::uint64_t i, Key const* row, std::uint64_t n,
                                          bool split) const;
  KOKKOS_INLINE_FUNCTION void host_row_passes(Buffers const& b, Key const* row, std::uint64_t n,
                                              std::uint64_t k, bool split,
                                              std::uint32_t const* big, std::uint64_t big_cap,
                                              State& s, bool& all, std::uint64_t& count) const;
  KOKKOS_INLINE_FUNCTION std::uint64_t host_candidates(member_type const& member,
                                                       Buffers const& b, Key const* row,
                                                       std::uint32_t* big, bool to_big, int m,
                                                       State& s, Key lo, Key hi) const;
  template <class IdAt, class KeyAt, class Put>
  KOKKOS_INLINE_FUNCTION static std::uint64_t host_list_tail(Buffers const& b, IdAt const& id_at,
                                                             KeyAt const& key_at, Put const& put,
                                                             int m, State& s, Key lo, Key hi);

  KOKKOS_INLINE_FUNCTION static void advance(State& s, int d, int shift, int bits,
                                             std::uint64_t count) {
    s.prefix |= static_cast<Key>(d) << shift;
    s.mask |= static_cast<Key>((1u << bits) - 1) << shift;
    s.shift = shift;
    // Every key on the prefix is taken once the bin holds just the rest.
    s.resolved = shift == 0 || count == s.rem;
  }

  KOKKOS_INLINE_FUNCTION static bool matches(Key key, State const& s) {
    return key != key_not_visible && (key & s.mask) == s.prefix;
  }

  KOKKOS_INLINE_FUNCTION void zero_hist(member_type const& member, Buffers const& b,
                                        int nb) const {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, nb),
                         [&](int d) { b.hist(d) = 0; });
    member.team_barrier();
  }

  KOKKOS_INLINE_FUNCTION static void count(member_type const& member, Buffers const& b,
                                           int d) {
    if (member.team_size() == 1)
      ++b.hist(d);
    else
      Kokkos::atomic_add(&b.hist(d), 1u);
  }

  // The first digit's histogram, copying the row into scratch.
  KOKKOS_INLINE_FUNCTION void stage_row_hist(member_type const& member, Buffers const& b,
                                             Key const* row, std::uint64_t n,
                                             int shift) const {
    zero_hist(member, b, bins);
    Kokkos::parallel_for(KokkosExt::team_range(member, 0, n), [&](std::int64_t p) {
      Key const key = row[p];
      b.row(p) = key;
      if (key != key_not_visible) count(member, b, static_cast<int>(key >> shift));
    });
    member.team_barrier();
  }

  // The histogram of the next digit over src[0, n)'s keys on the prefix.
  KOKKOS_INLINE_FUNCTION void row_hist(member_type const& member, Buffers const& b,
                                       Key const* src, std::uint64_t n, State const& s,
                                       int shift, int bits) const {
    hist_pass(member, b, [&](std::uint64_t p) { return src[p]; }, n, s, shift, bits);
  }

  // The same over the keys key_at(0 .. n - 1).
  template <class KeyAt>
  KOKKOS_INLINE_FUNCTION void hist_pass(member_type const& member, Buffers const& b,
                                        KeyAt const& key_at, std::uint64_t n,
                                        State const& s, int shift, int bits) const {
    int const nb = 1 << bits;
    zero_hist(member, b, nb);
    Key const low = static_cast<Key>(nb - 1);
    if (member.team_size() == 1) {
      std::uint32_t* h = b.hist.data();
      for (std::uint64_t p = 0; p < n; ++p) {
        Key const key = key_at(p);
        if (matches(key, s)) ++h[static_cast<int>((key >> shift) & low)];
      }
    } else {
      Kokkos::parallel_for(KokkosExt::team_range(member, 0, n),
                           [&](std::int64_t p) {
                             Key const key = key_at(static_cast<std::uint64_t>(p));
                             if (matches(key, s))
                               Kokkos::atomic_add(&b.hist(static_cast<int>((key >> shift) & low)),
                                                  1u);
                           });
    }
    member.team_barrier();
  }

  // A split row's first histogram: the sum of its segments' (each bin the
  // difference of two suffix counts) (KPool_TopkSplit.hpp).
  KOKKOS_INLINE_FUNCTION void merge_segments(member_type const& member, Buffers const& b,
                                             std::uint64_t i, std::uint64_t n) const;
  template <int Ways>
  KOKKOS_INLINE_FUNCTION static void merge_suffix_counts(member_type const& member, Buffers const& b,
                                                         std::uint16_t const* cum, std::uint64_t used);

  // The threshold digit: the bin d with (keys in bins above d) < rem <=
  // (keys in bins d and above), scanned from the top bin; rem becomes what
  // is left to take in bin d, `count` its keys, `total` all counted keys
  // (when total < rem, no bin is found and d is 0).
  KOKKOS_INLINE_FUNCTION static int find_digit(member_type const& member, Buffers const& b,
                                               int nb, std::uint64_t& rem,
                                               std::uint64_t& count, std::uint64_t& total) {
    std::uint64_t const want = rem;
    if (member.team_size() == 1) {
      std::uint64_t above = 0;
      int found = 0;
      std::uint64_t found_rem = 0, found_count = 0;
      bool done = false;
      for (int d = nb - 1; d >= 0; --d) {
        std::uint64_t const h = b.hist(d);
        if (!done && above < want && above + h >= want) {
          found = d;
          found_rem = want - above;
          found_count = h;
          done = true;
        }
        above += h;
      }
      total = above;
      rem = found_rem;
      count = found_count;
      return found;
    }
    Kokkos::single(Kokkos::PerTeam(member), [&]() {
      b.shared(0) = 0;
      b.shared(1) = 0;
      b.shared(2) = 0;
      b.shared(3) = 0;
    });
    member.team_barrier();
    // In runs: run q holds the bins j in [q * len, (q + 1) * len) from the
    // top (d = nb - 1 - j), one a thread, so the team scans the runs' sums
    // in one chunk (a team scan of the bins takes one a team size: 16, with
    // their barriers, for 2048 bins and 128 threads), then each run walks
    // its bins from its prefix: the same sums, the same digit. The runs'
    // length is odd (17 for 2048 bins and 128 threads), so the threads of
    // a warp reading their runs' j-th bins fall on distinct banks (a run
    // of 16 put 16 of them on one bank); a team's last runs may be short
    // or missing.
    int const len = ((nb + member.team_size() - 1) / member.team_size()) | 1;
    int const runs = (nb + len - 1) / len;
    Kokkos::parallel_scan(Kokkos::TeamThreadRange(member, runs),
                          [&](int q, std::uint64_t& above, bool final) {
                            int const j1 = (q + 1) * len < nb ? (q + 1) * len : nb;
                            std::uint64_t a = above;
                            for (int j = q * len; j < j1; ++j) {
                              int const d = nb - 1 - j;
                              std::uint64_t const h = b.hist(d);
                              if (final && a < want && a + h >= want) {
                                b.shared(0) = static_cast<std::uint64_t>(d);
                                b.shared(1) = want - a;
                                b.shared(2) = h;
                              }
                              a += h;
                            }
                            if (final && q == runs - 1) b.shared(3) = a;
                            above = a;
                          });
    member.team_barrier();
    int const d = static_cast<int>(b.shared(0));
    rem = b.shared(1);
    count = b.shared(2);
    total = b.shared(3);
    member.team_barrier();
    return d;
  }

  // The ordered partition of row[0, n): ids above the prefix into sure,
  // ids on it into the candidates (resolved: the first rem into chosen).
  // With `all`, every nonzero key is sure.
  KOKKOS_INLINE_FUNCTION void partition(member_type const& member, Buffers const& b,
                                        Key const* row, std::uint64_t n, State const& s,
                                        bool all, std::uint64_t& n_sure,
                                        std::uint64_t& n_cand) const {
    Key const prefix = all ? Key(0) : s.prefix;
    Key const mask = all ? Key(0) : s.mask;
    bool const resolved = s.resolved;
    std::uint64_t const rem = s.rem;
    // Without `all`, a nonzero key above the prefix; with it, any nonzero
    // key (mask 0, prefix 0 make every key "on the prefix", so test
    // `above` as nonzero-and-all).
    if (member.team_size() == 1) {
      std::uint64_t ns = 0, nc = 0;
      for (std::uint64_t p = 0; p < n; ++p) {
        Key const key = row[p];
        if (key == key_not_visible) continue;
        Key const m = key & mask;
        if (all || m > prefix) {
          b.sure(static_cast<int>(ns++)) = static_cast<std::int32_t>(p);
        } else if (m == prefix) {
          if (resolved) {
            if (nc < rem) b.chosen(static_cast<int>(nc)) = static_cast<std::int32_t>(p);
          } else {
            b.cand_ids(static_cast<int>(nc)) = static_cast<std::int32_t>(p);
            b.cand_keys(static_cast<int>(nc)) = key;
          }
          ++nc;
        }
      }
      n_sure = ns;
      n_cand = nc;
      return;
    }
    // (sure so far) in the low half, (on the prefix so far) in the high
    // half: visible < 2^32 pools, so neither overflows.
    std::uint64_t const totals = team_ordered_scan(
        member, runs(b), &b.shared(4), n,
        [&](std::uint64_t p, std::uint64_t& before, bool final) {
          Key const key = row[p];
          bool const nz = key != key_not_visible;
          Key const m = key & mask;
          bool const above = nz && (all || m > prefix);
          bool const on = nz && !all && m == prefix;
          if (final) {
            std::uint64_t const sb = before & 0xFFFFFFFFull;
            std::uint64_t const cb = before >> 32;
            if (above) b.sure(static_cast<int>(sb)) = static_cast<std::int32_t>(p);
            if (on) {
              if (resolved) {
                if (cb < rem) b.chosen(static_cast<int>(cb)) = static_cast<std::int32_t>(p);
              } else {
                b.cand_ids(static_cast<int>(cb)) = static_cast<std::int32_t>(p);
                b.cand_keys(static_cast<int>(cb)) = key;
              }
            }
          }
          before += (above ? 1ull : 0ull) + (on ? (1ull << 32) : 0ull);
        });
    n_sure = totals & 0xFFFFFFFFull;
    n_cand = totals >> 32;
  }

  // team_ordered_scan's words: the histogram's (free while a partition or
  // the tie rule runs; select_bins / 2 words, one a thread of the largest
  // team).
  static_assert(select_bins / 2 >= max_select_team, "a word a thread in the histogram");
  KOKKOS_INLINE_FUNCTION static std::uint64_t* runs(Buffers const& b) {
    return reinterpret_cast<std::uint64_t*>(b.hist.data());
  }

  // The tie rule over the m candidates (ascending ids), thr = the prefix
  // (resolved): above it chosen, equal to it the first rem; returns how
  // many are chosen.
  KOKKOS_INLINE_FUNCTION std::uint64_t choose_ties(member_type const& member,
                                                   Buffers const& b, int m,
                                                   State const& s) const {
    return choose_ties_at(
        member, b, m, s, [&](std::uint64_t j) { return b.cand_keys(static_cast<int>(j)); },
        [&](int j) { return b.cand_ids(j); });
  }

  // The same over candidates whose keys and ids are key_at(j), id_at(j).
  template <class KeyAt, class IdAt>
  KOKKOS_INLINE_FUNCTION std::uint64_t choose_ties_at(member_type const& member,
                                                      Buffers const& b, int m,
                                                      State const& s, KeyAt const& key_at,
                                                      IdAt const& id_at) const {
    Key const thr = s.prefix;
    Key const mask = s.mask;
    std::uint64_t const rem = s.rem;
    if (member.team_size() == 1) {
      std::uint64_t nc = 0, eq = 0;
      for (int j = 0; j < m; ++j) {
        Key const key = key_at(static_cast<std::uint64_t>(j)) & mask;
        bool const pick = key > thr || (key == thr && eq++ < rem);
        if (pick) b.chosen(static_cast<int>(nc++)) = id_at(j);
      }
      return nc;
    }
    // (above thr so far) in the low half, (equal to it so far) in the high
    // half: a candidate's column is the first plus the second up to rem.
    // (A scan's increment must not depend on the prefix: a team scan adds
    // each index's increment before it knows the prefix.)
    std::uint64_t const totals = team_ordered_scan(
        member, runs(b), &b.shared(4), static_cast<std::uint64_t>(m),
        [&](std::uint64_t j, std::uint64_t& before, bool final) {
          Key const key = key_at(j) & mask;
          bool const above = key > thr;
          bool const equal = key == thr;
          if (final) {
            std::uint64_t const eq_before = before >> 32;
            if (above || (equal && eq_before < rem))
              b.chosen(static_cast<int>((before & 0xFFFFFFFFull) +
                                        (eq_before < rem ? eq_before : rem))) =
                  id_at(static_cast<int>(j));
          }
          before += (above ? 1ull : 0ull) + (equal ? (1ull << 32) : 0ull);
        });
    std::uint64_t const equal_total = totals >> 32;
    return (totals & 0xFFFFFFFFull) + (equal_total < rem ? equal_total : rem);
  }

  // How many of a[0, n) (ascending) are below v.
  KOKKOS_INLINE_FUNCTION static int lower(Scratch<std::int32_t> const& a, int n,
                                          std::int32_t v) {
    int lo = 0, hi = n;
    while (lo < hi) {
      int const mid = (lo + hi) / 2;
      if (a(mid) < v)
        lo = mid + 1;
      else
        hi = mid;
    }
    return lo;
  }

  KOKKOS_INLINE_FUNCTION void put(std::uint64_t t, SelectRequest const& req, int col,
                                  std::int32_t id) const {
    if (!Expand) {
      out(t, col) = id;
      put_key(t, col, id);
      return;
    }
    int const K = batch.kpool;
    int const selected = topk * K;
    std::int64_t const positions =
        static_cast<std::int64_t>(req.cache_length + (t - req.begin) + 1);
    for (int m = 0; m < K; ++m)
      out(t, col * K + m) = expanded_column(col * K + m, id, positions, K, selected);
  }

  // Merges sure[0, ns) and chosen[0, nc) into the row's columns, -1 after.
  KOKKOS_INLINE_FUNCTION void write(member_type const& member, Buffers const& b,
                                    std::uint64_t t, SelectRequest const& req, int ns,
                                    int nc) const {
    int const total = ns + nc;
    if (member.team_size() == 1) {
      int i = 0, j = 0;
      for (int col = 0; col < total; ++col) {
        bool const from_sure = j >= nc || (i < ns && b.sure(i) < b.chosen(j));
        put(t, req, col, from_sure ? b.sure(i++) : b.chosen(j++));
      }
    } else {
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, total), [&](int x) {
        if (x < ns) {
          std::int32_t const id = b.sure(x);
          put(t, req, x + lower(b.chosen, nc, id), id);
        } else {
          std::int32_t const id = b.chosen(x - ns);
          put(t, req, x - ns + lower(b.sure, ns, id), id);
        }
      });
    }
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, topk - total),
                         [&](int x) { put(t, req, total + x, -1); });
    if (Expand) {
      int const K = batch.kpool;
      int const selected = topk * K;
      std::int64_t const positions =
          static_cast<std::int64_t>(req.cache_length + (t - req.begin) + 1);
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, out_columns - selected),
                           [&](int x) {
                             out(t, selected + x) =
                                 expanded_column(selected + x, -1, positions, K, selected);
                           });
    }
  }
};

}  // namespace Details
}  // namespace KPool

// The members defined out of line: the host path, and a planned split
// row's finish. (Each includes this header first.)
#include <select/detail/KPool_TopkHost.hpp>
#include <select/detail/KPool_TopkSplit.hpp>

#endif
