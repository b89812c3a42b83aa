#ifndef KPOOL_SELECT_DETAIL_TOPK_CORE_HPP
#define KPOOL_SELECT_DETAIL_TOPK_CORE_HPP

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
//   2. one ordered partition pass over the row (team_ordered_scan: a run
//      of the row a thread, one team scan over the runs' counts): keys
//      above the prefix go to the `sure` list, ascending; keys on the
//      prefix are compacted into the candidate buffer, ascending (or, once
//      the prefix is a whole key, the first `rem` of them go straight to
//      the `chosen` list: the tie rule);
//   3. candidate passes: the remaining digits over the candidates only,
//      then one ordered scan over them applies the tie rule into `chosen`;
//   4. the two ascending lists are merged (each id's column is its index
//      plus how many ids of the other list are lower) and written, with
//      -1 after them.
// A pass stops early once the threshold bin holds exactly the keys still
// to take. Counts are exact integers, so the selection is the same
// whatever the team size or backend, and it is the set the sorted ranking
// gives. Expand (select_tokens) writes the expanded token row instead
// (expanded_column).
//
// The parts, over the shared pieces here (the digit width, the split
// rows' plan and region layout, the host's block masks and counts):
//   KPool_TopkTeam.hpp   SelectFunctor, the steps above by a team;
//   KPool_TopkHost.hpp   its host path (host_select), for a host's
//                        one-thread teams;
//   KPool_TopkSplit.hpp  long rows split over teams, in two launches
//                        before the selection;
//   KPool_TopkWide.hpp   SelectWideFunctor, any topk in level-0 scratch.

#include <common/KPool_Shard.hpp>
#include <common/detail/KPool_KokkosExt.hpp>
#include <common/detail/KPool_Strided.hpp>
#include <common/detail/KPool_Scoring.hpp>

#include <cstddef>
#include <cstdint>

