#ifndef KPOOL_DETAILS_FUSED_STEP_FUNCTOR_HPP
#define KPOOL_DETAILS_FUSED_STEP_FUNCTOR_HPP

#include <cache/detail/KPool_CacheWrite.hpp>
#include <pool/detail/KPool_RaggedWriter.hpp>

#include <cstdint>

namespace KPool {
namespace Details {

// The general step in one launch. The first request_teams teams take the
// requests: each team thread closes its request's pending pool and then
// seeds its ring slot. The close reads ring entries the seed may overwrite
// (the next pool's members land on the same ring indices), and both are done
// by the same team thread with the same channel-to-lane mapping, so each
// lane reads its ring entries before it writes them, with no barrier. No
// other request touches that slot. The remaining teams build the compress
// pools, which never touch the ring. It calls the same device functions as
// the three-launch path, so both produce the same bits.
// With a cache (Cache a CacheTarget), every team then writes the pools its
// items made into the cache from team scratch (team_items).
template <class Writer, class Cache = NoCache>
struct FusedStepFunctor {
  using member_type = typename Writer::member_type;
  using execution_space = typename Writer::execution_space;

  Writer writer;
  Cache cache{};
  int request_teams = 0;
  int items_per_team = 1;

  KOKKOS_INLINE_FUNCTION void operator()(member_type const& member) const {
    int const team = member.league_rank();
    if (team < request_teams) {
      int const begin = team * items_per_team;
      team_items<execution_space, typename Writer::value_type>(
          member, cache, items_per_team, 1, [&](int i, auto const& hook) {
            writer.close(member, begin + i, hook);
            writer.seed(member, begin + i);
          });
    } else {
      std::uint64_t const begin =
          static_cast<std::uint64_t>(team - request_teams) * items_per_team;
      team_items<execution_space, typename Writer::value_type>(
          member, cache, items_per_team, 1, [&](int i, auto const& hook) {
            writer.pool_row(member, begin + i, hook);
          });
    }
  }
};

}  // namespace Details
}  // namespace KPool

#endif
