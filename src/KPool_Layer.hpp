#ifndef KPOOL_LAYER_HPP
#define KPOOL_LAYER_HPP

#include <KPool_Config.hpp>
#include <KPool_LayerConfig.hpp>
#include <cache/KPool_PagedCache.hpp>
#include <cache/KPool_PoolCache.hpp>
#include <common/KPool_Batch.hpp>
#include <common/KPool_Exceptions.hpp>
#include <common/KPool_Float8.hpp>
#include <common/KPool_Options.hpp>
#include <common/KPool_Types.hpp>
#include <pool/KPool_Ring.hpp>
#include <pool/KPool_Step.hpp>
#include <ranks/KPool_Communicator.hpp>
#include <ranks/KPool_ShardSelect.hpp>
#include <common/detail/KPool_KokkosExt.hpp>
#include <common/detail/KPool_Views.hpp>
#include <select/KPool_ScoreSelect.hpp>
#include <select/KPool_SelectTokens.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace KPool {

/// One indexer layer: everything of KPool that must agree, owned by one
/// object (docs/api.md, "KPool::Layer"): K, D, H, the ring (and its
/// length), the position embedding ape, the pool cache (element type C,
/// its scale mode and rotation), the StepOutput and the selection
/// workspace. Its members run the low-level entry points on them:
///
/// - step(): KPool::step with the cache, for a ragged mixed batch or a
///   decode batch;
/// - select_tokens() and score_select(): the
///   selection of the batch the last step took, from the same
///   description: after a ragged step, query row t is key row t; after a
///   decode step, query row r * next_n + i is entry (r, i) of positions,
///   the rows built on the device from positions (no host work).
///
/// A sharded layer (LayerConfig::shard over more than one rank) holds this
/// rank's share of the cache: its steps write this rank's pools, and its
/// selections are the global ones through LayerBuffers::communicator, bit
/// for bit one rank's layer over the whole cache (docs/ranks.md).
///
/// The layer keeps its own device copy of what its selection needs from
/// the step's batch (row_offsets and cache_lengths, or positions, and the
/// block table's live rows), made by one launch on the step's instance
/// with no host wait, in buffers sized by LayerConfig: the engine may
/// reuse or overwrite its own buffers as soon as step() returns. Results
/// are bit for bit the low-level calls' on the same objects; the
/// low-level entry points stay for engines that own their buffers.
///
/// @tparam T the storage type of keys, gates and queries.
/// @tparam C the cache element type: T (native) or KPool::float8_e4m3.
/// @tparam MemorySpace the execution space's memory space.
template <class T, class C = T,
          class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
class Layer {
  static_assert(Details::holds_storage_type<T, Layer>());
  static_assert(std::is_same<C, T>::value || std::is_same<C, float8_e4m3>::value,
                "KPool::Layer: C must be T (a native cache) or "
                "KPool::float8_e4m3");

 public:
  /// The storage type T.
  using value_type = T;
  /// The cache element type C.
  using cache_value_type = C;
  /// Where everything lives.
  using memory_space = MemorySpace;
  /// The ring's type.
  using ring_type = Ring<T, MemorySpace>;
  /// The pool cache's type.
  using cache_type = PoolCache<C, MemorySpace>;
  /// The step output's type.
  using output_type = StepOutput<T, MemorySpace>;
  /// ape, [K, D] float.
  using ape_type = Kokkos::View<const float**, Kokkos::LayoutStride, MemorySpace>;
  /// The selection workspace's type.
  using workspace_type = SelectWorkspace<T, MemorySpace>;
  /// The execution space a sharded layer's selections run on (its
  /// communicator's).
  using execution_space = typename MemorySpace::execution_space;
  /// A sharded layer's communicator.
  using communicator_type = Communicator<execution_space>;
  /// A sharded layer's exchange buffers.
  using exchange_type = ShardWorkspace<T, MemorySpace>;

  /// An empty layer, to assign a constructed one to later.
  Layer() = default;

