// expand_topk against the reference (docs/writers.md, "expand_topk"): pool ids
// back to token positions, stale and garbage ids never becoming attention
// indices, the tail columns, and rows outside the live requests untouched.

#include <KPoolTestUtils.hpp>

#include <limits>
#include <type_traits>

namespace {

using namespace KPoolTest;

// expand_topk has no storage type: one entry per execution space.
using Spaces = std::conditional_t<
    std::is_same<Kokkos::DefaultExecutionSpace,
                 Kokkos::DefaultHostExecutionSpace>::value,
    ::testing::Types<Kokkos::DefaultExecutionSpace>,
    ::testing::Types<Kokkos::DefaultExecutionSpace,
                     Kokkos::DefaultHostExecutionSpace>>;

struct SpaceName {
  template <class E>
  static std::string GetName(int) {
    return E::name();
  }
};

template <class E>
class ExpandTopk : public ::testing::Test {};
TYPED_TEST_SUITE(ExpandTopk, Spaces, SpaceName);

constexpr std::int32_t kSentinel = KPoolRef::kUntouched;
constexpr std::int32_t kMax = std::numeric_limits<std::int32_t>::max();
constexpr std::int32_t kMin = std::numeric_limits<std::int32_t>::min();

// One call: the batch, the token rows of pool_ids and out (at least the live
// rows; more leaves guard rows past row_offsets[num_requests]), the ids.
struct Case {
  int K = 1, topk = 1;
  bool tail = false;
  TestBatch batch;
  int rows = 0;
  std::vector<std::int32_t> pool_ids;  // [rows, topk]
  int width() const { return KPool::expand_topk_width(topk, K, tail); }
};

template <class E, class Layout = Kokkos::LayoutRight>
std::vector<std::int32_t> run_device(Case const& c) {
  using M = typename E::memory_space;
  using View = Kokkos::View<std::int32_t**, Layout, M>;
  View ids("pool_ids", c.rows, c.topk), out("out", c.rows, c.width());
  auto hi = Kokkos::create_mirror_view(ids);
  for (int t = 0; t < c.rows; ++t)
    for (int j = 0; j < c.topk; ++j) hi(t, j) = c.pool_ids[t * c.topk + j];
  Kokkos::deep_copy(ids, hi);
  Kokkos::deep_copy(out, kSentinel);
  BatchViews<M> const bv(c.batch.device);
  E space;
  KPool::PoolCache<float, M> const k_only(space, 1, 1, 1, c.K);  // K of the ids
  KPool::expand_topk(space, ids, c.tail,
                     KPool::ragged_batch(bv.row_offsets, bv.cache_lengths,
                                         c.batch.device.num_requests),
                     k_only, out, test_options<E>());
  auto const ho = on_host(out);
  std::vector<std::int32_t> v(static_cast<std::size_t>(c.rows) * c.width());
  for (int t = 0; t < c.rows; ++t)
    for (int j = 0; j < c.width(); ++j) v[t * c.width() + j] = ho(t, j);
  return v;
}

std::vector<std::int32_t> run_reference(Case const& c) {
  std::vector<std::int32_t> out(static_cast<std::size_t>(c.rows) * c.width(),
                                kSentinel);
  KPoolRef::expand_topk(c.K, c.pool_ids, c.topk, c.batch.reference, c.tail,
                        out);
  return out;
}

// A pool complete within `visible`, or -1 when there is none.
std::int32_t valid_id(Rng& rng, std::int64_t visible, int K) {
  std::int64_t const complete = visible / K;
  if (complete == 0) return -1;
  return static_cast<std::int32_t>(rng.next() %
                                   static_cast<std::uint64_t>(complete));
}

// An id for a row that sees `visible` tokens: no pool, other negatives,
// garbage, the pool still filling, pools past it, ids whose (pid + 1) * K
// overflows int32, and valid ids.
std::int32_t pick_id(Rng& rng, std::int64_t visible, int K) {
  std::int64_t const complete = visible / K;  // pools 0 .. complete - 1
  switch (rng.below(11)) {
    case 0: return -1;
    case 1: return -2 - rng.below(1000);
    case 2: return kMin;
    case 3: return kMax;
    case 4: return static_cast<std::int32_t>(complete);  // filling / next
    case 5:
      return static_cast<std::int32_t>(
          std::min<std::int64_t>(kMax, complete + 1 + rng.below(50)));
    case 6: return kMax / K;
    case 7:
      return complete > 0 ? static_cast<std::int32_t>(complete - 1) : -1;
    default: return valid_id(rng, visible, K);
  }
}

// Ids for every row: per row, all -1, valid ids followed by a run of -1
// (top-k padding), or a random mix.
std::vector<std::int32_t> make_ids(Rng& rng, KPoolRef::Batch const& live,
                                   int rows, int topk, int K) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(rows) * topk);
  std::vector<std::int64_t> visible(rows, 1 + rng.below(40));  // guard rows
  for (int b = 0; b < live.num_requests; ++b)
    for (std::uint32_t t = live.row_offsets[b]; t < live.row_offsets[b + 1]; ++t)
      visible[t] = std::int64_t(live.cache_lengths[b]) +
                   (t - live.row_offsets[b]) + 1;
  for (int t = 0; t < rows; ++t) {
    int const mode = rng.below(6);
    int const cut = rng.below(topk + 1);
    for (int j = 0; j < topk; ++j) {
      std::int32_t& id = ids[t * topk + j];
      if (mode == 0)
        id = -1;
      else if (mode == 1)
        id = j < cut ? valid_id(rng, visible[t], K) : -1;
      else
        id = pick_id(rng, visible[t], K);
    }
  }
  return ids;
}

