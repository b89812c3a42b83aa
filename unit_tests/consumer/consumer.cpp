// Built against the installed package by the consumer ctest: one compress
// of one full pool, checked by hand (equal gates and no ape: the mean).
#include <KPool.hpp>

#include <cmath>
#include <cstdio>

int main(int argc, char* argv[]) {
  Kokkos::ScopeGuard guard(argc, argv);
  using Mem = Kokkos::DefaultExecutionSpace::memory_space;
  int const K = 4, D = 3;
  Kokkos::View<float**, Mem> key("key", K, D), gate("gate", K, D), pooled("pooled", 1, D);
  Kokkos::View<float**, Mem> ape("ape", K, D);
  Kokkos::View<std::uint32_t*, Mem> row_offsets("row_offsets", 2), cache("cache", 1),
      pool_offsets("pool_row_offsets", 2);
  auto hk = Kokkos::create_mirror_view(key);
  for (int m = 0; m < K; ++m)
    for (int c = 0; c < D; ++c) hk(m, c) = static_cast<float>(m + c);
  Kokkos::deep_copy(key, hk);
  Kokkos::deep_copy(Kokkos::subview(row_offsets, 1), static_cast<std::uint32_t>(K));
  KPool::compress(Kokkos::DefaultExecutionSpace(), key, gate, ape, row_offsets, cache, 1,
                  pool_offsets, pooled);
  auto const h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), pooled);
  for (int c = 0; c < D; ++c)
    if (std::fabs(h(0, c) - (1.5f + c)) > 1e-5f) {
      std::printf("consumer: channel %d is %g, expected %g\n", c, h(0, c), 1.5 + c);
      return 1;
    }
#if KPOOL_HAS_KOKKOSKERNELS
  // The selection stage through the package (Kokkos Kernels found and
  // linked for the user): one query over 3 pools of a native cache, key p
  // = (p, 0, 0), query (1, 0, 0), weight 1: scores 0, 1, 2; the best two
  // are pools 1 and 2.
  {
    KPool::PoolCache<float, Mem> cache(Kokkos::DefaultExecutionSpace(), 1, 4, D);
    auto hv = Kokkos::create_mirror_view(cache.values());
    auto hs = Kokkos::create_mirror_view(cache.scales());
    for (int p = 0; p < 4; ++p) {
      hs(0, p) = 1.0f;
      for (int c = 0; c < D; ++c) hv(0, p, c) = c == 0 ? static_cast<float>(p) : 0.0f;
    }
    Kokkos::deep_copy(cache.values(), hv);
    Kokkos::deep_copy(cache.scales(), hs);
    Kokkos::View<std::uint32_t*, Mem> ro("row_offsets", 2), cl("cache_lengths", 1);
    Kokkos::deep_copy(Kokkos::subview(ro, 1), 1u);
    Kokkos::deep_copy(cl, 2u);  // position 2: pools 0..2 visible (K = 1)
    Kokkos::View<std::int32_t**, Mem> table("block_table", 1, 1), ids("pool_ids", 1, 2);
    Kokkos::View<float***, Mem> q("q", 1, 1, D);
    Kokkos::View<float**, Mem> w("weights", 1, 1);
    Kokkos::deep_copy(Kokkos::subview(q, 0, 0, 0), 1.0f);
    Kokkos::deep_copy(w, 1.0f);
    KPool::SelectWorkspace<float, Mem> ws(Kokkos::DefaultExecutionSpace(), 1, 4, 1, D);
    KPool::score_select(Kokkos::DefaultExecutionSpace(), ro, cl, table, 1, 1, q, w, cache, 2,
                        ids, ws);
    auto const hi = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), ids);
    if (hi(0, 0) != 1 || hi(0, 1) != 2) {
      std::printf("consumer: selected %d %d, expected 1 2\n", hi(0, 0), hi(0, 1));
      return 1;
    }
  }
#endif
  std::printf("consumer: KPool %s OK\n", KPOOL_VERSION_STRING);
  return 0;
}
