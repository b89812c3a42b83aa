// The general step and the decode step (docs/writers.md, "The three in
// order" and "The steps"): the compacted output against the reference writers run in the
// spec's order, and the fused launch against the three-launch one.

#include <KPoolTestUtils.hpp>

#include <cstring>

namespace {

using namespace KPoolTest;

template <class C>
class Step : public ::testing::Test {};
TYPED_TEST_SUITE(Step, Configs, ConfigName);

// A serving batch: fresh prefills, chunk continuations, zero-token rows,
// single-token decodes, and requests whose ring pool closes.
std::vector<std::pair<std::uint32_t, std::uint32_t>> serving_batch(int K, Rng& rng) {
  std::uint32_t const k = K;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> v = {
      {0, 4 * k + 3}, {k + 1, 3 * k}, {7, 0}, {3 * k - 1, 1}, {2 * k, 1},
      {0, 0},         {5 * k + 2, k}, {1, 1}};
  for (int i = 0; i < 6; ++i) v.emplace_back(rng.below(9 * K), rng.below(3 * K));
  return v;
}

struct Expected {
  std::vector<int> batch_row;
  std::vector<std::int64_t> pool_id;
  Matrix pooled, scale;
  std::vector<std::uint32_t> offsets;
};

// The reference writers in the spec's order: per request its ring_close pool
// (if any) and then its compress pools; the ring then seeded.
Expected reference_step(Matrix const& key, Matrix const& gate, Matrix const& ape,
                        KPoolRef::Batch const& batch, KPoolRef::Ring& ring) {
  int const D = ape.cols;
  auto const closed = KPoolRef::ring_close(key, gate, ape, batch, ring);
  auto const pools = KPoolRef::compress(key, gate, ape, batch);
  KPoolRef::seed_tail(key, gate, batch, ring);
  Expected e;
  std::vector<std::vector<double>> rows, scales;
  e.offsets.push_back(0);
  int const B = static_cast<int>(batch.cache_lengths.size());
  for (int r = 0; r < B; ++r) {
    if (r < batch.num_requests && closed.closed_pool[r] >= 0) {
      e.batch_row.push_back(r);
      e.pool_id.push_back(closed.closed_pool[r]);
      rows.emplace_back(closed.pooled.row(r), closed.pooled.row(r) + D);
      scales.emplace_back(closed.scale.row(r), closed.scale.row(r) + D);
    }
    for (std::uint32_t o = pools.pool_row_offsets[r]; o < pools.pool_row_offsets[r + 1]; ++o) {
      e.batch_row.push_back(r);
      e.pool_id.push_back(pools.pool_id[o]);
      rows.emplace_back(pools.pooled.row(o), pools.pooled.row(o) + D);
      scales.emplace_back(pools.scale.row(o), pools.scale.row(o) + D);
    }
    e.offsets.push_back(static_cast<std::uint32_t>(e.batch_row.size()));
  }
  e.pooled = Matrix(static_cast<int>(rows.size()), D);
  e.scale = Matrix(static_cast<int>(rows.size()), D);
  for (std::size_t i = 0; i < rows.size(); ++i)
    for (int c = 0; c < D; ++c) {
      e.pooled.at(i, c) = rows[i][c];
      e.scale.at(i, c) = scales[i][c];
    }
  return e;
}

template <class C>
void check_output(KPool::StepOutput<typename C::value_type, typename C::memory_space> const& out,
                  Expected const& e, int B) {
  std::uint32_t const count = on_host(out.count())();
  ASSERT_EQ(count, e.batch_row.size()) << "count";
  auto const ho = on_host(out.offsets());
  for (int r = 0; r <= B; ++r) ASSERT_EQ(ho(r), e.offsets[r]) << "offsets row " << r;
  auto const hb = on_host(out.batch_row());
  auto const hi = on_host(out.pool_id());
  auto const hp = on_host(out.pooled());
  for (std::uint32_t o = 0; o < count; ++o) {
    ASSERT_EQ(hb(o), e.batch_row[o]) << "batch_row " << o;
    ASSERT_EQ(hi(o), e.pool_id[o]) << "pool_id " << o;
    ASSERT_TRUE(pool_matches(C::dtype, &hp(o, 0), 1, e.pooled.row(o),
                             e.scale.row(o), e.pooled.cols))
        << "output row " << o;
  }
  // The one-call host copy holds the same, sized for this call.
  using T = typename C::value_type;
  typename C::execution_space const space;
  EXPECT_EQ(out.batch_size(), B);
  for (auto parts : {KPool::StepOutputParts::ids, KPool::StepOutputParts::ids_and_pooled}) {
    KPool::HostStepOutput<T> const h = out.to_host(space, parts);
    ASSERT_EQ(h.count, e.batch_row.size()) << "to_host count";
    ASSERT_EQ(h.batch_size(), B);
    ASSERT_EQ(h.batch_row.extent(0), h.count);
    ASSERT_EQ(h.pool_id.extent(0), h.count);
    for (int r = 0; r <= B; ++r) ASSERT_EQ(h.offsets(r), e.offsets[r]) << "to_host offsets " << r;
    for (std::uint32_t o = 0; o < count; ++o) {
      ASSERT_EQ(h.batch_row(o), e.batch_row[o]) << "to_host batch_row " << o;
      ASSERT_EQ(h.pool_id(o), e.pool_id[o]) << "to_host pool_id " << o;
    }
    if (parts == KPool::StepOutputParts::ids) {
      ASSERT_EQ(h.pooled.size(), 0u);
      continue;
    }
    ASSERT_EQ(h.pooled.extent(0), h.count);
    ASSERT_EQ(h.pooled.extent(1), hp.extent(1));
    for (std::uint32_t o = 0; o < count; ++o)
      for (std::size_t c = 0; c < hp.extent(1); ++c)
        ASSERT_EQ(std::memcmp(&h.pooled(o, c), &hp(o, c), sizeof(T)), 0)
            << "to_host pooled " << o << ", " << c;
  }
}

TYPED_TEST(Step, GeneralStepMatchesTheWritersInOrder) {
  KPOOL_TEST_CONFIG_NAMES;
  for (int K : k_grid())
    for (int D : {1, 7, 128}) {
      for (bool fused : {true, false}) {
        SCOPED_TRACE(shape(K, D) + (fused ? " fused" : " three launches"));
        Rng rng(13 * K + D);
        int const slots = 20, B = 17;
        TestBatch const batch = make_batch(serving_batch(K, rng), B, rng, slots);
        auto const [rows, key, gate, ape] = ragged_inputs(rng, C::dtype, batch, K, D);
        KPoolRef::Ring ref_ring = random_ring(rng, C::dtype, slots, K, D);
        E space;
        auto ring = loaded_ring<T, M>(space, ref_ring);
        Expected const e = reference_step(key, gate, ape, batch.reference, ref_ring);

        KPool::StepOutput<T, M> out(
            space, KPool::StepOutput<T, M>::capacity_for(rows, B, K), B, D);
        BatchViews<M> const bv(batch.device);
        KPool::Options o = test_options<E>();
        o.fused = fused;
        KPool::step(space, ring, to_view<T, M>(key, "key"), to_view<T, M>(gate, "gate"),
                    ape_view<M>(ape),
                    KPool::ragged_batch(bv.row_offsets, bv.cache_lengths, bv.slot_idx,
                                        batch.device.num_requests),
                    out, o);
        check_output<C>(out, e, B);
        ASSERT_TRUE(ring_equals(ring, ref_ring));
      }
    }
}

// docs/writers.md asks the fused launch and the three launches for the same
// pools; KPool promises the same bits, ring included.
TYPED_TEST(Step, FusedAndThreeLaunchPathsAgreeBitForBit) {
  KPOOL_TEST_CONFIG_NAMES;
  for (int K : {1, 3, 4, 8})
    for (int D : {7, 128, 256}) {
      SCOPED_TRACE(shape(K, D));
      Rng rng(3 * K + D);
      int const slots = 40, B = 36;
      std::vector<std::pair<std::uint32_t, std::uint32_t>> live;
      for (int r = 0; r < 32; ++r) live.emplace_back(rng.below(6 * K), rng.below(5 * K));
      TestBatch const batch = make_batch(live, B, rng, slots);
      auto const [rows, key, gate, ape] = ragged_inputs(rng, C::dtype, batch, K, D, 6);
      KPoolRef::Ring const start = random_ring(rng, C::dtype, slots, K, D);
      E space;
      auto const kv = to_view<T, M>(key, "key");
      auto const gv = to_view<T, M>(gate, "gate");
      auto const av = ape_view<M>(ape);
      BatchViews<M> const bv(batch.device);
      auto const ragged = KPool::ragged_batch(bv.row_offsets, bv.cache_lengths, bv.slot_idx,
                                              batch.device.num_requests);
      std::size_t const cap = KPool::StepOutput<T, M>::capacity_for(rows, B, K);
      auto ring_f = loaded_ring<T, M>(space, start);
      auto ring_u = loaded_ring<T, M>(space, start);
      KPool::StepOutput<T, M> out_f(space, cap, B, D), out_u(space, cap, B, D);
      KPool::Options o = test_options<E>();
      o.fused = true;
      KPool::step(space, ring_f, kv, gv, av, ragged, out_f, o);
      o.fused = false;
      KPool::step(space, ring_u, kv, gv, av, ragged, out_u, o);
      std::uint32_t const n = on_host(out_f.count())();
      ASSERT_EQ(n, on_host(out_u.count())());
      ASSERT_GT(n, 0u);
      auto const pf = on_host(out_f.pooled()), pu = on_host(out_u.pooled());
      auto const bf = on_host(out_f.batch_row()), bu = on_host(out_u.batch_row());
      auto const jf = on_host(out_f.pool_id()), ju = on_host(out_u.pool_id());
      for (std::uint32_t i = 0; i < n; ++i) {
        ASSERT_EQ(bf(i), bu(i));
        ASSERT_EQ(jf(i), ju(i));
        for (int c = 0; c < D; ++c)
          ASSERT_TRUE(same_bits(pf(i, c), pu(i, c))) << "row " << i << " channel " << c;
      }
      auto const rf = on_host(ring_f.tail()), ru = on_host(ring_u.tail());
      for (std::size_t i = 0; i < rf.span(); ++i)
        ASSERT_TRUE(same_bits(rf.data()[i], ru.data()[i])) << "ring entry " << i;
    }
}

// The output bound floor(total_tokens / K) + B is reached: every request
// closes its ring pool and fills the rest with whole pools.
TYPED_TEST(Step, CapacityBoundIsEnoughForTheFullestBatch) {
  KPOOL_TEST_CONFIG_NAMES;
  int const K = 4, D = 16, B = 6;
  Rng rng(8);
  std::vector<std::pair<std::uint32_t, std::uint32_t>> live;
  for (int r = 0; r < B; ++r) live.emplace_back(4 * r + 1, 3 + 4 * r);  // have 1, n = 3 + 4r
  TestBatch const batch = make_batch(live, B, rng, B);
  int const rows = static_cast<int>(total_rows(batch.device));
  Matrix const key = random_matrix(rng, C::dtype, rows, D, -2, 2);
  Matrix const ape = random_ape(rng, K, D);
  KPoolRef::Ring ref_ring = random_ring(rng, C::dtype, B, K, D);
  E space;
  auto ring = loaded_ring<T, M>(space, ref_ring);
  Expected const e = reference_step(key, key, ape, batch.reference, ref_ring);
  std::size_t const cap = KPool::StepOutput<T, M>::capacity_for(rows, B, K);
  // Request r closes its ring pool and builds r whole pools.
  ASSERT_EQ(e.batch_row.size(), static_cast<std::size_t>(B + B * (B - 1) / 2));
  ASSERT_GE(cap, e.batch_row.size());
  KPool::StepOutput<T, M> out(space, cap, B, D);
  BatchViews<M> const bv(batch.device);
  KPool::step(space, ring, to_view<T, M>(key, "key"), to_view<T, M>(key, "gate"),
              ape_view<M>(ape),
              KPool::ragged_batch(bv.row_offsets, bv.cache_lengths, bv.slot_idx, B), out,
              test_options<E>());
  check_output<C>(out, e, B);
}

// A ring and a step output over the caller's buffers (Ring(tail, state,
// K), StepOutput(pooled, batch_row, pool_id, offsets): how an engine hands
// KPool its own tensors, docs/torch.md) are written in place, with the
// same pools and ring as the allocated ones'.
TYPED_TEST(Step, RingAndOutputOverTheCallersBuffers) {
  KPOOL_TEST_CONFIG_NAMES;
  int const K = 4, D = 16, B = 17, slots = 20, R = 8;
  Rng rng(21);
  TestBatch const batch = make_batch(serving_batch(K, rng), B, rng, slots);
  auto const [rows, key, gate, ape] = ragged_inputs(rng, C::dtype, batch, K, D);
  E space;
  // Fresh slots, R = 2K, against an allocated ring of the same R run alike
  // (the allocated ring's pools are checked against the reference above).
  using Ring = KPool::Ring<T, M>;
  typename Ring::tail_type tail("caller_tail", slots, 2, R, D);
  typename Ring::state_type state("caller_state", slots);
  Ring theirs(tail, state, K);
  Ring ours(space, slots, K, D, R);
  ASSERT_EQ(theirs.tail().data(), tail.data());
  ASSERT_EQ(theirs.state().data(), state.data());
  ASSERT_EQ(theirs.ring_length(), R);
  std::size_t const cap = KPool::StepOutput<T, M>::capacity_for(rows, B, K);
  Kokkos::View<T**, Kokkos::LayoutRight, M> pooled("caller_pooled", cap, D);
  Kokkos::View<std::int32_t*, M> batch_row("caller_batch_row", cap), pool_id("caller_pool_id", cap);
  Kokkos::View<std::uint32_t*, M> offsets("caller_offsets", B + 1);
  KPool::StepOutput<T, M> out_theirs(pooled, batch_row, pool_id, offsets);
  KPool::StepOutput<T, M> out_ours(space, cap, B, D);
  ASSERT_EQ(out_theirs.capacity(), cap);
  ASSERT_EQ(out_theirs.max_batch(), B);
  BatchViews<M> const bv(batch.device);
  // Fresh sequences: every row from position 0.
  std::vector<std::uint32_t> zeros(B, 0);
  auto const lengths = to_index_view<Kokkos::View<std::uint32_t*, M>>(zeros, "lengths");
  auto const b = KPool::ragged_batch(bv.row_offsets, lengths, bv.slot_idx,
                                     batch.device.num_requests);
  auto const kv = to_view<T, M>(key, "key");
  auto const gv = to_view<T, M>(gate, "gate");
  KPool::step(space, theirs, kv, gv, ape_view<M>(ape), b, out_theirs, test_options<E>());
  KPool::step(space, ours, kv, gv, ape_view<M>(ape), b, out_ours, test_options<E>());
  std::uint32_t const n = on_host(out_theirs.count())();
  ASSERT_EQ(n, on_host(out_ours.count())());
  ASSERT_GT(n, 0u);
  ASSERT_EQ(on_host(offsets)(B), n);
  auto const pt = on_host(pooled), po = on_host(out_ours.pooled());
  auto const bt = on_host(batch_row), bo = on_host(out_ours.batch_row());
  auto const it = on_host(pool_id), io = on_host(out_ours.pool_id());
  for (std::uint32_t i = 0; i < n; ++i) {
    ASSERT_EQ(bt(i), bo(i)) << i;
    ASSERT_EQ(it(i), io(i)) << i;
    for (int c = 0; c < D; ++c) ASSERT_TRUE(same_bits(pt(i, c), po(i, c))) << i << ", " << c;
  }
  auto const rt = on_host(tail), ro = on_host(ours.tail());
  for (std::size_t i = 0; i < rt.span(); ++i)
    ASSERT_TRUE(same_bits(rt.data()[i], ro.data()[i])) << "ring entry " << i;
  auto const st = on_host(state), so = on_host(ours.state());
  for (int s = 0; s < slots; ++s)
    for (int w = 0; w < 3; ++w) ASSERT_EQ(st(s, w), so(s, w)) << "slot " << s << " word " << w;
}

TEST(StepBuffers, BadCallerBuffersAreRefusedByName) {
  using M = Kokkos::DefaultExecutionSpace::memory_space;
  using Ring = KPool::Ring<float, M>;
  using Out = KPool::StepOutput<float, M>;
  auto const refused = [](auto&& make, char const* arg) {
    try {
      make();
      ADD_FAILURE() << "accepted; expected a refusal of " << arg;
    } catch (KPool::InvalidArgument const& e) {
      EXPECT_EQ(e.argument(), arg) << e.what();
    }
  };
  typename Ring::state_type state("state", 3);
  refused([&] { Ring(typename Ring::tail_type("t", 3, 2, 8, 4), state, 0); }, "kpool");
  refused([&] { Ring(typename Ring::tail_type("t", 3, 1, 8, 4), state, 4); }, "tail");
  refused([&] { Ring(typename Ring::tail_type("t", 3, 2, 6, 4), state, 4); }, "tail");
  refused([&] { Ring(typename Ring::tail_type("t", 3, 2, 8, 0), state, 4); }, "tail");
  refused([&] { Ring(typename Ring::tail_type("t", 4, 2, 8, 4), state, 4); }, "state");
  typename Out::pooled_type pooled("p", 10, 4);
  typename Out::index_type ten("i", 10), nine("j", 9);
  typename Out::offsets_type offsets("o", 3);
  refused([&] { Out(typename Out::pooled_type("p", 0, 4), ten, ten, offsets); }, "pooled");
  refused([&] { Out(pooled, nine, ten, offsets); }, "batch_row");
  refused([&] { Out(pooled, ten, nine, offsets); }, "pool_id");
  refused([&] { Out(pooled, ten, ten, typename Out::offsets_type("o", 1)); }, "offsets");
  Out const ok(pooled, ten, ten, offsets);
  EXPECT_EQ(ok.capacity(), 10u);
  EXPECT_EQ(ok.max_batch(), 2);
  EXPECT_EQ(ok.head_dim(), 4);
  EXPECT_EQ(ok.batch_size(), 2);
}

TYPED_TEST(Step, DecodeStepCompactsTailUpdatePools) {
  KPOOL_TEST_CONFIG_NAMES;
  for (int K : k_grid())
    for (int next_n : {1, 2, K + 1, 2 * K}) {
      int const D = 64;
      SCOPED_TRACE(shape(K, D) + " next_n=" + std::to_string(next_n));
      Rng rng(100 * K + next_n);
      int const B = 9, live = 8, slots = 11;
      std::vector<std::int32_t> positions(B * next_n, -1);
      std::vector<std::uint32_t> slot_idx(B);
      for (int r = 0; r < B; ++r) {
        slot_idx[r] = r < live ? static_cast<std::uint32_t>(slots - 1 - r) : 99u;
        std::int32_t pos = rng.below(6 * K);
        int const real = 1 + rng.below(next_n);
        for (int i = 0; i < real; ++i) positions[r * next_n + i] = pos++;
      }
      auto [key, gate, ape, ref_ring] = decode_inputs(rng, C::dtype, B * next_n, slots, K, D);
      E space;
      auto ring = loaded_ring<T, M>(space, ref_ring);
      auto const ref = KPoolRef::tail_update(next_n, key, gate, ape, positions,
                                             slot_idx, live, ref_ring);
      Expected e;
      e.offsets.push_back(0);
      std::vector<int> rows_of;
      for (int r = 0; r < B; ++r) {
        for (int j = 0; r < live && j < ref.M; ++j)
          if (ref.closed_pool[r * ref.M + j] >= 0) {
            e.batch_row.push_back(r);
            e.pool_id.push_back(ref.closed_pool[r * ref.M + j]);
            rows_of.push_back(r * ref.M + j);
          }
        e.offsets.push_back(static_cast<std::uint32_t>(e.batch_row.size()));
      }
      e.pooled = Matrix(static_cast<int>(rows_of.size()), D);
      e.scale = Matrix(static_cast<int>(rows_of.size()), D);
      for (std::size_t i = 0; i < rows_of.size(); ++i)
        for (int c = 0; c < D; ++c) {
          e.pooled.at(i, c) = ref.pooled[rows_of[i] * D + c];
          e.scale.at(i, c) = ref.scale[rows_of[i] * D + c];
        }
      auto const k3 = to_view3<T, M>(key, next_n, "key");
      auto const g3 = to_view3<T, M>(gate, next_n, "gate");
      auto const pos_v = positions_view<M>(positions, next_n);
      KPool::StepOutput<T, M> out(
          space, KPool::StepOutput<T, M>::capacity_for(B * next_n, B, K), B, D);
      KPool::step(space, ring, k3, g3, ape_view<M>(ape),
                  KPool::decode_batch(
                      pos_v, to_index_view<Kokkos::View<std::uint32_t*, M>>(slot_idx, "slot_idx"),
                      live),
                  out, test_options<E>());
      check_output<C>(out, e, B);
      ASSERT_TRUE(ring_equals(ring, ref_ring));
    }
}

}  // namespace
