#ifndef KPOOL_STEP_HPP
#define KPOOL_STEP_HPP

#include <cache/KPool_PoolCache.hpp>
#include <common/KPool_Float8.hpp>
#include <common/KPool_Options.hpp>
#include <common/KPool_Types.hpp>
#include <pool/KPool_Ring.hpp>
#include <pool/KPool_TailUpdate.hpp>
#include <cache/detail/KPool_CacheFunctors.hpp>
#include <cache/detail/KPool_CachePath.hpp>
#include <cache/detail/KPool_CacheWrite.hpp>
#include <pool/detail/KPool_Call.hpp>
#include <pool/detail/KPool_CompressFunctor.hpp>
#include <pool/detail/KPool_FusedStepFunctor.hpp>
#include <pool/detail/KPool_OffsetsFunctor.hpp>
#include <pool/detail/KPool_RingCloseFunctor.hpp>
#include <pool/detail/KPool_SeedTailFunctor.hpp>
#include <pool/detail/KPool_TailUpdateFunctor.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace KPool {

/// What StepOutput::to_host copies besides the count and the offsets.
enum class StepOutputParts {
  /// batch_row and pool_id of rows [0, count).
  ids,
  /// batch_row, pool_id and the pooled keys of rows [0, count) (count * D
  /// values: the large part).
  ids_and_pooled
};

/// A host copy of the last call's part of a StepOutput (StepOutput::to_host):
/// plain host views, sized for that call.
/// @tparam T the storage type of the pooled keys.
template <class T>
struct HostStepOutput {
  /// How many pools the call closed.
  std::uint32_t count = 0;
  /// [B + 1]: request r's rows are [offsets(r), offsets(r + 1)).
  Kokkos::View<std::uint32_t*, Kokkos::HostSpace> offsets;
  /// [count]: the request index of each row.
  Kokkos::View<std::int32_t*, Kokkos::HostSpace> batch_row;
  /// [count]: each row's pool id j (positions [jK, jK + K)).
  Kokkos::View<std::int32_t*, Kokkos::HostSpace> pool_id;
  /// [count, D] with StepOutputParts::ids_and_pooled, else empty.
  Kokkos::View<T**, Kokkos::LayoutRight, Kokkos::HostSpace> pooled;
  /// @return B, the batch size of the call.
  int batch_size() const { return static_cast<int>(offsets.extent(0)) - 1; }
};

/// Every pool a step closed, compacted on the device (docs/writers.md,
/// "Reading a StepOutput"). Allocate once, at the largest call you will
/// make, and reuse: the steps allocate nothing. One StepOutput serves both
/// KPool::step and KPool::decode_step.
///
/// After a step with batch size B: rows [0, count) hold the pools; request
/// r's are rows [offsets(r), offsets(r + 1)), in pool order (for step, its
/// ring_close pool first); batch_row(i) is the request index r of row i
/// (the batch row of that call, not the slot); pool_id(i) the pool's id j,
/// covering positions [jK, jK + K) of its sequence. count is offsets(B), on
/// the device: nothing waits for the host. To read it on the host, to_host()
/// copies the count, the offsets and the rows in one call (or deep_copy a
/// view to a host mirror; either waits for the step). Each call
/// overwrites rows [0, count), offsets [0, B] and the count; later rows
/// keep earlier calls' values.
///
/// @tparam T the storage type of the pooled keys (that of the ring).
/// @tparam MemorySpace where the output lives: the memory space of the
/// execution space the steps run on.
template <class T, class MemorySpace =
                       Kokkos::DefaultExecutionSpace::memory_space>
class StepOutput {
 public:
  /// The pooled keys' view, [capacity, D], LayoutRight.
  using pooled_type = Kokkos::View<T**, Kokkos::LayoutRight, MemorySpace>;
  /// batch_row() and pool_id(): [capacity], int32.
  using index_type = Kokkos::View<std::int32_t*, MemorySpace>;
  /// offsets(): [max_batch + 1], uint32.
  using offsets_type = Kokkos::View<std::uint32_t*, MemorySpace>;
  /// count(): a rank-0 view into offsets().
  using count_type = Kokkos::Subview<offsets_type, std::size_t>;

  /// Rows a call can need, known without reading device data:
  /// floor(total_tokens / K) + batch. A call's pools are either made of its
  /// own rows only (at most floor(total_tokens / K) of them) or a
  /// request's ring_close pool (at most one per request).
  ///
  /// For KPool::step, pass the most token rows a call carries
  /// (key.extent(0)); a call needs floor(key rows / K) + num_requests rows.
  /// For KPool::decode_step, pass B * next_n (the entries of positions,
  /// padding included); a call needs num_requests * ceil(next_n / K) rows,
  /// never more than this. One StepOutput serves both kinds when sized for
  /// the larger.
  /// @param total_tokens the most token rows (or decode entries) of a call.
  /// @param batch the largest batch size B.
  /// @param kpool K, tokens per pool.
  /// @return the row capacity to construct the StepOutput with.
  static std::size_t capacity_for(std::size_t total_tokens, int batch,
                                  int kpool) {
    return total_tokens / static_cast<std::size_t>(kpool) +
           static_cast<std::size_t>(batch);
  }

  /// An empty output, to assign a constructed one to later; the steps
  /// reject it.
  StepOutput() = default;

  /// Allocates the output on `space` (labelled "KPool::StepOutput::pooled",
  /// "::batch_row", "::pool_id", "::offsets"); offsets is zero-filled, the
  /// rest left uninitialized.
  /// @tparam ExecutionSpace a Kokkos execution space whose memory space is
  /// MemorySpace.
  /// @param space the instance the allocations are queued on.
  /// @param capacity rows of pooled keys, e.g. capacity_for(...).
  /// @param max_batch the largest batch size B of a call.
  /// @param head_dim D, channels of a key.
  template <class ExecutionSpace>
  StepOutput(ExecutionSpace const& space, std::size_t capacity, int max_batch,
             int head_dim)
      : pooled_(Kokkos::view_alloc(space, Kokkos::WithoutInitializing,
                                   "KPool::StepOutput::pooled"),
                capacity, head_dim),
        batch_row_(Kokkos::view_alloc(space, Kokkos::WithoutInitializing,
                                      "KPool::StepOutput::batch_row"),
                   capacity),
        pool_id_(Kokkos::view_alloc(space, Kokkos::WithoutInitializing,
                                    "KPool::StepOutput::pool_id"),
                 capacity),
        offsets_(Kokkos::view_alloc(space, "KPool::StepOutput::offsets"),
                 static_cast<std::size_t>(max_batch) + 1),
        count_(Kokkos::subview(offsets_, std::size_t(0))) {}

