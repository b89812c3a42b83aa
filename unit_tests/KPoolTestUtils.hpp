#ifndef KPOOL_TEST_UTILS_HPP
#define KPOOL_TEST_UTILS_HPP

// Shared by the unit tests: the (execution space, storage type) grid every
// test body runs over, deterministic inputs, views from reference matrices
// and back, and the tolerances (docs/pools.md, "Tolerances").

#include <KPool.hpp>
#include <KPoolReference.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace KPoolTest {

// The engines of a list that this build has: team_gemm and blas need Kokkos
// Kernels (without it they are refused by name, which
// SelectValidation.KokkosKernelsEnginesAreRefusedWithoutIt tests).
inline std::vector<KPool::ScoreEngine> built_engines(std::vector<KPool::ScoreEngine> e) {
  if (!KPOOL_HAS_KOKKOSKERNELS)
    e.erase(std::remove_if(e.begin(), e.end(),
                           [](KPool::ScoreEngine x) {
                             return x == KPool::ScoreEngine::team_gemm ||
                                    x == KPool::ScoreEngine::blas;
                           }),
            e.end());
  return e;
}

using KPoolRef::DType;
using KPoolRef::Matrix;

template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same<T, float>::value) return DType::f32;
  if constexpr (std::is_same<T, double>::value) return DType::f64;
  if constexpr (std::is_same<T, KPool::bfloat16>::value) return DType::bf16;
  return DType::f16;
}

// One typed-test parameter: where it runs and what it stores.
template <class ExecSpace, class T>
struct Config {
  using execution_space = ExecSpace;
  using memory_space = typename ExecSpace::memory_space;
  using value_type = T;
  static constexpr DType dtype = dtype_of<T>();
};

#define KPOOL_TEST_CONFIGS_FOR(E)                                        \
  Config<E, float>, Config<E, double>, Config<E, KPool::bfloat16>, \
      Config<E, KPool::float16>

// Every enabled execution space: the default one, and the default host
// space where it differs (a CUDA build tests OpenMP too).
#if defined(KOKKOS_ENABLE_CUDA) || defined(KOKKOS_ENABLE_HIP) || \
    defined(KOKKOS_ENABLE_SYCL)
using Configs =
    ::testing::Types<KPOOL_TEST_CONFIGS_FOR(Kokkos::DefaultExecutionSpace),
                     KPOOL_TEST_CONFIGS_FOR(Kokkos::DefaultHostExecutionSpace)>;
#else
using Configs =
    ::testing::Types<KPOOL_TEST_CONFIGS_FOR(Kokkos::DefaultExecutionSpace)>;
#endif

struct ConfigName {
  template <class C>
  static std::string GetName(int) {
    return std::string(C::execution_space::name()) + "_" +
           KPool::storage_name<typename C::value_type>();
  }
};

// Team sizes above one on hosts, so races between team threads can show.
template <class ExecSpace>
KPool::Options test_options() {
  KPool::Options o;
  if (!KPool::Details::device_shapes<ExecSpace>::value)
    o.team_size = 2;
  return o;
}

// The grid of docs/writers.md, "What the tests check" 1.
inline std::vector<int> k_grid() { return {1, 2, 3, 4, 8, 16}; }
inline std::vector<int> d_grid() { return {1, 7, 64, 128, 256}; }

// splitmix64: deterministic inputs on every platform.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : s_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform(double lo, double hi) {
    return lo + (hi - lo) * static_cast<double>(next() >> 11) * 0x1.0p-53;
  }
  int below(int n) { return static_cast<int>(next() % static_cast<std::uint64_t>(n)); }

 private:
  std::uint64_t s_;
};

// Values already representable in the storage type, so the kernels and the
// reference read the same numbers.
inline Matrix random_matrix(Rng& rng, DType t, int rows, int cols, double lo,
                            double hi) {
  Matrix m(rows, cols);
  for (double& x : m.v) x = KPoolRef::round_to(t, rng.uniform(lo, hi));
  return m;
}

inline Matrix random_ape(Rng& rng, int K, int D) {
  Matrix m(K, D);
  for (double& x : m.v) x = static_cast<float>(rng.uniform(-1.0, 1.0));
  return m;
}

template <class T>
T to_storage(double x) {
  return KPool::from_accumulator<T>(static_cast<KPool::accumulator_t<T>>(x));
}

