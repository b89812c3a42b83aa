// The one batch argument (docs/api.md, "One batch argument"): every call's
// Batch form runs its positional form, so on the same inputs the two must
// agree bit for bit (the positional forms are checked against the
// independent references in the other suites): the writers, the steps with
// and without the paged cache, store_pools, expand_topk and the
// selections, a decode batch's selection in chunks of a workspace smaller
// than the batch included. A batch of the wrong form, or without the ring
// slots a call needs, is refused by name with nothing written; a workspace
// sizes only its engine's buffers.

#include <KPoolTestUtils.hpp>

#include <string>
#include <vector>

namespace {

using namespace KPoolTest;

using E = Kokkos::DefaultExecutionSpace;
using M = E::memory_space;
using U32 = Kokkos::View<std::uint32_t*, M>;
using I1 = Kokkos::View<std::int32_t*, M>;
using I2 = Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M>;
using F2 = Kokkos::View<float**, Kokkos::LayoutRight, M>;
using F3 = Kokkos::View<float***, Kokkos::LayoutRight, M>;
using Cache = KPool::PoolCache<KPool::float8_e4m3, M>;

constexpr int K = 4, D = 16, H = 2, max_slots = 4, blocks = 12, block_pools = 4;

// Two of everything a layer writes: `a` for the positional calls, `b` for
// the Batch forms, each starting from the same ring contents.
struct Twin {
  KPool::Ring<float, M> ring;
  Cache cache;
  KPool::StepOutput<float, M> out;
  Twin(E const& space, Rng rng)
      : ring(space, max_slots, K, D, 2 * K),
        cache(space, blocks, block_pools, D, K, KPool::CacheScale::amax, true),
        out(space, KPool::StepOutput<float, M>::capacity_for(32, 3, K), 3, D) {
    fill_uniform(rng, ring.tail(), -2, 2);
    hold_positions(ring, 0x7FFFFFFFu, 1);  // stands for earlier calls
    // Allocated uninitialized: the same bytes in both twins' rows that no
    // call writes.
    Kokkos::deep_copy(out.pooled(), 0.0f);
    Kokkos::deep_copy(out.pool_id(), -1);
  }
};

::testing::AssertionResult same_state(E const& space, Twin const& a, Twin const& b) {
  if (raw_bytes(a.ring.tail()) != raw_bytes(b.ring.tail()))
    return ::testing::AssertionFailure() << "ring";
  if (raw_bytes(a.cache.values()) != raw_bytes(b.cache.values()) ||
      raw_bytes(a.cache.scales()) != raw_bytes(b.cache.scales()))
    return ::testing::AssertionFailure() << "cache";
  auto const ha = a.out.to_host(space, KPool::StepOutputParts::ids_and_pooled);
  auto const hb = b.out.to_host(space, KPool::StepOutputParts::ids_and_pooled);
  if (ha.count != hb.count) return ::testing::AssertionFailure() << "output count";
  if (raw_bytes(a.out.pooled()) != raw_bytes(b.out.pooled()) ||
      raw_bytes(a.out.pool_id()) != raw_bytes(b.out.pool_id()))
    return ::testing::AssertionFailure() << "output";
  return ::testing::AssertionSuccess();
}

// Row r's blocks: 4r .. 4r + 3.
I2 block_table() {
  std::vector<std::int32_t> v;
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 4; ++c) v.push_back(4 * r + c);
  return positions_view<M>(v, 4);
}