  /// The pooled keys, in the storage type.
  /// @return [capacity, D]; rows [0, count) belong to the last call.
  pooled_type const& pooled() const { return pooled_; }
  /// The request each pool came from.
  /// @return [capacity]: batch_row()(i) is the request index r (the batch
  /// row of the last call) of row i.
  index_type const& batch_row() const { return batch_row_; }
  /// Each pool's id in its sequence.
  /// @return [capacity]: pool j covers positions [jK, jK + K).
  index_type const& pool_id() const { return pool_id_; }
  /// Where each request's pools start.
  /// @return [max_batch + 1]; entries [0, B] belong to the last call, whose
  /// request r has rows [offsets(r), offsets(r + 1)).
  offsets_type const& offsets() const { return offsets_; }
  /// How many pools the last call closed, on the device: offsets(B).
  /// @return a rank-0 view; read it with Kokkos::deep_copy(host_value, count()).
  count_type const& count() const { return count_; }

  /// @return the rows of pooled().
  std::size_t capacity() const { return pooled_.extent(0); }
  /// @return the largest batch a call may have; -1 for an empty output.
  int max_batch() const { return static_cast<int>(offsets_.extent(0)) - 1; }
  /// @return D, channels of a key.
  int head_dim() const { return static_cast<int>(pooled_.extent(1)); }
  /// @return B of the last call (0 before the first).
  int batch_size() const { return batch_; }

  /// The last call's results on the host, in one call: the count, the
  /// offsets [0, B] and rows [0, count) of batch_row and pool_id, and with
  /// StepOutputParts::ids_and_pooled the pooled keys too. Queues the copies
  /// on `space` after the step and waits for them (two fences: the count
  /// sizes the rest). Allocates the host views (labelled
  /// "KPool::StepOutput::host_*"): for reading results, not for the hot
  /// path of a serving loop.
  /// @param space the instance the step ran on.
  /// @param parts what to copy besides the count and the offsets.
  /// @return a HostStepOutput of the last call (count 0 before the first).
  template <class ExecutionSpace>
  HostStepOutput<T> to_host(ExecutionSpace const& space,
                            StepOutputParts parts = StepOutputParts::ids) const {
    using Kokkos::HostSpace;
    HostStepOutput<T> h;
    std::size_t const B = static_cast<std::size_t>(batch_);
    if (offsets_.extent(0) == 0) return h;
    h.offsets = Kokkos::View<std::uint32_t*, HostSpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing,
                           "KPool::StepOutput::host_offsets"),
        B + 1);
    Kokkos::deep_copy(space, h.offsets,
                      Kokkos::subview(offsets_, std::make_pair(std::size_t(0), B + 1)));
    space.fence();
    // A count past the capacity (only after a step whose bad data went
    // unchecked) reads what exists.
    std::size_t const n = std::min<std::size_t>(h.offsets(B), capacity());
    h.count = static_cast<std::uint32_t>(n);
    auto const rows = std::make_pair(std::size_t(0), n);
    h.batch_row = Kokkos::View<std::int32_t*, HostSpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing,
                           "KPool::StepOutput::host_batch_row"),
        n);
    h.pool_id = Kokkos::View<std::int32_t*, HostSpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing,
                           "KPool::StepOutput::host_pool_id"),
        n);
    Kokkos::deep_copy(space, h.batch_row, Kokkos::subview(batch_row_, rows));
    Kokkos::deep_copy(space, h.pool_id, Kokkos::subview(pool_id_, rows));
    if (parts == StepOutputParts::ids_and_pooled) {
      h.pooled = Kokkos::View<T**, Kokkos::LayoutRight, HostSpace>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing,
                             "KPool::StepOutput::host_pooled"),
          n, pooled_.extent(1));
      Kokkos::deep_copy(space, h.pooled,
                        Kokkos::subview(pooled_, rows, Kokkos::ALL));
    }
    space.fence();
    return h;
  }

  /// Used by the steps (not by callers): points count() at offsets(batch)
  /// for a call of `batch` rows.
  /// @param batch the call's batch size B.
  /// @return the call's offsets, [0, B].
  offsets_type begin_call(int batch) {
    batch_ = batch;
    count_ = Kokkos::subview(offsets_, static_cast<std::size_t>(batch));
    return Kokkos::subview(
        offsets_, std::make_pair(std::size_t(0), static_cast<std::size_t>(batch) + 1));
  }

 private:
  pooled_type pooled_;
  index_type batch_row_;
  index_type pool_id_;
  offsets_type offsets_;
  count_type count_;
  int batch_ = 0;
};

