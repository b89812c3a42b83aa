#ifndef KPOOL_SELECT_DETAIL_TOPK_FUSED_HPP
#define KPOOL_SELECT_DETAIL_TOPK_FUSED_HPP

// The fused decode selection (docs/indexer.md, "One launch for a decode
// selection"): the queries' preparation, the scoring engine's kernel and
// the top-k in one launch. Its league is the engine's: a group of query
// rows (rows_per_team of one request) is scored by `splits` virtual teams,
// each over its share of the group's pools; the tensor-core engine's
// launch is persistent (as many teams as are resident, each walking a
// contiguous share of the virtual teams a group's part at a time), the
// other engines' one team a virtual team. For each group's part, the team
// first helps prepare the group's queries, each (row, head) once
// (prepare_group); then it scores, writing its keys into the workspace as
// the engine alone does. Then it takes a ticket of its group for the
// splits it scored (a counter in the workspace, zero between launches):
// the team whose add completes the group knows that every split of the
// group has written its keys, and selects the group's rows with
// SelectFunctor's own code, one row after another, in the same team
// scratch (the scoring tiles' bytes are free by then; a persistent team
// restages them for its next part). The prepared
// queries, the keys and the selection are those of the separate launches
// (prepare, score, select), bit for bit.
//
// Memory order: a team barrier after the team's writes (its keys, its
// prepared queries), then one thread adds to the group's word with release
// and acquire ordering (KokkosExt::fetch_add_acq_rel: one instruction on
// CUDA, HIP and host compilers; a release by one thread after a barrier
// publishes the whole team's writes); a team that reads what others wrote
// does so after such an add or an acquire load, and a barrier (Kokkos'
// broadcast). No sequentially consistent fence is taken. No team waits at its
// ticket; the queries' wait (prepare_group) needs no forward-progress
// guarantee between teams either. The last team puts the group's words
// back to zero for the next launch.
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
#include <type_traits>

namespace KPool {
namespace Details {

// Whether a scoring functor walks persistent shares of its virtual teams
// (ScoreMmaFunctor: walk, tiles_of, score_part).
template <class F, class = void>
struct walks_team_shares : std::false_type {};
template <class F>
struct walks_team_shares<F, std::void_t<decltype(F::walks_shares)>>
    : std::integral_constant<bool, F::walks_shares> {};

// ScoreF, the engine's functor (its scoring inputs and team layout), and
// what the selection adds: the output, topk, the candidate buffer and the
// groups' tickets. A few words past the engine's functor.
template <class ExecutionSpace, class ScoreF, class Prepare, class Key, bool Expand,
          bool Staged>
struct FusedSelectFunctor : ScoreF {
  using member_type = typename ScoreF::member_type;
  // Not the scoring engine's launch bounds: this kernel holds both codes
  // (172-189 registers on CUDA), and a cap would spill them.
  using launch_bounds = Kokkos::LaunchBounds<>;
  using Select = SelectFunctor<ExecutionSpace, Key, Expand, Staged>;
  using scratch_space = typename ExecutionSpace::scratch_memory_space;

  Strided<std::int32_t, 2> out;
  int out_columns = 0;
  int topk = 0;
  int cap = 0;
  // The groups' words, zero between launches: [tickets][claims][prepared],
  // a word a group each (SelectWorkspace::fused_tickets).
  std::uint32_t* tickets = nullptr;
  std::uint32_t* claims = nullptr;
  std::uint32_t* prepared_count = nullptr;
  Key* out_keys = nullptr;  // a shard's keys (SelectTeamInputs)
  Prepare prepare{};        // the queries' preparation (PrepareQueriesFunctor)

  KOKKOS_INLINE_FUNCTION void operator()(member_type const& member) const {
    // The team's level-0 scratch as it stands before the scoring takes
    // its tiles: the queries' preparation and the selection take their
    // buffers from here, before and after the scoring.
    scratch_space const base = member.team_scratch(0);
    if constexpr (walks_team_shares<ScoreF>::value) {
      // A persistent launch (the tensor-core engine): the team walks its
      // share a group's part at a time, each part's splits counted at
      // once on the group's ticket; between parts the scoring restages
      // everything its scratch holds.
      auto const tiles = this->tiles_of(member);
      this->walk(member, [&](std::uint64_t group, int s0, int s1) {
        prepare_group(member, base, group);
        this->score_part(member, tiles, group, s0, s1);
        if (last_of_group(member, group, static_cast<std::uint32_t>(s1 - s0)))
          select_group(member, base, group);
      });
    } else {
      std::uint64_t const group =
          static_cast<std::uint64_t>(member.league_rank() / this->splits);
      prepare_group(member, base, group);
      ScoreF::operator()(member);
      if (last_of_group(member, group, 1u)) select_group(member, base, group);
    }
  }

