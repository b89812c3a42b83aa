#ifndef KPOOL_DETAILS_COMPRESS_FUNCTOR_HPP
#define KPOOL_DETAILS_COMPRESS_FUNCTOR_HPP

#include <details/KPool_DetailsRaggedWriter.hpp>

#include <cstdint>

namespace KPool {
namespace Details {

// compress on its own (the writer, or the step's middle launch). One work
// item is one output row.
template <class Writer>
struct CompressFunctor {
  using member_type = typename Writer::member_type;

  Writer writer;
  int items_per_team = 1;

  KOKKOS_INLINE_FUNCTION void operator()(member_type const& member) const {
    std::uint64_t const begin =
        static_cast<std::uint64_t>(member.league_rank()) * items_per_team;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, items_per_team),
                         [&](int i) { writer.pool_row(member, begin + i); });
  }
};

}  // namespace Details
}  // namespace KPool

#endif
