// ring_close, seed_tail and tail_update against the f64 reference
// (docs/ring.md and docs/writers.md, "The writers").

#include <KPoolTestUtils.hpp>

namespace {

using namespace KPoolTest;

template <class C>
class RingWriters : public ::testing::Test {};
TYPED_TEST_SUITE(RingWriters, Configs, ConfigName);

// Requests covering every ring_close case: have == 0, have + n < K,
// have + n == K, have + n > K, n == 0 with have > 0.
std::vector<std::pair<std::uint32_t, std::uint32_t>> ring_requests(int K) {
  std::uint32_t const k = K;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> v = {
      {2 * k, 3},              // have == 0
      {k + 1, k - 1},          // have + n == K (K >= 2)
      {3 * k + 1, 3 * k + 2},  // have + n > K
      {k - 1, 0},              // n == 0
      {0, 2 * k + 1},          // fresh prefill
  };
  if (K >= 3) v.emplace_back(k + 1, k - 2);  // have + n < K
  if (K >= 2) v.emplace_back(5 * k - 1, 1);  // a single-token decode closing
  return v;
}

// ring_requests(K) in a batch of B rows over `slots` slots, its inputs,
// and a random ring standing for earlier calls, drawn in that order.
struct RingCase {
  TestBatch batch;
  RaggedInputs in;
  KPoolRef::Ring ring;
  RingCase(Rng& rng, DType t, int K, int D, int B, int slots)
      : batch(make_batch(ring_requests(K), B, rng, slots)),
        in(ragged_inputs(rng, t, batch, K, D)),
        ring(random_ring(rng, t, slots, K, D)) {}
  RingCase(Rng&& rng, DType t, int K, int D, int B, int slots)
      : RingCase(rng, t, K, D, B, slots) {}
};

// A writer's closed_pool and pooled for rows [0, live) as the reference's
// (a pool wherever one closed). ring_close writes one column per row
// (closed_pool [B], pooled [B, D]); tail_update Mcols (closed_pool
// [B, Mcols], pooled [B, Mcols, D]), its reference M = ceil(next_n / K):
// columns past M close nothing (-1).
inline int ref_columns(KPoolRef::RingCloseOut const&) { return 1; }
inline int ref_columns(KPoolRef::TailUpdateOut const& ref) { return ref.M; }
inline double const* ref_data(Matrix const& m) { return m.v.data(); }
inline double const* ref_data(std::vector<double> const& v) { return v.data(); }
template <class V>
auto closed_at(V const& h, int r, int j) {
  (void)j;
  if constexpr (V::rank == 1) return h(r);
  else return h(r, j);
}
template <class V>
auto const* pooled_at(V const& h, int r, int j) {
  (void)j;
  if constexpr (V::rank == 2) return &h(r, 0);
  else return &h(r, j, 0);
}

template <class C, class Closed, class Pooled, class Ref>
::testing::AssertionResult writer_matches(Closed const& closed, Pooled const& pooled,
                                          Ref const& ref, int live, int D) {
  auto const hc = on_host(closed);
  auto const hp = on_host(pooled);
  int const cols = Closed::rank == 1 ? 1 : static_cast<int>(hc.extent(1));
  int const M = ref_columns(ref);
  for (int r = 0; r < live; ++r)
    for (int j = 0; j < cols; ++j) {
      std::int32_t const got = closed_at(hc, r, j);
      std::int32_t const want = j < M ? ref.closed_pool[r * M + j] : -1;
      if (got != want)
        return ::testing::AssertionFailure() << "closed_pool(" << r << ", " << j << "): " << got
                                             << " != " << want;
      std::size_t const o = static_cast<std::size_t>(r) * M + j;
      if (want >= 0 && !pool_matches(C::dtype, pooled_at(hp, r, j), 1,
                                     ref_data(ref.pooled) + o * D, ref_data(ref.scale) + o * D, D))
        return ::testing::AssertionFailure() << "pool (" << r << ", " << j << ")";
    }
  return ::testing::AssertionSuccess();
}

TYPED_TEST(RingWriters, RingCloseMatchesReferenceAndOnlyReadsTheRing) {
  KPOOL_TEST_CONFIG_NAMES;
  for (int K : k_grid())
    for (int D : d_grid()) {
      SCOPED_TRACE(shape(K, D));
      int const B = 10;
      RingCase const rc(Rng(31 * K + D), C::dtype, K, D, B, 12);
      auto const& [rows, key, gate, ape] = rc.in;
      TestBatch const& batch = rc.batch;
      KPoolRef::Ring const& ref_ring = rc.ring;
      auto const ref = KPoolRef::ring_close(key, gate, ape, batch.reference, ref_ring);

      E space;
      auto ring = loaded_ring<T, M>(space, ref_ring);
      BatchViews<M> const bv(batch.device);
      Kokkos::View<T**, Kokkos::LayoutRight, M> pooled("pooled", B, D);
      T const sentinel = to_storage<T>(777.0);
      Kokkos::deep_copy(pooled, sentinel);
      Kokkos::View<std::int32_t*, M> closed("closed_pool", B);
      Kokkos::deep_copy(closed, -99);
      KPool::ring_close(space, ring, to_view<T, M>(key, "key"), to_view<T, M>(gate, "gate"),
                        ape_view<M>(ape),
                        KPool::ragged_batch(bv.row_offsets, bv.cache_lengths, bv.slot_idx,
                                            batch.device.num_requests),
                        pooled, closed, test_options<E>());
      auto const hc = on_host(closed);
      auto const hp = on_host(pooled);
      for (int r = 0; r < B; ++r) {
        std::int32_t const want =
            ref.closed_pool[r] == KPoolRef::kUntouched ? -99 : ref.closed_pool[r];
        ASSERT_EQ(hc(r), want) << "closed_pool row " << r;
        if (want >= 0) {
          ASSERT_TRUE(pool_matches(C::dtype, &hp(r, 0), 1, ref.pooled.row(r),
                                   ref.scale.row(r), D))
              << "row " << r;
        } else {
          for (int c = 0; c < D; ++c)
            ASSERT_TRUE(same_bits(hp(r, c), sentinel))
                << "row " << r << " closed nothing but pooled was written";
        }
      }
      ASSERT_TRUE(ring_equals(ring, ref_ring)) << "ring_close wrote the ring";
    }
}

TYPED_TEST(RingWriters, SeedTailKeepsTheCallsLastRingLengthPositions) {
  KPOOL_TEST_CONFIG_NAMES;
  for (int K : k_grid())
    for (int D : d_grid()) {
      SCOPED_TRACE(shape(K, D));
      RingCase rc(Rng(17 * K + D), C::dtype, K, D, 9, 12);
      auto const& [rows, key, gate, ape] = rc.in;
      TestBatch const& batch = rc.batch;

      E space;
      auto ring = loaded_ring<T, M>(space, rc.ring);
      KPoolRef::Ring& ref_ring = rc.ring;
      KPoolRef::seed_tail(key, gate, batch.reference, ref_ring);
      BatchViews<M> const bv(batch.device);
      auto const in = interleaved<T, M>(key, gate);  // strided rows too
      KPool::seed_tail(space, ring, in.key, in.gate,
                       KPool::ragged_batch(bv.row_offsets, bv.cache_lengths, bv.slot_idx,
                                           batch.device.num_requests),
                       test_options<E>());
      ASSERT_TRUE(ring_equals(ring, ref_ring));
    }
}

// Decode rows: next_n from 1 to 2K, padded entries anywhere in a row,
// rows of padding only, dead rows, and more output columns than needed.
TYPED_TEST(RingWriters, TailUpdateMatchesReferenceForEveryNextN) {
  KPOOL_TEST_CONFIG_NAMES;
  for (int K : k_grid())
    for (int D : d_grid()) {
      for (int next_n = 1; next_n <= 2 * K; next_n += (K >= 8 ? 3 : 1)) {
        SCOPED_TRACE(shape(K, D) + " next_n=" + std::to_string(next_n));
        Rng rng(1009 * K + 31 * D + next_n);
        int const B = 7, live = 5, slots = 9;
        int const Mcols = (next_n + K - 1) / K + (next_n % 2);
        std::vector<std::int32_t> positions(B * next_n, -1);
        std::vector<std::uint32_t> slot_idx(B);
        std::vector<std::uint32_t> perm(slots);
        for (int s = 0; s < slots; ++s) perm[s] = s;
        for (int s = slots - 1; s > 0; --s) std::swap(perm[s], perm[rng.below(s + 1)]);
        for (int r = 0; r < B; ++r) {
          slot_idx[r] = r < live ? perm[r] : 1000 + r;
          if (r == 3) continue;  // padding only
          std::int32_t pos = rng.below(5 * K + 3);
          for (int i = 0; i < next_n; ++i)
            positions[r * next_n + i] = rng.below(4) == 0 ? -1 : pos++;
        }
        auto [key, gate, ape, ref_ring] = decode_inputs(rng, C::dtype, B * next_n, slots, K, D);

        E space;
        auto ring = loaded_ring<T, M>(space, ref_ring);
        auto const ref = KPoolRef::tail_update(next_n, key, gate, ape, positions,
                                               slot_idx, live, ref_ring);
        auto const k3 = to_view3<T, M>(key, next_n, "key");
        auto const g3 = to_view3<T, M>(gate, next_n, "gate");
        auto const pos_v = positions_view<M>(positions, next_n);
        Kokkos::View<T***, Kokkos::LayoutRight, M> pooled("pooled", B, Mcols, D);
        Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> closed("closed", B, Mcols);
        Kokkos::deep_copy(closed, -99);
        KPool::tail_update(
            space, ring, k3, g3, ape_view<M>(ape),
            KPool::decode_batch(
                pos_v, to_index_view<Kokkos::View<std::uint32_t*, M>>(slot_idx, "slot_idx"), live),
            pooled, closed, test_options<E>());
        ASSERT_TRUE(writer_matches<C>(closed, pooled, ref, live, D));
        auto const hc = on_host(closed);
        for (int r = live; r < B; ++r)
          for (int j = 0; j < Mcols; ++j)
            ASSERT_EQ(hc(r, j), -99) << "closed_pool(" << r << ", " << j << ") of a dead row";
        ASSERT_TRUE(ring_equals(ring, ref_ring));
      }
    }
}

// A ring longer than K (docs/ring.md): ring_close reads
// members (p * K + m) % R, seed_tail keeps the call's last R positions at
// pos % R, tail_update stashes at pos % R and closes from (p * K + m) % R.
// Cache lengths spread over several ring turns, chunks longer than R, and
// decode rows that start below where the ring's last writes ended
// (rewinds).
TYPED_TEST(RingWriters, EveryWriterAddressesTheRingByPositionModR) {
  KPOOL_TEST_CONFIG_NAMES;
  for (int K : {1, 3, 4})
    for (int D : {7, 128})
      for (int R : {2 * K, 4 * K}) {
        SCOPED_TRACE(shape(K, D) + " R=" + std::to_string(R));
        Rng rng(4099 * K + 7 * D + R);
        int const slots = 9, B = 8;
        std::vector<std::pair<std::uint32_t, std::uint32_t>> live;
        for (int r = 0; r < 7; ++r) {
          std::uint32_t const c = rng.below(5 * R);
          std::uint32_t const n = r == 0 ? 0 : r == 1 ? R + 1 + rng.below(2 * K) : rng.below(R + 2);
          live.emplace_back(c, n);
        }
        TestBatch const batch = make_batch(live, B, rng, slots);
        auto const [rows, key, gate, ape] = ragged_inputs(rng, C::dtype, batch, K, D);
        KPoolRef::Ring const start = random_ring(rng, C::dtype, slots, K, D, R);
        E space;
        BatchViews<M> const bv(batch.device);
        auto const ragged = KPool::ragged_batch(bv.row_offsets, bv.cache_lengths, bv.slot_idx,
                                                batch.device.num_requests);
        auto const kv = to_view<T, M>(key, "key");
        auto const gv = to_view<T, M>(gate, "gate");

        // ring_close
        {
          auto const ref = KPoolRef::ring_close(key, gate, ape, batch.reference, start);
          auto ring = loaded_ring<T, M>(space, start);
          ASSERT_EQ(ring.ring_length(), R);
          Kokkos::View<T**, Kokkos::LayoutRight, M> pooled("pooled", B, D);
          Kokkos::View<std::int32_t*, M> closed("closed_pool", B);
          KPool::ring_close(space, ring, kv, gv, ape_view<M>(ape), ragged, pooled, closed,
                            test_options<E>());
          ASSERT_TRUE(
              writer_matches<C>(closed, pooled, ref, batch.device.num_requests, D));
          ASSERT_TRUE(ring_equals(ring, start)) << "ring_close wrote the ring";
        }
        // seed_tail
        {
          KPoolRef::Ring ref_ring = start;
          KPoolRef::seed_tail(key, gate, batch.reference, ref_ring);
          auto ring = loaded_ring<T, M>(space, start);
          KPool::seed_tail(space, ring, kv, gv, ragged, test_options<E>());
          ASSERT_TRUE(ring_equals(ring, ref_ring));
        }
        // tail_update: rows start anywhere in the ring's span, including
        // below positions the random ring stands for (a rewind).
        {
          int const next_n = 1 + rng.below(R + 2);
          int const Mcols = (next_n + K - 1) / K;
          std::vector<std::int32_t> positions(B * next_n, -1);
          std::vector<std::uint32_t> slot_idx(B);
          for (int r = 0; r < B; ++r) {
            slot_idx[r] = r;
            std::int32_t pos = rng.below(5 * R);
            for (int i = 0; i < next_n; ++i)
              positions[r * next_n + i] = rng.below(5) == 0 ? -1 : pos++;
          }
          Matrix const k = random_matrix(rng, C::dtype, B * next_n, D, -2, 2);
          Matrix const g = random_matrix(rng, C::dtype, B * next_n, D, -4, 4);
          KPoolRef::Ring ref_ring = start;
          int const live_rows = B - 1;
          auto const ref = KPoolRef::tail_update(next_n, k, g, ape, positions, slot_idx,
                                                 live_rows, ref_ring);
          auto ring = loaded_ring<T, M>(space, start);
          Kokkos::View<T***, Kokkos::LayoutRight, M> pooled("pooled", B, Mcols, D);
          Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> closed("closed", B, Mcols);
          KPool::tail_update(
              space, ring, to_view3<T, M>(k, next_n, "key"), to_view3<T, M>(g, next_n, "gate"),
              ape_view<M>(ape),
              KPool::decode_batch(
                  positions_view<M>(positions, next_n),
                  to_index_view<Kokkos::View<std::uint32_t*, M>>(slot_idx, "slot_idx"), live_rows),
              pooled, closed, test_options<E>());
          ASSERT_TRUE(writer_matches<C>(closed, pooled, ref, live_rows, D));
          ASSERT_TRUE(ring_equals(ring, ref_ring));
        }
      }
}


// One alignment predicate for every ring access: a ring row (slot, keys or
// gates, index) starts at data + slot stride(0) + which stride(1) + index
// stride(2), so 16-byte packets need the base and all three strides.
TEST(RingAlignment, OnePredicateChecksTheBaseAndEveryRowStride) {
  using V = Kokkos::View<float****, Kokkos::LayoutStride, Kokkos::HostSpace,
                         Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  Kokkos::View<float*, Kokkos::HostSpace> buffer("buffer", 512);
  auto const ring = [&](int offset, std::size_t s0, std::size_t s1, std::size_t s2) {
    return V(buffer.data() + offset, Kokkos::LayoutStride(3, s0, 2, s1, 4, s2, 8, 1));
  };
  using KPool::Details::ring_aligned;
  EXPECT_TRUE(ring_aligned(ring(0, 96, 40, 8)));
  EXPECT_FALSE(ring_aligned(ring(0, 97, 40, 8))) << "slot stride";
  EXPECT_FALSE(ring_aligned(ring(0, 96, 41, 8))) << "keys-to-gates stride";
  EXPECT_FALSE(ring_aligned(ring(0, 96, 40, 9))) << "ring index stride";
  EXPECT_FALSE(ring_aligned(ring(1, 96, 40, 8))) << "base";
  Kokkos::DefaultHostExecutionSpace space;
  EXPECT_TRUE(ring_aligned(KPool::Ring<float, Kokkos::HostSpace>(space, 3, 4, 8).tail()));
  EXPECT_FALSE(ring_aligned(KPool::Ring<float, Kokkos::HostSpace>(space, 3, 4, 6).tail()));
}

// A ring whose rows are all misaligned but slot 0's keys: strided over one
// buffer with odd slot and keys-to-gates strides (index rows D apart, so
// the base and stride(2) alone look aligned). The writers must take the
// unaligned path and still match the reference; with device shapes a
// packet at a misaligned address aborts, as a GPU would fault. No
// KPool::Ring has such strides (its view is LayoutRight), so the writers'
// implementation (what their ring forms launch) runs on the view itself,
// with no slot state (none checked or moved, as the retired view forms).
template <class T, class M>
struct OddRing {
  using view_type = Kokkos::View<T****, Kokkos::LayoutStride, M,
                                 Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  std::size_t s0, s1, s2;
  Kokkos::View<T*, M> buffer;
  view_type tail;

