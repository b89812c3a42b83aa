// Argument validation (common/KPool_Exceptions.hpp, docs/validation.md): every
// public entry point checks its arguments before launching anything and
// throws KPool::InvalidArgument naming the entry point, the argument, the row
// and the bad value, with no output and no ring entry written. One TEST per
// rule, each feeding exactly that bad input (everything else valid) to every
// entry point the rule applies to.
//
// Then defence in depth: with Options::validate off, shape errors still
// throw, and data errors never write outside the ring or the outputs. The
// outputs are allocated with their exact sizes, so an AddressSanitizer build
// (CMake preset "asan") catches any write past them.

#include "KPoolValidationWorld.hpp"

#include <functional>
#include <limits>
#include <set>
#include <type_traits>

namespace {

using namespace KPoolTest;
using namespace KPoolValidationTest;


// ---------------------------------------------------------------------------
// The valid setup passes, so each rejection below is that rule's alone.
// ---------------------------------------------------------------------------

TEST(Validation, ValidSetupPassesEveryEntryPoint) {
  World w;
  for (Entry e : {Entry::compress, Entry::ring_close, Entry::seed_tail,
                  Entry::tail_update, Entry::step_fused, Entry::step_unfused,
                  Entry::decode_step, Entry::expand_topk,
                  Entry::pool_row_offsets}) {
    SCOPED_TRACE(label(e));
    w.scramble_outputs();
    Snapshot const before = snapshot(w);
    EXPECT_NO_THROW(w.run(e));
    Snapshot const after = snapshot(w);
    // The call wrote its output (so the snapshots see writes) ...
    std::string const main_output =
        e == Entry::compress       ? "compress.pooled"
        : e == Entry::ring_close   ? "ring_close.closed_pool"
        : e == Entry::seed_tail    ? "ring"
        : e == Entry::tail_update  ? "tail_update.closed_pool"
        : e == Entry::decode_step  ? "decode_step.pooled"
        : e == Entry::expand_topk  ? "expand_topk.out"
        : e == Entry::pool_row_offsets ? "compute_pool_row_offsets.out"
                                       : "step.pooled";
    EXPECT_FALSE(rows_unchanged(before, after, main_output,
                                [](std::size_t) { return true; }))
        << main_output << " not written";
    // ... and not the dead rows.
    EXPECT_TRUE(rows_unchanged(before, after, "ring_close.pooled",
                               [](std::size_t r) { return r >= 4; }));
    EXPECT_TRUE(rows_unchanged(before, after, "ring_close.closed_pool",
                               [](std::size_t r) { return r >= 4; }));
    EXPECT_TRUE(rows_unchanged(before, after, "tail_update.closed_pool",
                               [](std::size_t r) { return r >= 3; }));
    EXPECT_TRUE(rows_unchanged(before, after, "expand_topk.out",
                               [](std::size_t r) { return r >= 14; }));
    // A few values the batch pins down.
    std::uint32_t const want_offsets[5] = {0, 2, 2, 2, 2};
    switch (e) {
      case Entry::ring_close: {
        auto const closed = on_host(w.rc_closed);
        EXPECT_EQ(closed(0), -1);
        EXPECT_EQ(closed(1), 1);
        EXPECT_EQ(closed(2), -1);
        EXPECT_EQ(closed(3), 1);
        break;
      }
      case Entry::compress:
      case Entry::pool_row_offsets: {
        auto const off = on_host(e == Entry::compress ? w.c_offsets : w.pro_offsets);
        for (int r = 0; r < 5; ++r) EXPECT_EQ(off(r), want_offsets[r]) << r;
        break;
      }
      case Entry::step_fused:
      case Entry::step_unfused:
        EXPECT_EQ(on_host(w.step_out.count())(), 4u);  // 2 closes, 2 compress
        break;
      case Entry::tail_update:
        EXPECT_EQ(on_host(w.tu_closed)(0, 0), 0);  // position 3 closes pool 0
        break;
      case Entry::decode_step:
        EXPECT_EQ(on_host(w.decode_out.count())(), 1u);
        break;
      default: break;
    }
  }
}

// Edges that are allowed: a request ending exactly at INT32_MAX, no live
// request, every row live, dead rows sharing a live row's slot or out of
// range, padding between consecutive decode positions.
TEST(Validation, BoundaryValuesAreAccepted) {
  {
    World w;
    w.cache_lengths[1] = kInt32Max - 3;  // 3 rows: ends at INT32_MAX
    for (Entry e : kRagged) EXPECT_NO_THROW(w.run(e)) << label(e);
  }
  {
    World w;
    w.num_requests = 0;
    w.dnum = 0;
    for (Entry e : kRagged) EXPECT_NO_THROW(w.run(e)) << label(e);
    for (Entry e : kDecode) EXPECT_NO_THROW(w.run(e)) << label(e);
  }
  {
    World w;
    w.row_offsets[5] = 14;  // row 4 live and empty
    w.cache_lengths[4] = 3;
    w.slot_idx[4] = 7;
    w.num_requests = 5;
    w.step_out = Out(w.space, Out::capacity_for(14, 5, K), 5, w.D);
    w.dslots[3] = 1;
    w.positions[9] = 11;
    w.positions[10] = -1;
    w.positions[11] = 12;
    w.dnum = 4;
    for (Entry e : kRagged) EXPECT_NO_THROW(w.run(e)) << label(e);
    // decode_step needs room for four rows' pools.
    w.decode_out = Out(w.space, 4, w.Bd, w.D);
    for (Entry e : kDecode) EXPECT_NO_THROW(w.run(e)) << label(e);
  }
}

// ---------------------------------------------------------------------------
// One TEST per rule.
// ---------------------------------------------------------------------------

TEST(Validation, RowOffsetsMustStartAtZero) {
  World w;
  w.row_offsets[0] = 1;
  expect_rejected(w, kRagged, at_row("row_offsets", 0, 1));
}

TEST(Validation, RowOffsetsMustNotDecrease) {
  World w;
  w.row_offsets[2] = 8;  // row_offsets[1] = 9
  expect_rejected(w, kRagged, at_row("row_offsets", 2, 8));
}

TEST(Validation, LastLiveRowOffsetMustFitKeyRows) {
  World w;
  w.row_offsets[4] = 17;  // key and gate have 14 rows, pool_ids 16
  expect_rejected(w, kRagged, at_row("row_offsets", 4, 17));
}

TEST(Validation, NumRequestsMustNotExceedBatchSize) {
  World w;
  w.num_requests = 6;  // B = 5
  w.dnum = 5;          // decode B = 4
  expect_rejected(w, kRagged, scalar("num_requests", 6));
  expect_rejected(w, kDecode, scalar("num_requests", 5));
}

TEST(Validation, NumRequestsMustNotBeNegative) {
  World w;
  w.num_requests = -1;
  w.dnum = -1;
  expect_rejected(w, kRagged, scalar("num_requests", -1));
  expect_rejected(w, kDecode, scalar("num_requests", -1));
}

TEST(Validation, SlotIdxMustBeBelowMaxSlots) {
  for (std::uint32_t bad : {std::uint32_t(kSlots), 0xFFFFFFFFu}) {
    World w;
    w.slot_idx[1] = bad;
    w.dslots[1] = bad;
    expect_rejected(w, kRaggedRing, at_row("slot_idx", 1, bad));
    expect_rejected(w, kDecode, at_row("slot_idx", 1, bad));
  }
}

TEST(Validation, LiveSlotsMustBeDistinct) {
  World w;
  w.slot_idx[3] = w.slot_idx[1];
  w.dslots[2] = w.dslots[0];
  expect_rejected(w, kRaggedRing, at_row("slot_idx", 3, w.slot_idx[1]));
  expect_rejected(w, kDecode, at_row("slot_idx", 2, w.dslots[0]));
}

TEST(Validation, CacheLengthPlusRowsMustFitInt32) {
  {
    World w;
    w.cache_lengths[1] = kInt32Max - 2;  // 3 rows: one past INT32_MAX
    expect_rejected(w, kRagged, at_row("cache_lengths", 1, kInt32Max - 2));
  }
  {
    World w;
    w.cache_lengths[2] = 0xFFFFFFFFu;  // an empty request too
    expect_rejected(w, kRagged, at_row("cache_lengths", 2, 0xFFFFFFFFu));
  }
}

TEST(Validation, KpoolMustBeAtLeastOne) {
  World w;
  w.ape = F2("ape", 0, w.D);
  expect_rejected(w, {Entry::compress, Entry::ring_close, Entry::step_fused, Entry::step_unfused,
                      Entry::tail_update, Entry::decode_step},
                  at_extent("ape", 0, 0));
  // seed_tail takes K from the tail, [max_slots, 2, K, D].
  w.tail = V4("tail", kSlots, 2, 0, w.D);
  expect_rejected(w, {Entry::seed_tail}, at_extent("tail", 2, 0));
  // compute_pool_row_offsets takes it from ape, expand_topk from the cache the ids come from.
  expect_rejected(w, {Entry::pool_row_offsets}, scalar("kpool", 0));
  w.ids_cache = KPool::PoolCache<float, M>();  // built without K
  expect_rejected(w, {Entry::expand_topk}, Expect{"cache", -1, "0", "kpool"});
  for (int bad : {0, -3})  // whose constructor refuses K < 1, as the Ring's does
    EXPECT_TRUE(ctor_rejects([&] { KPool::PoolCache<float, M> c(w.space, 1, 1, 1, bad); },
                             scalar("kpool", bad), "KPool::PoolCache"));
  EXPECT_TRUE(ctor_rejects([&] { Ring r(w.space, kSlots, 0, w.D); }, scalar("kpool", 0)));
}

TEST(Validation, HeadDimMustBeAtLeastOne) {
  World w;
  w.ape = F2("ape", K, 0);
  expect_rejected(w, {Entry::compress, Entry::ring_close, Entry::step_fused, Entry::step_unfused,
                      Entry::tail_update, Entry::decode_step},
                  at_extent("ape", 1, 0));
  w.tail = V4("tail", kSlots, 2, K, 0);
  expect_rejected(w, {Entry::seed_tail}, at_extent("tail", 3, 0));
  EXPECT_TRUE(ctor_rejects([&] { Ring r(w.space, kSlots, K, 0); }, scalar("head_dim", 0)));
}

TEST(Validation, NextNMustBeAtLeastOne) {
  World w;
  w.next_n = 0;
  w.positions.clear();
  w.key3 = V3("key3", w.Bd, 0, w.D);
  w.gate3 = V3("gate3", w.Bd, 0, w.D);
  expect_rejected(w, kDecode, at_extent("positions", 1, 0));
}

TEST(Validation, DecodePositionsMustBeConsecutive) {
  // A gap, a repeat and a step back, each in a different live row.
  struct Bad {
    int row, column;
    std::vector<std::int32_t> positions;
  };
  for (Bad const& b : {Bad{1, 2, {8, -1, 10}}, Bad{0, 1, {3, 3, 4}},
                       Bad{2, 2, {-1, 6, 5}}}) {
    World w;
    for (int i = 0; i < w.next_n; ++i)
      w.positions[b.row * w.next_n + i] = b.positions[i];
    Expect const x{"positions", b.row,
                   std::to_string(b.positions[b.column]),
                   "row " + std::to_string(b.row) + ", column " +
                       std::to_string(b.column)};
    expect_rejected(w, kDecode, x);
  }
}

// Extents: D agrees between ape, key, gate, the ring and every output.
TEST(Validation, HeadDimMustAgree) {
  int const D = 8;
  {
    World w;
    w.key = V2("key", 14, D + 1);
    expect_rejected(w, kRaggedKeys, at_extent("key", 1, D + 1));
  }
  {
    World w;
    w.gate = V2("gate", 14, D + 1);
    expect_rejected(w, kRaggedKeys, at_extent("gate", 1, D + 1));
  }
  {
    World w;
    w.ape = F2("ape", K, D + 1);  // the ragged writers take D from ape
    expect_rejected(w, {Entry::compress, Entry::ring_close, Entry::step_fused,
                        Entry::step_unfused},
                    at_extent("key", 1, D));
    expect_rejected(w, kDecode, at_extent("tail", 3, D));
  }
  {
    World w;
    w.ring = Ring(w.space, kSlots, K, D + 1);
    expect_rejected(w, {Entry::ring_close, Entry::step_fused, Entry::step_unfused,
                        Entry::tail_update, Entry::decode_step},
                    at_extent("tail", 3, D + 1));
    expect_rejected(w, {Entry::seed_tail}, at_extent("key", 1, D));
  }
  {
    World w;
    w.key3 = V3("key3", w.Bd, w.next_n, D + 1);
    expect_rejected(w, kDecode, at_extent("key", 2, D + 1));
  }
  {
    World w;
    w.gate3 = V3("gate3", w.Bd, w.next_n, D + 1);
    expect_rejected(w, kDecode, at_extent("gate", 2, D + 1));
  }
  {
    World w;
    w.c_pooled = V2("compress.pooled", 2, D + 1);
    w.rc_pooled = V2("ring_close.pooled", 5, D + 1);
    w.tu_pooled = V3("tail_update.pooled", w.Bd, 1, D + 1);
    w.step_out = Out(w.space, Out::capacity_for(14, 4, K), 5, D + 1);
    w.decode_out = Out(w.space, 3, w.Bd, D + 1);
    w.scramble_outputs();
    expect_rejected(w, {Entry::compress, Entry::ring_close},
                    at_extent("pooled", 1, D + 1));
    expect_rejected(w, {Entry::tail_update}, at_extent("pooled", 2, D + 1));
    expect_rejected(w, {Entry::step_fused, Entry::step_unfused,
                        Entry::decode_step},
                    at_extent("out", 1, D + 1));
  }
}

// Extents: K agrees between ape and the ring.
TEST(Validation, KpoolMustAgree) {
  {
    World w;
    w.ring = Ring(w.space, kSlots, K + 1, w.D);
    expect_rejected(w, {Entry::step_fused, Entry::step_unfused, Entry::tail_update,
                        Entry::decode_step},
                    at_extent("tail", 2, K + 1));
    // ring_close checks the ring's kpool before its tail.
    expect_rejected(w, {Entry::ring_close}, Expect{"ring", -1, std::to_string(K + 1), "kpool"});
  }
  {
    World w;
    w.ape = F2("ape", K + 1, w.D);
    expect_rejected(w, {Entry::step_fused, Entry::step_unfused, Entry::tail_update,
                        Entry::decode_step},
                    at_extent("tail", 2, K));
    expect_rejected(w, {Entry::ring_close}, Expect{"ring", -1, std::to_string(K), "kpool"});
  }
  {
    World w;
    w.tail = V4("tail", kSlots, 3, K, w.D);  // keys and gates: 2
    expect_rejected(w, {Entry::ring_close, Entry::seed_tail, Entry::tail_update},
                    at_extent("tail", 1, 3));
  }
}

// The ring length R (tail extent 2) is a multiple of kpool and at least
// kpool (docs/ring.md), however the ring reaches the call.
TEST(Validation, RingLengthMustBeAMultipleOfKpool) {
  for (int R : {K + 2, K / 2, 0}) {
    SCOPED_TRACE("R = " + std::to_string(R));
    World w;
    w.tail = V4("tail", kSlots, 2, R, w.D);
    expect_rejected(w, {Entry::ring_close, Entry::tail_update},
                    at_extent("tail", 2, R));
    if (R > 0) {
      EXPECT_TRUE(ctor_rejects([&] { Ring r(w.space, kSlots, K, w.D, R); },
                               scalar("ring_length", R)));
    }
  }
  {
    // seed_tail reads no kpool: any R >= 1 is a ring it can fill.
    World w;
    w.tail = V4("tail", kSlots, 2, K + 2, w.D);
    EXPECT_NO_THROW(w.run(Entry::seed_tail));
  }
  {
    // A ring built for another kpool, even of a length this kpool divides.
    World w;
    w.ring = Ring(w.space, kSlots, K / 2, w.D, K);
    expect_rejected(w, {Entry::ring_close, Entry::tail_update, Entry::step_fused,
                        Entry::step_unfused, Entry::decode_step},
                    Expect{"ring", -1, std::to_string(K / 2), "kpool"});
  }
  {
    World w;
    w.ring = Ring(w.space, kSlots, K, w.D, 2 * K);
    hold_positions(w.ring, 0x7FFFFFFFu, 1);
    EXPECT_EQ(w.ring.ring_length(), 2 * K);
    EXPECT_EQ(w.ring.kpool(), K);
    for (Entry e : {Entry::ring_close, Entry::seed_tail, Entry::tail_update,
                    Entry::step_fused, Entry::step_unfused, Entry::decode_step})
      EXPECT_NO_THROW(w.run(e)) << label(e);
  }
}

// R = K * next_pow2(ceil((K + S) / K)) (docs/ring.md, "Sizing R").
TEST(Validation, ServingRingLength) {
  struct Case {
    int K, S, R;
  };
  for (Case const c : {Case{4, 0, 4}, Case{4, 1, 8}, Case{4, 3, 8}, Case{4, 4, 8},
                       Case{4, 5, 16}, Case{4, 7, 16}, Case{4, 12, 16}, Case{4, 13, 32},
                       Case{1, 0, 1}, Case{1, 1, 2}, Case{1, 7, 8}, Case{3, 1, 6},
                       Case{3, 4, 12}, Case{64, 1, 128}})
    EXPECT_EQ(Ring::serving_length(c.K, c.S), c.R) << "K " << c.K << " S " << c.S;
  for (auto const& bad : {std::make_pair(0, 1), std::make_pair(4, -1)}) {
    try {
      Ring::serving_length(bad.first, bad.second);
      ADD_FAILURE() << "serving_length(" << bad.first << ", " << bad.second << ") accepted";
    } catch (KPool::InvalidArgument const& e) {
      EXPECT_TRUE(check_message("KPool::Ring::serving_length", e,
                                bad.first < 1 ? scalar("kpool", 0) : scalar("drafts", -1)));
    }
  }
}

// Extents: B agrees between row_offsets (B + 1), cache_lengths, slot_idx and
// the outputs; in decode between positions, key, gate, slot_idx and outputs.
TEST(Validation, BatchSizeMustAgree) {
  {
    World w;
    w.cache_lengths.pop_back();
    expect_rejected(w, kRagged, at_extent("cache_lengths", 0, 4));
  }
  {
    World w;
    w.slot_idx.push_back(7);
    expect_rejected(w, kRaggedRing, at_extent("slot_idx", 0, 6));
  }
  {
    World w;
    w.dslots.pop_back();
    expect_rejected(w, kDecode, at_extent("slot_idx", 0, 3));
  }
  {
    World w;
    w.gate = V2("gate", 13, w.D);
    expect_rejected(w, kRaggedKeys, at_extent("gate", 0, 13));
  }
  {
    World w;
    w.key3 = V3("key3", w.Bd + 1, w.next_n, w.D);
    expect_rejected(w, kDecode, at_extent("key", 0, w.Bd + 1));
  }
  {
    World w;
    w.gate3 = V3("gate3", w.Bd - 1, w.next_n, w.D);
    expect_rejected(w, kDecode, at_extent("gate", 0, w.Bd - 1));
  }
  {
    World w;
    w.c_offsets = U32("compress.pool_row_offsets", 5);
    w.pro_offsets = U32("compute_pool_row_offsets.out", 7);
    w.rc_pooled = V2("ring_close.pooled", 4, w.D);
    w.tu_pooled = V3("tail_update.pooled", w.Bd + 1, 1, w.D);
    w.ex_out = I2("expand_topk.out", 15, KPool::expand_topk_width(2, K, true));
    w.scramble_outputs();
    expect_rejected(w, {Entry::compress}, at_extent("pool_row_offsets", 0, 5));
    expect_rejected(w, {Entry::pool_row_offsets},
                    at_extent("pool_row_offsets", 0, 7));
    expect_rejected(w, {Entry::ring_close}, at_extent("pooled", 0, 4));
    expect_rejected(w, {Entry::tail_update}, at_extent("pooled", 0, w.Bd + 1));
    expect_rejected(w, {Entry::expand_topk}, at_extent("out", 0, 15));
  }
  {
    World w;
    w.rc_closed = I32("ring_close.closed_pool", 6);
    w.tu_closed = I2("tail_update.closed_pool", w.Bd - 1, 1);
    w.step_out = Out(w.space, Out::capacity_for(14, 4, K), 4, w.D);
    w.decode_out = Out(w.space, 3, w.Bd - 1, w.D);
    w.scramble_outputs();
    expect_rejected(w, {Entry::ring_close}, at_extent("closed_pool", 0, 6));
    expect_rejected(w, {Entry::tail_update},
                    at_extent("closed_pool", 0, w.Bd - 1));
    expect_rejected(w, {Entry::step_fused, Entry::step_unfused},
                    Expect{"out", -1, "4", "max_batch"});
    expect_rejected(w, {Entry::decode_step},
                    Expect{"out", -1, std::to_string(w.Bd - 1), "max_batch"});
  }
}

// Extents: next_n agrees between positions, key, gate, and the two decode
// outputs of tail_update.
TEST(Validation, NextNMustAgree) {
  {
    World w;
    w.key3 = V3("key3", w.Bd, w.next_n + 1, w.D);
    expect_rejected(w, kDecode, at_extent("key", 1, w.next_n + 1));
  }
  {
    World w;
    w.gate3 = V3("gate3", w.Bd, w.next_n - 1, w.D);
    expect_rejected(w, kDecode, at_extent("gate", 1, w.next_n - 1));
  }
  {
    World w;
    w.tu_pooled = V3("tail_update.pooled", w.Bd, 2, w.D);
    w.scramble_outputs();
    expect_rejected(w, {Entry::tail_update}, at_extent("closed_pool", 1, 1));
  }
}

// Output capacities: room for every pool or column the call can produce.
TEST(Validation, OutputCapacityMustSuffice) {
  World w;
  w.c_pooled = V2("compress.pooled", 1, w.D);  // 2 pools
  w.tu_pooled = V3("tail_update.pooled", w.Bd, 0, w.D);  // ceil(3 / 4) = 1
  w.tu_closed = I2("tail_update.closed_pool", w.Bd, 0);
  w.step_out = Out(w.space, Out::capacity_for(14, 4, K) - 1, 5, w.D);
  w.decode_out = Out(w.space, 2, w.Bd, w.D);  // 3 rows * 1
  w.ex_out = I2("expand_topk.out", 16, KPool::expand_topk_width(2, K, true) - 1);
  w.scramble_outputs();
  expect_rejected(w, {Entry::compress}, at_extent("pooled", 0, 1));
  expect_rejected(w, {Entry::tail_update}, at_extent("pooled", 1, 0));
  expect_rejected(w, {Entry::step_fused, Entry::step_unfused},
                  at_extent("out", 0, Out::capacity_for(14, 4, K) - 1));
  expect_rejected(w, {Entry::decode_step}, at_extent("out", 0, 2));
  expect_rejected(w, {Entry::expand_topk},
                  at_extent("out", 1, KPool::expand_topk_width(2, K, true) - 1));
  // An empty StepOutput.
  w.step_out = Out();
  w.decode_out = Out();
  expect_rejected(w, {Entry::step_fused, Entry::step_unfused,
                      Entry::decode_step},
                  Expect{"out", -1, "an empty StepOutput", ""});
}

// ---------------------------------------------------------------------------
// Defence in depth: validation off.
// ---------------------------------------------------------------------------

// Shape errors cost nothing to check and still throw.
TEST(DefenceInDepth, ShapeErrorsThrowWithValidationOff) {
  {
    World w;
    w.opts.validate = false;
    w.key = V2("key", 14, w.D + 1);
    expect_rejected(w, kRaggedKeys, at_extent("key", 1, w.D + 1));
  }
  {
    World w;
    w.opts.validate = false;
    w.cache_lengths.pop_back();
    expect_rejected(w, kRagged, at_extent("cache_lengths", 0, 4));
  }
  {
    World w;
    w.opts.validate = false;
    w.num_requests = 6;
    w.dnum = 5;
    expect_rejected(w, kRagged, scalar("num_requests", 6));
    expect_rejected(w, kDecode, scalar("num_requests", 5));
  }
  {
    World w;
    w.opts.validate = false;
    w.dslots.pop_back();
    w.slot_idx.pop_back();
    expect_rejected(w, kDecode, at_extent("slot_idx", 0, 3));
    expect_rejected(w, kRaggedRing, at_extent("slot_idx", 0, 4));
  }
  {
    World w;
    w.opts.validate = false;
    w.tu_pooled = V3("tail_update.pooled", w.Bd, 0, w.D);
    w.tu_closed = I2("tail_update.closed_pool", w.Bd, 0);
    w.step_out = Out(w.space, Out::capacity_for(14, 4, K) - 1, 5, w.D);
    w.decode_out = Out(w.space, 2, w.Bd, w.D);
    w.ex_out = I2("expand_topk.out", 16, 10);
    w.rc_closed = I32("ring_close.closed_pool", 4);
    w.scramble_outputs();
    expect_rejected(w, {Entry::tail_update}, at_extent("pooled", 1, 0));
    expect_rejected(w, {Entry::step_fused, Entry::step_unfused},
                    at_extent("out", 0, Out::capacity_for(14, 4, K) - 1));
    expect_rejected(w, {Entry::decode_step}, at_extent("out", 0, 2));
    expect_rejected(w, {Entry::expand_topk}, at_extent("out", 1, 10));
    expect_rejected(w, {Entry::ring_close}, at_extent("closed_pool", 0, 4));
  }
  {
    World w;
    w.opts.validate = false;
    w.next_n = 0;
    w.positions.clear();
    w.key3 = V3("key3", w.Bd, 0, w.D);
    w.gate3 = V3("gate3", w.Bd, 0, w.D);
    expect_rejected(w, kDecode, at_extent("positions", 1, 0));
  }
  {
    World w;
    w.opts.validate = false;
    w.ape = F2("ape", 0, w.D);
    w.ids_cache = KPool::PoolCache<float, M>();
    expect_rejected(w, {Entry::compress, Entry::ring_close, Entry::step_fused,
                        Entry::step_unfused, Entry::tail_update, Entry::decode_step},
                    at_extent("ape", 0, 0));
    expect_rejected(w, {Entry::pool_row_offsets}, scalar("kpool", 0));
    expect_rejected(w, {Entry::expand_topk}, Expect{"cache", -1, "0", "kpool"});
  }
}

// Every entry point with validation off on w: the ring slots of `ragged`
// and those of the first 3 decode rows are the only ones valid rows own.
void run_all_unvalidated(World& w, std::set<std::uint32_t> const& ragged) {
  Allowed const a{ragged, {w.dslots.begin(), w.dslots.begin() + 3}, token_rows(w)};
  for (Entry e : all_entries()) run_unvalidated(w, e, a);
}

TEST(DefenceInDepth, SlotOutOfRangeWritesNoRingSlot) {
  for (int D : defence_dims())
    for (std::uint32_t bad : {std::uint32_t(kSlots), 0xFFFFFFFEu}) {
      World w(D);
      w.slot_idx[0] = bad;      // row 0 seeds the ring
      w.slot_idx[1] = bad + 1;  // row 1 closes a pool from it
      w.dslots[0] = bad;        // row 0 stashes and closes
      Allowed a{{w.slot_idx[2], w.slot_idx[3]},
                {w.dslots[1], w.dslots[2]},
                token_rows(w)};
      for (Entry e : all_entries()) run_unvalidated(w, e, a);
    }
}

TEST(DefenceInDepth, DuplicateSlotsStayWithinTheirSlot) {
  for (int D : defence_dims()) {
    World w(D);
    w.slot_idx[3] = w.slot_idx[1];
    w.dslots[1] = w.dslots[0];
    run_all_unvalidated(w, {w.slot_idx[0], w.slot_idx[1], w.slot_idx[2], w.slot_idx[3]});
  }
}

TEST(DefenceInDepth, DecreasingRowOffsetsStayInBounds) {
  for (int D : defence_dims()) {
    World w(D);
    // Request 1 runs backwards from 13 to 2; requests 2 and 3 then cover
    // rows 2..14 (valid on their own).
    w.row_offsets = {0, 13, 2, 12, 14, 3};
    run_all_unvalidated(w, {w.slot_idx[0], w.slot_idx[2], w.slot_idx[3]});
  }
}

TEST(DefenceInDepth, RowOffsetsPastKeyRowsReadNothingPastThem) {
  for (int D : defence_dims())
    for (std::uint32_t past : {17u, 1000u, 0xFFFFFFF0u}) {
      World w(D);
      // Requests 2 and 3 end past the 14 key rows (and the 16 id rows).
      w.row_offsets = {0, 9, 12, past, past, 3};
      run_all_unvalidated(w, {w.slot_idx[0], w.slot_idx[1]});
    }
}

TEST(DefenceInDepth, CacheLengthOverflowStaysInBounds) {
  for (int D : defence_dims())
    for (std::uint32_t c : {kInt32Max - 2, 0xFFFFFFFEu}) {
      World w(D);
      w.cache_lengths[1] = c;  // 3 rows past INT32_MAX
      w.cache_lengths[3] = 0xFFFFFFFFu;
      run_all_unvalidated(w, {w.slot_idx[0], w.slot_idx[2]});
    }
}

// Non-consecutive positions: every real position closes a pool, three per
// row where the outputs have room for one per row.
TEST(DefenceInDepth, NonConsecutiveDecodePositionsCloseNoMoreThanOutputsHold) {
  for (int D : defence_dims()) {
    World w(D);
    w.positions = {3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43, 47};
    Allowed a{{}, {w.dslots.begin(), w.dslots.begin() + 3}, token_rows(w)};
    for (Entry e : kDecode) run_unvalidated(w, e, a);
    // Padding and garbage positions mixed in.
    World g(D);
    g.positions = {2147483647, -1, 3, 7, -7, 2147483643, 11, 11, 11, 0, 0, 0};
    for (Entry e : kDecode) run_unvalidated(g, e, a);
  }
}

}  // namespace