namespace Details {

template <class T, class M>
PoolSink<T> step_sink(StepOutput<T, M> const& out,
                      View1<const std::uint32_t, M> const& offsets) {
  PoolSink<T> s;
  s.set_pooled(out.pooled());
  s.batch_row = out.batch_row();
  s.pool_id = out.pool_id();
  s.offsets = offsets;
  return s;
}

// The ring a step is given: its tail's shape (check_tail) and the kpool it
// was built for, which must be ape's.
template <class T, class M>
void check_ring(Checker const& chk, Ring<T, M> const& ring, int kpool,
                int head_dim) {
  check_tail(chk, ring.tail(), kpool, head_dim);
  if (ring.kpool() != kpool)
    chk.fail("ring", "kpool", -1, std::to_string(ring.kpool()),
             "does not match the kpool of ape = " + std::to_string(kpool));
}

// With validation: each live row that sends a position (re)starts its
// slot's sequence within the ring's depth (docs/ring.md, "The depth
// rule"), against H as the launches queued before left it. `argument` is
// what carries c: cache_lengths (step) or positions (decode_step).
template <class ExecutionSpace, class T, class M>
void check_ring_depth(Checker const& chk, ExecutionSpace const& space,
                      Ring<T, M> const& ring, std::vector<RingRestart> const& restarts,
                      char const* argument) {
  if (restarts.empty()) return;
  auto const high = host_readable(space, ring.high());
  std::uint64_t const R = static_cast<std::uint64_t>(ring.ring_length());
  for (std::size_t r = 0; r < restarts.size(); ++r) {
    RingRestart const& q = restarts[r];
    if (q.end <= q.start) continue;  // sends nothing
    std::uint64_t const H = high(q.slot);
    std::uint64_t const depth = rewind_depth(H, q.start, ring.kpool());
    if (depth > R)
      chk.fail_row(argument, static_cast<std::int64_t>(r), static_cast<std::int64_t>(q.start),
                   "restarts the sequence in slot " + std::to_string(q.slot) +
                       " deeper than the ring holds: H - floor(c/K)*K = " +
                       std::to_string(H) + " - " + std::to_string(H - depth) + " = " +
                       std::to_string(depth) + " > R = " + std::to_string(R) +
                       " (H: one past the highest position the slot was sent; "
                       "docs/ring.md, \"The depth rule\")");
  }
}

template <class T, class M>
void check_step_output(Checker const& chk, StepOutput<T, M> const& out,
                       std::size_t batch, int head_dim, std::size_t needed,
                       std::string const& why) {
  if (out.max_batch() < 0)
    chk.fail("out", "", -1, "an empty StepOutput",
             "has no storage (construct it with a capacity)");
  if (static_cast<std::size_t>(out.max_batch()) < batch)
    chk.fail("out", "max_batch", -1, std::to_string(out.max_batch()),
             "is less than the batch size B = " + std::to_string(batch));
  chk.extent_is("out", 1, out.pooled().extent(1), head_dim, "head_dim");
  chk.extent_at_least("out", 0, out.capacity(), needed, why);
}

// The cache a step writes: none (NoCacheArg), or a PoolCache and the
// call's block table. Path: where the pools are written
// (cache/detail/KPool_CachePath.hpp); the public steps leave it automatic, tests
// force each path.
struct NoCacheArg {
  static constexpr bool enabled = false;
  static constexpr CacheWritePath path = CacheWritePath::automatic;
};
template <class C, class M, class BlockTable,
          CacheWritePath Path = CacheWritePath::automatic>
struct CacheArg {
  static constexpr bool enabled = true;
  static constexpr CacheWritePath path = Path;
  PoolCache<C, M> const* cache;
  BlockTable const* block_table;
};

// Whether a cached step of ExecutionSpace, pools of T, items Items writes
// its cache by a second launch (false without a cache).
template <class ExecutionSpace, class T, CacheItems Items, class Arg>
constexpr bool cache_second_pass() {
  if constexpr (Arg::enabled)
    return cache_write_path<ExecutionSpace, T, Items, Arg::path>() ==
           CacheWritePath::second_pass;
  else
    return false;
}

// The compile-time checks of the steps' arguments, shared by the overloads
// with and without a cache.
// Each returns whether every check holds; the entry points skip their body
// otherwise (`if constexpr`), so one static_assert is the only error.
template <class ExecutionSpace, class T, class KeyView, class GateView,
          class ApeView, class RowOffsetsView, class CacheLengthsView,
          class SlotView>
constexpr bool check_step_views() {
  KPOOL_IMPL_CHECK_VIEW(KeyView, T, 2, ExecutionSpace, "key");
  KPOOL_IMPL_CHECK_VIEW(GateView, T, 2, ExecutionSpace, "gate");
  KPOOL_IMPL_CHECK_VIEW(ApeView, float, 2, ExecutionSpace, "ape");
  KPOOL_IMPL_CHECK_VIEW(RowOffsetsView, std::uint32_t, 1, ExecutionSpace,
                        "row_offsets");
  KPOOL_IMPL_CHECK_VIEW(CacheLengthsView, std::uint32_t, 1, ExecutionSpace,
                        "cache_lengths");
  KPOOL_IMPL_CHECK_VIEW(SlotView, std::uint32_t, 1, ExecutionSpace,
                        "slot_idx");
  return view_ok<KeyView, T, 2, ExecutionSpace>() &&
         view_ok<GateView, T, 2, ExecutionSpace>() &&
         view_ok<ApeView, float, 2, ExecutionSpace>() &&
         view_ok<RowOffsetsView, std::uint32_t, 1, ExecutionSpace>() &&
         view_ok<CacheLengthsView, std::uint32_t, 1, ExecutionSpace>() &&
         view_ok<SlotView, std::uint32_t, 1, ExecutionSpace>();
}

template <class ExecutionSpace, class T, class KeyView, class GateView,
          class ApeView, class PositionsView, class SlotView>
constexpr bool check_decode_views() {
  KPOOL_IMPL_CHECK_VIEW(KeyView, T, 3, ExecutionSpace, "key");
  KPOOL_IMPL_CHECK_VIEW(GateView, T, 3, ExecutionSpace, "gate");
  KPOOL_IMPL_CHECK_VIEW(ApeView, float, 2, ExecutionSpace, "ape");
  KPOOL_IMPL_CHECK_VIEW(PositionsView, std::int32_t, 2, ExecutionSpace,
                        "positions");
  KPOOL_IMPL_CHECK_VIEW(SlotView, std::uint32_t, 1, ExecutionSpace,
                        "slot_idx");
  return view_ok<KeyView, T, 3, ExecutionSpace>() &&
         view_ok<GateView, T, 3, ExecutionSpace>() &&
         view_ok<ApeView, float, 2, ExecutionSpace>() &&
         view_ok<PositionsView, std::int32_t, 2, ExecutionSpace>() &&
         view_ok<SlotView, std::uint32_t, 1, ExecutionSpace>();
}

// A cache of element type C for pools of T, and its block table.
template <class ExecutionSpace, class T, class C, class BlockTableView>
constexpr bool check_cache_arg() {
  static_assert(std::is_same<C, T>::value || std::is_same<C, float8_e4m3>::value,
                "KPool: a cache holds the pools' own storage type (native) "
                "or KPool::float8_e4m3");
  KPOOL_IMPL_CHECK_VIEW(BlockTableView, std::int32_t, 2, ExecutionSpace,
                        "block_table");
  return (std::is_same<C, T>::value || std::is_same<C, float8_e4m3>::value) &&
         view_ok<BlockTableView, std::int32_t, 2, ExecutionSpace>();
}

// Shapes of a step's cache, checked always: the cache has storage, D the
// call's, fp8 only for pools that are not f64, rotation only for D a
// power of two, K the ring's (when the cache knows its K), the block table
// a row per live request (as the selections take it), and `slots` pools
// (what one work item may stage) fit a team's scratch.
template <class ExecutionSpace, class T, class Arg>
void check_step_cache(Checker const& chk, ExecutionSpace const& space,
                      Arg const& arg, int kpool, int head_dim,
                      std::size_t live_rows, int slots) {
  if constexpr (Arg::enabled) {
    if (arg.cache->is_allocated() && arg.cache->kpool() != 0 &&
        arg.cache->kpool() != kpool)
      chk.fail("cache", "kpool", -1, std::to_string(arg.cache->kpool()),
               "does not match the kpool of the ring = " +
                   std::to_string(kpool) + " (the K the cache was built for)");
    check_cache_shapes<ExecutionSpace, T>(chk, space, *arg.cache,
                                          *arg.block_table, head_dim, live_rows);
    std::size_t max_bytes = 0;
    if (!cache_scratch_fits<ExecutionSpace, accumulator_t<T>>(
            space, head_dim, slots, &max_bytes))
      chk.fail("cache", "extent 2", -1, std::to_string(head_dim),
               "is a head_dim whose " + std::to_string(slots) +
                   " pools a row does not fit the " + std::to_string(max_bytes) +
                   " bytes of team scratch this execution space offers");
  } else {
    (void)chk, (void)space, (void)arg, (void)kpool, (void)head_dim,
        (void)live_rows, (void)slots;
  }
}

// With validation: every pool [first, end) row r writes has its block
// (docs/indexer.md, "Bad input"), read from the block table on the host.
template <class ExecutionSpace, class Arg>
void check_step_blocks(
    Checker const& chk, ExecutionSpace const& space, Arg const& arg,
    std::vector<std::pair<std::int64_t, std::int64_t>> const& pools) {
  if constexpr (Arg::enabled) {
    HostBlockTable const table =
        host_block_table(space, *arg.block_table, pools.size());
    for (std::size_t r = 0; r < pools.size(); ++r)
      check_pool_blocks(chk, table, static_cast<std::int64_t>(r),
                        pools[r].first, pools[r].second,
                        arg.cache->num_blocks(), arg.cache->block_pools());
  } else {
    (void)chk, (void)space, (void)arg, (void)pools;
  }
}

// The CacheTarget of a step's cache argument (Arg enabled).
template <class T, class Arg>
auto arg_cache_target(Arg const& arg) {
  return cache_target<typename std::remove_cv_t<
                          std::remove_pointer_t<decltype(arg.cache)>>::value_type,
                      accumulator_t<T>>(*arg.cache, *arg.block_table);
}

// What a step functor carries of the cache: the CacheTarget when it writes
// the cache in the step, NoCache without a cache or when a second pass
// writes it.
template <class T, bool SecondPass, class Arg>
auto step_cache_target(Arg const& arg) {
  if constexpr (Arg::enabled && !SecondPass)
    return arg_cache_target<T>(arg);
  else
    return NoCache();
}

// The second pass of a cached step, planned before anything is queued:
// store_pools' launch over the output's first `rows` rows (the step's
// bound on its count; the count itself read on the device). A no-op
// without one.
struct NoCachePass {
  template <class ExecutionSpace>
  void operator()(ExecutionSpace const&, std::string const&) const {}
};

template <class ExecutionSpace, class T, bool SecondPass, class M, class Arg>
auto plan_cache_pass(Checker const& chk, ExecutionSpace const& space,
                     StepOutput<T, M> const& out, Arg const& arg,
                     std::uint64_t rows, int team_size) {
  if constexpr (SecondPass)
    return plan_store_pools<ExecutionSpace, T>(
        chk, "out", space, out.pooled(), out.batch_row(), out.pool_id(),
        out.count().data(), rows, arg_cache_target<T>(arg), team_size);
  else {
    (void)chk, (void)space, (void)out, (void)arg, (void)rows, (void)team_size;
    return NoCachePass();
  }
}

// A step functor's launch: `items` work items, with `per_item` scratch
// slots each when it writes a cache.
// Stage is the functor's team_items type (T, or void for a decode step).
template <class ExecutionSpace, class T, class Cache, class Functor,
          class Stage = T>
LaunchShape step_items_shape(Checker const& chk, std::string const& argument,
                             ExecutionSpace const& space, Functor const& f,
                             std::uint64_t items, int head_dim, int width,
                             int per_item, int team_size) {
  using A = accumulator_t<T>;
  if constexpr (Cache::enabled && !device_shapes<ExecutionSpace>::value &&
                !host_stages_cache<ExecutionSpace, Stage, A>::value) {
    // A host writing each pool at once: one scratch row a team thread.
    LaunchShape l = items_shape(chk, argument, space, f, items, head_dim,
                                width, team_size);
    l.scratch_bytes = CacheScratch<ExecutionSpace, A>::bytes(l.team_size, head_dim);
    return l;
  } else if constexpr (Cache::enabled)
    return cache_items_shape<ExecutionSpace, accumulator_t<T>>(
        chk, argument, space, f, items, head_dim, width, per_item, team_size);
  else
    return items_shape(chk, argument, space, f, items, head_dim, width,
                       team_size);
}

template <class ExecutionSpace, class T, class M, class KeyView,
          class GateView, class ApeView, class RowOffsetsView,
          class CacheLengthsView, class SlotView, class Arg>
void step_impl(ExecutionSpace const& space, Ring<T, M>& ring,
               KeyView const& key, GateView const& gate, ApeView const& ape,
               RowOffsetsView const& row_offsets,
               CacheLengthsView const& cache_lengths, SlotView const& slot_idx,
               int num_requests, StepOutput<T, M>& out, Arg const& arg,
               Options const& options) {
  KokkosExt::ScopedProfileRegion region("KPool::step");
  Checker const chk("KPool::step");
  int const K = static_cast<int>(ape.extent(0));
  int const D = static_cast<int>(ape.extent(1));
  auto call = ragged_call<ExecutionSpace, T>(
      chk, key, gate, ape, row_offsets, cache_lengths, num_requests, K, D);
  check_ring(chk, ring, K, D);
  attach_slots(chk, call, slot_idx, ring.tail());
  std::size_t const bound =
      StepOutput<T, M>::capacity_for(key.extent(0), num_requests, K);
  check_step_output(
      chk, out, static_cast<std::size_t>(call.batch_size), D, bound,
      "rows this step may need (floor(key rows / K) + num_requests)");
  check_step_cache<ExecutionSpace, T>(
      chk, space, arg, K, D, static_cast<std::size_t>(num_requests), 1);
  if (options.validate) {
    HostBatch const hb = check_ragged_batch(
        chk, space, row_offsets, cache_lengths, &slot_idx, num_requests,
        key.extent(0), K, ring.max_slots());
    std::vector<RingRestart> restarts;
    for (std::size_t r = 0; r < hb.geometry.size(); ++r)
      restarts.push_back({hb.slots[r], hb.geometry[r].cache_length, hb.geometry[r].end});
    check_ring_depth(chk, space, ring, restarts, "cache_lengths");
    if constexpr (Arg::enabled) {
      // A request emits the pools whose last member it sends:
      // [floor(c / K), floor((c + n) / K)).
      std::vector<std::pair<std::int64_t, std::int64_t>> pools;
      for (RequestGeometry const& g : hb.geometry)
        pools.emplace_back(static_cast<std::int64_t>(g.cache_length / K),
                           static_cast<std::int64_t>(g.end / K));
      check_step_blocks(chk, space, arg, pools);
    }
  }

  View1<const std::uint32_t, M> const offsets =
      out.begin_call(call.batch_size);
  auto const sink = step_sink(out, offsets);
  View4<T, M> const tail = ring.tail();
  bool const contiguous = call.contiguous();
  bool const aligned = call.aligned() &&
                       rows_aligned(out.pooled().data(), D, 16) &&
                       ring_aligned(tail);
  std::uint64_t const requests = static_cast<std::uint64_t>(num_requests);
  std::uint64_t const rows = std::min<std::uint64_t>(bound, out.capacity());
  constexpr bool second_pass =
      cache_second_pass<ExecutionSpace, T, CacheItems::step, Arg>();
  auto const cache = step_cache_target<T, second_pass>(arg);
  using Cache = std::remove_const_t<decltype(cache)>;
  auto const cache_pass = plan_cache_pass<ExecutionSpace, T, second_pass>(
      chk, space, out, arg, rows, options.team_size);
  dispatch_path<ExecutionSpace, T>(K, D, contiguous, aligned, [&](auto path) {
    using P = decltype(path);
    using Writer = RaggedWriter<ExecutionSpace, T, P, true>;
    Writer writer = ragged_writer<Writer>(call);
    writer.tail = tail;
    writer.ring_high = ring.high().data();
    writer.out = sink;
    // Every launch is planned (and its size checked) before the first is
    // queued, so a call that throws has written nothing.
    if (options.fused) {
      FusedStepFunctor<Writer, Cache> f{writer, cache};
      // Both kinds of team share one shape: request teams and pool teams
      // each take items_per_team items (and as many scratch slots).
      LaunchShape shape = step_items_shape<ExecutionSpace, T, Cache>(
          chk, "num_requests", space, f, requests, D, P::width, 1,
          options.team_size);
      f.items_per_team = shape.items_per_team;
      f.request_teams = shape.league;
      std::uint64_t const league =
          static_cast<std::uint64_t>(f.request_teams) +
          static_cast<std::uint64_t>(
              league_for(chk, "out", rows, shape.items_per_team));
      if (league > 0x7FFFFFFFull)
        chk.fail("out", "", -1, std::to_string(rows),
                 "rows and num_requests = " + std::to_string(num_requests) +
                     " are more teams together than one launch takes "
                     "(2^31 - 1)");
      shape.league = static_cast<int>(league);
      launch_ragged_offsets<true>(space, "KPool::step::offsets", call,
                                  View1<std::uint32_t, M>(out.offsets()));
      launch(space, "KPool::step::fused", shape, f);
    } else {
      RingCloseFunctor<Writer, Cache> close{writer, cache};
      CompressFunctor<Writer, Cache> pools{writer, cache};
      SeedTailFunctor<Writer> seed{writer};
      LaunchShape const close_shape = step_items_shape<ExecutionSpace, T, Cache>(
          chk, "num_requests", space, close, requests, D, P::width, 1,
          options.team_size);
      LaunchShape const pools_shape = step_items_shape<ExecutionSpace, T, Cache>(
          chk, "out", space, pools, rows, D, P::width, 1, options.team_size);
      LaunchShape const seed_shape = items_shape(
          chk, "num_requests", space, seed, requests, D, P::width,
          options.team_size);
      launch_ragged_offsets<true>(space, "KPool::step::offsets", call,
                                  View1<std::uint32_t, M>(out.offsets()));
      // ring_close reads ring entries seed_tail overwrites; launches on one
      // execution space instance run in order.
      launch_items(space, "KPool::step::ring_close", close_shape, close);
      launch_items(space, "KPool::step::compress", pools_shape, pools);
      launch_items(space, "KPool::step::seed_tail", seed_shape, seed);
    }
  });
  // After the step on the same instance: it reads the rows the step wrote.
  cache_pass(space, "KPool::step::cache");
}

template <class ExecutionSpace, class T, class M, class KeyView,
          class GateView, class ApeView, class PositionsView, class SlotView,
          class Arg>
void decode_step_impl(ExecutionSpace const& space, Ring<T, M>& ring,
                      KeyView const& key, GateView const& gate,
                      ApeView const& ape, PositionsView const& positions,
                      SlotView const& slot_idx, int num_requests,
                      StepOutput<T, M>& out, Arg const& arg,
                      Options const& options) {
  KokkosExt::ScopedProfileRegion region("KPool::decode_step");
  Checker const chk("KPool::decode_step");
  check_decode_shapes(chk, key, gate, ape, positions, ring.tail(),
                      num_requests);
  int const K = static_cast<int>(ape.extent(0));
  int const D = static_cast<int>(ape.extent(1));
  check_ring(chk, ring, K, D);
  std::size_t const B = positions.extent(0);
  std::size_t const next_n = positions.extent(1);
  chk.extent_is("slot_idx", 0, slot_idx.extent(0), B,
                "the batch size B (positions is [B, next_n])");
  check_step_output(
      chk, out, B, D,
      static_cast<std::size_t>(num_requests) * ((next_n + K - 1) / K),
      "rows this step may need (num_requests * ceil(next_n / K))");
  // A row of consecutive positions closes at most ceil(next_n / K) pools.
  int const per_row = static_cast<int>(std::min<std::size_t>(
      (next_n + static_cast<std::size_t>(K) - 1) / static_cast<std::size_t>(K),
      0x7FFFFFFF));
  check_step_cache<ExecutionSpace, T>(
      chk, space, arg, K, D, static_cast<std::size_t>(num_requests), per_row);
  if (options.validate) {
    std::vector<std::pair<std::int64_t, std::int64_t>> pools;
    std::vector<RingRestart> restarts;
    check_decode_batch(chk, space, positions, slot_idx, num_requests, K,
                       ring.max_slots(), Arg::enabled ? &pools : nullptr, &restarts);
    check_ring_depth(chk, space, ring, restarts, "positions");
    check_step_blocks(chk, space, arg, pools);
  }

  View1<const std::uint32_t, M> const offsets =
      out.begin_call(static_cast<int>(B));
  View4<T, M> const tail = ring.tail();
  View3<const T, M> const k = key;
  View3<const T, M> const g = gate;
  View2<const float, M> const a = ape;
  bool const contiguous =
      k.stride(2) == 1 && g.stride(2) == 1 && a.stride(1) == 1;
  bool const aligned = decode_aligned<ExecutionSpace, T, M>(k, g, a, tail) &&
                       rows_aligned(out.pooled().data(), D, 16);
  constexpr bool second_pass =
      cache_second_pass<ExecutionSpace, T, CacheItems::decode, Arg>();
  auto const cache = step_cache_target<T, second_pass>(arg);
  using Cache = std::remove_const_t<decltype(cache)>;
  auto const cache_pass = plan_cache_pass<ExecutionSpace, T, second_pass>(
      chk, space, out, arg,
      std::min<std::uint64_t>(static_cast<std::uint64_t>(num_requests) *
                                  static_cast<std::uint64_t>(per_row),
                              out.capacity()),
      options.team_size);
  dispatch_path<ExecutionSpace, T>(K, D, contiguous, aligned, [&](auto path) {
    using P = decltype(path);
    TailUpdateFunctor<ExecutionSpace, T, P, true, Cache> f;
    f.tail = tail;
    f.key = k;
    f.gate = g;
    f.ape = ape_source(a);
    f.positions = positions;
    f.slot_idx = slot_idx;
    f.out = step_sink(out, offsets);
    f.num_requests = num_requests;
    f.next_n = static_cast<int>(next_n);
    f.kpool = K;
    f.head_dim = D;
    f.max_slots = ring.max_slots();
    f.ring_length = ring.ring_length();
    f.cache = cache;
    f.cache_slots = per_row;
    f.ring_high = ring.high().data();
    LaunchShape const shape = step_items_shape<ExecutionSpace, T, Cache,
                                               decltype(f), void>(
        chk, "num_requests", space, f,
        static_cast<std::uint64_t>(num_requests), D, P::width, per_row,
        options.team_size);
    launch_offsets_scan(space, "KPool::decode_step::offsets",
                        DecodePoolCount<M>{positions, slot_idx, num_requests,
                                           K, ring.max_slots()},
                        View1<std::uint32_t, M>(out.offsets()),
                        static_cast<int>(B));
    launch_items(space, "KPool::decode_step::tail_update", shape, f);
  });
  cache_pass(space, "KPool::decode_step::cache");
}

}  // namespace Details

