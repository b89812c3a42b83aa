#ifndef KPOOL_COMMON_DETAIL_LAUNCH_HPP
#define KPOOL_COMMON_DETAIL_LAUNCH_HPP

// Launch shapes. A team thread owns one work item at a time (a pool, a
// request, a decode row, a token row) and its vector lanes cover the
// channels. With device shapes (device_shapes: device backends, or any
// backend in a KPool_TEST_DEVICE_SHAPES build), lanes take 16-byte channel
// packets, a team thread takes one item and the team size is the device's
// choice for the functor; otherwise there is one lane (the compiler
// vectorizes the channel loop) and a team thread takes a run of items, so
// the league stays small. Every KPool kernel goes through launch() below.

#include <common/KPool_Exceptions.hpp>
#include <common/detail/KPool_KokkosExt.hpp>
#include <common/detail/KPool_Lanes.hpp>
#include <common/detail/KPool_Validate.hpp>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace KPool {
namespace Details {

// Channels one lane moves at once: 16 bytes with device shapes, else 1.
template <class ExecutionSpace, class T>
constexpr int packet_width() {
  return device_shapes<ExecutionSpace>::value ? static_cast<int>(16 / sizeof(T))
                                              : 1;
}

// Items each team thread takes in turn.
template <class ExecutionSpace>
constexpr int items_per_thread() {
  return device_shapes<ExecutionSpace>::value ? 1 : 16;
}

// Lanes per team thread: enough for a row's packets, at most the
// backend's lock-step group (a warp on CUDA, a wavefront on HIP).
template <class ExecutionSpace>
int vector_lanes(int channels_per_row) {
  if (!device_shapes<ExecutionSpace>::value) return 1;
  int const cap = KokkosExt::max_vector_lanes<ExecutionSpace>::value;
  int lanes = 1;
  while (lanes < channels_per_row && lanes < cap) lanes *= 2;
  return lanes;
}

// Threads a device block holds when Kokkos recommends nothing better; a
// host backend under device shapes takes as many of them as it allows.
constexpr int device_block_threads = 256;

// The largest power of two not above n (1 for n below 2). Kokkos before
// 3.7 aborts a CUDA team scan (a parallel_scan over a TeamThreadRange)
// whose team size is anything else, so every launch whose kernel scans
// over its team rounds its team size down through here, whatever
// Options::team_size asked for.
constexpr int power_of_two_floor(int n) {
  int p = 1;
  while (p <= n / 2) p *= 2;
  return p;
}

// A team size for f's launch: what Options::team_size asked (requested >
// 0), else the backend's recommendation (a device), a device block (device
// shapes) or one thread (a host); never above what the backend allows for
// f under its launch bounds (KokkosExt::BoundedTeamPolicy: the policy f
// launches with, so that the query compiles no kernel besides the
// launched one).
template <class ExecutionSpace, class Functor>
int team_size_for(ExecutionSpace const& space, Functor const& f, int lanes,
                  int requested) {
  KokkosExt::BoundedTeamPolicy<ExecutionSpace, Functor> const probe(space, 1, 1, lanes);
  int const max = probe.team_size_max(f, Kokkos::ParallelForTag());
  if (requested > 0) return std::max(1, std::min(requested, max));
  if constexpr (KokkosExt::is_device_backend<ExecutionSpace>::value) {
    return std::max(1, std::min(max, probe.team_size_recommended(f, Kokkos::ParallelForTag())));
  } else if constexpr (device_shapes<ExecutionSpace>::value) {
    return std::max(1, std::min(max, device_block_threads / lanes));
  } else {
    return 1;
  }
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

// Teams for `items` work items, items_per_team a team, counted in 64 bits.
// A league is an int and kernels index items as int, so every item index
// (teams * items_per_team, the last team's tail included) must stay below
// 2^31; past that the call throws, naming `argument`, instead of wrapping
// around and silently skipping work. Called before anything is launched.
inline int league_for(Checker const& chk, std::string const& argument,
                      std::uint64_t items, int items_per_team) {
  std::uint64_t const per = static_cast<std::uint64_t>(std::max(1, items_per_team));
  std::uint64_t const teams = items / per + (items % per != 0 ? 1 : 0);
  if (teams > 0x7FFFFFFFull / per)
    chk.fail(argument, "", -1, std::to_string(items),
             "is more work items (requests, pools or rows) than one launch "
             "takes (2^31 - 1)");
  return static_cast<int>(teams);
}

template <class ExecutionSpace>
std::size_t scratch_max(int level) {
  return static_cast<std::size_t>(
      KokkosExt::TeamPolicy<ExecutionSpace>::scratch_size_max(level));
}

// The level-0 (fast) team scratch a device-shaped launch must fit: the
// backend's own on a device (TeamPolicy::scratch_size_max(0)). Level 1 is
// never taken there: on CUDA it allocates device memory and fences, which
// also breaks graph capture. A host under device shapes
// (KPool_TEST_DEVICE_SHAPES) checks against 40,936 bytes, the least a GPU
// reports among the Kokkos releases KPool supports (Kokkos 4.6 on an H200;
// Kokkos 3.4 reports 40,960 for CUDA and HIP), so that it refuses and
// shrinks what a GPU would; its own level 0 is smaller, but a host's level
// 1 is the same memory and costs nothing.
constexpr std::size_t modeled_device_scratch0 = 40936;

template <class ExecutionSpace>
std::size_t device_scratch0() {
  if constexpr (KokkosExt::is_device_backend<ExecutionSpace>::value)
    return scratch_max<ExecutionSpace>(0);
  else
    return modeled_device_scratch0;
}

// A launch as planned before anything is queued.
struct LaunchShape {
  int league = 0;
  int team_size = 1;
  int lanes = 1;
  int items_per_team = 1;
  std::size_t scratch_bytes = 0;  // team scratch a team (cache writes, selection)
  int scratch_level = 0;          // where: 0 fast, 1 large
  // A host-only kernel (ScoreEngine::register_tiles), exempt from the
  // device scratch rule even under device shapes.
  bool host_only = false;
  // Level-1 scratch besides level 0's scratch_bytes (the fused decode
  // selection, whose scoring tiles take level 1 on a host).
  std::size_t level1_bytes = 0;
  // The kernel's layout is its team size (the tensor-core engine's warps,
  // register_tiles' one thread): a launch wrapping it keeps it.
  bool exact_team = false;
};

// The usual shape: `items` work items, items_per_team of them a team.
template <class ExecutionSpace, class Functor>
LaunchShape items_shape(Checker const& chk, std::string const& argument,
                        ExecutionSpace const& space, Functor const& f,
                        std::uint64_t items, int head_dim, int width,
                        int requested_team_size) {
  TeamShape const s =
      team_shape(space, f, head_dim, width, requested_team_size);
  LaunchShape l;
  l.league = league_for(chk, argument, items, s.items_per_team);
  l.team_size = s.team_size;
  l.lanes = s.lanes;
  l.items_per_team = s.items_per_team;
  return l;
}

// A CUDA driver (functor plus policy and launch bookkeeping, which add
// about 160 bytes) of 512 bytes or more launches through constant memory
// unless the policy says HintLightWeight: Kokkos then waits on the host for
// the previous such launch, and the launch cannot be captured in a CUDA
// graph. KPool's policies say HintLightWeight (every Kokkos from 3.4 on
// then passes drivers up to 4 KB as kernel arguments), and its functors
// hold Strided arrays and a few ints: at most 304 bytes for the steps
// without a cache, whose drivers stay under the line even for a Kokkos
// that ignored the hint, and 368 bytes for a step writing a pool cache
// (its 72-byte target), which relies on the hint. The bound checked here
// is the hard one: no functor reaches 512 bytes.
constexpr std::size_t max_functor_bytes = 512;

// Every KPool kernel launches here: on the caller's instance, with the
// light-weight hint, after the size check.
template <class ExecutionSpace, class Functor>
void launch(ExecutionSpace const& space, std::string const& label,
            LaunchShape const& shape, Functor const& f) {
  static_assert(sizeof(Functor) < max_functor_bytes,
                "KPool: a functor of 512 bytes or more launches through CUDA "
                "constant memory, which waits on the host; hold Strided "
                "arrays and a few ints, never copies of other functors");
  if constexpr (device_shapes<ExecutionSpace>::value) {
    // Never level-1 scratch on a device (device_scratch0): a kernel whose
    // team scratch could outgrow it is refused, or tiled, before this.
    if (!shape.host_only && shape.scratch_bytes > device_scratch0<ExecutionSpace>())
      throw std::logic_error("KPool: " + label + " asked for " +
                             std::to_string(shape.scratch_bytes) +
                             " bytes of team scratch, more than a device's fast (level-0) " +
                             std::to_string(device_scratch0<ExecutionSpace>()));
  }
  if (shape.league <= 0) return;
  KokkosExt::BoundedTeamPolicy<ExecutionSpace, Functor> policy(space, shape.league,
                                                               shape.team_size, shape.lanes);
  if (shape.scratch_bytes > 0)
    policy.set_scratch_size(shape.scratch_level,
                            Kokkos::PerTeam(shape.scratch_bytes));
  if (shape.level1_bytes > 0) policy.set_scratch_size(1, Kokkos::PerTeam(shape.level1_bytes));
#if defined(KPOOL_IMPL_CHECK_WIDE_COPIES)
  // Host backends run the kernel before parallel_for returns.
  KokkosExt::running_kernel() = label;
  Kokkos::parallel_for(label, policy, f);
  KokkosExt::running_kernel() = "(outside any KPool launch)";
#else
  Kokkos::parallel_for(label, policy, f);
#endif
}

// A flat launch, `n` work items of one index each, for the host-only
// engines' staging passes (ScoreEngine::blas): the same instance, hint and
// size check as launch().
template <class ExecutionSpace, class Functor>
void launch_range(ExecutionSpace const& space, std::string const& label,
                  std::size_t n, Functor const& f) {
  static_assert(sizeof(Functor) < max_functor_bytes,
                "KPool: a functor of 512 bytes or more launches through CUDA "
                "constant memory, which waits on the host; hold Strided "
                "arrays and a few ints, never copies of other functors");
  if (n == 0) return;
  Kokkos::parallel_for(
      label,
      Kokkos::RangePolicy<ExecutionSpace,
                          Kokkos::Experimental::WorkItemProperty::HintLightWeight_t>(
          space, 0, n),
      f);
}

// Launch of a work-item functor (one with an items_per_team member).
template <class ExecutionSpace, class Functor>
void launch_items(ExecutionSpace const& space, std::string const& label,
                  LaunchShape const& shape, Functor f) {
  f.items_per_team = shape.items_per_team;
  launch(space, label, shape, f);
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

/// The one alignment predicate of every ring access (ring_close, seed_tail,
/// tail_update and the steps): a ring row (slot, keys or gates, index)
/// starts at data() + slot * stride(0) + which * stride(1) + index *
/// stride(2), so the base and all three strides must keep 16 bytes for
/// packets to be read and written there.
template <class Tail>
bool ring_aligned(Tail const& tail) {
  using T = typename Tail::value_type;
  auto const keeps = [](std::size_t stride) { return stride * sizeof(T) % 16 == 0; };
  return reinterpret_cast<std::uintptr_t>(tail.data()) % 16 == 0 &&
         keeps(tail.stride(0)) && keeps(tail.stride(1)) && keeps(tail.stride(2));
}

}  // namespace Details
}  // namespace KPool

#endif
