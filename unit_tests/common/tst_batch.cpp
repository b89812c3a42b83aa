// The one batch argument (docs/api.md, "One batch argument"): a batch of
// the wrong form, or without the ring slots a call needs, is refused by
// name with nothing written, a decode batch's selection in chunks of a
// workspace smaller than the batch included; a workspace sizes only its
// engine's buffers. (The retired forms against their replacements:
// tst_deprecated.cpp.)

#include "KPoolTwin.hpp"

#include <string>
#include <vector>

namespace {

using namespace KPoolTwinTest;  // KPoolTest's names too

// Calls with a batch of the other form, or without the ring slots, and a
// blas selection from a workspace built for another engine: refused by
// name, nothing written.
TEST(Batch, AWrongBatchIsRefusedByNameAndNothingIsWritten) {
  E space;
  Rng rng(5);
  KPool::Options const opts = test_options<E>();
  F2 const ape = twin_ape(rng);
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
    expect_refused(call, {entry, argument, value, words});
    EXPECT_EQ(raw_bytes(t.ring.tail()), ring_before) << "the ring was written";
    EXPECT_EQ(raw_bytes(t.cache.values()), cache_before) << "the cache was written";
  };
  auto paged = KPool::paged(t.cache, table);
  expect([&] {
    KPool::step(space, t.ring, key, gate, ape, KPool::decode_batch(positions, slots, 2), paged,
                t.out, opts);
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
    KPool::tail_update(space, t.ring, dkey, dgate, ape, KPool::ragged_batch(ro, cl, slots, 2), x,
                       c, opts);
  }, "KPool::tail_update", "batch", "ragged", "is not the decode batch the call takes");
  expect([&] {
    KPool::seed_tail(space, t.ring, key, gate, KPool::decode_batch(positions, slots, 2), opts);
  }, "KPool::seed_tail", "batch", "decode", "is not the ragged batch the call takes");
  expect([&] {
    I2 ids("ids", 4, 1), out("out", 4, KPool::expand_topk_width(1, K, true));
    KPool::expand_topk(space, ids, true, KPool::decode_batch(positions, 2), t.cache, out, opts);
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
    KPool::score_select(space, q5, w5, 2, KPool::decode_batch(positions, 2), paged, ids, ws,
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
      KPool::select_tokens(space, q4, w4, 2, KPool::decode_batch(positions, 2),
                           KPool::paged(t.cache, bad), tok, ws1, opts);
    }, "block_table", "-1", "is not an assigned block");
    // Row 1's first real position 0 at entry 1: its base would be -1.
    I2 const below = positions_view<M>({8, 9, -1, 0}, 2);
    refused_at_row_1([&] {
      KPool::select_tokens(space, q4, w4, 2, KPool::decode_batch(below, 2), paged, tok, ws1,
                           opts);
    }, "positions", "0", "positions below 0");
    // Row 1 sees 9 pools, more than the workspace's 8.
    I2 const far = positions_view<M>({8, 9, 34, 35}, 2);
    refused_at_row_1([&] {
      KPool::select_tokens(space, q4, w4, 2, KPool::decode_batch(far, 2), paged, tok, ws1,
                           opts);
    }, "positions", "34", "more than the workspace's max_visible = 8");
    EXPECT_EQ(raw_bytes(tok), tok_before) << "the first chunk's tokens were written";
  }
#if KPOOL_HAS_KOKKOSKERNELS
  if (Kokkos::SpaceAccessibility<Kokkos::HostSpace, M>::accessible) {
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
