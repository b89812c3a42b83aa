// KPool::score, the indexer's logits (docs/api.md, docs/indexer.md,
// "Scoring"), on every engine of the space, native, fp8 exact and serving
// caches, ragged and decode batches:
//  * every visible pool's score is the independent f64 reference's
//    (KPoolSelectReference.hpp, from the cache's own stored numbers) within
//    docs/indexer.md's tolerance, every column past a row's visible pools
//    is -inf, and rows outside the live requests are not touched (a batch
//    of one request fewer scores the others' rows the same);
//  * the scores are the ones the selection ranks: their keys are, bit for
//    bit, the keys score_select leaves in the workspace, and for every topk
//    the ranking of KPool::score's scores (higher first, ties to the lower
//    id) is score_select's pool_ids, row by row, on the same workspace;
//  * a workspace of fewer rows (chunks) gives the same bits, and so does
//    the tensor-core engine's launch of 1, 2, 3, 5 or 1000 persistent teams
//    (Options::scoring_teams), whose shares cross row groups, and so do
//    its key pipelines of 1, 2 and 3 tiles (Options::key_pipeline_depth);
//  * a scores View too narrow or too short, or a negative
//    Options::scoring_teams or key_pipeline_depth, is refused by name,
//    nothing written.

#include <KPoolSelectReference.hpp>
#include <KPoolShardTestUtils.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using namespace KPoolTest;
namespace SR = KPoolSelectRef;

using namespace KPoolTest::OnDefaultSpace;

template <class T>
using Scores = Kokkos::View<typename KPool::SelectWorkspace<T, M>::score_type**,
                            Kokkos::LayoutRight, M>;

constexpr float kUntouched = 12345.0f;

// The engines of this space that take the call.
template <class T, class C>
std::vector<KPool::ScoreEngine> engines_for(bool serving) {
  std::vector<KPool::ScoreEngine> e{KPool::ScoreEngine::automatic, KPool::ScoreEngine::tiles};
  if (!KPool::Details::KokkosExt::is_device_backend<E>::value)
    e.push_back(KPool::ScoreEngine::register_tiles);
  for (KPool::ScoreEngine x : built_engines({KPool::ScoreEngine::team_gemm}))
    e.push_back(x);
  if (workspace_engine<M>(KPool::ScoreEngine::blas) == KPool::ScoreEngine::blas)
    e.push_back(KPool::ScoreEngine::blas);
  if (KPool::Details::mma_plan<E, T, C>(false, serving).usable)
    e.push_back(KPool::ScoreEngine::tensor_cores);
  return e;
}

// The library's cache as the reference's stored numbers.
template <class C>
SR::Cache reference_cache(KPool::PoolCache<C, M> const& cache, bool serving) {
  constexpr bool fp8 = std::is_same<C, KPool::float8_e4m3>::value;
  auto const v = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), cache.values());
  auto const s = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), cache.scales());
  int const blocks = static_cast<int>(v.extent(0)), pools = static_cast<int>(v.extent(1)),
            D = static_cast<int>(v.extent(2));
  SR::Cache ref(blocks, pools, D, fp8, false);
  ref.serving = serving;
  for (int b = 0; b < blocks; ++b)
    for (int e = 0; e < pools; ++e) {
      ref.scale[ref.entry(b, e)] = fp8 ? static_cast<double>(s(b, e)) : 1.0;
      for (int c = 0; c < D; ++c) {
        if constexpr (fp8)
          ref.set_code(b, e, c, v(b, e, c).bits);
        else
          ref.set_value(b, e, c, to_double(v(b, e, c)));
      }
    }
  return ref;
}

