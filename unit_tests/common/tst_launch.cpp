// How KPool launches (README "One serving step", issue: CUDA correctness
// without a GPU): launch shapes decided by backend, work-item counts
// checked in 64 bits, the offset scan's team size, and no host
// synchronization unless validation is on, then only of the caller's
// execution space instance, observed through Kokkos Tools callbacks.

#include <KPoolTestUtils.hpp>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>
#include <utility>

// A stand-in for a GPU backend whose memory the host can read (CUDA with
// UVM, a GH200, HIP on an MI300A): Kokkos Tools tag it as CUDA, its memory
// space is HostSpace.
struct UnifiedMemoryGpu {
  using memory_space = Kokkos::HostSpace;
};
// A stand-in for an AMD GPU backend, known only by its Kokkos Tools tag.
struct WavefrontGpu {};
namespace Kokkos {
namespace Tools {
namespace Experimental {
template <>
struct DeviceTypeTraits<UnifiedMemoryGpu> {
  static constexpr DeviceType id = DeviceType::Cuda;
};
template <>
struct DeviceTypeTraits<WavefrontGpu> {
  static constexpr DeviceType id = DeviceType::HIP;
};
}  // namespace Experimental
}  // namespace Tools
}  // namespace Kokkos

namespace {

using namespace KPoolTest;

using namespace KPoolTest::OnDefaultSpace;
using T = KPool::bfloat16;

// Device launch shapes follow the backend, not whether the host can reach
// the backend's memory.
TEST(LaunchShapes, DeviceIsDecidedByBackendNotByMemory) {
  using KPool::Details::KokkosExt::is_device_backend;
  EXPECT_TRUE(is_device_backend<UnifiedMemoryGpu>::value);
  EXPECT_TRUE((Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                          UnifiedMemoryGpu::memory_space>::accessible));
  EXPECT_FALSE(is_device_backend<Kokkos::DefaultHostExecutionSpace>::value);
#if defined(KOKKOS_ENABLE_SERIAL)
  EXPECT_FALSE(is_device_backend<Kokkos::Serial>::value);
#endif
}

// Device shapes everywhere in a KPool_TEST_DEVICE_SHAPES build, on device
// backends only otherwise; 16-byte packets and one item per team thread
// exactly when device shapes are on.
TEST(LaunchShapes, DeviceShapesFollowTheTestOption) {
  using H = Kokkos::DefaultHostExecutionSpace;
#if defined(KPOOL_TEST_DEVICE_SHAPES)
  bool const host_device_shapes = true;
#else
  bool const host_device_shapes = false;
#endif
  EXPECT_EQ(KPool::Details::device_shapes<H>::value, host_device_shapes);
  EXPECT_TRUE(KPool::Details::device_shapes<UnifiedMemoryGpu>::value);
  int const w16 = host_device_shapes ? 8 : 1;
  EXPECT_EQ((KPool::Details::packet_width<H, KPool::bfloat16>()), w16);
  EXPECT_EQ((KPool::Details::packet_width<H, KPool::float16>()), w16);
  EXPECT_EQ((KPool::Details::packet_width<H, float>()), host_device_shapes ? 4 : 1);
  EXPECT_EQ((KPool::Details::packet_width<H, double>()), host_device_shapes ? 2 : 1);
  EXPECT_EQ(KPool::Details::items_per_thread<H>(), host_device_shapes ? 1 : 16);
  EXPECT_EQ(KPool::Details::vector_lanes<H>(16), host_device_shapes ? 16 : 1);
  EXPECT_EQ(KPool::Details::vector_lanes<H>(100), host_device_shapes ? 32 : 1);
}

#if defined(KPOOL_IMPL_CHECK_WIDE_COPIES)
// A device-shapes build checks every 16- and 8-byte copy's alignment as a
// GPU would fault on it, and the abort names the kernel KPool launched.
struct WideCopies {
  unsigned char* bytes;
  int offset;
  int width;
  KOKKOS_INLINE_FUNCTION void operator()(
      KPool::Details::KokkosExt::TeamPolicy<E>::member_type const&) const {
    alignas(16) unsigned char v[16] = {};
    if (width == 16)
      KPool::Details::KokkosExt::copy_aligned_bytes<16>(v, bytes + offset);
    else
      KPool::Details::KokkosExt::copy_aligned_bytes<8>(bytes + offset, v);
  }
};

void launch_copies(unsigned char* bytes, int offset, int width) {
  KPool::Details::LaunchShape shape;
  shape.league = 1;
  KPool::Details::launch(E(), "KPool::test::wide_copy", shape, WideCopies{bytes, offset, width});
  E().fence();
}

TEST(DeviceShapes, AMisalignedWideCopyAbortsNamingItsKernel) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Kokkos::View<unsigned char*, M> buf("buf", 64);
  unsigned char* const p = buf.data();
  ASSERT_EQ(reinterpret_cast<std::uintptr_t>(p) % 16, 0u);
  launch_copies(p, 16, 16);  // aligned: fine
  launch_copies(p, 8, 8);
  EXPECT_DEATH(launch_copies(p, 4, 16),
               "misaligned 16-byte copy in kernel KPool::test::wide_copy");
  EXPECT_DEATH(launch_copies(p, 8, 16), "misaligned 16-byte copy");
  EXPECT_DEATH(launch_copies(p, 12, 8),
               "misaligned 8-byte copy in kernel KPool::test::wide_copy");
}
#endif

