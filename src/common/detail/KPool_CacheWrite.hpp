#ifndef KPOOL_COMMON_DETAIL_CACHE_WRITE_HPP
#define KPOOL_COMMON_DETAIL_CACHE_WRITE_HPP

// The pool cache's device side (docs/indexer.md, "The pool cache"): the one
// quantizer every cache write goes through, cached = Q(R(x)), and the team
// scratch it works in.
//
// A team writes its pools in three phases, every team thread taking part
// in each (team-uniform control flow, so every barrier is reached by all):
//
//   1. staging: inside the caller's TeamThreadRange, the thread that made
//      pool i copies it (as stored in T, converted to A) into scratch row
//      `slot` and records its cache entry, or marks the slot empty
//      (cache_stage_row / cache_stage_value + cache_stage_target /
//      cache_stage_skip). The steps stage from the registers their pooling
//      loop rounds the pool in (thread_vector_pool's stage, CacheStage),
//      through team_items and its hooks; store_pools from its input rows;
//   2. rotation (rotated caches): the Walsh-Hadamard butterflies run on the
//      scratch rows. On a device, one stage h at a time with a team
//      barrier between stages, lanes taking pairs (i, i + h): values cross
//      lanes and threads only through scratch, ordered by the barriers. On
//      a host, where a thread's lanes run in turn, one thread transforms a
//      whole row (in vector registers where GCC's vector extensions exist)
//      and a single barrier follows;
//   3. quantization: per slot, a vector-lane max gives amax, then each lane
//      writes its channels' E4M3 (or native) values and one lane the scale.
//
// Phases 2 and 3 are cache_team_write. A step without a cache (NoCache)
// has none of this: team_items is then the plain TeamThreadRange. The arithmetic follows docs/indexer.md's
// order exactly (butterflies in f32, f64 for f64 pools, then the multiply
// by the nearest value to 1/sqrt(D), then the f32 division by the scale),
// so every backend and every writer stores the same bytes, and a rotated
// pool does not depend on which team thread or lane did which pair.
//
// NaN is stored as the positive quiet NaN of C (0x7F in fp8): IEEE leaves a
// NaN result's sign to the hardware (x86 keeps an operand's, CUDA returns a
// canonical NaN), and the cache must hold the same bytes everywhere.

#include <common/detail/KPool_CacheQuantize.hpp>
#include <common/detail/KPool_CacheStaging.hpp>
#include <common/detail/KPool_CacheTarget.hpp>
#include <common/detail/KPool_Lanes.hpp>
#include <common/detail/KPool_Views.hpp>

#include <cstdint>
#include <string>
#include <type_traits>

namespace KPool {
namespace Details {

// --- The steps' cache writes --------------------------------------------

// A step without a cache: its functors compile to what they were before
// caches existed (no scratch, no barrier, nothing staged).
struct NoCache {
  static constexpr bool enabled = false;
  using arithmetic_type = void;
};

// thread_vector_pool's stage for a cache write: channel c of the pool, as
// rounded into T, converted to A, into the slot's scratch row.
template <class Row>
struct CacheStage {
  Row row;
  template <class T>
  KOKKOS_FORCEINLINE_FUNCTION void operator()(int c, T const& v) const {
    row[c] = to_accumulator(v);
  }
  template <class Member, class T>
  KOKKOS_FORCEINLINE_FUNCTION void finish(Member const&, T const*,
                                          std::ptrdiff_t) const {}
};

// What a writer's item function gets to route the pools it makes into the
// cache. open(member, r, pool, k) records where the item's k-th pool goes
// (pool `pool` of batch row r) and returns the stage to pool it with;
// holds(k) says whether the item has a k-th slot. NoCacheHook: no cache.
struct NoCacheHook {
  static constexpr bool enabled = false;
  KOKKOS_FORCEINLINE_FUNCTION bool holds(int) const { return false; }
  template <class Member>
  KOKKOS_FORCEINLINE_FUNCTION NoStage open(Member const&, int, std::int64_t,
                                           int = 0) const {
    return NoStage();
  }
};

// A host's hook for pools written at once (no device shapes: a team
// thread's lanes run in turn, so nothing needs a barrier): the stage does
// nothing per channel, and finish reads the completed pool back from the
// output row just written (still in the core's L1 cache) and writes it
// (cache_write_row). `row` is the thread's D-value buffer. Nothing is held
// per pool, so an item may write any number (holds is always true: a
// decode row whose positions are not consecutive, possible only without
// validation, caches every pool it makes, where a device caches as many as
// it has slots).
template <class ExecutionSpace, class Target>
struct DirectCacheStage {
  using A = typename Target::arithmetic_type;
  Target const* target;
  CacheSlot where;
  A* row;

