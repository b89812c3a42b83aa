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
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

namespace KPool {

/// Which values load_pools returns for a rotated cache: `cached`, the
/// rotated domain the cache holds (what a scorer multiplies rotated
/// queries with), or `original`, rotated back (the Walsh-Hadamard transform
/// is its own inverse). The same for an unrotated cache.
enum class PoolDomain { cached, original };

namespace Details {

// store_pools' checks and launch, for its every form.
template <class ExecutionSpace, class T, class C, class MemorySpace,
          class BlockTableView>
void store_pools_impl(ExecutionSpace const& space,
                 StepOutput<T, MemorySpace> const& out, int num_requests,
                 BlockTableView const& block_table,
                 PoolCache<C, MemorySpace>& cache,
                 Options const& options) {
  static_assert(std::is_same<MemorySpace, typename ExecutionSpace::memory_space>::value,
                "KPool::store_pools: the output and the cache must live in "
                "the execution space's memory space");
  static_assert(std::is_same<C, T>::value || std::is_same<C, float8_e4m3>::value,
                "KPool::store_pools: a cache holds the pools' own storage "
                "type (native) or KPool::float8_e4m3");
  KPOOL_IMPL_CHECK_VIEW(BlockTableView, std::int32_t, 2, ExecutionSpace,
                        "block_table");
  using A = accumulator_t<T>;

  Entry const chk("KPool::store_pools");
  if (out.max_batch() < 0)
    chk.fail("out", "", -1, "an empty StepOutput",
             "has no storage (construct it with a capacity)");
  if (num_requests < 0) chk.fail_scalar("num_requests", num_requests, "is negative");
  if (num_requests > out.max_batch())
    chk.fail_scalar("num_requests", num_requests,
                    "exceeds the output's max_batch = " +
                        std::to_string(out.max_batch()));
  check_cache_shapes<ExecutionSpace, T>(
      chk, space, cache, block_table, out.head_dim(),
      static_cast<std::size_t>(num_requests));

  std::uint64_t rows = out.capacity();
  if (options.validate) {
    auto const hc = host_readable(space, out.count());
    std::uint64_t const count = hc();
    if (count > out.capacity())
      chk.fail("out", "count", -1, std::to_string(count),
               "exceeds the output's capacity " + std::to_string(out.capacity()));
    auto const br = host_copy(space, out.batch_row(), count);
    auto const id = host_copy(space, out.pool_id(), count);
    auto const table = host_block_table(
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
      check_pool_blocks(chk, table, r, id[o], std::int64_t(id[o]) + 1,
                                 cache.num_blocks(), cache.block_pools(), "written",
                                 cache.shard());
    }
    rows = count;
  }

  if constexpr (is_cache_type<C, T>::value) {
    auto const pass = plan_store_pools<ExecutionSpace, T>(
        chk, "out", space, out.pooled(), out.batch_row(), out.pool_id(),
        out.count().data(), rows, cache_target<C, A>(cache, block_table),
        options.team_size);
    pass(space, "KPool::store_pools");
  }
}

// load_pools' checks and launch: the pools [0, counts(r)) of each live row
// r; `counts` is an array's (argument "num_pools") or a batch's
// (argument "batch"), `host_counts` the same counts read on the host (for
// validation).
template <class ExecutionSpace, class C, class MemorySpace, class BlockTableView,
          class OutView, class HostCounts>
void load_pools_impl(ExecutionSpace const& space, PoolCache<C, MemorySpace> const& cache,
                     BlockTableView const& block_table, PoolCounts const& counts,
                     char const* counts_name, std::size_t counts_extent,
                     HostCounts const& host_counts, int num_requests, OutView const& out,
                     PoolDomain domain, Options const& options) {
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
  KPOOL_IMPL_CHECK_OUTPUT_VIEW(OutView, O, 3, ExecutionSpace, "out");

  Entry const chk("KPool::load_pools");
  if (num_requests < 0) chk.fail_scalar("num_requests", num_requests, "is negative");
  std::size_t const n = static_cast<std::size_t>(num_requests);
  using TC = std::conditional_t<std::is_same<C, float8_e4m3>::value, float, C>;
  if (cache.is_allocated())
    chk.extent_is("out", 2, out.extent(2), static_cast<std::size_t>(cache.head_dim()),
                  "the cache's head_dim");
  check_cache_shapes<ExecutionSpace, TC>(chk, space, cache, block_table,
                                                  cache.head_dim(), n);
  chk.extent_at_least(counts_name, 0, counts_extent, n, "num_requests");
  chk.extent_at_least("out", 0, out.extent(0), n, "num_requests");
  if (out.extent(1) > 0x7FFFFFFF)
    chk.fail("out", "extent 1", -1, std::to_string(out.extent(1)), "is too many pools");
  if (options.validate) {
    std::vector<std::int64_t> const np = host_counts();
    auto const table = host_block_table(space, block_table, n);
    for (std::size_t r = 0; r < n; ++r) {
      if (np[r] < 0 || static_cast<std::size_t>(np[r]) > out.extent(1))
        chk.fail_row(counts_name, static_cast<std::int64_t>(r), np[r],
                     np[r] < 0 ? "is negative"
                               : "exceeds the " + std::to_string(out.extent(1)) +
                                     " pools a row of out holds");
      check_pool_blocks(chk, table, static_cast<std::int64_t>(r), 0, np[r],
                                 cache.num_blocks(), cache.block_pools(), "read");
    }
  }

  bool const unrotate = domain == PoolDomain::original && cache.rotated();
  LoadPoolsFunctor<ExecutionSpace, C, A, O> f;
  f.cache = cache_target<C, A>(cache, block_table);
  f.cache.shard = Shard();  // a shard's own pools, by their local ids
  f.num_pools = counts;
  f.out = View3<O, MemorySpace>(out);
  f.max_pools = out.extent(1);
  f.num_requests = num_requests;
  f.unrotate = unrotate;
  std::uint64_t const items = static_cast<std::uint64_t>(n) * out.extent(1);
  LaunchShape const shape =
      unrotate ? cache_items_shape<ExecutionSpace, A>(
                     chk, "out", space, f, items, cache.head_dim(), 1, 1,
                     options.team_size)
               : items_shape(chk, "out", space, f, items,
                                      cache.head_dim(), 1, options.team_size);
  launch_items(space, "KPool::load_pools", shape, f);
}

}  // namespace Details

/// Writes every pool of the last step into the paged cache (docs/indexer.md,
/// "The pool cache"): rows [0, count) of `out`, row o being pool pool_id(o)
/// of batch row batch_row(o), stored at block block_table(batch_row(o),
/// pool_id(o) / block_pools), entry pool_id(o) % block_pools, as Q(R(x)).
/// count is read on the device: with options.validate off nothing waits
/// for the host (one launch over the output's capacity; teams past count
/// return at once).
///
/// @param space the execution space instance the work is queued on.
/// @param out the step's output, read.
/// @param batch the step's batch: its num_requests is the live rows (its
/// form and views are not read).
/// @param cache the cache (PoolCache<T> native, or PoolCache<float8_e4m3>
/// for pools that are not f64; head_dim the output's), written, and the
/// batch rows' block table, [>= num_requests, max_blocks] int32
/// (KPool::paged).
/// @param options `validate`, `team_size`.
/// @throws KPool::InvalidArgument (nothing written) for a cache without
/// storage, of another head_dim, fp8 for f64 pools, a block table with
/// fewer than num_requests rows; with options.validate, a row whose batch
/// row is not below num_requests, a pool whose block table column does not
/// exist, is negative (unassigned) or not below num_blocks. With validation
/// off such pools are skipped: nothing is written outside the cache, and
/// nothing read outside the inputs.
template <class ExecutionSpace, class T, class C, class MemorySpace>
void store_pools(ExecutionSpace const& space, StepOutput<T, MemorySpace> const& out,
                 Batch<MemorySpace> const& batch, PagedCache<C, MemorySpace>& cache,
                 Options const& options = Options()) {
  Details::store_pools_impl(space, out, batch.num_requests, cache.block_table, cache.cache,
                            options);
}

/// The same, with the paged cache made in the call (KPool::paged): the
/// cache it holds is written.
template <class ExecutionSpace, class T, class C, class MemorySpace>
void store_pools(ExecutionSpace const& space, StepOutput<T, MemorySpace> const& out,
                 Batch<MemorySpace> const& batch, PagedCache<C, MemorySpace>&& cache,
                 Options const& options = Options()) {
  KPool::store_pools(space, out, batch, cache, options);
}

/// Reads pools back from the paged cache, dequantized (s * value; a native
/// cache's values as they are): for each live row r of `batch`, its pools
/// p < n_r, the pools complete before the batch's tokens (a ragged batch:
/// n_r = floor(cache_lengths(r) / K); a decode batch: floor(base_r / K),
/// base_r = p - i for the row's first real entry (r, i) at p), into
/// out(r, p, :). K is the cache's. Pools in the cached domain by default;
/// `domain` original rotates a rotated cache's pools back. Entries of `out`
/// for p >= n_r, and for pools skipped with validation off, are left as
/// they were. What an engine that resumes a sequence, or checks a cache,
/// reads back.
///
/// @param space the execution space instance the work is queued on.
/// @param batch a ragged or decode batch (slot_idx not read).
/// @param cache the cache and the batch rows' block table (KPool::paged),
/// read.
/// @param out [>= num_requests, max_pools, D]: float, or the cache's own
/// type (native caches), or bf16 / f16 (fp8 caches), rounded to nearest
/// even.
/// @param domain PoolDomain::cached (the default) or original.
/// @param options `validate`, `team_size`.
/// @throws KPool::InvalidArgument (nothing written) as store_pools for the
/// cache and its table; with options.validate, a row with more pools than
/// `out` holds (argument "batch") or whose pools' blocks are missing,
/// unassigned or not below num_blocks.
/// @par Launches and synchronization
/// One launch on `space` (two with `original` on a rotated cache's
/// staging). With options.validate, first fences `space` and copies the
/// batch's cache lengths (or positions) and the block table's live rows
/// to the host.
template <class ExecutionSpace, class C, class MemorySpace, class OutView>
void load_pools(ExecutionSpace const& space, Batch<MemorySpace> const& batch,
                PagedCache<C, MemorySpace> const& cache, OutView const& out,
                PoolDomain domain = PoolDomain::cached, Options const& options = Options()) {
  Details::Checker const chk("KPool::load_pools");
  Details::PoolCounts counts;
  counts.kpool = cache.cache.kpool() > 0 ? cache.cache.kpool() : 1;
  std::size_t const B = batch.size();
  std::size_t const n = batch.num_requests < 0 ? 0 : static_cast<std::size_t>(batch.num_requests);
  chk.num_requests_within(batch.num_requests, B);
  if (cache.cache.is_allocated() && cache.cache.kpool() < 1)
    chk.fail("cache", "kpool", -1, "0",
             "is a cache built without its K: load_pools counts a row's pools by it");
  std::function<std::vector<std::int64_t>()> host_counts;
  if (batch.is_decode()) {
    counts.from = Details::PoolCounts::From::decode;
    counts.positions = batch.positions;
    counts.next_n = static_cast<int>(batch.next_n());
    host_counts = [&] {
      auto const h = Details::host_readable(
          space, Kokkos::subview(batch.positions, std::make_pair(std::size_t(0), n), Kokkos::ALL));
      std::vector<std::int64_t> v(n);
      for (std::size_t r = 0; r < n; ++r)
        v[r] = static_cast<std::int64_t>(
            Details::decode_row_base(h, static_cast<std::int64_t>(r), counts.next_n) /
            static_cast<std::uint64_t>(counts.kpool));
      return v;
    };
  } else {
    chk.batch_shape(batch.row_offsets, batch.cache_lengths, batch.num_requests);
    counts.from = Details::PoolCounts::From::ragged;
    counts.cache_lengths = batch.cache_lengths;
    host_counts = [&] {
      std::vector<std::uint32_t> const c = Details::host_copy(space, batch.cache_lengths, n);
      std::vector<std::int64_t> v(n);
      for (std::size_t r = 0; r < n; ++r) v[r] = c[r] / counts.kpool;
      return v;
    };
  }
  Details::load_pools_impl(space, cache.cache, cache.block_table, counts, "batch", B,
                           host_counts, batch.num_requests, out, domain, options);
}

}  // namespace KPool

#endif