/// The general serving step (docs/writers.md, "The steps"): per request
/// ring_close, then compress, then seed_tail, for a ragged batch mixing
/// fresh prefills, chunk continuations, zero-token rows and single-token
/// decodes. Every pool whose last member arrived in this call lands in
/// `out`, compacted (see StepOutput), and the ring keeps what later calls
/// need. Pools do not depend on how a sequence was split across calls.
/// cache_lengths(r) may be below the sequence's length: the row re-sends
/// rejected drafts (docs/ring.md, "Rewinds"); re-sent positions replace
/// their ring entries and a pool whose last member is re-sent is emitted
/// again. The ring must be long enough for the rewind (the depth rule in
/// KPool::Ring, the caller's contract).
///
/// Request r (r < num_requests) owns token rows [row_offsets(r),
/// row_offsets(r + 1)) of key and gate, which are absolute positions
/// cache_lengths(r) + i of the sequence in ring slot slot_idx(r). Rows at
/// and past num_requests are neither read nor written.
///
/// Every View is a Kokkos::View in ExecutionSpace::memory_space, of any
/// layout Kokkos can view as LayoutStride (LayoutRight, LayoutLeft,
/// LayoutStride); ranks and element types are checked at compile time.
/// Unit channel stride (and 16-byte aligned rows on GPUs) selects the fast
/// kernels.
///
/// @tparam ExecutionSpace a Kokkos execution space; MemorySpace must be its
/// memory space.
/// @tparam T the storage type (float, double, bfloat16, float16).
/// @param space the execution space instance all work is queued on.
/// @param ring the layer's ring, [max_slots, 2, R, D]; read and written.
/// @param key [total_tokens, D] T: the new tokens' keys.
/// @param gate [total_tokens, D] T: their gate scores (the two halves of
/// one [total_tokens, 2D] buffer work).
/// @param ape [K, D] float: the position embedding within a pool; K and D
/// are taken from it.
/// @param row_offsets [B + 1] uint32: starts at 0, never decreases.
/// @param cache_lengths [B] uint32: tokens of each sequence before this call.
/// @param slot_idx [B] uint32: each row's ring slot, below max_slots,
/// distinct among live rows.
/// @param num_requests live rows, 0 <= num_requests <= B.
/// @param out the compacted pools, written: max_batch >= B and capacity >=
/// floor(total_tokens / K) + num_requests.
/// @param options `validate` (data checks), `team_size`, and `fused`: one
/// launch for the three writers (true) or three (false), same bits.
/// @throws KPool::InvalidArgument for mismatched shapes (always) or bad
/// index data (with options.validate): row_offsets not starting at 0,
/// decreasing or past the key rows, a sequence passing 2^31 - 1 positions,
/// a slot out of range or shared. Nothing has been written then.
/// @par Launches and synchronization
/// Two launches on `space` (the offset scan, then the fused writers), four
/// with fused = false (the scan, ring_close, compress, seed_tail). With
/// options.validate, first fences `space` and copies row_offsets,
/// cache_lengths and slot_idx (live rows) to the host; otherwise nothing
/// waits for the host, and the step can be captured in a CUDA graph.
template <class ExecutionSpace, class T, class MemorySpace, class KeyView,
          class GateView, class ApeView, class RowOffsetsView,
          class CacheLengthsView, class SlotView>
