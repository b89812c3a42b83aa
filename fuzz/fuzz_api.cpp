// fuzz_api: the input's bytes decode into one call of a public entry point
// in its Batch form (KPool::step fused and unfused with a ragged batch, and
// with a decode batch; the ring forms of ring_close, seed_tail and
// tail_update; compress, expand_topk, store_pools, score_select,
// select_tokens) with small shapes and arbitrary values in every index
// array: row offsets, cache lengths, slots, decode positions, block tables,
// pool ids, topk, K (the cache's, for expand_topk and the selections), the
// batch size.
//
// Every caller buffer is an unmanaged view over an allocation of exactly
// its size (AddressSanitizer sees one element past it), every buffer the
// call may write (outputs, ring, StepOutput, pool cache) starts filled with
// a canary byte. The writers' ring has every slot hold every position
// (docs/ring.md, "No gaps"), so that any start reaches the reference.
// Properties (fuzz/README.md), each an abort when broken:
//   - KPool::InvalidArgument (validation on or off) leaves every writable
//     byte as it was;
//   - with validation on, a call that returns agrees with the host
//     reference (unit_tests/KPoolReference.hpp): pools within
//     docs/pools.md's f32 tolerance, ids, offsets, ring and closed pools
//     exactly, rows past num_requests untouched (the writers, the steps and
//     expand_topk; store_pools, score_select and select_tokens are checked
//     for the first and the last property only);
//   - validation off: whatever the values, no read or write outside the
//     views (AddressSanitizer, UndefinedBehaviorSanitizer);
//   - nothing but KPool::InvalidArgument escapes.
//
// Input layout (Bytes below; missing bytes read as 0):
//   entry, flags, K, D, ring length, slots, batch size, num_requests, a
//   seed for the float data, then the entry's index arrays, element by
//   element (Bytes::u32 / Bytes::i32: one byte for a small value, escape
//   bytes for a raw 32-bit value or an extreme), then up to 4 "pokes"
//   (array, element, value) that overwrite one index each.
//
// A new argument of an entry point is one more field read in its case of
// run() below; the reference checks are per entry point.

#include <KPool.hpp>
#include <KPoolReference.hpp>
#include "FuzzSupport.hpp"

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace KPoolFuzz {
char const* const harness_name = "fuzz_api";
}

