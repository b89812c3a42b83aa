#ifndef KPOOL_SNIPPET_SUPPORT_HPP
#define KPOOL_SNIPPET_SUPPORT_HPP

// What the programs generated from the documentation's fragments share
// (cmake/KPoolSnippets.cmake): the driver that runs every fragment of a
// page, and small helpers for the wrappers. Fragments themselves use only
// KPool, Kokkos and the standard library, so a reader can copy them.

#include <KPool.hpp>

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <initializer_list>
#include <string>
#include <vector>

namespace kpool_snippets {

using Mem = Kokkos::DefaultExecutionSpace::memory_space;

struct Snippet {
  char const* where;  // page:line of the fragment
  void (*run)();
};

// Runs every fragment, even after a failure, and names each one that throws.
template <std::size_t N>
int run_all(Snippet const (&all)[N]) {
  int failed = 0;
  for (Snippet const& s : all) {
    try {
      s.run();
      Kokkos::fence();
      std::printf("%s: ok\n", s.where);
    } catch (std::exception const& e) {
      std::printf("%s: FAILED: %s\n", s.where, e.what());
      ++failed;
    }
  }
  return failed == 0 ? 0 : 1;
}

inline Kokkos::View<std::uint32_t*, Mem> device_u32(
    std::string const& label, std::initializer_list<std::uint32_t> values) {
  Kokkos::View<std::uint32_t*, Mem> d(label, values.size());
  auto h = Kokkos::create_mirror_view(d);
  std::size_t i = 0;
  for (std::uint32_t v : values) h(i++) = v;
  Kokkos::deep_copy(d, h);
  return d;
}

// rows x cols int32 entries, row by row.
inline Kokkos::View<std::int32_t**, Mem> device_i32(
    std::string const& label, std::size_t rows, std::size_t cols,
    std::initializer_list<std::int32_t> values) {
  assert(values.size() == rows * cols);
  Kokkos::View<std::int32_t**, Mem> d(label, rows, cols);
  auto h = Kokkos::create_mirror_view(d);
  std::size_t i = 0;
  for (std::int32_t v : values) {
    h(i / cols, i % cols) = v;
    ++i;
  }
  Kokkos::deep_copy(d, h);
  return d;
}

// Distinct, deterministic values in [-1, 1), so pools are not all zero.
template <class View>
void fill(View const& v, int salt) {
  using T = typename View::non_const_value_type;
  auto h = Kokkos::create_mirror_view(v);
  std::size_t const n = h.span();
  T* p = h.data();
  for (std::size_t i = 0; i < n; ++i)
    p[i] = T(static_cast<float>((i * 37 + salt * 101) % 64) / 32.0f - 1.0f);
  Kokkos::deep_copy(v, h);
}

}  // namespace kpool_snippets

#endif