  /// Allocates the ring, the cache, the step output and (with Kokkos
  /// Kernels) the selection workspace on `space`, sized by `config`.
  /// @param space the instance the allocations and zero fills are queued on.
  /// @param config the layer's sizes (LayerConfig).
  /// @param ape [K, D] float in MemorySpace, any layout: the position
  /// embedding within a pool. The layer keeps a reference (a View copy).
  /// @throws KPool::InvalidArgument (entry point "KPool::Layer") for a size
  /// below 1, ape not [K, D], no max_visible nor max_context, the fused
  /// layout without the serving profile, and whatever Ring, PoolCache and
  /// SelectWorkspace refuse; a sharded config (shard.ranks > 1), which
  /// needs the LayerBuffers form and its communicator.
  template <class ExecutionSpace, class ApeView>
  Layer(ExecutionSpace const& space, LayerConfig const& config, ApeView const& ape)
      : Layer(space, config, ape, LayerBuffers<T, C, MemorySpace>()) {}

  /// As above, adopting the buffers `buffers` holds (LayerBuffers): an
  /// engine-owned cache, a workspace shared with other layers. An adopted
  /// cache must be what the config describes (head_dim, kpool, profile,
  /// layout, scale, rotation; num_blocks and block_pools 0 in the config
  /// take the cache's); an adopted workspace must have the config's heads
  /// and head_dim and rows of at least its max_visible pools. A sharded
  /// layer (config.shard.ranks > 1) needs buffers.communicator, of
  /// config.shard's ranks and rank, and config.max_topk; its cache is
  /// config.shard's share (an adopted unsharded cache is taken as that
  /// share, PoolCache::sharded).
  /// @throws KPool::InvalidArgument (entry point "KPool::Layer") as above,
  /// or naming the buffer (argument "cache", "workspace" or
  /// "communicator") and the field that disagrees.
  template <class ExecutionSpace, class ApeView>
  Layer(ExecutionSpace const& space, LayerConfig const& config, ApeView const& ape,
        LayerBuffers<T, C, MemorySpace> const& buffers)
      : config_(config) {
    static_assert(std::is_same<typename ExecutionSpace::memory_space, MemorySpace>::value,
                  "KPool::Layer: MemorySpace must be the execution space's");
    KPOOL_IMPL_CHECK_VIEW(ApeView, float, 2, ExecutionSpace, "ape");
    Details::Checker const chk("KPool::Layer");
    cache_type const& adopted = buffers.cache;
    if (adopted.is_allocated()) {
      if (config_.num_blocks == 0) config_.num_blocks = adopted.num_blocks();
      if (config_.block_pools == 0) config_.block_pools = adopted.block_pools();
    }
    LayerConfig const& c = config_;
    auto const at_least_1 = [&](char const* name, long long v) {
      if (v < 1) chk.fail("config", name, -1, std::to_string(v), "is not at least 1");
    };
    at_least_1("kpool", c.kpool);
    at_least_1("head_dim", c.head_dim);
    at_least_1("max_slots", c.max_slots);
    at_least_1("max_batch", c.max_batch);
    at_least_1("max_tokens", static_cast<long long>(c.max_tokens));
    at_least_1("num_blocks", c.num_blocks);
    at_least_1("block_pools", c.block_pools);
    at_least_1("num_heads", c.num_heads);
    if (c.drafts < 0)
      chk.fail("config", "drafts", -1, std::to_string(c.drafts), "is negative");
    check_shard(chk, buffers.communicator.get());
    chk.extent_is("ape", 0, ape.extent(0), static_cast<std::size_t>(c.kpool),
                  "config.kpool");
    chk.extent_is("ape", 1, ape.extent(1), static_cast<std::size_t>(c.head_dim),
                  "config.head_dim");
    if (c.layout == CacheLayout::fused && c.profile != CacheProfile::serving)
      chk.fail("config", "layout", -1, "fused",
               "is the serving profile's layout (set config.profile = serving)");
    int const R = c.ring_length > 0 ? c.ring_length
                                    : ring_type::serving_length(c.kpool, c.drafts);
    config_.ring_length = R;
    if (c.scale == CacheScale::none && cache_type::is_fp8)
      config_.scale = c.profile == CacheProfile::serving ? CacheScale::pow2 : CacheScale::amax;
    if (c.max_visible == 0 && c.max_context > 0)
      config_.max_visible = (c.max_context + static_cast<std::size_t>(c.kpool) - 1) /
                            static_cast<std::size_t>(c.kpool);
    if (c.max_visible == 0)
      chk.fail("config", "max_visible", -1, "0",
               "and max_context 0 leave the selection workspace unsized: give the "
               "longest context (max_context, in tokens) or the most pools a query "
               "row sees (max_visible)");
    if (c.select_rows == 0) config_.select_rows = c.max_tokens;
    // The block table's columns the layer keeps: those of max_visible
    // pools, and the workspace holds every pool they address (so that
    // a selection without validation takes it, docs/validation.md).
    std::size_t const bp = static_cast<std::size_t>(c.block_pools);
    std::size_t const table_columns = (config_.max_visible + bp - 1) / bp;
    std::size_t const table_pools = table_columns * bp;
    if (adopted.is_allocated()) {
      check_adopted_cache(chk, adopted);
      cache_ = adopted;
      if (!adopted.shard().sharded()) cache_ = adopted.sharded(c.shard);
    } else if (c.layout == CacheLayout::fused) {
      using bytes_type = typename cache_type::bytes_type;
      bytes_type const bytes(Kokkos::view_alloc(space, "KPool::Layer::cache_bytes"),
                             static_cast<std::size_t>(c.num_blocks),
                             static_cast<std::size_t>(c.block_pools) *
                                 (static_cast<std::size_t>(c.head_dim) + 4));
      cache_ = cache_type(bytes, c.block_pools, c.head_dim, c.kpool, c.rotate);
    } else {
      cache_ = cache_type(space, c.num_blocks, c.block_pools, c.head_dim, c.kpool, c.scale,
                          c.rotate, c.profile);
    }
    if (!adopted.is_allocated()) cache_ = cache_.sharded(c.shard);
    if (c.shard.sharded()) {
      communicator_ = buffers.communicator;
      exchange_ = exchange_type(space, c.max_tokens, c.max_topk, c.shard.ranks);
    }
    ape_ = ape;
    ring_ = ring_type(space, c.max_slots, c.kpool, c.head_dim, R);
    out_ = output_type(space, output_type::capacity_for(c.max_tokens, c.max_batch, c.kpool),
                       c.max_batch, c.head_dim);
    if (buffers.workspace.is_allocated()) {
      workspace_type const& w = buffers.workspace;
      auto const differs = [&](char const* field, std::size_t got, std::string const& want) {
        chk.fail("workspace", field, -1, std::to_string(got), want);
      };
      if (w.num_heads() != c.num_heads)
        differs("num_heads", static_cast<std::size_t>(w.num_heads()),
                "does not match config.num_heads = " + std::to_string(c.num_heads));
      if (w.head_dim() != c.head_dim)
        differs("head_dim", static_cast<std::size_t>(w.head_dim()),
                "does not match config.head_dim = " + std::to_string(c.head_dim));
      if (w.max_visible() < table_pools)
        differs("max_visible", w.max_visible(),
                "is less than the pools a query row of this layer may see (" +
                    std::to_string(table_pools) + ": max_visible = " +
                    std::to_string(c.max_visible) + " rounded up to whole blocks of " +
                    std::to_string(c.block_pools) + ")");
      workspace_ = w;
    } else {
      workspace_ = workspace_type(space, c.select_rows, table_pools, c.num_heads, c.head_dim);
    }
    std::size_t const B = static_cast<std::size_t>(c.max_batch);
    kept_offsets_ = Kokkos::View<std::uint32_t*, MemorySpace>(
        Kokkos::view_alloc(space, "KPool::Layer::row_offsets"), B + 1);
    kept_lengths_ = Kokkos::View<std::uint32_t*, MemorySpace>(
        Kokkos::view_alloc(space, "KPool::Layer::cache_lengths"), B);
    kept_positions_ = Kokkos::View<std::int32_t*, MemorySpace>(
        Kokkos::view_alloc(space, "KPool::Layer::positions"), c.max_tokens);
    kept_table_ = Kokkos::View<std::int32_t**, Kokkos::LayoutRight, MemorySpace>(
        Kokkos::view_alloc(space, "KPool::Layer::block_table"), B, table_columns);
  }