// The tensor-core engine's kernels are compiled only where they can run: a
// host (the 32-lane emulation) and CUDA with the instruction; never on an
// AMD GPU, where the engine is refused before any launch.
TEST(LaunchShapes, TheTensorCoreKernelsAreCompiledOnlyWhereTheyRun) {
  using KPool::Details::MmaKind;
  using KPool::Details::mma_kernel_runs;
  static_assert(mma_kernel_runs<Kokkos::DefaultHostExecutionSpace, MmaKind::e4m3>(), "host");
  static_assert(mma_kernel_runs<Kokkos::DefaultHostExecutionSpace, MmaKind::bf16>(), "host");
  static_assert(!mma_kernel_runs<WavefrontGpu, MmaKind::bf16>(), "HIP");
  static_assert(!mma_kernel_runs<WavefrontGpu, MmaKind::e4m3>(), "HIP");
  EXPECT_FALSE((KPool::Details::mma_plan<WavefrontGpu, KPool::bfloat16, KPool::float8_e4m3>(
                    true, false)
                    .usable));
}

// Vector lanes stop at the backend's lock-step group: a CUDA warp, an AMD
// wavefront; host backends under device shapes mimic CUDA.
TEST(LaunchShapes, VectorLanesStopAtTheBackendsLockStepGroup) {
  using KPool::Details::KokkosExt::max_vector_lanes;
  EXPECT_EQ(max_vector_lanes<UnifiedMemoryGpu>::value, 32);
  EXPECT_EQ(max_vector_lanes<WavefrontGpu>::value, 64);
  EXPECT_EQ(max_vector_lanes<Kokkos::DefaultHostExecutionSpace>::value, 32);
#if defined(KOKKOS_ENABLE_CUDA)
  EXPECT_EQ(max_vector_lanes<Kokkos::Cuda>::value, 32);
#endif
#if defined(KOKKOS_ENABLE_HIP)
  EXPECT_EQ(max_vector_lanes<KPool::Details::KokkosExt::HIP>::value, 64);
#endif
  for (int packets : {1, 2, 3, 16, 17, 32, 33, 64, 65, 1000}) {
    int expect = 1;
    while (expect < packets && expect < 64) expect *= 2;
    EXPECT_EQ(KPool::Details::vector_lanes<WavefrontGpu>(packets), expect) << packets;
    EXPECT_EQ(KPool::Details::vector_lanes<UnifiedMemoryGpu>(packets),
              expect < 32 ? expect : 32)
        << packets;
  }
}

// The single scanning team: a power of two (Kokkos before 3.7 aborts a
// CUDA team_scan otherwise), within what the backend allows, no larger
// than the rows need, and not needlessly small.
TEST(LaunchShapes, OffsetScanTeamIsAPowerOfTwoWithinTheLimit) {
  for (int limit = 1; limit <= 1024; ++limit)
    for (int rows : {0, 1, 31, 32, 33, 63, 64, 65, 70, 95, 96, 100, 127, 128,
                     129, 150, 159, 160, 255, 256, 1000, 5000}) {
      int const t = KPool::Details::scan_team_size(limit, rows);
      int const need = (rows + 1 + 31) / 32 * 32;
      int const cap = std::min(limit, need);
      ASSERT_GE(t, 1);
      ASSERT_EQ(t & (t - 1), 0) << "limit " << limit << " rows " << rows << ": " << t;
      ASSERT_LE(t, cap) << "limit " << limit << " rows " << rows;
      ASSERT_GT(2 * t, cap) << "limit " << limit << " rows " << rows;
    }
}

