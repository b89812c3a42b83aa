// kpool_perf: KPool's kernels at serving shapes (D = 128, K = 4, bf16 and
// f32), each next to a plain Kokkos copy moving the same number of bytes on
// the same execution space instance.
//
//   kpool_perf [--quick] [--filter SUBSTRING[,SUBSTRING...]] [--out PATH] [--min-time S]
//
// Every timed entry is one (scenario, dtype, op): for example
// "prefill_b8_16k/bf16/compress". Per entry: one untimed call with
// validation on (the inputs must be valid), warm-up, then kernel and copy
// interleaved (kernel, copy, kernel, copy, ...) with a fence around each
// timed call, until --min-time seconds have passed (at least 5 runs, at most
// 200). The medians give GB/s; `ratio` = kernel GB/s / copy GB/s; the
// fastest runs are reported too (seconds_min, copy_seconds_min).
//
// `bytes` is the minimum traffic an op needs, counted from the batch
// description (see the *_bytes functions): every element read once plus
// every element written once, index arrays included; ring members a decode
// call stashed itself and closes in the same call are not counted as ring
// reads. The copy moves words = bytes / 16 uint64 words (read + write), so
// its byte count matches the kernel's.
//
// Every case runs with a ring of K entries except the speculative decode
// shape (decode_b*_n4_r8: next_n = 4, the next token and three drafts, on
// the serving ring of R = 8 entries); each case reports its `ring`.
//
// The pool cache ops (step_fused_cache_fp8 beside step_fused,
// decode_step_cache_fp8 beside decode_step) write every emitted pool into
// an fp8 (E4M3, amax scale) cache rotated by the Walsh-Hadamard transform,
// 16 pools a block. Their timed loop also runs the same step without the
// cache and then store_pools writing the same cache from that step's
// output rows (kernel, uncached kernel, store_pools, copy, ...), and the
// entry reports `baseline_op`, `baseline_seconds` (= `uncached_seconds`)
// and `overhead`: the median over runs of (cached time / uncached time) -
// 1, so both sides see the same machine state; `store_pools_seconds`; and
// the hosts' rule, cached <= uncached + store_pools (+ 5% for noise):
// `rule_ratio`, the median over runs of cached / (uncached + store_pools),
// with its 10th and 90th percentiles, the same ratio of the fastest runs
// (`rule_ratio_min_times`) and of process CPU time (`rule_ratio_cpu`, the
// median, and `rule_ratio_cpu_min`, of the least CPU times: every
// thread's, which a loaded machine's time slicing does not inflate), and
// `rule_holds` = rule_ratio <= 1.05; these entries take at least 15 runs. `cache_path` names the
// path the build's cached step takes (src/common/detail/KPool_CachePath.hpp);
// the ops *_cache_fp8_in_step and *_cache_fp8_second_pass force each path,
// the measurements the hosts' choice is made from. Their `bytes` add the
// cache entries written (D + 4 bytes a pool). store_pools_fp8 is also
// timed alone, beside the step without a cache: its overhead + 1 is the
// standalone write's time as a share of the step's.
// step_fused_cache_serving and decode_step_cache_serving write the serving
// profile's cache (docs/indexer.md, "The serving profile") on the same
// cases, reported beside step_fused_cache_fp8 and decode_step_cache_fp8:
// their overhead + 1 is the serving profile's cost relative to the amax
// one (target: at most 1.10).
//
// The selection stage (op `select`, when KPool has Kokkos Kernels) is
// compute-bound and measured in FLOPs instead: `flops` = 2 * H * D per
// scored (query, visible pool), `gflops` its rate, next to a same-run
// KokkosBlas::gemm of f32 [T * H, D] x [D, P] (P the mean visible pools, so
// the FLOP count matches): `gemm_gflops`, and `ratio` = gflops /
// gemm_gflops. Ops `select_<engine>` time the other scoring engines on the
// same inputs; `select_serving` the default engine over a serving-profile
// cache of the same bytes (its queries quantized inside the call), reported
// beside `select` with `baseline_op`, `baseline_seconds` and `overhead` as
// above (target: overhead + 1 at most 1.10). On the decode case,
// `select_fused` times the one-launch decode selection beside
// `select_separate`, and `select_ranks2` one rank's work of a selection
// over a cache sharded over 2 ranks (docs/ranks.md; local selection,
// exchange by copies, merge) beside `select_one_rank`, with `ranks` and
// `exchange_bytes_per_row`.
//
// Writes perf_report.json (or --out) in the current directory and prints its
// absolute path; perf_tests/perf_table.py prints it as a table.

#include <KPool.hpp>

#include <Kokkos_Core.hpp>
#if KPOOL_HAS_KOKKOSKERNELS
#include <KokkosBlas3_gemm.hpp>
#endif
#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
using Clock = std::chrono::steady_clock;

constexpr int kD = 128;
constexpr int kK = 4;

template <class T>
using View1 = Kokkos::View<T*, Kokkos::LayoutRight, Mem>;
template <class T>
using View2 = Kokkos::View<T**, Kokkos::LayoutRight, Mem>;
template <class T>
using View3 = Kokkos::View<T***, Kokkos::LayoutRight, Mem>;

// ---------------------------------------------------------------- settings

struct Settings {
  std::string filter;
  // --cases: exact entry names (scenario/dtype/op); some cases run only
  // when named here (named_only, device-sized).
  std::vector<std::string> cases;
  std::string out = "perf_report.json";
  // --lines, --summary: each case's JSON line and its printed line,
  // appended as the case ends, so a run cut short keeps what it measured.
  std::string lines, summary;
  // --describe: each selected case's description (bytes, FLOPs), no run.
  bool describe = false;
  bool quick = false;
  double min_time = 0.2;
  int min_runs = 5;
  int max_runs = 200;
  // Calls a batch of back-to-back calls with one fence (and a graph).
  int batch_calls = 16;
  int batches = 5;
};

struct Result {
  std::string name, op, dtype;
  std::uint64_t tokens = 0;
  int batch = 0;
  std::uint64_t bytes = 0;
  double seconds = 0;
  std::uint64_t copy_bytes = 0;
  double copy_seconds = 0;
  double seconds_min = 0;
  double copy_seconds_min = 0;
  int runs = 0;
  int launches = 0;
  int ring = 0;  // R, the ring length
  // Compute-bound cases (flops > 0): the kernel's FLOPs and the same-run
  // GEMM's (bytes and copy_* are 0 then).
  double flops = 0;
  double gemm_flops = 0;
  double gemm_seconds = 0;
  // Cache ops: the same step without the cache, timed in the same loop.
  std::string baseline_op;
  double baseline_seconds = 0;
  double overhead = 0;  // median of cached / uncached per run, minus 1
  // Cache ops: store_pools_fp8 after the uncached step, in the same loop,
  // and the rule cached <= uncached + store_pools (+ 5%): per run, cached /
  // (uncached + store_pools); its median and its spread over runs.
  std::string pass_op;
  double pass_seconds = 0;
  double rule_ratio = 0;      // median
  double rule_ratio_lo = 0;   // 10th percentile
  double rule_ratio_hi = 0;   // 90th percentile
  double rule_ratio_best = 0; // min-of-runs cached / (min uncached + min store)
  std::string cache_path;     // the path the op's cached step took
  // The same from the process's CPU time (std::clock: every thread's),
  // which a shared machine's time slicing does not inflate.
  double rule_ratio_cpu = 0;  // median
  double rule_ratio_cpu_min = 0;  // of the least CPU time of each
  double cpu_seconds = 0, baseline_cpu_seconds = 0, pass_cpu_seconds = 0;
  // Top-k cases (keys_read_seconds > 0): a same-run pass reading the same
  // keys once (a max-reduction, a key an iteration, whose accumulator the
  // compiler keeps in memory: it may alias the keys), and a same-run
  // streaming read of them (a max over blocks of 256 keys, vectorized).
  double keys_read_seconds = 0;
  double stream_read_seconds = 0;
  // Sharded selections (select_ranks*): the ranks, and the bytes a query
  // row sends through the exchange (ranks * topk * 8 for f32 keys).
  int ranks = 0;
  std::uint64_t exchange_bytes_per_row = 0;
  // Compute-bound cases: the tensor work on a GPU ("e4m3": `flops` of
  // E4M3 MMA, "bf16x3": 3 * `flops` of bf16 MMA, "f32": CUDA cores).
  std::string tensor;
  // The device time without the host's fence in it: the per-call median
  // over `batches` batches of batch_calls calls back to back with one
  // fence, and (CUDA) the per-call time of a CUDA graph of batch_calls
  // calls replayed (0: not timed).
  double seconds_batched = 0;
  double graph_seconds = 0;
  int batch_calls = 0;
};

// ------------------------------------------------------------ device work

// Deterministic values in [-2, 2), filled on the device.
template <class T>
struct FillFunctor {
  Kokkos::View<T*, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>> v;
  std::uint32_t seed;
  KOKKOS_INLINE_FUNCTION void operator()(std::size_t i) const {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 0x9E3779B1u ^ seed;
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    h ^= h >> 16;
    float const x = static_cast<float>(h >> 8) * (4.0f / 16777216.0f) - 2.0f;
    v(i) = T(x);
  }
};

template <class T>
void fill(Space const& space, T* data, std::size_t n, std::uint32_t seed) {
  FillFunctor<T> f;
  f.v = decltype(f.v)(data, n);
  f.seed = seed;
  Kokkos::parallel_for("kpool_perf::fill",
                       Kokkos::RangePolicy<Space>(space, 0, n), f);
}

// The baseline: one RangePolicy launch copying uint64 words.
struct CopyFunctor {
  Kokkos::View<const std::uint64_t*, Mem> src;
  Kokkos::View<std::uint64_t*, Mem> dst;
  KOKKOS_INLINE_FUNCTION void operator()(std::size_t i) const {
    dst(i) = src(i);
  }
};

class CopyBaseline {
 public:
  explicit CopyBaseline(Space const& space) : space_(space) {}
  // Words for an op of `bytes` (read + write): bytes / 16, at least one.
  static std::size_t words_for(std::uint64_t bytes) {
    return std::max<std::uint64_t>(1, bytes / 16);
  }
  void reserve(std::size_t words) {
    if (words <= src_.extent(0)) return;
    src_ = Kokkos::View<std::uint64_t*, Mem>();
    dst_ = Kokkos::View<std::uint64_t*, Mem>();
    src_ = Kokkos::View<std::uint64_t*, Mem>(
        Kokkos::view_alloc(space_, "kpool_perf::copy_src"), words);
    dst_ = Kokkos::View<std::uint64_t*, Mem>(
        Kokkos::view_alloc(space_, "kpool_perf::copy_dst"), words);
    space_.fence();
  }
  void run(std::size_t words) const {
    CopyFunctor f{src_, dst_};
    Kokkos::parallel_for("kpool_perf::copy",
                         Kokkos::RangePolicy<Space>(space_, 0, words), f);
  }

 private:
  Space space_;
  Kokkos::View<std::uint64_t*, Mem> src_, dst_;
};

// -------------------------------------------------------- batch geometry

// A ragged batch (prefill chunks, continuations, single-token decodes).
struct RaggedDesc {
  std::vector<std::uint32_t> rows;           // n per request
  std::vector<std::uint32_t> cache_lengths;  // c per request
  std::vector<std::uint32_t> slots;          // ring slot per request
  int max_slots = 1;
  int ring = kK;                             // R, the ring length
  int batch() const { return static_cast<int>(rows.size()); }
  std::uint64_t tokens() const {
    return std::accumulate(rows.begin(), rows.end(), std::uint64_t(0));
  }
};

// A decode batch: next_n consecutive positions per row from start[r].
struct DecodeDesc {
  int next_n = 1;
  std::vector<std::int32_t> start;
  std::vector<std::uint32_t> slots;
  int max_slots = 1;
  int ring = kK;  // R, the ring length
  int batch() const { return static_cast<int>(start.size()); }
  std::uint64_t tokens() const {
    return static_cast<std::uint64_t>(batch()) * next_n;
  }
  // The same tokens as a ragged batch (for the general step).
  RaggedDesc ragged() const {
    RaggedDesc r;
    for (int b = 0; b < batch(); ++b) {
      r.rows.push_back(static_cast<std::uint32_t>(next_n));
      r.cache_lengths.push_back(static_cast<std::uint32_t>(start[b]));
    }
    r.slots = slots;
    r.max_slots = max_slots;
    r.ring = ring;
    return r;
  }
};

// One request's pools, from docs/writers.md ("compress").
struct Geo {
  std::uint64_t have = 0;    // c % K
  std::uint64_t full = 0;    // compress pools
  bool closes = false;       // ring_close closes a pool
  std::uint64_t seeded = 0;  // positions seed_tail stashes: the last R
};

Geo geometry(std::uint64_t c, std::uint64_t n, std::uint64_t R) {
  std::uint64_t const K = kK;
  Geo g;
  std::uint64_t const end = c + n;
  g.have = c % K;
  std::uint64_t const first = (c + K - 1) / K;
  std::uint64_t const last = end / K;
  g.full = last > first ? last - first : 0;
  g.closes = g.have != 0 && g.have + n >= K;
  std::uint64_t const seed_start = end > c + R ? end - R : c;
  g.seeded = end - seed_start;
  return g;
}

