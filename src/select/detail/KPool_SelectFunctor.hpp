#ifndef KPOOL_DETAILS_SELECT_FUNCTOR_HPP
#define KPOOL_DETAILS_SELECT_FUNCTOR_HPP

// The selection (docs/indexer.md, "Selection"): one team per query row finds
// the row's top-k pools among its visible ones from their keys. Key 0 (not
// visible) is never selected; when no more than k keys are nonzero, all of
// them are. Otherwise the k-th largest key `thr` and `take`, how many keys
// equal to it are selected (the lowest ids: the tie rule), are found by a
// radix select, 11 key bits a digit from the top:
//   1. row passes: a histogram of the digit over the row's keys that match
//      the prefix found so far (built in parallel with team atomics, or
//      plainly by a one-thread team), scanned from the top bin in parallel
//      (a team scan) to find the threshold digit; repeated only while the
//      threshold bin holds more keys than the candidate buffer (`cap`,
//      up to candidate_capacity, as much as fast scratch allows);
//   2. one ordered partition pass over the row (a team scan in id order):
//      keys above the prefix go to the `sure` list, ascending; keys on the
//      prefix are compacted into the candidate buffer, ascending (or, once
//      the prefix is a whole key, the first `rem` of them go straight to
//      the `chosen` list: the tie rule);
//   3. candidate passes: the remaining digits over the candidates only,
//      then one ordered scan over them applies the tie rule into `chosen`;
//   4. the two ascending lists are merged (each id's column is its index
//      plus how many ids of the other list are lower) and written, with
//      -1 after them.
// A pass stops early once the threshold bin holds exactly the keys still
// to take. The row is read from global memory once per row pass and once
// for the partition; a Staged kernel copies it into team scratch on the
// first read, when the launch knows every row fits. Rows longer than the
// workspace's split length are split over teams in three launches before
// (no inter-team barrier): per-segment counts of the first digit
// (SegmentHistFunctor), a plan a row (SplitPlanFunctor: the threshold
// digit and each segment's offsets into the row's lists), the partition of
// each segment into those lists (SegmentPartitionFunctor); the selection
// launch then goes on from the row's candidates (split_finish), or, when
// they do not fit the row's region, reads the row whole from its summed
// counts. Counts are exact integers, so the
// selection is the same whatever the team size or backend, and it is the
// set the sorted ranking gives. Expand (select_tokens) writes the expanded
// token row instead (expanded_column).
// Team scratch holds the histogram, 2 * topk ids and the candidates, so it
// grows with topk. A device never takes level-1 scratch (on CUDA it
// allocates and fences, and breaks graph capture): when the buffers do not
// fit level 0 (topk past about 3900 in 40 KB, 4900 in 48 KB), launch_select takes
// SelectWideFunctor below instead, whose scratch is the same for every
// topk. The loops over a row's pools are 64-bit (KokkosExt::team_range).
// The team scans need a power-of-two team size on CUDA before Kokkos 3.7:
// launch_select rounds it, and a device-shapes build on a host checks it.
// A host's one-thread teams (no device shapes) take host_select: the same
// states, sequential, with ranges narrowing the digits, branchless
// compaction, and a split row's candidate ids in its region.

#include <common/detail/KPool_KokkosExt.hpp>
#include <common/detail/KPool_Strided.hpp>
#include <score/detail/KPool_Scoring.hpp>
#include <select/detail/KPool_ExpandTopkFunctor.hpp>

#include <cstdint>

