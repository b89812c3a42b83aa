// The pool cache (docs/indexer.md, "The pool cache"): store_pools writes exactly
// the bytes of the independent reference KPoolCacheReference.hpp (values
// and scales, memcmp), load_pools returns s * value (rotated back on
// request), a cache filled step by step is byte-identical to one filled
// from a one-shot prefill of the same sequences, and a cached step writes
// the same bytes by either path (in the step, or a second launch over its
// output rows).

#include <KPoolCacheTestUtils.hpp>

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>

namespace {

using namespace KPoolTest;
using namespace KPoolCacheTest;
using KPoolCacheRef::CacheKind;

template <class C>
class PoolCacheTest : public ::testing::Test {};
TYPED_TEST_SUITE(PoolCacheTest, Configs, ConfigName);

KPoolCacheRef::Scale ref_scale(KPool::CacheScale s) {
  return s == KPool::CacheScale::none   ? KPoolCacheRef::Scale::none
         : s == KPool::CacheScale::amax ? KPoolCacheRef::Scale::amax
                                        : KPoolCacheRef::Scale::pow2;
}

// The cache kinds docs/indexer.md defines for storage type t and head_dim D:
// native, fp8 amax and fp8 pow2 (not for f64), each rotated (D a power of
// two) or not.
struct Kind {
  bool fp8;
  KPool::CacheScale scale;
  bool rotate;
  bool serving = false;  // the serving profile (fp8, pow2)
  bool fused = false;    // in the engines' fused byte layout (serving only)
};

std::vector<Kind> kinds(DType t, int D) {
  std::vector<Kind> v;
  bool const pow2 = (D & (D - 1)) == 0;
  for (bool rotate : {false, true}) {
    if (rotate && !pow2) continue;
    v.push_back({false, KPool::CacheScale::none, rotate});
    if (t == DType::f64) continue;
    v.push_back({true, KPool::CacheScale::amax, rotate});
    v.push_back({true, KPool::CacheScale::pow2, rotate});
    v.push_back({true, KPool::CacheScale::pow2, rotate, true});
    if (D % 4 == 0) v.push_back({true, KPool::CacheScale::pow2, rotate, true, true});
  }
  return v;
}

std::string name(Kind const& k) {
  return std::string(k.fp8 ? "fp8 " : "native ") + KPool::cache_scale_name(k.scale) +
         (k.rotate ? " rotated" : "") + (k.serving ? " serving" : "") +
         (k.fused ? " fused" : "");
}

CacheKind ref_kind(DType t, Kind const& k) {
  return CacheKind{t, k.fp8, ref_scale(k.scale), k.rotate, k.serving};
}

// K of the caches the store_pools tests build from pools they make
// themselves: store_pools reads no K.
constexpr int kStoreK = 4;

// store_pools' batch of n live rows (only its num_requests is read).
template <class M>
KPool::Batch<M> live_rows(int n) {
  using U32 = Kokkos::View<std::uint32_t*, M>;
  return KPool::ragged_batch(U32("row_offsets", n + 1), U32("cache_lengths", n), n);
}

// An fp8 cache of kind k: split (allocated by the cache) or fused (over a
// zeroed byte buffer of its own).
template <class E, class M>
KPool::PoolCache<KPool::float8_e4m3, M> fp8_cache(Kind const& k, int num_blocks,
                                                 int block_pools, int D, int K) {
  if (k.fused) {
    typename KPool::PoolCache<KPool::float8_e4m3, M>::bytes_type bytes(
        "fused", num_blocks, static_cast<std::size_t>(block_pools) * (D + 4));
    return KPool::PoolCache<KPool::float8_e4m3, M>(bytes, block_pools, D, K, k.rotate);
  }
  return KPool::PoolCache<KPool::float8_e4m3, M>(
      E(), num_blocks, block_pools, D, K, k.scale, k.rotate,
      k.serving ? KPool::CacheProfile::serving : KPool::CacheProfile::exact);
}

// A pooled row of D values, representable in t, of one of several shapes:
// ordinary values, all zeros (signed), a NaN and infinities among ordinary
// values, values near the type's top, values near its bottom (subnormals),
// and a row whose f32 amax / 448 underflows to zero.
std::vector<double> pool_values(Rng& rng, DType t, int D, int shape) {
  std::vector<double> v(D);
  double big = t == DType::f16 ? 6.0e4 : t == DType::f64 ? 1e300 : 3.0e38;
  double tiny = t == DType::f16 ? 1e-7 : t == DType::f64 ? 1e-310 : 1e-40;
  for (int c = 0; c < D; ++c) {
    double x = rng.uniform(-3, 3);
    switch (shape) {
      case 1: x = (c % 3 == 0) ? -0.0 : 0.0; break;
      case 2:
        if (c == D / 2) x = std::numeric_limits<double>::quiet_NaN();
        if (c == D / 3 && D > 2) x = std::numeric_limits<double>::infinity();
        if (c == D / 5 && D > 4) x = -std::numeric_limits<double>::infinity();
        break;
      case 3: x = rng.uniform(-big, big); break;
      case 4: x = rng.uniform(-tiny, tiny); break;
      case 5: x = (c % 2 ? -1.0 : 1.0) * 1e-44 * (1 + rng.below(4)); break;
      case 6: x = rng.uniform(-1, 1) * std::ldexp(1.0, rng.below(40) - 20); break;
      case 7:
        // Next to the type's largest finite values: in f32 some round to
        // a bf16 infinity (the serving profile then saturates them).
        if (c % 4 == 1)
          x = (c % 8 == 1 ? 1 : -1) *
              (t == DType::f16 ? 65504.0 : t == DType::f64 ? 1.7e308
                                                           : 3.4e38 - rng.uniform(0, 1e36));
        break;
      default: break;
    }
    v[c] = KPoolRef::round_to(t, x);
  }
  return v;
}

template <class O>
double out_value(O x) {
  return to_double(x);
}

// load_pools against the reference's dequantization of the expected
// entries, in both domains, into float and (native caches) the storage
// type.
template <class O, class E, class C, class M, class Table>
void check_load(KPool::PoolCache<C, M> const& cache, Table const& table, Blocks const& b,
                CacheKind const& rk, ExpectedCache const& want, int D, KPool::Options o) {
  int const max_pools = b.max_blocks * b.block_pools;
  // Every row's pools [0, max_pools): a ragged batch at max_pools * K.
  Kokkos::View<std::uint32_t*, M> row_offsets("row_offsets", b.B + 1),
      cache_lengths("cache_lengths", b.B);
  Kokkos::deep_copy(cache_lengths, static_cast<std::uint32_t>(max_pools * cache.kpool()));
  auto const batch = KPool::ragged_batch(row_offsets, cache_lengths, b.B);
  std::size_t const elem = KPoolCacheRef::element_size(rk);
  for (auto domain : {KPool::PoolDomain::cached, KPool::PoolDomain::original}) {
    SCOPED_TRACE(domain == KPool::PoolDomain::cached ? "cached domain" : "original domain");
    Kokkos::View<O***, Kokkos::LayoutRight, M> out("out", b.B, max_pools + 1, D);
    Kokkos::deep_copy(out, to_storage<O>(-7.0));
    KPool::load_pools(E(), batch, KPool::paged(cache, table), out, domain, o);
    auto const h = on_host(out);
    for (int r = 0; r < b.B; ++r)
      for (int p = 0; p <= max_pools; ++p) {
        if (p == max_pools) {  // past the row's pools: untouched
          for (int c = 0; c < D; ++c) ASSERT_EQ(out_value(h(r, p, c)), -7.0);
          continue;
        }
        std::size_t const slot =
            static_cast<std::size_t>(b.at(r, p / b.block_pools)) * b.block_pools +
            p % b.block_pools;
        KPoolCacheRef::Entry e;
        e.bytes.assign(want.values.begin() + slot * D * elem,
                       want.values.begin() + (slot + 1) * D * elem);
        std::memcpy(&e.scale, want.scales.data() + slot * sizeof(float), sizeof(float));
        auto const ref = KPoolCacheRef::dequantize(rk, e, D, domain == KPool::PoolDomain::original);
        for (int c = 0; c < D; ++c) {
          double const g = out_value(h(r, p, c));
          double const w = out_value(to_storage<O>(ref[c]));
          if (std::isnan(w))
            ASSERT_TRUE(std::isnan(g)) << "row " << r << " pool " << p << " channel " << c;
          else
            ASSERT_EQ(g, w) << "row " << r << " pool " << p << " channel " << c;
        }
      }
  }
}

// store_pools writes exactly the reference's Q(R(x)) bytes (values and
// scales) at each pool's block and entry and nothing anywhere else, with
// validation on (count read on the host) and off (count read on the
// device, a launch over the whole capacity); load_pools reads them back.
TYPED_TEST(PoolCacheTest, StorePoolsWritesTheReferenceBytes) {
  using T = typename TypeParam::value_type;
  using E = typename TypeParam::execution_space;
  using M = typename TypeParam::memory_space;
  constexpr DType t = TypeParam::dtype;
  Rng rng(4242 + static_cast<int>(t));
  for (int D : {1, 7, 64, 128}) {
    SCOPED_TRACE("D=" + std::to_string(D));
    Blocks const b = make_blocks(rng, 5, 3, 3);
    auto const table = table_view<M>(b);
    // Pools of rows 0..3 of a batch of 5 (row 4 has none), ids in random
    // order, each shape of pool_values several times.
    std::vector<int> batch_row, pool_id;
    std::vector<std::vector<double>> pools;
    for (int r = 0; r < 4; ++r) {
      std::vector<int> ids(b.max_blocks * b.block_pools);
      std::iota(ids.begin(), ids.end(), 0);
      for (int i = static_cast<int>(ids.size()) - 1; i > 0; --i)
        std::swap(ids[i], ids[rng.below(i + 1)]);
      for (int j = 0; j < 7; ++j) {
        batch_row.push_back(r);
        pool_id.push_back(ids[j]);
        pools.push_back(pool_values(rng, t, D, static_cast<int>(pools.size()) % 8));
      }
    }
    KPool::StepOutput<T, M> out(E(), pools.size() + 9, 6, D);
    fill_output(out, 5, batch_row, pool_id, pools);
    for (Kind const& k : kinds(t, D)) {
      SCOPED_TRACE(name(k));
      CacheKind const rk = ref_kind(t, k);
      ExpectedCache want(b, D, KPoolCacheRef::element_size(rk));
      for (std::size_t o = 0; o < pools.size(); ++o)
        want.put(b, batch_row[o], pool_id[o], KPoolCacheRef::quantize(rk, pools[o]));
      for (bool validate : {true, false}) {
        SCOPED_TRACE(validate ? "validated" : "not validated");
        KPool::Options o = test_options<E>();
        o.validate = validate;
        auto run = [&](auto cache) {
          KPool::store_pools(E(), out, live_rows<M>(4), KPool::paged(cache, table), o);
          ASSERT_TRUE(same_bytes(value_bytes(cache), want.values, rk.fp8 ? 1 : sizeof(T), "values"));
          ASSERT_TRUE(same_bytes(scale_bytes(cache), want.scales, 4, "scales"));
          if (validate) {
            check_load<float, E>(cache, table, b, rk, want, D, o);
            if constexpr (!std::is_same<typename decltype(cache)::value_type,
                                        KPool::float8_e4m3>::value)
              check_load<T, E>(cache, table, b, rk, want, D, o);
          }
        };
        if (k.fp8) {
          if constexpr (!std::is_same<T, double>::value)
            run(fp8_cache<E, M>(k, b.num_blocks, b.block_pools, D, kStoreK));
        } else {
          run(KPool::PoolCache<T, M>(E(), b.num_blocks, b.block_pools, D, kStoreK, k.scale, k.rotate));
        }
      }
    }
  }
}

// A pool re-stored (a rewind re-emits it) overwrites its entry; other
// entries keep their bytes.
TYPED_TEST(PoolCacheTest, StoringAPoolAgainOverwritesItsEntry) {
  using T = typename TypeParam::value_type;
  using E = typename TypeParam::execution_space;
  using M = typename TypeParam::memory_space;
  constexpr DType t = TypeParam::dtype;
  Rng rng(77);
  int const D = 64;
  Blocks const b = make_blocks(rng, 2, 2, 4);
  auto const table = table_view<M>(b);
  using C = std::conditional_t<std::is_same<T, double>::value, T, KPool::float8_e4m3>;
  Kind const k{!std::is_same<T, double>::value,
               std::is_same<T, double>::value ? KPool::CacheScale::none : KPool::CacheScale::pow2,
               true};
  CacheKind const rk = ref_kind(t, k);
  KPool::PoolCache<C, M> cache(E(), b.num_blocks, b.block_pools, D, kStoreK, k.scale, k.rotate);
  KPool::StepOutput<T, M> out(E(), 8, 2, D);
  ExpectedCache want(b, D, KPoolCacheRef::element_size(rk));
  for (int round = 0; round < 2; ++round) {
    std::vector<std::vector<double>> pools;
    std::vector<int> rows, ids;
    for (int j = 0; j < (round == 0 ? 6 : 2); ++j) {
      rows.push_back(j % 2);
      ids.push_back(round == 0 ? j : 2 + j);  // round 1 rewrites ids 2 and 3
      pools.push_back(pool_values(rng, t, D, 0));
      want.put(b, rows.back(), ids.back(), KPoolCacheRef::quantize(rk, pools.back()));
    }
    fill_output(out, 2, rows, ids, pools);
    KPool::store_pools(E(), out, live_rows<M>(2), KPool::paged(cache, table),
                       test_options<E>());
  }
  EXPECT_TRUE(same_bytes(value_bytes(cache), want.values, sizeof(C), "values"));
  EXPECT_TRUE(same_bytes(scale_bytes(cache), want.scales, 4, "scales"));
}

// The value sent for (sequence, position, channel, key or gate), the same
// whichever call sends it. Keys spread over magnitudes so fp8 scales
// differ between pools.
template <class Cfg>
double cache_input(int seq, int pos, int c, int which) {
  Rng r((seq * 0x9E3779B97F4A7C15ull) ^ (pos * 0xC2B2AE3D27D4EB4Full) ^
        (static_cast<std::uint64_t>(c) * 0x165667B19E3779F9ull + which));
  double const mag = which ? 4.0 : std::ldexp(1.0, static_cast<int>(r.next() % 9) - 4);
  return KPoolRef::round_to(Cfg::dtype, r.uniform(-mag, mag));
}

// A call in which sequence seqs[i] sends take[i] positions from
// fed[seqs[i]], as a ragged batch: its row offsets and cache lengths, and
// key and gate of max(rows, 1) rows.
template <class Cfg>
struct RaggedCall {
  std::vector<std::uint32_t> offsets{0}, cache_lengths;
  Matrix key, gate;
  RaggedCall(std::vector<int> const& seqs, std::vector<int> const& fed,
             std::vector<int> const& take, int D) {
    int const n = static_cast<int>(seqs.size());
    for (int i = 0; i < n; ++i) {
      offsets.push_back(offsets.back() + take[i]);
      cache_lengths.push_back(fed[seqs[i]]);
    }
    key = gate = Matrix(std::max<int>(offsets.back(), 1), D);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < take[i]; ++j)
        for (int c = 0; c < D; ++c) {
          key.at(offsets[i] + j, c) = cache_input<Cfg>(seqs[i], fed[seqs[i]] + j, c, 0);
          gate.at(offsets[i] + j, c) = cache_input<Cfg>(seqs[i], fed[seqs[i]] + j, c, 1);
        }
  }
  int rows() const { return key.rows; }
};

