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
  std::printf("consumer: KPool %s OK\n", KPOOL_VERSION_STRING);
  return 0;
}
