#ifndef KPOOL_SELECT_SCORE_SELECT_HPP
#define KPOOL_SELECT_SCORE_SELECT_HPP

#include <KPool_Config.hpp>


#include <cache/KPool_PoolCache.hpp>
#include <common/KPool_Float8.hpp>
#include <common/KPool_Options.hpp>
#include <common/KPool_Types.hpp>
#include <select/detail/KPool_SelectCall.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

namespace KPool {

/// Scratch for the selection stage, built for one scoring engine: one key
/// per (query row, visible pool), a decode batch's rows, and only that
/// engine's buffers (the blas engine's staging). Allocate once, at the
/// largest call you will make (rows of q, pools a row can see, heads,
/// head_dim), and reuse: score_select and select_tokens allocate nothing.
/// Memory: max_tokens * max_visible keys of 4 bytes (8 for f64), the
/// prepared queries, max_tokens * H * (D + 1) values of 4 bytes (8 for
/// f64), and 8 bytes a row, plus with ScoreEngine::blas about 12 MiB of
/// staging at H = 32, D = 128.
///
/// @tparam T the queries' storage type; scores are f64 when T is f64, f32
/// otherwise.
/// @tparam MemorySpace where it lives: the execution space's memory space.
template <class T, class MemorySpace =
                       Kokkos::DefaultExecutionSpace::memory_space>
class SelectWorkspace {
  static_assert(Details::holds_storage_type<T, SelectWorkspace>());

 public:
  /// The queries' storage type.
  using storage_type = T;
  /// Where the buffers live.
  using memory_space = MemorySpace;
  /// The arithmetic of the scores: f64 for f64 queries, else f32.
  using score_type = accumulator_t<T>;
  /// A score as an order-preserving unsigned key (32 or 64 bits).
  using key_type = Details::score_key_t<score_type>;

  /// An empty workspace (is_allocated() is false); selections refuse it.
  SelectWorkspace() = default;