// One query row's inputs as the reference takes them.
template <class Q, class W>
SR::Query reference_query(Q const& q, W const& w, int t, bool serving) {
  int const H = static_cast<int>(q.extent(1)), D = static_cast<int>(q.extent(2));
  std::vector<double> qv(static_cast<std::size_t>(H) * D), wv(H);
  for (int h = 0; h < H; ++h) {
    wv[h] = w(t, h);
    for (int c = 0; c < D; ++c) qv[static_cast<std::size_t>(h) * D + c] = to_double(q(t, h, c));
  }
  return SR::Query(qv, wv, H, D, false, serving);
}

// A row of the call: its position and its request's block table row.
struct Row {
  int t, request;
  std::int64_t position;
};

template <class T, class C>
void check_scores(Sharded<E, T, C> const& s, KPool::PoolCache<C, M> const& cache,
                  I2 const& table, KPool::Batch<M> const& batch, std::vector<Row> const& rows,
                  KPool::Batch<M> const& fewer, int fewer_live, std::string const& what) {
  SCOPED_TRACE(what);
  E space = s.space;
  bool const serving = s.s.serving;
  SR::Cache const ref = reference_cache(cache, serving);
  auto const h_table = on_host(table);
  auto const qv = Kokkos::subview(s.q, std::make_pair(0, static_cast<int>(rows.size())),
                                  Kokkos::ALL, Kokkos::ALL);
  auto const wv = Kokkos::subview(s.w, std::make_pair(0, static_cast<int>(rows.size())),
                                  Kokkos::ALL);
  auto const hq = on_host(qv);
  auto const hw = on_host(wv);
  // Whole blocks past every row's pools (40 for the short cases).
  std::size_t visible = 40;
  for (int r = 0; r < s.B; ++r)
    visible = std::max<std::size_t>(visible, static_cast<std::size_t>(s.pools(r) + 8));
  std::size_t const cols = visible + 3;
  int const live = static_cast<int>(rows.size());
  int checked_engines = 0;
  for (KPool::ScoreEngine engine : engines_for<T, C>(serving)) {
    SCOPED_TRACE(KPool::Details::engine_name(engine));
    KPool::Options const o = test_options<E>();
    KPool::SelectWorkspace<T, M> ws(space, live, visible, s.s.H, s.s.D, engine);
    Scores<T> scores("scores", live, cols);
    Kokkos::deep_copy(scores, kUntouched);
    KPool::score(space, qv, wv, batch, KPool::paged(cache, table), scores, ws, o);
    auto const h = on_host(scores);
    bool const device_mma = engine == KPool::ScoreEngine::tensor_cores && serving &&
                            KPool::Details::KokkosExt::is_device_backend<E>::value;
    double const tol = device_mma ? std::ldexp(1.0, -10) : 1e-5;
    std::vector<SR::RowScores> got(rows.size());
    for (Row const& r : rows) {
      std::vector<std::int32_t> trow(h_table.extent(1));
      for (std::size_t c = 0; c < trow.size(); ++c) trow[c] = h_table(r.request, c);
      std::int64_t const n = SR::visible(r.position, s.s.K);
      SR::RowScores const want =
          SR::score_row(ref, trow, reference_query(hq, hw, r.t, serving), n);
      got[r.t].counted.assign(static_cast<std::size_t>(n), true);
      for (std::size_t p = 0; p < cols; ++p) {
        double const x = h(r.t, p);
        if (static_cast<std::int64_t>(p) >= n) {
          EXPECT_TRUE(std::isinf(x) && x < 0) << "row " << r.t << " column " << p << ": " << x;
          continue;
        }
        got[r.t].score.push_back(x);
        EXPECT_LE(std::fabs(x - want.score[p]), tol * want.S + 1e-30)
            << "row " << r.t << " pool " << p << ": " << x << ", reference " << want.score[p];
      }
    }
    // A batch of one request fewer: its rows as before, the last
    // request's rows not touched.
    Scores<T> part("part", live, cols);
    Kokkos::deep_copy(part, kUntouched);
    KPool::score(space, qv, wv, fewer, KPool::paged(cache, table), part, ws, o);
    auto const hp = on_host(part);
    for (int t = 0; t < live; ++t)
      for (std::size_t p = 0; p < cols; ++p) {
        float const want = t < fewer_live ? static_cast<float>(h(t, p)) : kUntouched;
        ASSERT_TRUE(same_bits(static_cast<float>(hp(t, p)), want)) << "row " << t << " pool " << p;
      }

    // The keys a selection ranks are these scores' keys, bit for bit (the
    // workspace keeps the last call's keys, row t at t * max_visible).
    {
      I2 ids("pool_ids", live, 1);
      KPool::score_select(space, qv, wv, 1, batch, KPool::paged(cache, table), ids, ws, o);
      auto const keys = on_host(ws.keys());
      for (Row const& r : rows)
        for (std::size_t p = 0; p < got[r.t].score.size(); ++p) {
          auto const x = static_cast<typename KPool::SelectWorkspace<T, M>::score_type>(h(r.t, p));
          ASSERT_EQ(keys(r.t * ws.max_visible() + p), KPool::Details::score_key(x))
              << "row " << r.t << " pool " << p;
        }
    }
    // The selection ranks exactly these scores, for every topk.
    for (int topk : {1, 2, 3, 5, 8, 13, 40}) {
      I2 ids("pool_ids", live, topk);
      KPool::score_select(space, qv, wv, topk, batch, KPool::paged(cache, table), ids, ws, o);
      auto const hi = on_host(ids);
      for (Row const& r : rows) {
        std::vector<std::int32_t> const want = SR::select_exact(got[r.t], topk);
        for (int j = 0; j < topk; ++j) {
          std::int32_t const expect = j < static_cast<int>(want.size()) ? want[j] : -1;
          ASSERT_EQ(hi(r.t, j), expect) << "topk " << topk << ", row " << r.t << " column " << j;
        }
      }
    }

    // Chunks of 7 rows: the same bits (but with blas, whose GEMM may block
    // a product of fewer rows otherwise: a rounding apart, docs/indexer.md,
    // "Scoring"; its scores meet the tolerance above either way).
    ++checked_engines;
    if (engine == KPool::ScoreEngine::blas) continue;
    KPool::SelectWorkspace<T, M> small(space, 7, visible, s.s.H, s.s.D, engine);
    Scores<T> chunked("chunked", live, cols);
    Kokkos::deep_copy(chunked, kUntouched);
    KPool::score(space, qv, wv, batch, KPool::paged(cache, table), chunked, small, o);
    EXPECT_EQ(raw_bytes(chunked), raw_bytes(scores));
    // The tensor-core engine's persistent launch (Options::scoring_teams):
    // one team walking every group, a few teams whose shares cross groups,
    // more teams than the work: the same bits.
    if (engine != KPool::ScoreEngine::tensor_cores) continue;
    for (int teams : {1, 2, 3, 5, 1000}) {
      SCOPED_TRACE("scoring_teams " + std::to_string(teams));
      KPool::Options p = o;
      p.scoring_teams = teams;
      Scores<T> persistent("persistent", live, cols);
      Kokkos::deep_copy(persistent, kUntouched);
      // The workspace's keys poisoned: a key the launch skips shows.
      Kokkos::deep_copy(ws.keys(), typename std::decay_t<decltype(ws.keys())>::value_type(0x5a5a5a5a));
      KPool::score(space, qv, wv, batch, KPool::paged(cache, table), persistent, ws, p);
      EXPECT_EQ(raw_bytes(persistent), raw_bytes(scores));
    }
    // The key pipeline (Options::key_pipeline_depth): one tile ahead in
    // registers, rings of 2 and 3 tiles copied asynchronously, with shares
    // crossing groups (3 teams) and not: the same bits.
    for (int depth : {1, 2, 3})
      for (int teams : {0, 3}) {
        SCOPED_TRACE("key_pipeline_depth " + std::to_string(depth) + ", scoring_teams " +
                     std::to_string(teams));
        KPool::Options p = o;
        p.key_pipeline_depth = depth;
        p.scoring_teams = teams;
        Scores<T> piped("piped", live, cols);
        Kokkos::deep_copy(piped, kUntouched);
        Kokkos::deep_copy(ws.keys(), typename std::decay_t<decltype(ws.keys())>::value_type(0x5a5a5a5a));
        KPool::score(space, qv, wv, batch, KPool::paged(cache, table), piped, ws, p);
        EXPECT_EQ(raw_bytes(piped), raw_bytes(scores));
      }
  }
  EXPECT_GE(checked_engines, 2);
}

