#ifndef KPOOL_COMMON_SHARD_HPP
#define KPOOL_COMMON_SHARD_HPP

/// @file
/// KPool::Shard: which of a sequence's pools one rank of a sharded pool
/// cache holds (docs/ranks.md). Over `ranks` ranks, the pools are dealt
/// out in runs of `interleave` consecutive pools, round-robin: pool p
/// lives on rank (p / interleave) % ranks, as its local pool
///   (p / (interleave * ranks)) * interleave + p % interleave,
/// so a rank's pools, in order, are its local pools 0, 1, 2, ... and its
/// block table maps local pools (local pool l in column l / block_pools),
/// exactly as an unsharded cache maps a sequence's pools. The default, one
/// rank, is the unsharded cache.

#include <common/detail/KPool_KokkosExt.hpp>

#include <cstdint>
#include <string>

namespace KPool {

/// One rank's share of a sharded pool cache (docs/ranks.md).
struct Shard {
  /// This rank, in [0, ranks).
  int rank = 0;
  /// The ranks the cache is sharded over (1: unsharded).
  int ranks = 1;
  /// Consecutive pools a rank holds before the next rank's (1: pool p on
  /// rank p % ranks).
  int interleave = 1;

  /// Whether the cache is split over more than one rank.
  KOKKOS_INLINE_FUNCTION bool sharded() const { return ranks > 1; }

  /// The rank that holds pool p.
  KOKKOS_INLINE_FUNCTION int owner(std::uint64_t p) const {
    return static_cast<int>((p / static_cast<std::uint64_t>(interleave)) %
                            static_cast<std::uint64_t>(ranks));
  }
  /// Pool p's local pool on its owner.
  KOKKOS_INLINE_FUNCTION std::uint64_t local(std::uint64_t p) const {
    std::uint64_t const u = static_cast<std::uint64_t>(interleave);
    return p / (u * static_cast<std::uint64_t>(ranks)) * u + p % u;
  }
  /// This rank's local pool l as a pool of the sequence. Increasing in l,
  /// so a rank's local order is the sequence's order.
  KOKKOS_INLINE_FUNCTION std::uint64_t global(std::uint64_t l) const {
    std::uint64_t const u = static_cast<std::uint64_t>(interleave);
    return (l / u * static_cast<std::uint64_t>(ranks) + static_cast<std::uint64_t>(rank)) * u +
           l % u;
  }
  /// How many of the pools [0, n) this rank holds: its local pools
  /// [0, local_count(n)) are exactly those.
  KOKKOS_INLINE_FUNCTION std::uint64_t local_count(std::uint64_t n) const {
    std::uint64_t const u = static_cast<std::uint64_t>(interleave);
    std::uint64_t const cycle = u * static_cast<std::uint64_t>(ranks);
    std::uint64_t const full = n / cycle * u;
    std::uint64_t const rem = n % cycle;
    std::uint64_t const start = static_cast<std::uint64_t>(rank) * u;
    std::uint64_t const extra = rem <= start ? 0 : (rem - start < u ? rem - start : u);
    return full + extra;
  }
};

/// "rank r of W (interleave u)", for messages.
inline std::string shard_name(Shard const& s) {
  return "rank " + std::to_string(s.rank) + " of " + std::to_string(s.ranks) +
         " (interleave " + std::to_string(s.interleave) + ")";
}

}  // namespace KPool

#endif