  /// Allocates the buffers on `space` (labelled
  /// KPool::SelectWorkspace::keys, ...::prepared_queries,
  /// ...::prepared_weights and ...::fused_tickets (the
  /// one buffer filled, with zeros, on `space`); on a device (or with
  /// device shapes), for max_visible up to 65535 and the automatic or
  /// tensor_cores engine, ...::row_histograms, 8 KiB a row
  /// (Options::score_histograms); for max_visible
  /// above 65536 the long rows' ...::segment_histograms and
  /// ...::split_plans, a quarter as many 4-byte words as keys in all; for
  /// the blas engine its staging buffers).
  /// @param space the execution space instance the allocation is queued on.
  /// @param max_tokens the most query rows (rows of q) a call will have.
  /// @param max_visible the most pools a query row will see.
  /// @param num_heads H, the query heads.
  /// @param head_dim D, the cache's head_dim.
  /// @param engine the scoring engine every selection through this
  /// workspace uses: the one place it is chosen (the default, automatic:
  /// the execution space's own choice, docs/indexer.md, "The scoring
  /// engines"). ScoreEngine::blas stages its buffers (hosts with Kokkos
  /// Kernels). An engine that does not take a call (tensor_cores over a
  /// native f32 cache, say) is refused by name when the call is made.
  /// @throws KPool::InvalidArgument (entry point "KPool::SelectWorkspace")
  /// for sizes below 1, max_visible above 2^31 - 1, a key buffer past
  /// the address space, or blas where it does not exist (a device memory
  /// space, or no Kokkos Kernels).
  template <class ExecutionSpace>
  SelectWorkspace(ExecutionSpace const& space, std::size_t max_tokens,
                  std::size_t max_visible, int num_heads, int head_dim,
                  ScoreEngine engine = ScoreEngine::automatic)
      : max_tokens_(max_tokens),
        max_visible_(max_visible),
        num_heads_(num_heads),
        head_dim_(head_dim),
        engine_(engine) {
    static_assert(Kokkos::SpaceAccessibility<ExecutionSpace, MemorySpace>::accessible,
                  "KPool::SelectWorkspace: the execution space must reach the memory space");
    Details::Checker const chk("KPool::SelectWorkspace");
    if (max_tokens < 1) chk.fail_scalar("max_tokens", 0, "is not at least 1");
    if (max_visible < 1) chk.fail_scalar("max_visible", 0, "is not at least 1");
    if (max_visible > Details::max_sequence_length)
      chk.fail("max_visible", "", -1, std::to_string(max_visible),
               "exceeds 2^31 - 1, more pools than an int32 position allows");
    if (num_heads < 1) chk.fail_scalar("num_heads", num_heads, "is not at least 1");
    if (head_dim < 1) chk.fail_scalar("head_dim", head_dim, "is not at least 1");
    if (engine == ScoreEngine::blas && !KPOOL_HAS_KOKKOSKERNELS)
      chk.fail("engine", "", -1, "blas",
               "needs Kokkos Kernels, which this KPool was built without");
    if (engine == ScoreEngine::blas &&
        !Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible)
      chk.fail("engine", "", -1, "blas", "is a host engine (this workspace is device memory)");
    if (max_tokens > (std::size_t(1) << 40) / max_visible)
      chk.fail("max_tokens", "", -1, std::to_string(max_tokens),
               "times max_visible = " + std::to_string(max_visible) +
                   " keys is more than the workspace can hold");
    keys_ = Kokkos::View<key_type*, MemorySpace>(
        Kokkos::view_alloc(space, Kokkos::WithoutInitializing,
                           "KPool::SelectWorkspace::keys"),
        max_tokens * max_visible);
    // Rows longer than the split length select through per-segment
    // counts and a plan a row (docs/indexer.md, "Top-k").
    Details::SelectSplit const split{};
    split_from_ = split.from;
    split_segment_ = split.segment;
    if (max_visible > split.from) {
      std::size_t const segs = (max_visible + split.segment - 1) / split.segment;
      split_segments_ = static_cast<int>(segs);
      seg_hist_ = Kokkos::View<std::uint32_t*, MemorySpace>(
          Kokkos::view_alloc(space, Kokkos::WithoutInitializing,
                             "KPool::SelectWorkspace::segment_histograms"),
          max_tokens * Details::split_region_words(segs));
      split_plans_ = Kokkos::View<std::uint32_t*, MemorySpace>(
          Kokkos::view_alloc(space, Kokkos::WithoutInitializing,
                             "KPool::SelectWorkspace::split_plans"),
          max_tokens * Details::split_plan_words(segs));
    }
    // Every (query row, head) of a chunk, prepared once for the scoring
    // engines (docs/indexer.md, "Scoring").
    std::size_t const row_heads = max_tokens * static_cast<std::size_t>(num_heads);
    prepared_ = buffer(space, "KPool::SelectWorkspace::prepared_queries",
                       row_heads * static_cast<std::size_t>(head_dim));
    prepared_weights_ =
        buffer(space, "KPool::SelectWorkspace::prepared_weights", row_heads);
    // The fused decode selection's words, three a group of rows (its
    // ticket, its queries claimed, its queries prepared): zero here, and
    // put back to zero by each launch.
    fused_tickets_ = Kokkos::View<std::uint32_t*, MemorySpace>(
        Kokkos::view_alloc(space, "KPool::SelectWorkspace::fused_tickets"), 3 * max_tokens);
    // Each row's first-digit histogram built while scoring (8 KiB a row):
    // on devices (and with device shapes), where the tensor-core engine
    // may run and rows are short enough (Options::score_histograms). Each
    // call zeroes its rows' before it scores them.
    if (Details::device_shapes<ExecutionSpace>::value &&
        max_visible <= Details::score_hist_max_pools &&
        (engine == ScoreEngine::automatic || engine == ScoreEngine::tensor_cores))
      row_hist_ = Kokkos::View<std::uint32_t*, MemorySpace>(
          Kokkos::view_alloc(space, Kokkos::WithoutInitializing,
                             "KPool::SelectWorkspace::row_histograms"),
          max_tokens * static_cast<std::size_t>(Details::score_hist_bins));
    // The blas engine's staging: only for it, on hosts with Kokkos Kernels.
    if (engine == ScoreEngine::blas) {
      chunks_ = Details::BlasChunks::for_shape(max_tokens, max_visible, num_heads);
      std::size_t const rows = chunks_.rows * static_cast<std::size_t>(num_heads);
      blas_queries_ = buffer(space, "KPool::SelectWorkspace::blas_queries",
                             rows * head_dim);
      blas_keys_ = buffer(space, "KPool::SelectWorkspace::blas_keys",
                          chunks_.pools * head_dim);
      blas_products_ = buffer(space, "KPool::SelectWorkspace::blas_products",
                              rows * chunks_.pools);
      blas_weights_ = buffer(space, "KPool::SelectWorkspace::blas_weights", rows);
    }
  }