// The same as a decode batch of next_n entries a row: key and gate
// [n, next_n, D] and positions [n, next_n], entries past take[i] padding
// (position -1, zeros).
template <class Cfg>
struct DecodeCall {
  using T = typename Cfg::value_type;
  using M = typename Cfg::memory_space;
  Kokkos::View<T***, Kokkos::LayoutRight, M> key, gate;
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> pos;
  DecodeCall(std::vector<int> const& seqs, std::vector<int> const& fed,
             std::vector<int> const& take, int next_n, int D) {
    int const n = static_cast<int>(seqs.size());
    key = decltype(key)("key", n, next_n, D);
    gate = decltype(gate)("gate", n, next_n, D);
    pos = decltype(pos)("positions", n, next_n);
    auto hk = Kokkos::create_mirror_view(key);
    auto hg = Kokkos::create_mirror_view(gate);
    auto hp = Kokkos::create_mirror_view(pos);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < next_n; ++j) {
        bool const real = j < take[i];
        int const p = fed[seqs[i]] + j;
        hp(i, j) = real ? p : -1;
        for (int c = 0; c < D; ++c) {
          hk(i, j, c) = to_storage<T>(real ? cache_input<Cfg>(seqs[i], p, c, 0) : 0.0);
          hg(i, j, c) = to_storage<T>(real ? cache_input<Cfg>(seqs[i], p, c, 1) : 0.0);
        }
      }
    Kokkos::deep_copy(key, hk);
    Kokkos::deep_copy(gate, hg);
    Kokkos::deep_copy(pos, hp);
  }
};