  /// @return the sizes, defaults filled in (ring_length, scale,
  /// max_visible, select_rows; num_blocks and block_pools of an adopted
  /// cache).
  LayerConfig const& config() const { return config_; }
  /// @return K.
  int kpool() const { return config_.kpool; }
  /// @return D.
  int head_dim() const { return config_.head_dim; }
  /// @return H.
  int num_heads() const { return config_.num_heads; }
  /// @return the ring (its length ring().ring_length()).
  ring_type& ring() { return ring_; }
  /// @return the ring, read only.
  ring_type const& ring() const { return ring_; }
  /// @return the pool cache (built for K).
  cache_type& cache() { return cache_; }
  /// @return the pool cache, read only.
  cache_type const& cache() const { return cache_; }
  /// @return the last step's pools (StepOutput::to_host reads them).
  output_type const& output() const { return out_; }
  /// @return ape, [K, D].
  ape_type const& ape() const { return ape_; }
  /// @return the selection workspace (its own, select_rows rows of
  /// max_visible pools, or the one it shares).
  workspace_type& workspace() { return workspace_; }

  /// KPool::step with the layer's ring, ape, output and cache (docs/api.md,
  /// "One batch argument"): a ragged batch with a [total_tokens, D] key
  /// (prefill chunks, continuations, decodes, rewinds), or a decode batch
  /// with a [B, next_n, D] key. The batch and the block table are kept for
  /// the selection that follows.
  /// @param space the execution space instance all work is queued on.
  /// @param key [total_tokens, D] or [B, next_n, D] T.
  /// @param gate the same shape as key.
  /// @param batch a ragged or decode batch with each row's ring slot
  /// (KPool::ragged_batch, KPool::decode_batch).
  /// @param block_table [>= num_requests, max_blocks] int32: the cache
  /// blocks of each live row.
  /// @param options as KPool::step.
  /// @return the output, holding the pools this step closed.
  /// @throws KPool::InvalidArgument (entry point "KPool::Layer::step") for
  /// a call past the layer's sizes (max_batch, max_tokens), and as
  /// KPool::step; nothing written then.
  template <class ExecutionSpace, class KeyView, class GateView, class BlockTableView>
  output_type const& step(ExecutionSpace const& space, KeyView const& key,
                          GateView const& gate, Batch<MemorySpace> const& batch,
                          BlockTableView const& block_table,
                          Options const& options = Options()) {
    if constexpr (Kokkos::is_view<KeyView>::value) {
      std::size_t const rows = KeyView::rank == 3 ? key.extent(0) * key.extent(1) : key.extent(0);
      check_config_fits("KPool::Layer::step", "key", "", rows, "token rows", "batch",
                        batch.size());
    }
    auto cache = KPool::paged(cache_, block_table);
    KPool::step(space, ring_, key, gate, ape_, batch, cache, out_, options);
    keep_batch(space, batch, cache.block_table);
    if constexpr (Kokkos::is_view<KeyView>::value)
      rows_ = batch.is_decode() ? batch.size() * batch.next_n() : key.extent(0);
    return out_;
  }

#if KPOOL_ENABLE_DEPRECATED
  /// The positional form of step() with a ragged batch (as
  /// KPool::ragged_batch(row_offsets, cache_lengths, slot_idx,
  /// num_requests)); retired.
  template <class ExecutionSpace, class KeyView, class GateView, class RowOffsetsView,
            class CacheLengthsView, class SlotView, class BlockTableView>
  [[deprecated("use Layer::step(space, key, gate, KPool::ragged_batch(row_offsets, "
               "cache_lengths, slot_idx, num_requests), block_table)")]]
  output_type const& step(ExecutionSpace const& space, KeyView const& key,
                          GateView const& gate, RowOffsetsView const& row_offsets,
                          CacheLengthsView const& cache_lengths,
                          SlotView const& slot_idx, int num_requests,
                          BlockTableView const& block_table,
                          Options const& options = Options()) {
    return step(space, key, gate,
                KPool::ragged_batch(row_offsets, cache_lengths, slot_idx, num_requests),
                block_table, options);
  }