  OddRing(int slots, int K, int D)
      : s0(2 * (static_cast<std::size_t>(K) * D + 1) + 3),
        s1(static_cast<std::size_t>(K) * D + 1),
        s2(D),
        buffer("odd_ring", (slots - 1) * s0 + s1 + (K - 1) * s2 + D),
        tail(buffer.data(), Kokkos::LayoutStride(slots, s0, 2, s1, K, s2, D, 1)) {}

  std::size_t at(int s, int w, int m, int c) const {
    return s * s0 + w * s1 + m * s2 + c;
  }
  void load(KPoolRef::Ring const& ref) {
    auto h = Kokkos::create_mirror_view(buffer);
    for (int s = 0; s < ref.max_slots; ++s)
      for (int w = 0; w < 2; ++w)
        for (int m = 0; m < ref.R; ++m)
          for (int c = 0; c < ref.D; ++c) h(at(s, w, m, c)) = to_storage<T>(ref.at(s, w, m, c));
    Kokkos::deep_copy(buffer, h);
  }
  ::testing::AssertionResult equals(KPoolRef::Ring const& ref) const {
    auto const h = on_host(buffer);
    for (int s = 0; s < ref.max_slots; ++s)
      for (int w = 0; w < 2; ++w)
        for (int m = 0; m < ref.R; ++m)
          for (int c = 0; c < ref.D; ++c)
            if (!same_bits(h(at(s, w, m, c)), to_storage<T>(ref.at(s, w, m, c))))
              return ::testing::AssertionFailure()
                     << "ring slot " << s << (w ? " gate" : " key") << " index " << m
                     << " channel " << c;
    return ::testing::AssertionSuccess();
  }
};

TYPED_TEST(RingWriters, OddlyStridedRingTakesTheUnalignedPath) {
  KPOOL_TEST_CONFIG_NAMES;
  for (auto const& [K, D] : {std::pair<int, int>{4, 128}, {3, 64}}) {
    SCOPED_TRACE(shape(K, D));
    E space;
    Rng rng(5 * K + D);
    int const slots = 12, B = 10;
    {
      OddRing<T, M> odd(slots, K, D);
      ASSERT_FALSE(KPool::Details::ring_aligned(odd.tail));
      RingCase rc(rng, C::dtype, K, D, B, slots);
      auto const& [rows, key, gate, ape] = rc.in;
      TestBatch const& batch = rc.batch;
      KPoolRef::Ring& ref_ring = rc.ring;
      odd.load(ref_ring);
      BatchViews<M> const bv(batch.device);
      auto const kv = to_view<T, M>(key, "key");
      auto const gv = to_view<T, M>(gate, "gate");
      auto const ref = KPoolRef::ring_close(key, gate, ape, batch.reference, ref_ring);
      Kokkos::View<T**, Kokkos::LayoutRight, M> pooled("pooled", B, D);
      Kokkos::View<std::int32_t*, M> closed("closed_pool", B);
      KPool::Details::ring_close_impl(space, odd.tail, kv, gv, ape_view<M>(ape), bv.row_offsets,
                                      bv.cache_lengths, bv.slot_idx, batch.device.num_requests,
                                      pooled, closed, test_options<E>(),
                                      KPool::Details::RingSlots<M>());
      ASSERT_TRUE(writer_matches<C>(closed, pooled, ref, batch.device.num_requests, D))
          << "ring_close";
      KPoolRef::seed_tail(key, gate, batch.reference, ref_ring);
      KPool::Details::seed_tail_impl(space, odd.tail, kv, gv, bv.row_offsets, bv.cache_lengths,
                                     bv.slot_idx, batch.device.num_requests, test_options<E>(),
                                     KPool::Details::RingSlots<M>());
      ASSERT_TRUE(odd.equals(ref_ring)) << "seed_tail";
    }
    {
      OddRing<T, M> odd(slots, K, D);
      int const next_n = K + 1, live = 5;
      std::vector<std::int32_t> positions(B * next_n, -1);
      std::vector<std::uint32_t> slot_idx(B);
      for (int r = 0; r < B; ++r) {
        slot_idx[r] = r < live ? static_cast<std::uint32_t>(2 * r + 1) : 1000u + r;
        std::int32_t pos = rng.below(5 * K);
        for (int i = 0; i < next_n; ++i) positions[r * next_n + i] = pos++;
      }
      auto [key, gate, ape, ref_ring] = decode_inputs(rng, C::dtype, B * next_n, slots, K, D);
      odd.load(ref_ring);
      auto const ref = KPoolRef::tail_update(next_n, key, gate, ape, positions,
                                             slot_idx, live, ref_ring);
      int const Mcols = (next_n + K - 1) / K;
      Kokkos::View<T***, Kokkos::LayoutRight, M> pooled("pooled", B, Mcols, D);
      Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> closed("closed", B, Mcols);
      KPool::Details::tail_update_impl(
          space, odd.tail, to_view3<T, M>(key, next_n, "key"), to_view3<T, M>(gate, next_n, "gate"),
          ape_view<M>(ape), positions_view<M>(positions, next_n),
          to_index_view<Kokkos::View<std::uint32_t*, M>>(slot_idx, "slot_idx"), live, pooled,
          closed, test_options<E>(), KPool::Details::RingSlots<M>());
      ASSERT_TRUE(writer_matches<C>(closed, pooled, ref, live, D)) << "tail_update";
      ASSERT_TRUE(odd.equals(ref_ring)) << "tail_update";
    }
  }
}

}  // namespace
