#ifndef KPOOL_SELECT_DETAIL_TOPK_SPLIT_HPP
#define KPOOL_SELECT_DETAIL_TOPK_SPLIT_HPP

// Long rows (docs/indexer.md, "Top-k"): rows longer than the workspace's
// split length are split over teams in two launches before the selection
// (no team waits on another): per-segment counts of the first digit
// (SegmentHistFunctor), whose last team for a row (a ticket a row) makes
// the row's plan (SplitPlanner: the threshold digit and each segment's
// offsets into the row's lists); then the partition of each segment into
// those lists (SegmentPartitionFunctor); the selection launch
// (SelectFunctor, KPool_TopkTeam.hpp) then goes on from the row's
// candidates (split_finish, below), or, when they do not fit the row's
// region, reads the row whole from its summed counts.

#include <common/detail/KPool_KokkosExt.hpp>
#include <common/detail/KPool_Lanes.hpp>
#include <common/detail/KPool_Scoring.hpp>
#include <select/detail/KPool_TopkCore.hpp>
#include <select/detail/KPool_TopkTeam.hpp>

#include <cstddef>
#include <cstdint>

namespace KPool {
namespace Details {

// The plan of a split row (docs/indexer.md, "Top-k"), made by the team
// that counted the row's last segment (SegmentHistFunctor): the row's
// first digit from the sum of its segments' suffix counts; then, when its
// sure ids and the ids and keys in its threshold bin fit its region
// (split_lists_fit), each used segment's offsets into those lists, one
// team scan over the segments (a segment's sure keys are its suffix count
// above the digit, its candidates the count at it). Otherwise the plan
// says `fallback` and the selection launch takes the row whole.
template <class ExecutionSpace, class Key>
struct SplitPlanner {
  using Select = SelectFunctor<ExecutionSpace, Key, false, false>;
  using member_type = typename Select::member_type;
  using scratch_space = typename ExecutionSpace::scratch_memory_space;
  template <class V>
  using Scratch = typename Select::template Scratch<V>;
  static constexpr int bins = select_bins;

  std::uint32_t* plans = nullptr;  // [chunk rows][split_plan_words(segs)]
  int topk = 0;

  static std::size_t scratch_bytes() {
    return Scratch<std::uint32_t>::shmem_size(bins) + Scratch<std::uint64_t>::shmem_size(8);
  }

