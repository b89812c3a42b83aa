#ifndef KPOOL_COMMON_DETAIL_CACHE_FUNCTORS_HPP
#define KPOOL_COMMON_DETAIL_CACHE_FUNCTORS_HPP

// store_pools and load_pools: the standalone cache passes, and the host
// side checks every cache write shares.

#include <cache/KPool_PoolCache.hpp>
#include <common/KPool_Exceptions.hpp>
#include <common/KPool_Float8.hpp>
#include <common/detail/KPool_CacheWrite.hpp>
#include <common/detail/KPool_Request.hpp>
#include <common/detail/KPool_Strided.hpp>
#include <common/detail/KPool_Validate.hpp>
#include <common/detail/KPool_Views.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace KPool {
namespace Details {

// store_pools: row o of a StepOutput (o < count, read on the device) goes to
// pool pool_id(o) of batch row batch_row(o). With device shapes one scratch
// slot per row; a host writes each row at once.
template <class ExecutionSpace, class T, class C>
struct StorePoolsFunctor {
  using member_type =
      typename KokkosExt::TeamPolicy<ExecutionSpace>::member_type;
  using A = accumulator_t<T>;

  Strided<const T, 2> pooled;
  Strided<const std::int32_t, 1> batch_row;
  Strided<const std::int32_t, 1> pool_id;
  std::uint32_t const* count;  // the output's count, on the device
  std::uint64_t capacity;      // pooled.extent(0)
  CacheTarget<C, A, typename ExecutionSpace::memory_space> cache;
  int items_per_team = 1;

  KOKKOS_INLINE_FUNCTION void operator()(member_type const& member) const {
    std::uint64_t const begin =
        static_cast<std::uint64_t>(member.league_rank()) * items_per_team;
    std::uint64_t const rows =
        *count < capacity ? static_cast<std::uint64_t>(*count) : capacity;
    // Team-uniform: a team past the last row leaves before any barrier.
    if (begin >= rows) return;
    CacheScratch<ExecutionSpace, A> const s(member, items_per_team,
                                            cache.head_dim());
    if constexpr (!device_shapes<ExecutionSpace>::value) {
      // Hosts: each row written at once by its thread (cache_write_row).
      A* const buffer = s.host_row(member.team_rank());
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, items_per_team), [&](int i) {
        std::uint64_t const o = begin + i;
        if (o >= rows) return;
        CacheSlot const where = cache.locate(batch_row(o), pool_id(o));
        if (where.block >= 0)
          cache_write_row<ExecutionSpace>(member, cache, where, &pooled(o, 0),
                                          pooled.stride(1), buffer);
      });
      return;
    }
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, items_per_team), [&](int i) {
      std::uint64_t const o = begin + i;
      if (o >= rows) {
        cache_stage_skip(member, s, i);
        return;
      }
      cache_stage_row<ExecutionSpace, Path<0, 0, 1, false>>(
          member, s, i, &pooled(o, 0), pooled.stride(1),
          cache.locate(batch_row(o), pool_id(o)));
    });
    cache_team_write<ExecutionSpace>(member, s, cache);
  }
};

// store_pools' launch, planned (and its size checked) before anything is
// queued: the functor over rows [0, count) of a step's output (count read
// on the device) and its shape, `rows` work items (at least count; teams
// past count return at once). store_pools runs it, and so does a cached
// step taking the second pass (common/detail/KPool_CachePath.hpp).
template <class ExecutionSpace, class T, class C>
struct StorePoolsLaunch {
  StorePoolsFunctor<ExecutionSpace, T, C> functor;
  LaunchShape shape;

  void operator()(ExecutionSpace const& space, std::string const& label) const {
    launch_items(space, label, shape, functor);
  }
};

template <class ExecutionSpace, class T, class C, class M, class PooledView,
          class IndexView>
StorePoolsLaunch<ExecutionSpace, T, C> plan_store_pools(
    Checker const& chk, std::string const& argument, ExecutionSpace const& space,
    PooledView const& pooled, IndexView const& batch_row,
    IndexView const& pool_id, std::uint32_t const* count, std::uint64_t rows,
    CacheTarget<C, accumulator_t<T>, M> const& target, int team_size) {
  StorePoolsLaunch<ExecutionSpace, T, C> l;
  l.functor.pooled = View2<const T, M>(pooled);
  l.functor.batch_row = View1<const std::int32_t, M>(batch_row);
  l.functor.pool_id = View1<const std::int32_t, M>(pool_id);
  l.functor.count = count;
  l.functor.capacity = pooled.extent(0);
  l.functor.cache = target;
  l.shape = cache_items_shape<ExecutionSpace, accumulator_t<T>>(
      chk, argument, space, l.functor, rows, target.head_dim(), 1, 1, team_size);
  return l;
}

