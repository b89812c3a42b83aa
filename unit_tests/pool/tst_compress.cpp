// compress against the f64 reference (docs/writers.md, "compress").

#include <KPoolTestUtils.hpp>

#include <limits>
#include <utility>

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
                  KPool::ragged_batch(
                      to_index_view<U32>(batch.device.row_offsets, "row_offsets"),
                      to_index_view<U32>(batch.device.cache_lengths, "cache_lengths"),
                      batch.device.num_requests),
                  offsets, pooled, test_options<E>());
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

// check_compress on key and gate as strided views: the halves of one
// [T, 2D] buffer, and LayoutLeft copies (channel stride is the row count,
// the generic path). what: a prefix for both traces.
template <class C>
void check_compress_strided(int K, int D, TestBatch const& batch, int rows, Matrix const& key,
                            Matrix const& gate, Matrix const& ape, std::string const& what) {
  using T = typename C::value_type;
  using M = typename C::memory_space;
  auto const in = interleaved<T, M>(key, gate);
  check_compress<C>(K, D, batch, key, gate, ape, in.key, in.gate, what + "halves of [T, 2D]");
  Kokkos::View<T**, Kokkos::LayoutLeft, M> kl("key_left", rows, D), gl("gate_left", rows, D);
  Kokkos::deep_copy(kl, to_view<T, M>(key, "k"));
  Kokkos::deep_copy(gl, to_view<T, M>(gate, "g"));
  check_compress<C>(K, D, batch, key, gate, ape, kl, gl, what + "LayoutLeft");
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
  for (int K : {1, 3, 4})
    for (int D : {1, 7, 128}) {
      Rng rng(7 + K * D);
      TestBatch const batch = make_batch(mixed_requests(K), 8, rng);
      auto const [rows, key, gate, ape] = ragged_inputs(rng, C::dtype, batch, K, D);
      check_compress_strided<C>(K, D, batch, rows, key, gate, ape, "");
    }
}

// docs/pools.md: non-finite inputs propagate as IEEE
// arithmetic on the formulas does, the maximum subtracted first: a channel
// whose logits are all -inf, or include +inf or NaN, is NaN, and so is a
// -inf gate on an infinite key (weight exp(-inf) = 0 times infinity); an
// infinite key under a finite weight is infinite. On every storage type and
// every kernel path (compile-time K = 4, D = 128; any K and D; strided).
TYPED_TEST(Compress, NonFiniteInputsPropagateLikeTheReference) {
  using C = TypeParam;
  using T = typename C::value_type;
  using M = typename C::memory_space;
  double const inf = std::numeric_limits<double>::infinity();
  double const nan = std::numeric_limits<double>::quiet_NaN();
  for (auto const& [K, D] : {std::pair<int, int>{4, 128}, {3, 16}}) {
    Rng rng(31 * K + D);
    TestBatch const batch = make_batch({{0, 3 * K}, {K, 2 * K + 1}}, 2, rng);
    auto [rows, key, gate, ape] = ragged_inputs(rng, C::dtype, batch, K, D);
    // Pool p of the first request is rows [p K, (p + 1) K); pools 0 and 1
    // carry a special case in every channel, pool 2 none.
    for (int p = 0; p < 2; ++p)
      for (int c = 0; c < D; ++c) {
        int const row = p * K;
        switch ((c + p) % 10) {
          case 0:  // every logit -inf: -inf - (-inf) is NaN
            for (int m = 0; m < K; ++m) gate.at(row + m, c) = -inf;
            break;
          case 1: gate.at(row + 1, c) = inf; break;   // inf - inf
          case 2: gate.at(row + 2, c) = nan; break;   // NaN logit
          case 3: gate.at(row, c) = nan; break;       // NaN as the first maximum
          case 4: key.at(row + 1, c) = inf; break;    // infinite key, finite weight
          case 5: key.at(row, c) = nan; break;        // NaN key
          case 6:                                     // inf + (-inf)
            key.at(row, c) = inf;
            key.at(row + 1, c) = -inf;
            break;
          case 7: gate.at(row + 1, c) = -inf; break;  // weight 0, result finite
          case 8:                                     // 0 * inf
            gate.at(row + 1, c) = -inf;
            key.at(row + 1, c) = inf;
            break;
          default: break;
        }
      }
    check_compress<C>(K, D, batch, key, gate, ape, to_view<T, M>(key, "key"),
                      to_view<T, M>(gate, "gate"), "non-finite, contiguous");
    check_compress_strided<C>(K, D, batch, rows, key, gate, ape, "non-finite, ");
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
    // Only the extents are read: key rows from the key, K from ape.
    Kokkos::View<float**, M> key_rows("key", rows, 1), ape("ape", K, 1);
    for (bool validate : {true, false}) {
      KPool::Options o;
      o.validate = validate;
      KPool::compute_pool_row_offsets(
          E(), key_rows, ape,
          KPool::ragged_batch(to_index_view<U32>(batch.device.row_offsets, "row_offsets"),
                              to_index_view<U32>(batch.device.cache_lengths, "cache_lengths"),
                              batch.device.num_requests),
          offsets, o);
      auto const h = on_host(offsets);
      for (int r = 0; r <= 10; ++r)
        ASSERT_EQ(h(r), ref.pool_row_offsets[r]) << "K=" << K << " row " << r;
    }
  }
}

}  // namespace