namespace KPool {
namespace Details {

// The digit width of the radix select, and how many candidates a team
// compacts into scratch.
constexpr int select_digit_bits = 11;
constexpr int select_bins = 1 << select_digit_bits;
constexpr int candidate_capacity = 1024;

// Where long rows split (docs/indexer.md, "Selection"): rows of more than
// `from` visible pools are split over teams, `segment` pools a team. Read when a SelectWorkspace is built (tests
// lower it so that small rows take the split path).
struct SelectSplit {
  std::uint64_t from = std::uint64_t(1) << 16;
  std::uint64_t segment = std::uint64_t(1) << 14;
};
inline SelectSplit& select_split_knob() {
  static SelectSplit s;
  return s;
}

// The selection's team scans need a power-of-two team size on CUDA before
// Kokkos 3.7; launch_select rounds it, and a device-shapes build on a host
// checks it here. (Not on a GPU: the abort's message buffer would cost
// every selection kernel a local-memory stack frame.)
template <class ExecutionSpace, class Member>
KOKKOS_INLINE_FUNCTION void check_select_team_size(Member const& member) {
  if constexpr (device_shapes<ExecutionSpace>::value &&
                !KokkosExt::is_device_backend<ExecutionSpace>::value) {
    int const ts = member.team_size();
    if ((ts & (ts - 1)) != 0)
      Kokkos::abort("KPool: the selection's team scan needs a power-of-two team size");
  }
}

// A split row's plan (SplitPlanFunctor), split_plan_words(segs) words:
// what the row takes, its first digit, what is left to take in that
// digit's bin, the bin's keys, the sure ids, then each used segment's
// offsets into the row's sure list and its candidate list (exclusive
// sums, the totals after the last used segment).
namespace SplitPlan {
enum : std::uint32_t { fallback = 0, threshold = 1, all = 2 };
constexpr int state = 0, digit = 1, rem = 2, count = 3, sure = 4, offsets = 8;
}  // namespace SplitPlan
KOKKOS_INLINE_FUNCTION constexpr std::size_t split_plan_words(std::size_t segs) {
  return SplitPlan::offsets + 2 * (segs + 1);
}

// A split row's region of the segment buffer, in 32-bit words: its
// segments' suffix counts (segs * bins), then room for as much again. Once
// planned, it holds the row's sure ids at [0, sure), its candidates' ids
// at [k, k + count) and their keys from split_keys_at(k, count) on.
KOKKOS_INLINE_FUNCTION constexpr std::size_t split_region_words(std::size_t segs) {
  return 2 * segs * static_cast<std::size_t>(select_bins);
}
template <class Key>
KOKKOS_INLINE_FUNCTION constexpr std::uint64_t split_keys_at(std::uint64_t k,
                                                             std::uint64_t count) {
  return (k + count + sizeof(Key) / 4 - 1) / (sizeof(Key) / 4) * (sizeof(Key) / 4);
}
template <class Key>
KOKKOS_INLINE_FUNCTION constexpr bool split_lists_fit(std::uint64_t k, std::uint64_t count,
                                                      std::size_t segs) {
  return split_keys_at<Key>(k, count) + count * (sizeof(Key) / 4) <= split_region_words(segs);
}

// A host's partition masks of a block of host_block keys: bit c of
// `above` when block[c] > top, of `on` when block[c] lies in [first,
// first + span]; loops the compiler vectorizes, so that the partition then
// stores only the selected ids (a store for every key, kept or not by a
// count, costs several times a key's compare on a host).
constexpr int host_block = 32;
template <class Key>
KOKKOS_INLINE_FUNCTION void host_block_masks(Key const* block, Key top, Key first, Key span,
                                             std::uint32_t& above, std::uint32_t& on) {
  above = 0;
  on = 0;
  for (int c = 0; c < host_block; ++c) {
    Key const key = block[c];
    above |= static_cast<std::uint32_t>(key > top) << c;
    on |= static_cast<std::uint32_t>(static_cast<Key>(key - first) <= span) << c;
  }
}

// The segment a segment team has (its league rank): chunk row i, segment
// seg of its n visible pools, pools [p0, p1). find is false when the row
// is not split or the segment lies past its pools.
struct SplitSegment {
  std::uint64_t i, n, p0, p1;
  int seg;
  KOKKOS_INLINE_FUNCTION bool find(SelectBatch const& batch, std::uint64_t split_from,
                                   std::uint64_t segment, int segs, int rank) {
    i = static_cast<std::uint64_t>(rank / segs);
    seg = rank % segs;
    std::uint64_t const t = batch.row_begin + i;
    SelectRequest req;
    if (t >= batch.row_end || batch.owner(t, req) < 0) return false;
    n = batch.visible(req, t);
    p0 = static_cast<std::uint64_t>(seg) * segment;
    if (n <= split_from || p0 >= n) return false;
    p1 = p0 + segment < n ? p0 + segment : n;
    return true;
  }
};

// A host's count of the first digits of keys[p0, p1) into h[0, bins)
// (key 0 in bin 0), through host_hist_copies histograms in turn (h holds
// host_hist_copies * bins words), so that a run of keys in one bin does
// not wait on its own increments. Returns how many keys are 0.
constexpr int host_hist_copies = 4;
template <class Key>
KOKKOS_INLINE_FUNCTION std::uint32_t host_first_digit_counts(std::uint32_t* h,
                                                             Key const* keys,
                                                             std::uint64_t p0,
                                                             std::uint64_t p1) {
  constexpr int shift = 8 * static_cast<int>(sizeof(Key)) - select_digit_bits;
  constexpr int copies = host_hist_copies;
  for (int d = 0; d < copies * select_bins; ++d) h[d] = 0;
  std::uint32_t zeros = 0;
  std::uint64_t p = p0;
  for (; p + copies <= p1; p += copies)
    for (int c = 0; c < copies; ++c) {
      Key const key = keys[p + c];
      ++h[c * select_bins + static_cast<int>(key >> shift)];
      zeros += key == key_not_visible ? 1u : 0u;
    }
  for (; p < p1; ++p) {
    Key const key = keys[p];
    ++h[static_cast<int>(key >> shift)];
    zeros += key == key_not_visible ? 1u : 0u;
  }
  for (int c = 1; c < copies; ++c)
    for (int d = 0; d < select_bins; ++d) h[d] += h[c * select_bins + d];
  return zeros;
}

// The first digit's suffix counts (nonzero keys) of one segment of a long
// row: out[d] is how many of its keys have a first digit of d or more.
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
  std::uint64_t split_from;
  std::uint64_t segment;
  int segs;