  /// @return the most query rows a call may have.
  std::size_t max_tokens() const { return max_tokens_; }
  /// @return the most pools a query row may see.
  std::size_t max_visible() const { return max_visible_; }
  /// @return H.
  int num_heads() const { return num_heads_; }
  /// @return D.
  int head_dim() const { return head_dim_; }
  /// @return the engine the selections use (automatic: the execution
  /// space's own choice).
  ScoreEngine engine() const { return engine_; }
  /// @return false for a default-constructed workspace.
  bool is_allocated() const { return keys_.data() != nullptr; }

  /// @return the keys, max_tokens() rows of max_visible() (the selection
  /// stage's own use).
  Kokkos::View<key_type*, MemorySpace> const& keys() const { return keys_; }
  /// @return 3 * max_tokens() words, zero between calls: the fused decode
  /// selection's tickets, then its counts of queries claimed and prepared;
  /// the first max_tokens() are also the long rows' tickets of their
  /// counted segments (rows past split_from() pools, which no fused call
  /// has) (the selection stage's own use).
  std::uint32_t* fused_tickets() const { return fused_tickets_.data(); }

  /// Puts the fused decode selection's words and the long rows' tickets
  /// (fused_tickets()) back to zero: one fill queued on `space`, no fence.
  /// Every launch that runs to its end leaves them at zero; one that dies
  /// mid-way (a device fault, a killed stream or process sharing the
  /// workspace, an aborted graph) may leave some set, and the next fused
  /// call through this workspace would then wait for queries no team
  /// prepares, or a long row be planned before all its segments are
  /// counted. Call it after
  /// such a failure, before the workspace is used again (docs/indexer.md,
  /// "One launch for a decode selection"); anywhere else it is needless and
  /// harmless. The other buffers need nothing: every call writes what it
  /// reads.
  template <class ExecutionSpace>
  void reset_counters(ExecutionSpace const& space) const {
    if (fused_tickets_.data() != nullptr) Kokkos::deep_copy(space, fused_tickets_, 0u);
  }
  /// @return each row's first-digit histogram built while scoring,
  /// [max_tokens][2048] (null where the workspace has none; the selection
  /// stage's own use).
  std::uint32_t* row_histograms() const { return row_hist_.data(); }
  /// @return the long rows' regions: per-segment counts, then their sure
  /// ids and candidates (null without long rows).
  std::uint32_t* segment_histograms() const { return seg_hist_.data(); }
  /// @return the long rows' plans (null without them).
  std::uint32_t* split_plans() const { return split_plans_.data(); }
  /// @return segments a long row splits into (0: no row is long).
  int split_segments() const { return split_segments_; }
  /// @return visible pools past which a row is long.
  std::uint64_t split_from() const { return split_from_; }
  /// @return pools a segment of a long row.
  std::uint64_t split_segment() const { return split_segment_; }
  /// @return the chunk's queries as the scoring engines read them,
  /// [max_tokens][H][D] (the selection stage's own use).
  score_type* prepared_queries() const { return prepared_.data(); }
  /// @return their weights, [max_tokens][H].
  score_type* prepared_weights() const { return prepared_weights_.data(); }
  /// @return the BLAS engine's chunk sizes.
  Details::BlasChunks const& blas_chunks() const { return chunks_; }
  /// @return the BLAS engine's staged queries (host memory spaces).
  score_type* blas_queries() const { return blas_queries_.data(); }
  /// @return the BLAS engine's staged keys (host memory spaces).
  score_type* blas_keys() const { return blas_keys_.data(); }
  /// @return the BLAS engine's products (host memory spaces).
  score_type* blas_products() const { return blas_products_.data(); }
  /// @return the BLAS engine's per query head row weights (host memory
  /// spaces).
  score_type* blas_weights() const { return blas_weights_.data(); }

 private:
  template <class ExecutionSpace>
  static Kokkos::View<score_type*, MemorySpace> buffer(
      ExecutionSpace const& space, char const* label, std::size_t n) {
    return Kokkos::View<score_type*, MemorySpace>(
        Kokkos::view_alloc(space, Kokkos::WithoutInitializing, std::string(label)), n);
  }