// Team sizes of kernels that scan over their team (Kokkos before 3.7
// aborts a CUDA team scan otherwise): the largest power of two not above
// what was asked, for every size a team can have.
TEST(LaunchShapes, TeamScanSizesRoundDownToAPowerOfTwo) {
  std::vector<int> sizes;
  for (int n = -2; n <= 4100; ++n) sizes.push_back(n);
  for (int n : {0x3FFFFFFF, 0x40000000, 0x40000001, 0x7FFFFFFE, 0x7FFFFFFF}) sizes.push_back(n);
  for (int n : sizes) {
    int const p = KPool::Details::power_of_two_floor(n);
    ASSERT_GE(p, 1) << n;
    ASSERT_EQ(p & (p - 1), 0) << n << " gave " << p;
    if (n >= 1) {
      ASSERT_LE(p, n) << n;
      ASSERT_GT(2 * static_cast<std::int64_t>(p), n) << n;
    } else {
      ASSERT_EQ(p, 1) << n;
    }
  }
}

// A row's pools go up to 2^32 - 1, past an int: the team loops over them
// (KokkosExt::team_range) visit every index of [begin, end) exactly once,
// in parallel_for and in parallel_scan (whose prefix counts the indices
// before), for ranges that cross 2^31 and end just below 2^32, with one
// thread a team and with as many as the backend gives (device shapes: the
// device's team size).
struct TeamRangeVisits {
  using member_type = KPool::Details::KokkosExt::TeamPolicy<E>::member_type;
  std::uint64_t begin, end;
  Kokkos::View<int*, M> visits;       // [end - begin]
  Kokkos::View<std::int64_t*, M> scanned;  // [end - begin]: the prefix seen
  KOKKOS_INLINE_FUNCTION void operator()(member_type const& member) const {
    using KPool::Details::KokkosExt::team_range;
    Kokkos::parallel_for(team_range(member, begin, end), [&](std::int64_t i) {
      std::int64_t const k = i - static_cast<std::int64_t>(begin);
      if (k >= 0 && k < static_cast<std::int64_t>(visits.extent(0)))
        Kokkos::atomic_add(&visits(k), 1);
      else
        Kokkos::atomic_add(&visits(0), 1000);  // outside the range
    });
    member.team_barrier();
    Kokkos::parallel_scan(team_range(member, begin, end),
                          [&](std::int64_t i, std::int64_t& prefix, bool final) {
                            std::int64_t const k = i - static_cast<std::int64_t>(begin);
                            if (final && k >= 0 && k < static_cast<std::int64_t>(scanned.extent(0)))
                              scanned(k) = prefix;
                            prefix += 1;
                          });
  }
};

TEST(LaunchShapes, TeamRangesOverLongRowsAre64Bit) {
  E space;
  KPool::Details::KokkosExt::TeamPolicy<E> const probe(space, 1, 1, 1);
  int const max = probe.team_size_max(TeamRangeVisits{}, Kokkos::ParallelForTag());
  for (int team : {1, KPool::Details::power_of_two_floor(max)})
    for (auto const& [begin, end] : std::vector<std::pair<std::uint64_t, std::uint64_t>>{
             {0, 1000},
             {0x7FFFFFFFull - 3000, 0x7FFFFFFFull},
             {0x80000000ull - 2500, 0x80000000ull + 2500},
             {0xFFFFFFFFull - 3000, 0xFFFFFFFFull}}) {
      SCOPED_TRACE("team size " + std::to_string(team) + ", range [" + std::to_string(begin) +
                   ", " + std::to_string(end) + ")");
      std::size_t const n = end - begin;
      TeamRangeVisits f{begin, end, Kokkos::View<int*, M>("visits", n),
                        Kokkos::View<std::int64_t*, M>("scanned", n)};
      Kokkos::deep_copy(f.scanned, -1);
      Kokkos::parallel_for("team_range", KPool::Details::KokkosExt::TeamPolicy<E>(space, 1, team, 1), f);
      auto const v = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), f.visits);
      auto const p = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), f.scanned);
      for (std::size_t k = 0; k < n; ++k) {
        ASSERT_EQ(v(k), 1) << "index " << begin + k << " visited " << v(k) << " times";
        ASSERT_EQ(p(k), static_cast<std::int64_t>(k)) << "scan prefix at " << begin + k;
      }
    }
}

