// The indexer across MPI ranks (docs/ranks.md; ctest label mpi, run by
// mpiexec -n 1, 2, 3 and 4): every rank writes its shard of the cache
// with the same steps, and KPool::score_select through a
// KPool::MpiCommunicator gives, on every rank, the selection one rank
// makes over the whole cache, bit for bit (each rank makes that one too,
// and compares): ragged prefill rows and decode rows, native, fp8 exact
// and serving caches, interleaves of 1 pool, a block and 3, ties that span
// ranks, rows some ranks see nothing of, more ranks than pools. Bad input
// on one rank is refused on every rank with the same named error, nothing
// written, and the group goes on.

#include <KPoolShardTestUtils.hpp>
#include <mpi/KPool_MpiCommunicator.hpp>

#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

namespace {

using namespace KPoolTest;
using E = Kokkos::DefaultExecutionSpace;
using M = E::memory_space;

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
  KPool::score_select(x.space, KPool::paged(whole, whole_table), x.q, x.w, s.topk, x.batch(),
                      want, ws, o);
  KPool::score_select(x.space, KPool::paged(mine.cache, mine.table), x.q, x.w, s.topk,
                      x.batch(), got, local_ws, ex, comm, o);
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
  KPool::score_select(x.space, KPool::paged(whole, whole_table), qd, wd, s.topk, decode,
                      want_d, ws, o);
  KPool::score_select(x.space, KPool::paged(mine.cache, mine.table), qd, wd, s.topk, decode,
                      got_d, local_ws, ex, comm, o);
  EXPECT_EQ(flat(got_d), flat(want_d));

  // Token rows (select_tokens), ragged and decode.
  int const width = KPool::select_tokens_width(s.topk, s.K);
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> want_t("want_t", x.rows, width);
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> got_t("got_t", x.rows, width);
  KPool::select_tokens(x.space, KPool::paged(whole, whole_table), x.q, x.w, s.topk, x.batch(),
                       want_t, ws, o);
  KPool::select_tokens(x.space, KPool::paged(mine.cache, mine.table), x.q, x.w, s.topk,
                       x.batch(), got_t, local_ws, ex, comm, o);
  EXPECT_EQ(flat(got_t), flat(want_t));
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> want_dt("want_dt", rows, width);
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> got_dt("got_dt", rows, width);
  KPool::select_tokens(x.space, KPool::paged(whole, whole_table), qd, wd, s.topk, decode,
                       want_dt, ws, o);
  KPool::select_tokens(x.space, KPool::paged(mine.cache, mine.table), qd, wd, s.topk, decode,
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
  expect_everywhere([&] { KPool::score_select(x.space, KPool::paged(mine.cache, table), x.q,
                                              x.w, s.topk, x.batch(), ids, ws, ex, comm); },
                    "block_table", last, "is not an assigned block");
  // A shard of another interleave on the last rank (with one rank, of
  // another rank count).
  KPool::Shard const odd = W > 1 ? KPool::Shard{rank, W, rank == W - 1 ? 2 : 1}
                                 : KPool::Shard{0, 2, 1};
  KPool::ShardWorkspace<float, M> ex_odd(x.space, x.rows, s.topk, odd.ranks);
  expect_everywhere([&] { KPool::score_select(x.space,
                                              KPool::paged(mine.cache.sharded(odd), mine.table),
                                              x.q, x.w, s.topk, x.batch(), ids, ws, ex_odd,
                                              comm); },
                    "cache", W > 1 ? last : "on rank 0",
                    W > 1 ? "does not match rank 0's interleave" : "does not match the communicator");
  // A topk of its own on rank 0.
  if (W > 1) {
    int const topk = rank == 0 ? s.topk - 1 : s.topk;
    Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> other("other", x.rows, topk);
    expect_everywhere([&] { KPool::score_select(x.space, KPool::paged(mine.cache, mine.table),
                                                x.q, x.w, topk, x.batch(), other, ws, ex,
                                                comm); },
                      "topk", "on rank 1", "does not match rank 0's topk");
  }
  EXPECT_EQ(flat(ids), untouched);
  // The group goes on: a good call after the refused ones.
  KPool::score_select(x.space, KPool::paged(mine.cache, mine.table), x.q, x.w, s.topk,
                      x.batch(), ids, ws, ex, comm);
  EXPECT_NE(flat(ids), untouched);
  EXPECT_TRUE(all_ranks(!::testing::Test::HasFailure()));
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
