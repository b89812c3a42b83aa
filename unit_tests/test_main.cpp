#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // ctest's test discovery only lists the tests: no Kokkos then, so that
  // nothing Kokkos prints at start-up is taken for a test name.
  if (::testing::GTEST_FLAG(list_tests)) return RUN_ALL_TESTS();
  Kokkos::ScopeGuard guard(argc, argv);
  return RUN_ALL_TESTS();
}