  // Row i (n visible pools, `used` segments of `segs`) from its counts
  // `cum`, with buffers from `scratch`.
  KOKKOS_INLINE_FUNCTION void plan_row(member_type const& member, scratch_space const& scratch,
                                       std::uint16_t const* cum, std::uint64_t i,
                                       std::uint64_t n, std::uint64_t used, int segs) const {
    std::uint32_t* const plan = plans + i * split_plan_words(segs);
    typename Select::Buffers b;
    b.hist = Scratch<std::uint32_t>(scratch, bins);
    b.shared = Scratch<std::uint64_t>(scratch, 8);
    Select::template merge_suffix_counts<4>(member, b, cum, used);
    std::uint64_t const k = n < static_cast<std::uint64_t>(topk) ? n : topk;
    std::uint64_t rem = k, count = 0, total = 0;
    int const d = Select::find_digit(member, b, bins, rem, count, total);
    bool const all = total <= k;
    bool const fits = all || split_lists_fit<Key>(k, count, segs);
    if (fits) {
      // (sure ids before g) in the low half, (candidates before g) in the
      // high half; the totals land at g = used.
      std::uint32_t* const sure_at = plan + SplitPlan::offsets;
      std::uint32_t* const cand_at = sure_at + segs + 1;
      Kokkos::parallel_scan(Kokkos::TeamThreadRange(member, static_cast<int>(used) + 1),
                            [&](int g, std::uint64_t& before, bool final) {
                              std::uint64_t up = 0, on = 0;
                              if (static_cast<std::uint64_t>(g) < used) {
                                std::uint16_t const* h = cum + static_cast<std::uint64_t>(g) * bins;
                                up = all ? h[0] : d + 1 < bins ? h[d + 1] : 0u;
                                on = all ? 0u : h[d] - up;
                              }
                              if (final) {
                                sure_at[g] = static_cast<std::uint32_t>(before & 0xFFFFFFFFull);
                                cand_at[g] = static_cast<std::uint32_t>(before >> 32);
                              }
                              before += up + (on << 32);
                            });
    }
    Kokkos::single(Kokkos::PerTeam(member), [&]() {
      plan[SplitPlan::state] =
          !fits ? SplitPlan::fallback : all ? SplitPlan::all : SplitPlan::threshold;
      plan[SplitPlan::digit] = static_cast<std::uint32_t>(d);
      plan[SplitPlan::rem] = static_cast<std::uint32_t>(rem);
      plan[SplitPlan::count] = static_cast<std::uint32_t>(count);
      // Keys in bins above the digit: k - rem of them.
      plan[SplitPlan::sure] = static_cast<std::uint32_t>(all ? total : k - rem);
    });
  }
};

// The first digit's suffix counts (nonzero keys) of one segment of a long
// row: out[d] is how many of its keys have a first digit of d or more, a
// 16-bit word (split_counts: a segment holds at most split_segment_max
// pools). Then the segment's team takes a ticket of its row (a word a row,
// zero between launches); the team whose ticket completes the row's used
// segments has every segment's counts before it, makes the row's plan
// (SplitPlanner) and puts the word back to zero. The plan used to be a
// launch of its own, a team a row: one launch gap more, and one round of
// teams that mostly found no long row.
//
// Memory order: team_ticket's (KPool_TopkCore.hpp), as the fused decode
// selection's groups. No team waits at its ticket. A launch that dies
// mid-way may leave a word set: SelectWorkspace::reset_counters puts the
// words back.
template <class ExecutionSpace, class Key>
struct SegmentHistFunctor {
  using member_type = typename KokkosExt::TeamPolicy<ExecutionSpace>::member_type;
  using scratch_space = typename ExecutionSpace::scratch_memory_space;
  using Scratch =
      Kokkos::View<std::uint32_t*, scratch_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  static constexpr int key_bits = 8 * static_cast<int>(sizeof(Key));
  static constexpr int top_shift = key_bits - select_digit_bits;

  SelectBatch batch;
  Key const* keys;           // [chunk rows * max_visible]
  std::uint32_t* seg_hist;   // [chunk rows][split_region_words(segs)]
  std::uint32_t* tickets;    // [chunk rows], zero between launches
  std::uint64_t split_from;
  std::uint64_t segment;
  int segs;
  SplitPlanner<ExecutionSpace, Key> planner;

  // A host's one-thread team counts through host_hist_copies histograms.
  // A team's histogram is followed by team_ordered_scan's words
  // (max_select_team + 1 of 64 bits), in a host's spare copies. The plan
  // takes the same scratch afterwards.
  static constexpr int copies = device_shapes<ExecutionSpace>::value ? 1 : host_hist_copies;
  static constexpr int team_words = select_bins + 2 * (max_select_team + 1);
  static constexpr int words = copies * select_bins > team_words ? copies * select_bins : team_words;
  static std::size_t scratch_bytes() {
    std::size_t const counts = Scratch::shmem_size(words);
    std::size_t const plan = SplitPlanner<ExecutionSpace, Key>::scratch_bytes();
    return counts > plan ? counts : plan;
  }

