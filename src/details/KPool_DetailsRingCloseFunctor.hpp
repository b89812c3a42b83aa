#ifndef KPOOL_DETAILS_RING_CLOSE_FUNCTOR_HPP
#define KPOOL_DETAILS_RING_CLOSE_FUNCTOR_HPP

#include <details/KPool_DetailsRaggedWriter.hpp>

namespace KPool {
namespace Details {

// ring_close on its own (the writer, or the step's first launch). One work
// item is one request; team thread i of a team takes item
// league_rank * items_per_team + i.
template <class Writer>
struct RingCloseFunctor {
  using member_type = typename Writer::member_type;

  Writer writer;
  int items_per_team = 1;

  KOKKOS_INLINE_FUNCTION void operator()(member_type const& member) const {
    int const begin = member.league_rank() * items_per_team;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, items_per_team),
                         [&](int i) { writer.close(member, begin + i); });
  }
};

}  // namespace Details
}  // namespace KPool

#endif