// The dequantized value s * value (a native cache's scale is 1 and is not
// read).
template <class A, class C>
KOKKOS_INLINE_FUNCTION A dequantize(C const& v, float s) {
  if constexpr (std::is_same<C, float8_e4m3>::value)
    return s * static_cast<float>(v);
  else
    return to_accumulator(v);
}

template <class O, class A>
KOKKOS_INLINE_FUNCTION O to_output(A a) {
  return O(static_cast<accumulator_t<O>>(a));
}

// load_pools: item (r, p) is pool p of batch row r, p < num_pools(r). In
// the original domain of a rotated cache the dequantized rows are staged
// in scratch and rotated back (the orthonormal transform is its own
// inverse) before they are written.
// How many pools load_pools reads for each live row: an array's count
// (its positional form), or the complete pools before a batch's rows (a
// ragged batch: floor(cache_lengths(r) / K); a decode batch: floor(base_r
// / K), base_r its first real position's row base).
struct PoolCounts {
  enum class From { array, ragged, decode };
  From from = From::array;
  Strided<const std::int32_t, 1> num_pools;
  Strided<const std::uint32_t, 1> cache_lengths;
  Strided<const std::int32_t, 2> positions;
  int next_n = 0;
  int kpool = 1;

  KOKKOS_INLINE_FUNCTION std::int64_t operator()(int r) const {
    if (from == From::array) return num_pools(r);
    std::uint64_t const base = from == From::ragged
                                   ? static_cast<std::uint64_t>(cache_lengths(r))
                                   : decode_row_base(positions, r, next_n);
    return static_cast<std::int64_t>(base / static_cast<std::uint64_t>(kpool));
  }
};

template <class ExecutionSpace, class C, class A, class O>
struct LoadPoolsFunctor {
  using member_type =
      typename KokkosExt::TeamPolicy<ExecutionSpace>::member_type;

  CacheTarget<C, A, typename ExecutionSpace::memory_space> cache;
  PoolCounts num_pools;
  Strided<O, 3> out;
  std::uint64_t max_pools;  // out.extent(1)
  int num_requests;
  bool unrotate;
  int items_per_team = 1;

  KOKKOS_INLINE_FUNCTION CacheSlot where(std::uint64_t item, int& r, int& p) const {
    r = static_cast<int>(item / max_pools);
    p = static_cast<int>(item % max_pools);
    if (r >= num_requests || p >= num_pools(r)) return CacheSlot{-1, 0};
    return cache.locate(r, p);
  }

  KOKKOS_INLINE_FUNCTION void operator()(member_type const& member) const {
    std::uint64_t const begin =
        static_cast<std::uint64_t>(member.league_rank()) * items_per_team;
    std::uint64_t const items =
        static_cast<std::uint64_t>(num_requests) * max_pools;
    if (begin >= items) return;
    int const D = cache.head_dim();
    if (!unrotate) {
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, items_per_team), [&](int i) {
        if (begin + i >= items) return;
        int r, p;
        CacheSlot const w = where(begin + i, r, p);
        if (w.block < 0) return;
        float const s = cache.scale_at(w);
        C const* const v = cache.row(w);
        KokkosExt::vector_for<ExecutionSpace>(member, D, [&](int c) {
          out(r, p, c) = to_output<O>(dequantize<A>(v[c], s));
        });
      });
      return;
    }
    CacheScratch<ExecutionSpace, A> const s(member, items_per_team, D);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, items_per_team), [&](int i) {
      int r = 0, p = 0;
      CacheSlot const w = begin + i < items ? where(begin + i, r, p) : CacheSlot{-1, 0};
      cache_stage_target(member, s, i, w);
      if (w.block < 0) return;
      float const sc = cache.scale_at(w);
      C const* const v = cache.row(w);
      auto const row = s.row(i);
      KokkosExt::vector_for<ExecutionSpace>(member, D, [&](int c) {
        row[c] = dequantize<A>(v[c], sc);
      });
    });
    member.team_barrier();
    cache_team_butterflies<ExecutionSpace>(member, s);
    A const rs = cache.rsqrt;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, items_per_team), [&](int i) {
      if (s.dest(i, 0) < 0) return;
      int r, p;
      where(begin + i, r, p);
      auto const row = s.row(i);
      KokkosExt::vector_for<ExecutionSpace>(
          member, D, [&](int c) { out(r, p, c) = to_output<O>(row[c] * rs); });
    });
  }
};

// --- Host-side checks shared by every cache write -------------------------

