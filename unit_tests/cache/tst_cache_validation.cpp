// Bad input to the pool cache (docs/indexer.md, "Bad input";
// docs/validation.md): KPool::PoolCache, KPool::store_pools and KPool::load_pools
// throw KPool::InvalidArgument naming the entry point, the argument, the
// row and the value, before anything is written: every test checks the
// cache (and load_pools' output) byte for byte after the throw. One TEST
// per rule. Then defence in depth: with Options::validate off, pools whose
// blocks are bad are skipped and everything else is written as usual.
// The cache overloads of KPool::step (fused and three-launch, and with a
// decode batch) follow the same rules, and after a throw their ring,
// output and cache are all unchanged.

#include <KPoolCacheTestUtils.hpp>

#include <functional>
#include <limits>

namespace {

using namespace KPoolTest;
using namespace KPoolCacheTest;

using namespace KPoolTest::OnDefaultSpace;
using T = KPool::bfloat16;
using F8 = KPool::float8_e4m3;
using Out = KPool::StepOutput<T, M>;
using Table = Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M>;

constexpr int D = 16;
constexpr int kBlocks = 6;
constexpr int kBlockPools = 4;

// Runs f, which must throw KPool::InvalidArgument with these fields.
::testing::AssertionResult throws(std::function<void()> const& f, std::string const& entry,
                                  std::string const& argument, std::int64_t row,
                                  std::string const& value) {
  try {
    f();
  } catch (KPool::InvalidArgument const& ex) {
    if (ex.entry_point() != entry || ex.argument() != argument || ex.row() != row ||
        ex.value() != value)
      return ::testing::AssertionFailure()
             << "threw (" << ex.entry_point() << ", " << ex.argument() << ", row " << ex.row()
             << ", value " << ex.value() << "): " << ex.what();
    return ::testing::AssertionSuccess() << ex.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

// A cache full of random bytes, so "unchanged" means something.
// kpool: the cache's K, by default the one the steps' setups use.
template <class C>
KPool::PoolCache<C, M> random_cache(Rng& rng, KPool::CacheScale scale, bool rotate = false,
                                    int head_dim = D, int kpool = 4) {
  KPool::PoolCache<C, M> cache(E(), kBlocks, kBlockPools, head_dim, kpool, scale, rotate);
  auto hv = Kokkos::create_mirror_view(cache.values());
  auto* bytes = reinterpret_cast<unsigned char*>(hv.data());
  for (std::size_t i = 0; i < hv.size() * sizeof(C); ++i) bytes[i] = rng.next() & 0xFF;
  Kokkos::deep_copy(cache.values(), hv);
  auto hs = Kokkos::create_mirror_view(cache.scales());
  for (std::size_t i = 0; i < hs.size(); ++i) hs.data()[i] = static_cast<float>(rng.uniform(0, 1));
  Kokkos::deep_copy(cache.scales(), hs);
  return cache;
}

template <class C>
struct Snapshot {
  std::vector<std::uint8_t> values, scales;
  explicit Snapshot(KPool::PoolCache<C, M> const& c)
      : values(value_bytes(c)), scales(scale_bytes(c)) {}
  ::testing::AssertionResult unchanged(KPool::PoolCache<C, M> const& c) const {
    auto const v = same_bytes(value_bytes(c), values, sizeof(C), "values");
    if (!v) return v;
    return same_bytes(scale_bytes(c), scales, 4, "scales");
  }
};

Table table_of(std::vector<std::vector<std::int32_t>> const& rows) {
  Table t("block_table", rows.size(), rows.empty() ? 0 : rows[0].size());
  auto h = Kokkos::create_mirror_view(t);
  for (std::size_t r = 0; r < rows.size(); ++r)
    for (std::size_t c = 0; c < rows[r].size(); ++c) h(r, c) = rows[r][c];
  Kokkos::deep_copy(t, h);
  return t;
}

// A step output of two batch rows: row 0 pools 0..3, row 1 pools 4 and 9
// (ids need columns 0..2 with 4 pools a block).
template <class U>
KPool::StepOutput<U, M> two_row_output(Rng& rng, std::vector<int> rows = {0, 0, 0, 0, 1, 1},
                                       std::vector<int> ids = {0, 1, 2, 3, 4, 9}) {
  KPool::StepOutput<U, M> out(E(), rows.size() + 2, 2, D);
  std::vector<std::vector<double>> pools;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    std::vector<double> v(D);
    for (double& x : v) x = rng.uniform(-2, 2);
    pools.push_back(v);
  }
  fill_output(out, 2, rows, ids, pools);
  return out;
}

Table good_table() { return table_of({{0, 1, 2}, {3, 4, 5}}); }

// The cache with the good table: KPool::paged(cache, good_table()).
template <class C>
KPool::PagedCache<C, M> paged(KPool::PoolCache<C, M> const& cache) {
  return KPool::paged(cache, good_table());
}

// store_pools' batch of n live rows (only its num_requests is read).
KPool::Batch<M> live(int n) { return KPool::ragged_batch(U32(), U32(), n); }

KPool::Options validated() {
  KPool::Options o;
  o.validate = true;
  return o;
}

// store_pools of `out` for n live rows into the cache through `table`,
// validated: throws (argument, row, value), the cache byte for byte as it
// was.
template <class C, class U>
void expect_store_throws(KPool::PoolCache<C, M> const& cache, KPool::StepOutput<U, M> const& out,
                         int n, Table const& table, std::string const& argument,
                         std::int64_t row, std::string const& value) {
  Snapshot<C> const before(cache);
  EXPECT_TRUE(throws(
      [&] { KPool::store_pools(E(), out, live(n), KPool::paged(cache, table), validated()); },
      "KPool::store_pools", argument, row, value));
  EXPECT_TRUE(before.unchanged(cache));
}

// --- KPool::PoolCache ------------------------------------------------------

TEST(CacheValidation, PoolCacheSizesMustBePositive) {
  auto make = [](int nb, int bp, int d) {
    return [=]() { KPool::PoolCache<T, M> c(E(), nb, bp, d, 4); };
  };
  EXPECT_TRUE(throws(make(0, 4, D), "KPool::PoolCache", "num_blocks", -1, "0"));
  EXPECT_TRUE(throws(make(4, -1, D), "KPool::PoolCache", "block_pools", -1, "-1"));
  EXPECT_TRUE(throws(make(4, 4, 0), "KPool::PoolCache", "head_dim", -1, "0"));
}

TEST(CacheValidation, Fp8CacheNeedsAScale) {
  EXPECT_TRUE(throws([] { KPool::PoolCache<F8, M> c(E(), 2, 2, D, 4, KPool::CacheScale::none); },
                     "KPool::PoolCache", "scale", -1, "none"));
}

TEST(CacheValidation, NativeCacheTakesNoScale) {
  EXPECT_TRUE(throws([] { KPool::PoolCache<T, M> c(E(), 2, 2, D, 4, KPool::CacheScale::pow2); },
                     "KPool::PoolCache", "scale", -1, "pow2"));
}

TEST(CacheValidation, PoolCacheKpoolMustBePositive) {
  for (int k : {0, -3})
    EXPECT_TRUE(throws([&] { KPool::PoolCache<F8, M>(E(), kBlocks, kBlockPools, D, k); },
                       "KPool::PoolCache", "kpool", -1, std::to_string(k)));
  KPool::PoolCache<T, M> const with_k(E(), kBlocks, kBlockPools, D, 4);
  EXPECT_EQ(with_k.kpool(), 4);
  EXPECT_EQ(with_k.scale(), KPool::CacheScale::none);
  KPool::PoolCache<F8, M> const fp8(E(), kBlocks, kBlockPools, D, 2);
  EXPECT_EQ(fp8.kpool(), 2);
  EXPECT_EQ(fp8.scale(), KPool::CacheScale::amax);
  // The fused constructor takes K after head_dim too, and refuses one below 1.
  using Bytes = KPool::PoolCache<F8, M>::bytes_type;
  for (int k : {0, -1})
    EXPECT_TRUE(throws([&] { KPool::PoolCache<F8, M> c(Bytes("b", 2, 4 * (D + 4)), 4, D, k); },
                       "KPool::PoolCache", "kpool", -1, std::to_string(k)));
  EXPECT_EQ((KPool::PoolCache<F8, M>(Bytes("b", 2, 4 * (D + 4)), 4, D, 3)).kpool(), 3);
  // The fused constructor's earlier order (rotate, then K) does not compile.
  static_assert(!std::is_constructible<KPool::PoolCache<F8, M>, Bytes, int, int, bool>::value,
                "(bytes, block_pools, head_dim, rotate) is the old order");
  static_assert(!std::is_constructible<KPool::PoolCache<F8, M>, Bytes, int, int, bool, int>::value,
                "(bytes, block_pools, head_dim, rotate, kpool) is the old order");
  static_assert(std::is_constructible<KPool::PoolCache<F8, M>, Bytes, int, int, int, bool>::value,
                "(bytes, block_pools, head_dim, kpool, rotate)");
  // Nor does a cache without K.
  static_assert(!std::is_constructible<KPool::PoolCache<F8, M>, E, int, int, int,
                                       KPool::CacheScale>::value,
                "a cache without K");
}

TEST(CacheValidation, RotationNeedsAPowerOfTwoHeadDim) {
  EXPECT_TRUE(throws(
      [] { KPool::PoolCache<F8, M> c(E(), 2, 2, 48, 4, KPool::CacheScale::amax, true); },
      "KPool::PoolCache", "head_dim", -1, "48"));
  KPool::PoolCache<F8, M> ok(E(), 2, 2, 64, 4, KPool::CacheScale::amax, true);
  EXPECT_TRUE(ok.rotated());
}

// The serving profile (docs/indexer.md, "The serving profile") is fp8 with
// pow2 scales only.
TEST(CacheValidation, ServingProfileNeedsAnFp8Cache) {
  EXPECT_TRUE(throws(
      [] {
        KPool::PoolCache<T, M> c(E(), 2, 2, D, 4, KPool::CacheScale::none, false,
                                 KPool::CacheProfile::serving);
      },
      "KPool::PoolCache", "profile", -1, "serving"));
}

TEST(CacheValidation, ServingProfileNeedsPow2Scales) {
  EXPECT_TRUE(throws(
      [] {
        KPool::PoolCache<F8, M> c(E(), 2, 2, D, 4, KPool::CacheScale::amax, true,
                                  KPool::CacheProfile::serving);
      },
      "KPool::PoolCache", "scale", -1, "amax"));
  KPool::PoolCache<F8, M> ok(E(), 2, 2, D, 4, KPool::CacheScale::pow2, true,
                             KPool::CacheProfile::serving);
  EXPECT_EQ(ok.profile(), KPool::CacheProfile::serving);
  EXPECT_EQ(ok.layout(), KPool::CacheLayout::split);
}

// The fused layout (docs/indexer.md, "The engines' byte layout"): a block
// holds block_pools * (D + 4) bytes, its f32 scales are aligned, and its
// entries are fp8.
TEST(CacheValidation, FusedLayoutNeedsWholeAlignedBlocks) {
  using Bytes = KPool::PoolCache<F8, M>::bytes_type;
  EXPECT_TRUE(throws([] { KPool::PoolCache<F8, M> c(Bytes("b", 2, 4 * (D + 4) - 1), 4, D, 4); },
                     "KPool::PoolCache", "bytes", -1, std::to_string(4 * (D + 4) - 1)));
  EXPECT_TRUE(throws([] { KPool::PoolCache<F8, M> c(Bytes("b", 2, 3 * (7 + 4)), 3, 7, 4); },
                     "KPool::PoolCache", "head_dim", -1, "7"));
  EXPECT_TRUE(throws([] { KPool::PoolCache<F8, M> c(Bytes("b", 0, 4 * (D + 4)), 4, D, 4); },
                     "KPool::PoolCache", "num_blocks", -1, "0"));
  EXPECT_TRUE(throws([] { KPool::PoolCache<T, M> c(Bytes("b", 2, 4 * (D + 4)), 4, D, 4); },
                     "KPool::PoolCache", "bytes", -1, "bf16"));
  EXPECT_TRUE(throws([] { KPool::PoolCache<F8, M> c(Bytes("b", 2, 4 * (48 + 4)), 4, 48, 4, true); },
                     "KPool::PoolCache", "head_dim", -1, "48"));
  // A buffer one byte into an allocation: its scales would be misaligned.
  Kokkos::View<std::uint8_t*, M> raw("raw", 2 * 4 * (D + 4) + 4);
  Bytes const shifted(raw.data() + 1, 2, 4 * (D + 4));
  EXPECT_TRUE(throws([&] { KPool::PoolCache<F8, M> c(shifted, 4, D, 4); }, "KPool::PoolCache",
                     "bytes", -1, "data()"));
  KPool::PoolCache<F8, M> ok(Bytes("b", 2, 4 * (D + 4)), 4, D, 4, true);
  EXPECT_EQ(ok.profile(), KPool::CacheProfile::serving);
  EXPECT_EQ(ok.scale(), KPool::CacheScale::pow2);
  EXPECT_EQ(ok.layout(), KPool::CacheLayout::fused);
  EXPECT_EQ(ok.num_blocks(), 2);
  EXPECT_TRUE(ok.is_allocated());
}

// --- KPool::store_pools ------------------------------------------------------

TEST(CacheValidation, StoreCacheHeadDimMustBeThePools) {
  Rng rng(1);
  auto cache = random_cache<F8>(rng, KPool::CacheScale::amax, false, 2 * D);
  expect_store_throws(cache, two_row_output<T>(rng), 2, good_table(), "cache", -1,
                      std::to_string(2 * D));
}

TEST(CacheValidation, StoreFp8CacheNeedsPoolsThatAreNotF64) {
  Rng rng(2);
  auto cache = random_cache<F8>(rng, KPool::CacheScale::pow2);
  expect_store_throws(cache, two_row_output<double>(rng), 2, good_table(), "cache", -1,
                      "fp8_e4m3");
}

TEST(CacheValidation, StoreServingCacheNeedsPoolsThatAreNotF64) {
  Rng rng(2);
  KPool::PoolCache<F8, M> cache(E(), kBlocks, kBlockPools, D, 4, KPool::CacheScale::pow2, true,
                                KPool::CacheProfile::serving);
  expect_store_throws(cache, two_row_output<double>(rng), 2, good_table(), "cache", -1,
                      "fp8_e4m3");
}

// A fused cache (the engines' layout) is left byte for byte as it was too.
TEST(CacheValidation, StoreFusedBlocksMustBeAssigned) {
  Rng rng(4);
  KPool::PoolCache<F8, M>::bytes_type bytes("fused", kBlocks, kBlockPools * (D + 4));
  auto h = Kokkos::create_mirror_view(bytes);
  for (std::size_t i = 0; i < h.size(); ++i) h.data()[i] = rng.next() & 0xFF;
  Kokkos::deep_copy(bytes, h);
  KPool::PoolCache<F8, M> cache(bytes, kBlockPools, D, 4);
  Snapshot<F8> const before(cache);
  auto const out = two_row_output<T>(rng);
  expect_store_throws(cache, out, 2, table_of({{0, 1, 2}, {3, -1, 5}}), "block_table", 1, "-1");
  KPool::store_pools(E(), out, live(2), paged(cache), validated());
  EXPECT_FALSE(before.unchanged(cache));
}

TEST(CacheValidation, StoreCacheMustHaveStorage) {
  Rng rng(3);
  KPool::PoolCache<T, M> empty;
  auto const out = two_row_output<T>(rng);
  EXPECT_TRUE(throws([&] { KPool::store_pools(E(), out, live(2), paged(empty), validated()); },
                     "KPool::store_pools", "cache", -1, "an empty PoolCache"));
}

TEST(CacheValidation, StoreBlockTableNeedsARowPerRequest) {
  Rng rng(4);
  auto cache = random_cache<T>(rng, KPool::CacheScale::none);
  expect_store_throws(cache, two_row_output<T>(rng), 2, table_of({{0, 1, 2}}), "block_table", -1,
                      "1");
}

TEST(CacheValidation, StoreNumRequestsWithinTheOutput) {
  Rng rng(5);
  auto cache = random_cache<T>(rng, KPool::CacheScale::none);
  auto const out = two_row_output<T>(rng);
  expect_store_throws(cache, out, -1, good_table(), "num_requests", -1, "-1");
  expect_store_throws(cache, out, 3, good_table(), "num_requests", -1, "3");
}

// A pool of batch row 1 (its output row 5) while only row 0 is live.
TEST(CacheValidation, StoreOutputRowsBelongToLiveRequests) {
  Rng rng(6);
  auto cache = random_cache<F8>(rng, KPool::CacheScale::amax);
  expect_store_throws(cache, two_row_output<T>(rng, {0, 0, 0, 0, 0, 1}, {0, 1, 2, 3, 4, 5}), 1,
                      good_table(), "out", 5, "1");
}

TEST(CacheValidation, StoreBlocksMustBeAssigned) {
  Rng rng(7);
  auto cache = random_cache<F8>(rng, KPool::CacheScale::amax, true);
  // Row 1's pool 9 lives in column 2.
  expect_store_throws(cache, two_row_output<T>(rng), 2, table_of({{0, 1, 2}, {3, 4, -1}}),
                      "block_table", 1, "-1");
}

TEST(CacheValidation, StoreBlocksMustBeBelowNumBlocks) {
  Rng rng(8);
  auto cache = random_cache<T>(rng, KPool::CacheScale::none);
  expect_store_throws(cache, two_row_output<T>(rng), 2, table_of({{kBlocks, 1, 2}, {3, 4, 5}}),
                      "block_table", 0, std::to_string(kBlocks));
}

// Pool 9 needs column 9 / 4 = 2; the table has 2 columns.
TEST(CacheValidation, StoreBlockTableWideEnoughForEveryPool) {
  Rng rng(9);
  auto cache = random_cache<F8>(rng, KPool::CacheScale::pow2);
  expect_store_throws(cache, two_row_output<T>(rng), 2, table_of({{0, 1}, {3, 4}}),
                      "block_table", 1, "2");
}

// Unused columns may hold anything: only the blocks a write needs count.
TEST(CacheValidation, StoreIgnoresBlocksNoPoolNeeds) {
  Rng rng(10);
  auto cache = random_cache<T>(rng, KPool::CacheScale::none);
  auto const out = two_row_output<T>(rng, {0, 1}, {1, 5});
  EXPECT_NO_THROW(KPool::store_pools(
      E(), out, live(2), KPool::paged(cache, table_of({{0, -1, 99}, {-5, 4, 1000}})), validated()));
}

// --- KPool::load_pools -------------------------------------------------------

template <class C>
struct LoadSetup {
  KPool::PoolCache<C, M> cache;
  Kokkos::View<float***, Kokkos::LayoutRight, M> out;
  std::vector<std::uint8_t> out_before;
  explicit LoadSetup(Rng& rng, int head_dim = D)
      : cache(random_cache<C>(rng, KPool::PoolCache<C, M>::is_fp8 ? KPool::CacheScale::amax
                                                                  : KPool::CacheScale::none)),
        out("out", 2, 8, head_dim) {
    Kokkos::deep_copy(out, 3.5f);
    out_before = bytes();
  }
  std::vector<std::uint8_t> bytes() const {
    auto const h = on_host(out);
    std::vector<std::uint8_t> b(h.size() * 4);
    std::memcpy(b.data(), h.data(), b.size());
    return b;
  }
};

// load_pools' batch: row r's pools are [0, cache_lengths[r] / kK), kK the caches' K.
constexpr std::uint32_t kK = 4;
KPool::Batch<M> lengths(std::vector<std::uint32_t> const& cache_lengths) {
  return KPool::ragged_batch(U32("row_offsets", cache_lengths.size() + 1),
                             to_index_view<U32>(cache_lengths, "cache_lengths"),
                             static_cast<int>(cache_lengths.size()));
}

TEST(CacheValidation, LoadNumPoolsWithinTheOutput) {
  Rng rng(11);
  LoadSetup<F8> s(rng);
  Snapshot<F8> const before(s.cache);
  // Row 1 has 9 pools (out holds 8), or the most a cache length gives (a count
  // cannot be negative).
  for (std::uint32_t bad : {9 * kK, 0xFFFFFFFFu}) {
    EXPECT_TRUE(throws(
        [&] {
          KPool::load_pools(E(), lengths({3 * kK, bad}), paged(s.cache), s.out,
                            KPool::PoolDomain::cached, validated());
        },
        "KPool::load_pools", "batch", 1, std::to_string(bad / kK)));
    EXPECT_TRUE(same_bytes(s.bytes(), s.out_before, 4, "out"));
  }
  EXPECT_TRUE(before.unchanged(s.cache));
}

TEST(CacheValidation, LoadBlocksMustBeAssignedAndInRange) {
  Rng rng(12);
  LoadSetup<T> s(rng);
  Snapshot<T> const before(s.cache);
  // Row 0 reads pools 0..4: columns 0 and 1.
  for (std::int32_t bad : {-2, kBlocks}) {
    EXPECT_TRUE(throws(
        [&] {
          KPool::load_pools(E(), lengths({5 * kK, kK}),
                            KPool::paged(s.cache, table_of({{0, bad, 2}, {3, 4, 5}})), s.out,
                            KPool::PoolDomain::original, validated());
        },
        "KPool::load_pools", "block_table", 0, std::to_string(bad)));
    EXPECT_TRUE(same_bytes(s.bytes(), s.out_before, 4, "out"));
  }
  EXPECT_TRUE(throws(
      [&] {
        KPool::load_pools(E(), lengths({5 * kK, kK}), KPool::paged(s.cache, table_of({{0}, {3}})),
                          s.out, KPool::PoolDomain::cached, validated());
      },
      "KPool::load_pools", "block_table", 0, "1"));
  EXPECT_TRUE(same_bytes(s.bytes(), s.out_before, 4, "out"));
  EXPECT_TRUE(before.unchanged(s.cache));
}

TEST(CacheValidation, LoadOutputHeadDimMustBeTheCaches) {
  Rng rng(13);
  LoadSetup<F8> s(rng, D / 2);
  EXPECT_TRUE(throws(
      [&] {
        KPool::load_pools(E(), lengths({kK, kK}), paged(s.cache), s.out,
                          KPool::PoolDomain::cached, validated());
      },
      "KPool::load_pools", "out", -1, std::to_string(D / 2)));
  EXPECT_TRUE(same_bytes(s.bytes(), s.out_before, 4, "out"));
}

// --- Validation off ------------------------------------------------------------

// Bad blocks (unassigned, too large, a missing column), batch rows and pool
// ids out of range are skipped; every good pool is written exactly as with
// validation on; nothing else changes.
TEST(CacheValidation, StoreWithoutValidationSkipsBadPools) {
  Rng rng(14);
  KPool::Options off;
  off.validate = false;
  auto good = random_cache<F8>(rng, KPool::CacheScale::amax, true);
  auto cache = random_cache<F8>(rng, KPool::CacheScale::amax, true);
  Kokkos::deep_copy(cache.values(), good.values());
  Kokkos::deep_copy(cache.scales(), good.scales());
  // Rows: row 0's pools 0..3 (block 0, fine) and 4 (column 1: -1), row 1's
  // pool 9 (column 2: too large) and 100 (no column), batch rows -3 and 7,
  // and a negative pool id.
  auto const out = two_row_output<T>(rng, {0, 0, 0, 0, 0, 1, 1, -3, 7, 1},
                                     {0, 1, 2, 3, 4, 9, 100, 0, 0, -8});
  auto const table = table_of({{0, -1, 2}, {3, 4, 1 << 30}});
  KPool::store_pools(E(), out, live(2), KPool::paged(cache, table), off);
  // The same good pools, validated.
  auto const only_good = two_row_output<T>(rng, {0, 0, 0, 0}, {0, 1, 2, 3});
  Kokkos::deep_copy(Kokkos::subview(only_good.pooled(), std::make_pair(0, 4), Kokkos::ALL),
                    Kokkos::subview(out.pooled(), std::make_pair(0, 4), Kokkos::ALL));
  KPool::store_pools(E(), only_good, live(2), KPool::paged(good, table_of({{0, 1, 2}, {3, 4, 5}})),
                     validated());
  Snapshot<F8> const want(good);
  EXPECT_TRUE(want.unchanged(cache));
}

TEST(CacheValidation, LoadWithoutValidationSkipsBadPools) {
  Rng rng(15);
  KPool::Options off;
  off.validate = false;
  LoadSetup<F8> s(rng);
  Snapshot<F8> const before(s.cache);
  // Row 0 asks for 20 pools (more than out holds), column 1 unassigned;
  // row 1 for none (a count cannot be negative: a cache length short of a pool).
  KPool::load_pools(E(), lengths({20 * kK, kK - 1}),
                    KPool::paged(s.cache, table_of({{0, -1, 2}, {3, 4, 5}})), s.out,
                    KPool::PoolDomain::original, off);
  auto const h = on_host(s.out);
  for (int p = 0; p < 8; ++p)
    for (int c = 0; c < D; ++c) {
      // Pools 0..3 (block 0) were loaded; 4..7 (column 1) skipped; row 1
      // untouched.
      if (p >= 4) {
        ASSERT_EQ(h(0, p, c), 3.5f);
      } else {
        ASSERT_NE(h(0, p, c), 3.5f) << "pool " << p;
      }
      ASSERT_EQ(h(1, p, c), 3.5f);
    }
  EXPECT_TRUE(before.unchanged(s.cache));
}

// --- The steps' cache writes -------------------------------------------------

// Two requests, K = 4: row 0 (slot 1) sends positions 14..20, emitting pool
// 3 (its ring_close pool, block column 0) and pool 4 (column 1); row 1
// (slot 0) sends 0..9, emitting pools 0 and 1. The decode call: row 0
// sends 18..20 (pool 4), row 1 sends 1..3 (pool 0).
struct StepSetup {
  static constexpr int K = 4, B = 2, next_n = 3;
  enum class Path { fused, unfused, decode };

  KPool::Ring<T, M> ring{E(), 2, K, D};
  Kokkos::View<T**, Kokkos::LayoutRight, M> key{"key", 17, D}, gate{"gate", 17, D};
  Kokkos::View<float**, Kokkos::LayoutRight, M> ape{"ape", K, D};
  U32 row_offsets = to_index_view<U32>(std::vector<std::uint32_t>{0, 7, 17}, "ro");
  U32 cache_lengths = to_index_view<U32>(std::vector<std::uint32_t>{14, 0}, "cl");
  U32 slot_idx = to_index_view<U32>(std::vector<std::uint32_t>{1, 0}, "slots");
  Kokkos::View<T***, Kokkos::LayoutRight, M> dkey{"dkey", B, next_n, D},
      dgate{"dgate", B, next_n, D};
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> positions =
      positions_view<M>({18, 19, 20, 1, 2, 3}, next_n);
  Out out{E(), Out::capacity_for(17, B, K), B, D};

  explicit StepSetup(Rng& rng) {
    randomize(rng, key);
    randomize(rng, gate);
    randomize(rng, dkey);
    randomize(rng, dgate);
    randomize(rng, ring.tail());
    hold_positions(ring, 0x7FFFFFFFu, 1);  // stands for earlier calls
    randomize(rng, ape);
    randomize(rng, out.pooled());
    // Allocated uninitialized: give the rows a step leaves alone known values.
    Kokkos::deep_copy(out.batch_row(), -7);
    Kokkos::deep_copy(out.pool_id(), -7);
  }

  template <class V>
  static V random_view(Rng& rng, V const& v) {
    auto h = Kokkos::create_mirror_view(v);
    for (std::size_t i = 0; i < h.size(); ++i)
      h.data()[i] = to_storage<typename V::value_type>(rng.uniform(-2, 2));
    V copy("copy", v.layout());
    Kokkos::deep_copy(copy, h);
    return copy;
  }
  template <class V>
  static void randomize(Rng& rng, V const& v) {
    Kokkos::deep_copy(v, random_view(rng, v));
  }

  template <class C, class Table>
  void run(Path path, KPool::PoolCache<C, M>& cache, Table const& table,
           KPool::Options o) {
    if (path == Path::decode) {
      KPool::step(E(), ring, dkey, dgate, ape, KPool::decode_batch(positions, slot_idx, B),
                  KPool::paged(cache, table), out, o);
    } else {
      o.fused = path == Path::fused;
      KPool::step(E(), ring, key, gate, ape,
                  KPool::ragged_batch(row_offsets, cache_lengths, slot_idx, B),
                  KPool::paged(cache, table), out, o);
    }
  }

  // Everything a step writes besides the cache.
  std::vector<std::uint8_t> state() const {
    std::vector<std::uint8_t> b;
    auto add = [&](auto const& v) {
      auto const h = on_host(v);
      auto const* p = reinterpret_cast<std::uint8_t const*>(h.data());
      b.insert(b.end(), p, p + h.size() * sizeof(typename decltype(h)::value_type));
    };
    add(ring.tail());
    add(out.pooled());
    add(out.batch_row());
    add(out.pool_id());
    add(out.offsets());
    return b;
  }
};

char const* path_name(StepSetup::Path p) {
  return p == StepSetup::Path::fused     ? "fused step"
         : p == StepSetup::Path::unfused ? "three-launch step"
                                         : "decode step";
}

// The decode form's errors name KPool::step too.
std::string step_entry(StepSetup::Path) { return "KPool::step"; }

constexpr StepSetup::Path kPaths[] = {StepSetup::Path::fused, StepSetup::Path::unfused,
                                      StepSetup::Path::decode};

// A step that must throw (row, value as given) with nothing written: not
// the ring, not the output, not the cache.
template <class C, class Table>
void expect_step_throws(StepSetup::Path path, KPool::PoolCache<C, M>& cache,
                        Table const& table, KPool::Options o, std::string const& argument,
                        std::int64_t row, std::string const& value) {
  SCOPED_TRACE(path_name(path));
  Rng rng(99);
  StepSetup s(rng);
  Snapshot<C> const before(cache);
  std::vector<std::uint8_t> const state = s.state();
  EXPECT_TRUE(throws([&] { s.run(path, cache, table, o); }, step_entry(path), argument, row,
                     value));
  EXPECT_TRUE(before.unchanged(cache));
  EXPECT_TRUE(same_bytes(s.state(), state, 1, "ring and output"));
}

TEST(CacheValidation, StepBlocksMustBeAssigned) {
  Rng rng(20);
  auto cache = random_cache<F8>(rng, KPool::CacheScale::amax, true);
  // Row 0's pool 4 lives in column 1.
  for (auto path : kPaths)
    expect_step_throws(path, cache, table_of({{0, -1}, {3, 4}}), validated(), "block_table",
                       0, "-1");
}

TEST(CacheValidation, StepBlocksMustBeBelowNumBlocks) {
  Rng rng(21);
  auto cache = random_cache<F8>(rng, KPool::CacheScale::pow2);
  for (auto path : kPaths) {
    expect_step_throws(path, cache, table_of({{0, 1}, {kBlocks, 4}}), validated(),
                       "block_table", 1, std::to_string(kBlocks));
  }
}

TEST(CacheValidation, StepBlockTableWideEnoughForEveryPool) {
  Rng rng(22);
  auto cache = random_cache<T>(rng, KPool::CacheScale::none);
  // One column: row 0's pool 4 has none.
  for (auto path : kPaths)
    expect_step_throws(path, cache, table_of({{0}, {3}}), validated(), "block_table", 0, "1");
}

// Shapes, with validation off too. The block table has a row per live
// request, like the selections' (docs/validation.md): more rows are unread.
TEST(CacheValidation, StepBlockTableHasARowPerLiveRequest) {
  Rng rng(23);
  auto cache = random_cache<F8>(rng, KPool::CacheScale::amax);
  KPool::Options off;
  off.validate = false;
  for (auto path : kPaths) {
    expect_step_throws(path, cache, table_of({{0, 1}}), off, "block_table", -1, "1");
    SCOPED_TRACE(path_name(path));
    for (KPool::Options o : {off, validated()}) {
      StepSetup s(rng);
      EXPECT_NO_THROW(s.run(path, cache, table_of({{0, 1}, {2, 3}, {-4, 99}}), o));
    }
  }
}

// A cache built for K is written only from a ring of that K.
TEST(CacheValidation, StepCacheKpoolMustBeTheRings) {
  Rng rng(27);
  int const K = StepSetup::K;
  for (int other : {K / 2, 2 * K}) {
    auto cache = random_cache<F8>(rng, KPool::CacheScale::amax, false, D, other);
    EXPECT_EQ(cache.kpool(), other);
    for (auto path : kPaths)
      expect_step_throws(path, cache, good_table(), validated(), "cache", -1,
                         std::to_string(other));
  }
  auto cache = random_cache<F8>(rng, KPool::CacheScale::amax, false, D, K);
  for (auto path : kPaths) {
    SCOPED_TRACE(path_name(path));
    StepSetup s(rng);
    EXPECT_NO_THROW(s.run(path, cache, good_table(), validated()));
  }
}

TEST(CacheValidation, StepCacheHeadDimMustBeThePools) {
  Rng rng(24);
  auto cache = random_cache<F8>(rng, KPool::CacheScale::amax, true, D / 2);
  KPool::Options off;
  off.validate = false;
  for (auto path : kPaths)
    expect_step_throws(path, cache, good_table(), off, "cache", -1, std::to_string(D / 2));
}

TEST(CacheValidation, StepCacheMustHaveStorage) {
  KPool::PoolCache<F8, M> cache;
  for (auto path : kPaths) {
    SCOPED_TRACE(path_name(path));
    Rng rng(25);
    StepSetup s(rng);
    std::vector<std::uint8_t> const state = s.state();
    EXPECT_TRUE(throws([&] { s.run(path, cache, good_table(), validated()); },
                       step_entry(path), "cache", -1, "an empty PoolCache"));
    EXPECT_TRUE(same_bytes(s.state(), state, 1, "ring and output"));
  }
}

TEST(CacheValidation, StepFp8CacheNeedsPoolsThatAreNotF64) {
  using Out64 = KPool::StepOutput<double, M>;
  KPool::Ring<double, M> ring(E(), 2, 4, D);
  Kokkos::View<double**, Kokkos::LayoutRight, M> key("key", 8, D), gate("gate", 8, D);
  Kokkos::View<float**, Kokkos::LayoutRight, M> ape("ape", 4, D);
  Out64 out(E(), 8, 2, D);
  KPool::PoolCache<F8, M> cache(E(), kBlocks, kBlockPools, D, 4, KPool::CacheScale::amax);
  EXPECT_TRUE(throws(
      [&] {
        KPool::step(E(), ring, key, gate, ape,
                    KPool::ragged_batch(
                        to_index_view<U32>(std::vector<std::uint32_t>{0, 8, 8}, "ro"),
                        to_index_view<U32>(std::vector<std::uint32_t>{0, 0}, "cl"),
                        to_index_view<U32>(std::vector<std::uint32_t>{0, 1}, "slots"), 2),
                    paged(cache), out);
      },
      "KPool::step", "cache", -1, "fp8_e4m3"));
  Kokkos::View<double***, Kokkos::LayoutRight, M> dkey("dkey", 2, 1, D), dgate("dgate", 2, 1, D);
  EXPECT_TRUE(throws(
      [&] {
        KPool::step(E(), ring, dkey, dgate, ape,
                    KPool::decode_batch(
                        positions_view<M>({3, 3}, 1),
                        to_index_view<U32>(std::vector<std::uint32_t>{0, 1}, "slots"), 2),
                    paged(cache), out);
      },
      "KPool::step", "cache", -1, "fp8_e4m3"));
}

// Columns no emitted pool needs may hold anything: row 1 emits pools 0 and
// 1 (column 0) only, row 0 nothing in column 2.
TEST(CacheValidation, StepIgnoresBlocksNoPoolNeeds) {
  Rng rng(26);
  auto cache = random_cache<F8>(rng, KPool::CacheScale::amax);
  for (auto path : kPaths) {
    SCOPED_TRACE(path_name(path));
    StepSetup s(rng);
    EXPECT_NO_THROW(s.run(path, cache, table_of({{0, 1, -5}, {3, -1, 1 << 30}}), validated()));
  }
}

// With validation off a pool whose block is unassigned or too large is
// left out of the cache, and everything else is as with a good table: the
// ring, the output (which still holds the pool) and every other entry.
TEST(CacheValidation, StepWithoutValidationSkipsBadBlocks) {
  KPool::Options off;
  off.validate = false;
  for (auto path : kPaths)
    for (std::int32_t bad : {-1, kBlocks, 1 << 30}) {
      SCOPED_TRACE(std::string(path_name(path)) + ", block " + std::to_string(bad));
      Rng rng(27);
      auto const start = random_cache<F8>(rng, KPool::CacheScale::amax, true);
      auto clone = [&] {
        KPool::PoolCache<F8, M> c(E(), kBlocks, kBlockPools, D, 4, KPool::CacheScale::amax, true);
        Kokkos::deep_copy(c.values(), start.values());
        Kokkos::deep_copy(c.scales(), start.scales());
        return c;
      };
      auto skipped = clone();
      auto good = clone();
      Rng r1(28), r2(28);
      StepSetup a(r1), b(r2);
      // Row 0's column 1 (pool 4 at block 5, entry 0) is bad in a.
      a.run(path, skipped, table_of({{0, bad}, {3, 4}}), off);
      b.run(path, good, table_of({{0, 5}, {3, 4}}), validated());
      EXPECT_TRUE(same_bytes(a.state(), b.state(), 1, "ring and output"));
      // good, with block 5's entry 0 put back as it was.
      auto const hs = on_host(start.values());
      auto const hss = on_host(start.scales());
      auto hg = on_host(good.values());
      auto hgs = on_host(good.scales());
      for (int c = 0; c < D; ++c) hg(5, 0, c) = hs(5, 0, c);
      hgs(5, 0) = hss(5, 0);
      Kokkos::deep_copy(good.values(), hg);
      Kokkos::deep_copy(good.scales(), hgs);
      EXPECT_TRUE(Snapshot<F8>(good).unchanged(skipped));
      EXPECT_FALSE(Snapshot<F8>(start).unchanged(skipped)) << "the good pools were not written";
    }
}

}  // namespace
