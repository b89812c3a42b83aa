#ifndef KPOOL_DETAILS_COMPRESS_FUNCTOR_HPP
#define KPOOL_DETAILS_COMPRESS_FUNCTOR_HPP

#include <cache/detail/KPool_CacheWrite.hpp>
#include <pool/detail/KPool_RaggedWriter.hpp>

#include <cstdint>

namespace KPool {
namespace Details {

// compress on its own (the writer, or the step's middle launch). One work
// item is one output row. A step's launch with a cache writes the pools
// into it too (team_items).
template <class Writer, class Cache = NoCache>
struct CompressFunctor {
  using member_type = typename Writer::member_type;
  using execution_space = typename Writer::execution_space;

  Writer writer;
  Cache cache{};
  int items_per_team = 1;

  KOKKOS_INLINE_FUNCTION void operator()(member_type const& member) const {
    std::uint64_t const begin =
        static_cast<std::uint64_t>(member.league_rank()) * items_per_team;
    team_items<execution_space, typename Writer::value_type>(
        member, cache, items_per_team, 1, [&](int i, auto const& hook) {
          writer.pool_row(member, begin + i, hook);
        });
  }
};

}  // namespace Details
}  // namespace KPool

#endif