  std::size_t max_tokens_ = 0;
  std::size_t max_visible_ = 0;
  int num_heads_ = 0;
  int head_dim_ = 0;
  ScoreEngine engine_ = ScoreEngine::automatic;
  Kokkos::View<std::uint32_t*, MemorySpace> fused_tickets_;
  Kokkos::View<score_type*, MemorySpace> prepared_;
  Kokkos::View<score_type*, MemorySpace> prepared_weights_;
  Details::BlasChunks chunks_;
  Kokkos::View<key_type*, MemorySpace> keys_;
  Kokkos::View<std::uint32_t*, MemorySpace> seg_hist_;
  Kokkos::View<std::uint32_t*, MemorySpace> row_hist_;
  Kokkos::View<std::uint32_t*, MemorySpace> split_plans_;
  int split_segments_ = 0;
  std::uint64_t split_from_ = 0;
  std::uint64_t split_segment_ = 1;
  Kokkos::View<score_type*, MemorySpace> blas_queries_;
  Kokkos::View<score_type*, MemorySpace> blas_keys_;
  Kokkos::View<score_type*, MemorySpace> blas_products_;
  Kokkos::View<score_type*, MemorySpace> blas_weights_;
};

/// Scoring and top-k selection over the pool cache (docs/indexer.md,
/// "Scoring" and "Selection"), for either form of the one batch argument
/// (docs/api.md, "One batch argument"). A query row at position pos of its
/// sequence sees the pools p < floor((pos + 1) / K) and scores each as
///   sum_h weights(t, h) * relu(R(q(t, h, :)) . k_p)
/// (k_p the dequantized cached key, R the cache's rotation, relu passing
/// NaN). pool_ids(t, :) receives the min(topk, visible) best pools, higher
/// score first, ties to the lower id, NaN below every number, in ascending
/// id order, then -1. Rows outside the live requests are not touched. K is
/// the cache's.
///
/// - A ragged batch: query row row_offsets(r) + i is position
///   cache_lengths(r) + i of the sequence in batch row r.
/// - A decode batch ([B, next_n] positions): query row r * next_n + i is
///   entry (r, i) of positions, at position base_r + i with base_r = p - i
///   for the row's first real entry (r, i) at p (a padding entry's row is
///   selected as that position: its result means nothing, like the
///   padding); on a device one kernel scores and selects it
///   (Options::decode_selection).
///
/// @param space the execution space instance everything is queued on.
/// @param q [T, H, D] of the workspace's storage type (the cache's type,
/// or any but f64 for an fp8 cache): the indexer queries (T = B * next_n
/// for a decode batch).
/// @param weights [T, H] float: per-head weights.
/// @param topk pools selected per query row, at least 1.
/// @param batch a ragged or decode batch (slot_idx not read).
/// @param cache the layer's pool cache and the batch rows' block table
/// (KPool::paged), read only.
/// @param pool_ids [T, topk] int32, written for the live rows.
/// @param workspace at least one row of max_visible pools, H heads, D;
/// its engine is the call's (SelectWorkspace).
/// @param options validate (with a decode batch also: a base_r below 0 is
/// refused), team_size, decode_selection.
/// @throws KPool::InvalidArgument for bad shapes (always) and bad data
/// (with options.validate), before anything is written (docs/indexer.md,
/// "Bad input").
/// @par Launches and synchronization
/// Per chunk of the workspace's rows, three on `space` (prepare the
/// queries, score, select; a decode batch's fused selection: one), which
/// wait for nothing without validation; with the blas engine the scoring
/// is, per request and chunk of up to 8192 pools and ~256 query head rows,
/// one staging launch, one gemm on the calling thread and one reduction
/// launch, with fences.
template <class ExecutionSpace, class QView, class WeightsView, class C, class MemorySpace,
          class PoolIdsView, class T>
void score_select(ExecutionSpace const& space, QView const& q, WeightsView const& weights,
                  int topk, Batch<MemorySpace> const& batch,
                  PagedCache<C, MemorySpace> const& cache, PoolIdsView const& pool_ids,
                  SelectWorkspace<T, MemorySpace>& workspace,
                  Options const& options = Options()) {
  if constexpr (Details::selection_output_ok<false, ExecutionSpace, PoolIdsView>()) {
    Details::score_select_batch<false>(Details::Entry("KPool::score_select"), space, cache, q,
                                       weights, topk, batch, "pool_ids", pool_ids, workspace,
                                       options);
  }
}

}  // namespace KPool

#endif