// ------------------------------------------------------------ byte counts
//
// S = sizeof(storage), row = D * S. Index arrays are u32/i32 (4 bytes).

struct Traffic {
  std::uint64_t ring_close = 0;  // ring members + new rows read, pooled out
  std::uint64_t compress = 0;    // key + gate rows read, pooled out
  std::uint64_t seed = 0;        // key + gate rows read, ring written
  std::uint64_t closed = 0;      // pools ring_close closes
  std::uint64_t pools = 0;       // compress pools
};

Traffic ragged_traffic(RaggedDesc const& d, std::uint64_t S) {
  std::uint64_t const row = kD * S;
  Traffic t;
  for (int r = 0; r < d.batch(); ++r) {
    Geo const g = geometry(d.cache_lengths[r], d.rows[r], d.ring);
    if (g.closes) {
      t.ring_close += g.have * 2 * row          // ring members (key, gate)
                      + (kK - g.have) * 2 * row  // the call's rows
                      + row;                     // pooled
      t.closed += 1;
    }
    t.compress += g.full * kK * 2 * row + g.full * row;
    t.pools += g.full;
    t.seed += g.seeded * 2 * row * 2;  // read key + gate, write the ring
  }
  return t;
}

std::uint64_t ape_bytes() { return std::uint64_t(kK) * kD * 4; }

// row_offsets [B + 1], cache_lengths [B], optionally slot_idx [B], read.
std::uint64_t ragged_index_bytes(RaggedDesc const& d, bool slots) {
  std::uint64_t const B = d.batch();
  return (B + 1) * 4 + B * 4 + (slots ? B * 4 : 0);
}

std::uint64_t compress_bytes(RaggedDesc const& d, std::uint64_t S) {
  Traffic const t = ragged_traffic(d, S);
  return t.compress + ape_bytes() + ragged_index_bytes(d, false) +
         (std::uint64_t(d.batch()) + 1) * 4;  // pool_row_offsets written
}

std::uint64_t ring_close_bytes(RaggedDesc const& d, std::uint64_t S) {
  Traffic const t = ragged_traffic(d, S);
  return t.ring_close + ape_bytes() + ragged_index_bytes(d, true) +
         std::uint64_t(d.batch()) * 4;  // closed_pool written
}

std::uint64_t seed_tail_bytes(RaggedDesc const& d, std::uint64_t S) {
  Traffic const t = ragged_traffic(d, S);
  return t.seed + ragged_index_bytes(d, true);
}

// The general step: the three writers' data plus the compacted output's
// batch_row and pool_id per pool and the offsets [B + 1] written.
std::uint64_t step_bytes(RaggedDesc const& d, std::uint64_t S) {
  Traffic const t = ragged_traffic(d, S);
  return t.ring_close + t.compress + t.seed + (t.closed + t.pools) * 8 +
         ape_bytes() + ragged_index_bytes(d, true) +
         (std::uint64_t(d.batch()) + 1) * 4;
}

struct DecodeTraffic {
  std::uint64_t data = 0;  // key/gate in, ring written and read, pooled out
  std::uint64_t pools = 0;
};

DecodeTraffic decode_traffic(DecodeDesc const& d, std::uint64_t S) {
  std::uint64_t const row = kD * S;
  DecodeTraffic t;
  for (int r = 0; r < d.batch(); ++r) {
    std::int64_t const first = d.start[r];
    for (int i = 0; i < d.next_n; ++i) {
      std::int64_t const pos = first + i;
      t.data += 2 * row   // key + gate read
                + 2 * row;  // stashed in the ring
      if (pos % kK == kK - 1) {
        std::int64_t const pool_start = pos - (kK - 1);
        std::int64_t const earlier = std::max<std::int64_t>(0, first - pool_start);
        t.data += static_cast<std::uint64_t>(earlier) * 2 * row  // ring read
                  + row;                                        // pooled
        t.pools += 1;
      }
    }
  }
  return t;
}

// positions [B, next_n] and slot_idx [B] read.
std::uint64_t decode_index_bytes(DecodeDesc const& d) {
  std::uint64_t const B = d.batch();
  return B * d.next_n * 4 + B * 4;
}

std::uint64_t tail_update_bytes(DecodeDesc const& d, std::uint64_t S) {
  std::uint64_t const M = (d.next_n + kK - 1) / kK;
  return decode_traffic(d, S).data + ape_bytes() + decode_index_bytes(d) +
         std::uint64_t(d.batch()) * M * 4;  // closed_pool written
}

std::uint64_t decode_step_bytes(DecodeDesc const& d, std::uint64_t S) {
  DecodeTraffic const t = decode_traffic(d, S);
  return t.data + t.pools * 8 + ape_bytes() + decode_index_bytes(d) +
         (std::uint64_t(d.batch()) + 1) * 4;  // offsets written
}

// The pool cache of the *_cache_fp8 ops: pools a block, and the bytes a
// pool's entry takes (D fp8 values and an f32 scale).
constexpr int kBlockPools = 16;
constexpr std::uint64_t kCacheEntryBytes = kD + 4;

// Pools each ragged request emits: [c / K, (c + n) / K).
std::vector<std::pair<std::int64_t, std::int64_t>> ragged_pools(RaggedDesc const& d) {
  std::vector<std::pair<std::int64_t, std::int64_t>> v;
  for (int r = 0; r < d.batch(); ++r) {
    std::int64_t const c = d.cache_lengths[r];
    v.emplace_back(c / kK, (c + d.rows[r]) / kK);
  }
  return v;
}

// Pools each decode row closes.
std::vector<std::pair<std::int64_t, std::int64_t>> decode_pools(DecodeDesc const& d) {
  std::vector<std::pair<std::int64_t, std::int64_t>> v;
  for (int r = 0; r < d.batch(); ++r) {
    std::int64_t const first = d.start[r];
    v.emplace_back(first / kK, (first + d.next_n) / kK);
  }
  return v;
}

std::uint64_t pool_count(std::vector<std::pair<std::int64_t, std::int64_t>> const& pools) {
  std::uint64_t n = 0;
  for (auto const& p : pools) n += static_cast<std::uint64_t>(p.second - p.first);
  return n;
}

std::uint64_t cache_bytes(std::vector<std::pair<std::int64_t, std::int64_t>> const& pools) {
  return pool_count(pools) * kCacheEntryBytes;
}

// ------------------------------------------------------------- device data

View1<std::uint32_t> upload(Space const& space, std::string const& label,
                            std::vector<std::uint32_t> const& v) {
  View1<std::uint32_t> d(Kokkos::view_alloc(space, label), v.size());
  auto h = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < v.size(); ++i) h(i) = v[i];
  Kokkos::deep_copy(space, d, h);
  space.fence();
  return d;
}

View2<float> make_ape(Space const& space) {
  View2<float> ape(Kokkos::view_alloc(space, "kpool_perf::ape"), kK, kD);
  auto h = Kokkos::create_mirror_view(ape);
  for (int m = 0; m < kK; ++m)
    for (int c = 0; c < kD; ++c)
      h(m, c) = 0.25f * static_cast<float>((m * 7 + c * 3) % 9) - 1.0f;
  Kokkos::deep_copy(space, ape, h);
  space.fence();
  return ape;
}

// An fp8 amax cache, rotated, with a block table giving every block
// column a call writes a block of its own (the rest unassigned, -1).
struct CacheData {
  KPool::PoolCache<KPool::float8_e4m3, Mem> cache;
  View2<std::int32_t> block_table;

  // serving: the serving profile (scale pow2) instead of the amax one.
  CacheData(Space const& space,
            std::vector<std::pair<std::int64_t, std::int64_t>> const& pools,
            bool serving = false) {
    std::size_t const B = pools.size();
    std::int64_t cols = 1;
    for (auto const& p : pools)
      if (p.second > p.first) cols = std::max(cols, (p.second - 1) / kBlockPools + 1);
    block_table = View2<std::int32_t>(
        Kokkos::view_alloc(space, "kpool_perf::block_table"), B, cols);
    auto h = Kokkos::create_mirror_view(block_table);
    Kokkos::deep_copy(h, -1);
    int blocks = 0;
    for (std::size_t r = 0; r < B; ++r) {
      if (pools[r].second <= pools[r].first) continue;
      for (std::int64_t c = pools[r].first / kBlockPools;
           c <= (pools[r].second - 1) / kBlockPools; ++c)
        h(r, c) = blocks++;
    }
    Kokkos::deep_copy(space, block_table, h);
    cache = KPool::PoolCache<KPool::float8_e4m3, Mem>(
        space, std::max(blocks, 1), kBlockPools, kD, kK,
        serving ? KPool::CacheScale::pow2 : KPool::CacheScale::amax, /*rotate=*/true,
        serving ? KPool::CacheProfile::serving : KPool::CacheProfile::exact);
    space.fence();
  }
};

template <class T>
struct RaggedData {
  RaggedDesc desc;
  View2<T> key, gate;
  View2<float> ape;
  View1<std::uint32_t> row_offsets, cache_lengths, slot_idx, pool_row_offsets;
  View2<T> pooled;  // compress output
  View2<T> rc_pooled;
  View1<std::int32_t> rc_closed;
  KPool::Batch<Mem> batch;  // all B rows, with their slots
  KPool::Ring<T, Mem> ring;
  KPool::StepOutput<T, Mem> out;

  RaggedData(Space const& space, RaggedDesc const& d) : desc(d) {
    std::size_t const B = d.batch();
    std::size_t const T_rows = d.tokens();
    std::vector<std::uint32_t> offsets(B + 1, 0);
    std::uint64_t full = 0;
    for (std::size_t r = 0; r < B; ++r) {
      offsets[r + 1] = offsets[r] + d.rows[r];
      full += geometry(d.cache_lengths[r], d.rows[r], d.ring).full;
    }
    key = View2<T>(Kokkos::view_alloc(space, Kokkos::WithoutInitializing,
                                      "kpool_perf::key"),
                   T_rows, kD);
    gate = View2<T>(Kokkos::view_alloc(space, Kokkos::WithoutInitializing,
                                       "kpool_perf::gate"),
                    T_rows, kD);
    fill(space, key.data(), key.size(), 0x1234u);
    fill(space, gate.data(), gate.size(), 0xBEEFu);
    ape = make_ape(space);
    row_offsets = upload(space, "kpool_perf::row_offsets", offsets);
    cache_lengths = upload(space, "kpool_perf::cache_lengths", d.cache_lengths);
    slot_idx = upload(space, "kpool_perf::slot_idx", d.slots);
    batch = KPool::ragged_batch(row_offsets, cache_lengths, slot_idx, static_cast<int>(B));
    pool_row_offsets =
        View1<std::uint32_t>(Kokkos::view_alloc(space, "kpool_perf::pro"), B + 1);
    pooled = View2<T>(Kokkos::view_alloc(space, "kpool_perf::pooled"),
                      std::max<std::uint64_t>(full, 1), kD);
    rc_pooled = View2<T>(Kokkos::view_alloc(space, "kpool_perf::rc_pooled"), B, kD);
    rc_closed = View1<std::int32_t>(
        Kokkos::view_alloc(space, "kpool_perf::rc_closed"), B);
    ring = KPool::Ring<T, Mem>(space, d.max_slots, kK, kD, d.ring);
    fill(space, ring.tail().data(), ring.tail().size(), 0x7777u);
    out = KPool::StepOutput<T, Mem>(
        space, KPool::StepOutput<T, Mem>::capacity_for(T_rows, d.batch(), kK),
        d.batch(), kD);
    space.fence();
  }
};

template <class T>
struct DecodeData {
  DecodeDesc desc;
  View3<T> key, gate;
  View2<float> ape;
  View2<std::int32_t> positions;
  View1<std::uint32_t> slot_idx;
  View3<T> pooled;
  View2<std::int32_t> closed;
  KPool::Batch<Mem> batch;  // all B rows, with their slots
  KPool::Ring<T, Mem> ring;
  KPool::StepOutput<T, Mem> out;

  DecodeData(Space const& space, DecodeDesc const& d) : desc(d) {
    std::size_t const B = d.batch();
    std::size_t const n = d.next_n;
    std::size_t const M = (n + kK - 1) / kK;
    key = View3<T>(Kokkos::view_alloc(space, Kokkos::WithoutInitializing,
                                      "kpool_perf::dkey"),
                   B, n, kD);
    gate = View3<T>(Kokkos::view_alloc(space, Kokkos::WithoutInitializing,
                                       "kpool_perf::dgate"),
                    B, n, kD);
    fill(space, key.data(), key.size(), 0x4321u);
    fill(space, gate.data(), gate.size(), 0xFEEDu);
    ape = make_ape(space);
    positions = View2<std::int32_t>(
        Kokkos::view_alloc(space, "kpool_perf::positions"), B, n);
    auto hp = Kokkos::create_mirror_view(positions);
    for (std::size_t r = 0; r < B; ++r)
      for (std::size_t i = 0; i < n; ++i)
        hp(r, i) = d.start[r] + static_cast<std::int32_t>(i);
    Kokkos::deep_copy(space, positions, hp);
    slot_idx = upload(space, "kpool_perf::dslot_idx", d.slots);
    batch = KPool::decode_batch(positions, slot_idx, static_cast<int>(B));
    pooled = View3<T>(Kokkos::view_alloc(space, "kpool_perf::dpooled"), B, M, kD);
    closed = View2<std::int32_t>(Kokkos::view_alloc(space, "kpool_perf::dclosed"),
                                 B, M);
    ring = KPool::Ring<T, Mem>(space, d.max_slots, kK, kD, d.ring);
    fill(space, ring.tail().data(), ring.tail().size(), 0x5555u);
    out = KPool::StepOutput<T, Mem>(space, B * M, d.batch(), kD);
    space.fence();
  }
};

