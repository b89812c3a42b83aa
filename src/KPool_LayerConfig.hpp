#ifndef KPOOL_LAYER_CONFIG_HPP
#define KPOOL_LAYER_CONFIG_HPP

/// @file
/// KPool::Layer's sizes (LayerConfig), the buffers it adopts
/// (LayerBuffers) and its copy of a step's batch (docs/api.md,
/// "KPool::Layer").

#include <KPool_Config.hpp>
#include <cache/KPool_PoolCache.hpp>
#include <common/KPool_Shard.hpp>
#include <common/KPool_Types.hpp>
#include <ranks/KPool_Communicator.hpp>
#include <select/KPool_ScoreSelect.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace KPool {

namespace Details {

// Layer's copy of a step's batch (Layer::keep_batch): item i copies index
// entry i (positions in a decode batch, row_offsets and cache_lengths in a
// ragged one) and block-table entry i of the live rows, in the layer's
// columns (-1 past the caller's table).
template <class M>
struct KeepBatchFunctor {
  bool decode = false;
  std::size_t batch = 0, next_n = 0, index_items = 0, live = 0, columns = 0, table_columns = 0;
  Kokkos::View<std::uint32_t*, M> offsets, lengths;
  Kokkos::View<std::int32_t*, M> positions;
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> table;
  Kokkos::View<const std::uint32_t*, Kokkos::LayoutStride, M> src_offsets, src_lengths;
  Kokkos::View<const std::int32_t**, Kokkos::LayoutStride, M> src_positions, src_table;

  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    std::size_t const u = static_cast<std::size_t>(i);
    if (u < index_items) {
      if (decode) {
        positions(u) = src_positions(u / next_n, u % next_n);
      } else {
        offsets(u) = src_offsets(u);
        if (u < batch) lengths(u) = src_lengths(u);
      }
    }
    if (u < live * columns) {
      std::size_t const r = u / columns, j = u % columns;
      table(r, j) = j < table_columns ? src_table(r, j) : -1;
    }
  }
};

}  // namespace Details

/// The sizes of one indexer layer (KPool::Layer). Fields left 0 take the
/// default their comment gives.
struct LayerConfig {
  /// K, tokens per pool (>= 1).
  int kpool = 0;
  /// D, channels of a key and of a query head (>= 1).
  int head_dim = 0;
  /// H, the indexer query heads of a selection (>= 1).
  int num_heads = 0;
  /// Sequences the ring holds at once (>= 1).
  int max_slots = 0;
  /// S, draft tokens a decode row sends besides the next token (>= 0).
  int drafts = 0;
  /// R; 0: Ring::serving_length(kpool, drafts), long enough for a rewind
  /// to the first rejected draft (docs/ring.md, "Rewinds").
  int ring_length = 0;
  /// The largest batch size B of a call (>= 1).
  int max_batch = 0;
  /// The most token rows of a step (key rows; B * next_n for a decode
  /// step), which is also the most query rows of a selection (>= 1).
  std::size_t max_tokens = 0;
  /// Blocks of the pool cache (>= 1).
  int num_blocks = 0;
  /// Pools a cache block holds (>= 1).
  int block_pools = 0;
  /// The fp8 cache's scale mode; none (the default) gives amax for an fp8
  /// cache of the exact profile, pow2 for the serving profile, and is the
  /// only mode of a native cache.
  CacheScale scale = CacheScale::none;
  /// Whether the cache stores pools rotated (head_dim a power of two).
  bool rotate = false;
  /// The cache's profile (docs/indexer.md, "The serving profile"): exact
  /// (the default), or serving (an fp8 cache with pow2 scales, byte for
  /// byte what the engines store).
  CacheProfile profile = CacheProfile::exact;
  /// The cache's byte layout: split (the default: values and scales
  /// views), or fused (the serving profile's engines' layout: one byte
  /// buffer, each block's entries then its scales).
  CacheLayout layout = CacheLayout::split;
  /// The longest sequence, in tokens, the layer serves: its query rows see
  /// at most ceil(max_context / kpool) pools, which sizes the selection
  /// workspace when max_visible is 0. One of the two must be given.
  std::size_t max_context = 0;
  /// The most pools a query row sees (the selection workspace's row
  /// length); 0: ceil(max_context / kpool).
  std::size_t max_visible = 0;
  /// Query rows the layer's own selection workspace holds (0: max_tokens);
  /// a selection of more rows runs in chunks of this many, with the same
  /// result.
  std::size_t select_rows = 0;
  /// The share of the pool cache this rank holds (docs/ranks.md): {rank,
  /// ranks, interleave}; ranks 1 (the default) is the whole cache. With
  /// more ranks the layer's steps write only this rank's pools (its block
  /// table holds its local pools) and its selections are the global ones,
  /// through LayerBuffers::communicator, bit for bit one rank's over the
  /// whole cache.
  Shard shard;
  /// A sharded layer only: the largest topk a selection asks for (>= 1),
  /// which sizes the ranks' exchange (ShardWorkspace).
  int max_topk = 0;
};

/// Buffers a Layer adopts instead of allocating its own (each one left
/// empty is allocated by the layer): an engine-owned pool cache, in either
/// layout (for example PoolCache's fused-layout constructor over an
/// unmanaged View of the engine's bytes), and a selection workspace shared
/// by several layers; and a sharded layer's communicator, which only the
/// engine can make. A Layer holds a View copy of each (the same memory);
/// the calls on one execution space instance run in order, so layers that
/// share a workspace and select on one instance never overlap.
/// @tparam T, C, MemorySpace as the Layer's.
template <class T, class C = T,
          class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
struct LayerBuffers {
  /// The layer's pool cache; empty: the layer allocates one from its config.
  PoolCache<C, MemorySpace> cache;
  /// The selection workspace; empty: the layer allocates one, select_rows
  /// rows of max_visible pools.
  SelectWorkspace<T, MemorySpace> workspace;
  /// The all-gather of a sharded layer's selections (LayerConfig::shard
  /// with ranks > 1; required there, not used otherwise): its size() the
  /// shard's ranks and its rank() the shard's rank, for example a
  /// KPool::MpiCommunicator (<mpi/KPool_MpiCommunicator.hpp>). Layers may
  /// share one; the selections run on its execution space.
  std::shared_ptr<Communicator<typename MemorySpace::execution_space>> communicator;
};

}  // namespace KPool

#endif