void step(ExecutionSpace const& space, Ring<T, MemorySpace>& ring,
          KeyView const& key, GateView const& gate, ApeView const& ape,
          RowOffsetsView const& row_offsets,
          CacheLengthsView const& cache_lengths, SlotView const& slot_idx,
          int num_requests, StepOutput<T, MemorySpace>& out,
          Options const& options = Options()) {
  static_assert(std::is_same<MemorySpace,
                             typename ExecutionSpace::memory_space>::value,
                "KPool::step: the ring and the output must live in the "
                "execution space's memory space");
  if constexpr (Details::check_step_views<ExecutionSpace, T, KeyView, GateView,
                                          ApeView, RowOffsetsView,
                                          CacheLengthsView, SlotView>())
    Details::step_impl(space, ring, key, gate, ape, row_offsets, cache_lengths,
                       slot_idx, num_requests, out, Details::NoCacheArg(),
                       options);
}

/// KPool::step writing every pool it emits into a pool cache as well
/// (docs/indexer.md, "The pool cache"): cached = Q(R(x)) of pool p of
/// batch row r goes to block block_table(r, p / block_pools), entry p %
/// block_pools. A pool re-emitted after a rewind overwrites its entry.
/// On a GPU (and with device shapes) in the same launches: each pool goes
/// from the registers that made it into team scratch, is rotated and
/// quantized there. On a host, by whichever path measured cheaper
/// (src/cache/detail/KPool_CachePath.hpp; the README's "Writing the
/// pool cache"): in the step, or one more launch on `space` over the
/// output's rows, store_pools' (the count read on the device). Same bytes
/// either way. Everything else is KPool::step's.
///
/// @tparam C the cache element type: T (a native cache) or
/// KPool::float8_e4m3 (T not f64).
/// @param cache the layer's cache, head_dim D; written.
/// @param block_table [>= num_requests, max_blocks] int32, any layout: row
/// r's blocks (the rule score_select and select_tokens take it by).
/// @throws KPool::InvalidArgument as KPool::step, and for a cache without
/// storage, of another head_dim, built for another K than the ring's, fp8
/// for f64 pools, or a block table with fewer rows than num_requests
/// (always); with options.validate, a pool this call
/// emits whose block table column is missing, negative (unassigned) or
/// not below num_blocks. Nothing has been written then (the ring, the
/// output and the cache are unchanged). With validation off such a pool
/// still reaches `out` and is left out of the cache.
/// @par Launches and synchronization
/// As KPool::step, plus the cache's launch where a host writes it in a
/// second pass; nothing more waits for the host. With options.validate the
/// block table's live rows are copied to the host too.
template <class ExecutionSpace, class T, class MemorySpace, class KeyView,
          class GateView, class ApeView, class RowOffsetsView,
          class CacheLengthsView, class SlotView, class C,
          class BlockTableView>
