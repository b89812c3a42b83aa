#ifndef KPOOL_SCORE_DETAIL_SCORE_BLAS_HPP
#define KPOOL_SCORE_DETAIL_SCORE_BLAS_HPP

// The BLAS scoring engine (ScoreEngine::blas), for host execution spaces:
// per request and chunk of pools, one launch stages the chunk's keys
// (converted, unscaled) and a chunk of rotated query rows into the
// workspace, one KokkosBlas::gemm multiplies them ([rows * H, D] x
// [D, pools]), and one launch folds the products into keys, pool by pool:
// sum_h w_h relu(s_p * product), w_h the weight prepare_query_row gave the
// query head row (the serving profile folds the query's scale into it). The gemm runs on the calling thread, so
// the engine reads the request layout on the host after fencing the
// execution space instance.

#include <KPool_Config.hpp>
#include <common/KPool_Types.hpp>
#include <common/detail/KPool_ServingQuant.hpp>
#include <common/detail/KPool_KokkosExt.hpp>
#include <common/detail/KPool_Launch.hpp>
#include <common/detail/KPool_Strided.hpp>
#include <common/detail/KPool_Scoring.hpp>

#if KPOOL_HAS_KOKKOSKERNELS
#include <KokkosBlas3_gemm.hpp>
#endif

#include <cstdint>
#include <string>

namespace KPool {
namespace Details {

// Pools one reduction work item folds at once: a run of contiguous product
// columns the compiler vectorizes over.
constexpr int blas_reduce_pools = 64;

// The piece of a call one stage-gemm-reduce round covers: request
// `request`'s pools from pool0 and its rows from query row row0.
template <class C, class A, class MemorySpace>
struct BlasTile {
  SelectBatch batch;
  SelectCache<C, A, MemorySpace> cache;
  int request;
  std::uint64_t pool0;
  std::uint64_t row0;
  int heads;
};

template <class ExecutionSpace, class T, class C>
struct BlasStageFunctor : BlasTile<C, accumulator_t<T>, typename ExecutionSpace::memory_space> {
  using memory_space = typename ExecutionSpace::memory_space;
  using A = accumulator_t<T>;
  using Tile = BlasTile<C, A, memory_space>;
  using Tile::batch, Tile::cache, Tile::request, Tile::pool0, Tile::row0, Tile::heads;

  A const* prepared;          // the chunk's prepared queries [rows][H][D]
  A const* prepared_weights;  // and weights [rows][H]
  A* keys_out;     // [pools, D]
  A* queries_out;  // [rows * H, D]
  A* weights_out;  // [rows * H]: each query head row's folding weight
  int pools;  // items [0, pools) stage keys, the rest query head rows

  KOKKOS_INLINE_FUNCTION void operator()(int item) const {
    int const D = cache.head_dim();
    if (item < pools) {
      stage_key_row(cache, cache.locate(request, static_cast<std::int64_t>(pool0 + item)),
                    keys_out + static_cast<std::size_t>(item) * D, D);
    } else {
      int const ih = item - pools;
      std::uint64_t const t = row0 + ih / heads;
      int const h = ih % heads;
      A* x = queries_out + static_cast<std::size_t>(ih) * D;
      std::uint64_t const at = (t - batch.row_begin) * static_cast<std::uint64_t>(heads) +
                               static_cast<std::uint64_t>(h);
      A const* p = prepared + at * static_cast<std::uint64_t>(D);
      for (int c = 0; c < D; ++c) x[c] = p[c];
      weights_out[ih] = prepared_weights[at];
    }
  }
};

template <class ExecutionSpace, class C, class A>
struct BlasReduceFunctor : BlasTile<C, A, typename ExecutionSpace::memory_space> {
  using memory_space = typename ExecutionSpace::memory_space;
  using Key = score_key_t<A>;
  using Tile = BlasTile<C, A, memory_space>;
  using Tile::batch, Tile::cache, Tile::request, Tile::pool0, Tile::row0, Tile::heads;
  static constexpr int W = blas_reduce_pools;

  SelectRequest req;
  A const* weights;   // [rows * H], as the stage prepared them
  A const* products;  // [rows * H, pools]
  Key* keys;
  int pools;
  int runs;  // ceil(pools / W)