// ------------------------------------------------------------------ timing

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  std::size_t const n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The q-quantile of v (nearest rank), q in [0, 1].
double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  std::size_t const i = static_cast<std::size_t>(q * (v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

// Each op sends its scenario's batch again and again, not the next tokens
// of its sequences: before the one validated call of an op, every slot
// holds every position of its sequence and was sent nothing past the
// first (Ring::state(): start 0, L = 2^31 - 1, H = 1), so the slot rules
// (docs/ring.md, "No gaps", "The depth rule") see each row continue its
// sequence. The timed calls run unvalidated.
template <class Ring>
void fresh_ring(Ring& ring, Space const& space, KPool::Options const& o) {
  if (!o.validate) return;
  auto h = Kokkos::create_mirror_view(ring.state());
  for (std::size_t slot = 0; slot < h.extent(0); ++slot) {
    h(slot, 0) = 0;
    h(slot, 1) = 0x7FFFFFFFu;
    h(slot, 2) = 1;
  }
  Kokkos::deep_copy(space, ring.state(), h);
  space.fence();
}

// ----------------------------------------------------------------- JSON

std::string json_string(std::string const& s) {
  std::string o = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') {
      o += '\\';
      o += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", ch);
      o += buf;
    } else {
      o += ch;
    }
  }
  return o + "\"";
}

std::string json_number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

// One case as a JSON object on one line: its description (name, op,
// dtype, tokens, batch, bytes, flops, tensor), then what was measured, by
// kind (a top-k case against a read of its keys, a compute-bound case
// against a copy of its bytes and a GEMM, the others against a copy).
std::string case_json(Result const& r) {
  std::ostringstream f;
  f << "{\"name\": " << json_string(r.name);
  f << ", \"op\": " << json_string(r.op);
  f << ", \"dtype\": " << json_string(r.dtype);
  f << ", \"tokens\": " << r.tokens;
  f << ", \"batch\": " << r.batch;
  f << ", \"bytes\": " << r.bytes;
  if (r.flops > 0) f << ", \"flops\": " << json_number(r.flops);
  if (!r.tensor.empty()) f << ", \"tensor\": " << json_string(r.tensor);
  f << ", \"launches\": " << r.launches;
  if (r.seconds <= 0) return f.str() + ", \"described\": true}";
  f << ", \"seconds\": " << json_number(r.seconds);
  f << ", \"seconds_min\": " << json_number(r.seconds_min);
  f << ", \"runs\": " << r.runs;
  if (r.batch_calls > 0) {
    f << ", \"seconds_batched\": " << json_number(r.seconds_batched);
    f << ", \"batch_calls\": " << r.batch_calls;
    if (r.graph_seconds > 0) f << ", \"graph_seconds\": " << json_number(r.graph_seconds);
  }
  if (r.keys_read_seconds > 0) {
    f << ", \"keys_read_seconds\": " << json_number(r.keys_read_seconds);
    f << ", \"ratio\": " << json_number(r.keys_read_seconds / r.seconds);
    f << ", \"stream_read_seconds\": " << json_number(r.stream_read_seconds);
    f << ", \"stream_ratio\": " << json_number(r.stream_read_seconds / r.seconds);
    return f.str() + "}";
  }
  double const gbps = r.bytes / r.seconds * 1e-9;
  double const cgbps = r.copy_bytes / r.copy_seconds * 1e-9;
  f << ", \"gbps\": " << json_number(gbps);
  f << ", \"copy_bytes\": " << r.copy_bytes;
  f << ", \"copy_seconds\": " << json_number(r.copy_seconds);
  f << ", \"copy_gbps\": " << json_number(cgbps);
  f << ", \"copy_seconds_min\": " << json_number(r.copy_seconds_min);
  if (r.flops > 0) {
    double const gf = r.flops / r.seconds * 1e-9;
    f << ", \"gflops\": " << json_number(gf);
    f << ", \"copy_ratio\": " << json_number(gbps / cgbps);
    if (r.gemm_seconds > 0) {
      double const ggf = r.gemm_flops / r.gemm_seconds * 1e-9;
      f << ", \"gemm_flops\": " << json_number(r.gemm_flops);
      f << ", \"gemm_seconds\": " << json_number(r.gemm_seconds);
      f << ", \"gemm_gflops\": " << json_number(ggf);
      f << ", \"ratio\": " << json_number(gf / ggf);
    } else {
      f << ", \"ratio\": " << json_number(gbps / cgbps);
    }
  } else {
    f << ", \"ratio\": " << json_number(gbps / cgbps);
    f << ", \"ring\": " << r.ring;
  }
  if (!r.baseline_op.empty()) {
    f << ", \"baseline_op\": " << json_string(r.baseline_op);
    f << ", \"baseline_seconds\": " << json_number(r.baseline_seconds);
    f << ", \"overhead\": " << json_number(r.overhead);
  }
  if (r.ranks > 0) {
    f << ", \"ranks\": " << r.ranks;
    f << ", \"exchange_bytes_per_row\": " << r.exchange_bytes_per_row;
  }
  if (!r.pass_op.empty()) {
    // The rule: cached <= uncached + store_pools, 5% for noise.
    f << ", \"cache_path\": " << json_string(r.cache_path);
    f << ", \"uncached_seconds\": " << json_number(r.baseline_seconds);
    f << ", \"store_pools_op\": " << json_string(r.pass_op);
    f << ", \"store_pools_seconds\": " << json_number(r.pass_seconds);
    f << ", \"rule_ratio\": " << json_number(r.rule_ratio);
    f << ", \"rule_ratio_p10\": " << json_number(r.rule_ratio_lo);
    f << ", \"rule_ratio_p90\": " << json_number(r.rule_ratio_hi);
    f << ", \"rule_ratio_min_times\": " << json_number(r.rule_ratio_best);
    f << ", \"rule_holds\": " << (r.rule_ratio <= 1.05 ? "true" : "false");
    f << ", \"cpu_seconds\": " << json_number(r.cpu_seconds);
    f << ", \"uncached_cpu_seconds\": " << json_number(r.baseline_cpu_seconds);
    f << ", \"store_pools_cpu_seconds\": " << json_number(r.pass_cpu_seconds);
    f << ", \"rule_ratio_cpu\": " << json_number(r.rule_ratio_cpu);
    f << ", \"rule_ratio_cpu_min\": " << json_number(r.rule_ratio_cpu_min);
  }
  return f.str() + "}";
}

// The run's own facts: the backend, its threads, Kokkos, the shapes, and
// what one fence of the idle instance costs.
std::string header_json(double fence_seconds) {
  int const v = KOKKOS_VERSION;
  std::string const version = std::to_string(v / 10000) + "." +
                              std::to_string(v / 100 % 100) + "." +
                              std::to_string(v % 100);
  std::ostringstream f;
  f << "\"backend\": " << json_string(Space::name());
  f << ", \"threads\": " << Space().concurrency();
  f << ", \"kokkos_version\": " << json_string(version);
  f << ", \"kokkos_kernels\": " << (KPOOL_HAS_KOKKOSKERNELS ? "true" : "false");
  f << ", \"head_dim\": " << kD;
  f << ", \"kpool\": " << kK;
  f << ", \"fence_seconds\": " << json_number(fence_seconds);
  return f.str();
}

bool write_report(std::string const& path, std::vector<Result> const& results,
                  double fence_seconds) {
  std::ofstream f(path);
  if (!f) return false;
  f << "{" << header_json(fence_seconds) << ",\n  \"cases\": [";
  for (std::size_t i = 0; i < results.size(); ++i)
    f << (i ? ",\n" : "\n") << "    " << case_json(results[i]);
  f << (results.empty() ? "]\n" : "\n  ]\n") << "}\n";
  return static_cast<bool>(f);
}

// The device's own time for a call, without the host's fence in each
// timed call: `calls` calls back to back and one fence, per call; on CUDA
// also a CUDA graph of those calls, captured on the instance's stream and
// replayed (docs/performance.md, "Measuring on a GPU").
class DeviceTimer {
 public:
  explicit DeviceTimer(Space const& space) : space_(space) {}

  // The median over `batches` batches of the per-call time.
  double batched(std::function<void()> const& call, int calls, int batches) const {
    std::vector<double> per;
    for (int b = 0; b < batches; ++b) {
      space_.fence();
      Clock::time_point const t0 = Clock::now();
      for (int i = 0; i < calls; ++i) call();
      space_.fence();
      per.push_back(seconds_between(t0, Clock::now()) / calls);
    }
    return median(per);
  }

  // The per-call time of a CUDA graph of `calls` calls, the median over
  // `batches` replays; 0 where there is no graph (another backend, or the
  // calls broke the capture: `why` says so).
  double graph(std::function<void()> const& call, int calls, int batches,
               std::string& why) const {
#if defined(KOKKOS_ENABLE_CUDA)
    if constexpr (std::is_same<Space, Kokkos::Cuda>::value) {
      cudaStream_t const stream = space_.cuda_stream();
      space_.fence();
      cudaGraph_t g = nullptr;
      if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        why = "cudaStreamBeginCapture failed";
        return 0;
      }
      try {
        for (int i = 0; i < calls; ++i) call();
      } catch (std::exception const& e) {
        why = e.what();
      }
      cudaError_t const end = cudaStreamEndCapture(stream, &g);
      if (!why.empty() || end != cudaSuccess) {
        if (why.empty()) why = cudaGetErrorString(end);
        if (g) cudaGraphDestroy(g);
        return 0;
      }
      cudaGraphExec_t exec = nullptr;
      if (cudaGraphInstantiateWithFlags(&exec, g, 0) != cudaSuccess) {
        why = "cudaGraphInstantiate failed";
        cudaGraphDestroy(g);
        return 0;
      }
      std::vector<double> per;
      for (int b = 0; b <= batches; ++b) {  // the first replay warms up
        Clock::time_point const t0 = Clock::now();
        cudaGraphLaunch(exec, stream);
        cudaStreamSynchronize(stream);
        if (b > 0) per.push_back(seconds_between(t0, Clock::now()) / calls);
      }
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(g);
      return median(per);
    }
#endif
    (void)call, (void)calls, (void)batches;
    why = "no CUDA graph on this backend";
    return 0;
  }

  // What one fence of the idle instance costs: the median of 50.
  double fence_seconds() const {
    std::vector<double> t;
    space_.fence();
    for (int i = 0; i < 50; ++i) {
      Clock::time_point const t0 = Clock::now();
      space_.fence();
      t.push_back(seconds_between(t0, Clock::now()));
    }
    return median(t);
  }

 private:
  Space space_;
};

class Runner {
 public:
  Runner(Space const& space, Settings const& s)
      : space_(space), s_(s), copy_(space), timer_(space) {
    fence_seconds_ = timer_.fence_seconds();
  }

  double fence_seconds() const { return fence_seconds_; }
  bool describing() const { return s_.describe; }

  // A case that runs only when --cases names it (device-sized).
  bool named(std::string const& name) const {
    return std::find(s_.cases.begin(), s_.cases.end(), name) != s_.cases.end();
  }

  // --cases A,B: exactly the entries named A or B; else --filter A,B:
  // entries whose name contains A or B.
  bool selected(std::string const& name) const {
    if (!s_.cases.empty()) return named(name);
    if (s_.filter.empty()) return true;
    std::size_t begin = 0;
    while (begin <= s_.filter.size()) {
      std::size_t const comma = s_.filter.find(',', begin);
      std::size_t const end = comma == std::string::npos ? s_.filter.size() : comma;
      if (end > begin && name.find(s_.filter.substr(begin, end - begin)) != std::string::npos)
        return true;
      begin = end + 1;
    }
    return false;
  }

  using Call = std::function<void(KPool::Options const&)>;

