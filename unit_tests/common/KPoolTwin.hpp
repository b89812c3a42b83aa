// Two of everything a layer writes, for tests that hold two ways of making
// the same calls to the same bits (tst_batch.cpp, tst_deprecated.cpp).
#ifndef KPOOL_UNIT_TESTS_COMMON_TWIN_HPP
#define KPOOL_UNIT_TESTS_COMMON_TWIN_HPP

#include <KPoolTestUtils.hpp>

#include <vector>

namespace KPoolTwinTest {

using namespace KPoolTest;
using namespace KPoolTest::OnDefaultSpace;
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

inline ::testing::AssertionResult same_state(E const& space, Twin const& a, Twin const& b) {
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

// An ape [K, D] of values drawn from [-1, 1).
inline F2 twin_ape(Rng& rng) {
  F2 ape("ape", K, D);
  fill_uniform(rng, ape, -1, 1);
  return ape;
}

// A selection's queries [rows, H, D] in [-1, 1) and head weights
// [rows, H] in [0, 1), drawn in that order.
struct TwinQueries {
  F3 q;
  F2 w;
};

inline TwinQueries twin_queries(Rng& rng, std::size_t rows) {
  TwinQueries x{F3("q", rows, H, D), F2("w", rows, H)};
  fill_uniform(rng, x.q, -1, 1);
  fill_uniform(rng, x.w, 0, 1);
  return x;
}

// Row r's blocks: 4r .. 4r + 3.
inline I2 block_table() {
  std::vector<std::int32_t> v;
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 4; ++c) v.push_back(4 * r + c);
  return positions_view<M>(v, 4);
}

}  // namespace KPoolTwinTest

#endif