// Streaming invariance of the cache (docs/indexer.md): sequences fed in random
// chunks through KPool::step (ragged and decode batches), each call followed by
// store_pools, leave caches byte-identical to those of one KPool::step
// prefilling the whole sequences, for native and fp8 caches, rotated or
// not.
template <class Cfg>
class CacheStreaming {
  using T = typename Cfg::value_type;
  using E = typename Cfg::execution_space;
  using M = typename Cfg::memory_space;
  using F8 = std::conditional_t<std::is_same<T, double>::value, T, KPool::float8_e4m3>;
  static constexpr bool has_fp8 = !std::is_same<T, double>::value;

 public:
  CacheStreaming(int K, int D, std::uint64_t seed)
      : K_(K), D_(D), rng_(seed), ape_(random_ape(rng_, K, D)) {
    for (int s = 0; s < S_; ++s) length_.push_back(1 + rng_.below(10 * K));
    max_pools_ = *std::max_element(length_.begin(), length_.end()) / K + 1;
    blocks_ = make_blocks(rng_, S_, (max_pools_ + block_pools_ - 1) / block_pools_, block_pools_);
  }

  struct Caches {
    KPool::PoolCache<T, M> native, native_rot;
    KPool::PoolCache<F8, M> amax_rot, pow2;
  };