  // Runs `call(options)` once validated, then timed next to the copy (and,
  // given a baseline, next to the baseline op, timed in the same loop).
  void measure(std::string const& scenario, std::string const& dtype,
               std::string const& op, std::uint64_t tokens, int batch,
               std::uint64_t bytes, int launches, int ring, Call const& call,
               std::string const& baseline_op = "",
               Call const& baseline = Call(), std::string const& pass_op = "",
               Call const& pass = Call()) {
    std::string const name = scenario + "/" + dtype + "/" + op;
    if (!selected(name)) return;
    if (describe(name, op, dtype, tokens, batch, bytes, 0, "", launches)) return;
    KPool::Options checked;
    checked.validate = true;
    KPool::Options fast;
    fast.validate = false;
    call(checked);
    if (baseline) baseline(checked);
    if (pass) pass(checked);
    space_.fence();

    std::size_t const words = CopyBaseline::words_for(bytes);
    copy_.reserve(words);
    // Warm up: at least two of each, and about 5% of the time budget.
    Clock::time_point const w0 = Clock::now();
    for (int i = 0;; ++i) {
      call(fast);
      space_.fence();
      if (baseline) {
        baseline(fast);
        space_.fence();
      }
      if (pass) {
        pass(fast);
        space_.fence();
      }
      copy_.run(words);
      space_.fence();
      if (i >= 1 && seconds_between(w0, Clock::now()) >= 0.05 * s_.min_time)
        break;
      if (i >= 20) break;
    }

    std::vector<double> kt, ct, bt, pt, ratio, rule;
    std::vector<double> kc, bc, pc, rule_cpu;  // CPU seconds (with a pass)
    Clock::time_point const start = Clock::now();
    for (;;) {
      space_.fence();
      std::clock_t const c0 = std::clock();
      Clock::time_point const t0 = Clock::now();
      call(fast);
      space_.fence();
      Clock::time_point const t1 = Clock::now();
      std::clock_t const c1 = std::clock();
      copy_.run(words);
      space_.fence();
      Clock::time_point const t2 = Clock::now();
      kt.push_back(seconds_between(t0, t1));
      ct.push_back(seconds_between(t1, t2));
      if (baseline) {
        std::clock_t const c2 = std::clock();
        Clock::time_point const b0 = Clock::now();
        baseline(fast);
        space_.fence();
        bt.push_back(seconds_between(b0, Clock::now()));
        std::clock_t const c3 = std::clock();
        ratio.push_back(kt.back() / bt.back());
        if (pass) {
          // After the uncached step: it writes the rows the step left.
          Clock::time_point const p0 = Clock::now();
          pass(fast);
          space_.fence();
          pt.push_back(seconds_between(p0, Clock::now()));
          std::clock_t const c4 = std::clock();
          rule.push_back(kt.back() / (bt.back() + pt.back()));
          auto const cpu = [](std::clock_t a, std::clock_t b) {
            return static_cast<double>(b - a) / CLOCKS_PER_SEC;
          };
          kc.push_back(cpu(c0, c1));
          bc.push_back(cpu(c2, c3));
          pc.push_back(cpu(c3, c4));
          double const both = bc.back() + pc.back();
          if (both > 0) rule_cpu.push_back(kc.back() / both);
        }
      }
      int const runs = static_cast<int>(kt.size());
      if (runs >= s_.max_runs) break;
      // The rule's entries compare three timings: at least 15 runs.
      if (runs >= (pass ? std::max(s_.min_runs, 15) : s_.min_runs) &&
          seconds_between(start, Clock::now()) >= s_.min_time)
        break;
    }

    Result r;
    r.name = name;
    r.op = op;
    r.dtype = dtype;
    r.tokens = tokens;
    r.batch = batch;
    r.bytes = bytes;
    r.seconds = median(kt);
    r.copy_bytes = words * 16;
    r.copy_seconds = median(ct);
    r.seconds_min = *std::min_element(kt.begin(), kt.end());
    r.copy_seconds_min = *std::min_element(ct.begin(), ct.end());
    r.runs = static_cast<int>(kt.size());
    r.launches = launches;
    r.ring = ring;
    if (baseline) {
      r.baseline_op = baseline_op;
      r.baseline_seconds = median(bt);
      r.overhead = median(ratio) - 1.0;
    }
    if (pass) {
      r.pass_op = pass_op;
      r.pass_seconds = median(pt);
      r.rule_ratio = median(rule);
      r.rule_ratio_lo = quantile(rule, 0.1);
      r.rule_ratio_hi = quantile(rule, 0.9);
      r.rule_ratio_best = r.seconds_min /
                          (*std::min_element(bt.begin(), bt.end()) +
                           *std::min_element(pt.begin(), pt.end()));
      r.cpu_seconds = median(kc);
      r.baseline_cpu_seconds = median(bc);
      r.pass_cpu_seconds = median(pc);
      r.rule_ratio_cpu = rule_cpu.empty() ? 0.0 : median(rule_cpu);
      double const cpu_parts = *std::min_element(bc.begin(), bc.end()) +
                               *std::min_element(pc.begin(), pc.end());
      r.rule_ratio_cpu_min =
          cpu_parts > 0 ? *std::min_element(kc.begin(), kc.end()) / cpu_parts : 0.0;
    }
    double const gbps = r.bytes / r.seconds * 1e-9;
    double const cgbps = r.copy_bytes / r.copy_seconds * 1e-9;
    std::printf("%-44s %8.2f GB/s  copy %8.2f GB/s  ratio %5.2f  %10.4f ms  "
                "(%d runs)",
                name.c_str(), gbps, cgbps, gbps / cgbps, r.seconds * 1e3,
                r.runs);
    if (baseline)
      std::printf("  overhead %+.1f%% over %s (%.4f ms)", 100.0 * r.overhead,
                  baseline_op.c_str(), r.baseline_seconds * 1e3);
    if (pass)
      std::printf("  rule %.3f [%.3f, %.3f] best %.3f cpu %.3f best %.3f "
                  "(%s %.4f ms)",
                  r.rule_ratio, r.rule_ratio_lo, r.rule_ratio_hi,
                  r.rule_ratio_best, r.rule_ratio_cpu, r.rule_ratio_cpu_min,
                  pass_op.c_str(), r.pass_seconds * 1e3);
    device_times(r, [&] { call(fast); });
    finish(r);
  }

  // A compute-bound case: `call(options)` once validated, then timed next
  // to a same-run copy of `bytes` (the bytes the call must read and write)
  // and, given one, a same-run GEMM `gemm` of `gemm_flops` (Kokkos
  // Kernels); `versus` (optional) is a second op timed in the same loop.
  // `tensor` names its FLOPs' kind on a GPU (Result::tensor).
  void measure_flops(std::string const& scenario, std::string const& dtype,
                     std::string const& op, std::uint64_t tokens, int batch,
                     double flops, std::string const& tensor, std::uint64_t bytes,
                     int launches,
                     std::function<void(KPool::Options const&)> const& call,
                     double gemm_flops, std::function<void()> const& gemm,
                     std::string const& versus_op = "",
                     std::function<void(KPool::Options const&)> const& versus = {}) {
    std::string const name = scenario + "/" + dtype + "/" + op;
    if (!selected(name)) return;
    if (describe(name, op, dtype, tokens, batch, bytes, flops, tensor, launches)) return;
    KPool::Options checked;
    checked.validate = true;
    KPool::Options fast;
    fast.validate = false;
    call(checked);
    if (versus) versus(checked);
    space_.fence();
    std::size_t const words = CopyBaseline::words_for(bytes);
    copy_.reserve(words);
    Clock::time_point const w0 = Clock::now();
    for (int i = 0;; ++i) {
      call(fast);
      space_.fence();
      if (versus) {
        versus(fast);
        space_.fence();
      }
      if (gemm) gemm();
      copy_.run(words);
      space_.fence();
      if (i >= 1 && seconds_between(w0, Clock::now()) >= 0.05 * s_.min_time)
        break;
      if (i >= 20) break;
    }
    std::vector<double> kt, ct, gt, vt, ratio;
    Clock::time_point const start = Clock::now();
    for (;;) {
      space_.fence();
      Clock::time_point const t0 = Clock::now();
      call(fast);
      space_.fence();
      Clock::time_point const t1 = Clock::now();
      copy_.run(words);
      space_.fence();
      Clock::time_point const t2 = Clock::now();
      kt.push_back(seconds_between(t0, t1));
      ct.push_back(seconds_between(t1, t2));
      if (gemm) {
        Clock::time_point const g0 = Clock::now();
        gemm();
        space_.fence();
        gt.push_back(seconds_between(g0, Clock::now()));
      }
      if (versus) {
        Clock::time_point const v0 = Clock::now();
        versus(fast);
        space_.fence();
        vt.push_back(seconds_between(v0, Clock::now()));
        ratio.push_back(kt.back() / vt.back());
      }
      int const runs = static_cast<int>(kt.size());
      if (runs >= s_.max_runs) break;
      if (runs >= s_.min_runs &&
          seconds_between(start, Clock::now()) >= s_.min_time)
        break;
    }
    Result r;
    r.name = name;
    r.op = op;
    r.dtype = dtype;
    r.tokens = tokens;
    r.batch = batch;
    r.flops = flops;
    r.tensor = tensor;
    r.bytes = bytes;
    r.seconds = median(kt);
    r.seconds_min = *std::min_element(kt.begin(), kt.end());
    r.copy_bytes = words * 16;
    r.copy_seconds = median(ct);
    r.copy_seconds_min = *std::min_element(ct.begin(), ct.end());
    if (gemm) {
      r.gemm_flops = gemm_flops;
      r.gemm_seconds = median(gt);
    }
    r.runs = static_cast<int>(kt.size());
    r.launches = launches;
    if (versus) {
      r.baseline_op = versus_op;
      r.baseline_seconds = median(vt);
      r.overhead = median(ratio) - 1.0;
    }
    double const gf = r.flops / r.seconds * 1e-9;
    double const copy_ratio = (r.bytes / r.seconds) / (r.copy_bytes / r.copy_seconds);
    std::printf("%-44s %8.2f GF/s  %8.2f GB/s  copy ratio %5.2f", name.c_str(), gf,
                r.bytes / r.seconds * 1e-9, copy_ratio);
    if (gemm)
      std::printf("  gemm %8.2f GF/s ratio %5.2f", r.gemm_flops / r.gemm_seconds * 1e-9,
                  gf / (r.gemm_flops / r.gemm_seconds * 1e-9));
    std::printf("  %10.4f ms  (%d runs)", r.seconds * 1e3, r.runs);
    if (versus)
      std::printf("  overhead %+.1f%% over %s (%.4f ms)", 100.0 * r.overhead,
                  versus_op.c_str(), r.baseline_seconds * 1e3);
    device_times(r, [&] { call(fast); });
    finish(r);
  }

  // Runs `call()` timed next to `read()` (a pass reading the same keys
  // once), alternating, after a warm-up.
  void measure_read(std::string const& scenario, std::string const& dtype,
                    std::string const& op, std::uint64_t tokens, int batch,
                    std::uint64_t bytes, int launches, std::function<void()> const& call,
                    std::function<void()> const& read,
                    std::function<void()> const& stream) {
    std::string const name = scenario + "/" + dtype + "/" + op;
    if (!selected(name)) return;
    if (describe(name, op, dtype, tokens, batch, bytes, 0, "", launches)) return;
    Clock::time_point const w0 = Clock::now();
    for (int i = 0;; ++i) {
      call();
      space_.fence();
      read();
      space_.fence();
      stream();
      space_.fence();
      if (i >= 1 && seconds_between(w0, Clock::now()) >= 0.05 * s_.min_time) break;
      if (i >= 20) break;
    }
    std::vector<double> kt, rt, st;
    Clock::time_point const start = Clock::now();
    for (;;) {
      space_.fence();
      Clock::time_point const t0 = Clock::now();
      call();
      space_.fence();
      Clock::time_point const t1 = Clock::now();
      read();
      space_.fence();
      Clock::time_point const t2 = Clock::now();
      stream();
      space_.fence();
      Clock::time_point const t3 = Clock::now();
      kt.push_back(seconds_between(t0, t1));
      rt.push_back(seconds_between(t1, t2));
      st.push_back(seconds_between(t2, t3));
      int const runs = static_cast<int>(kt.size());
      if (runs >= s_.max_runs) break;
      if (runs >= s_.min_runs && seconds_between(start, Clock::now()) >= s_.min_time)
        break;
    }
    Result r;
    r.name = name;
    r.op = op;
    r.dtype = dtype;
    r.tokens = tokens;
    r.batch = batch;
    r.bytes = bytes;
    r.seconds = median(kt);
    r.seconds_min = *std::min_element(kt.begin(), kt.end());
    r.keys_read_seconds = median(rt);
    r.stream_read_seconds = median(st);
    r.runs = static_cast<int>(kt.size());
    r.launches = launches;
    std::printf(
        "%-44s %10.4f ms  keys read %10.4f ms  ratio %5.2f  (streamed %7.4f ms, %5.2f)  "
        "(%d runs)",
        name.c_str(), r.seconds * 1e3, r.keys_read_seconds * 1e3,
        r.keys_read_seconds / r.seconds, r.stream_read_seconds * 1e3,
        r.stream_read_seconds / r.seconds, r.runs);
    device_times(r, call);
    finish(r);
  }