// League sizes are ints and kernels index items as ints: work-item counts
// are checked in 64 bits and past 2^31 - 1 throw a named error rather
// than wrapping around.
TEST(LaunchShapes, WorkItemsPast2To31ThrowANamedError) {
  KPool::Details::Checker const chk("KPool::compress");
  EXPECT_EQ(KPool::Details::league_for(chk, "key", 0, 16), 0);
  EXPECT_EQ(KPool::Details::league_for(chk, "key", 33, 16), 3);
  EXPECT_EQ(KPool::Details::league_for(chk, "key", 0x7FFFFFFFull, 1), 0x7FFFFFFF);
  EXPECT_EQ(KPool::Details::league_for(chk, "key", 0x7FFFFFF0ull, 16), 0x7FFFFFF);
  for (std::uint64_t items : std::vector<std::uint64_t>{
           0x80000000ull, 0x7FFFFFFFull + 16, 1ull << 40,
           std::numeric_limits<std::uint64_t>::max()}) {
    try {
      KPool::Details::league_for(chk, "key", items, 16);
      ADD_FAILURE() << items << " work items did not throw";
    } catch (KPool::InvalidArgument const& e) {
      EXPECT_EQ(e.entry_point(), "KPool::compress");
      EXPECT_EQ(e.argument(), "key");
      EXPECT_EQ(e.value(), std::to_string(items));
    }
  }
}

// The same through an entry point: a compress whose views claim 2^33 rows
// (unmanaged, over a few real elements, never read) throws with validation
// off, before anything is written, instead of launching a wrapped-around
// league.
TEST(LaunchShapes, CompressOfMoreThan2To31PoolsThrowsBeforeWriting) {
  E space;
  using Huge = Kokkos::View<T**, Kokkos::LayoutRight, M,
                            Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  Kokkos::View<T*, M> few("few", 16);
  std::size_t const rows = std::size_t(1) << 33;
  Huge const key(few.data(), rows, 1), pooled(few.data(), rows, 1);
  Kokkos::View<float**, Kokkos::LayoutRight, M> ape("ape", 1, 1);
  U32 const row_offsets =
      to_index_view<U32>(std::vector<std::uint32_t>{0, 4}, "row_offsets");
  U32 const cache_lengths = to_index_view<U32>(std::vector<std::uint32_t>{0}, "cl");
  U32 offsets("pool_row_offsets", 2);
  Kokkos::deep_copy(offsets, 777u);
  KPool::Options o;
  o.validate = false;
  try {
    KPool::compress(space, key, key, ape, KPool::ragged_batch(row_offsets, cache_lengths, 1),
                    offsets, pooled, o);
    ADD_FAILURE() << "no exception";
  } catch (KPool::InvalidArgument const& e) {
    EXPECT_EQ(e.entry_point(), "KPool::compress");
    EXPECT_EQ(e.argument(), "key");
  }
  auto const h = on_host(offsets);
  EXPECT_EQ(h(0), 777u);
  EXPECT_EQ(h(1), 777u);
}

// Batch sizes are ints as well: a row_offsets view of 2^31 + 1 entries
// (unmanaged, never read) is refused before anything runs.
TEST(LaunchShapes, BatchOfMoreThan2To31RequestsThrows) {
  E space;
  using Huge = Kokkos::View<std::uint32_t*, M, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  U32 few("few", 16);
  std::size_t const B = std::size_t(1) << 31;
  Huge const row_offsets(few.data(), B + 1), cache_lengths(few.data(), B),
      offsets(few.data(), B + 1);
  // 16 key rows, K = 4.
  Kokkos::View<T**, Kokkos::LayoutRight, M> const key("key", 16, 1);
  Kokkos::View<float**, Kokkos::LayoutRight, M> const ape("ape", 4, 1);
  KPool::Options o;
  o.validate = false;
  try {
    KPool::compute_pool_row_offsets(space, key, ape,
                                    KPool::ragged_batch(row_offsets, cache_lengths, 1), offsets,
                                    o);
    ADD_FAILURE() << "no exception";
  } catch (KPool::InvalidArgument const& e) {
    EXPECT_EQ(e.argument(), "row_offsets");
    EXPECT_EQ(e.value(), std::to_string(B + 1));
  }
}