template <class T>
bool same_bits(T const& a, T const& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <class T>
double to_double(T x) {
  return static_cast<double>(KPool::to_accumulator(x));
}

template <class T, class MemorySpace>
Kokkos::View<T**, Kokkos::LayoutRight, MemorySpace> to_view(
    Matrix const& m, std::string const& label) {
  Kokkos::View<T**, Kokkos::LayoutRight, MemorySpace> v(label, m.rows, m.cols);
  auto h = Kokkos::create_mirror_view(v);
  for (int r = 0; r < m.rows; ++r)
    for (int c = 0; c < m.cols; ++c) h(r, c) = to_storage<T>(m.at(r, c));
  Kokkos::deep_copy(v, h);
  return v;
}

// Decode inputs: rows r * next_n + i of a matrix as [B, next_n, D].
template <class T, class MemorySpace>
Kokkos::View<T***, Kokkos::LayoutRight, MemorySpace> to_view3(
    Matrix const& m, int next_n, std::string const& label) {
  int const B = m.rows / next_n;
  Kokkos::View<T***, Kokkos::LayoutRight, MemorySpace> v(label, B, next_n, m.cols);
  auto h = Kokkos::create_mirror_view(v);
  for (int r = 0; r < B; ++r)
    for (int i = 0; i < next_n; ++i)
      for (int c = 0; c < m.cols; ++c) h(r, i, c) = to_storage<T>(m.at(r * next_n + i, c));
  Kokkos::deep_copy(v, h);
  return v;
}

// The first rows * cols entries of v (row-major; v.at, so a v too short
// throws) as a [rows, cols] view labelled `label`.
template <class MemorySpace>
Kokkos::View<std::int32_t**, Kokkos::LayoutRight, MemorySpace> int_matrix_view(
    std::vector<std::int32_t> const& v, int rows, int cols, std::string const& label) {
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, MemorySpace> m(label, rows, cols);
  auto h = Kokkos::create_mirror_view(m);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) h(r, c) = v.at(static_cast<std::size_t>(r) * cols + c);
  Kokkos::deep_copy(m, h);
  return m;
}

// Decode positions [B * next_n] as [B, next_n].
template <class MemorySpace>
Kokkos::View<std::int32_t**, Kokkos::LayoutRight, MemorySpace> positions_view(
    std::vector<std::int32_t> const& positions, int next_n) {
  return int_matrix_view<MemorySpace>(positions, static_cast<int>(positions.size()) / next_n,
                                      next_n, "positions");
}

template <class MemorySpace>
Kokkos::View<float**, Kokkos::LayoutRight, MemorySpace> ape_view(Matrix const& m) {
  return to_view<float, MemorySpace>(m, "ape");
}

template <class V, class U>
V to_index_view(std::vector<U> const& values, std::string const& label) {
  V v(label, values.size());
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < values.size(); ++i)
    h(i) = static_cast<typename V::value_type>(values[i]);
  Kokkos::deep_copy(v, h);
  return v;
}

template <class V>
auto on_host(V const& v) {
  return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
}

// key and gate as the two halves of one [T, 2D] buffer: LayoutStride views
// with a row stride of 2D.
template <class T, class MemorySpace>
struct InterleavedInput {
  Kokkos::View<T**, Kokkos::LayoutRight, MemorySpace> buffer;
  Kokkos::View<T**, Kokkos::LayoutStride, MemorySpace> key;
  Kokkos::View<T**, Kokkos::LayoutStride, MemorySpace> gate;
};

template <class T, class MemorySpace>
InterleavedInput<T, MemorySpace> interleaved(Matrix const& key,
                                             Matrix const& gate) {
  Matrix both(key.rows, 2 * key.cols);
  for (int r = 0; r < key.rows; ++r)
    for (int c = 0; c < key.cols; ++c) {
      both.at(r, c) = key.at(r, c);
      both.at(r, key.cols + c) = gate.at(r, c);
    }
  InterleavedInput<T, MemorySpace> in;
  in.buffer = to_view<T, MemorySpace>(both, "key_gate");
  int const D = key.cols;
  in.key = Kokkos::subview(in.buffer, Kokkos::ALL, std::make_pair(0, D));
  in.gate = Kokkos::subview(in.buffer, Kokkos::ALL, std::make_pair(D, 2 * D));
  return in;
}

// docs/pools.md, "Tolerances", against an f64 reference:
//   f64:       1e-12 relative
//   f32:       1e-5 relative
//   bf16, f16: one unit in the last place of the storage type, plus the
//              f32 computation's own 1e-5 relative
// "Relative" is to max(|ref|, scale), scale = sum_m w_m |key_m|: a pool that
// cancels to near zero is judged against the size of its terms.
inline double tolerance(DType t, double ref, double scale) {
  double const mag = std::max(std::fabs(ref), scale);
  switch (t) {
    case DType::f64: return 1e-12 * mag + 1e-300;
    case DType::f32: return 1e-5 * mag + 1e-30;
    default: return KPoolRef::ulp(t, ref) + 1e-5 * scale;
  }
}