  std::vector<Result> const& results() const { return results_; }
  // Records a sharded selection's ranks and exchange bytes on entry `name`.
  void set_exchange(std::string const& name, int ranks, std::uint64_t bytes_per_row) {
    for (Result& r : results_)
      if (r.name == name) {
        r.ranks = ranks;
        r.exchange_bytes_per_row = bytes_per_row;
      }
  }
  // Records which path the cached step of entry `name` took.
  void set_cache_path(std::string const& name, std::string const& path) {
    for (Result& r : results_)
      if (r.name == name) r.cache_path = path;
  }
  Space const& space() const { return space_; }

 private:
  // With --describe: the case's description, as its line, instead of a run.
  bool describe(std::string const& name, std::string const& op, std::string const& dtype,
                std::uint64_t tokens, int batch, std::uint64_t bytes, double flops,
                std::string const& tensor, int launches) {
    if (!s_.describe) return false;
    Result r;
    r.name = name;
    r.op = op;
    r.dtype = dtype;
    r.tokens = tokens;
    r.batch = batch;
    r.bytes = bytes;
    r.flops = flops;
    r.tensor = tensor;
    r.launches = launches;
    std::printf("%-44s %12llu bytes  %14.6g flops%s%s\n", name.c_str(),
                static_cast<unsigned long long>(bytes), flops, tensor.empty() ? "" : "  ",
                tensor.c_str());
    emit(r, "");
    results_.push_back(r);
    return true;
  }

  // The device's own time for `call` (validation off): batched, and on
  // CUDA a graph (DeviceTimer).
  void device_times(Result& r, std::function<void()> const& call) {
    r.batch_calls = s_.batch_calls;
    r.seconds_batched = timer_.batched(call, s_.batch_calls, s_.batches);
    std::string why;
    r.graph_seconds = timer_.graph(call, s_.batch_calls, s_.batches, why);
    std::printf("  batched %.4f ms", r.seconds_batched * 1e3);
    if (r.graph_seconds > 0) std::printf("  graph %.4f ms", r.graph_seconds * 1e3);
  }

  // The case's line ends; its JSON line and its printed line go to the
  // --lines and --summary files now, so a run cut short keeps them.
  void finish(Result const& r) {
    std::printf("\n");
    std::fflush(stdout);
    char line[512];
    std::snprintf(line, sizeof line,
                  "%s: %.2f us a call (fenced), %.2f us batched, %s; %d runs",
                  r.name.c_str(), r.seconds * 1e6, r.seconds_batched * 1e6,
                  r.graph_seconds > 0
                      ? (std::to_string(r.graph_seconds * 1e6) + " us in a graph").c_str()
                      : "no graph",
                  r.runs);
    emit(r, line);
    results_.push_back(r);
  }

  void emit(Result const& r, std::string const& summary) const {
    if (!s_.lines.empty()) {
      std::ofstream f(s_.lines, std::ios::app);
      f << case_json(r) << "\n";
    }
    if (!s_.summary.empty() && !summary.empty()) {
      std::ofstream f(s_.summary, std::ios::app);
      f << summary << "\n";
    }
  }

  Space space_;
  Settings s_;
  CopyBaseline copy_;
  DeviceTimer timer_;
  double fence_seconds_ = 0;
  std::vector<Result> results_;
};

// -------------------------------------------------------------- scenarios

template <class T>
void run_step_cache(Runner& run, std::string const& scenario,
                    RaggedDesc const& d, RaggedData<T>& data);

template <class T>
void run_ragged(Runner& run, std::string const& scenario, RaggedDesc const& d,
                bool writers_on_ring) {
  std::string const dtype = KPool::storage_name<T>();
  std::uint64_t const S = sizeof(T);
  // Build nothing when the filter skips every op of this scenario.
  std::string const prefix = scenario + "/" + dtype + "/";
  char const* ops[] = {"compress", "ring_close", "seed_tail", "step3",
                       "step_fused", "step_fused_cache_fp8_in_step",
                       "step_fused_cache_fp8_second_pass",
                       "step_fused_cache_serving", "store_pools_fp8"};
  bool any = false;
  for (char const* op : ops) any = any || run.selected(prefix + op);
  if (!any) return;

  RaggedData<T> data(run.space(), d);
  Space const space = run.space();
  std::uint64_t const tokens = d.tokens();
  int const B = d.batch();
  run.measure(scenario, dtype, "compress", tokens, B, compress_bytes(d, S), 2,
              d.ring, [&](KPool::Options const& o) {
                KPool::compress(space, data.key, data.gate, data.ape, data.batch,
                                data.pool_row_offsets, data.pooled, o);
              });
  if (writers_on_ring) {
    run.measure(scenario, dtype, "ring_close", tokens, B,
                ring_close_bytes(d, S), 1, d.ring, [&](KPool::Options const& o) {
                  fresh_ring(data.ring, space, o);
                  KPool::ring_close(space, data.ring, data.key, data.gate, data.ape,
                                    data.batch, data.rc_pooled, data.rc_closed, o);
                });
    run.measure(scenario, dtype, "seed_tail", tokens, B, seed_tail_bytes(d, S),
                1, d.ring, [&](KPool::Options const& o) {
                  fresh_ring(data.ring, space, o);
                  KPool::seed_tail(space, data.ring, data.key, data.gate, data.batch, o);
                });
  }
  for (bool fused : {false, true}) {
    run.measure(scenario, dtype, fused ? "step_fused" : "step3", tokens, B,
                step_bytes(d, S), fused ? 2 : 4, d.ring,
                [&, fused](KPool::Options const& o) {
                  KPool::Options p = o;
                  p.fused = fused;
                  fresh_ring(data.ring, space, p);
                  KPool::step(space, data.ring, data.key, data.gate, data.ape, data.batch,
                              data.out, p);
                });
  }
  run_step_cache<T>(run, scenario, d, data);
}

// The path a cached step of `requests` requests takes in this build, and
// its name.
using CachePath = KPool::Details::CacheWritePath;
constexpr char const* path_name(CachePath p) {
  return p == CachePath::in_step ? "in_step" : "second_pass";
}
template <class T, KPool::Details::CacheItems Items>
constexpr CachePath build_cache_path(std::size_t requests) {
  return KPool::Details::cache_write_path_for<Space, T, Items>(requests);
}

// KPool::step writing the cache by path P (automatic: the public call).
template <CachePath P, class T>
void cached_step(Space const& space, RaggedData<T>& data, CacheData& cd, int B,
                 KPool::Options const& o) {
  KPool::Options p = o;
  p.fused = true;
  fresh_ring(data.ring, space, p);
  if constexpr (P == CachePath::automatic) {
    KPool::step(space, data.ring, data.key, data.gate, data.ape, data.batch,
                KPool::paged(cd.cache, cd.block_table), data.out, p);
  } else {
    KPool::Details::check_step_views<Space, typename Space::memory_space, T, decltype(data.key), decltype(data.gate),
                                     decltype(data.ape), decltype(data.row_offsets),
                                     decltype(data.cache_lengths),
                                     decltype(data.slot_idx)>();
    KPool::Details::step_impl(
        space, data.ring, data.key, data.gate, data.ape, data.row_offsets,
        data.cache_lengths, data.slot_idx, B, data.out,
        KPool::Details::CacheArg<KPool::float8_e4m3, Mem, View2<std::int32_t>, P>{
            &cd.cache, &cd.block_table},
        p);
  }
}

// step_fused_cache_fp8: the fused step writing an fp8 amax rotated cache,
// timed in one loop with the same step without it (baseline) and, after
// that, store_pools_fp8 writing the same cache from the uncached step's
// output rows: the entry's rule_ratio is cached / (uncached + store_pools).
// step_fused_cache_fp8_in_step and _second_pass force each path (what the
// host table in common/detail/KPool_CachePath.hpp is chosen from).
template <class T>
void run_step_cache(Runner& run, std::string const& scenario,
                    RaggedDesc const& d, RaggedData<T>& data) {
  std::string const dtype = KPool::storage_name<T>();
  std::string const prefix = scenario + "/" + dtype + "/";
  if (!run.selected(prefix + "step_fused_cache_fp8_in_step") &&
      !run.selected(prefix + "step_fused_cache_fp8_second_pass") &&
      !run.selected(prefix + "step_fused_cache_serving") &&
      !run.selected(prefix + "store_pools_fp8"))
    return;
  Space const space = run.space();
  auto const pools = ragged_pools(d);
  CacheData cd(space, pools);
  CacheData serving(space, pools, /*serving=*/true);
  int const B = d.batch();
  auto const uncached = [&](KPool::Options const& o) {
    KPool::Options p = o;
    p.fused = true;
    fresh_ring(data.ring, space, p);
    KPool::step(space, data.ring, data.key, data.gate, data.ape, data.batch, data.out, p);
  };
  auto const store = [&](KPool::Options const& o) {
    KPool::store_pools(space, data.out, data.batch, KPool::paged(cd.cache, cd.block_table), o);
  };
  std::uint64_t const bytes = step_bytes(d, sizeof(T)) + cache_bytes(pools);
  CachePath const built =
      build_cache_path<T, KPool::Details::CacheItems::step>(static_cast<std::size_t>(B));
  run.measure(
      scenario, dtype, "step_fused_cache_fp8", d.tokens(), B, bytes,
      built == CachePath::second_pass ? 3 : 2, d.ring,
      [&](KPool::Options const& o) {
        cached_step<CachePath::automatic>(space, data, cd, B, o);
      },
      "step_fused", uncached, "store_pools_fp8", store);
  run.set_cache_path(prefix + "step_fused_cache_fp8", path_name(built));
  // step_fused_cache_serving: the same step writing the serving profile's
  // rotated cache (bf16-rounded, UE8M0 scales), timed beside
  // step_fused_cache_fp8: its overhead + 1 is the serving profile's cost
  // relative to the amax one.
  run.measure(
      scenario, dtype, "step_fused_cache_serving", d.tokens(), B, bytes,
      built == CachePath::second_pass ? 3 : 2, d.ring,
      [&](KPool::Options const& o) {
        cached_step<CachePath::automatic>(space, data, serving, B, o);
      },
      "step_fused_cache_fp8",
      [&](KPool::Options const& o) {
        cached_step<CachePath::automatic>(space, data, cd, B, o);
      });
  run.measure(
      scenario, dtype, "step_fused_cache_fp8_in_step", d.tokens(), B, bytes, 2,
      d.ring,
      [&](KPool::Options const& o) {
        cached_step<CachePath::in_step>(space, data, cd, B, o);
      },
      "step_fused", uncached, "store_pools_fp8", store);
  run.set_cache_path(prefix + "step_fused_cache_fp8_in_step", "in_step");
  run.measure(
      scenario, dtype, "step_fused_cache_fp8_second_pass", d.tokens(), B, bytes,
      3, d.ring,
      [&](KPool::Options const& o) {
        cached_step<CachePath::second_pass>(space, data, cd, B, o);
      },
      "step_fused", uncached, "store_pools_fp8", store);
  run.set_cache_path(prefix + "step_fused_cache_fp8_second_pass", "second_pass");
  // store_pools_fp8: the same cache written by its own pass from the step's
  // output rows (read from memory), beside the step without a cache: its
  // overhead + 1 is what the write costs on its own, as a share of the
  // step.
  uncached(KPool::Options());
  space.fence();
  run.measure(
      scenario, dtype, "store_pools_fp8", d.tokens(), B,
      static_cast<std::uint64_t>(pool_count(pools)) * (kD * sizeof(T) + 8) +
          cache_bytes(pools),
      1, d.ring, store, "step_fused", uncached);
}

// KPool::step with a decode batch writing the cache by path P (automatic:
// the public call).
template <CachePath P, class T>
void cached_decode(Space const& space, DecodeData<T>& data, CacheData& cd,
                   int B, KPool::Options const& o) {
  fresh_ring(data.ring, space, o);
  if constexpr (P == CachePath::automatic) {
    KPool::step(space, data.ring, data.key, data.gate, data.ape, data.batch,
                KPool::paged(cd.cache, cd.block_table), data.out, o);
  } else {
    KPool::Details::decode_step_impl(
        space, data.ring, data.key, data.gate, data.ape, data.positions,
        data.slot_idx, B, data.out,
        KPool::Details::CacheArg<KPool::float8_e4m3, Mem, View2<std::int32_t>, P>{
            &cd.cache, &cd.block_table},
        o);
  }
}

