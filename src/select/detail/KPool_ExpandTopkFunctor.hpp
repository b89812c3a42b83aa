#ifndef KPOOL_SELECT_DETAIL_EXPAND_TOPK_FUNCTOR_HPP
#define KPOOL_SELECT_DETAIL_EXPAND_TOPK_FUNCTOR_HPP

#include <common/detail/KPool_KokkosExt.hpp>
#include <common/detail/KPool_Views.hpp>

#include <cstdint>

namespace KPool {
namespace Details {

// The width of an expanded row, in 64 bits (the callers check it against
// int32): topk * K pool columns, plus the K - 1 tail columns when
// tail_always (select_tokens always has them).
inline std::uint64_t expanded_width(std::uint64_t topk, int kpool, bool tail_always) {
  return topk * static_cast<std::uint64_t>(kpool) +
         (tail_always ? static_cast<std::uint64_t>(kpool) - 1 : 0);
}

// What column j of an expanded row holds (docs/writers.md, expand_topk), for a
// row whose first `visible` positions are visible, `selected` = topk * K
// pool columns: for j < selected, pid * K + j % K with pid the row's pool
// id j / K (passed in), or -1 when pid < 0 or the pool is not complete
// within visible; tail column j - selected the position visible - visible %
// K + (j - selected) when it is below visible, else -1. expand_topk and
// select_tokens both call this, so their token rows agree.
KOKKOS_INLINE_FUNCTION std::int32_t expanded_column(int j, std::int64_t pid,
                                                    std::int64_t visible,
                                                    int kpool, int selected) {
  std::int64_t const K = kpool;
  std::int64_t v = -1;
  if (j < selected) {
    if (pid >= 0 && (pid + 1) * K <= visible) v = pid * K + j % kpool;
  } else {
    std::int64_t const jt = j - selected;
    if (jt < visible % K) v = visible - visible % K + jt;
  }
  return static_cast<std::int32_t>(v);
}

// expand_topk: selected pool ids back to token positions. One work item is
// one token row; lanes cover its output columns. A pool id becomes
// positions only when the pool is complete within the row's visible count,
// so a stale or garbage id can never reach attention as an index.
template <class ExecutionSpace>
struct ExpandTopkFunctor {
  using memory_space = typename ExecutionSpace::memory_space;
  using member_type =
      typename KokkosExt::TeamPolicy<ExecutionSpace>::member_type;

  View2<const std::int32_t, memory_space> pool_ids;  // [T, pool_topk]
  View1<const std::uint32_t, memory_space> row_offsets;
  View1<const std::uint32_t, memory_space> cache_lengths;
  View2<std::int32_t, memory_space> out;  // [T, pool_topk*K (+ K-1)]
  int num_requests;
  int kpool;
  bool tail_always;
  int items_per_team = 1;

  KOKKOS_INLINE_FUNCTION void operator()(member_type const& member) const {
    std::uint64_t const begin =
        static_cast<std::uint64_t>(member.league_rank()) * items_per_team;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, items_per_team),
                         [&](int i) { expand(member, begin + i); });
  }

  KOKKOS_INLINE_FUNCTION void expand(member_type const& member,
                                     std::uint64_t t) const {
    if (t >= pool_ids.extent(0) || t >= out.extent(0)) return;
    int const b = owner_of(row_offsets, num_requests, t);
    // Rows outside every live request are not touched; with validation off
    // this also covers offsets that decrease.
    if (b >= num_requests || t < row_offsets(b) || t >= row_offsets(b + 1))
      return;
    std::int64_t const visible =
        static_cast<std::int64_t>(cache_lengths(b)) +
        static_cast<std::int64_t>(t - row_offsets(b)) + 1;
    int const topk = static_cast<int>(pool_ids.extent(1));
    int const selected = topk * kpool;
    int const width = selected + (tail_always ? kpool - 1 : 0);
    // A row past int32 positions (only possible with validation off) is
    // skipped like any other invalid request: its positions cannot be
    // written as int32.
    if (visible > static_cast<std::int64_t>(max_sequence_length)) return;
    KokkosExt::vector_for<ExecutionSpace>(member, width, [&](int j) {
      std::int64_t const pid = j < selected ? pool_ids(t, j / kpool) : -1;
      out(t, j) = expanded_column(j, pid, visible, kpool, selected);
    });
  }
};

}  // namespace Details
}  // namespace KPool

#endif