// Live requests: a fresh prefill, one starting a pool short of a boundary,
// one starting on a boundary, an empty one, a single-token decode, one that
// ends at INT32_MAX, and a short one.
std::vector<std::pair<std::uint32_t, std::uint32_t>> expand_requests(int K) {
  std::uint32_t const k = K;
  return {{0, 3 * k + 2}, {k - 1, 2 * k + 1}, {5 * k, k + 1}, {7, 0},
          {2 * k + 1, 1}, {std::uint32_t(kMax) - (2 * k + 1), 2 * k + 1},
          {3, 2}};
}

Case make_case(int K, int topk, bool tail, std::uint64_t seed, int guard = 3) {
  Rng rng(seed);
  Case c;
  c.K = K;
  c.topk = topk;
  c.tail = tail;
  auto const live = expand_requests(K);
  c.batch = make_batch(live, static_cast<int>(live.size()) + 2, rng);
  c.rows = static_cast<int>(total_rows(c.batch.device)) + guard;
  c.pool_ids = make_ids(rng, c.batch.device, c.rows, topk, K);
  return c;
}

TYPED_TEST(ExpandTopk, MatchesReference) {
  using E = TypeParam;
  for (int K : k_grid())
    for (int topk : {1, 3, 8})
      for (bool tail : {false, true}) {
        SCOPED_TRACE("K=" + std::to_string(K) + " pool_topk=" +
                     std::to_string(topk) + (tail ? " tail_always" : ""));
        Case const c = make_case(K, topk, tail, 7919u * K + 31u * topk + tail);
        std::vector<std::int32_t> const got = run_device<E>(c);
        std::vector<std::int32_t> const want = run_reference(c);
        ASSERT_EQ(got.size(), want.size());
        for (std::size_t i = 0; i < got.size(); ++i)
          ASSERT_EQ(got[i], want[i]) << "row " << i / c.width() << " column "
                                     << i % c.width();
      }
}

// Non-LayoutRight pool_ids and out: the entry point takes any layout.
TYPED_TEST(ExpandTopk, MatchesReferenceWithLayoutLeftViews) {
  using E = TypeParam;
  for (int K : {1, 4, 16}) {
    SCOPED_TRACE("K=" + std::to_string(K));
    Case const c = make_case(K, 3, true, 55u + K);
    EXPECT_EQ((run_device<E, Kokkos::LayoutLeft>(c)), run_reference(c));
  }
}