  template <class T>
  KOKKOS_FORCEINLINE_FUNCTION void operator()(int, T const&) const {}
  template <class Member, class T>
  KOKKOS_INLINE_FUNCTION void finish(Member const& member, T const* out,
                                     std::ptrdiff_t out_c) const {
    if (where.block >= 0)
      cache_write_row<ExecutionSpace>(member, *target, where, out, out_c, row);
  }
};

template <class ExecutionSpace, class Target>
struct DirectCacheHook {
  static constexpr bool enabled = true;
  using A = typename Target::arithmetic_type;

  Target const* target;
  A* row;

  KOKKOS_FORCEINLINE_FUNCTION bool holds(int) const { return true; }
  template <class Member>
  KOKKOS_INLINE_FUNCTION DirectCacheStage<ExecutionSpace, Target> open(
      Member const&, int r, std::int64_t pool, int = 0) const {
    return DirectCacheStage<ExecutionSpace, Target>{target,
                                                    target->locate(r, pool), row};
  }
};

/// How a host writes a step's pools (measured on x86 hosts;
/// docs/performance.md, "Writing the pool cache"; both store the same bytes): f32 pools of a
/// step's prefill and continuation items are staged from the pooling
/// loop's registers into scratch slots, as on a device, and each thread
/// writes its items' slots after them (cache_write_staged); 16-bit pools,
/// whose staging slows the pooling loop by about 40%, and decode items,
/// which make one pool or none, are written at once (DirectCacheHook).
/// T is the pools' storage type, void for a decode step.
/// (A trait rather than a constexpr function: device code may read it.)
template <class ExecutionSpace, class T, class A>
struct host_stages_cache
    : std::integral_constant<bool, !device_shapes<ExecutionSpace>::value &&
                                       std::is_same<T, float>::value &&
                                       std::is_same<A, float>::value> {};

template <class ExecutionSpace, class Target>
struct TeamCacheHook {
  static constexpr bool enabled = true;
  using A = typename Target::arithmetic_type;

  CacheScratch<ExecutionSpace, A> const* scratch;
  Target const* target;
  int first;  // the item's first slot
  int slots;  // slots an item has

  KOKKOS_FORCEINLINE_FUNCTION bool holds(int k) const { return k < slots; }
  template <class Member>
  KOKKOS_INLINE_FUNCTION CacheStage<typename CacheScratch<ExecutionSpace, A>::row_type> open(
      Member const& member, int r,
                                            std::int64_t pool, int k = 0) const {
    cache_stage_target(member, *scratch, first + k, target->locate(r, pool));
    return {scratch->row(first + k)};
  }
};

/// The team loop of every step functor: body(i, hook) for each item i in
/// [0, items), over the team's threads, T the pools' storage type (void
/// for a decode step). With a cache, on a device or staged on a host
/// (host_stages_cache), each item owns `per_item` scratch slots, marked
/// empty before its body runs, and the team writes every staged pool after
/// the loop (cache_team_write); the loop body holds no barrier and the
/// write phase is team-uniform, so every team thread reaches every barrier
/// however many pools its items made. Otherwise, on a host, each pool is
/// written as soon as it is made (DirectCacheHook), each team thread with
/// one scratch row. Without a cache it is the plain TeamThreadRange.
template <class ExecutionSpace, class T, class Cache, class Member, class Body>
KOKKOS_INLINE_FUNCTION void team_items(Member const& member,
                                       Cache const& cache, int items,
                                       int per_item, Body const& body) {
  if constexpr (Cache::enabled && !device_shapes<ExecutionSpace>::value &&
                !host_stages_cache<ExecutionSpace, T,
                                   typename Cache::arithmetic_type>::value) {
    using A = typename Cache::arithmetic_type;
    CacheScratch<ExecutionSpace, A> const s(member, member.team_size(),
                                            cache.head_dim());
    (void)per_item;
    DirectCacheHook<ExecutionSpace, Cache> const hook{
        &cache, s.host_row(member.team_rank())};
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, items),
                         [&](int i) { body(i, hook); });
  } else if constexpr (Cache::enabled) {
    using A = typename Cache::arithmetic_type;
    CacheScratch<ExecutionSpace, A> const s(member, items * per_item,
                                            cache.head_dim());
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, items), [&](int i) {
      TeamCacheHook<ExecutionSpace, Cache> const hook{&s, &cache,
                                                      i * per_item, per_item};
      KokkosExt::single_per_thread(member, [&]() {
        for (int k = 0; k < per_item; ++k) s.dest(i * per_item + k, 0) = -1;
      });
      body(i, hook);
    });
    cache_team_write<ExecutionSpace>(member, s, cache);
  } else {
    (void)cache;
    (void)per_item;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, items),
                         [&](int i) { body(i, NoCacheHook()); });
  }
}

