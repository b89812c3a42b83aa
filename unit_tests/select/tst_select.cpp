// score_select and select_tokens against the independent reference
// (docs/indexer.md, "Scoring" and "Selection"; KPoolSelectReference.hpp): every
// storage type, native and fp8 caches, rotated and not, both scoring
// engines; docs/indexer.md's tolerance rule on every row, planted exact ties
// resolved to the lower ids identically on every run, NaN, rows that see
// nothing, rows outside the live requests untouched, long rows.

#include "KPoolSelectScenario.hpp"

#include <iomanip>

namespace {

using namespace KPoolSelectTest;  // KPoolTest's names and SR too

template <class C>
class Select : public ::testing::Test {};
TYPED_TEST_SUITE(Select, Configs, ConfigName);

// ------------------------------------------------------------------ tests

TYPED_TEST(Select, ConformsToTheReferenceOnTheGrid) {
  using E = typename TypeParam::execution_space;
  using T = typename TypeParam::value_type;
  std::uint64_t seed = 100;
  for (Shape const& s : grid(TypeParam::dtype)) {
    expect_every_engine_conforms<E, T>(
        s, make_scenario(s, TypeParam::dtype, mixed_batch(), 6, 2, ++seed));
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
      expect_every_engine_conforms<E, T>(
          s, make_scenario(s, TypeParam::dtype, mixed_batch(), 6, 2, ++seed));
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
      expect_tokens_expand_the_selection<E, T>(sc, options_for<E>(engine));
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
    expect_tokens_expand_the_selection<E, T>(sc, options_for<E>(engine, 0));
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

}  // namespace
