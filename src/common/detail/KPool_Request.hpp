#ifndef KPOOL_COMMON_DETAIL_REQUEST_HPP
#define KPOOL_COMMON_DETAIL_REQUEST_HPP

// The one place that derives a request's pools from its cache length and
// row count (docs/writers.md, "The writers"). The kernels, the offset scan and
// host-side validation all call request_geometry, so compress skips exactly
// the rows ring_close consumes and seed_tail stashes the same range in the
// fused and the three-launch step.

#include <common/detail/KPool_KokkosExt.hpp>

#include <cstdint>

namespace KPool {
namespace Details {

// Positions and pool ids leave the library as int32, so a request may end
// at most here.
constexpr std::uint64_t max_sequence_length = 0x7FFFFFFFull;

struct RequestGeometry {
  std::uint64_t cache_length;  // c: tokens before this call
  std::uint64_t rows;          // n: this call's rows
  std::uint64_t end;           // c + n
  int have;                    // c % K: members the ring holds
  int align;                   // rows to skip to the first whole pool
  std::uint64_t first;         // ceil(c / K): first pool starting here
  std::uint64_t full;          // pools made entirely of this call's rows
  bool closes;                 // ring_close closes pool c / K
  std::uint64_t seed_start;    // first position seed_tail stashes
};

// Ring index of position `pos` in a ring of `ring_length` entries
// (docs/ring.md). Every writer addresses the ring through this.
// The ring length is a multiple of K, so pool p's K members sit at the
// consecutive indices ring_index(p * K, R) + m: a pool never wraps.
// Positions stay below 2^32 whatever the input (cache lengths are uint32,
// decode positions int32, and an invalid request seeds nothing), so the
// 32-bit remainder is exact, and on GPUs much cheaper than a 64-bit one.
KOKKOS_INLINE_FUNCTION int ring_index(std::uint64_t pos, int ring_length) {
  return static_cast<int>(static_cast<std::uint32_t>(pos) %
                          static_cast<std::uint32_t>(ring_length));
}

// `ring_length` only sets the seed range: the call's last R positions.
KOKKOS_INLINE_FUNCTION RequestGeometry request_geometry(std::uint64_t c,
                                                        std::uint64_t n,
                                                        int kpool,
                                                        int ring_length) {
  std::uint64_t const K = static_cast<std::uint64_t>(kpool);
  RequestGeometry g;
  g.cache_length = c;
  g.rows = n;
  g.end = c + n;
  g.have = static_cast<int>(c % K);
  g.align = static_cast<int>((K - c % K) % K);
  g.first = (c + K - 1) / K;
  std::uint64_t const last = g.end / K;
  g.full = last > g.first ? last - g.first : 0;
  g.closes = g.have != 0 && c % K + n >= K;
  // The last R positions, not only the pending pool's members: a later
  // call may rewind into them (docs/ring.md, "Rewinds").
  std::uint64_t const R = static_cast<std::uint64_t>(ring_length);
  g.seed_start = g.end > c + R ? g.end - R : c;
  return g;
}

// A ring slot's state (Ring::state(), docs/ring.md, "What a slot holds"):
// the slot holds its sequence's positions [start, length), length being
// L, where the last call ended, and high H, one past the highest position
// sent since the sequence started (high 0: the slot holds nothing, fresh
// or reset). Three words a slot, in this order, on the ring's memory space.
struct SlotState {
  std::uint32_t start = 0, length = 0, high = 0;
};
constexpr int slot_state_words = 3;

// What a call that sends positions [c, end), end > c, to a slot leaves
// there, moved on the device by the launch that writes the ring (one
// thread a slot): a call that continues or rewinds what the slot holds
// (c <= L, and [c, end) touches [start, L)) keeps start (or lowers it to
// c), sets L = end and H = max(H, end); any other (c = 0, a fresh or
// reset slot, or validation off letting a gap through) holds [c, end)
// alone, H = end.
KOKKOS_INLINE_FUNCTION void advance_slot(std::uint32_t* state, std::uint64_t c,
                                         std::uint64_t end) {
  std::uint32_t const start = state[0], length = state[1], high = state[2];
  bool const continues = c != 0 && high != 0 && c <= length && end >= start;
  state[0] = static_cast<std::uint32_t>(continues && start < c ? start : c);
  state[1] = static_cast<std::uint32_t>(end);
  state[2] = static_cast<std::uint32_t>(continues && high > end ? high : end);
}

// The ring's depth rule (docs/ring.md, "Rewinds"): a (re)start at c needs
// H - floor(c / K) * K <= R, the positions the ring must still hold from
// the pending pool's first member on; 0 for a new sequence (c = 0), which
// needs nothing from the ring.
KOKKOS_INLINE_FUNCTION std::uint64_t rewind_depth(std::uint64_t high, std::uint64_t c,
                                                  int kpool) {
  std::uint64_t const base = c / static_cast<std::uint64_t>(kpool) *
                             static_cast<std::uint64_t>(kpool);
  return c == 0 || high <= base ? 0 : high - base;
}

// Whether a call that reads the ring (a step, ring_close, tail_update) may
// start a slot's sequence at c (SEMANTICS, "No gaps"; docs/ring.md): c = 0
// always (a new sequence); in a slot that holds nothing, only at a pool
// boundary; otherwise at c <= L, with the pending pool's earlier members
// [floor(c/K)*K, c) held (from start on) and within the ring's depth.
enum class SlotStart { ok, fresh_mid_pool, gap, before_start, too_deep };

KOKKOS_INLINE_FUNCTION SlotStart slot_start(SlotState const& s, std::uint64_t c, int kpool,
                                            int ring_length) {
  std::uint64_t const K = static_cast<std::uint64_t>(kpool);
  if (c == 0) return SlotStart::ok;
  if (s.high == 0) return c % K == 0 ? SlotStart::ok : SlotStart::fresh_mid_pool;
  if (c > s.length) return SlotStart::gap;
  if (c % K != 0 && c / K * K < s.start) return SlotStart::before_start;
  if (rewind_depth(s.high, c, kpool) > static_cast<std::uint64_t>(ring_length))
    return SlotStart::too_deep;
  return SlotStart::ok;
}

// A decode batch's row r (docs/indexer.md, "Decode batches"): entry
// (r, i) is at position base_r + i, base_r = p - i for its first real
// entry (r, i) at p; 0 for a row without one, or a base below 0 (which
// validation refuses). What the selection and the ranks' expansion read.
template <class Positions>
KOKKOS_INLINE_FUNCTION std::uint64_t decode_row_base(Positions const& positions,
                                                     std::int64_t r, int next_n) {
  for (int i = 0; i < next_n; ++i) {
    std::int32_t const p = positions(r, i);
    if (p >= 0) {
      std::int64_t const base = static_cast<std::int64_t>(p) - i;
      return base < 0 ? 0u : static_cast<std::uint64_t>(base);
    }
  }
  return 0u;
}

// Pools that close when a decode row stashes `pos`: one when it is the last
// member of its pool.
KOKKOS_INLINE_FUNCTION bool closes_pool(std::int64_t pos, int kpool) {
  return pos >= 0 && pos % kpool == kpool - 1;
}

}  // namespace Details
}  // namespace KPool

#endif