  Caches make_caches() {
    Caches c;
    int const nb = blocks_.num_blocks, bp = block_pools_;
    c.native = KPool::PoolCache<T, M>(E(), nb, bp, D_, K_);
    c.native_rot = KPool::PoolCache<T, M>(E(), nb, bp, D_, K_, KPool::CacheScale::none, true);
    if constexpr (has_fp8) {
      c.amax_rot = KPool::PoolCache<F8, M>(E(), nb, bp, D_, K_, KPool::CacheScale::amax, true);
      c.pow2 = KPool::PoolCache<F8, M>(E(), nb, bp, D_, K_, KPool::CacheScale::pow2, false);
    }
    return c;
  }

  // One KPool::step with every whole sequence, rows in order.
  Caches one_shot() {
    Caches c = make_caches();
    std::vector<int> seqs(S_);
    std::iota(seqs.begin(), seqs.end(), 0);
    std::vector<int> take(length_), from(S_, 0);
    KPool::Ring<T, M> ring(E(), S_, K_, D_);
    step(ring, seqs, from, take, c);
    return c;
  }

  // Random chunks and decode runs, rows shuffled every call.
  Caches streamed() {
    Caches c = make_caches();
    KPool::Ring<T, M> ring(E(), S_, K_, D_);
    std::vector<int> fed(S_, 0);
    for (int call = 0; call < 400; ++call) {
      std::vector<int> seqs;
      for (int s = 0; s < S_; ++s)
        if (fed[s] < length_[s] && rng_.below(4) != 0) seqs.push_back(s);
      bool done = true;
      for (int s = 0; s < S_; ++s) done = done && fed[s] == length_[s];
      if (done) break;
      if (seqs.empty()) continue;
      for (int i = static_cast<int>(seqs.size()) - 1; i > 0; --i)
        std::swap(seqs[i], seqs[rng_.below(i + 1)]);
      std::vector<int> take;
      for (int s : seqs) take.push_back(std::min(length_[s] - fed[s], rng_.below(2 * K_ + 2)));
      if (rng_.below(3) == 0)
        decode(ring, seqs, fed, take, c);
      else
        step(ring, seqs, fed, take, c);
      for (std::size_t i = 0; i < seqs.size(); ++i) fed[seqs[i]] += take[i];
    }
    for (int s = 0; s < S_; ++s) EXPECT_EQ(fed[s], length_[s]) << "sequence " << s;
    return c;
  }

