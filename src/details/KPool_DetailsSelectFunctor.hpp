#ifndef KPOOL_DETAILS_SELECT_FUNCTOR_HPP
#define KPOOL_DETAILS_SELECT_FUNCTOR_HPP

// The selection (docs/indexer.md, "Selection"): one team per query row finds the
// row's top-k pools among its visible ones from their keys, in O(visible):
//   1. a radix select, 8 key bits a pass from the top, finds the k-th
//      largest key `thr` and how many of the keys equal to it are taken
//      (`take`): every key above thr is selected, and of those equal to it
//      the `take` lowest pool ids, which is the tie rule;
//   2. one team scan over the pools in id order counts, for each pool, the
//      selected pools before it: that count is its column, so the selected
//      ids come out ascending with no sort.
// Counts are exact integers, so the selection is the same whatever the
// team size or backend. Expand (select_tokens) keeps the ids in team
// scratch and writes the expanded token row instead (expanded_column).

#include <details/KPool_DetailsExpandTopkFunctor.hpp>
#include <details/KPool_DetailsKokkosExt.hpp>
#include <details/KPool_DetailsSelect.hpp>
#include <details/KPool_DetailsStrided.hpp>

#include <cstdint>

namespace KPool {
namespace Details {

template <class ExecutionSpace, class Key, bool Expand>
struct SelectFunctor {
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
  Key const* keys;  // [rows of q * max_visible]
  // pool_ids [T, topk], or with Expand the token rows [T, topk * K + K - 1].
  Strided<std::int32_t, 2> out;
  int out_columns;
  int topk;
  int scratch_level;

  static std::size_t scratch_bytes(int topk) {
    return Scratch<std::uint32_t>::shmem_size(bins) +
           Scratch<Key>::shmem_size(2) +
           (Expand ? Scratch<std::int32_t>::shmem_size(topk) : 0);
  }

  KOKKOS_INLINE_FUNCTION void operator()(member_type const& member) const {
    std::uint64_t const t = member.league_rank();
    SelectRequest req;
    if (t >= batch.total_rows || batch.owner(t, req) < 0) return;
    Scratch<std::uint32_t> hist(member.team_scratch(scratch_level), bins);
    Scratch<Key> shared(member.team_scratch(scratch_level), 2);
    Scratch<std::int32_t> ids;
    if (Expand) ids = Scratch<std::int32_t>(member.team_scratch(scratch_level), topk);

    std::uint64_t const n = batch.visible(req, t);
    Key const* row = keys + t * batch.max_visible;
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

    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, topk), [&](int j) {
      if (Expand)
        ids(j) = -1;
      else
        out(t, j) = -1;
    });
    member.team_barrier();

    // (selected above thr so far) in the low half, (equal to thr so far) in
    // the high half: visible < 2^32 pools, so neither overflows.
    Kokkos::parallel_scan(
        Kokkos::TeamThreadRange(member, static_cast<int>(n)),
        [&](int p, std::uint64_t& prefix, bool final) {
          Key const key = row[p];
          bool const above = key > thr;
          bool const equal = key == thr;
          if (final) {
            std::uint64_t const eq_before = prefix >> 32;
            if (above || (equal && eq_before < static_cast<std::uint64_t>(take))) {
              std::uint64_t const taken_eq =
                  eq_before < static_cast<std::uint64_t>(take) ? eq_before : take;
              int const col = static_cast<int>((prefix & 0xFFFFFFFFull) + taken_eq);
              if (Expand)
                ids(col) = p;
              else
                out(t, col) = p;
            }
          }
          prefix += (above ? 1ull : 0ull) + (equal ? (1ull << 32) : 0ull);
        });

    if (Expand) {
      member.team_barrier();
      int const K = batch.kpool;
      int const selected = topk * K;
      std::int64_t const positions =
          static_cast<std::int64_t>(req.cache_length + (t - req.begin) + 1);
      Kokkos::parallel_for(
          Kokkos::TeamThreadRange(member, out_columns),
          [&](int j) {
            std::int64_t const pid = j < selected ? ids(j / K) : -1;
            out(t, j) = expanded_column(j, pid, positions, K, selected);
          });
    }
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
          Kokkos::TeamThreadRange(member, static_cast<int>(n)), [&](int p) {
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
