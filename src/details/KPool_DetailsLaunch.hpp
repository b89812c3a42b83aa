#ifndef KPOOL_DETAILS_LAUNCH_HPP
#define KPOOL_DETAILS_LAUNCH_HPP

// Launch shapes. A team thread owns one work item at a time (a pool, a
// request, a decode row, a token row) and its vector lanes cover the
// channels. On a device, lanes take 16-byte channel packets and Kokkos
// picks the team size for the functor; on a host there is one lane (the
// compiler vectorizes the channel loop) and a team thread takes a run of
// items, so the league stays small.

#include <details/KPool_DetailsKokkosExt.hpp>
#include <details/KPool_DetailsPool.hpp>

#include <algorithm>
#include <cstdint>
#include <string>

namespace KPool {
namespace Details {

// Channels one lane moves at once: 16 bytes on a device, 1 on a host.
template <class ExecutionSpace, class T>
constexpr int packet_width() {
  return KokkosExt::is_device_space<ExecutionSpace>::value
             ? static_cast<int>(16 / sizeof(T))
             : 1;
}

// Items each team thread takes in turn.
template <class ExecutionSpace>
constexpr int items_per_thread() {
  return KokkosExt::is_device_space<ExecutionSpace>::value ? 1 : 16;
}

template <class ExecutionSpace>
int vector_lanes(int channels_per_row) {
  if (!KokkosExt::is_device_space<ExecutionSpace>::value) return 1;
  int lanes = 1;
  while (lanes < channels_per_row && lanes < 32) lanes *= 2;
  return lanes;
}

template <class ExecutionSpace, class Functor>
int team_size_for(ExecutionSpace const& space, Functor const& f, int lanes,
                  int requested) {
  Kokkos::TeamPolicy<ExecutionSpace> const probe(space, 1, 1, lanes);
  int const max = probe.team_size_max(f, Kokkos::ParallelForTag());
  if (requested > 0) return std::max(1, std::min(requested, max));
  if (KokkosExt::is_device_space<ExecutionSpace>::value)
    return std::max(1, probe.team_size_recommended(f, Kokkos::ParallelForTag()));
  return 1;
}

struct TeamShape {
  int lanes;
  int team_size;
  int items_per_team;
};

// Team size and lanes for a functor whose rows have `head_dim` channels,
// read `width` at a time.
template <class ExecutionSpace, class Functor>
TeamShape team_shape(ExecutionSpace const& space, Functor const& f,
                     int head_dim, int width, int requested_team_size) {
  TeamShape s;
  s.lanes = vector_lanes<ExecutionSpace>((head_dim + width - 1) / width);
  s.team_size = team_size_for(space, f, s.lanes, requested_team_size);
  s.items_per_team = s.team_size * items_per_thread<ExecutionSpace>();
  return s;
}

inline int league_for(std::uint64_t items, int items_per_team) {
  return static_cast<int>((items + items_per_team - 1) / items_per_team);
}

// The usual launch: `items` work items, items_per_team of them a team.
// The functor reads its items_per_team member.
template <class ExecutionSpace, class Functor>
void launch_items(ExecutionSpace const& space, std::string const& label,
                  Functor f, std::uint64_t items, int head_dim, int width,
                  int requested_team_size) {
  if (items == 0) return;
  TeamShape const s =
      team_shape(space, f, head_dim, width, requested_team_size);
  f.items_per_team = s.items_per_team;
  Kokkos::parallel_for(
      label,
      Kokkos::TeamPolicy<ExecutionSpace>(
          space, league_for(items, s.items_per_team), s.team_size, s.lanes),
      f);
}

// Runs f(Path<...>{}) with the kernel variant for this call's shape:
// K=4, D=128 at compile time when the views are contiguous, 16-byte channel
// packets on devices when every row start is 16-byte aligned.
template <class ExecutionSpace, class T, class F>
void dispatch_path(int kpool, int head_dim, bool contiguous, bool aligned,
                   F&& f) {
  constexpr int W = packet_width<ExecutionSpace, T>();
  bool const fast = kpool == 4 && head_dim == 128;
  if (!contiguous) {
    f(Path<0, 0, 1, false>{});
  } else if (W > 1 && aligned && head_dim % W == 0) {
    if (fast)
      f(Path<4, 128, W, true>{});
    else
      f(Path<0, 0, W, true>{});
  } else {
    if (fast)
      f(Path<4, 128, 1, true>{});
    else
      f(Path<0, 0, 1, true>{});
  }
}

// Whether a base pointer and a row stride (in elements) keep every row
// start aligned to `bytes`.
template <class T>
bool rows_aligned(T const* p, std::size_t row_stride, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0 &&
         (row_stride * sizeof(T)) % bytes == 0;
}

}  // namespace Details
}  // namespace KPool

#endif