// Kokkos Tools events while armed: fences (name, device id), deep copies
// and kernel launches (labels).
struct Recorder {
  bool armed = false;
  std::vector<std::pair<std::string, std::uint32_t>> fences;
  int deep_copies = 0;
  std::vector<std::string> launches;
};
Recorder recorder;

// Kokkos 4.x fences before each tool callback of a tool that asks for
// global fencing, the default for callbacks set after initialization (this
// test's): "Kokkos::Tools::invoke_kokkosp_callback: Kokkos Profile Tool
// Fence". Those fences exist only because a tool is listening, so they are
// not counted; every other fence is.
bool tool_fence(char const* name) {
  return std::strstr(name, "Kokkos Profile Tool Fence") != nullptr;
}
void on_fence(char const* name, std::uint32_t device_id, std::uint64_t*) {
  if (recorder.armed && !tool_fence(name)) recorder.fences.emplace_back(name, device_id);
}
void on_launch(char const* name, std::uint32_t, std::uint64_t*) {
  if (recorder.armed) recorder.launches.emplace_back(name);
}
void on_deep_copy(Kokkos::Tools::SpaceHandle, char const*, void const*,
                  Kokkos::Tools::SpaceHandle, char const*, void const*,
                  std::uint64_t) {
  if (recorder.armed) ++recorder.deep_copies;
}

class HostSync : public ::testing::Test {
 protected:
  void SetUp() override {
    Kokkos::fence();
    recorder = Recorder();
    Kokkos::Tools::Experimental::set_begin_fence_callback(on_fence);
    Kokkos::Tools::Experimental::set_begin_deep_copy_callback(on_deep_copy);
    Kokkos::Tools::Experimental::set_begin_parallel_for_callback(on_launch);
  }
  void TearDown() override {
    Kokkos::Tools::Experimental::set_begin_fence_callback(nullptr);
    Kokkos::Tools::Experimental::set_begin_deep_copy_callback(nullptr);
    Kokkos::Tools::Experimental::set_begin_parallel_for_callback(nullptr);
  }
  // Runs f with the recorder armed; everything queued before is finished.
  template <class F>
  Recorder record(F&& f) {
    Kokkos::fence();
    recorder = Recorder();
    recorder.armed = true;
    f();
    recorder.armed = false;
    Recorder r = recorder;
    Kokkos::fence();
    return r;
  }
};

// A general step's and a decode step's inputs, K = 4, D = 128 (the
// compile-time fast path), two requests.
struct Steps {
  static constexpr int K = 4, D = 128, B = 3, slots = 4, next_n = 2;
  E space;
  KPool::Ring<T, M> ring{space, slots, K, D};
  Kokkos::View<T**, Kokkos::LayoutRight, M> key{"key", 16, D}, gate{"gate", 16, D};
  Kokkos::View<float**, Kokkos::LayoutRight, M> ape{"ape", K, D};
  U32 row_offsets = to_index_view<U32>(std::vector<std::uint32_t>{0, 9, 12, 12}, "ro");
  U32 cache_lengths = to_index_view<U32>(std::vector<std::uint32_t>{2, 7, 0}, "cl");
  U32 slot_idx = to_index_view<U32>(std::vector<std::uint32_t>{3, 1, 0}, "slots");
  Kokkos::View<T***, Kokkos::LayoutRight, M> dkey{"dkey", B, next_n, D},
      dgate{"dgate", B, next_n, D};
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> positions{"positions", B, next_n};
  KPool::StepOutput<T, M> out{space, KPool::StepOutput<T, M>::capacity_for(16, B, K), B, D};
  // An fp8 rotated cache, 2 pools a block: row r's pools 0..5 in blocks
  // 3r .. 3r + 2.
  KPool::PoolCache<KPool::float8_e4m3, M> cache{space, 9, 2, D, K, KPool::CacheScale::amax, true};
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> block_table{"block_table", B, 3};