  /// The positional form of step() with a decode batch (as
  /// KPool::decode_batch(positions, slot_idx, num_requests)); retired.
  template <class ExecutionSpace, class KeyView, class GateView, class PositionsView,
            class SlotView, class BlockTableView>
  [[deprecated("use Layer::step(space, key, gate, KPool::decode_batch(positions, slot_idx, "
               "num_requests), block_table)")]]
  output_type const& decode_step(ExecutionSpace const& space, KeyView const& key,
                                 GateView const& gate, PositionsView const& positions,
                                 SlotView const& slot_idx, int num_requests,
                                 BlockTableView const& block_table,
                                 Options const& options = Options()) {
    return step(space, key, gate, KPool::decode_batch(positions, slot_idx, num_requests),
                block_table, options);
  }

#endif  // KPOOL_ENABLE_DEPRECATED

  /// KPool::select_tokens over the layer's cache, with the batch and block
  /// table of the last step() (its batch form's rows: after a ragged step
  /// q row t is key row t; after a decode step q row r * next_n + i is
  /// entry (r, i) of positions).
  /// @param space the execution space instance everything is queued on.
  /// @param q [rows, H, D] T: rows = batch_rows().
  /// @param weights [rows, H] float.
  /// @param topk pools selected per query row.
  /// @param tokens [rows, select_tokens_width(topk, K)] int32.
  /// @param options as KPool::select_tokens.
  /// @throws KPool::InvalidArgument (entry point "KPool::Layer::select_tokens")
  /// when no step has run, or as KPool::select_tokens.
  template <class ExecutionSpace, class QView, class WeightsView, class TokensView>
  void select_tokens(ExecutionSpace const& space, QView const& q,
                     WeightsView const& weights, int topk, TokensView const& tokens,
                     Options const& options = Options()) {
    select_last_batch<true>(space, q, weights, topk, tokens, options);
  }