template <class T>
::testing::AssertionResult pool_matches(DType t, T const* got,
                                        std::ptrdiff_t stride,
                                        double const* ref, double const* scale,
                                        int D) {
  for (int c = 0; c < D; ++c) {
    double const g = to_double(got[c * stride]);
    if (!std::isfinite(ref[c])) {
      // Non-finite inputs propagate as IEEE arithmetic does (docs/pools.md):
      // exactly the reference's NaN or infinity.
      if (std::isnan(ref[c]) ? !std::isnan(g) : g != ref[c])
        return ::testing::AssertionFailure()
               << "channel " << c << ": got " << g << ", reference " << ref[c];
      continue;
    }
    double const tol = tolerance(t, ref[c], scale[c]);
    if (!(std::fabs(g - ref[c]) <= tol))
      return ::testing::AssertionFailure()
             << "channel " << c << ": got " << g << ", reference " << ref[c]
             << " (scale " << scale[c] << ", tolerance " << tol << ")";
  }
  return ::testing::AssertionSuccess();
}

inline std::string shape(int K, int D) {
  std::ostringstream s;
  s << "K=" << K << " D=" << D;
  return s.str();
}

// A ragged batch from (cache length, rows) per live request, padded to B
// with dead rows. `device` carries garbage in the dead rows (the kernels
// must not look at them); `reference` carries harmless values there, since
// the reference checks every row.
struct TestBatch {
  KPoolRef::Batch device;
  KPoolRef::Batch reference;
};

inline TestBatch make_batch(
    std::vector<std::pair<std::uint32_t, std::uint32_t>> const& live, int B,
    Rng& rng, int max_slots = 0) {
  TestBatch t;
  KPoolRef::Batch& b = t.device;
  b.num_requests = static_cast<int>(live.size());
  b.row_offsets.push_back(0);
  for (auto const& cn : live) {
    b.cache_lengths.push_back(cn.first);
    b.row_offsets.push_back(b.row_offsets.back() + cn.second);
  }
  t.reference = b;
  for (int r = b.num_requests; r < B; ++r) {
    b.cache_lengths.push_back(static_cast<std::uint32_t>(rng.next()));
    b.row_offsets.push_back(static_cast<std::uint32_t>(rng.next()));
    t.reference.cache_lengths.push_back(0);
    t.reference.row_offsets.push_back(t.reference.row_offsets.back());
  }
  if (max_slots > 0) {
    // Distinct live slots in random order; dead rows point anywhere.
    std::vector<std::uint32_t> slots(max_slots);
    for (int s = 0; s < max_slots; ++s) slots[s] = s;
    for (int s = max_slots - 1; s > 0; --s) std::swap(slots[s], slots[rng.below(s + 1)]);
    for (int r = 0; r < B; ++r)
      b.slot_idx.push_back(r < b.num_requests ? slots[r]
                                              : static_cast<std::uint32_t>(rng.next()));
    t.reference.slot_idx = b.slot_idx;
  }
  return t;
}

inline std::uint32_t total_rows(KPoolRef::Batch const& b) {
  return b.row_offsets[b.num_requests];
}

// Random keys (in [-2, 2)), gate scores (in [-gate_range, gate_range)) and
// ape for every live row of a batch:
//   auto const [rows, key, gate, ape] = ragged_inputs(rng, t, batch, K, D);
struct RaggedInputs {
  int rows;
  Matrix key, gate, ape;
};

inline RaggedInputs ragged_inputs(Rng& rng, DType t, TestBatch const& batch, int K,
                                  int D, double gate_range = 4) {
  int const rows = static_cast<int>(total_rows(batch.device));
  Matrix key = random_matrix(rng, t, rows, D, -2, 2);
  Matrix gate = random_matrix(rng, t, rows, D, -gate_range, gate_range);
  return RaggedInputs{rows, std::move(key), std::move(gate), random_ape(rng, K, D)};
}

// Inputs are a function of (sequence, position, channel, sending), never of
// how the tokens were batched; each re-send of a position (`revision`)
// gets new values.
inline double input(std::uint64_t seq, std::uint64_t pos, int c, int which, DType t,
             int revision = 0) {
  Rng r((seq * 0x9E3779B97F4A7C15ull) ^ (pos * 0xC2B2AE3D27D4EB4Full) ^
        (static_cast<std::uint64_t>(c) * 0x165667B19E3779F9ull + which +
         8 * static_cast<std::uint64_t>(revision)));
  return KPoolRef::round_to(t, r.uniform(which ? -5 : -2, which ? 5 : 2));
}