  int pools() const {
    int n = 0;
    for (int l : length_) n += l / K_;
    return n;
  }

 private:
  // The block table of a call: row i is sequence seqs[i]'s blocks; one
  // extra row of unassigned blocks past num_requests.
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> table_for(std::vector<int> const& seqs) {
    int const n = static_cast<int>(seqs.size());
    Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> v("block_table", n + 1,
                                                           blocks_.max_blocks);
    auto h = Kokkos::create_mirror_view(v);
    for (int i = 0; i <= n; ++i)
      for (int c = 0; c < blocks_.max_blocks; ++c)
        h(i, c) = i < n ? blocks_.at(seqs[i], c) : -1;
    Kokkos::deep_copy(v, h);
    return v;
  }

  void store(KPool::StepOutput<T, M> const& out, std::vector<int> const& seqs, Caches& c) {
    auto const table = table_for(seqs);
    int const n = static_cast<int>(seqs.size());
    KPool::Options o = test_options<E>();
    o.validate = rng_.below(2) == 0;
    auto const batch = live_rows<M>(n);
    KPool::store_pools(E(), out, batch, KPool::paged(c.native, table), o);
    KPool::store_pools(E(), out, batch, KPool::paged(c.native_rot, table), o);
    if constexpr (has_fp8) {
      KPool::store_pools(E(), out, batch, KPool::paged(c.amax_rot, table), o);
      KPool::store_pools(E(), out, batch, KPool::paged(c.pow2, table), o);
    }
  }

  void step(KPool::Ring<T, M>& ring, std::vector<int> const& seqs, std::vector<int> const& from,
            std::vector<int> const& take, Caches& c) {
    int const n = static_cast<int>(seqs.size());
    RaggedCall<Cfg> const call(seqs, from, take, D_);
    std::vector<std::uint32_t> const slot(seqs.begin(), seqs.end());
    using U32 = Kokkos::View<std::uint32_t*, M>;
    KPool::StepOutput<T, M> out(
        E(), KPool::StepOutput<T, M>::capacity_for(call.rows(), n, K_), n, D_);
    KPool::Options o = test_options<E>();
    o.fused = rng_.below(2) == 0;
    KPool::step(E(), ring, to_view<T, M>(call.key, "key"), to_view<T, M>(call.gate, "gate"),
                ape_view<M>(ape_),
                KPool::ragged_batch(to_index_view<U32>(call.offsets, "row_offsets"),
                                    to_index_view<U32>(call.cache_lengths, "cache_lengths"),
                                    to_index_view<U32>(slot, "slot_idx"), n),
                out, o);
    store(out, seqs, c);
  }