  Steps() {
    auto h = Kokkos::create_mirror_view(positions);
    for (int r = 0; r < B; ++r)
      for (int i = 0; i < next_n; ++i) h(r, i) = 4 * r + 2 + i;
    Kokkos::deep_copy(positions, h);
    auto t = Kokkos::create_mirror_view(block_table);
    for (int r = 0; r < B; ++r)
      for (int c = 0; c < 3; ++c) t(r, c) = 3 * r + c;
    Kokkos::deep_copy(block_table, t);
  }
  void step(bool fused, bool validate, bool cached = false) {
    KPool::Options o;
    o.fused = fused;
    o.validate = validate;
    auto const batch = KPool::ragged_batch(row_offsets, cache_lengths, slot_idx, 2);
    if (cached)
      KPool::step(space, ring, key, gate, ape, batch, KPool::paged(cache, block_table), out, o);
    else
      KPool::step(space, ring, key, gate, ape, batch, out, o);
  }
  void decode(bool validate, bool cached = false) {
    KPool::Options o;
    o.validate = validate;
    auto const batch = KPool::decode_batch(positions, slot_idx, 2);
    if (cached)
      KPool::step(space, ring, dkey, dgate, ape, batch, KPool::paged(cache, block_table), out, o);
    else
      KPool::step(space, ring, dkey, dgate, ape, batch, out, o);
  }
};

// With validation off nothing waits for the host: no fence, no deep copy,
// so steps on different streams overlap and a step can be captured in a
// CUDA graph.
TEST_F(HostSync, StepsWithoutValidationNeitherFenceNorCopy) {
  Steps s;
  for (bool cached : {false, true}) {
    std::string const with = cached ? " with a pool cache" : "";
    for (bool fused : {true, false}) {
      Recorder const r = record([&] { s.step(fused, false, cached); });
      EXPECT_TRUE(r.fences.empty()) << (fused ? "fused" : "three-launch") << " step" << with
                                    << " fenced: " << r.fences.front().first;
      EXPECT_EQ(r.deep_copies, 0) << (fused ? "fused" : "three-launch") << " step" << with;
    }
    Recorder const r = record([&] { s.decode(false, cached); });
    EXPECT_TRUE(r.fences.empty()) << "decode step" << with << " fenced: " << r.fences.front().first;
    EXPECT_EQ(r.deep_copies, 0) << "decode step" << with;
  }
}

// Writing the pool cache inside the step adds no launch: the steps' own
// kernels write it (two for a fused step or a decode step, four for a
// three-launch step, the same labels). Where the path is the second pass
// (common/detail/KPool_CachePath.hpp: hosts, 16-bit prefill pools) exactly one
// launch follows the step's own, "KPool::step::cache" or
// "KPool::step::decode_cache". Each path forced gives its own launches.
template <KPool::Details::CacheWritePath P>
std::vector<std::string> expected_launches(std::vector<std::string> plain,
                                           std::string const& label) {
  if (P == KPool::Details::CacheWritePath::second_pass) plain.push_back(label);
  return plain;
}

TEST_F(HostSync, StepsWriteTheCacheInTheirOwnLaunchesOrOneMore) {
  using KPool::Details::CacheItems;
  using KPool::Details::CacheWritePath;
  using Table = decltype(Steps::block_table);
  constexpr CacheWritePath step_path = KPool::Details::cache_write_path<E, T, CacheItems::step>();
  constexpr CacheWritePath decode_path =
      KPool::Details::cache_write_path_for<E, T, CacheItems::decode>(2);
  Steps s;
  KPool::Options o;
  o.validate = false;
  // The step with its cache write forced onto the path P of a tag
  // std::integral_constant<CacheWritePath, P>.
  auto const forced = [&](auto path) {
    using Arg = KPool::Details::CacheArg<KPool::float8_e4m3, M, Table, decltype(path)::value>;
    return record([&] {
      KPool::Details::step_impl(s.space, s.ring, s.key, s.gate, s.ape, s.row_offsets,
                                s.cache_lengths, s.slot_idx, 2, s.out,
                                Arg{&s.cache, &s.block_table}, o);
    });
  };
  for (bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused step" : "three-launch step");
    o.fused = fused;
    Recorder const plain = record([&] { s.step(fused, false); });
    EXPECT_EQ(plain.launches.size(), fused ? 2u : 4u);
    Recorder const cached = record([&] { s.step(fused, false, true); });
    EXPECT_EQ(cached.launches,
              expected_launches<step_path>(plain.launches, "KPool::step::cache"));
    Recorder const in_step =
        forced(std::integral_constant<CacheWritePath, CacheWritePath::in_step>());
    EXPECT_EQ(in_step.launches, plain.launches);
    Recorder const pass =
        forced(std::integral_constant<CacheWritePath, CacheWritePath::second_pass>());
    EXPECT_EQ(pass.launches, expected_launches<CacheWritePath::second_pass>(
                                 plain.launches, "KPool::step::cache"));
    // The pass reads the count on the device: nothing waits for the host.
    EXPECT_TRUE(pass.fences.empty() && pass.deep_copies == 0);
  }
  Recorder const plain = record([&] { s.decode(false); });
  Recorder const cached = record([&] { s.decode(false, true); });
  EXPECT_EQ(plain.launches.size(), 2u);
  EXPECT_EQ(cached.launches,
            expected_launches<decode_path>(plain.launches, "KPool::step::decode_cache"))
      << "decode step";
  Recorder const pass = record([&] {
    KPool::Details::decode_step_impl(
        s.space, s.ring, s.dkey, s.dgate, s.ape, s.positions, s.slot_idx, 2, s.out,
        KPool::Details::CacheArg<KPool::float8_e4m3, M, Table, CacheWritePath::second_pass>{
            &s.cache, &s.block_table},
        o);
  });
  EXPECT_EQ(pass.launches, expected_launches<CacheWritePath::second_pass>(
                               plain.launches, "KPool::step::decode_cache"))
      << "decode step, second pass";
  EXPECT_TRUE(pass.fences.empty() && pass.deep_copies == 0) << "decode step, second pass";
}