// Every column is -1 or a position the row can see; a hand-worked row pins
// each kind of id to its exact output.
TYPED_TEST(ExpandTopk, GarbageIdsNeverBecomeIndices) {
  using E = TypeParam;
  for (int K : k_grid()) {
    SCOPED_TRACE("K=" + std::to_string(K));
    Case const c = make_case(K, 8, true, 100u + K, 0);
    std::vector<std::int32_t> const got = run_device<E>(c);
    KPoolRef::Batch const& b = c.batch.device;
    for (int r = 0; r < b.num_requests; ++r)
      for (std::uint32_t t = b.row_offsets[r]; t < b.row_offsets[r + 1]; ++t) {
        std::int64_t const visible =
            std::int64_t(b.cache_lengths[r]) + (t - b.row_offsets[r]) + 1;
        for (int j = 0; j < c.width(); ++j) {
          std::int32_t const v = got[t * c.width() + j];
          ASSERT_TRUE(v == -1 || (v >= 0 && v < visible))
              << "row " << t << " column " << j << ": " << v
              << " with visible " << visible;
          if (j < c.topk * K) {
            std::int64_t const pid = c.pool_ids[t * c.topk + j / K];
            bool const ok = pid >= 0 && (pid + 1) * K <= visible;
            ASSERT_EQ(v, ok ? pid * K + j % K : -1)
                << "row " << t << " column " << j << " id " << pid;
          }
        }
      }
  }

  // One row by hand: K = 4, cache length 9, one token, so visible = 10:
  // pools 0 and 1 complete, pool 2 filling (positions 8, 9).
  int const K = 4;
  Case c;
  c.K = K;
  c.topk = 9;
  c.tail = true;
  Rng rng(1);
  c.batch = make_batch({{9, 1}}, 1, rng);
  c.rows = 1;
  c.pool_ids = {-1, -5, kMin, kMax, 2, 3, 1, 0, kMax / K};
  std::vector<std::int32_t> want;
  for (std::int32_t pid : c.pool_ids)
    for (int m = 0; m < K; ++m)
      want.push_back(pid == 0 || pid == 1 ? pid * K + m : -1);
  for (std::int32_t j : {8, 9, -1}) want.push_back(j);  // tail
  EXPECT_EQ(run_device<E>(c), want);
}

// Dead rows (garbage offsets and lengths pointing at the guard rows), rows
// past row_offsets[num_requests], empty requests and num_requests == 0 write
// nothing.
TYPED_TEST(ExpandTopk, RowsOutsideLiveRequestsAreUntouched) {
  using E = TypeParam;
  for (int K : {1, 3, 4}) {
    SCOPED_TRACE("K=" + std::to_string(K));
    Case c = make_case(K, 3, true, 900u + K, 6);
    KPoolRef::Batch& b = c.batch.device;
    std::uint32_t const live_rows = total_rows(b);
    // Dead rows claim every guard row, with a length that makes ids valid.
    b.row_offsets[b.num_requests + 1] = static_cast<std::uint32_t>(c.rows);
    b.row_offsets[b.num_requests + 2] = static_cast<std::uint32_t>(c.rows);
    b.cache_lengths[b.num_requests] = 1u << 20;
    b.cache_lengths[b.num_requests + 1] = 0;
    std::vector<std::int32_t> const got = run_device<E>(c);
    for (int t = static_cast<int>(live_rows); t < c.rows; ++t)
      for (int j = 0; j < c.width(); ++j)
        ASSERT_EQ(got[t * c.width() + j], kSentinel)
            << "guard row " << t << " column " << j;
    // Every live row was written.
    for (std::uint32_t t = 0; t < live_rows; ++t)
      for (int j = 0; j < c.width(); ++j)
        ASSERT_NE(got[t * c.width() + j], kSentinel)
            << "live row " << t << " column " << j;
    EXPECT_EQ(got, run_reference(c));

    // No live request: nothing at all.
    c.batch.device.num_requests = 0;
    c.batch.reference.num_requests = 0;
    for (std::int32_t v : run_device<E>(c)) ASSERT_EQ(v, kSentinel);
  }
}

