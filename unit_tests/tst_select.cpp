// score_select and select_tokens against the independent reference
// (docs/indexer.md, "Scoring" and "Selection"; KPoolSelectReference.hpp): every
// storage type, native and fp8 caches, rotated and not, both scoring
// engines; docs/indexer.md's tolerance rule on every row, planted exact ties
// resolved to the lower ids identically on every run, NaN, rows that see
// nothing, rows outside the live requests untouched, long rows.

#include <KPoolSelectReference.hpp>
#include <KPoolTestUtils.hpp>

#include <algorithm>
#include <cstring>
#include <iomanip>
#include <limits>
#include <mutex>
#include <numeric>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using namespace KPoolTest;
namespace SR = KPoolSelectRef;

constexpr std::int32_t kSentinel = KPoolRef::kUntouched;

template <class C>
class Select : public ::testing::Test {};
TYPED_TEST_SUITE(Select, Configs, ConfigName);

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

std::vector<double> random_vector(Rng& rng, DType t, int n, double lo, double hi) {
  std::vector<double> v(n);
  for (double& x : v) x = KPoolRef::round_to(t, rng.uniform(lo, hi));
  return v;
}

Scenario make_scenario(Shape const& s, DType t,
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
std::size_t workspace_visible(Scenario const& sc, KPool::Options const& o) {
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
::testing::AssertionResult conforms(Scenario const& sc,
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
::testing::AssertionResult exact(Scenario const& sc, std::vector<std::int32_t> const& ids) {
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
std::vector<Shape> grid(DType t) {
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
std::vector<std::pair<std::uint32_t, std::uint32_t>> mixed_batch() {
  return {{0, 9}, {37, 6}, {130, 1}, {5, 0}, {61, 2}};
}

// ------------------------------------------------------------------ tests

TYPED_TEST(Select, ConformsToTheReferenceOnTheGrid) {
  using E = typename TypeParam::execution_space;
  using T = typename TypeParam::value_type;
  std::uint64_t seed = 100;
  for (Shape const& s : grid(TypeParam::dtype)) {
    Scenario const sc = make_scenario(s, TypeParam::dtype, mixed_batch(), 6, 2, ++seed);
    for (KPool::ScoreEngine engine : engines<E>()) {
      SCOPED_TRACE(describe(s) + " engine " + KPool::Details::engine_name(engine));
      EXPECT_TRUE(conforms(sc, run<E, T>(sc, options_for<E>(engine))));
    }
  }
}

// The fused layout's blocks are block_pools * (D + 4) bytes apart, 16-byte
// aligned only when block_pools is a multiple of 4: every engine reads
// every entry of blocks of any pool count (the tiles engine's 16-byte key
// loads took only the base's alignment into account: in a device-shapes
// build that aborted, as the GPU would fault, at block_pools 3).
TYPED_TEST(Select, FusedBlocksOfAnyPoolCountOnEveryEngine) {
  using E = typename TypeParam::execution_space;
  using T = typename TypeParam::value_type;
  if (TypeParam::dtype == DType::f64)
    GTEST_SKIP() << "the fused layout is the serving profile's, an fp8 cache, which f64 "
                    "pools do not take";
  std::uint64_t seed = 300;
  for (int block_pools : {1, 2, 3, 5, 6, 7})
    for (int D : {64, 128}) {
      Shape const s{4, 8, D, 16, true, true, block_pools, true, true};
      Scenario const sc = make_scenario(s, TypeParam::dtype, mixed_batch(), 6, 2, ++seed);
      for (KPool::ScoreEngine engine : engines<E>()) {
        SCOPED_TRACE(describe(s) + " engine " + KPool::Details::engine_name(engine));
        EXPECT_TRUE(conforms(sc, run<E, T>(sc, options_for<E>(engine))));
      }
    }
}

TYPED_TEST(Select, SelectTokensIsTheExpansionOfTheSelection) {
  using E = typename TypeParam::execution_space;
  using T = typename TypeParam::value_type;
  for (Shape s : {Shape{4, 4, 64, 8, true, true, 8}, Shape{1, 1, 7, 5, false, false, 3},
                  Shape{8, 32, 128, 3, true, false, 16},
                  Shape{4, 4, 64, 8, true, true, 8, true, true}}) {
    if (TypeParam::dtype == DType::f64) {
      if (s.serving) continue;
      s.fp8 = false;
    }
    Scenario const sc = make_scenario(s, TypeParam::dtype, mixed_batch(), 6, 2, 7);
    for (KPool::ScoreEngine engine : engines<E>()) {
      SCOPED_TRACE(describe(s) + " engine " + KPool::Details::engine_name(engine));
      EngineOptions const o = options_for<E>(engine);
      std::vector<std::int32_t> const ids = run<E, T>(sc, o);
      ASSERT_TRUE(conforms(sc, ids));
      // Rows outside the live requests stay as they were in both outputs.
      std::vector<std::int32_t> want;
      KPoolRef::expand_topk(s.K, ids, s.topk, sc.batch.reference, true, want);
      std::vector<std::int32_t> const got = run<E, T>(sc, o, true);
      ASSERT_EQ(got.size(), want.size());
      for (std::size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(got[i], want[i]) << "token column " << i;
    }
  }
}

// Duplicated pools score exactly alike, so the cut among them must take
// the lower ids: many copies of one key, a few distinct better pools, and
// the cut in the middle of the copies, the same on every run, engine and
// team size.
TYPED_TEST(Select, ExactTiesGoToTheLowerIdsOnEveryRun) {
  using E = typename TypeParam::execution_space;
  using T = typename TypeParam::value_type;
  // (A native 16-bit cache of D = 128: the tensor-core engine's key tiles
  // too wide for its registers, staged then scored.)
  for (Shape s : {Shape{2, 4, 64, 20, true, true, 8}, Shape{1, 32, 128, 40, true, false, 16},
                  Shape{4, 1, 7, 6, false, false, 5}, Shape{1, 4, 128, 40, false, false, 16},
                  Shape{2, 4, 64, 20, true, true, 8, true, true}}) {
    if (TypeParam::dtype == DType::f64) {
      if (s.serving) continue;
      s.fp8 = false;
    }
    Scenario sc = make_scenario(s, TypeParam::dtype, {{0, 3}, {90, 4}, {200, 1}}, 3, 0, 11);
    Rng rng(5);
    for (int r = 0; r < 3; ++r) {
      std::int64_t const vis =
          (sc.batch.reference.cache_lengths[r] +
           (sc.batch.reference.row_offsets[r + 1] - sc.batch.reference.row_offsets[r])) /
          s.K;
      if (vis < 2) continue;
      auto const model = sc.where(r, vis / 2);
      // Copies of one pool everywhere but a few; the copies sit around the
      // cut for topk well inside the row.
      for (std::int64_t p = 0; p < vis; ++p) {
        if (p % 7 == 3 || p == vis / 2) continue;
        auto const be = sc.where(r, p);
        sc.cache.copy_entry(model.first, model.second, be.first, be.second);
      }
    }
    std::vector<std::int32_t> first;
    for (KPool::ScoreEngine engine : tie_exact_engines<E>())
      for (int team_size : {1, 2, 3, 6, 0})
        for (int again = 0; again < 2; ++again) {
          SCOPED_TRACE(describe(s) + " engine " + KPool::Details::engine_name(engine) +
                       " team_size " + std::to_string(team_size));
          std::vector<std::int32_t> const ids =
              run<E, T>(sc, options_for<E>(engine, team_size));
          ASSERT_TRUE(exact(sc, ids));
          if (first.empty())
            first = ids;
          else
            ASSERT_EQ(ids, first);
        }
  }
}

// A pool whose every head's product is negative scores exactly 0; with few
// positive pools the cut falls among the zeros, which go by id.
TYPED_TEST(Select, ZeroScoreTiesGoToTheLowerIds) {
  using E = typename TypeParam::execution_space;
  using T = typename TypeParam::value_type;
  DType const t = TypeParam::dtype;
  for (int mode = 0; mode < 4; ++mode) {
    bool const rotated = mode % 2 == 1;
    bool const serving = mode >= 2;  // the serving profile's cache and queries
    if (serving && t == DType::f64) continue;
    Shape s{1, 4, 64, 12, t != DType::f64, rotated, 8, serving};
    Scenario sc = make_scenario(s, t, {{39, 1}}, 1, 0, 21);
    // Every head asks the same question, so a key opposite to it makes
    // every product negative.
    std::vector<double> q0(sc.q.begin(), sc.q.begin() + s.D);
    for (int h = 1; h < s.H; ++h) std::copy(q0.begin(), q0.end(), sc.q.begin() + h * s.D);
    for (int h = 0; h < s.H; ++h) sc.w[h] = 0.25 * (h + 1);
    for (std::int64_t p = 0; p < 40; ++p) {
      double const sign = p % 9 == 4 ? 1.0 : -1.0;  // 4 positive pools
      std::vector<double> x(s.D);
      for (int c = 0; c < s.D; ++c)
        x[c] = KPoolRef::round_to(t, sign * (1.0 + 0.01 * p) * q0[c]);
      auto const be = sc.where(0, p);
      sc.cache.store(be.first, be.second, x, t);
    }
    for (KPool::ScoreEngine engine : engines<E>()) {
      SCOPED_TRACE(std::string(rotated ? "rotated " : "") + (serving ? "serving " : "") +
                   KPool::Details::engine_name(engine));
      std::vector<std::int32_t> const ids = run<E, T>(sc, options_for<E>(engine));
      ASSERT_TRUE(exact(sc, ids));
      // 4 positive pools, then the 8 lowest zero-score ids.
      std::vector<std::int32_t> const want = {0, 1, 2, 3, 4, 5, 6, 7, 8, 13, 22, 31};
      ASSERT_EQ(ids, want);
    }
  }
}

// NaN weights make a row's every score NaN (the lowest ids then); NaN keys
// make their pools rank below every number.
TYPED_TEST(Select, NanRanksBelowEveryNumber) {
  using E = typename TypeParam::execution_space;
  using T = typename TypeParam::value_type;
  DType const t = TypeParam::dtype;
  Shape s{2, 4, 64, 10, t != DType::f64, false, 8};
  Scenario sc = make_scenario(s, t, {{50, 3}, {70, 2}}, 2, 0, 31);
  double const nan = std::numeric_limits<double>::quiet_NaN();
  // Row 0: one NaN weight. Request 1: NaN in some keys.
  sc.w[1] = nan;
  for (std::int64_t p = 0; p < 35; p += 3) {
    auto const be = sc.where(1, p);
    if (s.fp8)
      sc.cache.set_code(be.first, be.second, 5, 0x7F);
    else
      sc.cache.set_value(be.first, be.second, 5, nan);
  }
  for (KPool::ScoreEngine engine : engines<E>()) {
    SCOPED_TRACE(KPool::Details::engine_name(engine));
    std::vector<std::int32_t> const ids = run<E, T>(sc, options_for<E>(engine));
    EXPECT_TRUE(conforms(sc, ids));
    std::vector<std::int32_t> const row0(ids.begin(), ids.begin() + s.topk);
    std::vector<std::int32_t> lowest(s.topk);
    std::iota(lowest.begin(), lowest.end(), 0);
    EXPECT_EQ(row0, lowest);
    // Request 1 has 35 or 36 visible pools, 12 of them NaN: none selected.
    for (int t = 3; t < 5; ++t)
      for (int j = 0; j < s.topk; ++j) EXPECT_NE(ids[t * s.topk + j] % 3, 0);
  }
}

TYPED_TEST(Select, RowsThatSeeNoPoolOrFewerThanTopk) {
  using E = typename TypeParam::execution_space;
  using T = typename TypeParam::value_type;
  DType const t = TypeParam::dtype;
  Shape s{4, 4, 64, 16, t != DType::f64, true, 4};
  // Positions 0..6: rows 0..2 see nothing, rows 3..6 one pool; 30..33 see
  // 7 or 8 pools, fewer than topk: all of them, ascending.
  Scenario const sc = make_scenario(s, t, {{0, 7}, {30, 4}}, 2, 0, 41);
  for (KPool::ScoreEngine engine : engines<E>()) {
    SCOPED_TRACE(KPool::Details::engine_name(engine));
    std::vector<std::int32_t> const ids = run<E, T>(sc, options_for<E>(engine));
    ASSERT_TRUE(conforms(sc, ids));
    for (int row = 0; row < sc.rows; ++row) {
      std::int64_t const vis = SR::visible(sc.position(row), s.K);
      for (int j = 0; j < s.topk; ++j)
        EXPECT_EQ(ids[row * s.topk + j], j < vis ? j : -1) << "row " << row;
    }
    std::vector<std::int32_t> const tokens = run<E, T>(sc, options_for<E>(engine), true);
    int const width = KPool::select_tokens_width(s.topk, s.K);
    // Row 2 (position 2): no pool, the tail 0, 1, 2.
    EXPECT_EQ(tokens[2 * width + s.topk * s.K], 0);
    EXPECT_EQ(tokens[2 * width + s.topk * s.K + 2], 2);
    EXPECT_EQ(tokens[2 * width], -1);
  }
}

// A workspace of fewer rows than q: the call runs its rows in chunks, in
// order, and selects what one chunk selects (bit for bit, the same keys),
// for score_select and select_tokens, with every engine.
TYPED_TEST(Select, ChunkedCallsSelectWhatOneChunkSelects) {
  using E = typename TypeParam::execution_space;
  using T = typename TypeParam::value_type;
  Shape const s{4, 4, 64, 8, TypeParam::dtype != DType::f64, true, 8};
  Scenario const sc = make_scenario(s, TypeParam::dtype, mixed_batch(), 6, 2, 33);
  for (KPool::ScoreEngine engine : engines<E>()) {
    SCOPED_TRACE(KPool::Details::engine_name(engine));
    EngineOptions const o = options_for<E>(engine);
    std::vector<std::int32_t> const whole = run<E, T>(sc, o);
    EXPECT_TRUE(conforms(sc, whole));
    std::vector<std::int32_t> const whole_tokens = run<E, T>(sc, o, true);
    for (std::size_t chunk : {std::size_t(1), std::size_t(3), std::size_t(7)}) {
      std::vector<std::int32_t> const ids = run<E, T>(sc, o, false, chunk);
      EXPECT_EQ(ids, whole) << "chunks of " << chunk;
      std::vector<std::int32_t> const tokens = run<E, T>(sc, o, true, chunk);
      EXPECT_EQ(tokens, whole_tokens) << "tokens, chunks of " << chunk;
    }
  }
}

// One query over 2^16 pools (topk 2048), and one over 2^20 (small heads).
TYPED_TEST(Select, LongRows) {
  using E = typename TypeParam::execution_space;
  using T = typename TypeParam::value_type;
  DType const t = TypeParam::dtype;
  if (t != DType::bf16) GTEST_SKIP() << "bf16 covers it";
  struct Long {
    std::uint32_t pools;
    Shape s;
  };
  for (Long const& l : {Long{1u << 16, Shape{1, 4, 64, 2048, true, true, 256}},
                        Long{1u << 20, Shape{1, 1, 4, 512, true, false, 8192}}}) {
    Scenario const sc = make_scenario(l.s, t, {{l.pools - 1, 1}}, 1, 0, 51);
    SR::RowScores const ref = sc.scores(0);
    for (KPool::ScoreEngine engine : engines<E>()) {
      SCOPED_TRACE(describe(l.s) + " " + KPool::Details::engine_name(engine));
      // The space's own team size: this test is about length, not races.
      std::vector<std::int32_t> const ids = run<E, T>(sc, options_for<E>(engine, 0));
      std::string const why = SR::check_selection(ref, l.s.topk, ids.data());
      EXPECT_TRUE(why.empty()) << why;
    }
  }
}

// select_tokens with a topk whose ids would not fit a device team's fast
// scratch (12000 ids are 48 KB): one query over 2^14 pools, K = 4, on every
// engine, is the expansion of score_select's conforming selection. A
// device-shapes build refuses any launch that would take level-1 scratch.
TYPED_TEST(Select, SelectTokensWithATopkPastFastScratch) {
  using E = typename TypeParam::execution_space;
  using T = typename TypeParam::value_type;
  if (TypeParam::dtype != DType::bf16) GTEST_SKIP() << "bf16 covers it";
  Shape const s{4, 1, 8, 12000, true, false, 512};
  Scenario const sc = make_scenario(s, TypeParam::dtype, {{(1u << 14) * 4 - 1, 1}}, 1, 0, 53);
  for (KPool::ScoreEngine engine : engines<E>()) {
    SCOPED_TRACE(describe(s) + " engine " + KPool::Details::engine_name(engine));
    EngineOptions const o = options_for<E>(engine, 0);
    std::vector<std::int32_t> const ids = run<E, T>(sc, o);
    ASSERT_TRUE(conforms(sc, ids));
    std::vector<std::int32_t> want;
    KPoolRef::expand_topk(s.K, ids, s.topk, sc.batch.reference, true, want);
    std::vector<std::int32_t> const got = run<E, T>(sc, o, true);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i], want[i]) << "token column " << i;
  }
}

// A chunked prefill: an earlier call caches a request's first 16 tokens;
// this call's step closes the pools of its own rows, store_pools caches
// them, and the selection, queued after them on the same instance, lets the
// call's later queries see them. The cache starts with stale keys, so a
// selection that read before the writes could not match the reference
// built from the cache afterwards. Both step paths store the same bytes,
// so they give the same selections.
template <class E, class T, class C>
void prefill_in_one_call(DType t) {
  using M = typename E::memory_space;
  int const K = 4, H = 4, D = 64, topk = 6, bp = 4;
  E space;
  Rng rng(71);
  // Request 0: fresh, 37 rows (9 pools); request 1: 16 tokens cached
  // earlier, 11 rows now (pools 4 and 5 close here, 6 pools in all).
  TestBatch const earlier = make_batch({{0, 16}}, 1, rng, 2);
  TestBatch now = make_batch({{0, 37}, {16, 11}}, 2, rng, 2);
  now.device.slot_idx = {0, 1};
  now.reference.slot_idx = {0, 1};
  int const num_blocks = 6;
  std::vector<std::int32_t> const table = {5, 0, 3, 2, 4, -1};  // 2 x 3
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> bt("block_table", 2, 3);
  {
    auto h = Kokkos::create_mirror_view(bt);
    for (int i = 0; i < 6; ++i) h.data()[i] = table[i];
    Kokkos::deep_copy(bt, h);
  }
  // The earlier call's batch row 0 is request 1 now: its own table row.
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> bt_earlier("block_table", 1, 3);
  Kokkos::deep_copy(bt_earlier, Kokkos::subview(bt, std::make_pair(1, 2), Kokkos::ALL));

  std::vector<std::int32_t> first;
  for (bool fused : {true, false}) {
    KPool::Options o = test_options<E>();
    o.fused = fused;
    KPool::PoolCache<C, M> cache(space, num_blocks, bp, D, K,
                                 std::is_same<C, KPool::float8_e4m3>::value
                                     ? KPool::CacheScale::amax
                                     : KPool::CacheScale::none,
                                 true);
    {
      SR::Cache stale(num_blocks, bp, D, std::is_same<C, KPool::float8_e4m3>::value, true);
      for (int b = 0; b < num_blocks; ++b)
        for (int e = 0; e < bp; ++e)
          stale.store(b, e, random_vector(rng, DType::f32, D, -50, 50), t);
      KPool::PoolCache<C, M> const loaded = load_cache<T, C, M>(space, stale, K);
      Kokkos::deep_copy(cache.values(), loaded.values());
      Kokkos::deep_copy(cache.scales(), loaded.scales());
    }
    KPool::Ring<T, M> ring(space, 2, K, D);
    Rng data(72);  // the same tokens for both step paths
    {
      auto const in = ragged_inputs(data, t, earlier, K, D);
      BatchViews<M> const bv(earlier.device);
      KPool::StepOutput<T, M> out(space, KPool::StepOutput<T, M>::capacity_for(16, 1, K), 1, D);
      auto const key = to_view<T, M>(in.key, "key"), gate = to_view<T, M>(in.gate, "gate");
      // Request 1 sits in ring slot 1 in both calls.
      Kokkos::View<std::uint32_t*, M> slot("slot_idx", 1);
      Kokkos::deep_copy(slot, 1u);
      auto const batch = KPool::ragged_batch(bv.row_offsets, bv.cache_lengths, slot, 1);
      KPool::step(space, ring, key, gate, ape_view<M>(in.ape), batch, out, o);
      KPool::store_pools(space, out, batch, KPool::paged(cache, bt_earlier), o);
    }
    auto const in = ragged_inputs(data, t, now, K, D);
    BatchViews<M> const bv(now.device);
    KPool::StepOutput<T, M> out(space, KPool::StepOutput<T, M>::capacity_for(48, 2, K), 2, D);
    auto const key = to_view<T, M>(in.key, "key"), gate = to_view<T, M>(in.gate, "gate");
    auto const batch = KPool::ragged_batch(bv.row_offsets, bv.cache_lengths, bv.slot_idx, 2);
    KPool::step(space, ring, key, gate, ape_view<M>(in.ape), batch, out, o);
    KPool::store_pools(space, out, batch, KPool::paged(cache, bt), o);
    Kokkos::View<T***, Kokkos::LayoutRight, M> q("q", 48, H, D);
    Kokkos::View<float**, Kokkos::LayoutRight, M> w("weights", 48, H);
    std::vector<double> const qh = random_vector(data, t, 48 * H * D, -1, 1);
    std::vector<double> wh(48 * H);
    for (double& x : wh) x = static_cast<float>(data.uniform(-0.5, 1.0));
    {
      auto hq = Kokkos::create_mirror_view(q);
      auto hw = Kokkos::create_mirror_view(w);
      for (std::size_t i = 0; i < qh.size(); ++i) hq.data()[i] = to_storage<T>(qh[i]);
      for (std::size_t i = 0; i < wh.size(); ++i) hw.data()[i] = static_cast<float>(wh[i]);
      Kokkos::deep_copy(q, hq);
      Kokkos::deep_copy(w, hw);
    }
    Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> ids("pool_ids", 48, topk);
    KPool::SelectWorkspace<T, M> ws(space, 48, 9, H, D);
    KPool::score_select(space, q, w, topk, batch, KPool::paged(cache, bt), ids, ws, o);
    auto const got_view = on_host(ids);
    std::vector<std::int32_t> const got(got_view.data(), got_view.data() + got_view.size());

    // The reference reads the cache as it is after the call.
    Scenario sc;
    sc.s = Shape{K, H, D, topk, std::is_same<C, KPool::float8_e4m3>::value, true, bp};
    sc.t = t;
    sc.batch = now;
    sc.rows = 48;
    sc.max_blocks = 3;
    sc.table = table;
    sc.cache = SR::Cache(num_blocks, bp, D, sc.s.fp8, true);
    auto const hv = on_host(cache.values());
    auto const hs = on_host(cache.scales());
    for (int b = 0; b < num_blocks; ++b)
      for (int e = 0; e < bp; ++e) {
        sc.cache.scale[sc.cache.entry(b, e)] = hs(b, e);
        for (int c = 0; c < D; ++c) {
          if constexpr (std::is_same<C, KPool::float8_e4m3>::value)
            sc.cache.set_code(b, e, c, hv(b, e, c).bits);
          else
            sc.cache.set_value(b, e, c, to_double(hv(b, e, c)));
        }
      }
    sc.q = qh;
    sc.w = wh;
    EXPECT_TRUE(conforms(sc, got)) << (fused ? "fused step" : "three-launch step");
    if (first.empty())
      first = got;
    else
      EXPECT_EQ(got, first) << "the step paths disagree";
  }
}

TYPED_TEST(Select, QueriesSeePoolsClosedInTheSameCall) {
  using E = typename TypeParam::execution_space;
  using T = typename TypeParam::value_type;
  if constexpr (!std::is_same<T, double>::value)
    prefill_in_one_call<E, T, KPool::float8_e4m3>(TypeParam::dtype);
  prefill_in_one_call<E, T, T>(TypeParam::dtype);
}

// With validation off a bad block is skipped: its pools are not candidates,
// the rest of the row is selected as usual.
TYPED_TEST(Select, BadBlocksAreNotVisibleWithValidationOff) {
  using E = typename TypeParam::execution_space;
  using T = typename TypeParam::value_type;
  DType const t = TypeParam::dtype;
  Shape s{1, 4, 64, 24, t != DType::f64, false, 8};
  Scenario sc = make_scenario(s, t, {{60, 2}}, 1, 0, 61);
  int const nb = sc.cache.num_blocks;
  sc.table[1] = -5;  // pools 8..15
  sc.table[3] = nb;  // pools 24..31
  sc.table[5] = nb + 1000;
  for (KPool::ScoreEngine engine : engines<E>()) {
    SCOPED_TRACE(KPool::Details::engine_name(engine));
    EngineOptions o = options_for<E>(engine);
    o.validate = false;
    std::vector<std::int32_t> const ids = run<E, T>(sc, o);
    for (int row = 0; row < 2; ++row) {
      std::int64_t const vis = SR::visible(sc.position(row), s.K);
      std::vector<bool> counted(vis);
      for (std::int64_t p = 0; p < vis; ++p) {
        std::int64_t const j = p / s.block_pools;
        counted[p] = j != 1 && j != 3 && j != 5;
      }
      std::string const why =
          SR::check_selection(sc.scores(row, &counted), s.topk, ids.data() + row * s.topk);
      EXPECT_TRUE(why.empty()) << "row " << row << ": " << why;
    }
  }
}

// ------------------------------------------------------- tensor cores

// The tensor-core engine in the serving profile (the E4M3 MMA, emulated on
// hosts), through score_select: the profile's own quantized queries and
// cache against the reference, with planted ties across lanes and tiles
// (identical pools score identically, so the lower ids win). Then: a
// native f32 or f64 cache asked for tensor_cores is an InvalidArgument
// naming the workspace (its engine).
TYPED_TEST(Select, TensorCoresServingProfile) {
  using E = typename TypeParam::execution_space;
  using T = typename TypeParam::value_type;
  DType const t = TypeParam::dtype;
  if constexpr (std::is_same<T, double>::value || std::is_same<T, float>::value) {
    Shape s{2, 4, 64, 8, false, false, 8};
    Scenario sc = make_scenario(s, t, {{20, 3}}, 1, 0, 71);
    Inputs<E, T, T> in(sc);
    Kokkos::View<std::int32_t**, Kokkos::LayoutRight, typename E::memory_space> out(
        "out", sc.rows, s.topk);
    KPool::SelectWorkspace<T, typename E::memory_space> ws(
        in.space, sc.rows, sc.max_visible, s.H, s.D, KPool::ScoreEngine::tensor_cores);
    try {
      KPool::score_select(in.space, in.q, in.w, s.topk,
                          KPool::ragged_batch(in.bv.row_offsets, in.bv.cache_lengths,
                                              sc.batch.device.num_requests),
                          KPool::paged(in.cache, in.table), out, ws, test_options<E>());
      ADD_FAILURE() << "tensor_cores took a native " << KPool::storage_name<T>() << " cache";
    } catch (KPool::InvalidArgument const& e) {
      EXPECT_NE(std::string(e.what()).find("workspace"), std::string::npos) << e.what();
    }
  }
  if constexpr (!std::is_same<T, double>::value) {
    for (Shape s : {Shape{2, 4, 64, 16, true, false, 8, true},
                    Shape{1, 32, 128, 12, true, true, 16, true},
                    Shape{4, 3, 40, 5, true, false, 5, true}}) {
      SCOPED_TRACE(describe(s));
      Scenario sc = make_scenario(s, t, mixed_batch(), 6, 2, 73);
      // Planted ties: pools 9 and 17 of request 2 (130 cached positions)
      // are copies of its pool 1: other lanes, another tile.
      for (int copy : {9, 17}) {
        auto const from = sc.where(2, 1), to = sc.where(2, copy);
        std::size_t const f = sc.cache.entry(from.first, from.second);
        std::size_t const g = sc.cache.entry(to.first, to.second);
        sc.cache.scale[g] = sc.cache.scale[f];
        for (int c = 0; c < s.D; ++c) {
          sc.cache.code[g * s.D + c] = sc.cache.code[f * s.D + c];
          sc.cache.value[g * s.D + c] = sc.cache.value[f * s.D + c];
        }
      }
      std::vector<std::int32_t> const ids =
          run<E, T>(sc, options_for<E>(KPool::ScoreEngine::tensor_cores));
      EXPECT_TRUE(conforms(sc, ids));
      for (int row = 0; row < sc.rows; ++row) {
        if (sc.owner(row) != 2) continue;
        std::int32_t const* r = ids.data() + static_cast<std::size_t>(row) * s.topk;
        auto has = [&](int p) { return std::find(r, r + s.topk, p) != r + s.topk; };
        if (has(17)) {
          EXPECT_TRUE(has(9) && has(1)) << "row " << row;
        }
        if (has(9)) {
          EXPECT_TRUE(has(1)) << "row " << row;
        }
      }
    }
  }
}

// ----------------------------------------------- decode in one launch

// A decode batch of the scenario's requests, each of next_n rows (the
// scenario has no dead or guard rows): row r's positions from its cache
// length, the first `pad[r]` entries left as padding (-1), which leaves
// the rows' positions as they were.
struct DecodeRows {
  int next_n = 1;
  std::vector<std::int32_t> positions;  // [B][next_n]
};
DecodeRows decode_rows(Scenario const& sc, int next_n, Rng& rng) {
  DecodeRows d;
  d.next_n = next_n;
  for (int r = 0; r < sc.B(); ++r) {
    int const pad = static_cast<int>(rng.below(static_cast<std::uint64_t>(next_n)));
    for (int i = 0; i < next_n; ++i)
      d.positions.push_back(
          i < pad ? -1
                  : static_cast<std::int32_t>(sc.batch.reference.cache_lengths[r]) + i);
  }
  return d;
}

// pool_ids (or token rows) of a decode Batch selection of the scenario.
template <class E, class T, class C>
std::vector<std::int32_t> run_decode_with(Scenario const& sc, DecodeRows const& d,
                                          EngineOptions const& options, bool tokens,
                                          std::size_t ws_rows) {
  using M = typename E::memory_space;
  Inputs<E, T, C> in(sc);
  int const width = tokens ? KPool::select_tokens_width(sc.s.topk, sc.s.K) : sc.s.topk;
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> out("out", sc.rows, width);
  Kokkos::deep_copy(out, kSentinel);
  KPool::SelectWorkspace<T, M> ws(in.space, ws_rows, sc.max_visible, sc.s.H, sc.s.D,
                                  workspace_engine<M>(options.engine));
  // Every key poisoned with the highest key there is: a selection that read
  // a key before its scoring team wrote it would select it.
  Kokkos::deep_copy(ws.keys(), static_cast<typename KPool::SelectWorkspace<T, M>::key_type>(~0ull));
  auto const positions = positions_view<M>(d.positions, d.next_n);
  auto const batch = KPool::decode_batch(positions, sc.B());
  auto const paged = KPool::paged(in.cache, in.table);
  auto const call = [&](Kokkos::View<T***, Kokkos::LayoutRight, M> const& q) {
    if (tokens)
      KPool::select_tokens(in.space, q, in.w, sc.s.topk, batch, paged, out, ws, options);
    else
      KPool::score_select(in.space, q, in.w, sc.s.topk, batch, paged, out, ws, options);
  };
  // First a call on other queries (zeros), then, after every prepared
  // query value is poisoned with NaN, the call itself on the same
  // workspace: a fused call prepares its own queries (its groups' words
  // back to zero after the first), and scores none before it is prepared.
  call(Kokkos::View<T***, Kokkos::LayoutRight, M>("zero q", sc.rows, sc.s.H, sc.s.D));
  using A = typename KPool::SelectWorkspace<T, M>::score_type;
  Kokkos::deep_copy(
      Kokkos::View<A*, M, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
          ws.prepared_queries(), ws_rows * static_cast<std::size_t>(sc.s.H * sc.s.D)),
      std::numeric_limits<A>::quiet_NaN());
  call(in.q);
  auto const words = on_host(Kokkos::View<std::uint32_t*, M, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
      ws.fused_tickets(), 3 * ws_rows));
  for (std::size_t i = 0; i < words.extent(0); ++i)
    EXPECT_EQ(words(i), 0u) << "the fused call left word " << i << " of its groups' words";
  auto const h = on_host(out);
  return std::vector<std::int32_t>(h.data(), h.data() + h.size());
}

template <class E, class T>
std::vector<std::int32_t> run_decode(Scenario const& sc, DecodeRows const& d,
                                     EngineOptions const& o, bool tokens, std::size_t ws_rows) {
  if constexpr (!std::is_same<T, double>::value) {
    if (sc.s.fp8) return run_decode_with<E, T, KPool::float8_e4m3>(sc, d, o, tokens, ws_rows);
  }
  return run_decode_with<E, T, T>(sc, d, o, tokens, ws_rows);
}

// The engines a fused decode selection takes on E (every team engine the
// call takes: tensor_cores only where its plan takes the cache).
template <class E, class T>
std::vector<KPool::ScoreEngine> fused_engines(Shape const& s) {
  std::vector<KPool::ScoreEngine> e;
  for (KPool::ScoreEngine engine : tie_exact_engines<E>()) {
    bool const fp8 = s.fp8 && !std::is_same<T, double>::value;
    bool const mma_ok = fp8 ? KPool::Details::mma_plan<E, T, KPool::float8_e4m3>(s.rotated,
                                                                                s.serving)
                                  .usable
                            : KPool::Details::mma_plan<E, T, T>(s.rotated, s.serving).usable;
    if (engine == KPool::ScoreEngine::tensor_cores && !mma_ok) continue;
    bool const tiles_ok = fp8 ? KPool::Details::tiles_fit<E, T, KPool::float8_e4m3>(s.H, s.D)
                              : KPool::Details::tiles_fit<E, T, T>(s.H, s.D);
    if (engine == KPool::ScoreEngine::tiles && !tiles_ok) continue;
    e.push_back(engine);
  }
  return e;
}

// Decode (next_n 1) and speculative (next_n 3) batches of 1, 5 and 16
// requests, which split their rows' pools over many teams, a few and one
// (a host's splits fill 4 teams a thread); rows that see fewer pools than
// topk, none, or hundreds; native, fp8 and serving caches, 4 to 32 heads;
// workspaces of every row and of one request's rows (chunks). The fused selection (one launch) equals the separate one
// (two) bit for bit, for pool ids and token rows, on every team engine,
// and conforms to the reference.
TYPED_TEST(Select, DecodeSelectionInOneLaunchIsTheTwoLaunchesBitForBit) {
  using E = typename TypeParam::execution_space;
  using T = typename TypeParam::value_type;
  bool const f64 = TypeParam::dtype == DType::f64;  // no fp8 cache serves f64
  struct Case {
    Shape s;
    int next_n, B;
  };
  std::vector<Case> cases;
  for (int next_n : {1, 3})
    for (int B : {1, 5, 16}) cases.push_back({{4, 4, 64, 16, !f64, true, 16}, next_n, B});
  cases.push_back({{2, 8, 7, 12, false, false, 5}, 3, 5});
  cases.push_back({{2, 8, 7, 12, false, false, 5}, 1, 16});
  cases.push_back({{1, 8, 128, 32, false, true, 8}, 1, 5});
  if (!f64) {
    cases.push_back({{4, 32, 128, 32, true, true, 16, true}, 1, 5});
    cases.push_back({{4, 32, 128, 32, true, true, 16, true}, 3, 1});
  }
  Rng rng(77);
  std::uint64_t seed = 700;
  int compared = 0;
  for (Case const& cs : cases) {
    Shape const& s = cs.s;
    int const next_n = cs.next_n, B = cs.B;
    std::vector<std::pair<std::uint32_t, std::uint32_t>> live;
    for (int r = 0; r < B; ++r) {
      // Row 1 sees fewer pools than topk, row 2 at most one.
      std::uint32_t const c = r == 1   ? static_cast<std::uint32_t>(s.K * (s.topk / 2))
                              : r == 2 ? 0u
                                       : static_cast<std::uint32_t>(rng.below(600));
      live.push_back({c, static_cast<std::uint32_t>(next_n)});
    }
    if (B == 1) live[0].first = 1100;  // one long row over many teams
    Scenario const sc = make_scenario(s, TypeParam::dtype, live, B, 0, ++seed);
    DecodeRows const d = decode_rows(sc, next_n, rng);
    for (KPool::ScoreEngine engine : fused_engines<E, T>(s))
      for (bool tokens : {false, true}) {
        // Token rows from a workspace of one request's rows (chunks), for
        // one batch size.
        if (tokens && B != 5) continue;
        std::size_t const ws_rows = static_cast<std::size_t>(tokens ? next_n : sc.rows);
        SCOPED_TRACE(describe(s) + " engine " + KPool::Details::engine_name(engine) +
                     " next_n " + std::to_string(next_n) + " B " + std::to_string(B) +
                     (tokens ? " tokens" : " pool ids") + " workspace rows " +
                     std::to_string(ws_rows));
        EngineOptions fused = options_for<E>(engine);
        fused.decode_selection = KPool::DecodeSelection::fused;
        EngineOptions separate = fused;
        separate.decode_selection = KPool::DecodeSelection::separate;
        std::vector<std::int32_t> const x = run_decode<E, T>(sc, d, fused, tokens, ws_rows);
        std::vector<std::int32_t> const y = run_decode<E, T>(sc, d, separate, tokens, ws_rows);
        EXPECT_EQ(x, y);
        if (!tokens) {
          EXPECT_TRUE(conforms(sc, x));
        }
        ++compared;
      }
  }
  EXPECT_GT(compared, 20) << "too few engines took the fused call";
}

// Rows of one value (zero queries: every pool ties), of NaN scores, of
// -inf weights and of large scores: the fused selection is the separate
// one bit for bit, ties to the lower ids, NaN below every number.
TYPED_TEST(Select, DecodeSelectionInOneLaunchOnTiesNanAndInfinities) {
  using E = typename TypeParam::execution_space;
  using T = typename TypeParam::value_type;
  Shape const s{2, 4, 64, 8, false, false, 16};
  std::vector<std::pair<std::uint32_t, std::uint32_t>> live;
  for (int r = 0; r < 6; ++r) live.push_back({static_cast<std::uint32_t>(100 + 37 * r), 2});
  Scenario sc = make_scenario(s, TypeParam::dtype, live, 6, 0, 911);
  std::size_t const row = static_cast<std::size_t>(s.H) * s.D;
  auto q_row = [&](int t) { return sc.q.begin() + static_cast<std::ptrdiff_t>(t * row); };
  std::fill(q_row(0), q_row(2), 0.0);                       // request 0: every pool ties
  sc.q[2 * row] = std::numeric_limits<double>::quiet_NaN();  // row 2: NaN everywhere
  for (int h = 0; h < s.H; ++h)                              // row 5: -inf weights
    sc.w[5 * s.H + h] = -std::numeric_limits<double>::infinity();
  std::fill(q_row(7), q_row(8), 8192.0);  // row 7: large products
  Rng rng(3);
  DecodeRows const d = decode_rows(sc, 2, rng);
  for (KPool::ScoreEngine engine : fused_engines<E, T>(s)) {
    SCOPED_TRACE(KPool::Details::engine_name(engine));
    EngineOptions fused = options_for<E>(engine);
    fused.decode_selection = KPool::DecodeSelection::fused;
    EngineOptions separate = fused;
    separate.decode_selection = KPool::DecodeSelection::separate;
    std::vector<std::int32_t> const a = run_decode<E, T>(sc, d, fused, false, 12);
    std::vector<std::int32_t> const b = run_decode<E, T>(sc, d, separate, false, 12);
    EXPECT_EQ(a, b);
    // Request 0 ties everywhere: its rows take the lowest ids.
    for (int t = 0; t < 2; ++t)
      for (int j = 0; j < s.topk; ++j) EXPECT_EQ(a[t * s.topk + j], j) << "row " << t;
    EXPECT_TRUE(conforms(sc, a));
  }
}

// Teams that run at the same time claim a group's queries together, and
// wait for one another's: on a host backend of at least 4 threads, teams
// of 1 and 2 threads (Options::team_size) run several at once, so the
// claims, the prepared counts and the waits of the fused kernel's prologue
// race as on a GPU (CI runs it with OMP_NUM_THREADS=4:
// tst_select.fused_teams_together, which fails if skipped). Rows of 16
// heads over many teams, call after call on one workspace: the fused
// selection is the separate one bit for bit, every time.
TEST(SelectDecodeFusion, TeamsRunningTogetherPrepareTheQueriesOnce) {
  using E = Kokkos::DefaultExecutionSpace;
  if (E().concurrency() < 4)
    GTEST_SKIP() << "needs a host backend of at least 4 threads (has " << E().concurrency()
                 << ")";
  Shape const s{4, 16, 64, 16, true, true, 16};
  int compared = 0;
  // One request (one group: a host backend deals a league to its threads
  // in contiguous runs, so only a group whose teams span the threads has
  // teams of one group running together), then 6.
  for (int B : {1, 6}) {
    std::vector<std::pair<std::uint32_t, std::uint32_t>> live;
    for (int r = 0; r < B; ++r) live.push_back({static_cast<std::uint32_t>(300 + 97 * r), 2});
    live[0].first = 4000;  // a row over many teams
    Scenario const sc = make_scenario(s, DType::f32, live, B, 0, 4242 + B);
    Rng rng(5);
    DecodeRows const d = decode_rows(sc, 2, rng);
    for (int team : {1, 2})
      for (KPool::ScoreEngine engine : fused_engines<E, float>(s)) {
        SCOPED_TRACE(std::string(KPool::Details::engine_name(engine)) + " team " +
                     std::to_string(team) + " B " + std::to_string(B));
        EngineOptions fused = options_for<E>(engine, team);
        fused.decode_selection = KPool::DecodeSelection::fused;
        EngineOptions separate = fused;
        separate.decode_selection = KPool::DecodeSelection::separate;
        std::vector<std::int32_t> const want = run_decode<E, float>(sc, d, separate, false, 12);
        EXPECT_TRUE(conforms(sc, want));
        for (int round = 0; round < 4; ++round) {
          std::vector<std::int32_t> const got = run_decode<E, float>(sc, d, fused, false, 12);
          EXPECT_EQ(got, want) << "round " << round;
        }
        ++compared;
      }
  }
  EXPECT_GE(compared, 8);
}

// A call the fused selection does not take, asked for by name: refused
// naming options.decode_selection, nothing written; automatic takes the two
// launches instead.
TEST(SelectDecodeFusion, RefusedByNameWhereTheCallDoesNotAllowIt) {
  using E = Kokkos::DefaultExecutionSpace;
  using M = E::memory_space;
  Shape const s{4, 4, 64, 8, true, true, 16};
  std::vector<std::pair<std::uint32_t, std::uint32_t>> const live = {{40, 1}, {90, 1}};
  Scenario const sc = make_scenario(s, DType::f32, live, 2, 0, 31);
  Inputs<E, float, KPool::float8_e4m3> in(sc);
  Rng rng(4);
  DecodeRows const d = decode_rows(sc, 1, rng);
  auto const positions = positions_view<M>(d.positions, 1);
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> ids("ids", sc.rows, s.topk);
  auto const attempt = [&](KPool::SelectWorkspace<float, M>& ws, KPool::Options const& o,
                           char const* words) {
    Kokkos::deep_copy(ids, kSentinel);
    try {
      KPool::score_select(in.space, in.q, in.w, s.topk, KPool::decode_batch(positions, 2),
                          KPool::paged(in.cache, in.table), ids, ws, o);
      ADD_FAILURE() << "a fused selection the call does not allow was taken";
    } catch (KPool::InvalidArgument const& e) {
      EXPECT_EQ(e.argument(), "options");
      EXPECT_EQ(e.value(), "fused");
      EXPECT_NE(std::string(e.what()).find("decode_selection"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
    auto const h = on_host(ids);
    for (std::size_t i = 0; i < h.span(); ++i) ASSERT_EQ(h.data()[i], kSentinel);
  };
  KPool::Options o = test_options<E>();
  o.decode_selection = KPool::DecodeSelection::fused;
  {
    SCOPED_TRACE("rows longer than the split length");
    KPool::SelectWorkspace<float, M> ws(in.space, 2, (std::size_t(1) << 16) + 1, s.H, s.D);
    attempt(ws, o, "split segments");
    // automatic selects, in two launches.
    KPool::Options a = o;
    a.decode_selection = KPool::DecodeSelection::automatic;
    KPool::score_select(in.space, in.q, in.w, s.topk, KPool::decode_batch(positions, 2),
                        KPool::paged(in.cache, in.table), ids, ws, a);
    auto const h = on_host(ids);
    EXPECT_TRUE(conforms(sc, std::vector<std::int32_t>(h.data(), h.data() + h.size())));
  }
  {
    // A topk whose buffers only the wide top-k holds (device shapes: past
    // about 3900 in a device team's fast scratch; a host's level 0 holds
    // any of these).
    int const wide_topk = 5000;
    if (KPool::Details::select_plan<E, std::uint32_t, false>(wide_topk, sc.max_visible)
            .kernel == KPool::Details::SelectKernel::wide) {
      SCOPED_TRACE("the wide top-k");
      KPool::SelectWorkspace<float, M> ws(in.space, 2, sc.max_visible, s.H, s.D);
      Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> wide("wide", sc.rows, wide_topk);
      Kokkos::deep_copy(wide, kSentinel);
      try {
        KPool::score_select(in.space, in.q, in.w, wide_topk, KPool::decode_batch(positions, 2),
                            KPool::paged(in.cache, in.table), wide, ws, o);
        ADD_FAILURE() << "a fused selection of the wide top-k was taken";
      } catch (KPool::InvalidArgument const& e) {
        EXPECT_EQ(e.argument(), "options");
        EXPECT_NE(std::string(e.what()).find("wide selection"), std::string::npos) << e.what();
      }
      auto const h = on_host(wide);
      for (std::size_t i = 0; i < h.span(); ++i) ASSERT_EQ(h.data()[i], kSentinel);
    } else {
      EXPECT_FALSE(KPool::Details::device_shapes<E>::value)
          << "a device team's fast scratch held 5000 ids twice";
    }
  }
  if (KPOOL_HAS_KOKKOSKERNELS && Kokkos::SpaceAccessibility<Kokkos::HostSpace, M>::accessible) {
    SCOPED_TRACE("blas");
    KPool::SelectWorkspace<float, M> ws(in.space, 2, sc.max_visible, s.H, s.D,
                                        KPool::ScoreEngine::blas);
    attempt(ws, o, "blas");
  }
}

// Kokkos Tools events while armed: kernels begun, fences, deep copies and
// allocations.
struct LaunchEvents {
  bool armed = false;
  std::vector<std::string> kernels;
  int fences = 0, deep_copies = 0;
  std::vector<std::string> allocations;
};
LaunchEvents launch_events;
// A host backend allocates its threads' scratch from every thread at once
// (Kokkos::OpenMP grows its team-scratch pool inside a parallel region), so
// the callbacks take a lock.
std::mutex launch_events_lock;

void on_kernel(char const* name, std::uint32_t, std::uint64_t*) {
  std::lock_guard<std::mutex> const hold(launch_events_lock);
  if (launch_events.armed) launch_events.kernels.emplace_back(name);
}
void on_any_fence(char const*, std::uint32_t, std::uint64_t*) {
  std::lock_guard<std::mutex> const hold(launch_events_lock);
  if (launch_events.armed) ++launch_events.fences;
}
void on_any_copy(Kokkos::Tools::SpaceHandle, char const*, void const*, Kokkos::Tools::SpaceHandle,
                 char const*, void const*, std::uint64_t) {
  std::lock_guard<std::mutex> const hold(launch_events_lock);
  if (launch_events.armed) ++launch_events.deep_copies;
}
void on_allocation(Kokkos::Tools::SpaceHandle, char const* label, void const*, std::uint64_t) {
  std::lock_guard<std::mutex> const hold(launch_events_lock);
  if (launch_events.armed) launch_events.allocations.emplace_back(label ? label : "(no label)");
}

// A decode selection of 64 rows x 8192 pools (the serving profile's fp8
// rotated cache), validation off: fused, one kernel scores and selects
// (after the rows' and the queries' own small launches), one fewer than
// separate; once warm (a host backend grows its team-scratch pool on a
// kernel's first launch), neither fences, copies or allocates.
TEST(SelectDecodeFusion, SixtyFourRowsOf8192PoolsInOneScoringLaunch) {
  using E = Kokkos::DefaultExecutionSpace;
  using M = E::memory_space;
  using T = float;
  int const K = 4, H = 4, D = 64, topk = 64, B = 64, pools = 8192, block_pools = 64;
  int const blocks = pools / block_pools;
  E space;
  KPool::PoolCache<KPool::float8_e4m3, M> cache(space, blocks, block_pools, D, K,
                                                KPool::CacheScale::pow2, true,
                                                KPool::CacheProfile::serving);
  {
    Rng rng(8);
    auto v = Kokkos::create_mirror_view(cache.values());
    auto sc = Kokkos::create_mirror_view(cache.scales());
    for (std::size_t i = 0; i < v.span(); ++i)
      v.data()[i] = KPool::float8_e4m3::from_bits(static_cast<std::uint8_t>(rng.below(0x7E)));
    for (std::size_t i = 0; i < sc.span(); ++i) sc.data()[i] = 1.0f;
    Kokkos::deep_copy(cache.values(), v);
    Kokkos::deep_copy(cache.scales(), sc);
  }
  // Every request reads the same blocks; its one row sees all 8192 pools.
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> table("table", B, blocks);
  std::vector<std::int32_t> pos(B);
  {
    auto h = Kokkos::create_mirror_view(table);
    for (int r = 0; r < B; ++r)
      for (int j = 0; j < blocks; ++j) h(r, j) = j;
    Kokkos::deep_copy(table, h);
    for (int r = 0; r < B; ++r) pos[r] = K * pools - 1 - r % K;
  }
  auto const positions = positions_view<M>(pos, 1);
  Kokkos::View<T***, Kokkos::LayoutRight, M> q("q", B, H, D);
  Kokkos::View<float**, Kokkos::LayoutRight, M> w("w", B, H);
  {
    Rng rng(9);
    fill_uniform(rng, q, -1, 1);
    fill_uniform(rng, w, 0, 1);
  }
  KPool::SelectWorkspace<T, M> ws(space, B, pools, H, D);
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> fused_ids("fused", B, topk),
      separate_ids("separate", B, topk);
  auto const paged = KPool::paged(cache, table);
  auto const batch = KPool::decode_batch(positions, B);
  auto const select = [&](KPool::DecodeSelection how,
                          Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> const& out) {
    KPool::Options o = test_options<E>();
    o.validate = false;
    o.decode_selection = how;
    // Cold: only the backend may allocate (its scratch pool), never KPool.
    launch_events = LaunchEvents();
    launch_events.armed = true;
    KPool::score_select(space, q, w, topk, batch, paged, out, ws, o);
    launch_events.armed = false;
    Kokkos::fence();
    for (std::string const& label : launch_events.allocations)
      EXPECT_EQ(label.find("KPool"), std::string::npos) << "a cold call allocated " << label;
    launch_events = LaunchEvents();
    launch_events.armed = true;
    KPool::score_select(space, q, w, topk, batch, paged, out, ws, o);
    launch_events.armed = false;
    Kokkos::fence();
    return launch_events;
  };
  Kokkos::Tools::Experimental::set_begin_parallel_for_callback(on_kernel);
  Kokkos::Tools::Experimental::set_begin_fence_callback(on_any_fence);
  Kokkos::Tools::Experimental::set_begin_deep_copy_callback(on_any_copy);
  Kokkos::Tools::Experimental::set_allocate_data_callback(on_allocation);
  LaunchEvents const f = select(KPool::DecodeSelection::fused, fused_ids);
  LaunchEvents const p = select(KPool::DecodeSelection::separate, separate_ids);
  LaunchEvents const a = select(KPool::DecodeSelection::automatic, separate_ids);
  Kokkos::Tools::Experimental::set_begin_parallel_for_callback(nullptr);
  Kokkos::Tools::Experimental::set_begin_fence_callback(nullptr);
  Kokkos::Tools::Experimental::set_begin_deep_copy_callback(nullptr);
  Kokkos::Tools::Experimental::set_allocate_data_callback(nullptr);
  auto const joined = [](std::vector<std::string> const& v) {
    std::string s;
    for (std::string const& k : v) s += k + "; ";
    return s;
  };
  auto const count = [](std::vector<std::string> const& v, std::string const& part) {
    return std::count_if(v.begin(), v.end(), [&](std::string const& k) {
      return k.find(part) != std::string::npos;
    });
  };
  // Fused: one kernel preparing the queries, scoring and selecting (the
  // rows are read from the positions: no launch builds them).
  ASSERT_EQ(f.kernels.size(), 1u) << joined(f.kernels);
  EXPECT_EQ(count(f.kernels, "+select"), 1) << joined(f.kernels);
  // Separate: the queries, the scoring, the top-k.
  EXPECT_EQ(p.kernels.size(), 3u) << joined(p.kernels);
  EXPECT_EQ(count(p.kernels, "prepare_queries"), 1) << joined(p.kernels);
  EXPECT_EQ(count(p.kernels, "+select"), 0) << joined(p.kernels);
  // The default: fused with device shapes, separate on a host.
  EXPECT_EQ(a.kernels, KPool::Details::device_shapes<E>::value ? f.kernels : p.kernels)
      << joined(a.kernels);
  for (LaunchEvents const* e : {&f, &p}) {
    EXPECT_EQ(e->fences, 0);
    EXPECT_EQ(e->deep_copies, 0);
    EXPECT_TRUE(e->allocations.empty()) << "allocated " << joined(e->allocations);
  }
  EXPECT_EQ(raw_bytes(fused_ids), raw_bytes(separate_ids));
  // Every row selected topk distinct pools.
  auto const h = on_host(fused_ids);
  for (int r = 0; r < B; ++r) {
    std::vector<std::int32_t> row(h.data() + r * topk, h.data() + (r + 1) * topk);
    std::sort(row.begin(), row.end());
    EXPECT_TRUE(row.front() >= 0 && row.back() < pools &&
                std::adjacent_find(row.begin(), row.end()) == row.end())
        << "row " << r;
  }
}

// ------------------------------------------------------------ host sync

// Kokkos Tools events while armed: fences and deep copies.
struct HostEvents {
  bool armed = false;
  std::vector<std::string> fences;
  int deep_copies = 0;
};
HostEvents host_events;

void on_fence(char const* name, std::uint32_t, std::uint64_t*) {
  if (host_events.armed) host_events.fences.emplace_back(name);
}
void on_deep_copy(Kokkos::Tools::SpaceHandle, char const*, void const*,
                  Kokkos::Tools::SpaceHandle, char const*, void const*, std::uint64_t) {
  if (host_events.armed) ++host_events.deep_copies;
}

// With validation off, score_select and select_tokens queue their launches
// on the caller's instance and wait for nothing (no fence, no copy), so a
// serving step and its selection overlap other streams and can be captured
// in a CUDA graph: the engines that run on every space (tiles, team_gemm, and
// register_tiles on hosts). The BLAS engine fences by design.
TEST(SelectHostSync, WithoutValidationNothingWaitsForTheHost) {
  using E = Kokkos::DefaultExecutionSpace;
  using M = E::memory_space;
  using T = float;
  Shape const s{4, 4, 64, 8, true, true, 8};
  Scenario const sc = make_scenario(s, DType::f32, mixed_batch(), 6, 2, 21);
  Inputs<E, T, KPool::float8_e4m3> in(sc);
  auto const batch = KPool::ragged_batch(in.bv.row_offsets, in.bv.cache_lengths,
                                         sc.batch.device.num_requests);
  auto const paged = KPool::paged(in.cache, in.table);
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> ids("ids", sc.rows, s.topk);
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> tokens(
      "tokens", sc.rows, KPool::select_tokens_width(s.topk, s.K));
  std::vector<KPool::ScoreEngine> engines =
      built_engines({KPool::ScoreEngine::tiles, KPool::ScoreEngine::team_gemm});
  if (!KPool::Details::KokkosExt::is_device_backend<E>::value)
    engines.push_back(KPool::ScoreEngine::register_tiles);
  Kokkos::deep_copy(ids, kSentinel);
  Kokkos::fence();
  Kokkos::Tools::Experimental::set_begin_fence_callback(on_fence);
  Kokkos::Tools::Experimental::set_begin_deep_copy_callback(on_deep_copy);
  for (KPool::ScoreEngine engine : engines) {
    KPool::Options o = options_for<E>(engine);
    o.validate = false;
    KPool::SelectWorkspace<T, M> ws(in.space, sc.rows, workspace_visible(sc, o), s.H, s.D, engine);
    host_events = HostEvents();
    host_events.armed = true;
    KPool::score_select(in.space, in.q, in.w, s.topk, batch, paged, ids, ws, o);
    KPool::select_tokens(in.space, in.q, in.w, s.topk, batch, paged, tokens, ws, o);
    host_events.armed = false;
    Kokkos::fence();
    EXPECT_TRUE(host_events.fences.empty())
        << KPool::Details::engine_name(engine) << " fenced: " << host_events.fences.front();
    EXPECT_EQ(host_events.deep_copies, 0) << KPool::Details::engine_name(engine);
  }
  Kokkos::Tools::Experimental::set_begin_fence_callback(nullptr);
  Kokkos::Tools::Experimental::set_begin_deep_copy_callback(nullptr);
  // The same calls did select: the rows conform.
  auto const h = on_host(ids);
  EXPECT_TRUE(conforms(sc, std::vector<std::int32_t>(h.data(), h.data() + h.size())));
}

// ------------------------------------------------- implementation details

TEST(SelectDetails, Fp8DecodeMatchesTheCacheType) {
  for (int b = 0; b < 256; ++b) {
    auto const v = KPool::float8_e4m3::from_bits(static_cast<std::uint8_t>(b));
    float const want = static_cast<float>(v);
    float const got = KPool::Details::cache_value<float>(v);
    EXPECT_EQ(KPool::Details::KokkosExt::bit_cast<std::uint32_t>(got),
              KPool::Details::KokkosExt::bit_cast<std::uint32_t>(want))
        << "code " << b;
    double const ref = SR::fp8_decode(static_cast<std::uint8_t>(b));
    if (std::isnan(ref))
      EXPECT_TRUE(std::isnan(got));
    else
      EXPECT_EQ(static_cast<double>(got), ref) << "code " << b;
  }
}

// The selection's launch: a power-of-two team (its team scans need one on
// CUDA before Kokkos 3.7) not above what Options::team_size asked, and
// level-0 scratch within what a device team has, whatever topk is: the
// buffered kernel while its buffers fit, the wide kernel (the same scratch
// for every topk) past that.
template <class F>
void expect_select_shapes(F const& f, std::size_t bytes) {
  using E = Kokkos::DefaultExecutionSpace;
  E space;
  for (int requested = 0; requested <= 70; ++requested) {
    KPool::Options o;
    o.team_size = requested;
    KPool::Details::LaunchShape const shape =
        KPool::Details::select_shape(space, f, 100, bytes, o);
    ASSERT_GE(shape.team_size, 1);
    ASSERT_EQ(shape.team_size & (shape.team_size - 1), 0)
        << "team_size " << requested << " gave " << shape.team_size;
    if (requested > 0) {
      ASSERT_LE(shape.team_size, requested);
    }
    ASSERT_EQ(shape.scratch_level, 0);
    ASSERT_EQ(shape.scratch_bytes, bytes);
  }
}

TEST(SelectDetails, SelectLaunchTakesPowerOfTwoTeamsAndLevelZeroScratch) {
  using E = Kokkos::DefaultExecutionSpace;
  using Kernel = KPool::Details::SelectKernel;
  std::size_t const wide_bytes =
      KPool::Details::SelectWideFunctor<E, std::uint32_t, true>::scratch_bytes();
  for (std::size_t max_visible : {std::size_t(8192), std::size_t(1) << 20}) {
    for (int topk : {1, 512, 2048, 12000, 1 << 20}) {
      KPool::Details::SelectPlan const plan =
          KPool::Details::select_plan<E, std::uint32_t, true>(topk, max_visible);
      SCOPED_TRACE("topk " + std::to_string(topk) + ", max_visible " +
                   std::to_string(max_visible));
      EXPECT_LE(plan.scratch_bytes, KPool::Details::device_scratch0<E>());
      EXPECT_LE(plan.scratch_bytes, KPool::Details::scratch_max<E>(0));
      if (topk >= 12000) {
        // 2 * topk ids alone are past any device's fast scratch.
        EXPECT_EQ(plan.kernel, Kernel::wide);
        EXPECT_EQ(plan.scratch_bytes, wide_bytes);
      }
      if (topk <= 2048) {
        EXPECT_NE(plan.kernel, Kernel::wide);
        EXPECT_GE(plan.cap, 128);
      }
      if (plan.kernel == Kernel::wide) {
        KPool::Details::SelectWideFunctor<E, std::uint32_t, true> f{};
        expect_select_shapes(f, plan.scratch_bytes);
      } else {
        KPool::Details::SelectFunctor<E, std::uint32_t, true, false> f{};
        expect_select_shapes(f, plan.scratch_bytes);
      }
    }
  }
}

template <class F>
void check_key_order(std::vector<F> const& values) {
  using KPool::Details::score_key;
  for (F a : values)
    for (F b : values) {
      auto const ka = score_key(a), kb = score_key(b);
      if (std::isnan(a) || std::isnan(b)) {
        if (std::isnan(a) && std::isnan(b))
          EXPECT_EQ(ka, kb);
        else
          EXPECT_EQ(ka < kb, std::isnan(a)) << a << " vs " << b;
        continue;
      }
      EXPECT_EQ(ka < kb, a < b) << a << " vs " << b;
      EXPECT_EQ(ka == kb, a == b) << a << " vs " << b;
    }
  for (F a : values) EXPECT_GT(score_key(a), 0u) << "a score must rank above a pool that is not visible";
}

TEST(SelectDetails, KeysOrderLikeScores) {
  float const inf = std::numeric_limits<float>::infinity();
  float const nan = std::numeric_limits<float>::quiet_NaN();
  check_key_order<float>({-inf, -3.5f, -1e-30f, -0.0f, 0.0f, 1e-45f, 1.0f, 2.0f,
                          std::numeric_limits<float>::max(), inf, nan, -nan});
  double const dinf = std::numeric_limits<double>::infinity();
  double const dnan = std::numeric_limits<double>::quiet_NaN();
  check_key_order<double>({-dinf, -3.5, -1e-300, -0.0, 0.0, 4.9e-324, 1.0, 2.0, dinf,
                           dnan, -dnan});
}

}  // namespace