// The host rule for a decode call's cache (common/detail/KPool_CachePath.hpp):
// in the step below 64 requests, one more launch, the second pass, from 64
// on; devices and device shapes always in the step. Each call is a cached
// decode step of `requests` requests, one pool closed each, its launches
// against the same call without the cache, and its cache bytes against
// the two paths forced.
struct DecodeCall {
  static constexpr int K = 4, D = 128, next_n = K;
  E space;
  int requests;
  KPool::Ring<T, M> ring;
  Kokkos::View<T***, Kokkos::LayoutRight, M> dkey, dgate;
  Kokkos::View<float**, Kokkos::LayoutRight, M> ape{"ape", K, D};
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> positions;
  U32 slot_idx;
  KPool::StepOutput<T, M> out;
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> block_table;
  explicit DecodeCall(int n)
      : requests(n),
        ring(space, n, K, D),
        dkey("dkey", n, next_n, D),
        dgate("dgate", n, next_n, D),
        positions("positions", n, next_n),
        slot_idx("slot_idx", n),
        out(space, KPool::StepOutput<T, M>::capacity_for(n * next_n, n, K), n, D),
        block_table("block_table", n, 1) {
    Rng rng(static_cast<std::uint64_t>(n));
    fill_uniform(rng, dkey, -1, 1);
    fill_uniform(rng, dgate, -1, 1);
    fill_uniform(rng, ape, -1, 1);
    auto p = Kokkos::create_mirror_view(positions);
    auto s = Kokkos::create_mirror_view(slot_idx);
    auto t = Kokkos::create_mirror_view(block_table);
    for (int r = 0; r < n; ++r) {
      for (int i = 0; i < next_n; ++i) p(r, i) = i;
      s(r) = static_cast<std::uint32_t>(r);
      t(r, 0) = r;
    }
    Kokkos::deep_copy(positions, p);
    Kokkos::deep_copy(slot_idx, s);
    Kokkos::deep_copy(block_table, t);
  }
  KPool::PoolCache<KPool::float8_e4m3, M> new_cache() {
    return KPool::PoolCache<KPool::float8_e4m3, M>(space, requests, 1, D, K,
                                                   KPool::CacheScale::amax, true);
  }
  // A fresh ring (its own launches), then the call alone.
  void reset() {
    ring = KPool::Ring<T, M>(space, requests, K, D);
    space.fence();
  }
  template <KPool::Details::CacheWritePath P>
  void run(KPool::PoolCache<KPool::float8_e4m3, M> const* cache) {
    KPool::Options o;
    o.validate = false;
    if (!cache) {
      KPool::step(space, ring, dkey, dgate, ape, KPool::decode_batch(positions, slot_idx, requests),
                  out, o);
    } else {
      KPool::Details::decode_step_impl(
          space, ring, dkey, dgate, ape, positions, slot_idx, requests, out,
          KPool::Details::CacheArg<KPool::float8_e4m3, M, decltype(block_table), P>{cache,
                                                                                    &block_table},
          o);
    }
  }
};

