#ifndef KPOOL_DETAILS_SEED_TAIL_FUNCTOR_HPP
#define KPOOL_DETAILS_SEED_TAIL_FUNCTOR_HPP

#include <pool/detail/KPool_RaggedWriter.hpp>

namespace KPool {
namespace Details {

// seed_tail on its own (the writer, or the step's last launch). One work
// item is one request.
template <class Writer>
struct SeedTailFunctor {
  using member_type = typename Writer::member_type;

  Writer writer;
  int items_per_team = 1;

  KOKKOS_INLINE_FUNCTION void operator()(member_type const& member) const {
    int const begin = member.league_rank() * items_per_team;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, items_per_team),
                         [&](int i) { writer.seed(member, begin + i); });
  }
};

}  // namespace Details
}  // namespace KPool

#endif