  KOKKOS_INLINE_FUNCTION void operator()(member_type const& member) const {
    check_select_team_size<ExecutionSpace>(member);  // the scans, the plan's included
    scratch_space const base = member.team_scratch(0);
    SplitSegment g;
    if (!g.find(batch, split_from, segment, segs, member.league_rank())) return;
    std::uint16_t* const cum = split_counts(seg_hist + g.i * split_region_words(segs));
    {
      // A copy: the views taken from a scratch space advance its own
      // position, and the plan below starts again from base.
      scratch_space const scratch = base;
      count(member, scratch, g, cum + static_cast<std::uint64_t>(g.seg) * select_bins);
    }
    std::uint64_t const used = (g.n + segment - 1) / segment;
    if (last_of_row(member, g.i, used)) {
      scratch_space const scratch = base;  // the counts' buffers are free
      planner.plan_row(member, scratch, cum, g.i, g.n, used, segs);
    }
  }

  KOKKOS_INLINE_FUNCTION void count(member_type const& member, scratch_space const& scratch,
                                    SplitSegment const& g, std::uint16_t* out) const {
    std::uint64_t const p0 = g.p0, p1 = g.p1;
    Key const* row = keys + g.i * batch.max_visible;
    Scratch hist(scratch, words);
    if constexpr (!device_shapes<ExecutionSpace>::value) {
      // A host's one-thread team: plain loops, every key counted, then
      // key 0 taken out of bin 0.
      if (member.team_size() == 1) {
        std::uint32_t* h = hist.data();
        h[0] -= host_first_digit_counts(h, row, p0, p1);
        std::uint32_t above = 0;
        for (int d = select_bins - 1; d >= 0; --d) {
          above += h[d];
          out[d] = static_cast<std::uint16_t>(above);
        }
        return;
      }
    }
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, select_bins),
                         [&](int d) { hist(d) = 0; });
    member.team_barrier();
    bool const alone = member.team_size() == 1;
    Kokkos::parallel_for(KokkosExt::team_range(member, 0, p1 - p0),
                         [&](std::int64_t j) {
                           Key const key = row[p0 + j];
                           if (key == key_not_visible) return;
                           int const d = static_cast<int>(key >> top_shift);
                           if (alone)
                             ++hist(d);
                           else
                             Kokkos::atomic_add(&hist(d), 1u);
                         });
    member.team_barrier();
    // Suffix counts: out[d] is the segment's keys in bins d and above. A
    // run of bins a thread and one team scan over the runs
    // (team_ordered_scan), not a Kokkos team scan over the bins, whose 2048
    // / team size chunks each pay a scan and its barriers.
    std::uint64_t* const runs = reinterpret_cast<std::uint64_t*>(hist.data() + select_bins);
    team_ordered_scan(member, runs, runs + max_select_team, select_bins,
                      [&](std::uint64_t j, std::uint64_t& above, bool final) {
                        int const d = select_bins - 1 - static_cast<int>(j);
                        std::uint32_t const c = hist(d);
                        if (final) out[d] = static_cast<std::uint16_t>(above + c);
                        above += c;
                      });
  }

  // Whether this team, having counted its segment of row i, is the last of
  // the row's `used` segments to finish (their counts are then all written
  // and visible to it). The last puts the row's word back to zero.
  KOKKOS_INLINE_FUNCTION bool last_of_row(member_type const& member, std::uint64_t i,
                                          std::uint64_t used) const {
    return team_ticket(member, &tickets[i], 1u, used, []() {});
  }
};

// The partition of one segment of a planned split row, one team a
// segment: its sure ids (keys above the first digit's threshold bin; with
// `all`, every nonzero key) and its candidates (the keys in the bin and
// their ids), in pool order, at its offsets into the row's lists, which
// its region holds from now on (split_region_words). An ordered team scan
// (team_ordered_scan); on a host's one-thread team, a loop without a branch a key.
template <class ExecutionSpace, class Key>
struct SegmentPartitionFunctor {
  using member_type = typename KokkosExt::TeamPolicy<ExecutionSpace>::member_type;
  static constexpr int key_bits = 8 * static_cast<int>(sizeof(Key));
  static constexpr int top_shift = key_bits - select_digit_bits;

