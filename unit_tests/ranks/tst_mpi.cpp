// The indexer across MPI ranks (docs/ranks.md; ctest label mpi, run by
// mpiexec -n 1, 2, 3 and 4): every rank writes its shard of the cache
// with the same steps, and KPool::score_select through a
// KPool::MpiCommunicator gives, on every rank, the selection one rank
// makes over the whole cache, bit for bit (each rank makes that one too,
// and compares): ragged prefill rows and decode rows, native, fp8 exact
// and serving caches, interleaves of 1 pool, a block and 3, ties that span
// ranks, rows some ranks see nothing of, more ranks than pools. Bad input
// on one rank is refused on every rank with the same named error, nothing
// written, and the group goes on. A sharded KPool::Layer is one unsharded
// layer's, bit for bit, on every rank.

#include <KPoolShardTestUtils.hpp>
#include <mpi/KPool_MpiCommunicator.hpp>

#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

namespace {

using namespace KPoolTest;
using namespace KPoolTest::OnDefaultSpace;

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// Whether every rank passed (a failure on one rank fails the test on all,
// so that no rank goes on to a collective the others skip).
bool all_ranks(bool ok) {
  int mine = ok ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

// This rank's shard of the setup's cache, written by the step.
template <class T, class C>
struct RankCache {
  KPool::PoolCache<C, M> cache;
  typename Sharded<E, T, C>::Table table;
  std::size_t max_local = 1;
};
template <class T, class C>
RankCache<T, C> rank_cache(Sharded<E, T, C> const& x, KPool::Shard const& shard,
                           std::uint64_t seed) {
  RankCache<T, C> rc;
  int blocks = 0;
  rc.table = x.make_table(
      [&](int r) { return static_cast<int>(shard.local_count(x.pools(r))); }, blocks, seed);
  rc.cache = x.make_cache(blocks).sharded(shard);
  x.write(rc.cache, rc.table);
  for (int r = 0; r < x.B; ++r)
    rc.max_local = std::max<std::size_t>(rc.max_local, shard.local_count(x.pools(r)));
  return rc;
}

// Ragged rows (every row of the prefill) and decode rows (each request's
// last next_n positions again), sharded over the world with interleave u,
// against the whole cache on this rank.
template <class T, class C>
void check_world(ShardCase const& s, int u, std::uint64_t seed) {
  int const W = world_size(), rank = world_rank();
  SCOPED_TRACE(::testing::Message() << "rank " << rank << " of " << W << ", interleave " << u
                                    << ", topk " << s.topk << (s.fp8 ? " fp8" : " native")
                                    << (s.serving ? " serving" : ""));
  Sharded<E, T, C> x(s, seed);
  KPool::Options const o = test_options<E>();
  int blocks = 0;
  auto const whole_table = x.make_table([&](int r) { return x.pools(r); }, blocks, seed + 1);
  auto const whole = x.make_cache(blocks);
  x.write(whole, whole_table);
  std::size_t max_visible = 1;
  for (int r = 0; r < x.B; ++r) max_visible = std::max<std::size_t>(max_visible, x.pools(r));

  KPool::Shard const shard{rank, W, u};
  auto const mine = rank_cache(x, shard, seed + 10 + rank);
  KPool::MpiCommunicator<E> comm(MPI_COMM_WORLD);
  KPool::SelectWorkspace<T, M> ws(x.space, x.rows, max_visible, s.H, s.D);
  KPool::SelectWorkspace<T, M> local_ws(x.space, x.rows, mine.max_local, s.H, s.D);
  KPool::ShardWorkspace<T, M> ex(x.space, x.rows, s.topk, W);

  // Ragged: every prefill row.
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> want("want", x.rows, s.topk);
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> got("got", x.rows, s.topk);
  Kokkos::deep_copy(want, kSentinel);
  Kokkos::deep_copy(got, kSentinel);
  KPool::score_select(x.space, x.q, x.w, s.topk, x.batch(), KPool::paged(whole, whole_table),
                      want, ws, o);
  KPool::score_select(x.space, x.q, x.w, s.topk, x.batch(),
                      KPool::paged(mine.cache, mine.table), got, local_ws, ex, comm, o);
  EXPECT_EQ(flat(got), flat(want));

  // Decode: next_n = 2 rows a request at its last two positions (a
  // one-token request pads its first entry).
  int const next_n = 2;
  std::vector<std::int32_t> positions;
  for (int r = 0; r < x.B; ++r)
    for (int i = 0; i < next_n; ++i) {
      auto const n = static_cast<std::int32_t>(s.tokens[r]);
      positions.push_back(n >= next_n ? n - next_n + i : i < n ? i : -1);
    }
  auto const pos = positions_view<M>(positions, next_n);
  auto const decode = KPool::decode_batch(pos, x.B);
  int const rows = x.B * next_n;
  auto const qd = Kokkos::subview(x.q, std::make_pair(0, rows), Kokkos::ALL, Kokkos::ALL);
  auto const wd = Kokkos::subview(x.w, std::make_pair(0, rows), Kokkos::ALL);
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> want_d("want_d", rows, s.topk);
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> got_d("got_d", rows, s.topk);
  KPool::score_select(x.space, qd, wd, s.topk, decode, KPool::paged(whole, whole_table),
                      want_d, ws, o);
  KPool::score_select(x.space, qd, wd, s.topk, decode, KPool::paged(mine.cache, mine.table),
                      got_d, local_ws, ex, comm, o);
  EXPECT_EQ(flat(got_d), flat(want_d));

  // Token rows (select_tokens), ragged and decode.
  int const width = KPool::select_tokens_width(s.topk, s.K);
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> want_t("want_t", x.rows, width);
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> got_t("got_t", x.rows, width);
  KPool::select_tokens(x.space, x.q, x.w, s.topk, x.batch(), KPool::paged(whole, whole_table),
                       want_t, ws, o);
  KPool::select_tokens(x.space, x.q, x.w, s.topk, x.batch(),
                       KPool::paged(mine.cache, mine.table), got_t, local_ws, ex, comm, o);
  EXPECT_EQ(flat(got_t), flat(want_t));
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> want_dt("want_dt", rows, width);
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> got_dt("got_dt", rows, width);
  KPool::select_tokens(x.space, qd, wd, s.topk, decode, KPool::paged(whole, whole_table),
                       want_dt, ws, o);
  KPool::select_tokens(x.space, qd, wd, s.topk, decode, KPool::paged(mine.cache, mine.table),
                       got_dt, local_ws, ex, comm, o);
  EXPECT_EQ(flat(got_dt), flat(want_dt));
}

TEST(Ranks, ShardedSelectionIsOneRanksBitForBit) {
  std::uint64_t seed = 4000;
  for (int u : {1, 4, 3}) {
    ShardCase s;
    check_world<float, float>(s, u, ++seed);
    s.topk = 40;
    s.block_pools = 16;
    s.duplicates = 3;
    check_world<float, float>(s, u, ++seed);
    ShardCase f;
    f.fp8 = true;
    f.rotated = true;
    f.duplicates = 5;
    check_world<KPool::bfloat16, KPool::float8_e4m3>(f, u, ++seed);
    f.serving = true;
    f.H = 8;
    f.D = 128;
    f.tokens = {3, 64, 257};
    check_world<KPool::bfloat16, KPool::float8_e4m3>(f, u, ++seed);
    ASSERT_TRUE(all_ranks(!::testing::Test::HasFailure()));
  }
}

// The same named error on every rank, naming the rank it is about.
template <class F>
void expect_everywhere(F const& f, std::string const& argument, std::string const& where,
                       std::string const& says) {
  bool ok = false;
  try {
    f();
    ADD_FAILURE() << "rank " << world_rank() << ": no error";
  } catch (KPool::InvalidArgument const& e) {
    ok = e.entry_point() == "KPool::score_select" && e.argument() == argument &&
         e.where().find(where) != std::string::npos &&
         std::string(e.what()).find(says) != std::string::npos;
    EXPECT_TRUE(ok) << "rank " << world_rank() << ": " << e.what();
  }
  EXPECT_TRUE(all_ranks(ok));
}

TEST(Ranks, AnErrorOnOneRankIsThrownOnEveryRank) {
  int const W = world_size(), rank = world_rank();
  ShardCase s;
  Sharded<E, float, float> x(s, 77);
  KPool::Shard const shard{rank, W, 1};
  auto const mine = rank_cache(x, shard, 78 + rank);
  KPool::MpiCommunicator<E> comm(MPI_COMM_WORLD);
  KPool::SelectWorkspace<float, M> ws(x.space, x.rows, 64, s.H, s.D);
  KPool::ShardWorkspace<float, M> ex(x.space, x.rows, s.topk, W);
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> ids("ids", x.rows, s.topk);
  Kokkos::deep_copy(ids, kSentinel);
  auto const untouched = flat(ids);

  // The last rank's block table lacks the block of its first pool of
  // request 3.
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> table(
      "bad_table", mine.table.extent(0), mine.table.extent(1));
  Kokkos::deep_copy(table, mine.table);
  if (rank == W - 1) Kokkos::deep_copy(Kokkos::subview(table, 3, 0), -1);
  std::string const last = "on rank " + std::to_string(W - 1);
  expect_everywhere([&] { KPool::score_select(x.space, x.q, x.w, s.topk, x.batch(),
                                              KPool::paged(mine.cache, table), ids, ws, ex,
                                              comm); },
                    "block_table", last, "is not an assigned block");
  // A shard of another interleave on the last rank (with one rank, of
  // another rank count).
  KPool::Shard const odd = W > 1 ? KPool::Shard{rank, W, rank == W - 1 ? 2 : 1}
                                 : KPool::Shard{0, 2, 1};
  KPool::ShardWorkspace<float, M> ex_odd(x.space, x.rows, s.topk, odd.ranks);
  expect_everywhere([&] { KPool::score_select(x.space, x.q, x.w, s.topk, x.batch(),
                                              KPool::paged(mine.cache.sharded(odd), mine.table),
                                              ids, ws, ex_odd, comm); },
                    "cache", W > 1 ? last : "on rank 0",
                    W > 1 ? "does not match rank 0's interleave" : "does not match the communicator");
  // A topk of its own on rank 0.
  if (W > 1) {
    int const topk = rank == 0 ? s.topk - 1 : s.topk;
    Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> other("other", x.rows, topk);
    expect_everywhere([&] { KPool::score_select(x.space, x.q, x.w, topk, x.batch(),
                                                KPool::paged(mine.cache, mine.table), other, ws,
                                                ex, comm); },
                      "topk", "on rank 1", "does not match rank 0's topk");
  }
  EXPECT_EQ(flat(ids), untouched);
  // The group goes on: a good call after the refused ones.
  KPool::score_select(x.space, x.q, x.w, s.topk, x.batch(), KPool::paged(mine.cache, mine.table),
                      ids, ws, ex, comm);
  EXPECT_NE(flat(ids), untouched);
  EXPECT_TRUE(all_ranks(!::testing::Test::HasFailure()));
}

// A sharded KPool::Layer (LayerConfig::shard, LayerBuffers::communicator)
// through a prefill, a speculative decode step and a continuation: its
// step outputs and its selections (token rows and pool ids) are, on every
// rank, bit for bit those of one layer over the whole cache.
template <class C>
void check_layer(KPool::CacheProfile profile, int interleave, std::uint64_t seed) {
  int const W = world_size(), rank = world_rank();
  SCOPED_TRACE(::testing::Message() << "rank " << rank << " of " << W << ", interleave "
                                    << interleave);
  E space;
  Rng rng(seed);
  KPool::Options const o = test_options<E>();
  int const K = 4, D = 32, H = 4, topk = 5, bp = 4, row_blocks = 8;
  KPool::LayerConfig cfg = layer_config(K, D, H, 3, 3, 64, 3 * row_blocks, bp);
  cfg.drafts = 1;
  cfg.profile = profile;
  cfg.max_context = static_cast<std::size_t>(row_blocks * bp * K);
  Kokkos::View<float**, Kokkos::LayoutRight, M> ape("ape", K, D);
  fill_uniform(rng, ape, -1, 1);
  KPool::Layer<float, C, M> whole(space, cfg, ape);
  KPool::LayerConfig sharded_cfg = cfg;
  sharded_cfg.shard = KPool::Shard{rank, W, interleave};
  sharded_cfg.max_topk = topk;
  KPool::LayerBuffers<float, C, M> buffers;
  buffers.communicator = std::make_shared<KPool::MpiCommunicator<E>>(MPI_COMM_WORLD);
  KPool::Layer<float, C, M> mine(space, sharded_cfg, ape, buffers);
  ASSERT_EQ(mine.cache().shard().ranks, W);
  // Row r's blocks: r * row_blocks .. : the whole cache's pools, and each
  // rank's own (fewer) in the same blocks of its cache.
  std::vector<std::int32_t> t;
  for (int r = 0; r < 3; ++r)
    for (int b = 0; b < row_blocks; ++b) t.push_back(r * row_blocks + b);
  auto const table = positions_view<M>(t, row_blocks);
  auto const slots = to_index_view<Kokkos::View<std::uint32_t*, M>>(
      std::vector<std::uint32_t>{0, 1, 2}, "slot_idx");

  auto const compare = [&](std::size_t rows, char const* what) {
    SCOPED_TRACE(what);
    Kokkos::View<float***, Kokkos::LayoutRight, M> q("q", rows, H, D);
    Kokkos::View<float**, Kokkos::LayoutRight, M> w("w", rows, H);
    fill_uniform(rng, q, -1, 1);
    fill_uniform(rng, w, -0.5, 1);
    int const width = KPool::select_tokens_width(topk, K);
    Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> want("want", rows, width),
        got("got", rows, width), want_ids("want_ids", rows, topk), got_ids("got_ids", rows, topk);
    whole.select_tokens(space, q, w, topk, want, o);
    mine.select_tokens(space, q, w, topk, got, o);
    whole.score_select(space, q, w, topk, want_ids, o);
    mine.score_select(space, q, w, topk, got_ids, o);
    auto const a = whole.output().to_host(space, KPool::StepOutputParts::ids_and_pooled);
    auto const b = mine.output().to_host(space, KPool::StepOutputParts::ids_and_pooled);
    bool const same = flat(got) == flat(want) && flat(got_ids) == flat(want_ids) &&
                      a.count == b.count && raw_bytes(a.offsets) == raw_bytes(b.offsets) &&
                      raw_bytes(a.pool_id) == raw_bytes(b.pool_id) &&
                      raw_bytes(a.pooled) == raw_bytes(b.pooled);
    EXPECT_TRUE(all_ranks(same));
  };
  auto const ragged_step = [&](std::vector<std::uint32_t> const& lengths,
                               std::vector<std::uint32_t> const& tokens) {
    std::vector<std::uint32_t> ro{0};
    for (std::uint32_t n : tokens) ro.push_back(ro.back() + n);
    auto const row_offsets = to_index_view<Kokkos::View<std::uint32_t*, M>>(ro, "row_offsets");
    auto const cache_lengths =
        to_index_view<Kokkos::View<std::uint32_t*, M>>(lengths, "cache_lengths");
    Kokkos::View<float**, Kokkos::LayoutRight, M> key("key", ro.back(), D),
        gate("gate", ro.back(), D);
    fill_uniform(rng, key, -2, 2);
    fill_uniform(rng, gate, -3, 3);
    auto const batch = KPool::ragged_batch(row_offsets, cache_lengths, slots, 3);
    whole.step(space, key, gate, batch, table, o);
    mine.step(space, key, gate, batch, table, o);
    return static_cast<std::size_t>(ro.back());
  };
  compare(ragged_step({0, 0, 0}, {37, 20, 6}), "prefill");
  // A decode step with one draft: positions 37 and 38, 20 and 21, 6 and 7.
  auto const positions = positions_view<M>({37, 38, 20, 21, 6, 7}, 2);
  Kokkos::View<float***, Kokkos::LayoutRight, M> dkey("dkey", 3, 2, D), dgate("dgate", 3, 2, D);
  fill_uniform(rng, dkey, -2, 2);
  fill_uniform(rng, dgate, -3, 3);
  whole.step(space, dkey, dgate, KPool::decode_batch(positions, slots, 3), table, o);
  mine.step(space, dkey, dgate, KPool::decode_batch(positions, slots, 3), table, o);
  compare(6, "decode");
  // The drafts rejected on row 0 (a rewind to 38), accepted elsewhere.
  compare(ragged_step({38, 22, 8}, {15, 19, 9}), "continuation");
}

TEST(Ranks, ShardedLayerIsOneRanksLayerBitForBit) {
  check_layer<float>(KPool::CacheProfile::exact, 1, 71);
  check_layer<KPool::float8_e4m3>(KPool::CacheProfile::serving, 4, 72);
  check_layer<KPool::float8_e4m3>(KPool::CacheProfile::exact, 3, 73);
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (::testing::GTEST_FLAG(list_tests)) return RUN_ALL_TESTS();
  MPI_Init(&argc, &argv);
  // Only rank 0 prints gtest's report; every rank returns its result.
  if (world_rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int rc = 0;
  {
    Kokkos::ScopeGuard guard(argc, argv);
    rc = RUN_ALL_TESTS();
  }
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
