// Must NOT compile: row_offsets of int32 instead of uint32. The
// compile_fail.row_offsets test builds it and checks that the first error
// names the expected type and that no cascade of errors follows
// (cmake/KPoolCompileFail.cmake).

#include <KPool.hpp>

#include <cstdint>

int main(int argc, char* argv[]) {
  Kokkos::ScopeGuard guard(argc, argv);
  using E = Kokkos::DefaultExecutionSpace;
  using M = E::memory_space;
  int const K = 4, D = 8, B = 2;
  E space;
  KPool::Ring<float, M> ring(space, B, K, D);
  KPool::StepOutput<float, M> out(space, 16, B, D);
  Kokkos::View<float**, M> key("key", 8, D), gate("gate", 8, D), ape("ape", K, D);
  Kokkos::View<std::int32_t*, M> row_offsets("row_offsets", B + 1);  // wrong
  Kokkos::View<std::uint32_t*, M> cache_lengths("cache_lengths", B);
  Kokkos::View<std::uint32_t*, M> slot_idx("slot_idx", B);
  KPool::step(space, ring, key, gate, ape,
              KPool::ragged_batch(row_offsets, cache_lengths, slot_idx, B), out);
  return 0;
}
