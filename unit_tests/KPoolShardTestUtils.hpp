// What the sharded-cache tests share (tst_shard in one process, tst_mpi
// across MPI ranks): a scenario of B requests prefilled from position 0 by
// one ragged step and queried at every row of it, each cache (the whole
// one, or a rank's shard) written by that step on a fresh ring; the
// bytes of a cache entry; a View as a flat host vector.

#ifndef KPOOL_SHARD_TEST_UTILS_HPP
#define KPOOL_SHARD_TEST_UTILS_HPP

#include <KPoolTestUtils.hpp>

#include <algorithm>
#include <numeric>
#include <type_traits>
#include <vector>

namespace KPoolTest {

constexpr std::int32_t kSentinel = -7;

// One scenario: B requests prefilled from position 0 by one ragged step
// (tokens[r] each), then queried at every row of that step.
struct ShardCase {
  int K = 4, D = 64, H = 4, topk = 8, block_pools = 4;
  bool fp8 = false, rotated = false, serving = false;
  std::vector<std::uint32_t> tokens = {1, 9, 37, 130};
  int duplicates = 0;  // > 0: pools repeat every `duplicates` pools (ties)
  // Long rows: only decode rows are selected (not every prefill row), and
  // the caches' bytes are not compared entry by entry.
  bool long_rows = false;
};

template <class E, class T, class C>
struct Sharded {
  using M = typename E::memory_space;
  using Table = Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M>;
  E space;
  ShardCase s;
  int B, rows;
  Kokkos::View<std::uint32_t*, M> row_offsets, cache_lengths, slot_idx;
  Kokkos::View<T**, Kokkos::LayoutRight, M> key, gate;
  Kokkos::View<float**, Kokkos::LayoutRight, M> ape;
  Kokkos::View<T***, Kokkos::LayoutRight, M> q;
  Kokkos::View<float**, Kokkos::LayoutRight, M> w;

  explicit Sharded(ShardCase const& setup, std::uint64_t seed) : s(setup) {
    Rng rng(seed);
    B = static_cast<int>(s.tokens.size());
    std::vector<std::uint32_t> ro{0}, cl(B, 0), slots(B);
    for (int r = 0; r < B; ++r) ro.push_back(ro.back() + s.tokens[r]);
    std::iota(slots.begin(), slots.end(), 0u);
    rows = static_cast<int>(ro.back());
    row_offsets = to_index_view<Kokkos::View<std::uint32_t*, M>>(ro, "row_offsets");
    cache_lengths = to_index_view<Kokkos::View<std::uint32_t*, M>>(cl, "cache_lengths");
    slot_idx = to_index_view<Kokkos::View<std::uint32_t*, M>>(slots, "slot_idx");
    DType const t = dtype_of<T>();
    Matrix k = random_matrix(rng, t, rows, s.D, -2, 2);
    Matrix g = random_matrix(rng, t, rows, s.D, -3, 3);
    if (s.duplicates > 0) {
      // Token i of a request copies token i mod (duplicates * K): its pool
      // p is then pool p mod duplicates, to the bit.
      int const period = s.duplicates * s.K;
      for (int r = 0; r < B; ++r)
        for (std::uint32_t i = period; i < s.tokens[r]; ++i)
          for (int c = 0; c < s.D; ++c) {
            k.at(ro[r] + i, c) = k.at(ro[r] + i % period, c);
            g.at(ro[r] + i, c) = g.at(ro[r] + i % period, c);
          }
    }
    key = to_view<T, M>(k, "key");
    gate = to_view<T, M>(g, "gate");
    ape = ape_view<M>(random_ape(rng, s.K, s.D));
    Kokkos::View<T**, Kokkos::LayoutRight, M> q2 =
        to_view<T, M>(random_matrix(rng, t, rows, s.H * s.D, -1, 1), "q2");
    q = Kokkos::View<T***, Kokkos::LayoutRight, M>("q", rows, s.H, s.D);
    Kokkos::deep_copy(q, Kokkos::View<T***, Kokkos::LayoutRight, M, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
                             q2.data(), rows, s.H, s.D));
    Kokkos::fence();
    Matrix wm(rows, s.H);
    for (double& x : wm.v) x = static_cast<float>(rng.uniform(-0.5, 1.0));
    w = to_view<float, M>(wm, "weights");
  }

  KPool::Batch<M> batch() const {
    return KPool::ragged_batch(row_offsets, cache_lengths, slot_idx, B);
  }
  int pools(int r) const { return static_cast<int>(s.tokens[r]) / s.K; }

  // A cache of `blocks` blocks for this setup.
  KPool::PoolCache<C, M> make_cache(int blocks) const {
    constexpr bool fp8 = std::is_same<C, KPool::float8_e4m3>::value;
    return KPool::PoolCache<C, M>(
        space, blocks, s.block_pools, s.D, s.K,
        !fp8 ? KPool::CacheScale::none
             : s.serving ? KPool::CacheScale::pow2 : KPool::CacheScale::amax,
        s.rotated, s.serving ? KPool::CacheProfile::serving : KPool::CacheProfile::exact);
  }
  // Each request's `count(r)` pools in blocks of its own, scattered.
  template <class Count>
  Table make_table(Count const& count, int& blocks, std::uint64_t seed) const {
    std::vector<int> need(B);
    int cols = 1;
    blocks = 0;
    for (int r = 0; r < B; ++r) {
      need[r] = (count(r) + s.block_pools - 1) / s.block_pools;
      cols = std::max(cols, need[r]);
      blocks += need[r];
    }
    blocks += 1;  // one nobody owns
    std::vector<int> perm(blocks);
    std::iota(perm.begin(), perm.end(), 0);
    Rng rng(seed);
    for (int i = blocks - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
    Table table("block_table", B, cols);
    auto h = Kokkos::create_mirror_view(table);
    int next = 0;
    for (int r = 0; r < B; ++r)
      for (int c = 0; c < cols; ++c) h(r, c) = c < need[r] ? perm[next++] : -1;
    Kokkos::deep_copy(table, h);
    return table;
  }
  // The step writing `cache` through `table` (on a fresh ring).
  void write(KPool::PoolCache<C, M> const& cache, Table const& table) const {
    KPool::Ring<T, M> ring(space, B, s.K, s.D);
    KPool::StepOutput<T, M> out(
        space, KPool::StepOutput<T, M>::capacity_for(rows, B, s.K), B, s.D);
    KPool::step(space, ring, key, gate, ape, batch(), KPool::paged(cache, table), out);
  }
};

template <class V>
std::vector<std::int32_t> flat(V const& v) {
  auto const h = on_host(v);
  return std::vector<std::int32_t>(h.data(), h.data() + h.size());
}

// The cache's bytes of (block, entry): values then scale.
template <class C, class M>
std::vector<unsigned char> entry_bytes(KPool::PoolCache<C, M> const& cache, int b, int e) {
  auto const v = Kokkos::create_mirror_view_and_copy(
      Kokkos::HostSpace(), Kokkos::subview(cache.values(), b, e, Kokkos::ALL));
  float const sc = Kokkos::create_mirror_view_and_copy(
      Kokkos::HostSpace(), Kokkos::subview(cache.scales(), b, e))();
  std::vector<unsigned char> out(reinterpret_cast<unsigned char const*>(v.data()),
                                 reinterpret_cast<unsigned char const*>(v.data()) +
                                     v.size() * sizeof(C));
  unsigned char const* p = reinterpret_cast<unsigned char const*>(&sc);
  out.insert(out.end(), p, p + 4);
  return out;
}

}  // namespace KPoolTest

#endif