  SelectBatch batch;
  Key const* keys;               // [chunk rows * max_visible]
  std::uint32_t* seg_hist;       // [chunk rows][split_region_words(segs)]
  std::uint32_t const* plans;    // [chunk rows][split_plan_words(segs)]
  std::uint64_t split_from;
  std::uint64_t segment;
  int segs;
  int topk;

  using Scratch = Kokkos::View<std::uint64_t*, typename ExecutionSpace::scratch_memory_space,
                               Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  // team_ordered_scan's words.
  static std::size_t scratch_bytes() { return Scratch::shmem_size(max_select_team + 1); }

  KOKKOS_INLINE_FUNCTION void operator()(member_type const& member) const {
    check_select_team_size<ExecutionSpace>(member);
    SplitSegment g;
    if (!g.find(batch, split_from, segment, segs, member.league_rank())) return;
    std::uint64_t const i = g.i, n = g.n, p0 = g.p0, p1 = g.p1;
    int const seg = g.seg;
    std::uint32_t const* plan = plans + i * split_plan_words(segs);
    std::uint32_t const state = plan[SplitPlan::state];
    if (state == SplitPlan::fallback) return;
    bool const all = state == SplitPlan::all;
    std::uint64_t const k = n < static_cast<std::uint64_t>(topk) ? n : topk;
    std::uint32_t const* sure_at = plan + SplitPlan::offsets + seg;
    std::uint32_t const* cand_at = sure_at + segs + 1;
    std::uint32_t* const list = seg_hist + i * split_region_words(segs);
    std::uint32_t* const sure = list + sure_at[0];
    std::uint32_t* const cand = list + k + cand_at[0];
    Key* const cand_keys =
        reinterpret_cast<Key*>(list + split_keys_at<Key>(k, plan[SplitPlan::count])) +
        cand_at[0];
    // Sure: above `top`; candidates: in [first, top] (none with `all`).
    Key const d = static_cast<Key>(plan[SplitPlan::digit]);
    Key const top = all ? Key(0) : static_cast<Key>(static_cast<Key>((d + 1) << top_shift) - 1);
    Key const lowest = static_cast<Key>(d << top_shift);
    Key const first = lowest > 1 ? lowest : Key(1);
    Key const span = all ? Key(0) : static_cast<Key>(top - first);
    Key const* row = keys + i * batch.max_visible;
    if constexpr (!device_shapes<ExecutionSpace>::value) {
      if (member.team_size() == 1) {
        // Blocks of keys: the masks of the sure keys and of the
        // candidates, then a store for each set bit only.
        std::uint32_t const on_mask = all ? 0u : ~0u;
        std::uint64_t ns = 0, nc = 0, p = p0;
        for (; p + host_block <= p1; p += host_block) {
          Key const* const block = row + p;
          std::uint32_t ms, mc;
          host_block_masks(block, top, first, span, ms, mc);
          mc &= on_mask;
          for (; ms != 0; ms &= ms - 1)
            sure[ns++] = static_cast<std::uint32_t>(p + KokkosExt::lowest_set_bit(ms));
          for (; mc != 0; mc &= mc - 1) {
            int const c = KokkosExt::lowest_set_bit(mc);
            cand[nc] = static_cast<std::uint32_t>(p + c);
            cand_keys[nc++] = block[c];
          }
        }
        for (; p < p1; ++p) {
          Key const key = row[p];
          if (key > top) {
            sure[ns++] = static_cast<std::uint32_t>(p);
          } else if (!all && static_cast<Key>(key - first) <= span) {
            cand[nc] = static_cast<std::uint32_t>(p);
            cand_keys[nc++] = key;
          }
        }
        return;
      }
    }
    Scratch runs(member.team_scratch(0), max_select_team + 1);
    team_ordered_scan(member, runs.data(), runs.data() + max_select_team, p1 - p0,
                      [&](std::uint64_t j, std::uint64_t& before, bool final) {
                        std::uint64_t const p = p0 + j;
                        Key const key = row[p];
                        bool const above = key > top;
                        bool const on = !all && static_cast<Key>(key - first) <= span;
                        if (final) {
                          if (above) sure[before & 0xFFFFFFFFull] = static_cast<std::uint32_t>(p);
                          if (on) {
                            cand[before >> 32] = static_cast<std::uint32_t>(p);
                            cand_keys[before >> 32] = key;
                          }
                        }
                        before += (above ? 1ull : 0ull) + (on ? (1ull << 32) : 0ull);
                      });
  }
};