// The case's ragged batch (every token a query row) unless `decode_only`,
// then a decode batch.
template <class T, class C>
void check_case(ShardCase const& sc, std::uint64_t seed, bool decode_only = false) {
  Sharded<E, T, C> s(sc, seed);
  int blocks = 0;
  I2 const table = s.make_table([&](int r) { return s.pools(r) + 8; }, blocks, seed + 1);
  KPool::PoolCache<C, M> const cache = s.make_cache(blocks);
  s.write(cache, table);
  // The step's ragged rows: request r's i-th row at position i.
  if (!decode_only) {
    std::vector<Row> rows;
    for (int r = 0, t = 0; r < s.B; ++r)
      for (std::uint32_t i = 0; i < sc.tokens[r]; ++i) rows.push_back({t++, r, i});
    check_scores(s, cache, table, s.batch(), rows,
                 KPool::ragged_batch(s.row_offsets, s.cache_lengths, s.B - 1),
                 static_cast<int>(rows.size() - sc.tokens.back()), "ragged");
  }
  // A decode batch of two tokens a request at the end of its sequence.
  std::vector<std::int32_t> pos;
  std::vector<Row> drows;
  for (int r = 0; r < s.B; ++r)
    for (int i = 0; i < 2; ++i) {
      std::int32_t const p = static_cast<std::int32_t>(sc.tokens[r]) - 2 + i;
      pos.push_back(p < 0 ? -1 : p);
      if (p >= 0) drows.push_back({2 * r + i, r, p});
    }
  auto const positions = positions_view<M>(pos, 2);
  check_scores(s, cache, table, KPool::decode_batch(positions, s.B), drows,
               KPool::decode_batch(positions, s.B - 1), 2 * (s.B - 1), "decode");
}