// --- Launch ---------------------------------------------------------------

// Level-0 scratch one team of an ExecutionSpace launch may take.
template <class ExecutionSpace>
std::size_t team_scratch_max(ExecutionSpace const& space, int team_size,
                             int lanes) {
  KokkosExt::TeamPolicy<ExecutionSpace> const probe(space, 1, team_size, lanes);
  return static_cast<std::size_t>(probe.scratch_size_max(0));
}

// The team shape of a launch whose team holds `slots_per_item` scratch
// slots per work item: team threads and items per team capped so that the
// team's scratch fits level 0. `width` channels a lane, as team_shape.
template <class ExecutionSpace, class A, class Functor>
TeamShape cache_team_shape(ExecutionSpace const& space, Functor const& f,
                           int head_dim, int width, int slots_per_item,
                           int requested_team_size) {
  TeamShape s = team_shape(space, f, head_dim, width, requested_team_size);
  std::size_t const max = team_scratch_max(space, s.team_size, s.lanes);
  int const per = std::max(slots_per_item, 1);
  int const wanted = s.items_per_team * per;
  int const fit = cache_slots_fitting<ExecutionSpace, A>(max, head_dim, wanted) / per;
  if (fit < s.items_per_team) {
    int const per_thread = items_per_thread<ExecutionSpace>();
    s.team_size = std::max(1, std::min(s.team_size, fit / per_thread));
    s.items_per_team = std::max(1, std::min(s.team_size * per_thread, fit));
  }
  return s;
}

// Whether `slots` pools of D channels fit a team's level-0 scratch at all.
template <class ExecutionSpace, class A>
bool cache_scratch_fits(ExecutionSpace const& space, int head_dim, int slots = 1,
                        std::size_t* max_bytes = nullptr) {
  std::size_t const max = team_scratch_max(space, 1, 1);
  if (max_bytes) *max_bytes = max;
  return CacheScratch<ExecutionSpace, A>::bytes(slots, head_dim) <= max;
}

// A launch of `items` work items whose teams hold `slots_per_item` scratch
// slots per item (the functor reads its items_per_team member). Planned,
// and its size checked, before anything is queued.
template <class ExecutionSpace, class A, class Functor>
LaunchShape cache_items_shape(Checker const& chk, std::string const& argument,
                              ExecutionSpace const& space, Functor const& f,
                              std::uint64_t items, int head_dim, int width,
                              int slots_per_item, int requested_team_size) {
  TeamShape const s = cache_team_shape<ExecutionSpace, A>(
      space, f, head_dim, width, slots_per_item, requested_team_size);
  LaunchShape l;
  l.league = league_for(chk, argument, items, s.items_per_team);
  l.team_size = s.team_size;
  l.lanes = s.lanes;
  l.items_per_team = s.items_per_team;
  l.scratch_bytes = CacheScratch<ExecutionSpace, A>::bytes(
      s.items_per_team * std::max(slots_per_item, 1), head_dim);
  return l;
}

}  // namespace Details
}  // namespace KPool

#endif
