#ifndef KPOOL_DETAILS_TOPK_FUSED_HPP
#define KPOOL_DETAILS_TOPK_FUSED_HPP

// The fused decode selection (docs/indexer.md, "One launch for a decode
// selection"): the scoring engine's kernel and the top-k in one launch.
// Its league is the engine's: a group of query rows (rows_per_team of one
// request) is scored by `splits` teams, each over its share of the group's
// pools, writing their keys into the workspace as the engine alone does.
// Then each team takes a ticket of its group (a counter in the workspace,
// zero between launches): the team that draws the last one knows that
// every split of the group has written its keys, and selects the group's
// rows with SelectFunctor's own code, one row after another, in the same
// team scratch (the scoring tiles' bytes are free by then). The keys and
// the selection are those of the two launches, bit for bit.
//
// Memory order: every thread of a team fences after writing its keys
// (release), then one thread takes the ticket (an atomic add); the last
// team fences again before it reads (acquire). No team ever waits for
// another, so the kernel needs no forward-progress guarantee between
// teams. The last team puts the counter back to zero for the next launch.
//
// The selection's team scans need a power-of-two team size on CUDA before
// Kokkos 3.7: the launch takes one (FuseScoreSelect).

#include <common/detail/KPool_KokkosExt.hpp>
#include <common/detail/KPool_Launch.hpp>
#include <common/detail/KPool_Strided.hpp>
#include <select/detail/KPool_TopkCore.hpp>
#include <select/detail/KPool_TopkTeam.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace KPool {
namespace Details {

// ScoreF, the engine's functor (its scoring inputs and team layout), and
// what the selection adds: the output, topk, the candidate buffer and the
// groups' tickets. A few words past the engine's functor.
template <class ExecutionSpace, class ScoreF, class Key, bool Expand, bool Staged>
struct FusedSelectFunctor : ScoreF {
  using member_type = typename ScoreF::member_type;
  using Select = SelectFunctor<ExecutionSpace, Key, Expand, Staged>;
  using scratch_space = typename ExecutionSpace::scratch_memory_space;

  Strided<std::int32_t, 2> out;
  int out_columns = 0;
  int topk = 0;
  int cap = 0;
  std::uint32_t* tickets = nullptr;  // [groups], zero between launches
  Key* out_keys = nullptr;           // a shard's keys (SelectTeamInputs)

  KOKKOS_INLINE_FUNCTION void operator()(member_type const& member) const {
    // The team's level-0 scratch as it stands before the scoring takes
    // its tiles: the selection takes its buffers from here afterwards.
    scratch_space const base = member.team_scratch(0);
    ScoreF::operator()(member);
    std::uint64_t const group = static_cast<std::uint64_t>(member.league_rank() / this->splits);
    if (!last_of_group(member, group)) return;
    // No row of a fused call is split (fuse_decode_selection): the
    // selection's split fields keep their defaults.
    Select sel;
    static_cast<SelectTeamInputs<ExecutionSpace, Key>&>(sel) = SelectTeamInputs<ExecutionSpace, Key>{
        this->batch, this->keys, out, out_columns, topk};
    sel.out_keys = out_keys;
    sel.cap = cap;
    for (int j = 0; j < this->rows_per_team; ++j) {
      SelectRow r{};
      std::uint64_t const i = group * static_cast<std::uint64_t>(this->rows_per_team) +
                              static_cast<std::uint64_t>(j);
      if (!r.find<ExecutionSpace>(member, this->batch, i)) continue;
      scratch_space const scratch = base;  // each row's buffers from the start
      sel.select_row(member, scratch, r);
      member.team_barrier();  // the next row reuses the buffers
    }
  }

  // Whether this team is the last of its group to finish scoring (the
  // group's keys are then all written and visible to it).
  KOKKOS_INLINE_FUNCTION bool last_of_group(member_type const& member,
                                            std::uint64_t group) const {
    Kokkos::memory_fence();
    member.team_barrier();
    int last = 0;
    Kokkos::single(
        Kokkos::PerTeam(member),
        [&](int& l) {
          std::uint32_t const drawn = Kokkos::atomic_fetch_add(&tickets[group], 1u);
          l = drawn + 1 == static_cast<std::uint32_t>(this->splits) ? 1 : 0;
          // Every split has drawn: no team of this launch touches it again.
          if (l) tickets[group] = 0;
        },
        last);
    if (last) Kokkos::memory_fence();
    return last != 0;
  }
};

// The launcher LaunchScore stands for in a fused decode selection: it
// wraps the engine's functor, takes the larger of the two scratch needs at
// level 0 (or the scoring's level 1 beside the selection's level 0 on a
// host), a power-of-two team within what the wrapped kernel allows, and
// launches once, labelled after the engine ("...::score_tiles+select").
template <class ExecutionSpace, class Key, bool Expand>
struct FuseScoreSelect {
  ExecutionSpace space;
  Strided<std::int32_t, 2> out;
  int out_columns = 0;
  int topk = 0;
  SelectPlan plan;  // staged or fast (fuse_decode_selection)
  std::uint32_t* tickets = nullptr;
  Key* out_keys = nullptr;
  static constexpr bool power_of_two_team = true;

  template <class F>
  void operator()(std::string const& label, LaunchShape const& shape, F const& f) const {
    // A staged plan exists only with device shapes.
    if constexpr (device_shapes<ExecutionSpace>::value) {
      if (plan.kernel == SelectKernel::staged) {
        go<true>(label, shape, f);
        return;
      }
    }
    go<false>(label, shape, f);
  }

  template <bool Staged, class F>
  void go(std::string const& label, LaunchShape shape, F const& f) const {
    FusedSelectFunctor<ExecutionSpace, F, Key, Expand, Staged> g;
    static_cast<F&>(g) = f;
    g.out = out;
    g.out_columns = out_columns;
    g.topk = topk;
    g.cap = plan.cap;
    g.tickets = tickets;
    g.out_keys = out_keys;
    if (shape.scratch_level == 0) {
      shape.scratch_bytes = std::max(shape.scratch_bytes, plan.scratch_bytes);
    } else {
      shape.level1_bytes = shape.scratch_bytes;
      shape.scratch_level = 0;
      shape.scratch_bytes = plan.scratch_bytes;
    }
    // The engine's team, as far as the fused kernel allows it.
    int const fits =
        std::min(team_size_for(space, g, shape.lanes, shape.team_size), max_select_team);
    if (!shape.exact_team)
      shape.team_size = power_of_two_floor(fits);
    else if (fits < shape.team_size)
      throw std::logic_error("KPool: " + label + "+select needs teams of " +
                             std::to_string(shape.team_size) + " threads; the backend allows " +
                             std::to_string(fits) + " for the fused kernel");
    launch(space, label + "+select", shape, g);
  }
};

}  // namespace Details
}  // namespace KPool

#endif