ShardCase score_case(bool fp8, bool serving) {
  ShardCase sc;
  sc.D = 32;
  sc.fp8 = fp8;
  sc.serving = serving;
  sc.tokens = {2, 9, 37, 70};
  return sc;
}

TEST(Score, NativeCache) {
  check_case<float, float>(score_case(false, false), 11);
  check_case<KPool::bfloat16, KPool::bfloat16>(score_case(false, false), 12);
}

TEST(Score, Fp8Cache) {
  check_case<float, KPool::float8_e4m3>(score_case(true, false), 13);
  check_case<KPool::bfloat16, KPool::float8_e4m3>(score_case(true, false), 14);
  // 40 heads: two head groups a row (32, then 8) on the tensor-core engine.
  ShardCase wide = score_case(true, false);
  wide.H = 40;
  check_case<KPool::bfloat16, KPool::float8_e4m3>(wide, 19);
  // Channels not a multiple of 4: the tensor-core engine stages the f32
  // query's three bf16 terms from one prepared value at a time, not from
  // 16-byte packets, and pads them to the MMA's K.
  ShardCase narrow = score_case(true, false);
  narrow.D = 18;
  check_case<float, KPool::float8_e4m3>(narrow, 20);
}

TEST(Score, ServingCache) {
  check_case<KPool::bfloat16, KPool::float8_e4m3>(score_case(true, true), 15);
  // Decode rows of up to 1025 pools: split over a few teams, a warp still
  // walks 5 or more tiles, so the tensor-core engine's key rings of 2 and
  // 3 (check_scores) wrap around.
  ShardCase longer = score_case(true, true);
  longer.tokens = {9, 4100, 300};
  check_case<KPool::bfloat16, KPool::float8_e4m3>(longer, 16, true);
  // Channels not a multiple of 16: the tensor-core engine stages the
  // prepared E4M3 bytes a word at a time, not in 16-byte packets.
  ShardCase narrow = score_case(true, true);
  narrow.D = 8;
  check_case<KPool::bfloat16, KPool::float8_e4m3>(narrow, 17);
  // 40 heads: the tensor-core engine's rows take two head groups (32, then
  // 8), whose folds add into one row's sums.
  ShardCase wide = score_case(true, true);
  wide.H = 40;
  check_case<KPool::bfloat16, KPool::float8_e4m3>(wide, 18);
}