  void decode(KPool::Ring<T, M>& ring, std::vector<int> const& seqs, std::vector<int> const& from,
              std::vector<int> const& take, Caches& c) {
    int const n = static_cast<int>(seqs.size());
    int const next_n = std::max(1, *std::max_element(take.begin(), take.end()));
    DecodeCall<Cfg> const call(seqs, from, take, next_n, D_);
    std::vector<std::uint32_t> const slot(seqs.begin(), seqs.end());
    KPool::StepOutput<T, M> out(E(), n * ((next_n + K_ - 1) / K_), n, D_);
    KPool::step(E(), ring, call.key, call.gate, ape_view<M>(ape_),
                KPool::decode_batch(
                    call.pos, to_index_view<Kokkos::View<std::uint32_t*, M>>(slot, "slot_idx"),
                    n),
                out, test_options<E>());
    store(out, seqs, c);
  }

  static constexpr int S_ = 5, block_pools_ = 3;
  int K_, D_;
  Rng rng_;
  Matrix ape_;
  std::vector<int> length_;
  int max_pools_;
  Blocks blocks_;
};

TYPED_TEST(PoolCacheTest, StreamedCachesEqualOneShotCaches) {
  for (int K : {1, 3, 4})
    for (int D : {8, 64}) {
      SCOPED_TRACE(shape(K, D));
      CacheStreaming<TypeParam> sim(K, D, 31 * K + D);
      auto const once = sim.one_shot();
      auto const streamed = sim.streamed();
      EXPECT_GT(sim.pools(), 5);
      auto same = [](auto const& a, auto const& b, char const* what) {
        SCOPED_TRACE(what);
        using C = typename std::decay_t<decltype(a)>::value_type;
        EXPECT_TRUE(same_bytes(value_bytes(a), value_bytes(b), sizeof(C), "values"));
        EXPECT_TRUE(same_bytes(scale_bytes(a), scale_bytes(b), 4, "scales"));
      };
      same(streamed.native, once.native, "native");
      same(streamed.native_rot, once.native_rot, "native rotated");
      if constexpr (!std::is_same<typename TypeParam::value_type, double>::value) {
        same(streamed.amax_rot, once.amax_rot, "fp8 amax rotated");
        same(streamed.pow2, once.pow2, "fp8 pow2");
      }
    }
}

// The two paths of a cached step's write (common/detail/KPool_CachePath.hpp),
// forced: the same calls (fresh prefills, chunk continuations, decodes with
// drafts; fused and three-launch steps; a sequence without blocks, skipped
// with validation off) through KPool::Details::step_impl and
// decode_step_impl with CacheWritePath::in_step on one ring and cache and
// second_pass on another leave caches whose values and scales are the same
// bytes after every call, and every pool with a block has its entry.
template <class Cfg, KPool::Details::CacheWritePath P>
struct PathRun {
  using T = typename Cfg::value_type;
  using E = typename Cfg::execution_space;
  using M = typename Cfg::memory_space;
  using C = std::conditional_t<std::is_same<T, double>::value, T, KPool::float8_e4m3>;
  using Table = Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M>;

  KPool::Ring<T, M> ring;
  KPool::PoolCache<C, M> cache;
  PathRun(int S, int K, int D, int num_blocks, int block_pools)
      : ring(E(), S, K, D),
        cache(E(), num_blocks, block_pools, D, K,
              std::is_same<C, T>::value ? KPool::CacheScale::none : KPool::CacheScale::amax,
              /*rotate=*/(D & (D - 1)) == 0) {
    Kokkos::deep_copy(cache.scales(), -1.0f);  // unwritten entries
  }
  KPool::Details::CacheArg<C, M, Table, P> arg(Table const& table) const {
    return {&cache, &table};
  }
};

