// The harness of the selection tests (tst_select.cpp, tst_select_decode.cpp):
// the scenarios (shapes, batches, caches, queries drawn at random), the
// device calls of score_select and select_tokens on them, the engines each
// backend takes, and the grid of shapes.
#ifndef KPOOL_UNIT_TESTS_SELECT_SCENARIO_HPP
#define KPOOL_UNIT_TESTS_SELECT_SCENARIO_HPP

#include <KPoolSelectReference.hpp>
#include <KPoolTestUtils.hpp>

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace KPoolSelectTest {

using namespace KPoolTest;
namespace SR = KPoolSelectRef;

constexpr std::int32_t kSentinel = KPoolRef::kUntouched;


// ------------------------------------------------------------- scenarios

struct Shape {
  int K = 4, H = 4, D = 64, topk = 16;
  bool fp8 = false, rotated = false;
  int block_pools = 16;
  bool serving = false;  // the serving profile (fp8): cache and queries
  bool fused = false;    // the serving cache in the engines' fused layout
};

inline std::string describe(Shape const& s) {
  std::ostringstream o;
  o << "K=" << s.K << " H=" << s.H << " D=" << s.D << " topk=" << s.topk
    << (s.fp8 ? " fp8" : " native") << (s.rotated ? " rotated" : "")
    << (s.serving ? " serving" : "") << (s.fused ? " fused" : "")
    << " block_pools=" << s.block_pools;
  return o.str();
}

// One call's inputs on the host: the batch, a block table giving each live
// request its own scattered blocks, the cache (with "stale" entries that
// would win if a kernel ever read them as candidates), the queries and the
// weights.
struct Scenario {
  Shape s;
  DType t = DType::f32;
  TestBatch batch;
  int rows = 0;  // rows of q: the live rows and guard rows after them
  int max_blocks = 1;
  std::vector<std::int32_t> table;  // [B][max_blocks], garbage in dead rows
  SR::Cache cache{1, 1, 1, false, false};
  std::vector<double> q;  // [rows][H][D]
  std::vector<double> w;  // [rows][H]
  std::size_t max_visible = 1;

  int B() const { return static_cast<int>(batch.device.cache_lengths.size()); }
  std::vector<std::int32_t> table_row(int r) const {
    return std::vector<std::int32_t>(table.begin() + r * max_blocks,
                                     table.begin() + (r + 1) * max_blocks);
  }
  // The live request owning row t, or -1.
  int owner(int t) const {
    auto const& b = batch.reference;
    for (int r = 0; r < b.num_requests; ++r)
      if (static_cast<std::uint32_t>(t) >= b.row_offsets[r] &&
          static_cast<std::uint32_t>(t) < b.row_offsets[r + 1])
        return r;
    return -1;
  }
  std::int64_t position(int t) const {
    int const r = owner(t);
    return static_cast<std::int64_t>(batch.reference.cache_lengths[r]) + t -
           batch.reference.row_offsets[r];
  }
  SR::Query query(int t) const {
    std::vector<double> qs(q.begin() + static_cast<std::size_t>(t) * s.H * s.D,
                           q.begin() + static_cast<std::size_t>(t + 1) * s.H * s.D);
    std::vector<double> ws(w.begin() + static_cast<std::size_t>(t) * s.H,
                           w.begin() + static_cast<std::size_t>(t + 1) * s.H);
    return SR::Query(qs, ws, s.H, s.D, s.rotated, s.serving);
  }
  SR::RowScores scores(int t, std::vector<bool> const* counted = nullptr) const {
    int const r = owner(t);
    return SR::score_row(cache, table_row(r), query(t), SR::visible(position(t), s.K),
                         counted);
  }
  // Block and entry of pool p of live request r.
  std::pair<int, int> where(int r, std::int64_t p) const {
    return {table[r * max_blocks + static_cast<int>(p / s.block_pools)],
            static_cast<int>(p % s.block_pools)};
  }
};

inline std::vector<double> random_vector(Rng& rng, DType t, int n, double lo, double hi) {
  std::vector<double> v(n);
  for (double& x : v) x = KPoolRef::round_to(t, rng.uniform(lo, hi));
  return v;
}

inline Scenario make_scenario(Shape const& s, DType t,
                       std::vector<std::pair<std::uint32_t, std::uint32_t>> const& live,
                       int B, int guard_rows, std::uint64_t seed) {
  Rng rng(seed);
  Scenario sc;
  sc.s = s;
  sc.t = t;
  sc.batch = make_batch(live, B, rng);
  sc.rows = static_cast<int>(total_rows(sc.batch.device)) + guard_rows;
  std::vector<int> blocks_of(live.size());
  int total_blocks = 0;
  for (std::size_t r = 0; r < live.size(); ++r) {
    std::uint64_t const vis = (live[r].first + live[r].second) / s.K;
    sc.max_visible = std::max<std::size_t>(sc.max_visible, vis);
    // One block more than the visible pools need: its entries are stale.
    blocks_of[r] = static_cast<int>((vis + s.block_pools - 1) / s.block_pools) + 1;
    total_blocks += blocks_of[r];
    sc.max_blocks = std::max(sc.max_blocks, blocks_of[r] + 1);
  }
  int const num_blocks = total_blocks + 2;  // two blocks nobody owns
  std::vector<int> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  for (int i = num_blocks - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
  sc.table.assign(static_cast<std::size_t>(B) * sc.max_blocks, -1);
  int next = 0;
  for (std::size_t r = 0; r < live.size(); ++r)
    for (int j = 0; j < blocks_of[r]; ++j) sc.table[r * sc.max_blocks + j] = perm[next++];
  for (int r = static_cast<int>(live.size()); r < B; ++r)
    for (int j = 0; j < sc.max_blocks; ++j)
      sc.table[r * sc.max_blocks + j] = static_cast<std::int32_t>(rng.next());

  sc.cache = SR::Cache(num_blocks, s.block_pools, s.D, s.fp8, s.rotated);
  sc.cache.serving = s.serving;
  std::vector<bool> live_entry(static_cast<std::size_t>(num_blocks) * s.block_pools, false);
  // Pools as the step stores them in T; an fp8 cache quantizes them anyway,
  // so cheap f32 draws serve there.
  DType const pool_type = s.fp8 ? DType::f32 : t;
  for (std::size_t r = 0; r < live.size(); ++r) {
    std::int64_t const vis = (live[r].first + live[r].second) / s.K;
    for (std::int64_t p = 0; p < vis; ++p) {
      auto const be = sc.where(static_cast<int>(r), p);
      sc.cache.store(be.first, be.second, random_vector(rng, pool_type, s.D, -2, 2), t);
      live_entry[sc.cache.entry(be.first, be.second)] = true;
    }
  }
  // Every other entry is stale: large keys that would rank high if a
  // kernel ever read them as candidates.
  for (int b = 0; b < num_blocks; ++b)
    for (int e = 0; e < s.block_pools; ++e)
      if (!live_entry[sc.cache.entry(b, e)])
        sc.cache.store(b, e, random_vector(rng, pool_type, s.D, -60, 60), t);
  sc.q = random_vector(rng, t, sc.rows * s.H * s.D, -1, 1);
  sc.w.resize(static_cast<std::size_t>(sc.rows) * s.H);
  for (double& x : sc.w) x = static_cast<float>(rng.uniform(-0.5, 1.0));
  return sc;
}

// ----------------------------------------------------------- device calls

// A serving cache in the fused layout (docs/indexer.md): per block the
// entries' bytes, then their f32 scales.
template <class M>
KPool::PoolCache<KPool::float8_e4m3, M> load_fused_cache(SR::Cache const& ref, int kpool) {
  std::size_t const values = static_cast<std::size_t>(ref.block_pools) * ref.D;
  typename KPool::PoolCache<KPool::float8_e4m3, M>::bytes_type bytes(
      "fused", ref.num_blocks, values + 4 * static_cast<std::size_t>(ref.block_pools));
  auto h = Kokkos::create_mirror_view(bytes);
  for (int b = 0; b < ref.num_blocks; ++b)
    for (int e = 0; e < ref.block_pools; ++e) {
      float const sc = static_cast<float>(ref.scale[ref.entry(b, e)]);
      std::memcpy(&h(b, values + 4 * static_cast<std::size_t>(e)), &sc, 4);
      for (int c = 0; c < ref.D; ++c)
        h(b, static_cast<std::size_t>(e) * ref.D + c) = ref.code[ref.entry(b, e) * ref.D + c];
    }
  Kokkos::deep_copy(bytes, h);
  return KPool::PoolCache<KPool::float8_e4m3, M>(bytes, ref.block_pools, ref.D, kpool, ref.rotated);
}

template <class T, class C, class M, class E>
KPool::PoolCache<C, M> load_cache(E const& space, SR::Cache const& ref, int kpool,
                                  bool fused = false) {
  if constexpr (std::is_same<C, KPool::float8_e4m3>::value) {
    if (fused) return load_fused_cache<M>(ref, kpool);
  }
  KPool::PoolCache<C, M> cache(
      space, ref.num_blocks, ref.block_pools, ref.D, kpool,
      !ref.fp8 ? KPool::CacheScale::none
               : ref.serving ? KPool::CacheScale::pow2 : KPool::CacheScale::amax,
      ref.rotated, ref.serving ? KPool::CacheProfile::serving : KPool::CacheProfile::exact);
  auto v = Kokkos::create_mirror_view(cache.values());
  auto s = Kokkos::create_mirror_view(cache.scales());
  for (int b = 0; b < ref.num_blocks; ++b)
    for (int e = 0; e < ref.block_pools; ++e) {
      s(b, e) = static_cast<float>(ref.scale[ref.entry(b, e)]);
      for (int c = 0; c < ref.D; ++c) {
        std::size_t const i = ref.entry(b, e) * ref.D + c;
        if constexpr (std::is_same<C, KPool::float8_e4m3>::value)
          v(b, e, c) = KPool::float8_e4m3::from_bits(ref.code[i]);
        else
          v(b, e, c) = to_storage<C>(ref.value[i]);
      }
    }
  Kokkos::deep_copy(cache.values(), v);
  Kokkos::deep_copy(cache.scales(), s);
  return cache;
}

// Device copies of a scenario's inputs, for one cache element type C.
template <class E, class T, class C>
struct Inputs {
  using M = typename E::memory_space;
  E space;
  BatchViews<M> bv;
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> table;
  Kokkos::View<T***, Kokkos::LayoutRight, M> q;
  Kokkos::View<float**, Kokkos::LayoutRight, M> w;
  KPool::PoolCache<C, M> cache;

  explicit Inputs(Scenario const& sc)
      : bv(sc.batch.device),
        table("block_table", sc.B(), sc.max_blocks),
        q("q", sc.rows, sc.s.H, sc.s.D),
        w("weights", sc.rows, sc.s.H),
        cache(load_cache<T, C, M>(space, sc.cache, sc.s.K, sc.s.fused)) {
    auto ht = Kokkos::create_mirror_view(table);
    for (int r = 0; r < sc.B(); ++r)
      for (int j = 0; j < sc.max_blocks; ++j) ht(r, j) = sc.table[r * sc.max_blocks + j];
    Kokkos::deep_copy(table, ht);
    auto hq = Kokkos::create_mirror_view(q);
    auto hw = Kokkos::create_mirror_view(w);
    for (int t = 0; t < sc.rows; ++t)
      for (int h = 0; h < sc.s.H; ++h) {
        hw(t, h) = static_cast<float>(sc.w[t * sc.s.H + h]);
        for (int c = 0; c < sc.s.D; ++c)
          hq(t, h, c) = to_storage<T>(sc.q[(static_cast<std::size_t>(t) * sc.s.H + h) * sc.s.D + c]);
      }
    Kokkos::deep_copy(q, hq);
    Kokkos::deep_copy(w, hw);
  }
};

// pool_ids (or, with tokens, the token rows) of one call, as a flat host
// vector; the output starts filled with kSentinel.
// The workspace's row length for a call of `sc`: the rows' visible pools,
// or without validation every pool the block table addresses (a shorter
// one is refused then: docs/validation.md).
inline std::size_t workspace_visible(Scenario const& sc, KPool::Options const& o) {
  std::size_t const table = static_cast<std::size_t>(sc.max_blocks) *
                            static_cast<std::size_t>(sc.s.block_pools);
  return o.validate ? sc.max_visible : std::max(sc.max_visible, table);
}

// A call's options and the engine its workspace is built for (the workspace's).
struct EngineOptions : KPool::Options {
  KPool::ScoreEngine engine = KPool::ScoreEngine::automatic;
};

template <class E, class T, class C>
std::vector<std::int32_t> run_with(Scenario const& sc, EngineOptions const& o, bool tokens,
                                   std::size_t ws_rows = 0) {
  using M = typename E::memory_space;
  KPool::ScoreEngine engine = workspace_engine<M>(o.engine);
  if (engine == KPool::ScoreEngine::tensor_cores &&
      !KPool::Details::mma_plan<E, T, C>(sc.s.rotated, sc.s.serving).usable)
    engine = KPool::ScoreEngine::automatic;
  // Under device shapes tiles refuses (by name) heads whose one-row tile
  // does not fit a device team's fast scratch; automatic takes team_gemm.
  if (engine == KPool::ScoreEngine::tiles && !KPool::Details::tiles_fit<E, T, C>(sc.s.H, sc.s.D))
    engine = KPool::ScoreEngine::automatic;
  Inputs<E, T, C> in(sc);
  int const width = tokens ? KPool::select_tokens_width(sc.s.topk, sc.s.K) : sc.s.topk;
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> out("out", sc.rows, width);
  Kokkos::deep_copy(out, kSentinel);
  KPool::SelectWorkspace<T, M> ws(in.space, ws_rows > 0 ? ws_rows : sc.rows,
                                  workspace_visible(sc, o), sc.s.H, sc.s.D, engine);
  auto const batch = KPool::ragged_batch(in.bv.row_offsets, in.bv.cache_lengths,
                                         sc.batch.device.num_requests);
  if (tokens)
    KPool::select_tokens(in.space, in.q, in.w, sc.s.topk, batch,
                         KPool::paged(in.cache, in.table), out, ws, o);
  else
    KPool::score_select(in.space, in.q, in.w, sc.s.topk, batch,
                        KPool::paged(in.cache, in.table), out, ws, o);
  // Every call leaves the workspace's words at zero (the fused groups' and
  // the long rows' tickets), for the next call.
  auto const words = on_host(
      Kokkos::View<std::uint32_t*, M, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
          ws.fused_tickets(), 3 * ws.max_tokens()));
  for (std::size_t i = 0; i < words.extent(0); ++i)
    EXPECT_EQ(words(i), 0u) << "workspace word " << i << " left set by the call";
  auto const h = on_host(out);
  return std::vector<std::int32_t>(h.data(), h.data() + h.size());
}

template <class E, class T>
std::vector<std::int32_t> run(Scenario const& sc, EngineOptions const& o,
                              bool tokens = false, std::size_t ws_rows = 0) {
  if constexpr (!std::is_same<T, double>::value) {
    if (sc.s.fp8) return run_with<E, T, KPool::float8_e4m3>(sc, o, tokens, ws_rows);
  }
  return run_with<E, T, T>(sc, o, tokens, ws_rows);
}

// The engines a space offers.
// tensor_cores runs the emulation of its MMA on hosts; a call it does not
// take (f32 and f64 caches, rotated f16) runs as automatic would (run_with).
template <class E>
std::vector<KPool::ScoreEngine> engines() {
  if (KPool::Details::KokkosExt::is_device_backend<E>::value)
    return built_engines({KPool::ScoreEngine::tiles, KPool::ScoreEngine::team_gemm,
                          KPool::ScoreEngine::tensor_cores});
  return built_engines({KPool::ScoreEngine::register_tiles, KPool::ScoreEngine::tiles,
                        KPool::ScoreEngine::team_gemm, KPool::ScoreEngine::blas,
                        KPool::ScoreEngine::tensor_cores});
}

// The engines that score identical pools identically.
template <class E>
std::vector<KPool::ScoreEngine> tie_exact_engines() {
  std::vector<KPool::ScoreEngine> e = engines<E>();
  e.erase(std::remove(e.begin(), e.end(), KPool::ScoreEngine::blas), e.end());
  return e;
}

template <class E>
EngineOptions options_for(KPool::ScoreEngine engine, int team_size = -1) {
  EngineOptions o{test_options<E>(), engine};
  if (team_size >= 0) o.team_size = team_size;
  return o;
}

// Every live row conforms to docs/indexer.md's rule against the reference; every
// other row is untouched.
inline ::testing::AssertionResult conforms(Scenario const& sc,
                                    std::vector<std::int32_t> const& ids) {
  int const topk = sc.s.topk;
  for (int t = 0; t < sc.rows; ++t) {
    std::int32_t const* row = ids.data() + static_cast<std::size_t>(t) * topk;
    if (sc.owner(t) < 0) {
      for (int j = 0; j < topk; ++j)
        if (row[j] != kSentinel)
          return ::testing::AssertionFailure()
                 << "row " << t << " is outside the live requests but column " << j
                 << " was written (" << row[j] << ")";
      continue;
    }
    std::string const why = SR::check_selection(sc.scores(t), topk, row);
    if (!why.empty())
      return ::testing::AssertionFailure() << "row " << t << " (position "
                                           << sc.position(t) << "): " << why;
  }
  return ::testing::AssertionSuccess();
}

// Rows equal to the reference's exact ranking (planted exact ties).
inline ::testing::AssertionResult exact(Scenario const& sc, std::vector<std::int32_t> const& ids) {
  int const topk = sc.s.topk;
  for (int t = 0; t < sc.rows; ++t) {
    if (sc.owner(t) < 0) continue;
    std::vector<std::int32_t> want = SR::select_exact(sc.scores(t), topk);
    want.resize(topk, -1);
    for (int j = 0; j < topk; ++j)
      if (ids[static_cast<std::size_t>(t) * topk + j] != want[j])
        return ::testing::AssertionFailure()
               << "row " << t << " column " << j << ": got "
               << ids[static_cast<std::size_t>(t) * topk + j] << ", the ranking gives "
               << want[j] << " (scores " << std::setprecision(17)
               << sc.scores(t).score[ids[static_cast<std::size_t>(t) * topk + j]] << " and "
               << sc.scores(t).score[want[j]] << ")";
  }
  return ::testing::AssertionSuccess();
}

// The sampled grid: K in {1, 2, 4, 8}, H in {1, 4, 32}, D in {7, 64, 128},
// native and fp8, rotated (powers of two) and not, block sizes that divide
// and that do not.
inline std::vector<Shape> grid(DType t) {
  std::vector<Shape> g = {
      {1, 1, 7, 5, false, false, 16},   {2, 4, 64, 16, true, true, 8},
      {4, 32, 128, 32, true, true, 16}, {8, 4, 7, 3, false, false, 5},
      {4, 1, 128, 64, false, true, 32}, {1, 32, 64, 8, true, false, 3},
      {2, 32, 7, 12, true, false, 7},   {8, 1, 64, 2, true, true, 4},
  };
  // An fp8 cache serves every storage type but f64.
  if (t == DType::f64) {
    for (Shape& s : g) s.fp8 = false;
    return g;
  }
  // The serving profile, its caches split and fused.
  g.push_back({4, 32, 128, 32, true, true, 16, true});
  g.push_back({2, 4, 64, 16, true, true, 8, true, true});
  g.push_back({1, 32, 64, 8, true, false, 3, true, true});
  g.push_back({2, 8, 7, 12, true, false, 7, true});
  return g;
}

// Cache lengths and rows: fresh prefill, continuations off the pool grid,
// single-token decodes, an empty request; one dead row (B > num_requests)
// and guard rows after the live ones.
inline std::vector<std::pair<std::uint32_t, std::uint32_t>> mixed_batch() {
  return {{0, 9}, {37, 6}, {130, 1}, {5, 0}, {61, 2}};
}

// Every engine of E selects on the scenario of shape s as the reference
// does.
template <class E, class T>
void expect_every_engine_conforms(Shape const& s, Scenario const& sc) {
  for (KPool::ScoreEngine engine : engines<E>()) {
    SCOPED_TRACE(describe(s) + " engine " + KPool::Details::engine_name(engine));
    EXPECT_TRUE(conforms(sc, run<E, T>(sc, options_for<E>(engine))));
  }
}


// select_tokens on the scenario writes the expansion (KPoolRef::expand_topk)
// of what score_select selects, which conforms to the reference; rows
// outside the live requests stay as they were in both outputs.
template <class E, class T>
void expect_tokens_expand_the_selection(Scenario const& sc, EngineOptions const& o) {
  std::vector<std::int32_t> const ids = run<E, T>(sc, o);
  ASSERT_TRUE(conforms(sc, ids));
  std::vector<std::int32_t> want;
  KPoolRef::expand_topk(sc.s.K, ids, sc.s.topk, sc.batch.reference, true, want);
  std::vector<std::int32_t> const got = run<E, T>(sc, o, true);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << "token column " << i;
}

}  // namespace KPoolSelectTest

#endif