  // The group's rows, selected by the team that completed its scoring.
  KOKKOS_INLINE_FUNCTION void select_group(member_type const& member, scratch_space const& base,
                                           std::uint64_t group) const {
    // No row of a fused call is split (fuse_decode_selection): the
    // selection's split fields keep their defaults.
    Select sel;
    static_cast<SelectTeamInputs<ExecutionSpace, Key>&>(sel) = SelectTeamInputs<ExecutionSpace, Key>{
        this->batch, this->keys, out, out_columns, topk};
    sel.out_keys = out_keys;
    sel.cap = cap;
    // The rows' histograms, where the scoring built them: every split's
    // counts were added before its team drew the group's ticket.
    sel.built_hist = this->row_hist;
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

  // The group's queries, every (row, head) prepared exactly once by the
  // group's own teams: a team claims the next unprepared one (an atomic
  // add on the group's claims word), prepares it with the whole team,
  // releases it (a barrier, then a release add to the group's prepared
  // word), and
  // claims again until none is left; then it waits until every claimed
  // one is prepared. A team waits only once all are claimed, and only for
  // teams that claimed them, which are running and wait for nothing
  // before they finish them: so the wait ends without any guarantee on
  // the order teams start in (the argument of a decoupled look-back), on
  // a device as on a host, whatever the league's schedule.
  KOKKOS_INLINE_FUNCTION void prepare_group(member_type const& member, scratch_space const& base,
                                            std::uint64_t group) const {
    std::uint64_t const rows = static_cast<std::uint64_t>(this->rows_per_team);
    std::uint64_t const t0 = this->batch.row_begin + group * rows;
    std::uint64_t const t1 = t0 + rows < this->batch.row_end ? t0 + rows : this->batch.row_end;
    std::uint32_t const items =
        static_cast<std::uint32_t>((t1 - t0) * static_cast<std::uint64_t>(this->heads));
    std::uint64_t const first = (t0 - this->batch.row_begin) * static_cast<std::uint64_t>(this->heads);
    for (;;) {
      std::uint32_t item = 0;
      Kokkos::single(
          Kokkos::PerTeam(member),
          [&](std::uint32_t& it) { it = Kokkos::atomic_fetch_add(&claims[group], 1u); }, item);
      if (item >= items) break;
      scratch_space const scratch = base;
      prepare.prepare(member, scratch, first + item);
      member.team_barrier();
      Kokkos::single(Kokkos::PerTeam(member), [&]() {
        KokkosExt::fetch_add_acq_rel(&prepared_count[group], 1u);
      });
    }
    // One thread waits (acquire loads); the broadcast of its result holds
    // the team until it has seen the count.
    int ready = 0;
    Kokkos::single(
        Kokkos::PerTeam(member),
        [&](int& r) {
          while (KokkosExt::load_acquire(&prepared_count[group]) < items) {
          }
          r = 1;
        },
        ready);
    (void)ready;
  }

  // Whether this team, having scored `count` splits of the group, is the
  // last of the group to finish scoring (the group's keys are then all
  // written and visible to it).
  KOKKOS_INLINE_FUNCTION bool last_of_group(member_type const& member, std::uint64_t group,
                                            std::uint32_t count) const {
    // Every split has drawn: no team of this launch touches the group's
    // words again.
    return team_ticket(member, &tickets[group], count,
                       static_cast<std::uint64_t>(this->splits), [&]() {
                         claims[group] = 0;
                         prepared_count[group] = 0;
                       });
  }
};

// The launcher LaunchScore stands for in a fused decode selection: it
// wraps the engine's functor, takes the larger of the two scratch needs at
// level 0 (or the scoring's level 1 beside the selection's level 0 on a
// host), a power-of-two team within what the wrapped kernel allows, and
// launches once, labelled after the engine ("...::score_tiles+select").
template <class ExecutionSpace, class Prepare, class Key, bool Expand>
struct FuseScoreSelect {
  ExecutionSpace space;
  Strided<std::int32_t, 2> out;
  int out_columns = 0;
  int topk = 0;
  SelectPlan plan;  // staged or fast (fuse_decode_selection)
  std::uint32_t* tickets = nullptr;  // 3 x max_tokens words (SelectWorkspace::fused_tickets)
  std::size_t groups_capacity = 0;   // max_tokens: the words a kind
  Key* out_keys = nullptr;
  Prepare prepare{};
  static constexpr bool power_of_two_team = true;
  // The tensor-core engine's teams are persistent here too, as many as
  // are resident: this kernel has no launch bounds, so at most 255
  // registers a thread (2 teams of 4 warps an SM).
  static constexpr bool persistent = true;
  static constexpr int register_cap = 255;

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
    FusedSelectFunctor<ExecutionSpace, F, Prepare, Key, Expand, Staged> g;
    static_cast<F&>(g) = f;
    g.out = out;
    g.out_columns = out_columns;
    g.topk = topk;
    g.cap = plan.cap;
    g.tickets = tickets;
    g.claims = tickets + groups_capacity;
    g.prepared_count = tickets + 2 * groups_capacity;
    g.out_keys = out_keys;
    g.prepare = prepare;
    // The preparation zeroes only the histograms the scoring builds (its
    // launcher may decline them: f.row_hist null).
    g.prepare.row_hist = f.row_hist;
    std::size_t const level0 =
        std::max(plan.scratch_bytes, Prepare::scratch_bytes(prepare.head_dim));
    if (shape.scratch_level == 0) {
      shape.scratch_bytes = std::max(shape.scratch_bytes, level0);
    } else {
      shape.level1_bytes = shape.scratch_bytes;
      shape.scratch_level = 0;
      shape.scratch_bytes = level0;
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