template <class Cfg>
void check_cache_paths(int K, int D, std::uint64_t seed) {
  using T = typename Cfg::value_type;
  using E = typename Cfg::execution_space;
  using M = typename Cfg::memory_space;
  using U32 = Kokkos::View<std::uint32_t*, M>;
  using Table = Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M>;
  using KPool::Details::CacheWritePath;
  constexpr int S = 5, block_pools = 3;
  Rng rng(seed);
  std::vector<int> length;
  for (int s = 0; s < S; ++s) length.push_back(1 + rng.below(12 * K));
  int const max_pools = *std::max_element(length.begin(), length.end()) / K + 1;
  Blocks const blocks = make_blocks(rng, S, (max_pools + block_pools - 1) / block_pools,
                                    block_pools);
  PathRun<Cfg, CacheWritePath::in_step> a(S, K, D, blocks.num_blocks, block_pools);
  PathRun<Cfg, CacheWritePath::second_pass> b(S, K, D, blocks.num_blocks, block_pools);
  Matrix const ape = random_ape(rng, K, D);
  auto const ape_v = ape_view<M>(ape);
  KPool::Options o = test_options<E>();
  o.validate = false;  // sequence 0 has no blocks: its pools are skipped

  std::vector<int> fed(S, 0);
  int calls = 0, decodes = 0;
  for (int call = 0; call < 200; ++call) {
    std::vector<int> seqs;
    for (int s = 0; s < S; ++s)
      if (fed[s] < length[s] && rng.below(4) != 0) seqs.push_back(s);
    if (seqs.empty()) {
      bool done = true;
      for (int s = 0; s < S; ++s) done = done && fed[s] == length[s];
      if (done) break;
      continue;
    }
    for (int i = static_cast<int>(seqs.size()) - 1; i > 0; --i)
      std::swap(seqs[i], seqs[rng.below(i + 1)]);
    int const n = static_cast<int>(seqs.size());
    bool const decode = rng.below(3) == 0;
    std::vector<int> take;
    for (int s : seqs)
      take.push_back(std::min(length[s] - fed[s], decode ? 1 + rng.below(K + 1)
                                                         : rng.below(3 * K + 2)));
    Table table("block_table", n, blocks.max_blocks);
    {
      auto h = Kokkos::create_mirror_view(table);
      for (int i = 0; i < n; ++i)
        for (int c = 0; c < blocks.max_blocks; ++c)
          h(i, c) = seqs[i] == 0 ? -1 : blocks.at(seqs[i], c);
      Kokkos::deep_copy(table, h);
    }
    std::vector<std::uint32_t> slot(seqs.begin(), seqs.end());
    auto const slot_v = to_index_view<U32>(slot, "slot_idx");
    if (decode) {
      int const next_n = *std::max_element(take.begin(), take.end());
      DecodeCall<Cfg> const d(seqs, fed, take, next_n, D);
      KPool::StepOutput<T, M> out_a(E(), n * ((next_n + K - 1) / K), n, D),
          out_b(E(), n * ((next_n + K - 1) / K), n, D);
      KPool::Details::decode_step_impl(E(), a.ring, d.key, d.gate, ape_v, d.pos, slot_v, n,
                                       out_a, a.arg(table), o);
      KPool::Details::decode_step_impl(E(), b.ring, d.key, d.gate, ape_v, d.pos, slot_v, n,
                                       out_b, b.arg(table), o);
      ++decodes;
    } else {
      RaggedCall<Cfg> const r(seqs, fed, take, D);
      auto const key_v = to_view<T, M>(r.key, "key");
      auto const gate_v = to_view<T, M>(r.gate, "gate");
      auto const off_v = to_index_view<U32>(r.offsets, "row_offsets");
      auto const len_v = to_index_view<U32>(r.cache_lengths, "cache_lengths");
      std::size_t const cap = KPool::StepOutput<T, M>::capacity_for(r.rows(), n, K);
      KPool::StepOutput<T, M> out_a(E(), cap, n, D), out_b(E(), cap, n, D);
      o.fused = rng.below(2) == 0;
      KPool::Details::step_impl(E(), a.ring, key_v, gate_v, ape_v, off_v, len_v, slot_v, n,
                                out_a, a.arg(table), o);
      KPool::Details::step_impl(E(), b.ring, key_v, gate_v, ape_v, off_v, len_v, slot_v, n,
                                out_b, b.arg(table), o);
    }
    ++calls;
    for (int i = 0; i < n; ++i) fed[seqs[i]] += take[i];
    SCOPED_TRACE("call " + std::to_string(call) + (decode ? " (decode)" : " (step)"));
    ASSERT_TRUE(same_bytes(value_bytes(b.cache), value_bytes(a.cache),
                           sizeof(typename decltype(a.cache)::value_type), "values"));
    ASSERT_TRUE(same_bytes(scale_bytes(b.cache), scale_bytes(a.cache), 4, "scales"));
  }
  for (int s = 0; s < S; ++s) ASSERT_EQ(fed[s], length[s]) << "sequence " << s;
  EXPECT_GT(decodes, 0);
  EXPECT_GT(calls - decodes, 0);
  // Every pool of sequences 1.. has its entry; sequence 0's none.
  int want = 0;
  for (int s = 1; s < S; ++s) want += length[s] / K;
  auto const scales = on_host(a.cache.scales());
  int written = 0;
  for (std::size_t i = 0; i < scales.size(); ++i) written += scales.data()[i] != -1.0f;
  EXPECT_EQ(written, want);
  EXPECT_GT(want, 5);
}

TYPED_TEST(PoolCacheTest, BothCacheWritePathsStoreTheSameBytes) {
  for (auto const& [K, D] : std::initializer_list<std::pair<int, int>>{{4, 8}, {3, 128}}) {
    SCOPED_TRACE(shape(K, D));
    check_cache_paths<TypeParam>(K, D, 977 * K + D);
  }
}

}  // namespace