namespace {

using E = Kokkos::DefaultHostExecutionSpace;
using M = E::memory_space;
using T = float;
template <class DataType>
using U = Kokkos::View<DataType, Kokkos::LayoutRight, M,
                       Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
using U32 = U<std::uint32_t*>;
using I2 = U<std::int32_t**>;
using I1 = U<std::int32_t*>;
using V2 = U<T**>;
using V3 = U<T***>;
using V4 = U<T****>;
using F2 = U<float**>;
using Ring = KPool::Ring<T, M>;
using Out = KPool::StepOutput<T, M>;
using RefMatrix = KPoolRef::Matrix;

using namespace KPoolFuzz;

template <class V>
void fill(V const& v, Values& vals) {
  T* p = v.data();
  for (std::size_t i = 0; i < v.span(); ++i) p[i] = vals.next();
}

// A ragged batch: row_offsets [B + 1], cache_lengths [B], slot_idx [B].
// Structured (flags bit): consecutive offsets from 0 and small lengths and
// slots, which pokes then break one value at a time; otherwise raw.
struct Ragged {
  U32 row_offsets, cache_lengths, slot_idx;
  std::size_t key_rows = 0;
};

Ragged ragged(Bytes& in, Arena& a, int B, bool structured, int slots) {
  Ragged r;
  r.row_offsets = a.input<U32>(B + 1);
  r.cache_lengths = a.input<U32>(B);
  r.slot_idx = a.input<U32>(B);
  if (structured) {
    r.row_offsets(0) = 0;
    for (int i = 0; i < B; ++i) {
      r.row_offsets(i + 1) = r.row_offsets(i) + in.pick(9);
      r.cache_lengths(i) = in.pick(20);
      r.slot_idx(i) = in.pick(slots + 1);
    }
    r.key_rows = r.row_offsets(B) + in.pick(3);
  } else {
    for (int i = 0; i <= B; ++i) r.row_offsets(i) = in.u32();
    for (int i = 0; i < B; ++i) r.cache_lengths(i) = in.u32();
    for (int i = 0; i < B; ++i) r.slot_idx(i) = in.u32();
    r.key_rows = in.pick(40);
  }
  return r;
}

// Up to 4 single-value overwrites of the given index arrays.
template <class... Views>
void poke(Bytes& in, Views const&... views) {
  int const n = in.pick(5);
  for (int k = 0; k < n; ++k) {
    int const which = in.pick(static_cast<int>(sizeof...(Views)));
    std::size_t const at = in.u8();
    std::uint32_t const value = in.u32();
    int i = 0;
    auto one = [&](auto const& v) {
      if (i++ != which || v.span() == 0) return;
      using V = typename std::decay_t<decltype(v)>::value_type;
      v.data()[at % v.span()] = static_cast<V>(value);
    };
    (one(views), ...);
  }
}

KPoolRef::Batch ref_batch(Ragged const& r, int B, int num_requests) {
  KPoolRef::Batch b;
  b.row_offsets.assign(r.row_offsets.data(), r.row_offsets.data() + B + 1);
  // Rows past num_requests are dead: KPool reads none of their entries
  // (docs/validation.md); the reference wants the array non-decreasing.
  for (int i = std::max(num_requests, 0) + 1; i <= B; ++i)
    b.row_offsets[i] = b.row_offsets[std::max(num_requests, 0)];
  b.cache_lengths.assign(r.cache_lengths.data(), r.cache_lengths.data() + B);
  b.slot_idx.assign(r.slot_idx.data(), r.slot_idx.data() + B);
  b.num_requests = num_requests;
  return b;
}

// key, gate ([rows, D] of T) or ape ([K, D] of float).
RefMatrix ref_matrix(V2 const& v) {
  RefMatrix m(static_cast<int>(v.extent(0)), static_cast<int>(v.extent(1)));
  for (std::size_t i = 0; i < v.extent(0); ++i)
    for (std::size_t c = 0; c < v.extent(1); ++c) m.at(int(i), int(c)) = v(i, c);
  return m;
}
// [B, N, D] as [B * N, D].
RefMatrix ref_matrix(V3 const& v) {
  RefMatrix m(static_cast<int>(v.extent(0) * v.extent(1)), static_cast<int>(v.extent(2)));
  for (std::size_t i = 0; i < v.extent(0); ++i)
    for (std::size_t j = 0; j < v.extent(1); ++j)
      for (std::size_t c = 0; c < v.extent(2); ++c)
        m.at(int(i * v.extent(1) + j), int(c)) = v(i, j, c);
  return m;
}

KPoolRef::Ring ref_ring(V4 const& tail, int K) {
  KPoolRef::Ring r(int(tail.extent(0)), K, int(tail.extent(3)), int(tail.extent(2)));
  for (std::size_t s = 0; s < tail.extent(0); ++s)
    for (int w = 0; w < 2; ++w)
      for (std::size_t i = 0; i < tail.extent(2); ++i)
        for (std::size_t c = 0; c < tail.extent(3); ++c)
          r.at(int(s), w, int(i), int(c)) = tail(s, w, i, c);
  return r;
}

void expect_ring(V4 const& tail, KPoolRef::Ring const& ref, char const* entry) {
  for (std::size_t s = 0; s < tail.extent(0); ++s)
    for (int w = 0; w < 2; ++w)
      for (std::size_t i = 0; i < tail.extent(2); ++i)
        for (std::size_t c = 0; c < tail.extent(3); ++c) {
          float const want = static_cast<float>(ref.at(int(s), w, int(i), int(c)));
          if (std::memcmp(&tail(s, w, i, c), &want, sizeof(float)) != 0)
            defect(std::string(entry) + ": ring slot " + std::to_string(s) +
                   (w ? " gate" : " key") + " index " + std::to_string(i) + " channel " +
                   std::to_string(c) + " is " + std::to_string(tail(s, w, i, c)) +
                   ", the reference has " + std::to_string(want));
        }
}

// docs/pools.md's f32 tolerance: 1e-5 of max(|ref|, scale).
void expect_pool(T const* got, std::ptrdiff_t stride, double const* ref, double const* scale,
                 int D, std::string const& what) {
  for (int c = 0; c < D; ++c) {
    double const g = got[c * stride];
    double const tol = 1e-5 * std::max(std::fabs(ref[c]), scale[c]) + 1e-30;
    if (!(std::fabs(g - ref[c]) <= tol))
      defect(what + " channel " + std::to_string(c) + ": got " + std::to_string(g) +
             ", reference " + std::to_string(ref[c]));
  }
}

bool untouched(void const* p, std::size_t bytes) {
  auto const* b = static_cast<unsigned char const*>(p);
  for (std::size_t i = 0; i < bytes; ++i)
    if (b[i] != canary) return false;
  return true;
}

// The pools a step (ragged or decode) wrote into `out`, checked against the
// per-request pools the reference expects (each with its value and scale).
struct RefPool {
  std::int32_t request, id;
  double const* value;
  double const* scale;
};

void expect_step_output(Out const& out, int B, int D, std::vector<RefPool> const& want,
                        char const* entry) {
  auto const& offsets = out.offsets();
  std::uint32_t const count = offsets(B);
  if (count != want.size())
    defect(std::string(entry) + ": count " + std::to_string(count) + ", the reference has " +
           std::to_string(want.size()) + " pools");
  if (offsets(0) != 0) defect(std::string(entry) + ": offsets(0) is not 0");
  std::size_t o = 0;
  for (int r = 0; r < B; ++r) {
    std::size_t n = 0;
    while (o + n < want.size() && want[o + n].request == r) ++n;
    if (offsets(r + 1) - offsets(r) != n || offsets(r) != o)
      defect(std::string(entry) + ": request " + std::to_string(r) + " has rows [" +
             std::to_string(offsets(r)) + ", " + std::to_string(offsets(r + 1)) +
             "), the reference " + std::to_string(n) + " pools from " + std::to_string(o));
    o += n;
  }
  for (std::size_t i = 0; i < want.size(); ++i) {
    std::string const at = std::string(entry) + ": row " + std::to_string(i);
    if (out.batch_row()(i) != want[i].request || out.pool_id()(i) != want[i].id)
      defect(at + " is request " + std::to_string(out.batch_row()(i)) + " pool " +
             std::to_string(out.pool_id()(i)) + ", the reference has request " +
             std::to_string(want[i].request) + " pool " + std::to_string(want[i].id));
    expect_pool(&out.pooled()(i, 0), 1, want[i].value, want[i].scale, D, at);
  }
}

// A pool cache whose construction every cache-taking call shares: its
// blocks and block_pools from the input, then the cache for pools of K.
struct CacheSize {
  int blocks, block_pools;
};

CacheSize cache_size(Bytes& in) {
  int const blocks = 1 + in.pick(4);
  return {blocks, 1 + in.pick(4)};
}

template <class C>
KPool::PoolCache<C, M> make_cache(CacheSize z, int D, int K, bool rotate, bool pow2) {
  constexpr bool fp8 = std::is_same<C, KPool::float8_e4m3>::value;
  return KPool::PoolCache<C, M>(E(), z.blocks, z.block_pools, D, K,
                                fp8 ? (pow2 ? KPool::CacheScale::pow2 : KPool::CacheScale::amax)
                                    : KPool::CacheScale::none,
                                rotate);
}

template <class C>
KPool::PoolCache<C, M> make_cache(Bytes& in, int D, int K, bool rotate, bool pow2) {
  return make_cache<C>(cache_size(in), D, K, rotate, pow2);
}

template <class C>
void watch_cache(Arena& a, KPool::PoolCache<C, M> const& cache) {
  a.watch(cache.values());
  a.watch(cache.scales());
}

void watch_output(Arena& a, Out const& out) {
  a.watch(out.pooled());
  a.watch(out.batch_row());
  a.watch(out.pool_id());
  a.watch(out.offsets());
}

I2 block_table(Bytes& in, Arena& a, int rows) {
  int const width = in.pick(5);
  I2 t = a.input<I2>(rows, width);
  for (std::size_t i = 0; i < t.span(); ++i) t.data()[i] = in.i32();
  return t;
}

enum Entry {
  step_fused,
  step_unfused,
  step_decode,
  ring_close,
  seed_tail,
  tail_update,
  compress,
  expand_topk,
  store_pools,
  score_select,
  select_tokens,
  num_entries
};

char const* const entry_names[num_entries] = {
    "KPool::step (fused)", "KPool::step (unfused)", "KPool::step (decode)",
    "KPool::ring_close",   "KPool::seed_tail",      "KPool::tail_update",
    "KPool::compress",     "KPool::expand_topk",    "KPool::store_pools",
    "KPool::score_select", "KPool::select_tokens"};

// One decoded call. `call` runs it (it may throw KPool::InvalidArgument);
// `check` compares its result with the reference after it returned with
// validation on.
struct Call {
  std::function<void()> call;
  std::function<void()> check;
};

struct Setup {
  Bytes& in;
  Arena& a;
  Values vals;
  KPool::Options opts;
  KPool::ScoreEngine engine;  // the selections' workspace's
  bool structured, use_cache, fp8, rotate, pow2, tail_always;
  int K, D, R, slots, B, num_requests;
};

// The step, ragged and decode: a Ring and a StepOutput (library allocations,
// watched), optionally a pool cache and its block table.
template <class C>
Call steps(Setup& s, Entry e) {
  auto ring = std::make_shared<Ring>(E(), s.slots, s.K, s.D, s.R);
  s.a.watch(ring->tail());
  for (std::size_t i = 0; i < ring->tail().span(); ++i) ring->tail().data()[i] = s.vals.next();
  std::size_t const capacity = s.in.pick(24);
  auto out = std::make_shared<Out>(E(), capacity, std::max(1, s.B + s.in.pick(3) - 1), s.D);
  watch_output(s.a, *out);
  F2 ape = s.a.input<F2>(s.K, s.D);
  fill(ape, s.vals);
  auto cache = std::make_shared<KPool::PoolCache<C, M>>();
  I2 table;
  if (s.use_cache) {
    *cache = make_cache<C>(s.in, s.D, s.K, s.rotate, s.pow2);
    watch_cache(s.a, *cache);
    table = block_table(s.in, s.a, s.B + s.in.pick(2));
  }
  KPool::Options opts = s.opts;
  int const D = s.D, K = s.K, B = s.B, nr = s.num_requests;
  bool const use_cache = s.use_cache;
  if (e == step_decode) {
    int const N = 1 + s.in.pick(4);
    V3 key = s.a.input<V3>(B, N, D), gate = s.a.input<V3>(B, N, D);
    fill(key, s.vals);
    fill(gate, s.vals);
    I2 positions = s.a.input<I2>(B, N);
    U32 slot_idx = s.a.input<U32>(B);
    for (int r = 0; r < B; ++r) {
      slot_idx(r) = s.structured ? s.in.pick(s.slots + 1) : s.in.u32();
      std::int32_t p = s.structured ? s.in.pick(20) : s.in.i32();
      for (int i = 0; i < N; ++i) positions(r, i) = s.structured ? p++ : s.in.i32();
    }
    poke(s.in, positions, slot_idx);
    auto const ring0 = std::make_shared<KPoolRef::Ring>(ref_ring(ring->tail(), K));
    return {[=] {
              auto const batch = KPool::decode_batch(positions, slot_idx, nr);
              if (use_cache)
                KPool::step(E(), *ring, key, gate, ape, batch, KPool::paged(*cache, table), *out,
                            opts);
              else
                KPool::step(E(), *ring, key, gate, ape, batch, *out, opts);
            },
            [=] {
              std::vector<std::int32_t> pos(positions.data(), positions.data() + B * N);
              std::vector<std::uint32_t> slots(slot_idx.data(), slot_idx.data() + B);
              KPoolRef::Ring rr = *ring0;
              auto const ref = KPoolRef::tail_update(N, ref_matrix(key), ref_matrix(gate),
                                                     ref_matrix(ape), pos, slots, nr, rr);
              std::vector<RefPool> want;
              for (int r = 0; r < nr; ++r)
                for (int j = 0; j < ref.M; ++j) {
                  std::size_t const o = std::size_t(r) * ref.M + j;
                  if (ref.closed_pool[o] >= 0)
                    want.push_back({r, ref.closed_pool[o], ref.pooled.data() + o * D,
                                    ref.scale.data() + o * D});
                }
              expect_step_output(*out, B, D, want, "KPool::step (decode)");
              expect_ring(ring->tail(), rr, "KPool::step (decode)");
            }};
  }
  Ragged rg = ragged(s.in, s.a, B, s.structured, s.slots);
  V2 key = s.a.input<V2>(rg.key_rows, D), gate = s.a.input<V2>(rg.key_rows, D);
  fill(key, s.vals);
  fill(gate, s.vals);
  poke(s.in, rg.row_offsets, rg.cache_lengths, rg.slot_idx);
  opts.fused = e == step_fused;
  auto const ring0 = std::make_shared<KPoolRef::Ring>(ref_ring(ring->tail(), K));
  return {[=] {
            auto const batch =
                KPool::ragged_batch(rg.row_offsets, rg.cache_lengths, rg.slot_idx, nr);
            if (use_cache)
              KPool::step(E(), *ring, key, gate, ape, batch, KPool::paged(*cache, table), *out,
                          opts);
            else
              KPool::step(E(), *ring, key, gate, ape, batch, *out, opts);
          },
          [=] {
            KPoolRef::Batch const b = ref_batch(rg, B, nr);
            RefMatrix const k = ref_matrix(key), g = ref_matrix(gate), ap = ref_matrix(ape);
            auto const closed = KPoolRef::ring_close(k, g, ap, b, *ring0);
            auto const pools = KPoolRef::compress(k, g, ap, b);
            std::vector<RefPool> want;
            for (int r = 0; r < nr; ++r) {
              if (closed.closed_pool[r] >= 0)
                want.push_back({r, closed.closed_pool[r], closed.pooled.row(r),
                                closed.scale.row(r)});
              for (std::uint32_t o = pools.pool_row_offsets[r]; o < pools.pool_row_offsets[r + 1];
                   ++o)
                want.push_back({r, static_cast<std::int32_t>(pools.pool_id[o]),
                                pools.pooled.row(int(o)), pools.scale.row(int(o))});
            }
            expect_step_output(*out, B, D, want, "KPool::step");
            KPoolRef::Ring rr = *ring0;
            KPoolRef::seed_tail(k, g, b, rr);
            expect_ring(ring->tail(), rr, "KPool::step");
          }};
}

// The writers' ring forms on a Ring (a library allocation, watched) of
// [slots, 2, R, D] whose every slot holds every position (start 0,
// L = 2^31 - 1, H = 1: docs/ring.md), so that any start continues it.
Call writers(Setup& s, Entry e) {
  int const D = s.D, K = s.K, B = s.B, nr = s.num_requests;
  KPool::Options const opts = s.opts;
  auto ring = std::make_shared<Ring>(E(), s.slots, K, D, s.R);
  V4 tail = ring->tail();
  s.a.watch(tail);
  fill(tail, s.vals);
  for (int i = 0; i < s.slots; ++i) {
    ring->state()(i, 0) = 0;
    ring->state()(i, 1) = 0x7FFFFFFFu;
    ring->state()(i, 2) = 1;
  }
  F2 ape = s.a.input<F2>(K, D);
  fill(ape, s.vals);
  auto const ring0 = std::make_shared<KPoolRef::Ring>(ref_ring(tail, K));
  if (e == tail_update) {
    int const N = 1 + s.in.pick(4);
    V3 key = s.a.input<V3>(B, N, D), gate = s.a.input<V3>(B, N, D);
    fill(key, s.vals);
    fill(gate, s.vals);
    I2 positions = s.a.input<I2>(B, N);
    U32 slot_idx = s.a.input<U32>(B);
    for (int r = 0; r < B; ++r) {
      slot_idx(r) = s.structured ? s.in.pick(s.slots + 1) : s.in.u32();
      std::int32_t p = s.structured ? s.in.pick(20) : s.in.i32();
      for (int i = 0; i < N; ++i) positions(r, i) = s.structured ? p++ : s.in.i32();
    }
    poke(s.in, positions, slot_idx);
    int const Mp = (N + K - 1) / K + s.in.pick(2);
    V3 pooled = s.a.output<V3>(B, Mp, D);
    I2 closed = s.a.output<I2>(B, Mp);
    return {[=] {
              KPool::tail_update(E(), *ring, key, gate, ape,
                                 KPool::decode_batch(positions, slot_idx, nr), pooled, closed,
                                 opts);
            },
            [=] {
              std::vector<std::int32_t> pos(positions.data(), positions.data() + B * N);
              std::vector<std::uint32_t> slots(slot_idx.data(), slot_idx.data() + B);
              KPoolRef::Ring rr = *ring0;
              auto const ref = KPoolRef::tail_update(N, ref_matrix(key), ref_matrix(gate),
                                                     ref_matrix(ape), pos, slots, nr, rr);
              expect_ring(tail, rr, "KPool::tail_update");
              for (int r = 0; r < B; ++r)
                for (int j = 0; j < ref.M; ++j) {
                  std::size_t const o = std::size_t(r) * ref.M + j;
                  std::string const at = "KPool::tail_update: request " + std::to_string(r) +
                                         " pool " + std::to_string(j);
                  if (r >= nr) {
                    if (!untouched(&closed(r, j), sizeof(std::int32_t)) ||
                        !untouched(&pooled(r, j, 0), D * sizeof(T)))
                      defect(at + " is past num_requests but was written");
                    continue;
                  }
                  if (closed(r, j) != ref.closed_pool[o])
                    defect(at + ": closed_pool " + std::to_string(closed(r, j)) +
                           ", the reference has " + std::to_string(ref.closed_pool[o]));
                  if (ref.closed_pool[o] >= 0)
                    expect_pool(&pooled(r, j, 0), 1, ref.pooled.data() + o * D,
                                ref.scale.data() + o * D, D, at);
                }
            }};
  }
  Ragged rg = ragged(s.in, s.a, B, s.structured, s.slots);
  V2 key = s.a.input<V2>(rg.key_rows, D), gate = s.a.input<V2>(rg.key_rows, D);
  fill(key, s.vals);
  fill(gate, s.vals);
  poke(s.in, rg.row_offsets, rg.cache_lengths, rg.slot_idx);
  if (e == seed_tail)
    return {[=] {
              KPool::seed_tail(
                  E(), *ring, key, gate,
                  KPool::ragged_batch(rg.row_offsets, rg.cache_lengths, rg.slot_idx, nr), opts);
            },
            [=] {
              KPoolRef::Ring rr = *ring0;
              KPoolRef::seed_tail(ref_matrix(key), ref_matrix(gate), ref_batch(rg, B, nr), rr);
              expect_ring(tail, rr, "KPool::seed_tail");
            }};
  int const rows = std::max(0, B + s.in.pick(3) - 1);
  V2 pooled = s.a.output<V2>(rows, D);
  I1 closed = s.a.output<I1>(rows);
  return {[=] {
            KPool::ring_close(
                E(), *ring, key, gate, ape,
                KPool::ragged_batch(rg.row_offsets, rg.cache_lengths, rg.slot_idx, nr), pooled,
                closed, opts);
          },
          [=] {
            auto const ref = KPoolRef::ring_close(ref_matrix(key), ref_matrix(gate),
                                                  ref_matrix(ape), ref_batch(rg, B, nr), *ring0);
            expect_ring(tail, *ring0, "KPool::ring_close");
            for (int r = 0; r < B; ++r) {
              std::string const at = "KPool::ring_close: request " + std::to_string(r);
              if (r >= nr) {
                if (!untouched(&closed(r), sizeof(std::int32_t)))
                  defect(at + " is past num_requests but was written");
                continue;
              }
              if (closed(r) != ref.closed_pool[r])
                defect(at + ": closed_pool " + std::to_string(closed(r)) +
                       ", the reference has " + std::to_string(ref.closed_pool[r]));
              if (ref.closed_pool[r] >= 0)
                expect_pool(&pooled(r, 0), 1, ref.pooled.row(r), ref.scale.row(r), D, at);
            }
          }};
}

Call compress_call(Setup& s) {
  int const D = s.D, K = s.K, B = s.B, nr = s.num_requests;
  KPool::Options const opts = s.opts;
  F2 ape = s.a.input<F2>(K, D);
  fill(ape, s.vals);
  Ragged rg = ragged(s.in, s.a, B, s.structured, s.slots);
  V2 key = s.a.input<V2>(rg.key_rows, D), gate = s.a.input<V2>(rg.key_rows, D);
  fill(key, s.vals);
  fill(gate, s.vals);
  poke(s.in, rg.row_offsets, rg.cache_lengths);
  U32 offsets = s.a.output<U32>(std::max(0, B + s.in.pick(3) - 1 + 1));
  V2 pooled = s.a.output<V2>(s.in.pick(12), D);
  return {[=] {
            KPool::compress(E(), key, gate, ape,
                            KPool::ragged_batch(rg.row_offsets, rg.cache_lengths, nr), offsets,
                            pooled, opts);
          },
          [=] {
            auto const ref = KPoolRef::compress(ref_matrix(key), ref_matrix(gate),
                                                ref_matrix(ape), ref_batch(rg, B, nr));
            for (int r = 0; r <= B; ++r)
              if (offsets(r) != ref.pool_row_offsets[r])
                defect("KPool::compress: pool_row_offsets(" + std::to_string(r) + ") is " +
                       std::to_string(offsets(r)) + ", the reference has " +
                       std::to_string(ref.pool_row_offsets[r]));
            for (int o = 0; o < ref.pooled.rows; ++o)
              expect_pool(&pooled(o, 0), 1, ref.pooled.row(o), ref.scale.row(o), D,
                          "KPool::compress: pool row " + std::to_string(o));
          }};
}

Call expand_call(Setup& s) {
  int const K = s.K, B = s.B, nr = s.num_requests;
  bool const tail_always = s.tail_always;
  KPool::Options const opts = s.opts;
  Ragged rg = ragged(s.in, s.a, B, s.structured, s.slots);
  // K is the cache's the ids come from: any value; one below 1 is a cache
  // built without K (kpool() 0).
  int const kpool = s.structured ? K : s.in.i32();
  auto const k_cache = std::make_shared<KPool::PoolCache<float, M>>();
  if (kpool >= 1) *k_cache = KPool::PoolCache<float, M>(E(), 1, 1, 1, kpool);
  int const topk = s.in.pick(4);
  I2 pool_ids = s.a.input<I2>(rg.key_rows, topk);
  for (std::size_t i = 0; i < pool_ids.span(); ++i) pool_ids.data()[i] = s.in.i32();
  poke(s.in, rg.row_offsets, rg.cache_lengths, pool_ids);
  int const width = std::max(
      0, KPool::expand_topk_width(topk, std::max(1, std::min(kpool, 64)), tail_always) +
             s.in.pick(3) - 1);
  I2 out = s.a.output<I2>(rg.key_rows + s.in.pick(2), width);
  return {[=] {
            KPool::expand_topk(E(), pool_ids, tail_always,
                               KPool::ragged_batch(rg.row_offsets, rg.cache_lengths, nr), *k_cache,
                               out, opts);
          },
          [=] {
            std::vector<std::int32_t> ids(pool_ids.data(), pool_ids.data() + pool_ids.span());
            std::vector<std::int32_t> ref;
            KPoolRef::expand_topk(kpool, ids, topk, ref_batch(rg, B, nr), tail_always, ref);
            int const w = KPoolRef::expand_width(kpool, topk, tail_always);
            std::uint32_t const live = rg.row_offsets(nr);
            for (std::size_t t = 0; t < out.extent(0); ++t)
              for (int j = 0; j < w; ++j) {
                std::string const at = "KPool::expand_topk: out(" + std::to_string(t) + ", " +
                                       std::to_string(j) + ")";
                if (t >= live) {
                  if (!untouched(&out(t, j), sizeof(std::int32_t)))
                    defect(at + " is past the live requests' rows but was written");
                  continue;
                }
                if (out(t, j) != ref[t * w + j])
                  defect(at + " is " + std::to_string(out(t, j)) + ", the reference has " +
                         std::to_string(ref[t * w + j]));
              }
          }};
}

template <class C>
Call store_call(Setup& s) {
  std::size_t const capacity = s.in.pick(8);
  int const max_batch = 1 + s.in.pick(4);
  auto out = std::make_shared<Out>(E(), capacity, max_batch, s.D);
  // A step's output as a caller could leave it: every field arbitrary.
  for (std::size_t i = 0; i < out->offsets().span(); ++i) out->offsets()(i) = s.in.u32();
  for (std::size_t i = 0; i < capacity; ++i) {
    out->batch_row()(i) = s.in.i32();
    out->pool_id()(i) = s.in.i32();
    for (int c = 0; c < s.D; ++c) out->pooled()(i, c) = s.vals.next();
  }
  int const count_at = s.in.pick(max_batch + 1);
  out->begin_call(count_at);
  auto cache = std::make_shared<KPool::PoolCache<C, M>>(
      make_cache<C>(s.in, s.D, s.K, s.rotate, s.pow2));
  watch_cache(s.a, *cache);
  // Around num_requests rows (the harness's own allocation stays small).
  int const table_rows = s.num_requests >= 0 && s.num_requests <= 8
                             ? std::max(0, s.num_requests + s.in.pick(3) - 1)
                             : s.in.pick(8);
  I2 table = block_table(s.in, s.a, table_rows);
  int const nr = s.num_requests;
  KPool::Options const opts = s.opts;
  // The batch: only its num_requests is read.
  return {[=] {
            KPool::store_pools(E(), *out, KPool::ragged_batch(U32(), U32(), nr),
                               KPool::paged(*cache, table), opts);
          },
          [] {}};
}

template <class C>
Call select_call(Setup& s, Entry e) {
  int const D = s.D, B = s.B, nr = s.num_requests;
  int const H = 1 + s.in.pick(3);
  Ragged rg = ragged(s.in, s.a, B, s.structured, s.slots);
  CacheSize const size = cache_size(s.in);
  I2 table = block_table(s.in, s.a, B + s.in.pick(2));
  // K is the cache's: any value (the cache refuses one below 1).
  int const kpool = s.structured ? s.K : s.in.i32();
  auto cache = std::make_shared<KPool::PoolCache<C, M>>(
      make_cache<C>(size, D, kpool, s.rotate, s.pow2));
  for (std::size_t i = 0; i < cache->values().span(); ++i)
    cache->values().data()[i] = static_cast<C>(s.vals.next());
  int const topk = s.structured ? 1 + s.in.pick(6) : s.in.i32();
  std::size_t const rows = rg.key_rows;
  auto q = s.a.input<V3>(rows, H, D + s.in.pick(2) * (s.structured ? 0 : 1));
  fill(q, s.vals);
  F2 weights = s.a.input<F2>(rows, H);
  fill(weights, s.vals);
  poke(s.in, rg.row_offsets, rg.cache_lengths, table);
  int const width0 = e == select_tokens
                         ? KPool::select_tokens_width(std::max(0, std::min(topk, 64)),
                                                      std::max(1, std::min(kpool, 64)))
                         : std::max(0, std::min(topk, 64));
  I2 ids = s.a.output<I2>(rows + s.in.pick(2), std::max(0, width0 + s.in.pick(3) - 1));
  auto ws = std::make_shared<KPool::SelectWorkspace<T, M>>(E(), 1 + s.in.pick(40),
                                                           1 + s.in.pick(64), H, D, s.engine);
  KPool::Options const opts = s.opts;
  return {[=] {
            auto const batch = KPool::ragged_batch(rg.row_offsets, rg.cache_lengths, nr);
            if (e == select_tokens)
              KPool::select_tokens(E(), q, weights, topk, batch, KPool::paged(*cache, table), ids,
                                   *ws, opts);
            else
              KPool::score_select(E(), q, weights, topk, batch, KPool::paged(*cache, table), ids,
                                  *ws, opts);
          },
          [] {}};
}

// The call the rest of the input describes.
Call decode_call(Setup& s, Entry e) {
  Call c;
  switch (e) {
    case step_fused:
    case step_unfused:
    case step_decode:
      c = s.fp8 ? steps<KPool::float8_e4m3>(s, e) : steps<T>(s, e);
      break;
    case ring_close:
    case seed_tail:
    case tail_update: c = writers(s, e); break;
    case compress: c = compress_call(s); break;
    case expand_topk: c = expand_call(s); break;
    case store_pools:
      c = s.fp8 ? store_call<KPool::float8_e4m3>(s) : store_call<T>(s);
      break;
    case score_select:
    case select_tokens:
      c = s.fp8 ? select_call<KPool::float8_e4m3>(s, e) : select_call<T>(s, e);
      break;
    case num_entries: return Call();
  }

  return c;
}

bool run(std::uint8_t const* data, std::size_t size) {
  Bytes in(data, size);
  Arena a;
  Entry const e = static_cast<Entry>(in.pick(num_entries));
  std::uint8_t const flags = in.u8();
  int const Ks[] = {1, 2, 3, 4, 8};
  int const Ds[] = {1, 2, 3, 5, 8, 16, 128, 4};
  Setup s{in, a, Values(0), KPool::Options(), KPool::ScoreEngine::automatic,
          false, false, false, false, false, false, 0, 0, 0, 0, 0, 0};
  s.opts.validate = flags & 1;
  s.structured = flags & 2;
  s.use_cache = flags & 4;
  s.fp8 = flags & 8;
  s.rotate = flags & 16;
  s.pow2 = flags & 32;
  s.tail_always = flags & 64;
  KPool::ScoreEngine const engines[] = {KPool::ScoreEngine::automatic,
                                        KPool::ScoreEngine::register_tiles,
                                        KPool::ScoreEngine::team_gemm, KPool::ScoreEngine::blas};
  s.engine = engines[(flags >> 6) & 3];
  s.K = Ks[in.pick(5)];
  s.D = Ds[in.pick(8)];
  s.R = s.K * (1 + in.pick(3));
  s.slots = 1 + in.pick(4);
  s.B = in.pick(5);
  if (s.structured) {
    s.num_requests = in.pick(s.B + 2);
    if (in.u8() == 0xFF) s.num_requests = -1;
  } else {
    s.num_requests = in.i32();
  }
  s.vals = Values(in.u8());

  // The constructors (Ring, StepOutput, PoolCache, SelectWorkspace) refuse
  // what they cannot hold, before any call.
  Call c;
  try {
    c = decode_call(s, e);
  } catch (KPool::InvalidArgument const&) {
    return true;
  }
  if (!c.call) return false;

  std::vector<unsigned char> const before = a.snapshot();
  try {
    c.call();
    E().fence();
  } catch (KPool::InvalidArgument const& x) {
    E().fence();
    if (a.snapshot() != before)
      defect(std::string(entry_names[e]) + " threw '" + x.what() +
             "' but wrote into its outputs, ring or cache");
    return true;
  }
  if (s.opts.validate) {
    try {
      c.check();
    } catch (std::invalid_argument const& x) {
      // The reference refuses what KPool accepted.
      defect(std::string(entry_names[e]) + " accepted a call its reference refuses: " +
             x.what());
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("OMP_NUM_THREADS", "1", 0);
  setenv("OMP_PROC_BIND", "false", 0);
  Kokkos::initialize();
  std::atexit([] { Kokkos::finalize(); });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  return run(data, size) ? 0 : -1;
}