template <class T>
void run_decode(Runner& run, std::string const& scenario, DecodeDesc const& d) {
  std::string const dtype = KPool::storage_name<T>();
  std::uint64_t const S = sizeof(T);
  std::string const prefix = scenario + "/" + dtype + "/";
  if (!run.selected(prefix + "tail_update") &&
      !run.selected(prefix + "decode_step") &&
      !run.selected(prefix + "decode_step_cache_serving") &&
      !run.selected(prefix + "decode_step_cache_fp8_in_step") &&
      !run.selected(prefix + "decode_step_cache_fp8_second_pass") &&
      !run.selected(prefix + "store_pools_fp8") &&
      !run.selected(prefix + "step_fused"))
    return;

  DecodeData<T> data(run.space(), d);
  Space const space = run.space();
  std::uint64_t const tokens = d.tokens();
  int const B = d.batch();
  run.measure(scenario, dtype, "tail_update", tokens, B,
              tail_update_bytes(d, S), 1, d.ring, [&](KPool::Options const& o) {
                fresh_ring(data.ring, space, o);
                KPool::tail_update(space, data.ring, data.key, data.gate, data.ape,
                                   data.batch, data.pooled, data.closed, o);
              });
  run.measure(scenario, dtype, "decode_step", tokens, B,
              decode_step_bytes(d, S), 2, d.ring, [&](KPool::Options const& o) {
                fresh_ring(data.ring, space, o);
                KPool::step(space, data.ring, data.key, data.gate, data.ape, data.batch,
                            data.out, o);
              });
  // decode_step_cache_fp8: the same call writing an fp8 amax rotated
  // cache, timed beside it and store_pools_fp8 (as step_fused_cache_fp8),
  // and with each path forced.
  if (run.selected(prefix + "decode_step_cache_fp8_in_step") ||
      run.selected(prefix + "decode_step_cache_fp8_second_pass") ||
      run.selected(prefix + "decode_step_cache_serving") ||
      run.selected(prefix + "store_pools_fp8")) {
    auto const pools = decode_pools(d);
    CacheData cd(space, pools);
    CacheData serving(space, pools, /*serving=*/true);
    auto const uncached = [&](KPool::Options const& o) {
      fresh_ring(data.ring, space, o);
      KPool::step(space, data.ring, data.key, data.gate, data.ape, data.batch, data.out, o);
    };
    auto const store = [&](KPool::Options const& o) {
      KPool::store_pools(space, data.out, data.batch, KPool::paged(cd.cache, cd.block_table), o);
    };
    std::uint64_t const bytes = decode_step_bytes(d, S) + cache_bytes(pools);
    CachePath const built =
        build_cache_path<T, KPool::Details::CacheItems::decode>(static_cast<std::size_t>(B));
    run.measure(
        scenario, dtype, "decode_step_cache_fp8", tokens, B, bytes,
        built == CachePath::second_pass ? 3 : 2, d.ring,
        [&](KPool::Options const& o) {
          cached_decode<CachePath::automatic>(space, data, cd, B, o);
        },
        "decode_step", uncached, "store_pools_fp8", store);
    run.set_cache_path(prefix + "decode_step_cache_fp8", path_name(built));
    // decode_step_cache_serving: the serving profile's cache, timed beside
    // decode_step_cache_fp8 (its overhead + 1 is the ratio to it).
    run.measure(
        scenario, dtype, "decode_step_cache_serving", tokens, B, bytes,
        built == CachePath::second_pass ? 3 : 2, d.ring,
        [&](KPool::Options const& o) {
          cached_decode<CachePath::automatic>(space, data, serving, B, o);
        },
        "decode_step_cache_fp8",
        [&](KPool::Options const& o) {
          cached_decode<CachePath::automatic>(space, data, cd, B, o);
        });
    run.measure(
        scenario, dtype, "decode_step_cache_fp8_in_step", tokens, B, bytes, 2,
        d.ring,
        [&](KPool::Options const& o) {
          cached_decode<CachePath::in_step>(space, data, cd, B, o);
        },
        "decode_step", uncached, "store_pools_fp8", store);
    run.set_cache_path(prefix + "decode_step_cache_fp8_in_step", "in_step");
    run.measure(
        scenario, dtype, "decode_step_cache_fp8_second_pass", tokens, B, bytes,
        3, d.ring,
        [&](KPool::Options const& o) {
          cached_decode<CachePath::second_pass>(space, data, cd, B, o);
        },
        "decode_step", uncached, "store_pools_fp8", store);
    run.set_cache_path(prefix + "decode_step_cache_fp8_second_pass",
                       "second_pass");
    uncached(KPool::Options());
    space.fence();
    run.measure(scenario, dtype, "store_pools_fp8", tokens, B,
                static_cast<std::uint64_t>(pool_count(pools)) * (kD * S + 8) +
                    cache_bytes(pools),
                1, d.ring, store, "decode_step", uncached);
  }
  // The same tokens through the general (fused) step, for comparison.
  if (run.selected(prefix + "step_fused")) {
    RaggedDesc const rd = d.ragged();
    RaggedData<T> rdata(run.space(), rd);
    run.measure(scenario, dtype, "step_fused", tokens, B, step_bytes(rd, S), 2,
                rd.ring, [&](KPool::Options const& o) {
                  KPool::Options p = o;
                  p.fused = true;
                  fresh_ring(rdata.ring, space, p);
                  KPool::step(space, rdata.ring, rdata.key, rdata.gate, rdata.ape,
                              rdata.batch, rdata.out, p);
                });
  }
}

// Slots: a random choice of distinct slots out of 2B (batches reorder).
std::vector<std::uint32_t> random_slots(int B, int max_slots,
                                        std::mt19937& rng) {
  std::vector<std::uint32_t> all(max_slots);
  std::iota(all.begin(), all.end(), 0u);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(B);
  return all;
}

RaggedDesc fresh_prefill(int B, std::uint32_t tokens, std::mt19937& rng) {
  RaggedDesc d;
  d.rows.assign(B, tokens);
  d.cache_lengths.assign(B, 0);
  d.max_slots = 2 * B;
  d.slots = random_slots(B, d.max_slots, rng);
  return d;
}

// Chunk continuations: cache lengths and chunk ends off the pool grid.
RaggedDesc continuation(int B, std::uint32_t tokens, std::mt19937& rng) {
  RaggedDesc d;
  std::uniform_int_distribution<std::uint32_t> chunks(1, 8), off(1, kK - 1);
  for (int r = 0; r < B; ++r) {
    d.cache_lengths.push_back(chunks(rng) * 4096 + off(rng));
    d.rows.push_back(tokens + off(rng));
  }
  d.max_slots = 2 * B;
  d.slots = random_slots(B, d.max_slots, rng);
  return d;
}

DecodeDesc decode(int B, int next_n, std::mt19937& rng, int ring = kK) {
  DecodeDesc d;
  d.next_n = next_n;
  d.ring = ring;
  std::uniform_int_distribution<std::int32_t> len(1000, 60000);
  for (int r = 0; r < B; ++r) d.start.push_back(len(rng));
  d.max_slots = 2 * B;
  d.slots = random_slots(B, d.max_slots, rng);
  return d;
}

// Chunk continuations of lo..hi tokens and single-token decodes, shuffled.
RaggedDesc mixed(int continuations, int decodes, std::uint32_t lo,
                 std::uint32_t hi, std::mt19937& rng) {
  RaggedDesc d;
  std::uniform_int_distribution<std::uint32_t> chunk(lo, hi), len(0, 16000);
  std::vector<bool> is_decode(continuations + decodes, false);
  std::fill(is_decode.begin() + continuations, is_decode.end(), true);
  std::shuffle(is_decode.begin(), is_decode.end(), rng);
  for (bool dec : is_decode) {
    d.rows.push_back(dec ? 1u : chunk(rng));
    d.cache_lengths.push_back(len(rng));
  }
  d.max_slots = 2 * d.batch();
  d.slots = random_slots(d.batch(), d.max_slots, rng);
  return d;
}

std::string k_tokens(std::uint32_t t) {
  return t % 1024 == 0 ? std::to_string(t / 1024) + "k" : std::to_string(t);
}

template <class T>
void run_all(Runner& run, Settings const& s) {
  std::mt19937 rng(20240611u);
  std::vector<int> const prefill_batches =
      s.quick ? std::vector<int>{1} : std::vector<int>{1, 8};
  std::vector<std::uint32_t> const prefill_tokens =
      s.quick ? std::vector<std::uint32_t>{4096}
              : std::vector<std::uint32_t>{4096, 16384, 65536};
  for (int B : prefill_batches)
    for (std::uint32_t t : prefill_tokens)
      run_ragged<T>(run, "prefill_b" + std::to_string(B) + "_" + k_tokens(t),
                    fresh_prefill(B, t, rng), false);
  {
    int const B = s.quick ? 2 : 8;
    std::uint32_t const t = s.quick ? 1024 : 16384;
    run_ragged<T>(run, "prefill_cont_b" + std::to_string(B) + "_" + k_tokens(t),
                  continuation(B, t, rng), true);
  }
  std::vector<int> const decode_batches =
      s.quick ? std::vector<int>{64} : std::vector<int>{1, 64, 256, 512};
  for (int B : decode_batches) {
    for (int n : {1, 2})
      run_decode<T>(run,
                    "decode_b" + std::to_string(B) + "_n" + std::to_string(n),
                    decode(B, n, rng));
    // Speculative decoding: the next token and three drafts a row, on the
    // serving ring for S = 3 (R = 4 * next_pow2(ceil(7 / 4)) = 8). Its own
    // generator leaves the other cases' inputs as they were.
    std::mt19937 spec_rng(20240611u + static_cast<unsigned>(B));
    run_decode<T>(run, "decode_b" + std::to_string(B) + "_n4_r8",
                  decode(B, 4, spec_rng, KPool::Ring<T, Mem>::serving_length(kK, 3)));
  }
  {
    // The serving mix the fused step is for: many small chunk
    // continuations (speculative or chunked-prefill tails) among decodes.
    int const c = s.quick ? 16 : 64, dec = s.quick ? 48 : 192;
    std::string const tail = std::to_string(c) + "c_" + std::to_string(dec) + "d";
    run_ragged<T>(run, "mixed_" + tail, mixed(c, dec, 2, 24, rng), true);
    // The same mix with larger continuations, where the work outweighs
    // the launches.
    if (!s.quick)
      run_ragged<T>(run, "mixed_large_" + tail, mixed(c, dec, 32, 256, rng), true);
  }
}

// ----------------------------------------------------------- selection

// One selection call's inputs: `rows[r]` query rows at cache length
// `cache_lengths[r]` per request, an fp8 rotated cache holding every
// request's pools in shuffled blocks, bf16 queries.
struct SelectDesc {
  std::vector<std::uint32_t> rows, cache_lengths;
  int heads = 32;
  int topk = 512;
  int block_pools = 64;
  // Whether the case is timed beside a same-run GEMM of its FLOPs (with
  // Kokkos Kernels; not for rows too long for one).
  bool gemm = true;
  int batch() const { return static_cast<int>(rows.size()); }
  int max_blocks() const {
    std::uint64_t m = 1;
    for (int r = 0; r < batch(); ++r)
      m = std::max<std::uint64_t>(
          m, ((cache_lengths[r] + rows[r]) / kK + block_pools - 1) / block_pools);
    return static_cast<int>(m);
  }
  // The least a selection moves: each request's visible pools read once
  // (an fp8 entry, D codes and an f32 scale: D + 4 bytes; both profiles),
  // the bf16 queries and f32 weights, the ids written, the block table and
  // the batch's index arrays. The cost model and h200_limits.py take their
  // memory time from it.
  std::uint64_t bytes() const {
    std::uint64_t n = 0;
    for (int r = 0; r < batch(); ++r)
      n += (cache_lengths[r] + rows[r]) / kK * std::uint64_t(kD + 4);
    n += tokens() * static_cast<std::uint64_t>(heads) * (kD * 2 + 4);
    n += tokens() * static_cast<std::uint64_t>(topk) * 4;
    n += static_cast<std::uint64_t>(batch()) * max_blocks() * 4 + (2 * batch() + 1) * 4;
    return n;
  }
  std::uint64_t tokens() const {
    return std::accumulate(rows.begin(), rows.end(), std::uint64_t(0));
  }
  // Visible pools summed over the query rows.
  std::uint64_t scored() const {
    std::uint64_t n = 0;
    for (int r = 0; r < batch(); ++r)
      for (std::uint32_t i = 0; i < rows[r]; ++i) n += (cache_lengths[r] + i + 1) / kK;
    return n;
  }
  // Launches of the BLAS engine (a staging launch, a gemm and a reduction
  // per request, pool chunk and query chunk, then the selection), with the
  // workspace's chunk sizes.
  int blas_launches() const {
    auto const chunks = KPool::Details::BlasChunks::for_shape(tokens(), max_visible(), heads);
    std::uint64_t n = 1;
    for (int r = 0; r < batch(); ++r) {
      std::uint64_t const c = cache_lengths[r], rows_r = rows[r];
      std::uint64_t const vis = (c + rows_r) / kK;
      for (std::uint64_t p0 = 0; p0 < vis; p0 += chunks.pools) {
        std::uint64_t const need = (p0 + 1) * kK;
        std::uint64_t const i0 = need > c + 1 ? need - c - 1 : 0;
        if (i0 < rows_r) n += 3 * ((rows_r - i0 + chunks.rows - 1) / chunks.rows);
      }
    }
    return static_cast<int>(n);
  }
  std::uint64_t max_visible() const {
    std::uint64_t m = 1;
    for (int r = 0; r < batch(); ++r)
      m = std::max<std::uint64_t>(m, (cache_lengths[r] + rows[r]) / kK);
    return m;
  }
};

