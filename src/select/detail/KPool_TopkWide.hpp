#ifndef KPOOL_SELECT_DETAIL_TOPK_WIDE_HPP
#define KPOOL_SELECT_DETAIL_TOPK_WIDE_HPP

// SelectWideFunctor: the selection (KPool_TopkCore.hpp) for a topk whose
// SelectFunctor buffers (KPool_TopkTeam.hpp) do not fit level-0 team
// scratch (select_plan); no selection kernel takes level-1 scratch.

#include <common/detail/KPool_KokkosExt.hpp>
#include <common/detail/KPool_Strided.hpp>
#include <common/detail/KPool_Scoring.hpp>
#include <select/detail/KPool_ExpandTopkFunctor.hpp>
#include <select/detail/KPool_TopkCore.hpp>

#include <cstddef>
#include <cstdint>

namespace KPool {
namespace Details {

// The selection for any topk in level-0 scratch (a 256-bin histogram and
// two keys): a radix select of 8 key bits a pass from the top, each pass
// over the whole row, finds the k-th largest key `thr` and `take`, how
// many keys equal to it are selected; then one ordered scan over the
// pools in id order (team_ordered_scan) gives each selected pool its
// column (the selected pools before it), so the ids come out ascending
// with no sort. Expand writes the token
// row's -1s and tail columns first, then each selected pool's K positions
// at its column. Slower than SelectFunctor (four reads of the row), it is
// what a topk whose buffers do not fit level 0 takes.
template <class ExecutionSpace, class Key, bool Expand>
struct SelectWideFunctor : SelectTeamInputs<ExecutionSpace, Key> {
  KPOOL_IMPL_SELECT_TEAM_INPUTS(ExecutionSpace, Key);

  static constexpr int digit_bits = 8;
  static constexpr int bins = 1 << digit_bits;
  static constexpr int key_bits = 8 * static_cast<int>(sizeof(Key));

  // Level-0 team scratch, the same for every topk: the histogram, two
  // keys, and team_ordered_scan's words.
  static std::size_t scratch_bytes() {
    return Scratch<std::uint32_t>::shmem_size(bins) + Scratch<Key>::shmem_size(2) +
           Scratch<std::uint64_t>::shmem_size(max_select_team + 1);
  }

  KOKKOS_INLINE_FUNCTION void operator()(member_type const& member) const {
    SelectRow r{};
    if (!r.find<ExecutionSpace>(member, batch, member.league_rank())) return;
    std::uint64_t const i = r.i, t = r.t, n = r.n;
    SelectRequest const& req = r.req;
    Scratch<std::uint32_t> hist(member.team_scratch(0), bins);
    Scratch<Key> shared(member.team_scratch(0), 2);
    Scratch<std::uint64_t> runs(member.team_scratch(0), max_select_team + 1);

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
      if (!Expand) put_key(t, j, -1);
    });
    member.team_barrier();

    // (selected above thr so far) in the low half, (equal to thr so far) in
    // the high half: visible < 2^32 pools, so neither overflows.
    team_ordered_scan(
        member, runs.data(), runs.data() + max_select_team, n,
        [&](std::uint64_t p, std::uint64_t& prefix, bool final) {
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
                  out(t, col * K + m) = expanded_column(col * K + m, static_cast<std::int64_t>(p),
                                                        positions, K, selected);
              } else {
                out(t, col) = static_cast<std::int32_t>(p);
                put_key(t, col, static_cast<std::int64_t>(p));
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