namespace KPool {
namespace Details {

// The digit width of the radix select, and how many candidates a team
// compacts into scratch.
constexpr int select_digit_bits = 11;
constexpr int select_bins = 1 << select_digit_bits;
constexpr int candidate_capacity = 1024;
static_assert(select_digit_bits == score_hist_bits,
              "a histogram built while scoring is the top-k's first digit's");

// Where long rows split (docs/indexer.md, "Selection"): rows of more than
// `from` visible pools are split over teams, `segment` pools a team. A
// SelectWorkspace takes these defaults; the tests pass lower ones to the
// launch so that small rows take the split path.
struct SelectSplit {
  std::uint64_t from = std::uint64_t(1) << 16;
  std::uint64_t segment = std::uint64_t(1) << 14;
};
// A segment's suffix counts are 16-bit words (split_counts), so that a
// segment holds at most 65535 pools: launch_select refuses a longer
// segment (InvalidArgument, on the host before any launch).
constexpr std::uint64_t split_segment_max = 0xFFFF;
static_assert(SelectSplit{}.segment <= split_segment_max,
              "a split segment's suffix counts are 16-bit");

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

// The largest team a selection kernel takes (select_shape clamps to it):
// team_ordered_scan keeps a word a thread in team scratch.
constexpr int max_select_team = 1024;

// The one-team-a-row selection (SelectFunctor) carries no launch bounds:
// nvcc 13 (sm_90) gives it 71-78 registers without them, 6 teams of 128
// an SM, and more under any: LaunchBounds<128, 5> 87 (5 teams an SM),
// <128, 6> 79-80 with a 24-byte spill in the staged kernel, <128, 7> 72
// with 232 bytes spilled. Its occupancy is the unbounded kernel's.

// An ordered scan of [0, n) by a team, not chunked by the team size (a
// Kokkos team scan over n indices runs n / team_size chunks, each a team
// scan with its barriers): each thread takes one run of consecutive
// indices and sums its increments; one team scan over the team's run sums
// gives each run its start; each thread then walks its run again with
// `final`. f(p, before, final) is a Kokkos scan closure: it adds index p's
// increment to `before`, which on the final call holds the sum over every
// index below p. The runs' length is odd, so that the threads of a warp
// reading a row staged in team scratch fall on distinct banks. `runs` is
// team_size words of team scratch and `total` one more, both free during
// the call; the sum over [0, n) is returned to every thread. Indices are
// 64-bit. It ends with a barrier: what the final calls wrote is then
// visible to the whole team.
template <class Member, class F>
KOKKOS_INLINE_FUNCTION std::uint64_t team_ordered_scan(Member const& member,
                                                       std::uint64_t* runs,
                                                       std::uint64_t* total, std::uint64_t n,
                                                       F const& f) {
  int const team = member.team_size();
  std::uint64_t const T = static_cast<std::uint64_t>(team);
  std::uint64_t const r = static_cast<std::uint64_t>(member.team_rank());
  std::uint64_t const len = ((n + T - 1) / T) | 1u;
  std::uint64_t const b0 = r * len < n ? r * len : n;
  std::uint64_t const b1 = n - b0 < len ? n : b0 + len;
  std::uint64_t sum = 0;
  for (std::uint64_t p = b0; p < b1; ++p) f(p, sum, false);
  member.team_barrier();  // the words may have held the caller's data
  KokkosExt::single_per_thread(member, [&]() { runs[r] = sum; });
  member.team_barrier();
  // One scan over the team's run sums, in place: index j's call reads its
  // own word before it writes it, and no other index reads it.
  Kokkos::parallel_scan(Kokkos::TeamThreadRange(member, team),
                        [&](int j, std::uint64_t& before, bool final) {
                          std::uint64_t const v = runs[j];
                          if (final) {
                            runs[j] = before;
                            if (j == team - 1) *total = before + v;
                          }
                          before += v;
                        });
  member.team_barrier();
  std::uint64_t before = runs[r];
  std::uint64_t const all = *total;
  for (std::uint64_t p = b0; p < b1; ++p) f(p, before, true);
  member.team_barrier();  // the words are free again; `final`'s writes are done
  return all;
}

// What every selection team functor reads (set_select_args fills it) and
// its team types: SelectFunctor and SelectWideFunctor derive from it.
template <class ExecutionSpace, class Key>
struct SelectTeamInputs {
  using memory_space = typename ExecutionSpace::memory_space;
  using member_type = typename KokkosExt::TeamPolicy<ExecutionSpace>::member_type;
  template <class V>
  using Scratch = Kokkos::View<V*, typename ExecutionSpace::scratch_memory_space,
                               Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

  SelectBatch batch;
  Key const* keys;  // [chunk rows * max_visible]
  // pool_ids [T, topk], or with Expand the token rows [T, topk * K + K - 1].
  Strided<std::int32_t, 2> out;
  int out_columns = 0;
  int topk = 0;
  // A shard's local selection (docs/ranks.md; pool ids only): each
  // written column's key as well, [T, topk] contiguous, 0 after the
  // selected ones. Null otherwise.
  Key* out_keys = nullptr;