void step(ExecutionSpace const& space, Ring<T, MemorySpace>& ring,
          KeyView const& key, GateView const& gate, ApeView const& ape,
          RowOffsetsView const& row_offsets,
          CacheLengthsView const& cache_lengths, SlotView const& slot_idx,
          int num_requests, StepOutput<T, MemorySpace>& out,
          PoolCache<C, MemorySpace>& cache, BlockTableView const& block_table,
          Options const& options = Options()) {
  static_assert(std::is_same<MemorySpace,
                             typename ExecutionSpace::memory_space>::value,
                "KPool::step: the ring, the output and the cache must live "
                "in the execution space's memory space");
  constexpr bool views_ok =
      Details::check_step_views<ExecutionSpace, T, KeyView, GateView, ApeView,
                                RowOffsetsView, CacheLengthsView, SlotView>();
  constexpr bool cache_ok =
      Details::check_cache_arg<ExecutionSpace, T, C, BlockTableView>();
  if constexpr (!views_ok || !cache_ok) {
    (void)space, (void)ring, (void)key, (void)gate, (void)ape,
        (void)row_offsets, (void)cache_lengths, (void)slot_idx,
        (void)num_requests, (void)out, (void)cache, (void)block_table,
        (void)options;
  } else if constexpr (is_cache_type<C, T>::value) {
    Details::step_impl(
        space, ring, key, gate, ape, row_offsets, cache_lengths, slot_idx,
        num_requests, out,
        Details::CacheArg<C, MemorySpace, BlockTableView>{&cache, &block_table},
        options);
  } else {
    // fp8 of f64 pools: refused, before anything runs.
    Details::check_cache_shapes<ExecutionSpace, T>(
        Details::Checker("KPool::step"), space, cache, block_table,
        static_cast<int>(ape.extent(1)), block_table.extent(0));
  }
}