namespace {

// expand_topk writes int32 positions: with validation off, a row whose
// visible count passes int32 is skipped like any invalid request, never
// written as wrapped (negative) indices.
TEST(DefenceInDepth, ExpandRowPastInt32PositionsIsSkipped) {
  using E = Kokkos::DefaultExecutionSpace;
  using M = E::memory_space;
  int const K = 4, width = KPool::expand_topk_width(1, K, true);
  Kokkos::View<std::int32_t**, M> ids("ids", 2, 1), out("out", 2, width);
  Kokkos::View<std::uint32_t*, M> row_offsets("row_offsets", 3), cache("cache_lengths", 2);
  auto hi = Kokkos::create_mirror_view(ids);
  auto ho = Kokkos::create_mirror_view(row_offsets);
  auto hc = Kokkos::create_mirror_view(cache);
  hi(0, 0) = 1073741819;  // complete within the wrapped visible count
  hi(1, 0) = 0;
  ho(0) = 0;
  ho(1) = 1;
  ho(2) = 2;
  hc(0) = 0xFFFFFFF0u;  // visible = 2^32 - 15: past int32
  hc(1) = 5;            // a valid row beside it
  Kokkos::deep_copy(ids, hi);
  Kokkos::deep_copy(row_offsets, ho);
  Kokkos::deep_copy(cache, hc);
  Kokkos::deep_copy(out, -77);
  KPool::Options o;
  o.validate = false;
  KPool::expand_topk(E(), ids, true, KPool::ragged_batch(row_offsets, cache, 2),
                     KPool::PoolCache<float, M>(E(), 1, 1, 1, K), out, o);
  auto const h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
  for (int j = 0; j < width; ++j) EXPECT_EQ(h(0, j), -77) << "column " << j;
  // Row 1: visible 6, pool 0 complete, tail positions 4 and 5.
  std::int32_t const want[] = {0, 1, 2, 3, 4, 5, -1};
  for (int j = 0; j < width; ++j) EXPECT_EQ(h(1, j), want[j]) << "column " << j;
}

}  // namespace