// The ring: random contents standing for earlier calls, loaded into a
// KPool::Ring, and compared back bit for bit (the ring only ever holds
// copies of stored values).
inline KPoolRef::Ring random_ring(Rng& rng, DType t, int slots, int K, int D,
                                  int R = 0) {
  KPoolRef::Ring r(slots, K, D, R > 0 ? R : K);
  for (double& x : r.data) x = KPoolRef::round_to(t, rng.uniform(-3, 3));
  return r;
}

// Every slot of `ring` holds its sequence's positions [0, length) and
// was sent nothing past them (Ring::state(): start 0, L = length,
// H = high), as earlier calls would have left it (docs/ring.md, "What a
// slot holds").
template <class T, class M>
void hold_positions(KPool::Ring<T, M> const& ring, std::uint32_t length, std::uint32_t high) {
  auto h = Kokkos::create_mirror_view(ring.state());
  for (std::size_t s = 0; s < h.extent(0); ++s) {
    h(s, 0) = 0;
    h(s, 1) = length;
    h(s, 2) = high;
  }
  Kokkos::deep_copy(ring.state(), h);
}

// The ring's contents stand for earlier calls of unknown length: every
// slot holds every position (start 0, L = 2^31 - 1) and H = 1, so that
// any start continues the sequence within the ring's depth (docs/ring.md,
// "No gaps"): a test of one call at arbitrary starts over a random ring.
template <class T, class M>
void load_ring(KPool::Ring<T, M> const& ring, KPoolRef::Ring const& ref) {
  auto h = Kokkos::create_mirror_view(ring.tail());
  for (int s = 0; s < ref.max_slots; ++s)
    for (int w = 0; w < 2; ++w)
      for (int m = 0; m < ref.R; ++m)
        for (int c = 0; c < ref.D; ++c)
          h(s, w, m, c) = to_storage<T>(ref.at(s, w, m, c));
  Kokkos::deep_copy(ring.tail(), h);
  hold_positions(ring, 0x7FFFFFFFu, 1);
}

// A KPool::Ring of ref's shape (slots, K, D, R) holding ref's contents,
// as load_ring leaves it.
template <class T, class M, class E>
KPool::Ring<T, M> loaded_ring(E const& space, KPoolRef::Ring const& ref) {
  KPool::Ring<T, M> ring(space, ref.max_slots, ref.K, ref.D, ref.R);
  load_ring(ring, ref);
  return ring;
}

// A decode call's random inputs: key (in [-2, 2)) and gate (in [-4, 4)) of
// `rows` rows, ape, and a random ring of `slots` slots standing for
// earlier calls, drawn in that order:
//   auto [key, gate, ape, ref_ring] = decode_inputs(rng, t, B * next_n, slots, K, D);
struct DecodeInputs {
  Matrix key, gate, ape;
  KPoolRef::Ring ring;
};

inline DecodeInputs decode_inputs(Rng& rng, DType t, int rows, int slots, int K, int D) {
  // A braced list is evaluated left to right: the draws keep their order.
  return DecodeInputs{random_matrix(rng, t, rows, D, -2, 2), random_matrix(rng, t, rows, D, -4, 4),
                      random_ape(rng, K, D), random_ring(rng, t, slots, K, D)};
}

template <class T, class M>
::testing::AssertionResult ring_equals(KPool::Ring<T, M> const& ring,
                                       KPoolRef::Ring const& ref) {
  auto const h = on_host(ring.tail());
  for (int s = 0; s < ref.max_slots; ++s)
    for (int w = 0; w < 2; ++w)
      for (int m = 0; m < ref.R; ++m)
        for (int c = 0; c < ref.D; ++c)
          if (!same_bits(h(s, w, m, c), to_storage<T>(ref.at(s, w, m, c))))
            return ::testing::AssertionFailure()
                   << "ring slot " << s << (w ? " gate" : " key") << " index "
                   << m << " channel " << c << ": " << to_double(h(s, w, m, c))
                   << " != " << ref.at(s, w, m, c);
  return ::testing::AssertionSuccess();
}

