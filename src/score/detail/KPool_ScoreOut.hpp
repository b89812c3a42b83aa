#ifndef KPOOL_SCORE_DETAIL_SCORE_OUT_HPP
#define KPOOL_SCORE_DETAIL_SCORE_OUT_HPP

// KPool::score's output: the keys the engines wrote into the workspace,
// back as the scores they order (score_key's inverse on its image), one
// team a query row, -inf past the row's visible pools and for a pool the
// selection would not see (a bad block, validation off).

#include <common/KPool_Options.hpp>
#include <common/detail/KPool_KokkosExt.hpp>
#include <common/detail/KPool_Launch.hpp>
#include <common/detail/KPool_Scoring.hpp>
#include <common/detail/KPool_Strided.hpp>
#include <common/detail/KPool_Validate.hpp>

#include <cstdint>
#include <string>

namespace KPool {
namespace Details {

// The score a key stands for: key_not_visible -inf, key_nan NaN, a
// number's key its number (+0 for either zero, as score_key maps both).
KOKKOS_INLINE_FUNCTION float key_score(std::uint32_t k) {
  if (k == key_not_visible) return KokkosExt::bit_cast<float>(0xFF800000u);  // -inf
  if (k == key_nan) return KokkosExt::bit_cast<float>(0x7FC00000u);
  std::uint32_t const u = (k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k;
  return KokkosExt::bit_cast<float>(u);
}

KOKKOS_INLINE_FUNCTION double key_score(std::uint64_t k) {
  constexpr std::uint64_t sign = 0x8000000000000000ull;
  if (k == key_not_visible) return KokkosExt::bit_cast<double>(0xFFF0000000000000ull);
  if (k == key_nan) return KokkosExt::bit_cast<double>(0x7FF8000000000000ull);
  std::uint64_t const u = (k & sign) ? (k & ~sign) : ~k;
  return KokkosExt::bit_cast<double>(u);
}

// Rows [row_begin, row_end) of a chunk: row t's columns p < width, its
// visible pools' scores, then -inf. Rows of no live request are left.
template <class ExecutionSpace, class Key>
struct ScoresFunctor {
  using member_type = typename KokkosExt::TeamPolicy<ExecutionSpace>::member_type;
  using Score = decltype(key_score(Key()));
  SelectBatch batch;
  Key const* keys = nullptr;
  Strided<Score, 2> out;
  std::uint64_t width = 0;

  KOKKOS_INLINE_FUNCTION void operator()(member_type const& member) const {
    std::uint64_t const t = batch.row_begin + static_cast<std::uint64_t>(member.league_rank());
    SelectRequest req;
    if (batch.owner(t, req) < 0) return;
    std::uint64_t const vis = batch.visible(req, t);
    Key const* row = keys + batch.key_offset(t);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, width), [&](std::uint64_t p) {
      out(t, p) = key_score(p < vis ? row[p] : static_cast<Key>(key_not_visible));
    });
  }
};

template <class ExecutionSpace, class Key, class OutView>
void launch_scores(Checker const& chk, ExecutionSpace const& space, SelectBatch const& batch,
                   Key const* keys, OutView const& out, Options const& options) {
  std::size_t const rows = batch.row_end - batch.row_begin;
  if (rows == 0) return;
  ScoresFunctor<ExecutionSpace, Key> f;
  f.batch = batch;
  f.keys = keys;
  f.out = out;
  f.width = out.extent(1);
  LaunchShape shape;
  shape.league = league_for(chk, "q", rows, 1);
  shape.team_size = team_size_for(space, f, 1, options.team_size);
  launch(space, chk.entry_point() + "::scores", shape, f);
}

}  // namespace Details
}  // namespace KPool

#endif
