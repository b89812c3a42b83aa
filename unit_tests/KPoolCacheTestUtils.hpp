#ifndef KPOOL_CACHE_TEST_UTILS_HPP
#define KPOOL_CACHE_TEST_UTILS_HPP

// Shared by the pool cache tests: block tables, step outputs filled by
// hand, and whole caches as bytes.

#include <KPoolCacheReference.hpp>
#include <KPoolTestUtils.hpp>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

namespace KPoolCacheTest {

using namespace KPoolTest;

// A fused cache's values or scales (the engines' layout, docs/indexer.md),
// gathered into the split layout's order: per block, the block_pools * D
// value bytes first, then block_pools f32 scales.
template <class C, class M>
std::vector<std::uint8_t> fused_part(KPool::PoolCache<C, M> const& cache, bool scales) {
  auto const h = on_host(cache.bytes());
  std::size_t const nb = h.extent(0);
  std::size_t const values = static_cast<std::size_t>(cache.block_pools()) * cache.head_dim();
  std::size_t const part = scales ? 4 * static_cast<std::size_t>(cache.block_pools()) : values;
  std::vector<std::uint8_t> b(nb * part);
  for (std::size_t blk = 0; blk < nb; ++blk)
    std::memcpy(b.data() + blk * part, &h(blk, scales ? values : 0), part);
  return b;
}

// A split cache's values or scales, copied to the host, as bytes.
template <class V>
std::vector<std::uint8_t> split_part(V const& v) {
  auto const h = on_host(v);
  std::vector<std::uint8_t> b(h.size() * sizeof(typename V::value_type));
  std::memcpy(b.data(), h.data(), b.size());
  return b;
}

// Host view of a whole cache, as bytes.
template <class C, class M>
std::vector<std::uint8_t> value_bytes(KPool::PoolCache<C, M> const& cache) {
  if (cache.layout() == KPool::CacheLayout::fused) return fused_part(cache, false);
  return split_part(cache.values());
}

template <class C, class M>
std::vector<std::uint8_t> scale_bytes(KPool::PoolCache<C, M> const& cache) {
  if (cache.layout() == KPool::CacheLayout::fused) return fused_part(cache, true);
  return split_part(cache.scales());
}

// A block table [B, max_blocks]: every (row, column) its own block, in a
// shuffled order, and a few spare blocks nobody uses.
struct Blocks {
  int B, max_blocks, block_pools, num_blocks;
  std::vector<std::int32_t> table;  // row-major
  std::int32_t at(int r, int col) const { return table[r * max_blocks + col]; }
};

inline Blocks make_blocks(Rng& rng, int B, int max_blocks, int block_pools) {
  Blocks b{B, max_blocks, block_pools, B * max_blocks + 3, {}};
  std::vector<std::int32_t> ids(b.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  for (int i = b.num_blocks - 1; i > 0; --i) std::swap(ids[i], ids[rng.below(i + 1)]);
  b.table.assign(ids.begin(), ids.begin() + B * max_blocks);
  return b;
}

template <class M>
Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> table_view(Blocks const& b) {
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> v("block_table", b.B, b.max_blocks);
  auto h = Kokkos::create_mirror_view(v);
  for (int r = 0; r < b.B; ++r)
    for (int c = 0; c < b.max_blocks; ++c) h(r, c) = b.at(r, c);
  Kokkos::deep_copy(v, h);
  return v;
}

// The bytes a cache must hold: zeros (a new cache), then each stored pool's
// reference entry at its block and entry.
struct ExpectedCache {
  std::vector<std::uint8_t> values, scales;
  ExpectedCache(Blocks const& b, int D, std::size_t elem)
      : values(static_cast<std::size_t>(b.num_blocks) * b.block_pools * D * elem, 0),
        scales(static_cast<std::size_t>(b.num_blocks) * b.block_pools * sizeof(float), 0) {}
  void put(Blocks const& b, int r, int pool, KPoolCacheRef::Entry const& e) {
    std::size_t const slot = static_cast<std::size_t>(b.at(r, pool / b.block_pools)) *
                                 b.block_pools + pool % b.block_pools;
    std::memcpy(values.data() + slot * e.bytes.size(), e.bytes.data(), e.bytes.size());
    std::memcpy(scales.data() + slot * sizeof(float), &e.scale, sizeof(float));
  }
};

// The first differing element, for a readable failure.
inline ::testing::AssertionResult same_bytes(std::vector<std::uint8_t> const& got,
                                      std::vector<std::uint8_t> const& want,
                                      std::size_t elem, char const* what) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << what << ": sizes differ";
  if (std::memcmp(got.data(), want.data(), got.size()) == 0)
    return ::testing::AssertionSuccess();
  auto hex = [&](std::vector<std::uint8_t> const& v, std::size_t i) {
    std::string h = "0x";
    char const* digits = "0123456789abcdef";
    for (std::size_t j = elem; j-- > 0;) {
      h += digits[v[i + j] >> 4];
      h += digits[v[i + j] & 15];
    }
    return h;
  };
  for (std::size_t i = 0; i < got.size(); i += elem)
    if (std::memcmp(got.data() + i, want.data() + i, elem) != 0)
      return ::testing::AssertionFailure() << what << " differ at element " << i / elem
                                           << ": got " << hex(got, i) << ", reference "
                                           << hex(want, i);
  return ::testing::AssertionFailure();
}

// A step's output filled by hand: rows [0, count) are the given pools, the
// rows past count name real cache entries (so a pass reading past count
// would show) and hold garbage.
template <class T, class M>
void fill_output(KPool::StepOutput<T, M>& out, int B, std::vector<int> const& batch_row,
                 std::vector<int> const& pool_id, std::vector<std::vector<double>> const& pools) {
  int const count = static_cast<int>(batch_row.size());
  out.begin_call(B);
  auto ho = Kokkos::create_mirror_view(out.offsets());
  for (int r = 0; r <= B; ++r) ho(r) = static_cast<std::uint32_t>(r == B ? count : 0);
  Kokkos::deep_copy(out.offsets(), ho);
  auto hp = Kokkos::create_mirror_view(out.pooled());
  auto hb = Kokkos::create_mirror_view(out.batch_row());
  auto hi = Kokkos::create_mirror_view(out.pool_id());
  for (std::size_t o = 0; o < out.capacity(); ++o) {
    bool const live = static_cast<int>(o) < count;
    hb(o) = live ? batch_row[o] : 0;
    hi(o) = live ? pool_id[o] : 0;
    for (int c = 0; c < out.head_dim(); ++c)
      hp(o, c) = to_storage<T>(live ? pools[o][c] : 1234.5);
  }
  Kokkos::deep_copy(out.pooled(), hp);
  Kokkos::deep_copy(out.batch_row(), hb);
  Kokkos::deep_copy(out.pool_id(), hi);
}

}  // namespace KPoolCacheTest

#endif
