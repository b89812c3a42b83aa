#ifndef KPOOL_POOL_DETAIL_WRITER_FUNCTORS_HPP
#define KPOOL_POOL_DETAIL_WRITER_FUNCTORS_HPP

// The launches of the ragged writers' device functions (RaggedWriter): one
// functor, whose part says which functions its items call. Team thread i
// of a team takes item league_rank * items_per_team + i of its part:
//   ring_close: a request (close its ring pool),
//   compress:   an output row (one pool of this call's tokens),
//   seed_tail:  a request (seed its ring slot),
//   step:       the general step in one launch. The first request_teams
//               teams take the requests: each team thread closes its
//               request's pending pool and then seeds its ring slot. The
//               close reads ring entries the seed may overwrite (the next
//               pool's members land on the same ring indices), and both are
//               done by the same team thread with the same channel-to-lane
//               mapping, so each lane reads its ring entries before it
//               writes them, with no barrier. No other request touches that
//               slot. The remaining teams build the compress pools, which
//               never touch the ring. The three-launch path calls the same
//               device functions, so both produce the same bits.
// With a cache (Cache a CacheTarget), every team then writes the pools its
// items made into the cache from team scratch (team_items); seed_tail
// makes no pool and takes none.

#include <common/detail/KPool_CacheWrite.hpp>
#include <pool/detail/KPool_RaggedWriter.hpp>

#include <cstdint>

namespace KPool {
namespace Details {

enum class WriterPart { ring_close, compress, seed_tail, step };

template <class Writer, WriterPart Part, class Cache = NoCache>
struct RaggedFunctor {
  using member_type = typename Writer::member_type;
  using execution_space = typename Writer::execution_space;

  Writer writer;
  Cache cache{};
  int items_per_team = 1;
  int request_teams = 0;  // step: the teams that take the requests

  KOKKOS_INLINE_FUNCTION void operator()(member_type const& member) const {
    int const team = member.league_rank();
    if constexpr (Part == WriterPart::compress) {
      pools(member, team);
    } else if constexpr (Part == WriterPart::step) {
      if (team < request_teams)
        requests(member, team);
      else
        pools(member, team - request_teams);
    } else {
      requests(member, team);
    }
  }

 private:
  KOKKOS_INLINE_FUNCTION void pools(member_type const& member, int team) const {
    std::uint64_t const begin = static_cast<std::uint64_t>(team) * items_per_team;
    team_items<execution_space, typename Writer::value_type>(
        member, cache, items_per_team, 1, [&](int i, auto const& hook) {
          writer.pool_row(member, begin + i, hook);
        });
  }

  KOKKOS_INLINE_FUNCTION void requests(member_type const& member, int team) const {
    int const begin = team * items_per_team;
    team_items<execution_space, typename Writer::value_type>(
        member, cache, items_per_team, 1, [&](int i, auto const& hook) {
          if constexpr (Part != WriterPart::seed_tail)
            writer.close(member, begin + i, hook);
          else
            (void)hook;
          if constexpr (Part != WriterPart::ring_close)
            writer.seed(member, begin + i);
        });
  }
};

template <class Writer, class Cache = NoCache>
using RingCloseFunctor = RaggedFunctor<Writer, WriterPart::ring_close, Cache>;
template <class Writer, class Cache = NoCache>
using CompressFunctor = RaggedFunctor<Writer, WriterPart::compress, Cache>;
template <class Writer>
using SeedTailFunctor = RaggedFunctor<Writer, WriterPart::seed_tail>;
template <class Writer, class Cache = NoCache>
using FusedStepFunctor = RaggedFunctor<Writer, WriterPart::step, Cache>;

}  // namespace Details
}  // namespace KPool

#endif