  // A host's one-thread team counts through host_hist_copies histograms.
  static constexpr int copies = device_shapes<ExecutionSpace>::value ? 1 : host_hist_copies;
  static std::size_t scratch_bytes() { return Scratch::shmem_size(copies * select_bins); }

  KOKKOS_INLINE_FUNCTION void operator()(member_type const& member) const {
    SplitSegment g;
    if (!g.find(batch, split_from, segment, segs, member.league_rank())) return;
    std::uint64_t const i = g.i, p0 = g.p0, p1 = g.p1;
    int const seg = g.seg;
    Key const* row = keys + i * batch.max_visible;
    Scratch hist(member.team_scratch(0), copies * select_bins);
    std::uint32_t* out = seg_hist + i * split_region_words(segs) + seg * select_bins;
    if constexpr (!device_shapes<ExecutionSpace>::value) {
      // A host's one-thread team: plain loops, every key counted, then
      // key 0 taken out of bin 0.
      if (member.team_size() == 1) {
        std::uint32_t* h = hist.data();
        h[0] -= host_first_digit_counts(h, row, p0, p1);
        std::uint32_t above = 0;
        for (int d = select_bins - 1; d >= 0; --d) out[d] = above += h[d];
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
    // Suffix counts: out[d] is the segment's keys in bins d and above.
    Kokkos::parallel_scan(Kokkos::TeamThreadRange(member, select_bins),
                          [&](int j, std::uint32_t& above, bool final) {
                            int const d = select_bins - 1 - j;
                            std::uint32_t const c = hist(d);
                            if (final) out[d] = above + c;
                            above += c;
                          });
  }
};

// Level-0 team scratch always. Staged: every row fits team scratch next to
// the buffers and is copied there on its first read.
template <class ExecutionSpace, class Key, bool Expand, bool Staged = false>
struct SelectFunctor {
  using memory_space = typename ExecutionSpace::memory_space;
  using member_type =
      typename KokkosExt::TeamPolicy<ExecutionSpace>::member_type;
  using scratch_space = typename ExecutionSpace::scratch_memory_space;
  template <class V>
  using Scratch =
      Kokkos::View<V*, scratch_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

  static constexpr int bins = select_bins;
  static constexpr int key_bits = 8 * static_cast<int>(sizeof(Key));

  SelectBatch batch;
  Key const* keys;  // [chunk rows * max_visible]
  // pool_ids [T, topk], or with Expand the token rows [T, topk * K + K - 1].
  Strided<std::int32_t, 2> out;
  int out_columns;
  int topk;
  int segs;  // segments a split row's histograms hold (0: no split rows)
  std::uint64_t split_from;
  std::uint64_t segment;  // pools a segment of a split row
  // [chunk rows][split_region_words(segs)], the segments' suffix counts;
  // once planned, a split row's sure ids and candidates
  // (SegmentPartitionFunctor), or on a host its candidate buffer once
  // summed (host_select).
  std::uint32_t* seg_hist;
  std::uint32_t const* plans;  // [chunk rows][split_plan_words(segs)]

  int cap;  // candidates the buffer holds

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
    check_select_team_size<ExecutionSpace>(member);
    std::uint64_t const i = member.league_rank();
    std::uint64_t const t = batch.row_begin + i;
    SelectRequest req;
    if (t >= batch.row_end || batch.owner(t, req) < 0) return;
    std::uint64_t const n = batch.visible(req, t);
    Key const* row = keys + i * batch.max_visible;
    bool const split = segs > 0 && n > split_from;

    Buffers b;
    b.hist = Scratch<std::uint32_t>(member.team_scratch(0), bins);
    b.shared = Scratch<std::uint64_t>(member.team_scratch(0), 8);
    b.sure = Scratch<std::int32_t>(member.team_scratch(0), topk);
    b.chosen = Scratch<std::int32_t>(member.team_scratch(0), topk);
    b.cand_ids = Scratch<std::int32_t>(member.team_scratch(0), cap);
    b.cand_keys = Scratch<Key>(member.team_scratch(0), cap);
    if (Staged)
      b.row = Scratch<Key>(member.team_scratch(0), split ? 0 : n);
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
  // and written as any row. It does not read the row.
  KOKKOS_INLINE_FUNCTION void split_finish(member_type const& member, Buffers const& b,
                                           std::uint64_t t, SelectRequest const& req,
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

  // ---------------------------------------------------------------- host
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

  // Extends the prefix by the bits that every key on it within [lo, hi]
  // shares (all of them: the prefix becomes a whole key, resolved).
  KOKKOS_INLINE_FUNCTION static void narrow(State& s, Key lo, Key hi) {
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
  KOKKOS_INLINE_FUNCTION static void on_prefix(State const& s, Key lo, Key hi, Key& a,
                                               Key& span) {
    Key const top = s.prefix | static_cast<Key>(~s.mask);
    a = lo > s.prefix ? lo : s.prefix;
    if (a == key_not_visible) a = 1;
    Key const z = hi < top ? hi : top;
    span = z >= a ? static_cast<Key>(z - a) : Key(0);
  }

  // The threshold bin among hist[dlo, dhi], scanned from the top: the
  // state takes its digit and `count` its keys; false when the bins hold
  // fewer than rem keys.
  KOKKOS_INLINE_FUNCTION static bool host_scan(Buffers const& b, int dlo, int dhi,
                                               int shift, int bits, State& s,
                                               std::uint64_t& count) {
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
  template <class KeyOf>
  KOKKOS_INLINE_FUNCTION static void host_digit(Buffers const& b, KeyOf const& key_of,
                                                std::uint64_t m, State& s, Key lo, Key hi,
                                                std::uint64_t& count,
                                                int digit_bits = select_digit_bits) {
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
  template <class IdOf, class KeyOf, class Put>
  KOKKOS_INLINE_FUNCTION static int host_keep(IdOf const& id_of, KeyOf const& key_of,
                                              Put const& put, int m, State const& s,
                                              Key& lo, Key& hi) {
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

  KOKKOS_INLINE_FUNCTION void host_select(member_type const& member, Buffers const& b,
                                          std::uint64_t t, SelectRequest const& req,
                                          std::uint64_t i, Key const* row, std::uint64_t n,
                                          bool split) const {
    std::uint64_t const k = n < static_cast<std::uint64_t>(topk) ? n : topk;
    State s = State::start(k);
    bool all = n <= static_cast<std::uint64_t>(topk);
    Key lo = 1, hi = static_cast<Key>(~Key(0));  // the nonzero keys' range
    std::uint64_t count = 0;
    std::uint32_t* h = b.hist.data();
    // A split row's region: its segments' suffix counts, [segs][bins].
    std::uint32_t* const big = split ? seg_hist + i * split_region_words(segs) : nullptr;
    std::uint64_t const big_cap = split ? static_cast<std::uint64_t>(segs) * bins : 0;
    if (!all) {
      int const shift = key_bits - select_digit_bits;
      int dhi = bins - 1;
      if (split) {
        // The segments' suffix counts, summed, then differenced.
        std::uint64_t const used = (n + segment - 1) / segment;
        for (int d = 0; d < bins; ++d) h[d] = big[d];
        for (std::uint64_t g = 1; g < used; ++g) {
          std::uint32_t const* src = big + g * bins;
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
      int m = static_cast<int>(nc);
      lo = clo;
      hi = chi;
      narrow(s, lo, hi);
      if (to_big) {
        n_chosen = host_list_tail(
            b, [&](int j) { return static_cast<std::int32_t>(big[j]); },
            [&](std::uint64_t j) { return row[big[j]]; },
            [&](int c, std::int32_t id, Key) { big[c] = static_cast<std::uint32_t>(id); }, m,
            s, lo, hi);
      } else {
        auto cand_id = [&](int j) { return b.cand_ids(j); };
        auto cand_key = [&](std::uint64_t j) { return b.cand_keys(static_cast<int>(j)); };
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
        n_chosen = choose_ties(member, b, m, s);
      }
    }
    write(member, b, t, req, static_cast<int>(ns), static_cast<int>(n_chosen));
  }

  // The remaining digits over the m candidates in global memory (ids
  // id_at(j) ascending, keys key_at(j) in [lo, hi]), compacted through
  // put(c, id, key) after each; then the tie rule over them into chosen.
  // Returns how many are chosen.
  template <class IdAt, class KeyAt, class Put>
  KOKKOS_INLINE_FUNCTION static std::uint64_t host_list_tail(Buffers const& b,
                                                             IdAt const& id_at,
                                                             KeyAt const& key_at,
                                                             Put const& put, int m, State& s,
                                                             Key lo, Key hi) {
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
  // difference of two suffix counts).
  KOKKOS_INLINE_FUNCTION void merge_segments(member_type const& member, Buffers const& b,
                                             std::uint64_t i, std::uint64_t n) const {
    merge_suffix_counts(member, b, seg_hist + i * split_region_words(segs),
                        (n + segment - 1) / segment);
  }
  KOKKOS_INLINE_FUNCTION static void merge_suffix_counts(member_type const& member,
                                                         Buffers const& b,
                                                         std::uint32_t const* cum,
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
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, bins), [&](int d) {
      std::uint32_t sum = 0;
      for (std::uint64_t g = 0; g < used; ++g)
        sum += cum[g * bins + d] - (d + 1 < bins ? cum[g * bins + d + 1] : 0u);
      b.hist(d) = sum;
    });
    member.team_barrier();
  }

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
    Kokkos::parallel_scan(Kokkos::TeamThreadRange(member, nb),
                          [&](int j, std::uint64_t& above, bool final) {
                            int const d = nb - 1 - j;
                            std::uint64_t const h = b.hist(d);
                            if (final) {
                              if (above < want && above + h >= want) {
                                b.shared(0) = static_cast<std::uint64_t>(d);
                                b.shared(1) = want - above;
                                b.shared(2) = h;
                              }
                              if (j == nb - 1) b.shared(3) = above + h;
                            }
                            above += h;
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
    reset_total(member, b);
    std::int64_t const last = static_cast<std::int64_t>(n) - 1;
    Kokkos::parallel_scan(
        KokkosExt::team_range(member, 0, n),
        [&](std::int64_t p, std::uint64_t& before, bool final) {
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
          if (final && p == last) b.shared(4) = before;
        });
    std::uint64_t const totals = read_total(member, b);
    n_sure = totals & 0xFFFFFFFFull;
    n_cand = totals >> 32;
  }

  // A team scan's total, written by the thread of its last index.
  KOKKOS_INLINE_FUNCTION static void reset_total(member_type const& member,
                                                 Buffers const& b) {
    Kokkos::single(Kokkos::PerTeam(member), [&]() { b.shared(4) = 0; });
    member.team_barrier();
  }
  KOKKOS_INLINE_FUNCTION static std::uint64_t read_total(member_type const& member,
                                                         Buffers const& b) {
    member.team_barrier();
    std::uint64_t const total = b.shared(4);
    member.team_barrier();
    return total;
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
    reset_total(member, b);
    Kokkos::parallel_scan(
        Kokkos::TeamThreadRange(member, m),
        [&](int j, std::uint64_t& before, bool final) {
          Key const key = key_at(static_cast<std::uint64_t>(j)) & mask;
          bool const above = key > thr;
          bool const equal = key == thr;
          std::uint64_t const eq_before = before >> 32;
          bool const pick = above || (equal && eq_before < rem);
          if (final && pick) b.chosen(static_cast<int>(before & 0xFFFFFFFFull)) = id_at(j);
          before += (pick ? 1ull : 0ull) + (equal ? (1ull << 32) : 0ull);
          if (final && j == m - 1) b.shared(4) = before;
        });
    return read_total(member, b) & 0xFFFFFFFFull;
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

// The plan of each split row (docs/indexer.md, "Top-k"), one team a row,
// between the segments' counts and their partition: the row's first digit
// from the sum of its segments' suffix counts; then, when its sure ids and
// the ids and keys in its threshold bin fit its region (split_lists_fit),
// each used segment's offsets into those lists,
// one team scan over the segments (a segment's sure keys are its suffix
// count above the digit, its candidates the count at it). Otherwise the
// plan says `fallback` and the selection launch takes the row whole.
template <class ExecutionSpace, class Key>
struct SplitPlanFunctor {
  using Select = SelectFunctor<ExecutionSpace, Key, false, false>;
  using member_type = typename Select::member_type;
  template <class V>
  using Scratch = typename Select::template Scratch<V>;
  static constexpr int bins = select_bins;

  SelectBatch batch;
  std::uint32_t const* seg_hist;  // [chunk rows][split_region_words(segs)]
  std::uint32_t* plans;           // [chunk rows][split_plan_words(segs)]
  std::uint64_t split_from;
  std::uint64_t segment;
  int segs;
  int topk;

  static std::size_t scratch_bytes() {
    return Scratch<std::uint32_t>::shmem_size(bins) + Scratch<std::uint64_t>::shmem_size(8);
  }

  KOKKOS_INLINE_FUNCTION void operator()(member_type const& member) const {
    check_select_team_size<ExecutionSpace>(member);
    std::uint64_t const i = member.league_rank();
    std::uint64_t const t = batch.row_begin + i;
    SelectRequest req;
    if (t >= batch.row_end || batch.owner(t, req) < 0) return;
    std::uint64_t const n = batch.visible(req, t);
    if (n <= split_from) return;
    std::uint64_t const used = (n + segment - 1) / segment;
    std::uint32_t const* cum = seg_hist + i * split_region_words(segs);
    std::uint32_t* const plan = plans + i * split_plan_words(segs);
    typename Select::Buffers b;
    b.hist = Scratch<std::uint32_t>(member.team_scratch(0), bins);
    b.shared = Scratch<std::uint64_t>(member.team_scratch(0), 8);
    Select::merge_suffix_counts(member, b, cum, used);
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
                                std::uint32_t const* h = cum + static_cast<std::uint64_t>(g) * bins;
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

// The partition of one segment of a planned split row, one team a
// segment: its sure ids (keys above the first digit's threshold bin; with
// `all`, every nonzero key) and its candidates (the keys in the bin and
// their ids), in pool order, at its offsets into the row's lists, which
// its region holds from now on (split_region_words). A team scan in pool
// order; on a host's one-thread team, a loop without a branch a key.
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
    Kokkos::parallel_scan(KokkosExt::team_range(member, 0, p1 - p0),
                          [&](std::int64_t j, std::uint64_t& before, bool final) {
                            std::uint64_t const p = p0 + static_cast<std::uint64_t>(j);
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

// The selection for any topk in level-0 scratch (a 256-bin histogram and
// two keys): a radix select of 8 key bits a pass from the top, each pass
// over the whole row, finds the k-th largest key `thr` and `take`, how
// many keys equal to it are selected; then one team scan over the pools in
// id order gives each selected pool its column (the selected pools before
// it), so the ids come out ascending with no sort. Expand writes the token
// row's -1s and tail columns first, then each selected pool's K positions
// at its column. Slower than SelectFunctor (four reads of the row), it is
// what a topk whose buffers do not fit level 0 takes.
template <class ExecutionSpace, class Key, bool Expand>
struct SelectWideFunctor {
  using memory_space = typename ExecutionSpace::memory_space;
  using member_type =
      typename KokkosExt::TeamPolicy<ExecutionSpace>::member_type;
  using scratch_space = typename ExecutionSpace::scratch_memory_space;
  template <class V>
  using Scratch =
      Kokkos::View<V*, scratch_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

  static constexpr int digit_bits = 8;
  static constexpr int bins = 1 << digit_bits;
  static constexpr int key_bits = 8 * static_cast<int>(sizeof(Key));

  SelectBatch batch;
  Key const* keys;  // [chunk rows * max_visible]
  // pool_ids [T, topk], or with Expand the token rows [T, topk * K + K - 1].
  Strided<std::int32_t, 2> out;
  int out_columns;
  int topk;

  // Level-0 team scratch, the same for every topk.
  static std::size_t scratch_bytes() {
    return Scratch<std::uint32_t>::shmem_size(bins) + Scratch<Key>::shmem_size(2);
  }

  KOKKOS_INLINE_FUNCTION void operator()(member_type const& member) const {
    check_select_team_size<ExecutionSpace>(member);
    std::uint64_t const i = member.league_rank();
    std::uint64_t const t = batch.row_begin + i;
    SelectRequest req;
    if (t >= batch.row_end || batch.owner(t, req) < 0) return;
    Scratch<std::uint32_t> hist(member.team_scratch(0), bins);
    Scratch<Key> shared(member.team_scratch(0), 2);

    std::uint64_t const n = batch.visible(req, t);
    Key const* row = keys + i * batch.max_visible;
    std::uint64_t const k = n < static_cast<std::uint64_t>(topk) ? n : topk;

    // Every visible pool is selected when there are no more than topk:
    // everything but pools of bad blocks (key 0).
    Key thr = key_nan;
    Key take = static_cast<Key>(n);
    if (k < n) radix_select(member, row, n, k, hist, shared, thr, take);
    // Fewer than k pools with a usable block (validation off): all of them.
    if (thr == key_not_visible) {
      thr = key_nan;
      take = static_cast<Key>(n);
    }

    // Every column as if nothing were selected: -1, and with Expand the
    // row's incomplete tail pool's positions after the selected columns.
    int const K = batch.kpool;
    int const selected = topk * K;
    std::int64_t const positions =
        static_cast<std::int64_t>(req.cache_length + (t - req.begin) + 1);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, out_columns), [&](int j) {
      out(t, j) = Expand ? expanded_column(j, -1, positions, K, selected) : -1;
    });
    member.team_barrier();

    // (selected above thr so far) in the low half, (equal to thr so far) in
    // the high half: visible < 2^32 pools, so neither overflows.
    Kokkos::parallel_scan(
        KokkosExt::team_range(member, 0, n),
        [&](std::int64_t p, std::uint64_t& prefix, bool final) {
          Key const key = row[p];
          bool const above = key > thr;
          bool const equal = key == thr;
          if (final) {
            std::uint64_t const eq_before = prefix >> 32;
            if (above || (equal && eq_before < static_cast<std::uint64_t>(take))) {
              std::uint64_t const taken_eq =
                  eq_before < static_cast<std::uint64_t>(take) ? eq_before : take;
              int const col = static_cast<int>((prefix & 0xFFFFFFFFull) + taken_eq);
              if (Expand) {
                for (int m = 0; m < K; ++m)
                  out(t, col * K + m) = expanded_column(col * K + m, p, positions, K, selected);
              } else {
                out(t, col) = static_cast<std::int32_t>(p);
              }
            }
          }
          prefix += (above ? 1ull : 0ull) + (equal ? (1ull << 32) : 0ull);
        });
  }

  // The k-th largest of row[0, n) (k < n) into thr, and into take how many
  // keys equal to it rank within the first k.
  KOKKOS_INLINE_FUNCTION void radix_select(member_type const& member,
                                           Key const* row, std::uint64_t n,
                                           std::uint64_t k,
                                           Scratch<std::uint32_t> const& hist,
                                           Scratch<Key> const& shared, Key& thr,
                                           Key& take) const {
    Key prefix = 0;
    Key mask = 0;
    Key remaining = static_cast<Key>(k);
    bool const alone = member.team_size() == 1;
    for (int shift = key_bits - digit_bits; shift >= 0; shift -= digit_bits) {
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, bins),
                           [&](int d) { hist(d) = 0; });
      member.team_barrier();
      Kokkos::parallel_for(
          KokkosExt::team_range(member, 0, n), [&](std::int64_t p) {
            Key const key = row[p];
            if ((key & mask) != prefix) return;
            int const d = static_cast<int>((key >> shift) & (bins - 1));
            // One thread a team (hosts) needs no atomics.
            if (alone)
              ++hist(d);
            else
              Kokkos::atomic_add(&hist(d), 1u);
          });
      member.team_barrier();
      Kokkos::single(Kokkos::PerTeam(member), [&]() {
        Key rem = remaining;
        int d = bins - 1;
        for (; d > 0; --d) {
          if (hist(d) >= rem) break;
          rem -= hist(d);
        }
        shared(0) = prefix | (static_cast<Key>(d) << shift);
        shared(1) = rem;
      });
      member.team_barrier();
      prefix = shared(0);
      remaining = shared(1);
      mask |= static_cast<Key>(bins - 1) << shift;
      member.team_barrier();
    }
    thr = prefix;
    take = remaining;
  }
};

}  // namespace Details
}  // namespace KPool

#endif
