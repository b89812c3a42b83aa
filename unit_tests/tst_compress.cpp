// compress against the f64 reference (docs/writers.md, "compress").

#include <KPoolTestUtils.hpp>

namespace {

using namespace KPoolTest;

template <class C>
class Compress : public ::testing::Test {};
TYPED_TEST_SUITE(Compress, Configs, ConfigName);

// Runs compress on `live` requests (padded to B rows) and checks offsets,
// every pooled row, and that rows past the last pool stay untouched.
template <class C, class KeyView, class GateView>
void check_compress(int K, int D, TestBatch const& batch, Matrix const& key,
                    Matrix const& gate, Matrix const& ape, KeyView const& kv,
                    GateView const& gv, std::string const& what) {
  using T = typename C::value_type;
  using E = typename C::execution_space;
  using M = typename C::memory_space;
  using U32 = Kokkos::View<std::uint32_t*, M>;
  SCOPED_TRACE(what + " " + shape(K, D));
  E space;
  auto const ref = KPoolRef::compress(key, gate, ape, batch.reference);
  int const B = static_cast<int>(batch.device.cache_lengths.size());
  int const total = static_cast<int>(ref.pool_row_offsets[B]);
  int const spare = 3;
  Kokkos::View<T**, Kokkos::LayoutRight, M> pooled("pooled", total + spare, D);
  T const sentinel = to_storage<T>(-12345.0);
  Kokkos::deep_copy(pooled, sentinel);
  U32 offsets("pool_row_offsets", B + 1);
  KPool::compress(space, kv, gv, ape_view<M>(ape),
                  to_index_view<U32>(batch.device.row_offsets, "row_offsets"),
                  to_index_view<U32>(batch.device.cache_lengths, "cache_lengths"),
                  batch.device.num_requests, offsets, pooled,
                  test_options<E>());
  auto const ho = on_host(offsets);
  for (int r = 0; r <= B; ++r)
    ASSERT_EQ(ho(r), ref.pool_row_offsets[r]) << "pool_row_offsets row " << r;
  auto const hp = on_host(pooled);
  for (int o = 0; o < total; ++o)
    ASSERT_TRUE(pool_matches(C::dtype, &hp(o, 0), 1, ref.pooled.row(o),
                             ref.scale.row(o), D))
        << "pool row " << o << " (request " << ref.request[o] << ", pool "
        << ref.pool_id[o] << ")";
  for (int o = total; o < total + spare; ++o)
    for (int c = 0; c < D; ++c)
      ASSERT_TRUE(same_bits(hp(o, c), sentinel))
          << "row " << o << " past the last pool was written";
}

// A batch with every request kind the spec names: a fresh prefill, a
// continuation whose cache length is not a multiple of K, an empty
// request, one too short to complete a pool, one that ends exactly on a
// pool boundary, and dead rows past num_requests.
std::vector<std::pair<std::uint32_t, std::uint32_t>> mixed_requests(int K) {
  std::uint32_t const k = K;
  return {{0, 3 * k + 1},
          {k + 1, 2 * k + 3},
          {5, 0},
          {1, k > 2 ? k - 2 : 0},
          {2 * k, k},
          {k - 1, 1},
          {7 * k + 2, 5 * k}};
}

TYPED_TEST(Compress, MatchesReferenceForEveryShape) {
  using C = TypeParam;
  using M = typename C::memory_space;
  for (int K : k_grid())
    for (int D : d_grid()) {
      Rng rng(1000 * K + D);
      TestBatch const batch = make_batch(mixed_requests(K), 9, rng);
      auto const [rows, key, gate, ape] = ragged_inputs(rng, C::dtype, batch, K, D);
      check_compress<C>(K, D, batch, key, gate, ape,
                        to_view<typename C::value_type, M>(key, "key"),
                        to_view<typename C::value_type, M>(gate, "gate"),
                        "contiguous");
    }
}

TYPED_TEST(Compress, StridedKeyAndGateFromOneBuffer) {
  using C = TypeParam;
  using T = typename C::value_type;
  using M = typename C::memory_space;
  for (int K : {1, 3, 4})
    for (int D : {1, 7, 128}) {
      Rng rng(7 + K * D);
      TestBatch const batch = make_batch(mixed_requests(K), 8, rng);
      auto const [rows, key, gate, ape] = ragged_inputs(rng, C::dtype, batch, K, D);
      auto const in = interleaved<T, M>(key, gate);
      check_compress<C>(K, D, batch, key, gate, ape, in.key, in.gate,
                        "halves of [T, 2D]");
      // LayoutLeft: channel stride is the row count, the generic path.
      Kokkos::View<T**, Kokkos::LayoutLeft, M> kl("key_left", rows, D),
          gl("gate_left", rows, D);
      Kokkos::deep_copy(kl, to_view<T, M>(key, "k"));
      Kokkos::deep_copy(gl, to_view<T, M>(gate, "g"));
      check_compress<C>(K, D, batch, key, gate, ape, kl, gl,
                        "LayoutLeft");
    }
}

TYPED_TEST(Compress, ManyRequestsFindTheirRows) {
  using C = TypeParam;
  using T = typename C::value_type;
  using M = typename C::memory_space;
  int const K = 4, D = 128;
  Rng rng(99);
  std::vector<std::pair<std::uint32_t, std::uint32_t>> live;
  for (int r = 0; r < 300; ++r)
    live.emplace_back(rng.below(40), rng.below(3) == 0 ? 0 : rng.below(30));
  TestBatch const batch = make_batch(live, 310, rng);
  auto const [rows, key, gate, ape] = ragged_inputs(rng, C::dtype, batch, K, D);
  check_compress<C>(K, D, batch, key, gate, ape, to_view<T, M>(key, "key"),
                    to_view<T, M>(gate, "gate"), "300 requests");
}

TYPED_TEST(Compress, NoLiveRequestsWritesNoPool) {
  using C = TypeParam;
  using T = typename C::value_type;
  using M = typename C::memory_space;
  Rng rng(5);
  TestBatch const batch = make_batch({}, 4, rng);
  Matrix const key = random_matrix(rng, C::dtype, 16, 8, -2, 2);
  Matrix const ape = random_ape(rng, 4, 8);
  check_compress<C>(4, 8, batch, key, key, ape, to_view<T, M>(key, "key"),
                    to_view<T, M>(key, "gate"), "empty batch");
}

TYPED_TEST(Compress, PoolRowOffsetsHelperMatchesReference) {
  using C = TypeParam;
  using E = typename C::execution_space;
  using M = typename C::memory_space;
  using U32 = Kokkos::View<std::uint32_t*, M>;
  for (int K : k_grid()) {
    Rng rng(K);
    TestBatch const batch = make_batch(mixed_requests(K), 10, rng);
    int const rows = static_cast<int>(total_rows(batch.device));
    Matrix const key(rows, 1);
    auto const ref = KPoolRef::compress(key, key, Matrix(K, 1), batch.reference);
    U32 offsets("pool_row_offsets", 11);
    for (bool validate : {true, false}) {
      KPool::Options o;
      o.validate = validate;
      KPool::compute_pool_row_offsets(
          E(), to_index_view<U32>(batch.device.row_offsets, "row_offsets"),
          to_index_view<U32>(batch.device.cache_lengths, "cache_lengths"),
          batch.device.num_requests, K, rows, offsets, o);
      auto const h = on_host(offsets);
      for (int r = 0; r <= 10; ++r)
        ASSERT_EQ(h(r), ref.pool_row_offsets[r]) << "K=" << K << " row " << r;
    }
  }
}

}  // namespace
