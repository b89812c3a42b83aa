#ifndef KPOOL_DETAILS_RING_CLOSE_FUNCTOR_HPP
#define KPOOL_DETAILS_RING_CLOSE_FUNCTOR_HPP

#include <cache/detail/KPool_CacheWrite.hpp>
#include <pool/detail/KPool_RaggedWriter.hpp>

namespace KPool {
namespace Details {

// ring_close on its own (the writer, or the step's first launch). One work
// item is one request; team thread i of a team takes item
// league_rank * items_per_team + i. A step's launch with a cache writes
// the closed pools into it too (team_items).
template <class Writer, class Cache = NoCache>
struct RingCloseFunctor {
  using member_type = typename Writer::member_type;
  using execution_space = typename Writer::execution_space;

  Writer writer;
  Cache cache{};
  int items_per_team = 1;

  KOKKOS_INLINE_FUNCTION void operator()(member_type const& member) const {
    int const begin = member.league_rank() * items_per_team;
    team_items<execution_space, typename Writer::value_type>(
        member, cache, items_per_team, 1, [&](int i, auto const& hook) {
          writer.close(member, begin + i, hook);
        });
  }
};

}  // namespace Details
}  // namespace KPool

#endif