/// The decode step (docs/writers.md, "The steps"): tail_update for every
/// live row, with the closed pools compacted into `out` like KPool::step's
/// (request r's at rows [offsets(r), offsets(r + 1)), in position order;
/// the count on the device). Row r carries up to next_n tokens of the
/// sequence in ring slot slot_idx(r) (speculative decoding sends the next
/// token and drafts); a sequence may alternate between step and
/// decode_step and gets the same pools. A row's first real position may
/// rewind, as in KPool::step (the next token plus S drafts a row, re-sent
/// from the first rejected one, needs a ring of at least K + S:
/// Ring::serving_length).
///
/// Views as for KPool::step: in ExecutionSpace::memory_space, any layout
/// Kokkos can view as LayoutStride.
///
/// @tparam ExecutionSpace a Kokkos execution space; MemorySpace must be its
/// memory space.
/// @tparam T the storage type (float, double, bfloat16, float16).
/// @param space the execution space instance all work is queued on.
/// @param ring the layer's ring, [max_slots, 2, R, D]; read and written.
/// @param key [B, next_n, D] T: the tokens' keys (padding entries unread).
/// @param gate [B, next_n, D] T: their gate scores.
/// @param ape [K, D] float; K and D are taken from it.
/// @param positions [B, next_n] int32: each token's absolute position in
/// its sequence; negative marks padding. A row's real positions, left to
/// right, are consecutive.
/// @param slot_idx [B] uint32: each row's ring slot, below max_slots,
/// distinct among live rows.
/// @param num_requests live rows, 0 <= num_requests <= B.
/// @param out the compacted pools, written: max_batch >= B and capacity >=
/// num_requests * ceil(next_n / K) (StepOutput::capacity_for(B * next_n,
/// B, K) suffices).
/// @param options `validate` (data checks) and `team_size`; `fused` unused.
/// @throws KPool::InvalidArgument for mismatched shapes, next_n = 0 or a
/// ring built for another K (always), or, with options.validate, a slot out
/// of range or shared, or a row whose real positions are not consecutive.
/// Nothing has been written then.
/// @par Launches and synchronization
/// Two launches on `space`: the offset scan and tail_update. With
/// options.validate, first fences `space` and copies slot_idx and
/// positions (live rows) to the host; otherwise nothing waits for the host.
template <class ExecutionSpace, class T, class MemorySpace, class KeyView,
          class GateView, class ApeView, class PositionsView, class SlotView>