  /// KPool::score_select over the layer's cache, with the batch of the
  /// last step(), as select_tokens() above.
  /// @param space the execution space instance everything is queued on.
  /// @param q [rows, H, D] T.
  /// @param weights [rows, H] float.
  /// @param topk pools selected per query row.
  /// @param pool_ids [rows, topk] int32.
  /// @param options as KPool::score_select.
  /// @throws KPool::InvalidArgument as select_tokens().
  template <class ExecutionSpace, class QView, class WeightsView, class PoolIdsView>
  void score_select(ExecutionSpace const& space, QView const& q,
                    WeightsView const& weights, int topk, PoolIdsView const& pool_ids,
                    Options const& options = Options()) {
    select_last_batch<false>(space, q, weights, topk, pool_ids, options);
  }

  /// @return the batch of the last step(), over the layer's own copy of
  /// its index arrays (valid while the layer lives; empty before the
  /// first step).
  Batch<MemorySpace> const& batch() const { return batch_; }

  /// @return the query rows of the last batch: the step's key rows, or B *
  /// next_n after a decode step (0 before the first step).
  std::size_t batch_rows() const { return rows_; }

 private:
  // An adopted cache is what the config says the layer's cache is.
  void check_adopted_cache(Details::Checker const& chk, cache_type const& a) const {
    LayerConfig const& c = config_;
    auto const differs = [&](char const* field, std::string const& got, std::string const& want) {
      chk.fail("cache", field, -1, got, "does not match config." + std::string(field) + " = " + want);
    };
    if (a.head_dim() != c.head_dim)
      differs("head_dim", std::to_string(a.head_dim()), std::to_string(c.head_dim));
    if (a.kpool() != c.kpool)
      differs("kpool", std::to_string(a.kpool()), std::to_string(c.kpool));
    if (a.num_blocks() != c.num_blocks)
      differs("num_blocks", std::to_string(a.num_blocks()), std::to_string(c.num_blocks));
    if (a.block_pools() != c.block_pools)
      differs("block_pools", std::to_string(a.block_pools()), std::to_string(c.block_pools));
    if (a.profile() != c.profile)
      differs("profile", cache_profile_name(a.profile()), cache_profile_name(c.profile));
    if (a.layout() != c.layout)
      differs("layout", cache_layout_name(a.layout()), cache_layout_name(c.layout));
    if (a.scale() != c.scale)
      differs("scale", cache_scale_name(a.scale()), cache_scale_name(c.scale));
    if (a.rotated() != c.rotate)
      differs("rotate", a.rotated() ? "true" : "false", c.rotate ? "true" : "false");
    Shard const& s = a.shard();
    if (s.sharded() && (s.rank != c.shard.rank || s.ranks != c.shard.ranks ||
                        s.interleave != c.shard.interleave))
      differs("shard",
              "{" + std::to_string(s.rank) + ", " + std::to_string(s.ranks) + ", " +
                  std::to_string(s.interleave) + "}",
              "{" + std::to_string(c.shard.rank) + ", " + std::to_string(c.shard.ranks) +
                  ", " + std::to_string(c.shard.interleave) + "}");
  }

