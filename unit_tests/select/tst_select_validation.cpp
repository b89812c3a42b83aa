// Bad input to the selection stage (docs/indexer.md, "Bad input"): score_select
// and select_tokens check every argument before launching anything and
// throw KPool::InvalidArgument naming the entry point, the argument, the
// row and the value, with no output written. One TEST per rule, each
// breaking exactly one thing of a valid call.
//
// Then defence in depth: with Options::validate off, garbage block tables,
// offsets and lengths never make a kernel write outside the outputs or
// read outside the cache (outputs and cache have their exact sizes, so an
// AddressSanitizer build catches a stray access), and rows outside the live
// requests stay untouched.

#include <KPoolTestUtils.hpp>

#include <functional>
#include <limits>

namespace {

using namespace KPoolTest;

using namespace KPoolTest::OnDefaultSpace;
using T = KPool::bfloat16;
using C = KPool::float8_e4m3;
using Q3 = Kokkos::View<T***, Kokkos::LayoutRight, M>;
using Cache = KPool::PoolCache<C, M>;
using Workspace = KPool::SelectWorkspace<T, M>;

enum class Entry { score_select, select_tokens };

std::string entry_name(Entry e) {
  return e == Entry::score_select ? "KPool::score_select" : "KPool::select_tokens";
}
std::vector<Entry> const kBoth = {Entry::score_select, Entry::select_tokens};

// One valid call, K = 2, H = 4, D = 16, topk = 3, an fp8 rotated cache of 4
// blocks of 4 pools. B = 4: live requests (cache length, rows) (0, 5) with 2
// visible pools in block 0, (9, 3) with 6 in blocks 2 and 1, (3, 0) with no
// rows; row 3 is dead, with garbage. q has 10 rows, 2 past the live ones.
struct World {
  Rng rng{20240613};
  E space;
  int K = 2, H = 4, D = 16, topk = 3;
  std::vector<std::uint32_t> row_offsets{0, 5, 8, 8, 2};
  std::vector<std::uint32_t> cache_lengths{0, 9, 3, 0xFFFFFFF0u};
  int num_requests = 3;
  int max_blocks = 3;
  std::vector<std::int32_t> table{0, -1, -1, 2, 1, -1, -1, -1, -1, 77, -9, 5};
  int rows = 10;
  std::size_t ws_rows = 10, ws_visible = 8;
  int ws_heads = 4;
  Q3 q;
  F2 weights;
  Cache cache;
  I2 pool_ids, tokens;
  KPool::Options opts;
  KPool::ScoreEngine engine = KPool::ScoreEngine::automatic;  // the workspace's

  World() {
    opts = test_options<E>();
    opts.validate = true;
    q = Q3("q", rows, H, D);
    weights = F2("weights", rows, H);
    fill(q);
    fill(weights);
    cache = Cache(space, 4, 4, D, K, KPool::CacheScale::amax, true);
    random_bytes(cache.values());
    Kokkos::deep_copy(cache.scales(), 0.5f);
    pool_ids = I2("pool_ids", rows, topk);
    tokens = I2("tokens", rows, KPool::select_tokens_width(topk, K));
    scramble_outputs();
  }

  template <class V>
  void fill(V const& v) {
    auto h = Kokkos::create_mirror_view(v);
    for (std::size_t i = 0; i < h.span(); ++i)
      h.data()[i] = static_cast<typename V::value_type>(rng.uniform(-1, 1));
    Kokkos::deep_copy(v, h);
  }
  template <class V>
  void random_bytes(V const& v) {
    auto h = Kokkos::create_mirror_view(v);
    auto* p = reinterpret_cast<unsigned char*>(h.data());
    for (std::size_t i = 0; i < h.span() * sizeof(typename V::value_type); ++i)
      p[i] = static_cast<unsigned char>(rng.next());
    Kokkos::deep_copy(v, h);
  }
  void scramble_outputs() {
    random_bytes(pool_ids);
    random_bytes(tokens);
  }

  I2 table_view() const {
    return int_matrix_view<M>(table, static_cast<int>(cache_lengths.size()), max_blocks,
                              "block_table");
  }

  void run(Entry e) { run_with(e, q, weights, cache); }