// Views of a ragged batch's index arrays.
template <class M>
struct BatchViews {
  Kokkos::View<std::uint32_t*, M> row_offsets, cache_lengths, slot_idx;
  explicit BatchViews(KPoolRef::Batch const& b)
      : row_offsets(to_index_view<Kokkos::View<std::uint32_t*, M>>(b.row_offsets, "row_offsets")),
        cache_lengths(to_index_view<Kokkos::View<std::uint32_t*, M>>(b.cache_lengths, "cache_lengths")),
        slot_idx(to_index_view<Kokkos::View<std::uint32_t*, M>>(b.slot_idx, "slot_idx")) {}
};

// The engine a test's workspace is built for: the one asked for, except
// blas where it does not exist (a device memory space, or no Kokkos
// Kernels), which becomes the default: a workspace refuses to be built for
// an engine its space cannot run (tested on its own).
template <class MemorySpace>
KPool::ScoreEngine workspace_engine(KPool::ScoreEngine e) {
  if (e != KPool::ScoreEngine::blas) return e;
  bool const blas = KPOOL_HAS_KOKKOSKERNELS &&
                    Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible;
  return blas ? KPool::ScoreEngine::blas : KPool::ScoreEngine::automatic;
}

// A View's bytes, copied to the host (for bit-for-bit comparisons).
template <class V>
std::vector<unsigned char> raw_bytes(V const& v) {
  auto const h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  auto const* p = reinterpret_cast<unsigned char const*>(h.data());
  return std::vector<unsigned char>(p, p + h.span() * sizeof(typename V::value_type));
}

// Every entry of a View uniform in [lo, hi), rounded to its value type.
template <class V>
void fill_uniform(Rng& rng, V const& v, double lo, double hi) {
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < h.span(); ++i)
    h.data()[i] = static_cast<typename V::value_type>(static_cast<float>(rng.uniform(lo, hi)));
  Kokkos::deep_copy(v, h);
}

// What a refusal must say: the entry point and argument always, the value,
// a part of what(), the row and the whole of what() where given.
struct Refusal {
  static constexpr std::int64_t any_row = std::numeric_limits<std::int64_t>::min();
  char const* entry;
  char const* argument;
  char const* value = nullptr;
  char const* words = nullptr;
  std::int64_t row = any_row;
  char const* what = nullptr;
};

// call() must throw KPool::InvalidArgument saying `r`.
template <class F>
void expect_refused(F const& call, Refusal const& r) {
  try {
    call();
    ADD_FAILURE() << r.entry << " accepted what it must refuse (argument " << r.argument << ")";
  } catch (KPool::InvalidArgument const& e) {
    EXPECT_EQ(e.entry_point(), r.entry);
    EXPECT_EQ(e.argument(), r.argument);
    if (r.value) {
      EXPECT_EQ(e.value(), r.value);
    }
    if (r.words) {
      EXPECT_NE(std::string(e.what()).find(r.words), std::string::npos) << e.what();
    }
    if (r.row != Refusal::any_row) {
      EXPECT_EQ(e.row(), r.row);
    }
    if (r.what) {
      EXPECT_STREQ(e.what(), r.what);
    }
  }
}

// The names a typed test's body gives its configuration (TypeParam, a
// Config): C, its storage type T, execution space E and memory space M.
#define KPOOL_TEST_CONFIG_NAMES          \
  using C = TypeParam;                   \
  using T = typename C::value_type;      \
  using E = typename C::execution_space; \
  using M = typename C::memory_space

// A LayerConfig of the sizes every layer test gives: K, head_dim, heads,
// slots, batch rows, token rows, cache blocks and pools a block; the rest
// at LayerConfig's defaults, for the test to set.
inline KPool::LayerConfig layer_config(int kpool, int head_dim, int num_heads, int max_slots,
                                       int max_batch, std::size_t max_tokens, int num_blocks,
                                       int block_pools) {
  KPool::LayerConfig c;
  c.kpool = kpool;
  c.head_dim = head_dim;
  c.num_heads = num_heads;
  c.max_slots = max_slots;
  c.max_batch = max_batch;
  c.max_tokens = max_tokens;
  c.num_blocks = num_blocks;
  c.block_pools = block_pools;
  return c;
}

// The names the tests on the default execution space use.
namespace OnDefaultSpace {
using E = Kokkos::DefaultExecutionSpace;
using M = E::memory_space;
using U32 = Kokkos::View<std::uint32_t*, M>;
using I1 = Kokkos::View<std::int32_t*, M>;
using I2 = Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M>;
using F2 = Kokkos::View<float**, Kokkos::LayoutRight, M>;
using F3 = Kokkos::View<float***, Kokkos::LayoutRight, M>;
}  // namespace OnDefaultSpace

}  // namespace KPoolTest

#endif