// A planned split row: its sure ids, then (threshold) the remaining
// digits over its candidates' keys and the tie rule over them; merged
// and written as any row. It does not read the row.
template <class ExecutionSpace, class Key, bool Expand, bool Staged>
KOKKOS_INLINE_FUNCTION void SelectFunctor<ExecutionSpace, Key, Expand, Staged>::split_finish(
    member_type const& member, Buffers const& b, std::uint64_t t, SelectRequest const& req,
    std::uint64_t i, std::uint64_t n) const {
  std::uint32_t const* plan = plans + i * split_plan_words(segs);
  std::uint32_t* const list = seg_hist + i * split_region_words(segs);
  std::uint64_t const k = n < static_cast<std::uint64_t>(topk) ? n : topk;
  int const ns = static_cast<int>(plan[SplitPlan::sure]);
  Kokkos::parallel_for(Kokkos::TeamThreadRange(member, ns), [&](int j) {
    b.sure(j) = static_cast<std::int32_t>(list[j]);
  });
  std::uint64_t n_chosen = 0;
  if (plan[SplitPlan::state] == SplitPlan::threshold) {
    State s = State::start(k);
    s.rem = plan[SplitPlan::rem];
    std::uint64_t count = plan[SplitPlan::count];
    int const first_shift = key_bits - select_digit_bits;
    advance(s, static_cast<int>(plan[SplitPlan::digit]), first_shift, select_digit_bits,
            count);
    std::uint32_t* const ids = list + k;
    Key* const ckeys = reinterpret_cast<Key*>(list + split_keys_at<Key>(k, count));
    int const m = static_cast<int>(count);
    if constexpr (!device_shapes<ExecutionSpace>::value) {
      if (member.team_size() == 1) {
        Key lo = s.prefix > 1 ? s.prefix : Key(1);
        Key hi = static_cast<Key>(s.prefix | static_cast<Key>(~s.mask));
        n_chosen = host_list_tail(
            b, [&](int j) { return static_cast<std::int32_t>(ids[j]); },
            [&](std::uint64_t j) { return ckeys[j]; },
            [&](int c, std::int32_t id, Key key) {
              ids[c] = static_cast<std::uint32_t>(id);
              ckeys[c] = key;
            },
            m, s, lo, hi);
        write(member, b, t, req, ns, static_cast<int>(n_chosen));
        return;
      }
    }
    auto key_at = [&](std::uint64_t j) { return ckeys[j]; };
    while (!s.resolved) {
      int const bits = s.shift < select_digit_bits ? s.shift : select_digit_bits;
      int const shift = s.shift - bits;
      hist_pass(member, b, key_at, m, s, shift, bits);
      std::uint64_t total = 0;
      int const d = find_digit(member, b, 1 << bits, s.rem, count, total);
      advance(s, d, shift, bits, count);
    }
    n_chosen = choose_ties_at(member, b, m, s, key_at,
                              [&](int j) { return static_cast<std::int32_t>(ids[j]); });
  }
  member.team_barrier();
  write(member, b, t, req, ns, static_cast<int>(n_chosen));
}

// A split row's first histogram: the sum of its segments' (each bin the
// difference of two suffix counts).
template <class ExecutionSpace, class Key, bool Expand, bool Staged>
KOKKOS_INLINE_FUNCTION void SelectFunctor<ExecutionSpace, Key, Expand, Staged>::merge_segments(
    member_type const& member, Buffers const& b, std::uint64_t i, std::uint64_t n) const {
  merge_suffix_counts<1>(member, b, split_counts(seg_hist + i * split_region_words(segs)),
                         (n + segment - 1) / segment);
}