  template <class QV, class Cc>
  void run_with(Entry e, QV const& qv, F2 const& w, Cc const& c) {
    using Tq = typename QV::non_const_value_type;
    U32 const ro = to_index_view<U32>(row_offsets, "row_offsets");
    U32 const cl = to_index_view<U32>(cache_lengths, "cache_lengths");
    I2 const bt = table_view();
    KPool::SelectWorkspace<Tq, M> ws(space, ws_rows, ws_visible, ws_heads, D,
                                     workspace_engine<M>(engine));
    auto const batch = KPool::ragged_batch(ro, cl, num_requests);
    if (e == Entry::score_select)
      KPool::score_select(space, qv, w, topk, batch, KPool::paged(c, bt), pool_ids, ws, opts);
    else
      KPool::select_tokens(space, qv, w, topk, batch, KPool::paged(c, bt), tokens, ws, opts);
    space.fence();
  }
};

// Every byte the calls may write, and the cache they read.
struct Snapshot {
  std::vector<std::int32_t> pool_ids, tokens;
  std::vector<unsigned char> values;
  std::vector<float> scales;
};

template <class V>
std::vector<typename V::non_const_value_type> bytes_of(V const& v) {
  auto const h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  return std::vector<typename V::non_const_value_type>(h.data(), h.data() + h.span());
}

Snapshot snapshot(World const& w) {
  Snapshot s;
  s.pool_ids = bytes_of(w.pool_ids);
  s.tokens = bytes_of(w.tokens);
  auto const v = bytes_of(w.cache.values());
  for (auto x : v) s.values.push_back(x.bits);
  s.scales = bytes_of(w.cache.scales());
  return s;
}

struct Expect {
  std::string argument;
  std::int64_t row;
  std::string value;
  std::string where;
};

Expect at_row(std::string arg, std::int64_t row, std::int64_t value) {
  return {std::move(arg), row, std::to_string(value), "row " + std::to_string(row)};
}
Expect at_extent(std::string arg, int extent, std::uint64_t value) {
  return {std::move(arg), -1, std::to_string(value), "extent " + std::to_string(extent)};
}
Expect scalar(std::string arg, std::int64_t value) {
  return {std::move(arg), -1, std::to_string(value), ""};
}

::testing::AssertionResult check_message(std::string const& entry,
                                         KPool::InvalidArgument const& e, Expect const& x) {
  std::string const what = e.what();
  std::string const expected = entry + ": argument '" + x.argument + "'" +
                               (x.where.empty() ? "" : ", " + x.where) + ": value " +
                               x.value + " ";
  if (e.entry_point() != entry || e.argument() != x.argument || e.row() != x.row ||
      e.value() != x.value || what.find(expected) != 0)
    return ::testing::AssertionFailure()
           << "got entry_point '" << e.entry_point() << "', argument '" << e.argument()
           << "', row " << e.row() << ", value '" << e.value() << "'\n  what(): " << what
           << "\n  expected what() to begin with: " << expected;
  return ::testing::AssertionSuccess();
}

// `call` must throw as `x` says and leave the outputs and the cache as they
// were.
::testing::AssertionResult rejects(World& w, Entry e, Expect const& x,
                                   std::function<void()> const& call) {
  w.scramble_outputs();
  Snapshot const before = snapshot(w);
  ::testing::AssertionResult result = ::testing::AssertionSuccess();
  try {
    call();
    result = ::testing::AssertionFailure() << "accepted the bad input";
  } catch (KPool::InvalidArgument const& ex) {
    result = check_message(entry_name(e), ex, x);
  } catch (std::exception const& ex) {
    result = ::testing::AssertionFailure()
             << "threw something other than KPool::InvalidArgument: " << ex.what();
  }
  w.space.fence();
  Snapshot const after = snapshot(w);
  if (result && (after.pool_ids != before.pool_ids || after.tokens != before.tokens))
    result = ::testing::AssertionFailure() << "an output was written";
  if (result && (after.values != before.values || after.scales != before.scales))
    result = ::testing::AssertionFailure() << "the cache was written";
  if (!result) result << "\n  (entry point " << entry_name(e) << ")";
  return result;
}

void expect_rejected(World& w, Expect const& x) {
  for (Entry e : kBoth) EXPECT_TRUE(rejects(w, e, x, [&] { w.run(e); }));
}

// The valid setup with one scalar argument set to `bad`: refused, naming
// the argument and the value.
void expect_scalar_rejected(int World::*field, char const* argument, int bad) {
  World w;
  w.*field = bad;
  expect_rejected(w, scalar(argument, bad));
}

// ---------------------------------------------------------------------------
// The valid setup passes, so each rejection below is that rule's alone.
// ---------------------------------------------------------------------------

TEST(SelectValidation, ValidSetupPasses) {
  World w;
  for (Entry e : kBoth) {
    EXPECT_NO_THROW(w.run(e)) << entry_name(e);
  }
  // Request 1, row 5 (position 9): pools 0..4 visible, 3 selected.
  auto const ids = bytes_of(w.pool_ids);
  int n = 0;
  for (int j = 0; j < w.topk; ++j) n += ids[5 * w.topk + j] >= 0 ? 1 : 0;
  EXPECT_EQ(n, 3);
}

TEST(SelectValidation, TopkMustBeAtLeastOne) {
  expect_scalar_rejected(&World::topk, "topk", 0);
}

// K is the cache's: a cache is never built with K < 1 (the one cache
// without K, an empty one, is refused as empty: CacheMustBeAllocated).
TEST(SelectValidation, KpoolMustBeAtLeastOne) {
  World w;
  for (int bad : {0, -3}) {
    try {
      Cache c(w.space, 4, 4, w.D, bad, KPool::CacheScale::amax, true);
      ADD_FAILURE() << "built a cache of K = " << bad;
    } catch (KPool::InvalidArgument const& e) {
      EXPECT_TRUE(check_message("KPool::PoolCache", e, scalar("kpool", bad)));
    }
  }
}

// A cache built for K (PoolCache's kpool constructor) is read with that K
// only: the K = 2 selection over a K = 4 cache ran and returned
// other visible pools. K is the cache's now, so token rows sized for K = 2
// are refused over a cache of another K, and a K = 4 cache's row at
// position 9 sees 2 pools, not 5.
TEST(SelectValidation, KpoolMustBeTheCaches) {
  for (int built : {4, 1}) {
    World w;
    w.cache = Cache(w.space, 4, 4, w.D, built, KPool::CacheScale::amax, true);
    EXPECT_EQ(w.cache.kpool(), built);
    EXPECT_TRUE(rejects(w, Entry::select_tokens,
                        at_extent("tokens", 1, KPool::select_tokens_width(w.topk, w.K)),
                        [&] { w.run(Entry::select_tokens); }));
    if (built != 4) continue;
    ASSERT_NO_THROW(w.run(Entry::score_select));
    auto const ids = bytes_of(w.pool_ids);
    for (int j = 0; j < w.topk; ++j) EXPECT_EQ(ids[5 * w.topk + j] >= 0, j < 2) << j;
  }
  World w;
  w.cache = Cache(w.space, 4, 4, w.D, w.K, KPool::CacheScale::amax, true);
  for (Entry e : kBoth) EXPECT_NO_THROW(w.run(e)) << entry_name(e);
}

TEST(SelectValidation, QueriesMustHaveTheCacheHeadDim) {
  World w;
  w.q = Q3("q", w.rows, w.H, w.D + 1);
  expect_rejected(w, at_extent("q", 2, w.D + 1));
}

TEST(SelectValidation, WeightsMustBeRowsByHeads) {
  {
    World w;
    w.weights = F2("weights", w.rows - 1, w.H);
    expect_rejected(w, at_extent("weights", 0, w.rows - 1));
  }
  {
    World w;
    w.weights = F2("weights", w.rows, w.H + 1);
    expect_rejected(w, at_extent("weights", 1, w.H + 1));
  }
}

TEST(SelectValidation, OutputMustBeRowsByWidth) {
  {
    World w;
    w.pool_ids = I2("pool_ids", w.rows, w.topk + 1);
    EXPECT_TRUE(rejects(w, Entry::score_select, at_extent("pool_ids", 1, w.topk + 1),
                        [&] { w.run(Entry::score_select); }));
    w.pool_ids = I2("pool_ids", w.rows + 1, w.topk);
    EXPECT_TRUE(rejects(w, Entry::score_select, at_extent("pool_ids", 0, w.rows + 1),
                        [&] { w.run(Entry::score_select); }));
  }
  {
    World w;
    w.tokens = I2("tokens", w.rows, w.topk * w.K);  // no tail columns
    EXPECT_TRUE(rejects(w, Entry::select_tokens, at_extent("tokens", 1, w.topk * w.K),
                        [&] { w.run(Entry::select_tokens); }));
  }
}

TEST(SelectValidation, BlockTableMustHaveARowPerLiveRequest) {
  World w;
  for (Entry e : kBoth)
    EXPECT_TRUE(rejects(w, e, at_extent("block_table", 0, 2), [&] {
      U32 const ro = to_index_view<U32>(w.row_offsets, "row_offsets");
      U32 const cl = to_index_view<U32>(w.cache_lengths, "cache_lengths");
      I2 const bt("block_table", 2, w.max_blocks);  // 3 live requests
      Workspace ws(w.space, w.ws_rows, w.ws_visible, w.H, w.D);
      auto const batch = KPool::ragged_batch(ro, cl, w.num_requests);
      if (e == Entry::score_select)
        KPool::score_select(w.space, w.q, w.weights, w.topk, batch, KPool::paged(w.cache, bt),
                            w.pool_ids, ws, w.opts);
      else
        KPool::select_tokens(w.space, w.q, w.weights, w.topk, batch, KPool::paged(w.cache, bt),
                             w.tokens, ws, w.opts);
    }));
}

TEST(SelectValidation, RowOffsetsMustFitTheQueryRows) {
  World w;
  w.row_offsets[3] = 11;  // q has 10 rows
  expect_rejected(w, at_row("row_offsets", 3, 11));
}

TEST(SelectValidation, RowOffsetsMustNotDecrease) {
  World w;
  w.row_offsets[2] = 4;  // row_offsets[1] = 5
  expect_rejected(w, at_row("row_offsets", 2, 4));
}

TEST(SelectValidation, NumRequestsMustNotExceedBatchSize) {
  expect_scalar_rejected(&World::num_requests, "num_requests", 5);
}

TEST(SelectValidation, VisiblePoolsNeedAssignedBlocks) {
  World w;
  w.table[1 * w.max_blocks + 1] = -1;  // request 1's pools 4..5
  expect_rejected(w, Expect{"block_table", 1, "-1", "row 1, column 1"});
}

TEST(SelectValidation, VisiblePoolsNeedBlocksBelowNumBlocks) {
  World w;
  w.table[0] = 4;  // num_blocks = 4
  expect_rejected(w, Expect{"block_table", 0, "4", "row 0, column 0"});
}

TEST(SelectValidation, BlockTableNeedsAColumnPerVisibleBlock) {
  World w;
  // Request 1 sees 6 pools, 2 blocks of 4; give the table one column.
  std::vector<std::int32_t> narrow;
  for (int r = 0; r < 4; ++r) narrow.push_back(w.table[r * w.max_blocks]);
  w.table = narrow;
  w.max_blocks = 1;
  expect_rejected(w, Expect{"block_table", 1, "1", "row 1"});
}

TEST(SelectValidation, VisiblePoolsMustFitTheWorkspace) {
  World w;
  w.ws_visible = 5;  // request 1 sees 6 pools
  expect_rejected(w, at_row("cache_lengths", 1, 9));
}

// Without validation the rows' visible pools are not read, so a workspace
// that may be too short for a row is refused by its size alone: it must
// hold every pool a row of the block table addresses (3 columns of 4
// pools), never truncate a row (docs/validation.md).
TEST(SelectValidation, WithoutValidationTheWorkspaceHoldsTheBlockTable) {
  World w;
  w.opts.validate = false;
  ASSERT_EQ(w.ws_visible, 8u);  // every row's visible pools, not the table's 12
  expect_rejected(w, Expect{"workspace", -1, "8", "max_visible"});
  // The same workspace and a decode batch of the same rows.
  {
    I2 const positions = positions_view<M>({0, 1, 2, 3, 4, 9, 10, 11, -1, -1}, 5);
    I2 const table = positions_view<M>(w.table, w.max_blocks);
    Workspace ws(w.space, w.ws_rows, w.ws_visible, w.H, w.D);
    EXPECT_TRUE(rejects(w, Entry::score_select, Expect{"workspace", -1, "8", "max_visible"}, [&] {
      KPool::score_select(w.space, w.q, w.weights, w.topk, KPool::decode_batch(positions, 2),
                          KPool::paged(w.cache, table), w.pool_ids, ws, w.opts);
    }));
  }
  w.ws_visible = 12;
  for (Entry e : kBoth) EXPECT_NO_THROW(w.run(e));
}

TEST(SelectValidation, WorkspaceHeadsMustMatch) {
  World w;
  w.ws_heads = 8;
  expect_rejected(w, at_extent("q", 1, 4));
}

TEST(SelectValidation, CacheLengthPlusRowsMustFitInt32) {
  World w;
  w.cache_lengths[1] = 0x7FFFFFFFu - 1;  // 3 rows
  expect_rejected(w, at_row("cache_lengths", 1, 0x7FFFFFFFu - 1));
}

TEST(SelectValidation, Fp8CacheNeedsAStorageTypeOtherThanF64) {
  World w;
  Kokkos::View<double***, Kokkos::LayoutRight, M> qd("q", w.rows, w.H, w.D);
  for (Entry e : kBoth)
    EXPECT_TRUE(rejects(w, e, Expect{"q", -1, "f64", ""},
                        [&] { w.run_with(e, qd, w.weights, w.cache); }));
}

// An empty cache has no K either (kpool() = 0, and K is the cache's): it
// is refused as kpool 0, which is checked before the cache's storage.
TEST(SelectValidation, CacheMustBeAllocated) {
  World w;
  Cache empty;
  for (Entry e : kBoth)
    EXPECT_TRUE(rejects(w, e, Expect{"cache", -1, "an empty PoolCache", ""},
                        [&] { w.run_with(e, w.q, w.weights, empty); }));
}

// team_gemm never takes level-1 team scratch on a device (on CUDA it
// allocates and fences, breaking graph capture): 1024 heads of 16 channels
// (64 KB of rotated queries for one row) are refused before anything is
// launched where launches take device shapes (a device, or a device-shapes
// build); a host runs them from its level-1 scratch.
TEST(SelectValidation, TeamGemmHeadsMustFitADevicesFastScratch) {
  if (!KPOOL_HAS_KOKKOSKERNELS) GTEST_SKIP() << "team_gemm needs Kokkos Kernels";
  World w;
  w.engine = KPool::ScoreEngine::team_gemm;
  int const H = 1024;
  w.ws_heads = H;
  Q3 q("q", w.rows, H, w.D);
  F2 weights("weights", w.rows, H);
  w.fill(q);
  w.fill(weights);
  for (Entry e : kBoth) {
    if (KPool::Details::device_shapes<E>::value)
      EXPECT_TRUE(rejects(w, e, at_extent("q", 1, H),
                          [&] { w.run_with(e, q, weights, w.cache); }));
    else
      EXPECT_NO_THROW(w.run_with(e, q, weights, w.cache)) << entry_name(e);
  }
}

// blas is refused where its workspace is built: the constructor names
// its engine, and says `why`.
::testing::AssertionResult workspace_refuses(World const& w, KPool::ScoreEngine engine,
                                             std::string const& why) {
  try {
    Workspace ws(w.space, w.ws_rows, w.ws_visible, w.H, w.D, engine);
  } catch (KPool::InvalidArgument const& e) {
    if (std::string(e.what()).find(why) == std::string::npos)
      return ::testing::AssertionFailure() << "no '" << why << "' in " << e.what();
    return check_message("KPool::SelectWorkspace", e,
                         Expect{"engine", -1, KPool::Details::engine_name(engine), ""});
  }
  return ::testing::AssertionFailure() << "built a workspace for it";
}

// team_gemm and blas are Kokkos Kernels' code: a build without it refuses
// them by name, before anything is written, with or without validation
// (blas already when its workspace is built).
TEST(SelectValidation, KokkosKernelsEnginesAreRefusedWithoutIt) {
  if (KPOOL_HAS_KOKKOSKERNELS) GTEST_SKIP() << "this build has Kokkos Kernels";
  for (bool validate : {true, false})
    for (KPool::ScoreEngine engine : {KPool::ScoreEngine::team_gemm, KPool::ScoreEngine::blas}) {
      World w;
      w.opts.validate = validate;
      if (engine == KPool::ScoreEngine::blas) {
        EXPECT_TRUE(workspace_refuses(w, engine, "needs Kokkos Kernels"));
        continue;
      }
      w.engine = engine;
      expect_rejected(w, Expect{"workspace", -1, KPool::Details::engine_name(engine), "engine"});
      try {
        w.run(Entry::score_select);
        ADD_FAILURE() << "accepted";
      } catch (KPool::InvalidArgument const& e) {
        EXPECT_NE(std::string(e.what()).find("needs Kokkos Kernels"), std::string::npos)
            << e.what();
      }
    }
}

TEST(SelectValidation, HostEnginesNeedAHostSpace) {
  if (!KPool::Details::KokkosExt::is_device_backend<E>::value)
    GTEST_SKIP() << "every engine runs on a host execution space";
  World w;
  EXPECT_TRUE(workspace_refuses(w, KPool::ScoreEngine::blas, ""));
  w.engine = KPool::ScoreEngine::register_tiles;
  expect_rejected(w, Expect{"workspace", -1, "register_tiles", "engine"});
}

// ---------------------------------------------------------------------------
// Defence in depth: validation off.
// ---------------------------------------------------------------------------

std::vector<KPool::ScoreEngine> engines() {
  if (KPool::Details::KokkosExt::is_device_backend<E>::value)
    return built_engines({KPool::ScoreEngine::tiles, KPool::ScoreEngine::team_gemm});
  return built_engines({KPool::ScoreEngine::register_tiles, KPool::ScoreEngine::tiles,
                        KPool::ScoreEngine::team_gemm, KPool::ScoreEngine::blas});
}

TEST(SelectDefenceInDepth, ShapeErrorsThrowWithValidationOff) {
  World w;
  w.opts.validate = false;
  w.topk = 0;
  expect_rejected(w, scalar("topk", 0));
}

// Garbage block numbers, offsets and lengths: every call returns, reads
// only the cache and writes only rows of the outputs (rows past the live
// ones stay as they were, and the cache is unchanged).
TEST(SelectDefenceInDepth, GarbageStaysInBounds) {
  for (KPool::ScoreEngine engine : engines())
    for (int trial = 0; trial < 4; ++trial) {
      SCOPED_TRACE(std::string(KPool::Details::engine_name(engine)) + " trial " +
                   std::to_string(trial));
      World w;
      w.opts.validate = false;
      w.engine = engine;
      for (auto& b : w.table) b = static_cast<std::int32_t>(w.rng.next());
      if (trial >= 1) w.cache_lengths[1] = 0x7FFFFFF0u + trial;  // overflowing positions
      if (trial >= 2) w.row_offsets[2] = 3;                       // decreasing
      if (trial >= 3) w.row_offsets[3] = 1000;                    // past the q rows
      w.ws_visible = 12;  // every pool the table addresses
      Snapshot const before = snapshot(w);
      for (Entry e : kBoth) ASSERT_NO_THROW(w.run(e));
      Snapshot const after = snapshot(w);
      EXPECT_EQ(after.values, before.values);
      EXPECT_EQ(after.scales, before.scales);
      // Rows 8 and 9 belong to no request.
      int const wt = static_cast<int>(w.tokens.extent(1));
      for (int t = 8; t < w.rows; ++t) {
        for (int j = 0; j < w.topk; ++j)
          EXPECT_EQ(after.pool_ids[t * w.topk + j], before.pool_ids[t * w.topk + j]);
        for (int j = 0; j < wt; ++j)
          EXPECT_EQ(after.tokens[t * wt + j], before.tokens[t * wt + j]);
      }
    }
}

// Ids written with validation off are always -1 or a pool the row sees.
TEST(SelectDefenceInDepth, GarbageBlocksYieldOnlyVisibleIds) {
  for (KPool::ScoreEngine engine : engines()) {
    World w;
    w.opts.validate = false;
    w.engine = engine;
    w.ws_visible = 12;  // every pool the table addresses
    for (auto& b : w.table) b = static_cast<std::int32_t>(w.rng.next() % 9) - 2;
    w.run(Entry::score_select);
    auto const ids = bytes_of(w.pool_ids);
    for (int t = 0; t < 8; ++t) {
      int const r = t < 5 ? 0 : 1;
      std::int64_t const pos = w.cache_lengths[r] + t - w.row_offsets[r];
      std::int64_t const vis = (pos + 1) / w.K;
      for (int j = 0; j < w.topk; ++j) {
        std::int32_t const id = ids[t * w.topk + j];
        EXPECT_TRUE(id == -1 || (id >= 0 && id < vis))
            << KPool::Details::engine_name(engine) << " row " << t << ": " << id;
        if (id >= 0) {
          std::int32_t const b = w.table[r * w.max_blocks + id / 4];
          EXPECT_TRUE(b >= 0 && b < 4) << "pool " << id << " of a bad block was selected";
        }
      }
    }
  }
}

}  // namespace