TEST(Batch, EveryCallsBatchFormIsItsPositionalForm) {
  E space;
  Rng rng(11);
  KPool::Options const opts = test_options<E>();
  F2 ape("ape", K, D);
  fill_uniform(rng, ape, -1, 1);
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
    KPool::compute_pool_row_offsets(space, ro, cl, 2, K, 14, qa, opts);
    KPool::compute_pool_row_offsets(space, KPool::ragged_batch(ro, cl, 2), K, 14, qb, opts);
    EXPECT_EQ(raw_bytes(qa), raw_bytes(qb));
    EXPECT_EQ(raw_bytes(qa), raw_bytes(pa));
  }
  // ring_close then seed_tail.
  {
    Twin a(space, rng), b(space, rng);
    F2 xa("pooled_a", 3, D), xb("pooled_b", 3, D);
    I1 ca("closed_a", 3), cb("closed_b", 3);
    KPool::ring_close(space, a.ring.tail(), key, gate, ape, ro, cl, slots, 2, xa, ca, opts);
    KPool::ring_close(space, b.ring.tail(), key, gate, ape, batch, xb, cb, opts);
    EXPECT_EQ(raw_bytes(xa), raw_bytes(xb));
    EXPECT_EQ(raw_bytes(ca), raw_bytes(cb));
    KPool::seed_tail(space, a.ring.tail(), key, gate, ro, cl, slots, 2, opts);
    KPool::seed_tail(space, b.ring.tail(), key, gate, batch, opts);
    EXPECT_TRUE(same_state(space, a, b));
  }
  // The steps, with and without the cache, then store_pools.
  Twin a(space, rng), b(space, rng);
  KPool::step(space, a.ring, key, gate, ape, ro, cl, slots, 2, a.out, a.cache, table, opts);
  KPool::step(space, b.ring, key, gate, ape, batch, b.out, KPool::paged(b.cache, table), opts);
  EXPECT_TRUE(same_state(space, a, b));
  {
    Cache sa(space, blocks, block_pools, D, K, KPool::CacheScale::amax, true);
    Cache sb(space, blocks, block_pools, D, K, KPool::CacheScale::amax, true);
    KPool::store_pools(space, a.out, 2, table, sa, opts);
    KPool::store_pools(space, b.out, batch, KPool::paged(sb, table), opts);
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
    KPool::tail_update(space, tb.ring.tail(), dkey, dgate, ape, decode, xb, cb, opts);
    EXPECT_EQ(raw_bytes(xa), raw_bytes(xb));
    EXPECT_EQ(raw_bytes(ca), raw_bytes(cb));
    EXPECT_TRUE(same_state(space, ta, tb));
  }
  KPool::decode_step(space, a.ring, dkey, dgate, ape, positions, slots, 2, a.out, a.cache,
                     table, opts);
  KPool::step(space, b.ring, dkey, dgate, ape, decode, b.out, KPool::paged(b.cache, table),
              opts);
  EXPECT_TRUE(same_state(space, a, b));

  // The selections over the cache both twins wrote: a ragged batch, then
  // the decode batch with a one-row workspace (a chunk a request).
  int const topk = 2, width = KPool::select_tokens_width(topk, K);
  auto const select = [&](std::size_t rows, auto const& forms_batch, U32 const& ro_p,
                          U32 const& cl_p, std::size_t ws_rows) {
    F3 q("q", rows, H, D);
    F2 w("w", rows, H);
    fill_uniform(rng, q, -1, 1);
    fill_uniform(rng, w, 0, 1);
    KPool::SelectWorkspace<float, M> wa(space, rows, 8, H, D), wb(space, ws_rows, 8, H, D);
    I2 ia("ids_a", rows, topk), ib("ids_b", rows, topk);
    I2 ta("tokens_a", rows, width), tb("tokens_b", rows, width);
    Kokkos::deep_copy(ia, -7);
    Kokkos::deep_copy(ib, -7);
    Kokkos::deep_copy(ta, -7);
    Kokkos::deep_copy(tb, -7);
    KPool::score_select(space, ro_p, cl_p, table, 2, K, q, w, a.cache, topk, ia, wa, opts);
    KPool::score_select(space, KPool::paged(b.cache, table), q, w, topk, forms_batch, ib, wb,
                        opts);
    KPool::select_tokens(space, ro_p, cl_p, table, 2, K, q, w, a.cache, topk, ta, wa, opts);
    KPool::select_tokens(space, KPool::paged(b.cache, table), q, w, topk, forms_batch, tb, wb,
                         opts);
    EXPECT_EQ(raw_bytes(ia), raw_bytes(ib));
    EXPECT_EQ(raw_bytes(ta), raw_bytes(tb));
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
    I2 ea("expanded_a", 14, ew), eb("expanded_b", 14, ew);
    KPool::expand_topk(space, ids, ro, cl, 2, K, true, ea, opts);
    KPool::expand_topk(space, ids, K, true, KPool::ragged_batch(ro, cl, 2), eb, opts);
    EXPECT_EQ(raw_bytes(ea), raw_bytes(eb));
  }
  {
    SCOPED_TRACE("decode");
    // Row r owns rows [3r, 3r + 3) from its first real entry's base.
    U32 const dro = to_index_view<U32>(std::vector<std::uint32_t>{0, 3, 6, 9}, "ro");
    U32 const dcl = to_index_view<U32>(std::vector<std::uint32_t>{12, 4, 0}, "cl");
    select(9, KPool::decode_batch(positions, 2), dro, dcl, 1);
  }
}

