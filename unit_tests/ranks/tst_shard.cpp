// The indexer across ranks (docs/ranks.md), in one process: W rank caches
// written by the same steps as one whole cache, each holding only its own
// pools at their local ids; every rank's local selection, the payloads
// gathered as an all-gather would, and every rank's merge, against the
// single-rank selection over the whole cache, bit for bit: every storage
// type, native, fp8 and serving caches, every team engine, W = 1 to 4,
// interleaves of 1 pool, a block, and a run that does not divide a block,
// duplicated pools whose ties span ranks, rows a rank sees nothing of, W
// above the visible pools. Then the bad input: named, nothing written.

#include <KPoolShardTestUtils.hpp>

#include <algorithm>
#include <numeric>
#include <type_traits>
#include <vector>

namespace {

using namespace KPoolTest;

template <class C>
class Shard : public ::testing::Test {};
TYPED_TEST_SUITE(Shard, Configs, ConfigName);

TEST(ShardMap, LocalPoolsAreTheRanksShareInOrder) {
  for (int W = 1; W <= 5; ++W)
    for (int u : {1, 2, 3, 8})
      for (int w = 0; w < W; ++w) {
        KPool::Shard const s{w, W, u};
        std::uint64_t held = 0;
        for (std::uint64_t p = 0; p < 200; ++p) {
          ASSERT_EQ(s.local_count(p), held) << "W=" << W << " u=" << u << " w=" << w << " p=" << p;
          bool const mine = (p / u) % W == static_cast<std::uint64_t>(w);
          ASSERT_EQ(s.owner(p) == w, mine);
          if (!mine) continue;
          ASSERT_EQ(s.local(p), held);
          ASSERT_EQ(s.global(held), p);
          ++held;
        }
      }
}

// Every rank of W (interleave u): its cache written by the step holds
// exactly its pools, at their local ids, with the whole cache's bytes; its
// local selections, gathered, merge on every rank into the whole cache's
// selection, bit for bit.
template <class E, class T, class C>
void check_sharded(ShardCase const& s, int W, int u, KPool::ScoreEngine engine,
                   std::uint64_t seed) {
  using M = typename E::memory_space;
  using Key = typename KPool::ShardWorkspace<T, M>::key_type;
  SCOPED_TRACE(::testing::Message() << "W=" << W << " interleave=" << u << " topk=" << s.topk
                                    << " block_pools=" << s.block_pools
                                    << (s.fp8 ? " fp8" : " native")
                                    << (s.serving ? " serving" : "")
                                    << " engine=" << static_cast<int>(engine)
                                    << " duplicates=" << s.duplicates);
  Sharded<E, T, C> x(s, seed);
  KPool::Options const o = test_options<E>();

  int whole_blocks = 0;
  auto const whole_table = x.make_table([&](int r) { return x.pools(r); }, whole_blocks, seed + 1);
  auto const whole = x.make_cache(whole_blocks);
  x.write(whole, whole_table);
  std::size_t max_visible = 1;
  for (int r = 0; r < x.B; ++r) max_visible = std::max<std::size_t>(max_visible, x.pools(r));
  auto const wt = on_host(whole_table);
  std::vector<KPool::PoolCache<C, M>> caches;
  std::vector<typename Sharded<E, T, C>::Table> tables;
  std::size_t max_local = 1;
  for (int rank = 0; rank < W; ++rank) {
    KPool::Shard const shard{rank, W, u};
    int blocks = 0;
    auto const table = x.make_table(
        [&](int r) { return static_cast<int>(shard.local_count(x.pools(r))); }, blocks,
        seed + 10 + rank);
    auto const cache = x.make_cache(blocks).sharded(shard);
    x.write(cache, table);
    caches.push_back(cache);
    tables.push_back(table);
    for (int r = 0; r < x.B; ++r)
      max_local = std::max<std::size_t>(max_local, shard.local_count(x.pools(r)));
    if (s.long_rows) continue;
    // The rank's cache: its pools' bytes at their local ids, and nothing
    // written anywhere else (a zero-filled entry stays zero).
    auto const ht = on_host(table);
    std::vector<bool> used(static_cast<std::size_t>(blocks) * s.block_pools, false);
    for (int r = 0; r < x.B; ++r)
      for (int p = 0; p < x.pools(r); ++p) {
        if (shard.owner(p) != rank) continue;
        auto const l = static_cast<int>(shard.local(p));
        int const b = ht(r, l / s.block_pools), e = l % s.block_pools;
        used[static_cast<std::size_t>(b) * s.block_pools + e] = true;
        ASSERT_EQ(entry_bytes(cache, b, e),
                  entry_bytes(whole, wt(r, p / s.block_pools), p % s.block_pools))
            << "rank " << rank << " request " << r << " pool " << p;
      }
    std::vector<unsigned char> const zero = entry_bytes(x.make_cache(1), 0, 0);
    for (int b = 0; b < blocks; ++b)
      for (int e = 0; e < s.block_pools; ++e)
        if (!used[static_cast<std::size_t>(b) * s.block_pools + e]) {
          ASSERT_EQ(entry_bytes(cache, b, e), zero) << "rank " << rank << " block " << b;
        }
  }

  // One selection of `rows` rows of q and weights by `batch`: the whole
  // cache's, then every rank's local one, the payloads gathered as an
  // all-gather would, and every rank's merge, which must be the whole
  // cache's, bit for bit; rows of no request untouched.
  int const next_n = 3;
  std::size_t const ws_rows = s.long_rows ? static_cast<std::size_t>(x.B + 1) * next_n
                                          : static_cast<std::size_t>(x.rows);
  KPool::SelectWorkspace<T, M> ws(x.space, ws_rows, max_visible, s.H, s.D, engine);
  KPool::SelectWorkspace<T, M> local_ws(x.space, ws_rows, max_local, s.H, s.D, engine);
  auto const compare = [&](KPool::Batch<M> const& batch, int rows, char const* what) {
    auto const q = Kokkos::subview(x.q, std::make_pair(0, rows), Kokkos::ALL, Kokkos::ALL);
    auto const w = Kokkos::subview(x.w, std::make_pair(0, rows), Kokkos::ALL);
    Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> want("want", rows, s.topk);
    Kokkos::deep_copy(want, kSentinel);
    KPool::score_select(x.space, q, w, s.topk, batch, KPool::paged(whole, whole_table), want,
                        ws, o);
    std::vector<std::int32_t> const expected = flat(want);
    std::vector<KPool::ShardWorkspace<T, M>> exchanges;
    std::size_t const bytes = KPool::ShardWorkspace<T, M>::payload_bytes(rows, s.topk);
    for (int rank = 0; rank < W; ++rank) {
      exchanges.emplace_back(x.space, ws_rows, s.topk, W);
      KPool::shard_select_local(x.space, q, w, s.topk, batch,
                                KPool::paged(caches[rank], tables[rank]), local_ws,
                                exchanges.back(), o);
    }
    for (auto& ex : exchanges)
      for (int rank = 0; rank < W; ++rank)
        Kokkos::deep_copy(
            x.space,
            Kokkos::subview(ex.recv(), std::make_pair(rank * bytes, (rank + 1) * bytes)),
            Kokkos::subview(exchanges[rank].send(), std::make_pair(std::size_t(0), bytes)));
    // The token rows: select_tokens over the whole cache.
    int const width = KPool::select_tokens_width(s.topk, s.K);
    Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> want_tokens("want_tokens", rows, width);
    Kokkos::deep_copy(want_tokens, kSentinel);
    KPool::select_tokens(x.space, q, w, s.topk, batch, KPool::paged(whole, whole_table),
                         want_tokens, ws, o);
    std::vector<std::int32_t> const expected_tokens = flat(want_tokens);
    for (int rank = 0; rank < W; ++rank) {
      Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> got("got", rows, s.topk);
      Kokkos::deep_copy(got, kSentinel);
      KPool::shard_select_merge(x.space, s.topk, KPool::paged(caches[rank], tables[rank]), got,
                                exchanges[rank], o);
      std::vector<std::int32_t> const ids = flat(got);
      for (int t = 0; t < rows; ++t)
        for (int j = 0; j < s.topk; ++j)
          ASSERT_EQ(ids[t * s.topk + j], expected[t * s.topk + j])
              << what << ": merged on rank " << rank << ", row " << t << " column " << j;
      Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> got_tokens("got_tokens", rows, width);
      Kokkos::deep_copy(got_tokens, kSentinel);
      KPool::shard_select_merge_tokens(x.space, s.topk, batch,
                                       KPool::paged(caches[rank], tables[rank]), got_tokens,
                                       exchanges[rank], o);
      std::vector<std::int32_t> const tokens = flat(got_tokens);
      for (int t = 0; t < rows; ++t)
        for (int j = 0; j < width; ++j)
          ASSERT_EQ(tokens[t * width + j], expected_tokens[t * width + j])
              << what << ": token rows merged on rank " << rank << ", row " << t << " column "
              << j;
    }
  };
  if (!s.long_rows) compare(x.batch(), x.rows, "ragged");
  if (::testing::Test::HasFatalFailure()) return;
  // Decode rows (the default decode selection; its fused form gives the
  // same bits, tst_select_decode): each
  // request's last 3 positions again, a short request padded; a fourth
  // batch row past num_requests.
  std::vector<std::int32_t> positions;
  for (int r = 0; r < x.B + 1; ++r)
    for (int i = 0; i < next_n; ++i) {
      auto const n = r < x.B ? static_cast<std::int32_t>(s.tokens[r]) : 0;
      positions.push_back(n >= next_n ? n - next_n + i : i < n ? i : -1);
    }
  auto const pos = positions_view<M>(positions, next_n);
  compare(KPool::decode_batch(pos, x.B), (x.B + 1) * next_n, "decode");
  static_assert(sizeof(Key) == 4 || sizeof(Key) == 8, "keys of 32 or 64 bits");
}

template <class E, class T>
std::vector<KPool::ScoreEngine> shard_engines() {
  std::vector<KPool::ScoreEngine> e;
  if (KPool::Details::KokkosExt::is_device_backend<E>::value)
    e = built_engines({KPool::ScoreEngine::tiles, KPool::ScoreEngine::team_gemm});
  else
    e = built_engines({KPool::ScoreEngine::register_tiles, KPool::ScoreEngine::tiles,
                       KPool::ScoreEngine::team_gemm});
  return e;
}

template <class E, class T, class C>
void sharded_grid(ShardCase const& base) {
  std::uint64_t seed = 700;
  for (int W : {1, 2, 3, 4})
    for (int u : {1, base.block_pools, 3}) {
      std::vector<KPool::ScoreEngine> const engines = shard_engines<E, T>();
      // One engine a (W, u), in turn, and every engine at W = 3.
      for (std::size_t i = 0; i < engines.size(); ++i) {
        if (W != 3 && i != static_cast<std::size_t>(W + u) % engines.size()) continue;
        check_sharded<E, T, C>(base, W, u, engines[i], ++seed);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
}

TYPED_TEST(Shard, MergedSelectionIsTheWholeCachesBitForBit) {
  using E = typename TypeParam::execution_space;
  using T = typename TypeParam::value_type;
  ShardCase s;
  sharded_grid<E, T, T>(s);
  // topk past most rows' pools, blocks of 16, ties spanning ranks.
  s.topk = 40;
  s.block_pools = 16;
  s.duplicates = 3;
  sharded_grid<E, T, T>(s);
}

TYPED_TEST(Shard, MergedSelectionOverFp8AndServingCaches) {
  using E = typename TypeParam::execution_space;
  using T = typename TypeParam::value_type;
  if constexpr (!std::is_same<T, double>::value) {
    ShardCase s;
    s.fp8 = true;
    s.rotated = true;
    s.duplicates = 5;
    sharded_grid<E, T, KPool::float8_e4m3>(s);
    if constexpr (std::is_same<T, KPool::bfloat16>::value) {
      s.serving = true;
      s.H = 8;
      s.D = 128;
      s.tokens = {3, 64, 257};
      sharded_grid<E, T, KPool::float8_e4m3>(s);
    }
  }
}

// Rows past the split length (65536 visible pools) select in segments
// (docs/indexer.md, "Top-k"), on the whole cache and on every shard alike
// (70000 and more local pools on each of 2 ranks): decode rows of a
// 140000-token request (K = 1) and a short one.
TEST(ShardLongRows, RowsSplitOverSegmentsMergeIntoTheWholeCachesSelection) {
  using E = Kokkos::DefaultExecutionSpace;
  ShardCase s;
  s.K = 1;
  s.D = 8;
  s.H = 2;
  s.topk = 24;
  s.block_pools = 64;
  s.tokens = {140001, 7};
  s.duplicates = 5000;
  s.long_rows = true;
  std::vector<KPool::ScoreEngine> const engines = shard_engines<E, float>();
  check_sharded<E, float, float>(s, 2, 1, engines.front(), 811);
  if (::testing::Test::HasFatalFailure()) return;
  check_sharded<E, float, float>(s, 2, s.block_pools, engines.back(), 812);
}

// ------------------------------------------------------------- bad input

using E0 = Kokkos::DefaultExecutionSpace;
using M0 = E0::memory_space;

template <class F>
void expect_invalid(F const& f, std::string const& entry, std::string const& argument,
                    std::string const& says) {
  try {
    f();
    ADD_FAILURE() << "no error; expected " << entry << " on '" << argument << "'";
  } catch (KPool::InvalidArgument const& e) {
    EXPECT_EQ(e.entry_point(), entry) << e.what();
    EXPECT_EQ(e.argument(), argument) << e.what();
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
}

TEST(ShardValidation, RefusedByNameNothingWritten) {
  ShardCase s;
  Sharded<E0, float, float> x(s, 91);
  KPool::Shard const shard{1, 2, 1};
  int blocks = 0;
  auto const table = x.make_table(
      [&](int r) { return static_cast<int>(shard.local_count(x.pools(r))); }, blocks, 92);
  auto const cache = x.make_cache(blocks).sharded(shard);
  x.write(cache, table);
  KPool::SelectWorkspace<float, M0> ws(x.space, x.rows, 64, s.H, s.D);
  KPool::ShardWorkspace<float, M0> ex(x.space, x.rows, s.topk, 2);
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M0> ids("ids", x.rows, s.topk);
  Kokkos::deep_copy(ids, kSentinel);
  auto const untouched = flat(ids);

  // A shard's cache alone holds half the pools: selecting from it is refused.
  expect_invalid([&] { KPool::score_select(x.space, x.q, x.w, s.topk, x.batch(),
                                           KPool::paged(cache, table), ids, ws); },
                 "KPool::score_select", "cache", "the ranks' exchange");
  // Shards out of range.
  expect_invalid([&] { (void)x.make_cache(1).sharded(KPool::Shard{2, 2, 1}); },
                 "KPool::PoolCache", "shard", "is not a rank of the 2 ranks");
  expect_invalid([&] { (void)x.make_cache(1).sharded(KPool::Shard{0, 2, 0}); },
                 "KPool::PoolCache", "shard", "is not at least 1");
  // An exchange for other ranks, too few rows, too small a topk.
  KPool::ShardWorkspace<float, M0> ex3(x.space, x.rows, s.topk, 3);
  expect_invalid([&] { KPool::shard_select_local(x.space, x.q, x.w, s.topk, x.batch(),
                                                 KPool::paged(cache, table), ws, ex3); },
                 "KPool::shard_select_local", "exchange", "does not match the cache's shard");
  KPool::ShardWorkspace<float, M0> small(x.space, 2, s.topk, 2);
  expect_invalid([&] { KPool::shard_select_local(x.space, x.q, x.w, s.topk, x.batch(),
                                                 KPool::paged(cache, table), ws, small); },
                 "KPool::shard_select_local", "q", "max_tokens");
  expect_invalid([&] { KPool::shard_select_merge(x.space, s.topk + 1,
                                                 KPool::paged(cache, table), ids, ex); },
                 "KPool::shard_select_merge", "pool_ids", "topk");
  // Token rows of the pool ids' width.
  expect_invalid([&] { KPool::shard_select_merge_tokens(x.space, s.topk, x.batch(),
                                                        KPool::paged(cache, table), ids, ex); },
                 "KPool::shard_select_merge_tokens", "tokens", "topk * K + K - 1");
  // A block table that lacks a block of one of this rank's pools: named by
  // its local pool and its pool of the sequence.
  auto bad = x.make_table(
      [&](int r) { return static_cast<int>(shard.local_count(x.pools(r))); }, blocks, 92);
  auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), bad);
  hb(3, 2) = -1;  // request 3's local pools 8..11 (block_pools 4)
  Kokkos::deep_copy(bad, hb);
  expect_invalid([&] { KPool::shard_select_local(x.space, x.q, x.w, s.topk, x.batch(),
                                                 KPool::paged(cache, bad), ws, ex); },
                 "KPool::shard_select_local", "block_table",
                 "local pool 8 (pool 17 of the sequence, rank 1 of 2 (interleave 1))");
  // The step into it is refused the same way, and writes nothing.
  auto const fresh = x.make_cache(blocks).sharded(shard);
  expect_invalid([&] { x.write(fresh, bad); }, "KPool::step", "block_table",
                 "local pool 8 (pool 17 of the sequence");
  std::vector<unsigned char> const zero = entry_bytes(x.make_cache(1), 0, 0);
  for (int b = 0; b < blocks; ++b)
    for (int e = 0; e < s.block_pools; ++e) ASSERT_EQ(entry_bytes(fresh, b, e), zero);
  // Through a Communicator: a group of one holding rank 1 of 2.
  KPool::SelfCommunicator<E0> self;
  expect_invalid([&] { KPool::score_select(x.space, x.q, x.w, s.topk, x.batch(),
                                           KPool::paged(cache, table), ids, ws, ex, self); },
                 "KPool::score_select", "cache", "does not match the communicator's rank 0 of 1");
  EXPECT_EQ(flat(ids), untouched);
}

// A group of one through the Communicator forms: the single-rank selection and token rows.
TEST(ShardCommunicator, GroupOfOneIsTheSingleRankSelection) {
  ShardCase s;
  s.topk = 12;
  Sharded<E0, float, float> x(s, 93);
  int blocks = 0;
  auto const table = x.make_table([&](int r) { return x.pools(r); }, blocks, 94);
  auto const cache = x.make_cache(blocks);
  x.write(cache, table);
  KPool::SelectWorkspace<float, M0> ws(x.space, x.rows, 64, s.H, s.D);
  KPool::ShardWorkspace<float, M0> ex(x.space, x.rows, s.topk, 1);
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M0> want("want", x.rows, s.topk);
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M0> got("got", x.rows, s.topk);
  KPool::score_select(x.space, x.q, x.w, s.topk, x.batch(), KPool::paged(cache, table), want,
                      ws);
  KPool::SelfCommunicator<E0> self;
  KPool::score_select(x.space, x.q, x.w, s.topk, x.batch(), KPool::paged(cache, table), got,
                      ws, ex, self);
  EXPECT_EQ(flat(got), flat(want));
  int const width = KPool::select_tokens_width(s.topk, s.K);
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M0> want_tokens("want_tokens", x.rows, width);
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M0> got_tokens("got_tokens", x.rows, width);
  KPool::select_tokens(x.space, x.q, x.w, s.topk, x.batch(), KPool::paged(cache, table),
                       want_tokens, ws);
  KPool::select_tokens(x.space, x.q, x.w, s.topk, x.batch(), KPool::paged(cache, table),
                       got_tokens, ws, ex, self);
  EXPECT_EQ(flat(got_tokens), flat(want_tokens));
}

}  // namespace