void decode_step(ExecutionSpace const& space, Ring<T, MemorySpace>& ring,
                 KeyView const& key, GateView const& gate, ApeView const& ape,
                 PositionsView const& positions, SlotView const& slot_idx,
                 int num_requests, StepOutput<T, MemorySpace>& out,
                 Options const& options = Options()) {
  static_assert(std::is_same<MemorySpace,
                             typename ExecutionSpace::memory_space>::value,
                "KPool::decode_step: the ring and the output must live in "
                "the execution space's memory space");
  if constexpr (Details::check_decode_views<ExecutionSpace, T, KeyView,
                                            GateView, ApeView, PositionsView,
                                            SlotView>())
    Details::decode_step_impl(space, ring, key, gate, ape, positions, slot_idx,
                              num_requests, out, Details::NoCacheArg(),
                              options);
}

/// KPool::decode_step writing every pool it closes into a pool cache as
/// well, as the cache overload of KPool::step does (docs/indexer.md, "The
/// pool cache"): in its launch on a GPU, by the cheaper path on a host
/// (one more launch when that is the second pass). Everything else is
/// KPool::decode_step's.
///
/// @param cache the layer's cache, head_dim D; written.
/// @param block_table [>= num_requests, max_blocks] int32, any layout: row
/// r's blocks.
/// @throws KPool::InvalidArgument as KPool::decode_step, and as the cache
/// overload of KPool::step for the cache and the block table. Nothing has
/// been written then.
template <class ExecutionSpace, class T, class MemorySpace, class KeyView,
          class GateView, class ApeView, class PositionsView, class SlotView,
          class C, class BlockTableView>
void decode_step(ExecutionSpace const& space, Ring<T, MemorySpace>& ring,
                 KeyView const& key, GateView const& gate, ApeView const& ape,
                 PositionsView const& positions, SlotView const& slot_idx,
                 int num_requests, StepOutput<T, MemorySpace>& out,
                 PoolCache<C, MemorySpace>& cache,
                 BlockTableView const& block_table,
                 Options const& options = Options()) {
  static_assert(std::is_same<MemorySpace,
                             typename ExecutionSpace::memory_space>::value,
                "KPool::decode_step: the ring, the output and the cache must "
                "live in the execution space's memory space");
  constexpr bool views_ok =
      Details::check_decode_views<ExecutionSpace, T, KeyView, GateView,
                                  ApeView, PositionsView, SlotView>();
  constexpr bool cache_ok =
      Details::check_cache_arg<ExecutionSpace, T, C, BlockTableView>();
  if constexpr (!views_ok || !cache_ok) {
    (void)space, (void)ring, (void)key, (void)gate, (void)ape,
        (void)positions, (void)slot_idx, (void)num_requests, (void)out,
        (void)cache, (void)block_table, (void)options;
  } else if constexpr (is_cache_type<C, T>::value) {
    Details::decode_step_impl(
        space, ring, key, gate, ape, positions, slot_idx, num_requests, out,
        Details::CacheArg<C, MemorySpace, BlockTableView>{&cache, &block_table},
        options);
  } else {
    Details::check_cache_shapes<ExecutionSpace, T>(
        Details::Checker("KPool::decode_step"), space, cache, block_table,
        static_cast<int>(ape.extent(1)), block_table.extent(0));
  }
}

}  // namespace KPool

#endif