// Shapes of a cache write of pools of storage type T and D channels, made
// for the first `batch` rows of a block table. Always on: they cost
// nothing.
template <class ExecutionSpace, class T, class C, class M, class BlockTable>
void check_cache_shapes(Checker const& chk, ExecutionSpace const& space,
                        PoolCache<C, M> const& cache,
                        BlockTable const& block_table, int head_dim,
                        std::size_t batch) {
  if (!cache.is_allocated())
    chk.fail("cache", "", -1, "an empty PoolCache",
             "has no storage (construct it with its sizes)");
  if (PoolCache<C, M>::is_fp8 && std::is_same<T, double>::value)
    chk.fail("cache", "", -1, cache_element_name<C>(),
             "needs pools of a storage type that is not f64, and these are f64");
  chk.extent_is("cache", 2, static_cast<std::size_t>(cache.head_dim()),
                static_cast<std::size_t>(head_dim), "head_dim of the pools");
  int const D = cache.head_dim();
  if (cache.rotated() && (D & (D - 1)) != 0)
    chk.fail("cache", "extent 2", -1, std::to_string(D),
             "is not a power of two, which a rotated cache needs");
  chk.extent_at_least("block_table", 0, block_table.extent(0), batch,
                      "rows of the live requests");
  std::size_t max_bytes = 0;
  if (!cache_scratch_fits<ExecutionSpace, accumulator_t<T>>(space, D, 1, &max_bytes))
    chk.fail("cache", "extent 2", -1, std::to_string(D),
             "is a head_dim whose pool does not fit the " +
                 std::to_string(max_bytes) +
                 " bytes of team scratch this execution space offers");
}

// The first `rows` rows of a block table, on the host (validation only).
struct HostBlockTable {
  std::vector<std::int32_t> v;
  std::size_t rows = 0, cols = 0;
  std::int32_t at(std::size_t r, std::size_t c) const { return v[r * cols + c]; }
};

template <class ExecutionSpace, class BlockTable>
HostBlockTable host_block_table(ExecutionSpace const& space,
                                BlockTable const& block_table,
                                std::size_t rows) {
  HostBlockTable t;
  t.rows = rows;
  t.cols = block_table.extent(1);
  t.v.resize(rows * t.cols);
  if (rows == 0 || t.cols == 0) return t;
  auto const h = host_readable(
      space, Kokkos::subview(block_table, std::make_pair(std::size_t(0), rows),
                             Kokkos::ALL));
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < t.cols; ++c) t.v[r * t.cols + c] = h(r, c);
  return t;
}

// Every pool in [first, end) of batch row r has a column in the table and
// an assigned block below num_blocks (docs/indexer.md, "Bad input"). On a
// shard (docs/ranks.md), the pools of [first, end) it holds are its local
// pools [local_count(first), local_count(end)), and those are checked.
inline void check_pool_blocks(Checker const& chk, HostBlockTable const& t,
                              std::int64_t r, std::int64_t first,
                              std::int64_t end, int num_blocks,
                              int block_pools, char const* use = "written",
                              Shard const& shard = Shard()) {
  if (shard.sharded()) {
    first = static_cast<std::int64_t>(shard.local_count(static_cast<std::uint64_t>(first)));
    end = static_cast<std::int64_t>(shard.local_count(static_cast<std::uint64_t>(end)));
  }
  // "pool p", or on a shard "local pool l (pool p)".
  auto const name = [&](std::int64_t l) {
    if (!shard.sharded()) return "pool " + std::to_string(l);
    return "local pool " + std::to_string(l) + " (pool " +
           std::to_string(shard.global(static_cast<std::uint64_t>(l))) + " of the sequence, " +
           shard_name(shard) + ")";
  };
  if (first >= end) return;
  std::int64_t const last_col = (end - 1) / block_pools;
  if (last_col >= static_cast<std::int64_t>(t.cols))
    chk.fail("block_table", "row " + std::to_string(r), r, std::to_string(t.cols),
             "is max_blocks, too few columns for " +
                 name(std::max<std::int64_t>(
                     first, static_cast<std::int64_t>(t.cols) * block_pools)) +
                 " (pool p lives in column p / block_pools, block_pools = " +
                 std::to_string(block_pools) + ")");
  for (std::int64_t col = first / block_pools; col <= last_col; ++col) {
    std::int32_t const b = t.at(static_cast<std::size_t>(r), static_cast<std::size_t>(col));
    std::int64_t const pool = std::max<std::int64_t>(first, col * block_pools);
    std::string const where =
        "row " + std::to_string(r) + ", column " + std::to_string(col);
    if (b < 0)
      chk.fail("block_table", where, r, std::to_string(b),
               "is not an assigned block, and " + name(pool) + " is " + use + " there");
    if (b >= num_blocks)
      chk.fail("block_table", where, r, std::to_string(b),
               "is not below num_blocks = " + std::to_string(num_blocks) +
                   " (" + name(pool) + " is " + use + " there)");
  }
}

}  // namespace Details
}  // namespace KPool

#endif
