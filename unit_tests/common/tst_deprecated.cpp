// The retired forms (src/pool/, src/select/ and src/ranks/
// KPool_deprecated.hpp, CHANGELOG.md): each is a thin wrapper over its
// replacement, so on the same inputs the two agree bit for bit: the
// positional writers and steps (decode_step included), store_pools and
// load_pools, expand_topk and compute_pool_row_offsets with their kpool,
// the selections' positional forms and their older Batch order, and
// Layer's positional step and decode_step; the retired
// Options::score_engine may only repeat the workspace's engine. This is
// the one test that calls them: it is built only with
// KPool_ENABLE_DEPRECATED (the default), with their warnings silenced here
// (ctest deprecated_warnings checks that they warn, naming the
// replacements).

// Built once more by ctest deprecated_warnings with
// KPOOL_SHOW_DEPRECATION_WARNINGS, which shows them.
#if defined(__GNUC__) && !defined(KPOOL_SHOW_DEPRECATION_WARNINGS)
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif

#include "KPoolTwin.hpp"

#include <string>
#include <vector>

namespace {

using namespace KPoolTwinTest;  // KPoolTest's names too

TEST(Deprecated, EveryRetiredFormIsItsReplacement) {
  E space;
  Rng rng(11);
  KPool::Options const opts = test_options<E>();
  F2 const ape = twin_ape(rng);
  I2 const table = block_table();

  // A ragged batch: 2 live rows (continuations of 3 and 0 tokens), a dead
  // third row of garbage.
  U32 const ro = to_index_view<U32>(std::vector<std::uint32_t>{0, 9, 14, 77}, "row_offsets");
  U32 const cl = to_index_view<U32>(std::vector<std::uint32_t>{3, 0, 99}, "cache_lengths");
  U32 const slots = to_index_view<U32>(std::vector<std::uint32_t>{1, 3, 50}, "slot_idx");
  auto const batch = KPool::ragged_batch(ro, cl, slots, 2);
  EXPECT_EQ(batch.size(), 3u);
  EXPECT_FALSE(batch.is_decode());
  F2 key("key", 14, D), gate("gate", 14, D);
  fill_uniform(rng, key, -2, 2);
  fill_uniform(rng, gate, -3, 3);

  // compress and compute_pool_row_offsets.
  {
    U32 pa("pro_a", 4), pb("pro_b", 4);
    F2 xa("pooled_a", 3, D), xb("pooled_b", 3, D);
    KPool::compress(space, key, gate, ape, ro, cl, 2, pa, xa, opts);
    KPool::compress(space, key, gate, ape, KPool::ragged_batch(ro, cl, 2), pb, xb, opts);
    EXPECT_EQ(raw_bytes(pa), raw_bytes(pb));
    EXPECT_EQ(raw_bytes(xa), raw_bytes(xb));
    U32 qa("pro_a", 4), qb("pro_b", 4);
    U32 qc("pro_c", 4);
    KPool::compute_pool_row_offsets(space, ro, cl, 2, K, 14, qa, opts);
    KPool::compute_pool_row_offsets(space, KPool::ragged_batch(ro, cl, 2), K, 14, qc, opts);
    KPool::compute_pool_row_offsets(space, key, ape, KPool::ragged_batch(ro, cl, 2), qb, opts);
    EXPECT_EQ(raw_bytes(qa), raw_bytes(qb));
    EXPECT_EQ(raw_bytes(qc), raw_bytes(qb));
    EXPECT_EQ(raw_bytes(qa), raw_bytes(pa));
  }
  // ring_close then seed_tail.
  {
    Twin a(space, rng), b(space, rng);
    F2 xa("pooled_a", 3, D), xb("pooled_b", 3, D);
    I1 ca("closed_a", 3), cb("closed_b", 3);
    F2 xc("pooled_c", 3, D);
    I1 cc("closed_c", 3);
    KPool::ring_close(space, a.ring.tail(), key, gate, ape, ro, cl, slots, 2, xa, ca, opts);
    KPool::ring_close(space, a.ring.tail(), key, gate, ape, batch, xc, cc, opts);
    KPool::ring_close(space, b.ring, key, gate, ape, batch, xb, cb, opts);
    EXPECT_EQ(raw_bytes(xa), raw_bytes(xb));
    EXPECT_EQ(raw_bytes(ca), raw_bytes(cb));
    EXPECT_EQ(raw_bytes(xc), raw_bytes(xb));
    EXPECT_EQ(raw_bytes(cc), raw_bytes(cb));
    KPool::seed_tail(space, a.ring.tail(), key, gate, ro, cl, slots, 2, opts);
    KPool::seed_tail(space, b.ring, key, gate, batch, opts);
    EXPECT_TRUE(same_state(space, a, b));
    Twin c(space, rng);
    KPool::seed_tail(space, c.ring.tail(), key, gate, batch, opts);
    EXPECT_EQ(raw_bytes(c.ring.tail()), raw_bytes(b.ring.tail()));
  }
  // The steps, with and without the cache, then store_pools.
  Twin a(space, rng), b(space, rng);
  KPool::step(space, a.ring, key, gate, ape, ro, cl, slots, 2, a.out, a.cache, table, opts);
  KPool::step(space, b.ring, key, gate, ape, batch, KPool::paged(b.cache, table), b.out, opts);
  EXPECT_TRUE(same_state(space, a, b));
  {
    // The older Batch order (the cache after the output) and the
    // positional step without a cache.
    Twin c(space, rng), d(space, rng), e(space, rng);
    KPool::step(space, c.ring, key, gate, ape, batch, c.out, KPool::paged(c.cache, table), opts);
    EXPECT_TRUE(same_state(space, c, b));
    KPool::step(space, d.ring, key, gate, ape, ro, cl, slots, 2, d.out, opts);
    KPool::step(space, e.ring, key, gate, ape, batch, e.out, opts);
    EXPECT_TRUE(same_state(space, d, e));
  }
  {
    Cache sa(space, blocks, block_pools, D, K, KPool::CacheScale::amax, true);
    Cache sb(space, blocks, block_pools, D, K, KPool::CacheScale::amax, true);
    KPool::store_pools(space, a.out, 2, table, sa, opts);
    KPool::store_pools(space, b.out, batch, KPool::paged(sb, table), opts);
    // load_pools: the positional form's num_pools against the batch form's
    // pools before each row (row 0 at 3: none; here 8 and 4 positions).
    U32 const lcl = to_index_view<U32>(std::vector<std::uint32_t>{8, 4, 0}, "cache_lengths");
    I1 const np = to_index_view<I1>(std::vector<std::int32_t>{2, 1, 0}, "num_pools");
    F3 la("loaded_a", 3, 4, D), lb("loaded_b", 3, 4, D);
    Kokkos::deep_copy(la, -3.0f);
    Kokkos::deep_copy(lb, -3.0f);
    KPool::load_pools(space, sa, table, np, 2, la, KPool::PoolDomain::original, opts);
    KPool::load_pools(space, KPool::ragged_batch(ro, lcl, 2), KPool::paged(sb, table), lb,
                      KPool::PoolDomain::original, opts);
    EXPECT_EQ(raw_bytes(la), raw_bytes(lb));
    EXPECT_EQ(raw_bytes(sa.values()), raw_bytes(sb.values()));
    EXPECT_EQ(raw_bytes(sa.values()), raw_bytes(a.cache.values()))
        << "store_pools writes what the cached step wrote";
  }

  // A decode batch: next_n 3, row 1 left-padded, row 2 dead.
  int const next_n = 3;
  I2 const positions = positions_view<M>({12, 13, 14, -1, 5, 6, 0, 0, 0}, next_n);
  auto const decode = KPool::decode_batch(positions, slots, 2);
  EXPECT_TRUE(decode.is_decode());
  EXPECT_EQ(decode.next_n(), 3u);
  F3 dkey("key", 3, next_n, D), dgate("gate", 3, next_n, D);
  fill_uniform(rng, dkey, -2, 2);
  fill_uniform(rng, dgate, -3, 3);
  {
    Twin ta(space, rng), tb(space, rng);
    Kokkos::View<float***, Kokkos::LayoutRight, M> xa("pooled_a", 3, 1, D), xb("pooled_b", 3, 1, D);
    I2 ca("closed_a", 3, 1), cb("closed_b", 3, 1);
    KPool::tail_update(space, ta.ring.tail(), dkey, dgate, ape, positions, slots, 2, xa, ca,
                       opts);
    KPool::tail_update(space, tb.ring, dkey, dgate, ape, decode, xb, cb, opts);
    Twin tc(space, rng);
    Kokkos::View<float***, Kokkos::LayoutRight, M> xc("pooled_c", 3, 1, D);
    I2 cc("closed_c", 3, 1);
    KPool::tail_update(space, tc.ring.tail(), dkey, dgate, ape, decode, xc, cc, opts);
    EXPECT_EQ(raw_bytes(xc), raw_bytes(xb));
    EXPECT_EQ(raw_bytes(cc), raw_bytes(cb));
    EXPECT_EQ(raw_bytes(xa), raw_bytes(xb));
    EXPECT_EQ(raw_bytes(ca), raw_bytes(cb));
    EXPECT_TRUE(same_state(space, ta, tb));
  }
  KPool::decode_step(space, a.ring, dkey, dgate, ape, positions, slots, 2, a.out, a.cache,
                     table, opts);
  KPool::step(space, b.ring, dkey, dgate, ape, decode, KPool::paged(b.cache, table), b.out,
              opts);
  EXPECT_TRUE(same_state(space, a, b));
  {
    Twin c(space, rng), d(space, rng);
    KPool::decode_step(space, c.ring, dkey, dgate, ape, positions, slots, 2, c.out, opts);
    KPool::step(space, d.ring, dkey, dgate, ape, decode, d.out, opts);
    EXPECT_TRUE(same_state(space, c, d));
  }

  // The selections over the cache both twins wrote: a ragged batch, then
  // the decode batch with a one-row workspace (a chunk a request).
  int const topk = 2, width = KPool::select_tokens_width(topk, K);
  auto const select = [&](std::size_t rows, auto const& forms_batch, U32 const& ro_p,
                          U32 const& cl_p, std::size_t ws_rows) {
    auto const [q, w] = twin_queries(rng, rows);
    KPool::SelectWorkspace<float, M> wa(space, rows, 8, H, D), wb(space, ws_rows, 8, H, D);
    I2 ia("ids_a", rows, topk), ib("ids_b", rows, topk);
    I2 ta("tokens_a", rows, width), tb("tokens_b", rows, width);
    Kokkos::deep_copy(ia, -7);
    Kokkos::deep_copy(ib, -7);
    Kokkos::deep_copy(ta, -7);
    Kokkos::deep_copy(tb, -7);
    I2 ic("ids_c", rows, topk), tc("tokens_c", rows, width);
    Kokkos::deep_copy(ic, -7);
    Kokkos::deep_copy(tc, -7);
    KPool::score_select(space, ro_p, cl_p, table, 2, K, q, w, a.cache, topk, ia, wa, opts);
    KPool::score_select(space, q, w, topk, forms_batch, KPool::paged(b.cache, table), ib, wb,
                        opts);
    KPool::score_select(space, KPool::paged(b.cache, table), q, w, topk, forms_batch, ic, wb,
                        opts);
    KPool::select_tokens(space, ro_p, cl_p, table, 2, K, q, w, a.cache, topk, ta, wa, opts);
    KPool::select_tokens(space, q, w, topk, forms_batch, KPool::paged(b.cache, table), tb, wb,
                         opts);
    KPool::select_tokens(space, KPool::paged(b.cache, table), q, w, topk, forms_batch, tc, wb,
                         opts);
    EXPECT_EQ(raw_bytes(ia), raw_bytes(ib));
    EXPECT_EQ(raw_bytes(ta), raw_bytes(tb));
    EXPECT_EQ(raw_bytes(ic), raw_bytes(ib));
    EXPECT_EQ(raw_bytes(tc), raw_bytes(tb));
    auto const h = on_host(ia);
    int selected = 0;
    for (std::size_t i = 0; i < h.span(); ++i) selected += h.data()[i] >= 0 ? 1 : 0;
    EXPECT_GT(selected, 0) << "the comparison is not of two empty selections";
    return ia;
  };
  {
    SCOPED_TRACE("ragged");
    I2 const ids = select(14, KPool::ragged_batch(ro, cl, 2), ro, cl, 5);
    // expand_topk's Batch form on those ids.
    int const ew = KPool::expand_topk_width(topk, K, true);
    I2 ea("expanded_a", 14, ew), eb("expanded_b", 14, ew), ec("expanded_c", 14, ew);
    KPool::expand_topk(space, ids, ro, cl, 2, K, true, ea, opts);
    KPool::expand_topk(space, ids, K, true, KPool::ragged_batch(ro, cl, 2), ec, opts);
    KPool::expand_topk(space, ids, true, KPool::ragged_batch(ro, cl, 2), b.cache, eb, opts);
    EXPECT_EQ(raw_bytes(ea), raw_bytes(eb));
    EXPECT_EQ(raw_bytes(ec), raw_bytes(eb));
  }
  {
    SCOPED_TRACE("decode");
    // Row r owns rows [3r, 3r + 3) from its first real entry's base.
    U32 const dro = to_index_view<U32>(std::vector<std::uint32_t>{0, 3, 6, 9}, "ro");
    U32 const dcl = to_index_view<U32>(std::vector<std::uint32_t>{12, 4, 0}, "cl");
    select(9, KPool::decode_batch(positions, 2), dro, dcl, 1);
  }
}


// The retired Options::score_engine may only repeat the workspace's
// engine, or choose where the workspace was built for automatic: a
// contradiction is refused by name, nothing written; blas asked of a
// workspace built without its buffers likewise.
TEST(Deprecated, OptionsMayNotContradictTheWorkspacesEngine) {
  E space;
  Rng rng(7);
  KPool::Options opts = test_options<E>();
  Cache cache(space, blocks, block_pools, D, K, KPool::CacheScale::amax, true);
  I2 const table = block_table();
  U32 const ro = to_index_view<U32>(std::vector<std::uint32_t>{0, 4, 8}, "row_offsets");
  U32 const cl = to_index_view<U32>(std::vector<std::uint32_t>{9, 9}, "cache_lengths");
  TwinQueries const sel = twin_queries(rng, 8);
  I2 ids("ids", 8, 2), again("again", 8, 2);
  Kokkos::deep_copy(ids, -7);
  auto const before = raw_bytes(ids);
  KPool::SelectWorkspace<float, M> tiles(space, 8, 16, H, D, KPool::ScoreEngine::tiles);
  opts.score_engine = KPool::ScoreEngine::team_gemm;
  expect_refused(
      [&] {
        KPool::score_select(space, sel.q, sel.w, 2, KPool::ragged_batch(ro, cl, 2),
                            KPool::paged(cache, table), ids, tiles, opts);
      },
      {"KPool::score_select", "options", "team_gemm", "contradicts the workspace's engine, tiles"});
  EXPECT_EQ(raw_bytes(ids), before);
  // Repeating it is the same call.
  opts.score_engine = KPool::ScoreEngine::tiles;
  KPool::score_select(space, sel.q, sel.w, 2, KPool::ragged_batch(ro, cl, 2),
                      KPool::paged(cache, table), ids, tiles, opts);
  KPool::Options plain = test_options<E>();
  KPool::score_select(space, sel.q, sel.w, 2, KPool::ragged_batch(ro, cl, 2),
                      KPool::paged(cache, table), again, tiles, plain);
  EXPECT_EQ(raw_bytes(ids), raw_bytes(again));
#if KPOOL_HAS_KOKKOSKERNELS
  if (Kokkos::SpaceAccessibility<Kokkos::HostSpace, M>::accessible) {
    KPool::SelectWorkspace<float, M> automatic(space, 8, 16, H, D);
    KPool::Options blas = test_options<E>();
    blas.score_engine = KPool::ScoreEngine::blas;
    expect_refused(
        [&] {
          KPool::score_select(space, sel.q, sel.w, 2, KPool::ragged_batch(ro, cl, 2),
                              KPool::paged(cache, table), ids, automatic, blas);
        },
        {"KPool::score_select", "options", nullptr, "needs a workspace built for it"});
  }
#endif
}

// The ranks' older order (the cache before the inputs) is the one order,
// on one rank's shard of the whole cache with the communicator of one.
TEST(Deprecated, TheRanksOlderOrderIsTheOneOrder) {
  E space;
  Rng rng(5);
  KPool::Options const opts = test_options<E>();
  KPool::PoolCache<float, M> whole(space, blocks, block_pools, D, K);
  fill_uniform(rng, whole.values(), -2, 2);
  auto const shard = whole.sharded(KPool::Shard{0, 1, 1});
  I2 const table = block_table();
  U32 const ro = to_index_view<U32>(std::vector<std::uint32_t>{0, 4, 8}, "row_offsets");
  U32 const cl = to_index_view<U32>(std::vector<std::uint32_t>{9, 13}, "cache_lengths");
  auto const batch = KPool::ragged_batch(ro, cl, 2);
  auto const [q, w] = twin_queries(rng, 8);
  int const topk = 3, width = KPool::select_tokens_width(topk, K);
  KPool::SelectWorkspace<float, M> wa(space, 8, 16, H, D), wb(space, 8, 16, H, D);
  KPool::ShardWorkspace<float, M> xa(space, 8, topk, 1), xb(space, 8, topk, 1);
  KPool::SelfCommunicator<E> comm;
  auto const paged = KPool::paged(shard, table);
  // The three steps by hand.
  I2 ia("ia", 8, topk), ib("ib", 8, topk);
  KPool::shard_select_local(space, paged, q, w, topk, batch, wa, xa, opts);
  KPool::shard_select_local(space, q, w, topk, batch, paged, wb, xb, opts);
  EXPECT_EQ(raw_bytes(xa.send()), raw_bytes(xb.send()));
  comm.all_gather(space, xa.send().data(), xa.recv().data(), xa.send().span());
  comm.all_gather(space, xb.send().data(), xb.recv().data(), xb.send().span());
  KPool::shard_select_merge(space, paged, topk, ia, xa, opts);
  KPool::shard_select_merge(space, topk, paged, ib, xb, opts);
  EXPECT_EQ(raw_bytes(ia), raw_bytes(ib));
  I2 ta("ta", 8, width), tb("tb", 8, width);
  KPool::shard_select_merge_tokens(space, paged, topk, batch, ta, xa, opts);
  KPool::shard_select_merge_tokens(space, topk, batch, paged, tb, xb, opts);
  EXPECT_EQ(raw_bytes(ta), raw_bytes(tb));
  // And in one call each, which is the selection over the whole cache.
  I2 ja("ja", 8, topk), jb("jb", 8, topk), whole_ids("whole_ids", 8, topk);
  KPool::score_select(space, paged, q, w, topk, batch, ja, wa, xa, comm, opts);
  KPool::score_select(space, q, w, topk, batch, paged, jb, wb, xb, comm, opts);
  KPool::score_select(space, q, w, topk, batch, KPool::paged(whole, table), whole_ids, wb, opts);
  EXPECT_EQ(raw_bytes(ja), raw_bytes(jb));
  EXPECT_EQ(raw_bytes(jb), raw_bytes(whole_ids));
  EXPECT_EQ(raw_bytes(jb), raw_bytes(ib));
  I2 ua("ua", 8, width), ub("ub", 8, width);
  KPool::select_tokens(space, paged, q, w, topk, batch, ua, wa, xa, comm, opts);
  KPool::select_tokens(space, q, w, topk, batch, paged, ub, wb, xb, comm, opts);
  EXPECT_EQ(raw_bytes(ua), raw_bytes(ub));
  EXPECT_EQ(raw_bytes(ub), raw_bytes(tb));
}

// Layer's positional step and decode_step are its batch step.
TEST(Deprecated, LayersPositionalStepsAreItsBatchStep) {
  E space;
  Rng rng(3);
  KPool::LayerConfig cfg;
  cfg.kpool = K;
  cfg.head_dim = D;
  cfg.num_heads = H;
  cfg.max_slots = max_slots;
  cfg.max_batch = 3;
  cfg.max_tokens = 16;
  cfg.num_blocks = blocks;
  cfg.block_pools = block_pools;
  cfg.max_context = 64;
  F2 const ape = twin_ape(rng);
  KPool::Layer<float, float, M> a(space, cfg, ape), b(space, cfg, ape);
  I2 const table = block_table();
  KPool::Options const opts = test_options<E>();
  U32 const ro = to_index_view<U32>(std::vector<std::uint32_t>{0, 9, 14}, "row_offsets");
  U32 const cl = to_index_view<U32>(std::vector<std::uint32_t>{0, 0}, "cache_lengths");
  U32 const slots = to_index_view<U32>(std::vector<std::uint32_t>{1, 3}, "slot_idx");
  F2 key("key", 14, D), gate("gate", 14, D);
  fill_uniform(rng, key, -2, 2);
  fill_uniform(rng, gate, -3, 3);
  a.step(space, key, gate, ro, cl, slots, 2, table, opts);
  b.step(space, key, gate, KPool::ragged_batch(ro, cl, slots, 2), table, opts);
  EXPECT_EQ(raw_bytes(a.ring().tail()), raw_bytes(b.ring().tail()));
  EXPECT_EQ(raw_bytes(a.cache().values()), raw_bytes(b.cache().values()));
  I2 const positions = positions_view<M>({9, 10, 5, 6}, 2);
  F3 dkey("key", 2, 2, D), dgate("gate", 2, 2, D);
  fill_uniform(rng, dkey, -2, 2);
  fill_uniform(rng, dgate, -3, 3);
  a.decode_step(space, dkey, dgate, positions, slots, 2, table, opts);
  b.step(space, dkey, dgate, KPool::decode_batch(positions, slots, 2), table, opts);
  EXPECT_EQ(raw_bytes(a.ring().tail()), raw_bytes(b.ring().tail()));
  EXPECT_EQ(raw_bytes(a.ring().state()), raw_bytes(b.ring().state()));
  EXPECT_EQ(raw_bytes(a.cache().values()), raw_bytes(b.cache().values()));
}

}  // namespace