// The sum of `used` segments' suffix counts cum[g * bins + d] (16-bit
// words) into hist (32-bit: at most 2^32 - 1 keys a row). A team: each
// thread sums octets of 8 consecutive bins over all segments, a 16-byte
// load a segment (every segment's counts start 16-byte aligned: the region
// is a View's, at multiples of split_region_words(segs) words, and a
// segment's counts are bins 16-bit words, 4 KiB), Ways segments at a time
// into their own sums, so that a thread's loads are independent and many
// are in flight (the plan, Ways = 4: at 2^20 pools, 256 threads busy, 64
// loads each, of 8 bins; half the bytes of 32-bit counts). The
// selection's fallback (merge_segments, a row whose lists did not fit)
// takes Ways = 1: its 8 sums instead of 32 keep the selection kernel's
// registers, and so its teams an SM, those of its usual path. Sums of
// suffix counts are suffix counts: each bin is then the difference of its
// neighbours' (bin d's sum minus bin d + 1's), taken in scratch, not by
// reading cum[d + 1] again.
template <class ExecutionSpace, class Key, bool Expand, bool Staged>
template <int Ways>
KOKKOS_INLINE_FUNCTION void SelectFunctor<ExecutionSpace, Key, Expand, Staged>::merge_suffix_counts(
    member_type const& member, Buffers const& b, std::uint16_t const* cum,
    std::uint64_t used) {
  if (member.team_size() == 1) {
    // Segment by segment, in memory order.
    std::uint32_t* const h = b.hist.data();
    for (int d = 0; d < bins; ++d) h[d] = 0;
    for (std::uint64_t g = 0; g < used; ++g)
      for (int d = 0; d < bins; ++d) h[d] += cum[g * bins + d];
    for (int d = 0; d + 1 < bins; ++d) h[d] -= h[d + 1];
    return;
  }
  constexpr int lanes = 8;  // 16-bit counts a 16-byte load
  constexpr int octets = bins / lanes;
  Kokkos::parallel_for(Kokkos::TeamThreadRange(member, octets), [&](int q) {
    std::uint16_t const* const at = cum + lanes * q;
    std::uint32_t s[Ways][lanes] = {};
    std::uint64_t g = 0;
    for (; g + Ways <= used; g += Ways)
      for (int u = 0; u < Ways; ++u) {
        Packet<std::uint16_t, lanes> const v = load_packet<lanes>(at + (g + u) * bins);
        for (int c = 0; c < lanes; ++c) s[u][c] += v.v[c];
      }
    for (; g < used; ++g) {
      Packet<std::uint16_t, lanes> const v = load_packet<lanes>(at + g * bins);
      for (int c = 0; c < lanes; ++c) s[0][c] += v.v[c];
    }
    for (int c = 0; c < lanes; ++c) {
      std::uint32_t sum = 0;
      for (int u = 0; u < Ways; ++u) sum += s[u][c];
      b.hist(lanes * q + c) = sum;
    }
  });
  member.team_barrier();
  // The differences, a team size of octets at a time: each thread reads
  // its octet's sums and the next octet's first into registers, the team
  // waits, then writes (the octet below reads this octet's first sum).
  int const team = member.team_size();
  for (int q0 = 0; q0 < octets; q0 += team) {
    int const q = q0 + member.team_rank();
    std::uint32_t h[lanes + 1] = {};
    if (q < octets)
      for (int c = 0; c <= lanes; ++c) h[c] = lanes * q + c < bins ? b.hist(lanes * q + c) : 0u;
    member.team_barrier();
    if (q < octets)
      for (int c = 0; c < lanes; ++c) b.hist(lanes * q + c) = h[c] - h[c + 1];
  }
  member.team_barrier();
}

}  // namespace Details
}  // namespace KPool

#endif