// Calls with a batch of the other form, or without the ring slots, and a
// blas selection from a workspace built for another engine: refused by
// name, nothing written.
TEST(Batch, AWrongBatchIsRefusedByNameAndNothingIsWritten) {
  E space;
  Rng rng(5);
  KPool::Options const opts = test_options<E>();
  F2 ape("ape", K, D);
  fill_uniform(rng, ape, -1, 1);
  I2 const table = block_table();
  U32 const ro = to_index_view<U32>(std::vector<std::uint32_t>{0, 4, 8}, "row_offsets");
  U32 const cl = to_index_view<U32>(std::vector<std::uint32_t>{0, 0}, "cache_lengths");
  U32 const slots = to_index_view<U32>(std::vector<std::uint32_t>{0, 1}, "slot_idx");
  I2 const positions = positions_view<M>({8, 9, 4, 5}, 2);
  F2 key("key", 8, D), gate("gate", 8, D);
  F3 dkey("key", 2, 2, D), dgate("gate", 2, 2, D);
  fill_uniform(rng, key, -2, 2);
  fill_uniform(rng, dkey, -2, 2);
  Twin t(space, rng);
  auto const ring_before = raw_bytes(t.ring.tail());
  auto const cache_before = raw_bytes(t.cache.values());

  auto const expect = [&](auto const& call, char const* entry, char const* argument,
                          char const* value, char const* words) {
    try {
      call();
      ADD_FAILURE() << entry << " took a batch it must refuse";
    } catch (KPool::InvalidArgument const& e) {
      EXPECT_EQ(e.entry_point(), entry);
      EXPECT_EQ(e.argument(), argument);
      EXPECT_EQ(e.value(), value);
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
    EXPECT_EQ(raw_bytes(t.ring.tail()), ring_before) << "the ring was written";
    EXPECT_EQ(raw_bytes(t.cache.values()), cache_before) << "the cache was written";
  };
  auto const paged = KPool::paged(t.cache, table);
  expect([&] {
    KPool::step(space, t.ring, key, gate, ape, KPool::decode_batch(positions, slots, 2), t.out,
                paged, opts);
  }, "KPool::step", "batch", "decode", "a [total_tokens, D] key takes KPool::ragged_batch");
  expect([&] {
    KPool::step(space, t.ring, dkey, dgate, ape, KPool::ragged_batch(ro, cl, slots, 2), t.out,
                opts);
  }, "KPool::step", "batch", "ragged", "a [B, next_n, D] key takes KPool::decode_batch");
  expect([&] {
    KPool::step(space, t.ring, key, gate, ape, KPool::ragged_batch(ro, cl, 2), t.out, opts);
  }, "KPool::step", "batch", "empty", "is needed by a call that reads or writes the ring");
  expect([&] {
    Kokkos::View<float***, Kokkos::LayoutRight, M> x("pooled", 2, 1, D);
    I2 c("closed", 2, 1);
    KPool::tail_update(space, t.ring.tail(), dkey, dgate, ape,
                       KPool::ragged_batch(ro, cl, slots, 2), x, c, opts);
  }, "KPool::tail_update", "batch", "ragged", "is not the decode batch the call takes");
  expect([&] {
    KPool::seed_tail(space, t.ring.tail(), key, gate, KPool::decode_batch(positions, slots, 2),
                     opts);
  }, "KPool::seed_tail", "batch", "decode", "is not the ragged batch the call takes");
  expect([&] {
    I2 ids("ids", 4, 1), out("out", 4, KPool::expand_topk_width(1, K, true));
    KPool::expand_topk(space, ids, K, true, KPool::decode_batch(positions, 2), out, opts);
  }, "KPool::expand_topk", "batch", "decode", "select_tokens takes a decode batch");

  // Selections: q rows not B * next_n of a decode batch; blas from a
  // workspace built for the default engine.
  KPool::SelectWorkspace<float, M> ws(space, 8, 8, H, D);
  EXPECT_EQ(ws.engine(), KPool::ScoreEngine::automatic);
  EXPECT_EQ(ws.blas_queries(), nullptr) << "a default workspace stages no blas buffers";
  I2 ids("ids", 8, 2);
  Kokkos::deep_copy(ids, -7);
  auto const ids_before = raw_bytes(ids);
  F3 q5("q", 5, H, D);
  F2 w5("w", 5, H);
  expect([&] {
    KPool::score_select(space, paged, q5, w5, 2, KPool::decode_batch(positions, 2), ids, ws,
                        opts);
  }, "KPool::score_select", "q", "5", "B * next_n of the decode batch");

  // A decode selection in chunks (a workspace of one request's rows, so a
  // chunk a request): a bad row in the second chunk is refused under its
  // own batch row, 1, before the first chunk writes anything.
  {
    KPool::SelectWorkspace<float, M> ws1(space, 2, 8, H, D);
    F3 q4("q", 4, H, D);
    F2 w4("w", 4, H);
    fill_uniform(rng, q4, -1, 1);
    fill_uniform(rng, w4, 0, 1);
    I2 ids4("ids", 4, 2);
    Kokkos::deep_copy(ids4, -7);
    auto const ids4_before = raw_bytes(ids4);
    auto const refused_at_row_1 = [&](auto const& call, char const* argument,
                                      char const* value, char const* words) {
      try {
        call();
        ADD_FAILURE() << "a bad second chunk was taken";
      } catch (KPool::InvalidArgument const& e) {
        EXPECT_EQ(e.entry_point(), "KPool::select_tokens");
        EXPECT_EQ(e.argument(), argument);
        EXPECT_EQ(e.row(), 1) << e.what();
        EXPECT_EQ(e.value(), value);
        EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
      }
      EXPECT_EQ(raw_bytes(ids4), ids4_before) << "the first chunk was written";
    };
    // Row 1's block of pool 0 unassigned.
    auto const bad = block_table();
    auto const hbad = on_host(bad);
    hbad(1, 0) = -1;
    Kokkos::deep_copy(bad, hbad);
    I2 tok("tokens", 4, KPool::select_tokens_width(2, K));
    Kokkos::deep_copy(tok, -7);
    auto const tok_before = raw_bytes(tok);
    refused_at_row_1([&] {
      KPool::select_tokens(space, KPool::paged(t.cache, bad), q4, w4, 2,
                           KPool::decode_batch(positions, 2), tok, ws1, opts);
    }, "block_table", "-1", "is not an assigned block");
    // Row 1's first real position 0 at entry 1: its base would be -1.
    I2 const below = positions_view<M>({8, 9, -1, 0}, 2);
    refused_at_row_1([&] {
      KPool::select_tokens(space, paged, q4, w4, 2, KPool::decode_batch(below, 2), tok, ws1,
                           opts);
    }, "positions", "0", "positions below 0");
    // Row 1 sees 9 pools, more than the workspace's 8.
    I2 const far = positions_view<M>({8, 9, 34, 35}, 2);
    refused_at_row_1([&] {
      KPool::select_tokens(space, paged, q4, w4, 2, KPool::decode_batch(far, 2), tok, ws1,
                           opts);
    }, "positions", "34", "more than the workspace's max_visible = 8");
    EXPECT_EQ(raw_bytes(tok), tok_before) << "the first chunk's tokens were written";
  }
#if KPOOL_HAS_KOKKOSKERNELS
  if (Kokkos::SpaceAccessibility<Kokkos::HostSpace, M>::accessible) {
    F3 q("q", 8, H, D);
    F2 w("w", 8, H);
    KPool::Options blas = opts;
    blas.score_engine = KPool::ScoreEngine::blas;
    expect([&] {
      KPool::score_select(space, paged, q, w, 2, KPool::ragged_batch(ro, cl, 2), ids, ws, blas);
    }, "KPool::score_select", "options", "blas", "needs a workspace built for it");
    KPool::SelectWorkspace<float, M> wb(space, 8, 8, H, D, KPool::ScoreEngine::blas);
    EXPECT_EQ(wb.engine(), KPool::ScoreEngine::blas);
    EXPECT_NE(wb.blas_queries(), nullptr);
  }
#else
  try {
    KPool::SelectWorkspace<float, M> wb(space, 8, 8, H, D, KPool::ScoreEngine::blas);
    ADD_FAILURE() << "a blas workspace without Kokkos Kernels";
  } catch (KPool::InvalidArgument const& e) {
    EXPECT_EQ(e.argument(), "engine");
  }
#endif
  EXPECT_EQ(raw_bytes(ids), ids_before) << "a refused selection wrote pool ids";
}

}  // namespace