  KOKKOS_INLINE_FUNCTION void operator()(int item) const {
    int const i = item / runs;
    int const j0 = (item % runs) * W;
    std::uint64_t const t = row0 + i;
    std::uint64_t const vis = batch.visible(req, t);
    if (vis <= pool0 + j0) return;
    int const limit = pools - j0 < W ? pools - j0 : W;
    int const n = vis - pool0 - j0 < static_cast<std::uint64_t>(limit)
                      ? static_cast<int>(vis - pool0 - j0)
                      : limit;
    A s[W];
    bool ok[W];
    A acc[W];
    for (int j = 0; j < n; ++j) {
      CacheSlot const slot =
          cache.locate(request, static_cast<std::int64_t>(pool0 + j0 + j));
      ok[j] = slot.block >= 0;
      s[j] = ok[j] ? static_cast<A>(cache.scale_at(slot)) : A(0);
      acc[j] = A(0);
    }
    for (int h = 0; h < heads; ++h) {
      A const w = weights[static_cast<std::size_t>(i) * heads + h];
      A const* prod = products + (static_cast<std::size_t>(i) * heads + h) * pools + j0;
      KPOOL_IMPL_IVDEP
      for (int j = 0; j < n; ++j) acc[j] += w * relu(s[j] * prod[j]);
    }
    Key* out = keys + batch.key_offset(t) + pool0 + j0;
    for (int j = 0; j < n; ++j)
      out[j] = ok[j] ? score_key(acc[j]) : static_cast<Key>(key_not_visible);
  }
};

// Chunk sizes of the BLAS engine's workspace buffers: up to `pools` pools
// staged at once, and query rows so that a gemm has about 256 rows.
struct BlasChunks {
  std::size_t pools = 0;
  std::size_t rows = 0;
  static BlasChunks for_shape(std::size_t max_tokens, std::size_t max_visible,
                              int heads) {
    BlasChunks c;
    c.pools = max_visible < 8192 ? max_visible : 8192;
    std::size_t const r = heads < 256 ? 256 / static_cast<std::size_t>(heads) : 1;
    c.rows = max_tokens < r ? max_tokens : r;
    if (c.rows < 1) c.rows = 1;
    if (c.pools < 1) c.pools = 1;
    return c;
  }
};

#if KPOOL_HAS_KOKKOSKERNELS
// The BLAS engine over a whole call. `queries`, `pool_keys` and `products`
// are the workspace buffers sized by BlasChunks.
template <class ExecutionSpace, class T, class C, class Key>
void score_blas(std::string const& entry, ExecutionSpace const& space,
                SelectBatch const& batch,
                accumulator_t<T> const* prepared, accumulator_t<T> const* prepared_weights,
                SelectCache<C, accumulator_t<T>, typename ExecutionSpace::memory_space> const& cache,
                Key* keys, accumulator_t<T>* queries, accumulator_t<T>* pool_keys,
                accumulator_t<T>* products, accumulator_t<T>* query_weights,
                BlasChunks const& chunks, int heads) {
  using M = typename ExecutionSpace::memory_space;
  using A = accumulator_t<T>;
  static_assert(Kokkos::SpaceAccessibility<Kokkos::HostSpace, M>::accessible,
                "KPool: the BLAS scoring engine runs on host memory only");
  using Matrix = Kokkos::View<A**, Kokkos::LayoutRight, M,
                              Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using ConstMatrix = Kokkos::View<const A**, Kokkos::LayoutRight, M,
                                   Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  // The index arrays may have been written by work queued before this call.
  space.fence();
  std::uint64_t const K = static_cast<std::uint64_t>(batch.kpool);
  int const D = cache.head_dim();
  for (int r = 0; r < batch.num_requests; ++r) {
    SelectRequest const req = batch.request(r);
    if (!req.valid || req.begin == req.end) continue;
    // This chunk's rows of the request: [lo, n) from its first.
    if (req.end <= batch.row_begin || req.begin >= batch.row_end) continue;
    std::uint64_t const lo = batch.row_begin > req.begin ? batch.row_begin - req.begin : 0;
    std::uint64_t const n =
        (req.end < batch.row_end ? req.end : batch.row_end) - req.begin;
    std::uint64_t const c = req.cache_length;
    std::uint64_t const vis_hi = batch.visible(req, req.begin + n - 1);
    for (std::uint64_t p0 = 0; p0 < vis_hi; p0 += chunks.pools) {
      std::uint64_t const chunk = vis_hi - p0 < chunks.pools ? vis_hi - p0 : chunks.pools;
      // Rows that see past p0: (c + i + 1) / K > p0.
      std::uint64_t const need = (p0 + 1) * K;
      std::uint64_t i0 = need > c + 1 ? need - c - 1 : 0;
      if (i0 < lo) i0 = lo;
      bool keys_staged = false;
      for (; i0 < n; i0 += chunks.rows) {
        std::uint64_t const i1 = i0 + chunks.rows < n ? i0 + chunks.rows : n;
        int const rows = static_cast<int>(i1 - i0);
        std::uint64_t const vis_last = batch.visible(req, req.begin + i1 - 1);
        int const np = static_cast<int>((vis_last < p0 + chunk ? vis_last : p0 + chunk) - p0);
        BlasTile<C, A, M> const tile{batch, cache, r, p0, req.begin + i0, heads};
        // The chunk's keys once, for its first rows; later rows reuse them.
        BlasStageFunctor<ExecutionSpace, T, C> const stage{
            tile, prepared, prepared_weights, pool_keys, queries, query_weights,
            keys_staged ? 0 : static_cast<int>(chunk)};
        launch_range(space, entry + "::blas_stage",
                     static_cast<std::size_t>(stage.pools) +
                         static_cast<std::size_t>(rows) * heads,
                     stage);
        keys_staged = true;
        space.fence();
        ConstMatrix const a(queries, static_cast<std::size_t>(rows) * heads, D);
        ConstMatrix const b(pool_keys, static_cast<std::size_t>(np), D);
        Matrix const prod(products, static_cast<std::size_t>(rows) * heads, np);
        KokkosBlas::gemm("N", "T", A(1), a, b, A(0), prod);

        BlasReduceFunctor<ExecutionSpace, C, A> const reduce{
            tile, req, query_weights, products, keys, np,
            (np + blas_reduce_pools - 1) / blas_reduce_pools};
        launch_range(space, entry + "::blas_reduce",
                     static_cast<std::size_t>(rows) * reduce.runs, reduce);
        // The next gemm overwrites the products.
        space.fence();
      }
    }
  }
}
#endif  // KPOOL_HAS_KOKKOSKERNELS

}  // namespace Details
}  // namespace KPool

#endif
