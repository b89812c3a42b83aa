#ifndef KPOOL_CACHE_PAGED_CACHE_HPP
#define KPOOL_CACHE_PAGED_CACHE_HPP

#include <cache/KPool_PoolCache.hpp>
#include <common/detail/KPool_Validate.hpp>

#include <cstdint>

namespace KPool {

/// A pool cache with the block table a call reads it by: the cache
/// travels with its block table (docs/api.md, "One batch argument"). Pool
/// p of live batch row r is entry p % block_pools of block
/// block_table(r, p / block_pools). Both are handles: a PagedCache copies
/// no data, and a call that writes it writes the cache's own storage.
/// Made by KPool::paged.
template <class C, class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
struct PagedCache {
  /// The cache element type.
  using value_type = C;
  /// Where the cache and the table live.
  using memory_space = MemorySpace;
  /// The cache (K is cache.kpool()).
  PoolCache<C, MemorySpace> cache;
  /// [>= num_requests, max_blocks] int32: each live batch row's blocks.
  Kokkos::View<const std::int32_t**, Kokkos::LayoutStride, MemorySpace> block_table;
};

/// The cache read or written through `block_table`.
/// @param cache the layer's pool cache.
/// @param block_table [>= num_requests, max_blocks] int32 in the cache's
/// memory space, any layout: each live batch row's blocks (-1: unassigned).
/// @return the pair, as the steps, store_pools and the selections take it.
template <class C, class MemorySpace, class BlockTableView>
PagedCache<C, MemorySpace> paged(PoolCache<C, MemorySpace> const& cache,
                                 BlockTableView const& block_table) {
  using Space = PoolCache<C, MemorySpace>;  // its memory_space
  KPOOL_IMPL_CHECK_VIEW(BlockTableView, std::int32_t, 2, Space, "block_table");
  return PagedCache<C, MemorySpace>{cache, block_table};
}

}  // namespace KPool

#endif