  // Column `col` of row t selects `id` (-1: none): its key into out_keys.
  KOKKOS_INLINE_FUNCTION void put_key(std::uint64_t t, int col, std::int64_t id) const {
    if (out_keys != nullptr)
      out_keys[t * static_cast<std::uint64_t>(topk) + static_cast<std::uint64_t>(col)] =
          id >= 0 ? keys[batch.key_offset(t) + static_cast<std::uint64_t>(id)] : Key(0);
  }
};

// A call's top-k kernel (select_plan, select/detail/KPool_SelectCall.hpp):
// SelectFunctor with the row staged in scratch or not, or
// SelectWideFunctor; the candidates SelectFunctor's buffer holds, and the
// level-0 scratch a team takes.
enum class SelectKernel { staged, fast, wide };
struct SelectPlan {
  SelectKernel kernel = SelectKernel::wide;
  int cap = 0;
  std::size_t scratch_bytes = 0;
};

// The members of SelectTeamInputs a derived functor names unqualified.
#define KPOOL_IMPL_SELECT_TEAM_INPUTS(ExecSpace, Key)                                 \
  using Inputs = ::KPool::Details::SelectTeamInputs<ExecSpace, Key>;                 \
  using typename Inputs::memory_space, typename Inputs::member_type;                 \
  template <class V>                                                                 \
  using Scratch = typename Inputs::template Scratch<V>;                              \
  using Inputs::batch, Inputs::keys, Inputs::out, Inputs::out_columns, Inputs::topk, \
      Inputs::out_keys, Inputs::put_key

// The row a selection team has (its league rank, or the fused decode
// selection's row): chunk row i, query row t, its request and its n
// visible pools. find is false for a row past the chunk's rows or a dead
// row.
struct SelectRow {
  std::uint64_t i, t, n;
  SelectRequest req;
  template <class ExecutionSpace, class Member>
  KOKKOS_INLINE_FUNCTION bool find(Member const& member, SelectBatch const& batch,
                                   std::uint64_t chunk_row) {
    check_select_team_size<ExecutionSpace>(member);
    i = chunk_row;
    t = batch.row_begin + i;
    if (t >= batch.row_end || batch.owner(t, req) < 0) return false;
    n = batch.visible(req, t);
    return true;
  }
};

// A split row's plan (SplitPlanner, KPool_TopkSplit.hpp),
// split_plan_words(segs) words: what the row takes, its first digit, what
// is left to take in that digit's bin, the bin's keys, the sure ids, then
// each used segment's offsets into the row's sure list and its candidate
// list (exclusive sums, the totals after the last used segment).
namespace SplitPlan {
enum : std::uint32_t { fallback = 0, threshold = 1, all = 2 };
constexpr int state = 0, digit = 1, rem = 2, count = 3, sure = 4, offsets = 8;
}  // namespace SplitPlan
KOKKOS_INLINE_FUNCTION constexpr std::size_t split_plan_words(std::size_t segs) {
  return SplitPlan::offsets + 2 * (segs + 1);
}

// A split row's region of the segment buffer, in 32-bit words: first its
// segments' suffix counts (split_counts: segs * bins 16-bit words, 4 KiB
// a segment, each segment's 16-byte aligned), in its first quarter. Once
// planned (or, on a host, once summed), the whole region holds the row's
// lists: its sure ids at [0, sure), its candidates' ids at [k, k + count)
// and their keys from split_keys_at(k, count) on.
KOKKOS_INLINE_FUNCTION constexpr std::size_t split_region_words(std::size_t segs) {
  return 2 * segs * static_cast<std::size_t>(select_bins);
}
// A region's suffix counts, [segs][bins] 16-bit words (a count fits: a
// segment holds at most split_segment_max pools).
KOKKOS_INLINE_FUNCTION std::uint16_t* split_counts(std::uint32_t* region) {
  return reinterpret_cast<std::uint16_t*>(region);
}
KOKKOS_INLINE_FUNCTION std::uint16_t const* split_counts(std::uint32_t const* region) {
  return reinterpret_cast<std::uint16_t const*>(region);
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

// A team's ticket: whether this team's `count` added to *word completes
// `total` (every team that shares the word has then written what it
// published). A team barrier after the team's writes, then one thread adds
// with release and acquire ordering (KokkosExt::fetch_add_acq_rel: a
// release by one thread after a barrier publishes the whole team's
// writes), and Kokkos' broadcast holds the team until the answer is in, so
// the last team reads the others' writes after an acquire and a barrier.
// No team waits at its ticket. The last one, which no team of the launch
// follows on this word, puts it back to zero and calls on_last() (the same
// thread: other words to put back).
template <class Member, class OnLast>
KOKKOS_INLINE_FUNCTION bool team_ticket(Member const& member, std::uint32_t* word,
                                        std::uint32_t count, std::uint64_t total,
                                        OnLast const& on_last) {
  member.team_barrier();
  int last = 0;
  Kokkos::single(
      Kokkos::PerTeam(member),
      [&](int& l) {
        std::uint32_t const drawn = KokkosExt::fetch_add_acq_rel(word, count);
        l = static_cast<std::uint64_t>(drawn) + count == total ? 1 : 0;
        if (l) {
          *word = 0;
          on_last();
        }
      },
      last);
  return last != 0;
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

}  // namespace Details
}  // namespace KPool

#endif
