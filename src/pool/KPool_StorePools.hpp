#ifndef KPOOL_POOL_STORE_POOLS_HPP
#define KPOOL_POOL_STORE_POOLS_HPP

// The standalone pool cache passes: store_pools writes a step's output into
// a PoolCache, load_pools reads pools back, dequantized.

#include <cache/KPool_PagedCache.hpp>
#include <cache/KPool_PoolCache.hpp>
#include <common/KPool_Batch.hpp>
#include <common/KPool_Float8.hpp>
#include <common/KPool_Options.hpp>
#include <common/KPool_Types.hpp>
#include <pool/KPool_StepOutput.hpp>
#include <common/detail/KPool_CacheFunctors.hpp>
#include <common/detail/KPool_CacheWrite.hpp>
#include <common/detail/KPool_Validate.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

namespace KPool {

/// Which values load_pools returns for a rotated cache: `cached`, the
/// rotated domain the cache holds (what a scorer multiplies rotated
/// queries with), or `original`, rotated back (the Walsh-Hadamard transform
/// is its own inverse). The same for an unrotated cache.
enum class PoolDomain { cached, original };

/// Writes every pool of the last step into the cache (docs/indexer.md, "The pool
/// cache"): rows [0, count) of `out`, row o being pool pool_id(o) of batch
/// row batch_row(o), stored at block block_table(batch_row(o), pool_id(o) /
/// block_pools), entry pool_id(o) % block_pools, as Q(R(x)). count is read
/// on the device: with options.validate off nothing waits for the host
/// (one launch over the output's capacity; teams past count return at
/// once).
///
/// block_table  [>= num_requests, max_blocks] int32, any layout
/// cache        PoolCache<T> (native) or PoolCache<float8_e4m3> (T not f64),
///              head_dim the output's
///
/// Bad input (named KPool::InvalidArgument, nothing written): a cache
/// without storage, of another head_dim, fp8 for f64 pools, a block table
/// with fewer than num_requests rows; with options.validate, a row whose
/// batch row is not below num_requests, a pool whose block table column
/// does not exist, is negative (unassigned) or not below num_blocks. With
/// validation off such pools are skipped: nothing is written outside the
/// cache, and nothing read outside the inputs.
template <class ExecutionSpace, class T, class C, class MemorySpace,
          class BlockTableView>
void store_pools(ExecutionSpace const& space,
                 StepOutput<T, MemorySpace> const& out, int num_requests,
                 BlockTableView const& block_table,
                 PoolCache<C, MemorySpace>& cache,
                 Options const& options = Options()) {
  static_assert(std::is_same<MemorySpace, typename ExecutionSpace::memory_space>::value,
                "KPool::store_pools: the output and the cache must live in "
                "the execution space's memory space");
  static_assert(std::is_same<C, T>::value || std::is_same<C, float8_e4m3>::value,
                "KPool::store_pools: a cache holds the pools' own storage "
                "type (native) or KPool::float8_e4m3");
  KPOOL_IMPL_CHECK_VIEW(BlockTableView, std::int32_t, 2, ExecutionSpace,
                        "block_table");
  using A = accumulator_t<T>;

  Details::Entry const chk("KPool::store_pools");
  if (out.max_batch() < 0)
    chk.fail("out", "", -1, "an empty StepOutput",
             "has no storage (construct it with a capacity)");
  if (num_requests < 0) chk.fail_scalar("num_requests", num_requests, "is negative");
  if (num_requests > out.max_batch())
    chk.fail_scalar("num_requests", num_requests,
                    "exceeds the output's max_batch = " +
                        std::to_string(out.max_batch()));
  Details::check_cache_shapes<ExecutionSpace, T>(
      chk, space, cache, block_table, out.head_dim(),
      static_cast<std::size_t>(num_requests));

  std::uint64_t rows = out.capacity();
  if (options.validate) {
    auto const hc = Details::host_readable(space, out.count());
    std::uint64_t const count = hc();
    if (count > out.capacity())
      chk.fail("out", "count", -1, std::to_string(count),
               "exceeds the output's capacity " + std::to_string(out.capacity()));
    auto const br = Details::host_copy(space, out.batch_row(), count);
    auto const id = Details::host_copy(space, out.pool_id(), count);
    auto const table = Details::host_block_table(
        space, block_table, static_cast<std::size_t>(num_requests));
    for (std::uint64_t o = 0; o < count; ++o) {
      std::int64_t const r = br[o];
      if (r < 0 || r >= num_requests)
        chk.fail("out", "row " + std::to_string(o), static_cast<std::int64_t>(o),
                 std::to_string(r),
                 "is a batch row not below num_requests = " +
                     std::to_string(num_requests));
      if (id[o] < 0)
        chk.fail("out", "row " + std::to_string(o), static_cast<std::int64_t>(o),
                 std::to_string(id[o]), "is a negative pool id");
      Details::check_pool_blocks(chk, table, r, id[o], std::int64_t(id[o]) + 1,
                                 cache.num_blocks(), cache.block_pools(), "written",
                                 cache.shard());
    }
    rows = count;
  }

  if constexpr (is_cache_type<C, T>::value) {
    auto const pass = Details::plan_store_pools<ExecutionSpace, T>(
        chk, "out", space, out.pooled(), out.batch_row(), out.pool_id(),
        out.count().data(), rows, Details::cache_target<C, A>(cache, block_table),
        options.team_size);
    pass(space, "KPool::store_pools");
  }
}

/// store_pools with one batch argument (docs/api.md, "One batch
/// argument"): the output's rows are rows of `batch` (its num_requests is
/// the live rows; its form and views are not read), written into `cache`
/// through its block table. Same bytes, launches and errors as the
/// positional form.
/// @param space the execution space instance the work is queued on.
/// @param out the step's output, read.
/// @param batch the step's batch.
/// @param cache the cache and the batch rows' block table (KPool::paged);
/// the cache is written.
/// @param options as the positional form.
template <class ExecutionSpace, class T, class C, class MemorySpace>
void store_pools(ExecutionSpace const& space, StepOutput<T, MemorySpace> const& out,
                 Batch<MemorySpace> const& batch, PagedCache<C, MemorySpace> const& cache,
                 Options const& options = Options()) {
  PoolCache<C, MemorySpace> written = cache.cache;  // a handle on the same storage
  store_pools(space, out, batch.num_requests, cache.block_table, written, options);
}

/// Reads pools back from the cache, dequantized (s * value; a native
/// cache's values as they are): pool p of batch row r, for p < num_pools(r),
/// into out(r, p, :). Pools in the cached domain by default; `domain`
/// original rotates a rotated cache's pools back. Entries of `out` for
/// p >= num_pools(r), and for pools skipped with validation off, are left
/// as they were.
///
/// block_table  [>= num_requests, max_blocks] int32
/// num_pools    [>= num_requests] int32
/// out          [>= num_requests, max_pools, D]: float, or the cache's own
///              type (native caches), or bf16 / f16 (fp8 caches), rounded
///              to nearest even
///
/// Bad input as for store_pools (with validation: num_pools(r) negative or
/// above max_pools, blocks of pools [0, num_pools(r)) missing, unassigned
/// or not below num_blocks).
template <class ExecutionSpace, class C, class MemorySpace, class BlockTableView,
          class NumPoolsView, class OutView>
void load_pools(ExecutionSpace const& space, PoolCache<C, MemorySpace> const& cache,
                BlockTableView const& block_table, NumPoolsView const& num_pools,
                int num_requests, OutView const& out,
                PoolDomain domain = PoolDomain::cached,
                Options const& options = Options()) {
  using O = typename OutView::non_const_value_type;
  using A = std::conditional_t<std::is_same<C, float8_e4m3>::value, float,
                               accumulator_t<C>>;
  static_assert(std::is_same<MemorySpace, typename ExecutionSpace::memory_space>::value,
                "KPool::load_pools: the cache must live in the execution "
                "space's memory space");
  static_assert(std::is_same<O, float>::value || std::is_same<O, C>::value ||
                    (std::is_same<C, float8_e4m3>::value &&
                     (std::is_same<O, bfloat16>::value || std::is_same<O, float16>::value)),
                "KPool::load_pools: out holds float, the cache's own type, or "
                "(fp8 caches) bf16 or f16");
  KPOOL_IMPL_CHECK_VIEW(BlockTableView, std::int32_t, 2, ExecutionSpace,
                        "block_table");
  KPOOL_IMPL_CHECK_VIEW(NumPoolsView, std::int32_t, 1, ExecutionSpace, "num_pools");
  KPOOL_IMPL_CHECK_OUTPUT_VIEW(OutView, O, 3, ExecutionSpace, "out");

  Details::Entry const chk("KPool::load_pools");
  if (num_requests < 0) chk.fail_scalar("num_requests", num_requests, "is negative");
  std::size_t const n = static_cast<std::size_t>(num_requests);
  using TC = std::conditional_t<std::is_same<C, float8_e4m3>::value, float, C>;
  if (cache.is_allocated())
    chk.extent_is("out", 2, out.extent(2), static_cast<std::size_t>(cache.head_dim()),
                  "the cache's head_dim");
  Details::check_cache_shapes<ExecutionSpace, TC>(chk, space, cache, block_table,
                                                  cache.head_dim(), n);
  chk.extent_at_least("num_pools", 0, num_pools.extent(0), n, "num_requests");
  chk.extent_at_least("out", 0, out.extent(0), n, "num_requests");
  if (out.extent(1) > 0x7FFFFFFF)
    chk.fail("out", "extent 1", -1, std::to_string(out.extent(1)), "is too many pools");
  if (options.validate) {
    auto const np = Details::host_copy(space, num_pools, n);
    auto const table = Details::host_block_table(space, block_table, n);
    for (std::size_t r = 0; r < n; ++r) {
      if (np[r] < 0 || static_cast<std::size_t>(np[r]) > out.extent(1))
        chk.fail_row("num_pools", static_cast<std::int64_t>(r), np[r],
                     np[r] < 0 ? "is negative"
                               : "exceeds the " + std::to_string(out.extent(1)) +
                                     " pools a row of out holds");
      Details::check_pool_blocks(chk, table, static_cast<std::int64_t>(r), 0, np[r],
                                 cache.num_blocks(), cache.block_pools(), "read");
    }
  }

  bool const unrotate = domain == PoolDomain::original && cache.rotated();
  Details::LoadPoolsFunctor<ExecutionSpace, C, A, O> f;
  f.cache = Details::cache_target<C, A>(cache, block_table);
  f.cache.shard = Shard();  // a shard's own pools, by their local ids
  f.num_pools = Details::View1<const std::int32_t, MemorySpace>(num_pools);
  f.out = Details::View3<O, MemorySpace>(out);
  f.max_pools = out.extent(1);
  f.num_requests = num_requests;
  f.unrotate = unrotate;
  std::uint64_t const items = static_cast<std::uint64_t>(n) * out.extent(1);
  Details::LaunchShape const shape =
      unrotate ? Details::cache_items_shape<ExecutionSpace, A>(
                     chk, "out", space, f, items, cache.head_dim(), 1, 1,
                     options.team_size)
               : Details::items_shape(chk, "out", space, f, items,
                                      cache.head_dim(), 1, options.team_size);
  Details::launch_items(space, "KPool::load_pools", shape, f);
}

}  // namespace KPool

#endif