TYPED_TEST(ExpandTopk, OutputWidthIsTopkTimesKPlusTail) {
  using E = TypeParam;
  using M = typename E::memory_space;
  using View = Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M>;
  EXPECT_EQ(KPool::expand_topk_width(8, 4, false), 32);
  EXPECT_EQ(KPool::expand_topk_width(8, 4, true), 35);
  EXPECT_EQ(KPool::expand_topk_width(3, 1, true), 3);
  EXPECT_EQ(KPool::expand_topk_width(0, 16, true), 15);
  EXPECT_EQ(KPool::expand_topk_width(0, 16, false), 0);

  E space;
  Rng rng(4);
  TestBatch const batch = make_batch({{5, 6}}, 1, rng);
  BatchViews<M> const bv(batch.device);
  for (bool tail : {false, true}) {
    int const K = 4, topk = 3;
    KPool::PoolCache<float, M> const k_only(space, 1, 1, 1, K);
    int const w = KPool::expand_topk_width(topk, K, tail);
    View ids("pool_ids", 6, topk);
    Kokkos::deep_copy(ids, 1);
    for (int wrong : {w - 1, w + 1}) {
      View out("out", 6, wrong);
      Kokkos::deep_copy(out, kSentinel);
      try {
        KPool::expand_topk(space, ids, tail,
                           KPool::ragged_batch(bv.row_offsets, bv.cache_lengths, 1), k_only,
                           out, test_options<E>());
        ADD_FAILURE() << "width " << wrong << " instead of " << w << " accepted";
      } catch (KPool::InvalidArgument const& e) {
        EXPECT_EQ(e.argument(), "out");
        EXPECT_EQ(e.value(), std::to_string(wrong));
        EXPECT_NE(std::string(e.what()).find("extent 1"), std::string::npos)
            << e.what();
      }
      auto const h = on_host(out);
      for (std::size_t i = 0; i < h.span(); ++i)
        ASSERT_EQ(h.data()[i], kSentinel) << "out written despite the throw";
    }
  }

  // pool_topk = 0: only the tail columns, or nothing at all.
  for (bool tail : {false, true}) {
    Case c;
    c.K = 4;
    c.topk = 0;
    c.tail = tail;
    c.batch = make_batch(expand_requests(4), 8, rng);
    c.rows = static_cast<int>(total_rows(c.batch.device));
    EXPECT_EQ(run_device<E>(c), run_reference(c));
  }
}

// visible % K == 0: the row has just completed pool visible / K - 1, which
// is selectable, and no tail column is valid.
TYPED_TEST(ExpandTopk, PoolBoundaryRowHasNoTailColumns) {
  using E = TypeParam;
  for (int K : k_grid()) {
    SCOPED_TRACE("K=" + std::to_string(K));
    Case c;
    c.K = K;
    c.topk = 2;
    c.tail = true;
    Rng rng(K);
    std::uint32_t const cache = 2 * K - 1;  // row i sees 2K + i tokens
    c.batch = make_batch({{cache, 2 * K + 1}}, 1, rng);
    c.rows = 2 * K + 1;
    for (int i = 0; i < c.rows; ++i) {
      std::int64_t const visible = cache + i + 1;
      // The last complete pool, then the one after it.
      c.pool_ids.push_back(static_cast<std::int32_t>(visible / K - 1));
      c.pool_ids.push_back(static_cast<std::int32_t>(visible / K));
    }
    std::vector<std::int32_t> const got = run_device<E>(c);
    for (int i = 0; i < c.rows; ++i) {
      std::int64_t const visible = cache + i + 1;
      std::int32_t const* row = got.data() + i * c.width();
      std::int64_t const last = visible / K - 1;
      for (int m = 0; m < K; ++m) {
        ASSERT_EQ(row[m], last * K + m) << "visible " << visible;
        ASSERT_EQ(row[K + m], -1) << "visible " << visible;
      }
      for (int j = 0; j < K - 1; ++j) {
        std::int64_t const want =
            j < visible % K ? visible - visible % K + j : -1;
        ASSERT_EQ(row[2 * K + j], want) << "visible " << visible << " tail " << j;
        if (visible % K == 0) {
          ASSERT_EQ(row[2 * K + j], -1) << "pool boundary, tail " << j;
        }
      }
    }
    EXPECT_EQ(got, run_reference(c));
  }
}

}  // namespace