struct SelectData {
  using Cache = KPool::PoolCache<KPool::float8_e4m3, Mem>;
  SelectDesc desc;
  View1<std::uint32_t> row_offsets, cache_lengths;
  View2<std::int32_t> block_table;
  View3<KPool::bfloat16> q;
  View2<float> weights;
  Cache cache;
  // The same bytes as a serving-profile cache (pow2 scales).
  Cache serving_cache;
  View2<std::int32_t> pool_ids;
  // Built for the default engine (each other engine's is built like it).
  KPool::SelectWorkspace<KPool::bfloat16, Mem> workspace;
  // The same-run GEMM: f32 [T * H, D] x [D, P]^T.
  View2<float> a, b, c;

  SelectData(Space const& space, SelectDesc const& d, std::mt19937& rng) : desc(d) {
    int const B = d.batch();
    std::size_t const T = d.tokens();
    std::vector<std::uint32_t> offsets(B + 1, 0);
    std::vector<int> blocks(B);
    int total = 0, max_blocks = 1;
    std::size_t const P = d.gemm ? std::max<std::uint64_t>(1, (d.scored() + T / 2) / T) : 1;
    for (int r = 0; r < B; ++r) {
      offsets[r + 1] = offsets[r] + d.rows[r];
      std::uint64_t const vis = (d.cache_lengths[r] + d.rows[r]) / kK;
      blocks[r] = static_cast<int>((vis + d.block_pools - 1) / d.block_pools);
      total += blocks[r];
      max_blocks = std::max(max_blocks, blocks[r]);
    }
    row_offsets = upload(space, "kpool_perf::select_row_offsets", offsets);
    cache_lengths = upload(space, "kpool_perf::select_cache_lengths", d.cache_lengths);
    std::vector<int> perm(std::max(total, 1));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    block_table = View2<std::int32_t>(Kokkos::view_alloc(space, "kpool_perf::block_table"),
                                      B, max_blocks);
    auto ht = Kokkos::create_mirror_view(block_table);
    int next = 0;
    for (int r = 0; r < B; ++r)
      for (int j = 0; j < max_blocks; ++j) ht(r, j) = j < blocks[r] ? perm[next++] : -1;
    Kokkos::deep_copy(space, block_table, ht);
    cache = Cache(space, std::max(total, 1), d.block_pools, kD, kK, KPool::CacheScale::amax,
                  true);
    fill(space, cache.values().data(), cache.values().size(), 0x3131u);
    Kokkos::deep_copy(space, cache.scales(), 0.01f);
    serving_cache = Cache(space, std::max(total, 1), d.block_pools, kD, kK,
                          KPool::CacheScale::pow2, true, KPool::CacheProfile::serving);
    Kokkos::deep_copy(space, serving_cache.values(), cache.values());
    Kokkos::deep_copy(space, serving_cache.scales(), 0.0078125f);
    q = View3<KPool::bfloat16>(Kokkos::view_alloc(space, Kokkos::WithoutInitializing,
                                                  "kpool_perf::q"),
                               T, d.heads, kD);
    fill(space, q.data(), q.size(), 0x5151u);
    weights = View2<float>(Kokkos::view_alloc(space, Kokkos::WithoutInitializing,
                                              "kpool_perf::weights"),
                           T, d.heads);
    fill(space, weights.data(), weights.size(), 0x7171u);
    pool_ids = View2<std::int32_t>(Kokkos::view_alloc(space, "kpool_perf::pool_ids"), T,
                                   d.topk);
    // Every pool a row of the block table addresses: the timed calls run
    // without validation (docs/validation.md).
    std::size_t const table_pools = block_table.extent(1) * static_cast<std::size_t>(d.block_pools);
    workspace = KPool::SelectWorkspace<KPool::bfloat16, Mem>(space, T, table_pools, d.heads, kD);
    a = View2<float>(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "kpool_perf::gemm_a"),
                     d.gemm ? T * d.heads : 1, kD);
    b = View2<float>(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "kpool_perf::gemm_b"),
                     P, kD);
    c = View2<float>(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "kpool_perf::gemm_c"),
                     d.gemm ? T * d.heads : 1, P);
    fill(space, a.data(), a.size(), 0x9191u);
    fill(space, b.data(), b.size(), 0xA1A1u);
    space.fence();
  }
  double gemm_flops() const {
    return 2.0 * static_cast<double>(a.extent(0)) * b.extent(0) * kD;
  }
  // The same-run GEMM where there is one (Kokkos Kernels, SelectDesc::gemm).
  std::function<void()> gemm() const {
#if KPOOL_HAS_KOKKOSKERNELS
    if (desc.gemm)
      return [a = a, b = b, c = c]() { KokkosBlas::gemm("N", "T", 1.0f, a, b, 0.0f, c); };
#endif
    return {};
  }
};

// The tensor work of a selection op on a GPU (Result::tensor): the serving
// profile's E4M3 MMA, the exact profile's three bf16 terms (automatic takes
// tensor_cores there), the other engines' f32 CUDA cores.
char const* select_tensor(std::string const& op) {
  if (op.find("serving") != std::string::npos) return "e4m3";
  if (op == "select" || op == "select_tensor_cores" || op == "select_fused" ||
      op == "select_ranks2")
    return "bf16x3";
  return "f32";
}

void run_select(Runner& run, std::string const& scenario, SelectDesc const& d,
                std::mt19937& rng) {
  std::string const prefix = scenario + "/bf16/";
  std::vector<std::pair<std::string, KPool::ScoreEngine>> engines = {
      {"select", KPool::ScoreEngine::automatic},
      {"select_tiles", KPool::ScoreEngine::tiles}};
  if (KPOOL_HAS_KOKKOSKERNELS) engines.push_back({"select_team_gemm", KPool::ScoreEngine::team_gemm});
  if (!KPool::Details::KokkosExt::is_device_backend<Space>::value) {
    engines.push_back({"select_register_tiles", KPool::ScoreEngine::register_tiles});
    if (KPOOL_HAS_KOKKOSKERNELS) engines.push_back({"select_blas", KPool::ScoreEngine::blas});
  } else if (KPool::Details::mma_plan<Space, KPool::bfloat16, KPool::float8_e4m3>(true)
                 .on_device) {
    // The tensor-core engine by name (automatic picks it too); its
    // tensor-core work is 3x `flops` (three bf16 terms of the rotated query).
    engines.push_back({"select_tensor_cores", KPool::ScoreEngine::tensor_cores});
  }
  bool const one_row_each =
      std::all_of(d.rows.begin(), d.rows.end(), [](std::uint32_t n) { return n == 1; });
  std::vector<std::string> ops = {"select_serving"};
  for (auto const& e : engines) ops.push_back(e.first);
  if (one_row_each) {
    ops.push_back("select_fused");
    ops.push_back("select_fused_serving");
    ops.push_back("select_ranks2");
  }
  bool any = false;
  for (auto const& op : ops) any = any || run.selected(prefix + op);
  if (!any) return;
  // --describe builds nothing: the cases' sizes come from `d` alone.
  std::unique_ptr<SelectData> owned;
  if (!run.describing()) owned = std::make_unique<SelectData>(run.space(), d, rng);
  SelectData* const data = owned.get();  // null with --describe
  Space const space = run.space();
  double const flops = 2.0 * d.heads * kD * static_cast<double>(d.scored());
  std::uint64_t const bytes = d.bytes();
  double const gemm_flops = owned ? data->gemm_flops() : 0.0;
  std::function<void()> const gemm = owned ? data->gemm() : std::function<void()>();
  bool const device = KPool::Details::KokkosExt::is_device_backend<Space>::value;
  for (auto const& e : engines) {
    KPool::ScoreEngine const engine = e.second;
    bool const blas = engine == KPool::ScoreEngine::blas;
    // The engine is the workspace's: one built for it, as the default's.
    using Workspace = KPool::SelectWorkspace<KPool::bfloat16, Mem>;
    Workspace ws = owned ? data->workspace : Workspace();
    if (owned && engine != ws.engine() && run.selected(prefix + e.first))
      ws = Workspace(space, ws.max_tokens(), ws.max_visible(), d.heads, kD, engine);
    run.measure_flops(
        scenario, "bf16", e.first, d.tokens(), d.batch(), flops, select_tensor(e.first), bytes,
        blas && !device ? d.blas_launches() : 2,
        [&](KPool::Options const& o) {
          KPool::score_select(space, data->q, data->weights, d.topk,
                              KPool::ragged_batch(data->row_offsets, data->cache_lengths,
                                                  d.batch()),
                              KPool::paged(data->cache, data->block_table), data->pool_ids, ws,
                              o);
        },
        gemm_flops, gemm);
  }
  // select_serving: the default engine over the serving-profile cache (the
  // queries quantized in the same launches), timed beside "select" over
  // the exact profile's: its overhead + 1 is the serving profile's cost.
  auto const select_over = [&](KPool::Options const& o, SelectData::Cache const& cache) {
    KPool::score_select(space, data->q, data->weights, d.topk,
                        KPool::ragged_batch(data->row_offsets, data->cache_lengths, d.batch()),
                        KPool::paged(cache, data->block_table), data->pool_ids, data->workspace,
                        o);
  };
  run.measure_flops(
      scenario, "bf16", "select_serving", d.tokens(), d.batch(), flops, "e4m3", bytes, 2,
      [&](KPool::Options const& o) { select_over(o, data->serving_cache); }, gemm_flops, gemm,
      "select", [&](KPool::Options const& o) { select_over(o, data->cache); });
  if (!one_row_each) return;
  // select_fused and select_fused_serving: a decode batch (one row a
  // request) through the Batch form, scoring and top-k in one launch,
  // timed beside the same call in three (Options::decode_selection): its
  // overhead + 1 is the fused kernel's cost against the separate path's;
  // over the exact and the serving profile's cache.
  View2<std::int32_t> positions;
  if (owned) {
    positions = View2<std::int32_t>("kpool_perf::select_positions", d.batch(), 1);
    auto h = Kokkos::create_mirror_view(positions);
    for (int r = 0; r < d.batch(); ++r) h(r, 0) = static_cast<std::int32_t>(d.cache_lengths[r]);
    Kokkos::deep_copy(positions, h);
  }
  auto const decode_over = [&](KPool::Options const& o, KPool::DecodeSelection how,
                               SelectData::Cache const& cache) {
    KPool::Options p = o;
    p.decode_selection = how;
    KPool::score_select(space, data->q, data->weights, d.topk,
                        KPool::decode_batch(positions, d.batch()),
                        KPool::paged(cache, data->block_table), data->pool_ids, data->workspace,
                        p);
  };
  for (bool serving : {false, true}) {
    SelectData::Cache const* cache = owned ? (serving ? &data->serving_cache : &data->cache)
                                           : nullptr;
    std::string const op = serving ? "select_fused_serving" : "select_fused";
    run.measure_flops(
        scenario, "bf16", op, d.tokens(), d.batch(), flops, select_tensor(op), bytes, 1,
        [&](KPool::Options const& o) { decode_over(o, KPool::DecodeSelection::fused, *cache); },
        gemm_flops, gemm, serving ? "select_separate_serving" : "select_separate",
        [&](KPool::Options const& o) {
          decode_over(o, KPool::DecodeSelection::separate, *cache);
        });
  }
  // select_ranks2: one rank's work in a decode selection over a cache
  // sharded over 2 ranks (docs/ranks.md), in this one process: rank 0's
  // local selection over its half of the pools (a block of the cache a
  // run: the even columns of the block table, the same bytes), the
  // exchange as copies of two payloads, and the merge; timed beside the
  // same selection over the whole cache on one rank (select_one_rank): its
  // overhead + 1 is one rank's share of the time. No real second rank runs
  // (its work would share these cores): the collective's latency is not in
  // it (docs/ranks.md has the arithmetic for NVLink).
  if (!owned || !run.selected(prefix + "select_ranks2")) return;
  int const W = 2;
  auto const batch = KPool::decode_batch(positions, d.batch());
  KPool::Shard const shard{0, W, d.block_pools};
  View2<std::int32_t> half("kpool_perf::ranks_table", d.batch(),
                           (data->block_table.extent(1) + 1) / 2);
  auto ht = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), data->block_table);
  auto hh = Kokkos::create_mirror_view(half);
  for (int r = 0; r < d.batch(); ++r)
    for (std::size_t c = 0; c < hh.extent(1); ++c) hh(r, c) = ht(r, 2 * c);
  Kokkos::deep_copy(half, hh);
  auto const mine = KPool::paged(data->cache.sharded(shard), half);
  KPool::SelectWorkspace<KPool::bfloat16, Mem> local_ws(
      space, d.tokens(), half.extent(1) * static_cast<std::size_t>(d.block_pools), d.heads, kD);
  KPool::ShardWorkspace<KPool::bfloat16, Mem> exchange(space, d.tokens(), d.topk, W);
  std::size_t const payload =
      KPool::ShardWorkspace<KPool::bfloat16, Mem>::payload_bytes(d.tokens(), d.topk);
  run.measure_flops(
      scenario, "bf16", "select_ranks2", d.tokens(), d.batch(), flops / W, "bf16x3", bytes / W,
      4,
      [&](KPool::Options const& o) {
        KPool::shard_select_local(space, data->q, data->weights, d.topk, batch, mine, local_ws,
                                  exchange, o);
        for (int r = 0; r < W; ++r)
          Kokkos::deep_copy(
              space,
              Kokkos::subview(exchange.recv(), std::make_pair(r * payload, (r + 1) * payload)),
              Kokkos::subview(exchange.send(), std::make_pair(std::size_t(0), payload)));
        KPool::shard_select_merge(space, d.topk, mine, data->pool_ids, exchange, o);
      },
      gemm_flops, gemm, "select_one_rank",
      [&](KPool::Options const& o) {
        KPool::score_select(space, data->q, data->weights, d.topk, batch,
                            KPool::paged(data->cache, data->block_table), data->pool_ids,
                            data->workspace, o);
      });
  run.set_exchange(prefix + "select_ranks2", W,
                   static_cast<std::uint64_t>(W) * d.topk *
                       (4 + sizeof(KPool::ShardWorkspace<KPool::bfloat16, Mem>::key_type)));
}