std::vector<unsigned char> cache_bytes(KPool::PoolCache<KPool::float8_e4m3, M> const& c) {
  std::vector<unsigned char> v = raw_bytes(c.values());
  std::vector<unsigned char> const s = raw_bytes(c.scales());
  v.insert(v.end(), s.begin(), s.end());
  return v;
}

TEST_F(HostSync, DecodeCallsOf64RequestsWriteTheCacheByTheSecondPassOnHosts) {
  using KPool::Details::CacheWritePath;
  bool const device = KPool::Details::device_shapes<E>::value;
  for (int requests : {1, 63, 64, 130}) {
    SCOPED_TRACE(std::to_string(requests) + " requests");
    DecodeCall call(requests);
    call.reset();
    Recorder const plain = record([&] { call.run<CacheWritePath::automatic>(nullptr); });
    ASSERT_EQ(plain.launches.size(), 2u);
    auto automatic = call.new_cache();
    call.reset();
    Recorder const cached = record([&] { call.run<CacheWritePath::automatic>(&automatic); });
    call.space.fence();
    std::vector<std::string> expected = plain.launches;
    if (!device && requests >= 64) expected.push_back("KPool::step::decode_cache");
    EXPECT_EQ(cached.launches, expected);
    EXPECT_TRUE(cached.fences.empty() && cached.deep_copies == 0);
    // The bytes are those of either path forced.
    auto in_step = call.new_cache();
    auto pass = call.new_cache();
    call.reset();
    call.run<CacheWritePath::in_step>(&in_step);
    call.reset();
    call.run<CacheWritePath::second_pass>(&pass);
    call.space.fence();
    std::vector<unsigned char> const a = cache_bytes(automatic), b = cache_bytes(in_step),
                                     c = cache_bytes(pass);
    EXPECT_EQ(a, b);
    EXPECT_EQ(a, c);
    EXPECT_NE(std::count(a.begin(), a.end(), static_cast<unsigned char>(0)),
              static_cast<std::ptrdiff_t>(a.size()))
        << "the calls wrote nothing";
  }
}

// Validation reads the index arrays on the host: it fences, and only the
// caller's instance (a global Kokkos::fence would also wait for every other
// stream). Kokkos 3.4 reports no fence of its own to Kokkos Tools, so
// there the global half of the check sees nothing; from 3.5 on it does.
TEST_F(HostSync, ValidationFencesOnlyTheCallersInstance) {
  Steps s;
  Recorder const probe = record(
      [&] { KPool::Details::KokkosExt::fence(s.space, "probe"); });
  ASSERT_EQ(probe.fences.size(), 1u);
  std::uint32_t const instance = probe.fences[0].second;
#if KOKKOS_VERSION >= 30500
  Recorder const global = record([] { Kokkos::fence(); });
  ASSERT_FALSE(global.fences.empty());
  for (auto const& f : global.fences)
    ASSERT_NE(f.second, instance) << "a global fence is indistinguishable here";
#endif
  // Each call sends the same batch again, not its sequences' next tokens:
  // before each, outside the record, every slot holds every position, so
  // that the rows' starts continue their sequences.
  auto const fresh = [&](auto const& call) {
    s.space.fence();
    hold_positions(s.ring, 0x7FFFFFFFu, 1);
    return record(call);
  };
  std::vector<std::pair<std::string, Recorder>> runs;
  runs.emplace_back("fused step", fresh([&] { s.step(true, true); }));
  runs.emplace_back("three-launch step", fresh([&] { s.step(false, true); }));
  runs.emplace_back("decode step", fresh([&] { s.decode(true); }));
  runs.emplace_back("fused step with a pool cache", fresh([&] { s.step(true, true, true); }));
  runs.emplace_back("three-launch step with a pool cache",
                    fresh([&] { s.step(false, true, true); }));
  runs.emplace_back("decode step with a pool cache", fresh([&] { s.decode(true, true); }));
  for (auto const& [what, r] : runs) {
    EXPECT_FALSE(r.fences.empty()) << what << " validated without fencing";
    for (auto const& f : r.fences)
      EXPECT_EQ(f.second, instance)
          << what << ": fence '" << f.first << "' is not of the caller's instance";
  }
}

}  // namespace