// A scores View without room for the workspace's rows or its pools is
// refused by name before anything is written.
TEST(Score, RefusesAScoresViewTooSmall) {
  Sharded<E, float, float> s(score_case(false, false), 21);
  int blocks = 0;
  I2 const table = s.make_table([&](int r) { return s.pools(r) + 8; }, blocks, 22);
  KPool::PoolCache<float, M> const cache = s.make_cache(blocks);
  s.write(cache, table);
  KPool::SelectWorkspace<float, M> ws(s.space, s.rows, 40, s.s.H, s.s.D);
  for (auto const& shape : {std::make_pair(s.rows, 39), std::make_pair(s.rows - 1, 40)}) {
    Scores<float> scores("scores", shape.first, shape.second);
    Kokkos::deep_copy(scores, kUntouched);
    auto const before = raw_bytes(scores);
    try {
      KPool::score(s.space, s.q, s.w, s.batch(), KPool::paged(cache, table), scores, ws,
                   test_options<E>());
      ADD_FAILURE() << "a scores View of " << shape.first << " x " << shape.second
                    << " was taken";
    } catch (KPool::InvalidArgument const& e) {
      EXPECT_EQ(e.entry_point(), "KPool::score");
      EXPECT_EQ(e.argument(), "scores") << e.what();
    }
    EXPECT_EQ(raw_bytes(scores), before);
  }
  // A negative Options::scoring_teams, on every engine (the option is
  // checked before any launch, whichever engine runs).
  Scores<float> scores("scores", s.rows, 40);
  Kokkos::deep_copy(scores, kUntouched);
  auto const before = raw_bytes(scores);
  KPool::Options o = test_options<E>();
  o.scoring_teams = -3;
  try {
    KPool::score(s.space, s.q, s.w, s.batch(), KPool::paged(cache, table), scores, ws, o);
    ADD_FAILURE() << "scoring_teams = -3 was taken";
  } catch (KPool::InvalidArgument const& e) {
    EXPECT_EQ(e.argument(), "options") << e.what();
    EXPECT_EQ(e.value(), "-3") << e.what();
    EXPECT_NE(std::string(e.what()).find("scoring_teams"), std::string::npos) << e.what();
  }
  EXPECT_EQ(raw_bytes(scores), before);
  // A negative Options::key_pipeline_depth, the same way.
  o.scoring_teams = 0;
  o.key_pipeline_depth = -1;
  try {
    KPool::score(s.space, s.q, s.w, s.batch(), KPool::paged(cache, table), scores, ws, o);
    ADD_FAILURE() << "key_pipeline_depth = -1 was taken";
  } catch (KPool::InvalidArgument const& e) {
    EXPECT_EQ(e.argument(), "options") << e.what();
    EXPECT_EQ(e.value(), "-1") << e.what();
    EXPECT_NE(std::string(e.what()).find("key_pipeline_depth"), std::string::npos) << e.what();
  }
  EXPECT_EQ(raw_bytes(scores), before);
}

}  // namespace