  // A call within the sizes the layer was built for, refused in the
  // config's words: its rows within LayerConfig::max_tokens, its batch
  // within LayerConfig::max_batch.
  void check_config_fits(char const* entry, char const* rows_argument, char const* rows_where,
                         std::size_t rows, char const* rows_what,
                         char const* batch_argument, std::size_t batch) const {
    Details::Checker const chk(entry);
    if (batch > static_cast<std::size_t>(config_.max_batch))
      chk.fail(batch_argument, "extent 0", -1, std::to_string(batch),
               "is a batch of more rows than LayerConfig::max_batch = " +
                   std::to_string(config_.max_batch) + " (the layer's size)");
    if (rows > config_.max_tokens)
      chk.fail(rows_argument, rows_where, -1, std::to_string(rows),
               std::string("is more ") + rows_what + " than LayerConfig::max_tokens = " +
                   std::to_string(config_.max_tokens) + " (the layer's size)");
  }

  // The layer's copy of what its selection needs from a step's batch (its
  // rows, and the block table's live rows, in the columns the layer
  // keeps; columns past the caller's table read -1): one launch on the
  // step's instance, no host wait. The step has checked the batch's
  // shapes and, with validation, its data.
  template <class ExecutionSpace, class Table>
  void keep_batch(ExecutionSpace const& space, Batch<MemorySpace> const& batch,
                  Table const& table) {
    std::size_t const B = batch.size();
    std::size_t const next_n = batch.next_n();
    bool const decode = batch.is_decode();
    Details::KeepBatchFunctor<MemorySpace> f;
    f.decode = decode;
    f.batch = B;
    f.next_n = next_n;
    f.index_items = decode ? B * next_n : B + 1;
    f.live = static_cast<std::size_t>(batch.num_requests);
    f.columns = kept_table_.extent(1);
    f.table_columns = table.extent(1);
    f.offsets = kept_offsets_;
    f.lengths = kept_lengths_;
    f.positions = kept_positions_;
    f.table = kept_table_;
    f.src_offsets = batch.row_offsets;
    f.src_lengths = batch.cache_lengths;
    f.src_positions = batch.positions;
    f.src_table = table;
    std::size_t const items = std::max(f.index_items, f.live * f.columns);
    Kokkos::parallel_for("KPool::Layer::keep_batch",
                         Kokkos::RangePolicy<ExecutionSpace, Kokkos::IndexType<std::int64_t>>(
                             space, 0, static_cast<std::int64_t>(items)),
                         f);
    Batch<MemorySpace> kept;
    kept.kind = batch.kind;
    kept.num_requests = batch.num_requests;
    if (decode) {
      kept.positions = Kokkos::View<const std::int32_t**, Kokkos::LayoutRight, MemorySpace,
                                    Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
          kept_positions_.data(), B, next_n);
    } else {
      kept.row_offsets = Kokkos::subview(kept_offsets_, std::make_pair(std::size_t(0), B + 1));
      kept.cache_lengths = Kokkos::subview(kept_lengths_, std::make_pair(std::size_t(0), B));
    }
    batch_ = kept;
    block_table_ = kept_table_;
    has_batch_ = true;
  }

  // The cache with the last step's block table, for a selection (a
  // sharded one's topk within the exchange's).
  PagedCache<C, MemorySpace> last_paged(char const* what, int topk) const {
    Details::Checker const chk(std::string("KPool::Layer::") + what);
    if (!has_batch_)
      chk.fail("layer", "", -1, "",
               "has run no step yet: a selection follows step(), whose batch it "
               "selects for");
    if (config_.shard.sharded() && topk > config_.max_topk)
      chk.fail_scalar("topk", topk,
                      "is more than LayerConfig::max_topk = " +
                          std::to_string(config_.max_topk) +
                          " (the sharded layer's exchange is sized by it)");
    return PagedCache<C, MemorySpace>{cache_, block_table_};
  }

  // select_tokens() (Expand) and score_select(): KPool::select_tokens or
  // KPool::score_select over the cache and batch of the last step, the
  // sharded form on a sharded layer (on the layer's execution space only),
  // else the one-rank form.
  template <bool Expand, class ExecutionSpace, class QView, class WeightsView, class OutView>
  void select_last_batch(ExecutionSpace const& space, QView const& q, WeightsView const& weights,
                         int topk, OutView const& out, Options const& options) {
    char const* const what = Expand ? "select_tokens" : "score_select";
    auto const select = [](auto&... args) {
      if constexpr (Expand)
        KPool::select_tokens(args...);
      else
        KPool::score_select(args...);
    };
    auto const paged = last_paged(what, topk);
    if (config_.shard.sharded()) {
      if constexpr (std::is_same<ExecutionSpace, execution_space>::value)
        select(space, q, weights, topk, batch_, paged, out, workspace_, exchange_,
               *communicator_, options);
      else
        refuse_space(what);
    } else {
      select(space, q, weights, topk, batch_, paged, out, workspace_, options);
    }
  }

  // A sharded layer's selections run on its communicator's space.
  [[noreturn]] void refuse_space(char const* what) const {
    Details::Checker(std::string("KPool::Layer::") + what)
        .fail("space", "", -1, "",
              "is not the sharded layer's execution space (its communicator's, "
              "Layer::execution_space): run its selections there");
  }

  // The shard, and for a sharded layer its communicator and max_topk.
  void check_shard(Details::Checker const& chk, communicator_type const* comm) const {
    Shard const& s = config_.shard;
    if (s.ranks < 1 || s.rank < 0 || s.rank >= s.ranks || s.interleave < 1)
      chk.fail("config", "shard", -1,
               "{" + std::to_string(s.rank) + ", " + std::to_string(s.ranks) + ", " +
                   std::to_string(s.interleave) + "}",
               "is not a shard: ranks and interleave at least 1, rank in [0, ranks)");
    if (!s.sharded()) return;
    if (config_.max_topk < 1)
      chk.fail("config", "max_topk", -1, std::to_string(config_.max_topk),
               "is not at least 1: a sharded layer sizes its exchange by it");
    if (comm == nullptr)
      chk.fail("communicator", "", -1, "",
               "is empty: a sharded layer (config.shard.ranks = " + std::to_string(s.ranks) +
                   ") selects through the ranks' all-gather (LayerBuffers::communicator)");
    if (comm->size() != s.ranks || comm->rank() != s.rank)
      chk.fail("communicator", "", -1,
               "rank " + std::to_string(comm->rank()) + " of " + std::to_string(comm->size()),
               "is not config.shard's rank " + std::to_string(s.rank) + " of " +
                   std::to_string(s.ranks));
  }

  LayerConfig config_;
  ape_type ape_;
  ring_type ring_;
  cache_type cache_;
  output_type out_;
  workspace_type workspace_;
  // A sharded layer's exchange and all-gather.
  exchange_type exchange_;
  std::shared_ptr<communicator_type> communicator_;
  // The last step's batch and block table.
  bool has_batch_ = false;
  Batch<MemorySpace> batch_;
  Details::View2<const std::int32_t, MemorySpace> block_table_;
  std::size_t rows_ = 0;
  // The layer's copy of a step's batch (keep_batch), sized by the config.
  Kokkos::View<std::uint32_t*, MemorySpace> kept_offsets_, kept_lengths_;
  Kokkos::View<std::int32_t*, MemorySpace> kept_positions_;
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, MemorySpace> kept_table_;
};

}  // namespace KPool

#endif
