#ifndef KPOOL_COMMON_DETAIL_CACHE_STAGING_HPP
#define KPOOL_COMMON_DETAIL_CACHE_STAGING_HPP

// Phase 1 of a team's cache write (KPool_CacheWrite.hpp): the team's
// scratch rows and what each thread stages into them.

#include <common/detail/KPool_CacheTarget.hpp>
#include <common/detail/KPool_Lanes.hpp>

#include <cstddef>
#include <cstdint>

namespace KPool {
namespace Details {

// A slot row as the team's lanes see it. With device shapes the rows are
// padded: channel c sits at word c + c / 32, one pad word after every 32
// channels, so that the staging stores (lane p writing channels
// [p * W, (p + 1) * W), W = 4 for f32 pools and 8 for 16-bit ones, one
// channel w at a time), the quantizer's loads (lane c reading channel c)
// and the butterflies' first stage (lane k taking channels 2k and 2k + 1)
// each reach 32 distinct banks of 4-byte words; unpadded, the stores would
// be 4- and 8-way conflicts and that stage 2-way. Two team threads that
// share a warp stage rows D + D / 32 words apart, which also lands their
// lanes on different banks for D = 128 (cache_row_banks in the unit tests
// checks all of this). Hosts keep rows unpadded and contiguous.
template <class A, bool Padded>
struct SlotRow {
  A* p;
  /// The word channel c sits at.
  KOKKOS_FORCEINLINE_FUNCTION static constexpr int word(int c) {
    return Padded ? c + (c >> 5) : c;
  }
  /// Words a row of D channels takes.
  KOKKOS_FORCEINLINE_FUNCTION static constexpr int columns(int D) {
    return Padded ? D + D / 32 : D;
  }
  KOKKOS_FORCEINLINE_FUNCTION A& operator[](int c) const { return p[word(c)]; }
};

// One team's scratch: `slots` rows of D values in A (padded on devices,
// SlotRow), and each slot's cache entry (block, entry; block < 0 when the
// slot holds nothing). Every team thread constructs it, from the start of
// level-0 scratch, identically.
template <class ExecutionSpace, class A>
struct CacheScratch {
  using scratch_space = typename ExecutionSpace::scratch_memory_space;
  using rows_type = Kokkos::View<A**, Kokkos::LayoutRight, scratch_space,
                                 Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using dest_type = Kokkos::View<int**, Kokkos::LayoutRight, scratch_space,
                                 Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  static constexpr bool padded = device_shapes<ExecutionSpace>::value;
  using row_type = SlotRow<A, padded>;
  rows_type rows;
  dest_type dest;
  int head_dim;

  /// Words a row of D channels takes.
  KOKKOS_INLINE_FUNCTION static constexpr int columns(int D) {
    return row_type::columns(D);
  }

  /// Level-0 scratch bytes a team needs for `slots` pools of D channels.
  static std::size_t bytes(int slots, int head_dim) {
    return rows_type::shmem_size(slots, columns(head_dim)) +
           dest_type::shmem_size(slots, 2);
  }

  template <class Member>
  KOKKOS_INLINE_FUNCTION CacheScratch(Member const& member, int slots,
                                      int head_dim_)
      : rows(member.team_scratch(0), slots, columns(head_dim_)),
        dest(member.team_scratch(0), slots, 2),
        head_dim(head_dim_) {}

  KOKKOS_INLINE_FUNCTION int slots() const {
    return static_cast<int>(dest.extent(0));
  }
  /// Slot `slot`'s row, channel by channel.
  KOKKOS_INLINE_FUNCTION row_type row(int slot) const { return row_type{&rows(slot, 0)}; }
  /// Slot `slot`'s row as D contiguous values: hosts only (unpadded).
  KOKKOS_INLINE_FUNCTION A* host_row(int slot) const {
    static_assert(!padded, "device rows are padded: use row()");
    return &rows(slot, 0);
  }
};

// Largest slot count up to `wanted` whose scratch fits `max_bytes` (0 when
// not even one does).
template <class ExecutionSpace, class A>
int cache_slots_fitting(std::size_t max_bytes, int head_dim, int wanted) {
  int n = std::max(wanted, 1);
  while (n > 0 && CacheScratch<ExecutionSpace, A>::bytes(n, head_dim) > max_bytes) --n;
  return n;
}

// --- Phase 1: staging (per team thread, inside its work item) -----------

/// Records where slot `slot`'s pool goes (one lane writes).
template <class Member, class ExecutionSpace, class A>
KOKKOS_INLINE_FUNCTION void cache_stage_target(
    Member const& member, CacheScratch<ExecutionSpace, A> const& s, int slot,
    CacheSlot where) {
  KokkosExt::single_per_thread(member, [&]() {
    s.dest(slot, 0) = where.block;
    s.dest(slot, 1) = where.entry;
  });
}

/// Marks slot `slot` empty: nothing is written for it.
template <class Member, class ExecutionSpace, class A>
KOKKOS_INLINE_FUNCTION void cache_stage_skip(
    Member const& member, CacheScratch<ExecutionSpace, A> const& s, int slot) {
  cache_stage_target(member, s, slot, CacheSlot{-1, 0});
}

/// Stages channel c of slot `slot`: x is the pool's value as stored in T,
/// converted to A (to_accumulator). For a writer staging straight from
/// the registers its pooling loop just rounded into T, so the pool makes
/// no second trip through memory; any lane may stage any channel (the
/// barrier in cache_team_write orders them). Pair it with one
/// cache_stage_target for the slot.
template <class ExecutionSpace, class A>
KOKKOS_FORCEINLINE_FUNCTION void cache_stage_value(
    CacheScratch<ExecutionSpace, A> const& s, int slot, int c, A x) {
  s.row(slot)[c] = x;
}

/// Stages pool x (D values as stored in T, channel stride `stride`) into
/// slot `slot`, bound for `where` (an empty `where` marks the slot empty).
/// The calling team thread's vector lanes copy the channels with the lane
/// mapping of path P (thread_vector_pool's and thread_vector_copy's: lane p
/// takes channels [p * W, (p + 1) * W) on contiguous paths, channel p on
/// strided ones), so a writer may stage the row it has just written to
/// its output: each lane reads back only what it wrote itself.
template <class ExecutionSpace, class P = Path<0, 0, 1, false>, class Member,
          class A, class T>
KOKKOS_INLINE_FUNCTION void cache_stage_row(
    Member const& member, CacheScratch<ExecutionSpace, A> const& s, int slot,
    T const* x, std::ptrdiff_t stride, CacheSlot where) {
  cache_stage_target(member, s, slot, where);
  if (where.block < 0) return;
  auto const row = s.row(slot);
  int const D = s.head_dim;
  constexpr int W = P::width;
  if constexpr (P::contiguous) {
    KokkosExt::vector_for<ExecutionSpace>(member, D / W, [&](int p) {
      KPOOL_IMPL_UNROLL
      for (int w = 0; w < W; ++w) row[p * W + w] = to_accumulator(x[p * W + w]);
    });
  } else {
    KokkosExt::vector_for<ExecutionSpace>(
        member, D, [&](int c) { row[c] = to_accumulator(x[c * stride]); });
  }
}

}  // namespace Details
}  // namespace KPool

#endif