namespace {

// The UE8M0 rounding (docs/indexer.md, "The serving profile") against the
// reference's own reading of it: exact at every f32 power of two, the next
// power up one ulp above, the same one ulp below; 0, subnormals and the
// largest values clamped into [2^-126, 2^127].
TEST(ServingScale, Ue8m0IsExactAtPowersOfTwoAndOneUlpEitherSide) {
  for (int k = -149; k <= 127; ++k) {
    float const p = std::ldexp(1.0f, k);
    float const below = std::nextafter(p, 0.0f);
    float const above = std::nextafter(p, std::numeric_limits<float>::infinity());
    for (float x : {p, below, above}) {
      SCOPED_TRACE(x);
      float const got = KPool::Details::ceil_ue8m0(x);
      float const want = KPoolCacheRef::ue8m0_ceil(x);
      ASSERT_EQ(got, want);
    }
    if (k >= -126 && k < 127) {
      ASSERT_EQ(KPool::Details::ceil_ue8m0(p), p);
      ASSERT_EQ(KPool::Details::ceil_ue8m0(above), 2 * p);
      ASSERT_EQ(KPool::Details::ceil_ue8m0(below), p);
    }
  }
  EXPECT_EQ(KPool::Details::ceil_ue8m0(0.0f), std::ldexp(1.0f, -126));
  EXPECT_EQ(KPool::Details::ceil_ue8m0(std::numeric_limits<float>::max()),
            std::ldexp(1.0f, 127));
  // The scale of an amax: f32(1/448) times it, then the rounding; the
  // floor for an all-zero row.
  EXPECT_EQ(KPool::Details::serving_scale(0u), std::ldexp(1.0f, -22));
  for (float amax : {1.0f, 448.0f, 3.5f, 1e-4f, 2e-4f, 57344.0f}) {
    std::uint32_t bits;
    std::memcpy(&bits, &amax, 4);
    EXPECT_EQ(KPool::Details::serving_scale(bits),
              KPoolCacheRef::ue8m0_ceil(std::max(amax, 1e-4f) * KPoolCacheRef::serving_inv448()))
        << amax;
  }
}

}  // namespace

// Serving entries whose amax makes amax * f32(1/448) exactly a power of two
// (amax = 448 * 2^k: the scale is 2^k and that value's code is 448), and
// the bf16 neighbours of such an amax on either side (scales 2^(k+1) and
// 2^k), all-zero rows (the 1e-4 floor) and rows below it, through
// store_pools on both host paths (D = 128, the vector path, and D = 16):
// bytes and scales equal to the reference's.
TYPED_TEST(PoolCacheTest, ServingScalesAtPowersOfTwo) {
  using T = typename TypeParam::value_type;
  using E = typename TypeParam::execution_space;
  using M = typename TypeParam::memory_space;
  constexpr DType t = TypeParam::dtype;
  if constexpr (t != DType::f64) {
    Rng rng(991);
    int const lo = t == DType::f16 ? -12 : -30, hi = t == DType::f16 ? 6 : 30;
    for (int D : {128, 16}) {
      SCOPED_TRACE("D=" + std::to_string(D));
      std::vector<std::vector<double>> pools;
      for (int k = lo; k <= hi; k += 3)
        for (int step : {0, 1, -1}) {
          // 448 * 2^k and its bf16 neighbours (spacing 2^(k + 1) there).
          std::vector<double> v(D);
          double const amax = std::ldexp(448.0 + 2.0 * step, k);
          for (int c = 0; c < D; ++c)
            v[c] = KPoolRef::round_to(t, rng.uniform(-1, 1) * amax * 0.9);
          v[rng.below(D)] = (rng.below(2) ? 1 : -1) * amax;
          pools.push_back(v);
        }
      pools.push_back(std::vector<double>(D, 0.0));
      std::vector<double> tiny(D);
      for (double& x : tiny) x = KPoolRef::round_to(t, rng.uniform(-5e-5, 5e-5));
      pools.push_back(tiny);
      int const n = static_cast<int>(pools.size());
      Blocks const b = make_blocks(rng, 1, (n + 3) / 4, 4);
      auto const table = table_view<M>(b);
      std::vector<int> rows(n, 0), ids(n);
      std::iota(ids.begin(), ids.end(), 0);
      KPool::StepOutput<T, M> out(E(), n, 1, D);
      fill_output(out, 1, rows, ids, pools);
      Kind const k{true, KPool::CacheScale::pow2, false, true};
      CacheKind const rk = ref_kind(t, k);
      ExpectedCache want(b, D, 1);
      for (int o = 0; o < n; ++o) want.put(b, 0, o, KPoolCacheRef::quantize(rk, pools[o]));
      auto cache = fp8_cache<E, M>(k, b.num_blocks, b.block_pools, D, kStoreK);
      KPool::store_pools(E(), out, live_rows<M>(1), KPool::paged(cache, table),
                         test_options<E>());
      EXPECT_TRUE(same_bytes(value_bytes(cache), want.values, 1, "values"));
      EXPECT_TRUE(same_bytes(scale_bytes(cache), want.scales, 4, "scales"));
    }
  }
}