void run_selects(Runner& run, Settings const& s) {
  std::mt19937 rng(20240612u);
  {
    // Decode: 64 requests, one query each over 8192 visible pools.
    SelectDesc d;
    int const B = s.quick ? 8 : 64;
    std::uint32_t const pools = s.quick ? 2048 : 8192;
    d.rows.assign(B, 1);
    d.cache_lengths.assign(B, pools * kK - 1);
    run_select(run, s.quick ? "select_decode_b8_p2k" : "select_decode_b64_p8k", d, rng);
  }
  {
    // Prefill: the last 2048 tokens of an 8192-token prompt, one request:
    // 2048 queries over 1536..2048 visible pools.
    SelectDesc d;
    std::uint32_t const n = s.quick ? 256 : 2048;
    d.rows.assign(1, n);
    d.cache_lengths.assign(1, 4 * n - n);
    run_select(run, s.quick ? "select_prefill_q256_p256" : "select_prefill_q2k_p2k", d,
               rng);
  }
  {
    // One query row over 2^20 visible pools (a 4M-token context), only
    // when --cases names it: a GPU's case (run_device.sh tier 1), minutes
    // on a host. No GEMM beside it.
    std::string const scenario = "select_decode_b1_p1m";
    bool named = false;
    for (char const* op : {"select", "select_serving", "select_fused", "select_fused_serving"})
      named = named || run.named(scenario + "/bf16/" + op);
    if (named) {
      SelectDesc d;
      d.rows.assign(1, 1);
      d.cache_lengths.assign(1, (1u << 20) * kK - 1);
      d.gemm = false;
      run_select(run, scenario, d, rng);
    }
  }
}
// Keys of scores in [-2, 2), as the scoring engines write them.
struct KeyFillFunctor {
  Kokkos::View<std::uint32_t*, Mem> keys;
  KOKKOS_INLINE_FUNCTION void operator()(std::size_t i) const {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 0x9E3779B1u ^ 0x2545F491u;
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    h ^= h >> 16;
    float const x = static_cast<float>(h >> 8) * (4.0f / 16777216.0f) - 2.0f;
    keys(i) = KPool::Details::score_key(x);
  }
};

struct KeyMaxFunctor {
  Kokkos::View<const std::uint32_t*, Mem> keys;
  KOKKOS_INLINE_FUNCTION void operator()(std::size_t i, std::uint32_t& m) const {
    m = keys(i) > m ? keys(i) : m;
  }
};

// The same maximum, a block of keys an iteration into a local value (a
// loop the compiler vectorizes), the accumulator updated once a block.
struct KeyStreamMaxFunctor {
  static constexpr std::uint64_t block = 256;
  Kokkos::View<const std::uint32_t*, Mem> keys;
  std::uint64_t n;
  KOKKOS_INLINE_FUNCTION void operator()(std::size_t b, std::uint32_t& m) const {
    std::uint64_t const p0 = b * block;
    std::uint64_t const p1 = p0 + block < n ? p0 + block : n;
    std::uint32_t const* k = keys.data();
    std::uint32_t x = 0;
    for (std::uint64_t p = p0; p < p1; ++p) x = k[p] > x ? k[p] : x;
    m = x > m ? x : m;
  }
};

// Op `topk`: the selection alone over `rows` rows of `pools` scored keys
// (one request a row), next to a max-reduction reading the same keys.
void run_topk(Runner& run, std::string const& scenario, int rows, std::uint32_t pools,
              int topk) {
  if (!run.selected(scenario + "/f32/topk")) return;
  namespace D = KPool::Details;
  Space const space = run.space();
  std::vector<std::uint32_t> offsets(rows + 1), lengths(rows, pools - 1);
  std::iota(offsets.begin(), offsets.end(), 0u);
  View1<std::uint32_t> row_offsets = upload(space, "kpool_perf::topk_row_offsets", offsets);
  View1<std::uint32_t> cache_lengths = upload(space, "kpool_perf::topk_cache_lengths", lengths);
  // The workspace a selection of these rows would use (its keys and its
  // long-row histograms).
  KPool::SelectWorkspace<float, Mem> ws(space, rows, pools, 1, 1);
  Kokkos::View<std::uint32_t*, Mem> keys(ws.keys().data(), ws.keys().size());
  Kokkos::parallel_for("kpool_perf::topk_keys",
                       Kokkos::RangePolicy<Space>(space, 0, keys.size()),
                       KeyFillFunctor{keys});
  View2<std::int32_t> out(Kokkos::view_alloc(space, "kpool_perf::topk_ids"), rows, topk);
  D::SelectBatch batch;
  batch.row_offsets = row_offsets;
  batch.cache_lengths = cache_lengths;
  batch.num_requests = rows;
  batch.kpool = 1;
  batch.total_rows = static_cast<std::uint64_t>(rows);
  batch.max_visible = pools;
  batch.row_begin = 0;
  batch.row_end = static_cast<std::uint64_t>(rows);
  D::SplitArgs split;
  split.seg_hist = ws.segment_histograms();
  split.plans = ws.split_plans();
  split.tickets = ws.fused_tickets();
  split.segs = ws.split_segments();
  split.from = ws.split_from();
  split.segment = ws.split_segment();
  D::Checker const chk("kpool_perf::topk");
  KPool::Options o;
  space.fence();
  std::uint64_t const n = static_cast<std::uint64_t>(rows) * pools;
  run.measure_read(
      scenario, "f32", "topk", static_cast<std::uint64_t>(rows), rows, n * 4,
      split.segs > 0 ? 3 : 1,
      [&]() {
        D::launch_select<false>(chk, space, batch,
                                static_cast<std::uint32_t const*>(keys.data()),
                                D::View2<std::int32_t, Mem>(out), topk, split, o);
      },
      [&]() {
        std::uint32_t m = 0;
        Kokkos::parallel_reduce("kpool_perf::topk_keys_read",
                                Kokkos::RangePolicy<Space>(space, 0, n),
                                KeyMaxFunctor{keys}, Kokkos::Max<std::uint32_t>(m));
      },
      [&]() {
        std::uint32_t m = 0;
        std::uint64_t const blocks = (n + KeyStreamMaxFunctor::block - 1) / KeyStreamMaxFunctor::block;
        Kokkos::parallel_reduce("kpool_perf::topk_keys_streamed",
                                Kokkos::RangePolicy<Space>(space, 0, blocks),
                                KeyStreamMaxFunctor{keys, n}, Kokkos::Max<std::uint32_t>(m));
      });
}

void run_topks(Runner& run, Settings const& s) {
  if (s.quick) {
    run_topk(run, "topk_b8_p2k", 8, 2048, 128);
    run_topk(run, "topk_b1_p256k", 1, 1u << 18, 512);
  } else {
    run_topk(run, "topk_b64_p8k", 64, 8192, 512);
    run_topk(run, "topk_b1_p1m", 1, 1u << 20, 2048);
  }
}

// ---------------------------------------------------------------- report

void usage(char const* argv0) {
  std::printf(
      "usage: %s [--quick] [--filter SUBSTRING[,SUBSTRING...]] [--cases NAME[,NAME...]]\n"
      "       [--out PATH] [--lines PATH] [--summary PATH] [--describe] [--min-time SECONDS]\n"
      "       [--batch-calls N]\n"
      "  --quick        fewer, smaller cases (smoke test)\n"
      "  --filter S     only entries whose name contains S (names are\n"
      "                 scenario/dtype/op, e.g. prefill_b8_16k/bf16/compress);\n"
      "                 S1,S2,... any of them\n"
      "  --cases N      exactly the entries named N (N1,N2,...); device-sized\n"
      "                 cases (select_decode_b1_p1m) run only when named\n"
      "  --out PATH     report path (default perf_report.json), written at the end\n"
      "  --lines PATH   append each case's JSON line to PATH as it ends (and a\n"
      "                 first line with the run's own facts)\n"
      "  --summary PATH append each case's printed summary line to PATH as it ends\n"
      "  --describe     list the selected cases' bytes and FLOPs, run nothing\n"
      "  --min-time S   seconds of timed runs per entry (default 0.2; quick\n"
      "                 0.02); at least 5 runs, at most 200\n"
      "  --batch-calls N  calls a batch of back-to-back calls (default 16)\n",
      argv0);
}

}  // namespace

int main(int argc, char* argv[]) {
  Settings s;
  bool min_time_set = false;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    auto value = [&](char const* opt) -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "kpool_perf: %s needs a value\n", opt);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--quick") {
      s.quick = true;
    } else if (a == "--filter") {
      s.filter = value("--filter");
    } else if (a == "--cases") {
      std::string const v = value("--cases");
      std::size_t begin = 0;
      while (begin <= v.size()) {
        std::size_t const comma = v.find(',', begin);
        std::size_t const end = comma == std::string::npos ? v.size() : comma;
        if (end > begin) s.cases.push_back(v.substr(begin, end - begin));
        begin = end + 1;
      }
    } else if (a == "--lines") {
      s.lines = value("--lines");
    } else if (a == "--summary") {
      s.summary = value("--summary");
    } else if (a == "--describe") {
      s.describe = true;
    } else if (a == "--batch-calls") {
      s.batch_calls = std::atoi(value("--batch-calls").c_str());
      if (s.batch_calls < 1) {
        std::fprintf(stderr, "kpool_perf: --batch-calls needs a count of at least 1\n");
        return 2;
      }
    } else if (a == "--out") {
      s.out = value("--out");
    } else if (a == "--min-time") {
      std::string const v = value("--min-time");
      char* end = nullptr;
      s.min_time = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0' || !(s.min_time >= 0)) {
        std::fprintf(stderr, "kpool_perf: bad --min-time '%s'\n", v.c_str());
        return 2;
      }
      min_time_set = true;
    } else if (a == "--help" || a == "-h") {
      usage(argv[0]);
      return 0;
    } else if (a.rfind("--kokkos", 0) == 0) {
      // Kokkos' own options, handled by Kokkos::initialize.
    } else {
      std::fprintf(stderr, "kpool_perf: unknown argument '%s'\n", a.c_str());
      usage(argv[0]);
      return 2;
    }
  }
  if (s.quick && !min_time_set) s.min_time = 0.02;

  int status = 0;
  Kokkos::initialize(argc, argv);
#if defined(KOKKOS_ENABLE_CUDA)
  // On CUDA the instance runs on a stream of its own, which the graph
  // timing captures (DeviceTimer::graph).
  cudaStream_t stream = nullptr;
  if constexpr (std::is_same<Space, Kokkos::Cuda>::value)
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
#endif
  {
#if defined(KOKKOS_ENABLE_CUDA)
    Space space = [&] {
      if constexpr (std::is_same<Space, Kokkos::Cuda>::value)
        return Space(stream);
      else
        return Space();
    }();
#else
    Space space;
#endif
    Clock::time_point const t0 = Clock::now();
    Runner run(space, s);
    std::printf("kpool_perf: %s, concurrency %d, D = %d, K = %d%s; a fence of the idle "
                "instance: %.2f us\n",
                Space::name(), space.concurrency(), kD, kK, s.quick ? ", quick" : "",
                run.fence_seconds() * 1e6);
    std::fflush(stdout);
    if (!s.lines.empty()) {
      std::ofstream f(s.lines, std::ios::app);
      f << "{" << header_json(run.fence_seconds()) << "}\n";
    }
    try {
      run_all<KPool::bfloat16>(run, s);
      run_all<float>(run, s);
      run_selects(run, s);
      run_topks(run, s);
    } catch (std::exception const& e) {
      std::fprintf(stderr, "kpool_perf: %s\n", e.what());
      status = 1;
    }
    if (!write_report(s.out, run.results(), run.fence_seconds())) {
      std::fprintf(stderr, "kpool_perf: cannot write %s\n", s.out.c_str());
      status = 1;
    } else {
      std::error_code ec;
      std::filesystem::path const p = std::filesystem::absolute(s.out, ec);
      std::printf("kpool_perf: %zu cases in %.1f s, report %s\n",
                  run.results().size(), seconds_between(t0, Clock::now()),
                  ec ? s.out.c_str() : p.string().c_str());
    }
  }
#if defined(KOKKOS_ENABLE_CUDA)
  if (stream) cudaStreamDestroy(stream);
#endif
  Kokkos::finalize();
  return status;
}
