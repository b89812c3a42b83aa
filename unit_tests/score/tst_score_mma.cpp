// The tensor-core engine's pieces (docs/indexer.md, "The tensor-core
// engine"): the MMA fragment mapping against the PTX ISA's tables, the host
// emulation of a warp's MMA against a plain f64 product, the exact bf16
// split of an f32 query, the serving query codes, and, where a CUDA device
// runs the tests, the hardware MMA against the emulation bit for bit. The
// engine's whole path (scores and selection against the reference, planted
// ties) runs in tst_select with ScoreEngine::tensor_cores.

#include <KPoolSelectReference.hpp>
#include <KPoolTestUtils.hpp>
#include <select/KPool_ScoreSelect.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <utility>
#include <vector>

namespace {

using KPool::Details::MmaKind;
using KPool::Details::MmaShape;
using KPoolTest::Rng;

// ------------------------------------------------ the PTX ISA's tables

// The fragment tables as the PTX ISA prints them ("Matrix Fragments for
// mma.m16n8k16 with floating point type" and "... mma.m16n8k32"), written
// out here independently of src/: (row, col) of element i of lane `lane`.
// A and B of m16n8k16 (16-bit types) and m16n8k32 (8-bit) are one table
// in P, the elements a 32-bit register holds (2 or 4): element i is entry
// i % P of register i / P; A's registers 1 and 3 hold rows g + 8, its
// registers 2 and 3 columns 4 P on; B's register 1 holds rows 4 P on.
template <int P>
std::pair<int, int> ptx_a(int lane, int i) {
  int const g = lane / 4, t = lane % 4;
  int const row = (i < P || (i >= 2 * P && i < 3 * P)) ? g : g + 8;
  int const col = i < 2 * P ? t * P + i % P : t * P + i % P + 4 * P;
  return {row, col};
}
template <int P>
std::pair<int, int> ptx_b(int lane, int i) {
  int const g = lane / 4, t = lane % 4;
  return {i < P ? t * P + i % P : t * P + i % P + 4 * P, g};
}
constexpr auto ptx_a16 = &ptx_a<2>;
constexpr auto ptx_b16 = &ptx_b<2>;
constexpr auto ptx_a8 = &ptx_a<4>;
constexpr auto ptx_b8 = &ptx_b<4>;
std::pair<int, int> ptx_c(int lane, int i) {
  int const g = lane / 4, t = lane % 4;
  return {i < 2 ? g : g + 8, t * 2 + (i & 1)};
}

template <MmaKind Kind>
void expect_tables(std::pair<int, int> (*a)(int, int), std::pair<int, int> (*b)(int, int)) {
  using S = MmaShape<Kind>;
  std::set<std::pair<int, int>> as, bs, cs;
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < S::a_elems; ++i) {
      std::pair<int, int> const got{S::a_row(lane, i), S::a_col(lane, i)};
      EXPECT_EQ(got, a(lane, i)) << "A lane " << lane << " element " << i;
      as.insert(got);
    }
    for (int i = 0; i < S::b_elems; ++i) {
      std::pair<int, int> const got{S::b_row(lane, i), S::b_col(lane, i)};
      EXPECT_EQ(got, b(lane, i)) << "B lane " << lane << " element " << i;
      bs.insert(got);
    }
    for (int i = 0; i < 4; ++i) {
      std::pair<int, int> const got{S::c_row(lane, i), S::c_col(lane, i)};
      EXPECT_EQ(got, ptx_c(lane, i)) << "C lane " << lane << " element " << i;
      cs.insert(got);
    }
  }
  // Every element of each tile once.
  EXPECT_EQ(as.size(), static_cast<std::size_t>(S::m * S::k));
  EXPECT_EQ(bs.size(), static_cast<std::size_t>(S::k * S::n));
  EXPECT_EQ(cs.size(), static_cast<std::size_t>(S::m * S::n));
}

TEST(MmaFragments, MatchThePtxTables) {
  expect_tables<MmaKind::bf16>(ptx_a16, ptx_b16);
  expect_tables<MmaKind::f16>(ptx_a16, ptx_b16);
  expect_tables<MmaKind::e4m3>(ptx_a8, ptx_b8);
}

// ------------------------------------------------ the emulated warp MMA

// Random operands as bit patterns of the kind, and their values.
std::uint32_t random_bits(Rng& rng, MmaKind kind, double& value) {
  if (kind == MmaKind::e4m3) {
    std::uint8_t b;
    do b = static_cast<std::uint8_t>(rng.next()); while ((b & 0x7F) == 0x7F);
    value = KPoolSelectRef::fp8_decode(b);
    return b;
  }
  float const f = static_cast<float>(rng.uniform(-4, 4));
  if (kind == MmaKind::bf16) {
    KPool::bfloat16 const h(f);
    value = static_cast<float>(h);
    return h.bits;
  }
  KPool::float16 const h(f);
  value = static_cast<float>(h);
  return h.bits;
}

// Tiles packed into the 32 lanes' registers by the PTX tables above.
template <MmaKind Kind>
struct WarpOperands {
  using S = MmaShape<Kind>;
  std::uint32_t a[32][4] = {};
  std::uint32_t b[32][2] = {};
  float c[32][4] = {};
  std::vector<double> am = std::vector<double>(S::m * S::k);
  std::vector<double> bm = std::vector<double>(S::k * S::n);
  std::vector<double> cm = std::vector<double>(S::m * S::n);

  WarpOperands(Rng& rng, std::pair<int, int> (*ta)(int, int),
               std::pair<int, int> (*tb)(int, int)) {
    int const bits = 32 / S::per_reg;
    for (int lane = 0; lane < 32; ++lane) {
      for (int i = 0; i < S::a_elems; ++i) {
        double v;
        std::uint32_t const x = random_bits(rng, Kind, v);
        a[lane][i / S::per_reg] |= x << ((i % S::per_reg) * bits);
        am[ta(lane, i).first * S::k + ta(lane, i).second] = v;
      }
      for (int i = 0; i < S::b_elems; ++i) {
        double v;
        std::uint32_t const x = random_bits(rng, Kind, v);
        b[lane][i / S::per_reg] |= x << ((i % S::per_reg) * bits);
        bm[tb(lane, i).first * S::n + tb(lane, i).second] = v;
      }
      for (int i = 0; i < 4; ++i) {
        c[lane][i] = static_cast<float>(rng.uniform(-8, 8));
        cm[ptx_c(lane, i).first * S::n + ptx_c(lane, i).second] = c[lane][i];
      }
    }
  }
};

template <MmaKind Kind>
void expect_emulation(std::pair<int, int> (*ta)(int, int), std::pair<int, int> (*tb)(int, int)) {
  using S = MmaShape<Kind>;
  Rng rng(static_cast<std::uint64_t>(Kind) + 11);
  for (int rep = 0; rep < 20; ++rep) {
    WarpOperands<Kind> w(rng, ta, tb);
    float d[32][4];
    KPool::Details::mma_emulate<Kind>(d, w.a, w.b, w.c);
    for (int lane = 0; lane < 32; ++lane)
      for (int i = 0; i < 4; ++i) {
        int const r = ptx_c(lane, i).first, col = ptx_c(lane, i).second;
        double ref = w.cm[r * S::n + col], mag = std::fabs(ref);
        for (int k = 0; k < S::k; ++k) {
          ref += w.am[r * S::k + k] * w.bm[k * S::n + col];
          mag += std::fabs(w.am[r * S::k + k] * w.bm[k * S::n + col]);
        }
        // f32 sums of exact products: within K + 1 roundings of the terms.
        EXPECT_NEAR(d[lane][i], ref, (S::k + 1) * 0x1.0p-24 * mag)
            << "lane " << lane << " element " << i;
      }
  }
}

TEST(MmaEmulation, IsTheProductOfTheTiles) {
  expect_emulation<MmaKind::bf16>(ptx_a16, ptx_b16);
  expect_emulation<MmaKind::f16>(ptx_a16, ptx_b16);
  expect_emulation<MmaKind::e4m3>(ptx_a8, ptx_b8);
}

// ------------------------------------------------ numerics of the operands

float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Three bf16 terms hold every finite f32 of magnitude 2^-110 or more
// exactly (up to the largest), smaller ones to within 2^-134 (bf16's
// subnormal step is 2^-133); two leave at most 2^-17 |x|; one term is the
// nearest bf16.
TEST(MmaNumerics, ThreeBf16TermsAreExact) {
  Rng rng(7);
  auto value = [](std::uint32_t bits) {
    return static_cast<double>(KPool::Details::bf16_bits_to_float(static_cast<std::uint16_t>(bits)));
  };
  for (int n = 0; n < 200000; ++n) {
    std::uint32_t u = static_cast<std::uint32_t>(rng.next());
    if (n % 4 == 1) u &= 0x807FFFFFu;                          // subnormals
    if (n % 4 == 2) u = (u & 0x80FFFFFFu) | 0x7E000000u;       // near the top
    float const x = bits_float(u);
    if (!std::isfinite(x)) continue;
    std::uint32_t t3[3], t2[3], t1[3];
    KPool::Details::split_bf16(x, 3, t3);
    KPool::Details::split_bf16(x, 2, t2);
    KPool::Details::split_bf16(x, 1, t1);
    double const s3 = value(t3[0]) + value(t3[1]) + value(t3[2]);
    // Below 2^-110 the f32 bits reach under bf16's smallest step, 2^-133.
    if (std::fabs(x) >= 0x1.0p-110) {
      ASSERT_EQ(s3, static_cast<double>(x)) << "x = " << x;
    } else {
      ASSERT_LE(std::fabs(s3 - x), 0x1.0p-134) << "x = " << x;
    }
    ASSERT_EQ(t2[2], 0u);
    double const s2 = value(t2[0]) + value(t2[1]);
    if (std::isfinite(value(t2[0])) && std::fabs(x) >= 0x1.0p-110) {
      ASSERT_LE(std::fabs(s2 - x), 0x1.0p-17 * std::fabs(x)) << "x = " << x;
    }
    ASSERT_EQ(t1[1], 0u);
    ASSERT_EQ(t1[0], KPool::bfloat16(x).bits);
    // The split (one conversion a term) gives bf16_term's terms, each
    // computed anew from x.
    for (int j = 0; j < 3; ++j) ASSERT_EQ(t3[j], KPool::Details::bf16_term(x, j)) << "x = " << x;
  }
  // inf and NaN stay in the first term.
  std::uint32_t t[3];
  KPool::Details::split_bf16(std::numeric_limits<float>::infinity(), 3, t);
  EXPECT_TRUE(std::isinf(value(t[0])));
  EXPECT_EQ(t[1] | t[2], 0u);
  KPool::Details::split_bf16(std::numeric_limits<float>::quiet_NaN(), 3, t);
  EXPECT_TRUE(std::isnan(value(t[0])));
  EXPECT_EQ(t[1] | t[2], 0u);
}

// E4M3 operands: every product of two codes is exact in f32, so the MMA's
// products are the contract's exact products.
TEST(MmaNumerics, E4m3ProductsAreExactInF32) {
  for (int a = 0; a < 256; ++a)
    for (int b = 0; b < 256; ++b) {
      if ((a & 0x7F) == 0x7F || (b & 0x7F) == 0x7F) continue;
      double const x = KPoolSelectRef::fp8_decode(static_cast<std::uint8_t>(a));
      double const y = KPoolSelectRef::fp8_decode(static_cast<std::uint8_t>(b));
      ASSERT_EQ(static_cast<double>(static_cast<float>(x) * static_cast<float>(y)), x * y);
    }
}

// The serving profile's query codes (docs/indexer.md): a power-of-two scale
// from the bf16-rounded row's amax (floored at 1e-4), every code the
// nearest E4M3 of value / scale, computed here from the definition.
TEST(MmaNumerics, ServingQueryCodes) {
  Rng rng(3);
  for (int rep = 0; rep < 2000; ++rep) {
    int const D = 1 + rng.below(128);
    double const range = std::ldexp(1.0, rng.below(40) - 20);
    std::vector<float> x(D);
    for (float& v : x) v = static_cast<float>(rng.uniform(-range, range));
    std::vector<float> y = x;
    // What the engine stages: prepare_query_row, no rotation, weight 1
    // (the returned weight is then s_q).
    KPool::Details::QueryPrep<float> const prep{1.0f, false, true};
    float const s = KPool::Details::prepare_query_row(y.data(), D, prep, 1.0f);
    double amax = 1e-4f;
    std::vector<double> r(D);
    for (int c = 0; c < D; ++c) {
      r[c] = static_cast<float>(KPool::bfloat16(x[c]));
      amax = std::max(amax, std::fabs(r[c]));
    }
    // The smallest power of two at or above f32(amax * f32(1/448)).
    float const want = static_cast<float>(amax) * (1.0f / 448.0f);
    double p2 = std::ldexp(1.0, -126);
    while (p2 < want) p2 *= 2;
    ASSERT_EQ(static_cast<double>(s), p2) << "amax " << amax;
    for (int c = 0; c < D; ++c) {
      double const q = r[c] / s;
      // Nearest code: no code lies strictly closer.
      double const got = y[c];
      for (int b = 0; b < 256; ++b) {
        if ((b & 0x7F) == 0x7F) continue;
        double const v = KPoolSelectRef::fp8_decode(static_cast<std::uint8_t>(b));
        ASSERT_GE(std::fabs(v - q), std::fabs(got - q)) << "value " << q;
      }
    }
  }
}

// ------------------------------------------------ the engine's scratch

// The team's scratch fits the level-0 scratch a GPU reports (40,936 bytes
// with Kokkos 4.6 on an H200, what device-shapes builds check against):
// the queries arrive prepared (no rotation rows in scratch), and the warps
// come off one at a time, so a rotated fp8 decode call of the exact
// profile (H = 32, D = 128, three bf16 query terms, one row) runs 3-warp
// teams there rather than 2.
TEST(MmaEngine, ARotatedFp8DecodeCallTakesThreeWarpsInAnH200sScratch) {
  using F = KPool::Details::ScoreMmaFunctor<Kokkos::DefaultHostExecutionSpace, KPool::bfloat16,
                                            KPool::float8_e4m3, MmaKind::bf16>;
  std::size_t const h200 = 40936;
  EXPECT_EQ(KPool::Details::modeled_device_scratch0, h200);
  EXPECT_LE(F::scratch_bytes(1, 3, 32, 128, 3, 1), h200);
  EXPECT_GT(F::scratch_bytes(1, 3, 32, 128, 4, 1), h200);
  // No key ring: its fp8 keys become bf16 operands as they are staged.
  EXPECT_FALSE(F::direct_keys);
  for (int warps : {1, 2, 4}) {
    auto const l = F::layout(1, 3, 32, 128, warps, 1);
    // Each warp's key tile, and nothing else, between k and meta.
    EXPECT_EQ(l.meta - l.k, static_cast<std::size_t>(warps) * 16 * F::row_words(128) * 4)
        << warps << " warps";
  }
}

// The key ring (ScoreMmaFunctor::score_ring) in the same scratch: a
// serving decode call (E4M3 keys taken as they are, H = 32, D = 128, one
// row, 4 warps) holds the deepest ring, 3 tiles a warp; a prefill-shaped
// one (4 rows a team) holds 2 (35,472 and 39,440 bytes of 40,936); each
// warp's ring is `depth` key tiles, and its places and scales a slot a
// tile. With the row's histogram built while scoring, the decode call still
// holds its ring of 3 (39,568 bytes).
TEST(MmaEngine, AServingDecodeCallHoldsAKeyRingOfThreeInAnH200sScratch) {
  using F = KPool::Details::ScoreMmaFunctor<Kokkos::DefaultHostExecutionSpace, KPool::bfloat16,
                                            KPool::float8_e4m3, MmaKind::e4m3>;
  std::size_t const h200 = KPool::Details::modeled_device_scratch0;
  EXPECT_TRUE(F::direct_keys);
  EXPECT_EQ(F::max_depth, 3);
  EXPECT_EQ(F::scratch_bytes(1, 1, 32, 128, 4, 3), 35472u);
  EXPECT_EQ(F::scratch_bytes(4, 1, 32, 128, 4, 2), 39440u);
  EXPECT_GT(F::scratch_bytes(4, 1, 32, 128, 4, 3), h200);
  // The row's first-digit counts built while scoring (2048 16-bit bins)
  // fit beside the decode call's ring of 3.
  EXPECT_EQ(F::scratch_bytes(1, 1, 32, 128, 4, 3, true), 35472u + 4096u);
  EXPECT_LE(F::scratch_bytes(1, 1, 32, 128, 4, 3, true), h200);
  EXPECT_EQ(F::layout(1, 1, 32, 128, 4, 3, true).hist, F::layout(1, 1, 32, 128, 4, 3).total);
  for (int depth : {1, 2, 3}) {
    auto const l = F::layout(1, 1, 32, 128, 4, depth);
    EXPECT_EQ(l.meta - l.k, static_cast<std::size_t>(4 * depth) * 16 * F::row_words(128) * 4)
        << "depth " << depth;
    EXPECT_EQ(l.total - l.meta, static_cast<std::size_t>(4 * (depth < 2 ? 2 : depth)) * 2 * 16 * 4)
        << "depth " << depth;
  }
}

// ------------------------------------------------ queries prepared once

// The prepare launch (score/detail/KPool_ScorePrepare.hpp), on the default
// execution space (teams sharing a row under device shapes), leaves every
// (row, head) of the chunk bit for bit as prepare_query_row, the serial
// definition every engine used before, leaves it: both profiles, rotated
// or not, f32, bf16 and f64 queries, a chunk that starts past row 0.
// With codes (the serving profile for the E4M3 MMA), each (row, head)'s
// region starts with the E4M3 bytes of those values, and the launch writes
// nothing past them.
template <class T>
void expect_prepared_rows(bool rotate, bool serving, int D, bool codes = false) {
  using E = Kokkos::DefaultExecutionSpace;
  using M = E::memory_space;
  using A = KPool::accumulator_t<T>;
  int const rows = 5, H = 3, row0 = 2, chunk = 3;
  Rng rng(static_cast<std::uint64_t>(D) * 7 + (rotate ? 1 : 0) + (serving ? 2 : 0));
  Kokkos::View<T***, Kokkos::LayoutRight, M> q("q", rows, H, D);
  Kokkos::View<float**, Kokkos::LayoutRight, M> w("w", rows, H);
  KPoolTest::fill_uniform(rng, q, -3, 3);
  KPoolTest::fill_uniform(rng, w, 0, 2);
  KPool::Details::QueryPrep<A> const prep{static_cast<A>(1 / std::sqrt(static_cast<double>(D))),
                                          rotate, serving};
  Kokkos::View<A*, M> out("prepared", chunk * H * D), out_w("prepared_w", chunk * H);
  // A sentinel in every byte, so that a byte the launch leaves shows.
  Kokkos::deep_copy(Kokkos::View<unsigned char*, M>(reinterpret_cast<unsigned char*>(out.data()),
                                                     out.size() * sizeof(A)),
                    static_cast<unsigned char>(0xA5));
  E space;
  KPool::Details::launch_prepare_queries<E, T, A>(
      KPool::Details::Checker("test"), space, q, w, prep, row0, chunk, H, D, out.data(),
      out_w.data(), codes);
  space.fence();
  auto const hq = KPoolTest::on_host(q);
  auto const hw = KPoolTest::on_host(w);
  auto const ho = KPoolTest::on_host(out);
  auto const how = KPoolTest::on_host(out_w);
  for (int i = 0; i < chunk; ++i)
    for (int h = 0; h < H; ++h) {
      std::vector<A> x(D);
      for (int c = 0; c < D; ++c) x[c] = KPool::to_accumulator(hq(row0 + i, h, c));
      A const wt = KPool::Details::prepare_query_row(x.data(), D, prep, hw(row0 + i, h));
      int const at = i * H + h;
      ASSERT_EQ(std::memcmp(&wt, &how(at), sizeof(A)), 0) << "weight of row " << i << " head " << h;
      if (codes) {
        unsigned char const* bytes = reinterpret_cast<unsigned char const*>(&ho(at * D));
        for (int c = 0; c < D; ++c)
          ASSERT_EQ(bytes[c], KPool::Details::float_to_e4m3_bits(static_cast<float>(x[c])))
              << "code " << c << " of row " << i << " head " << h << (rotate ? " rotated" : "")
              << " D " << D;
        // The team launch writes the bytes alone (a host's one-thread
        // teams convert the values in place).
        if (KPool::Details::device_shapes<E>::value) {
          for (std::size_t b = D; b < D * sizeof(A); ++b)
            ASSERT_EQ(bytes[b], 0xA5) << "byte " << b << " of row " << i << " head " << h;
        }
      } else {
        ASSERT_EQ(std::memcmp(x.data(), &ho(at * D), D * sizeof(A)), 0)
            << "row " << i << " head " << h << (rotate ? " rotated" : "")
            << (serving ? " serving" : " exact") << " D " << D;
      }
    }
}

TEST(PreparedQueries, AreThoseOfPrepareQueryRowBitForBit) {
  for (int D : {16, 128})
    for (bool rotate : {false, true}) {
      expect_prepared_rows<float>(rotate, false, D);
      expect_prepared_rows<float>(rotate, true, D);
      expect_prepared_rows<KPool::bfloat16>(rotate, true, D);
      expect_prepared_rows<double>(rotate, false, D);
      expect_prepared_rows<float>(rotate, true, D, true);
      expect_prepared_rows<KPool::bfloat16>(rotate, true, D, true);
    }
}

// ------------------------------------------------ queries staged as operands

// A scoring team's staging of prepared query rows for the 16-bit MMAs
// (ScoreMmaFunctor's stage_queries, one team of the default execution
// space's shape) against the operand bits of each prepared value, computed
// here one value at a time: bf16_term (bf16, 1 or 3 terms, each computed
// anew from the value, which the numerics test above ties to split_bf16)
// and float16's bits. Channels past D and heads past H are zero, each
// (row, head)'s weight is the prepared
// one (0 past H), and the 4 words of padding after each operand row keep
// what they held. D of 18 (values read one at a time) and of 20, 32 and
// 128 (16-byte loads); rows of a chunk that does not start at row 0.
template <class T, class C, MmaKind Kind>
void expect_staged_queries(int D, int H, int terms) {
  using E = Kokkos::DefaultExecutionSpace;
  using M = E::memory_space;
  using F = KPool::Details::ScoreMmaFunctor<E, T, C, Kind>;
  using S = MmaShape<Kind>;
  SCOPED_TRACE("D " + std::to_string(D) + ", H " + std::to_string(H) + ", terms " +
               std::to_string(terms) + ", operand words of " + std::to_string(S::per_reg));
  int const nrows = 2, row_begin = 3, t0 = 4;  // the chunk's rows 1 and 2
  int const chunk = 4;
  Rng rng(static_cast<std::uint64_t>(D * 31 + H * 7 + terms));
  Kokkos::View<float*, M> prepared("prepared", chunk * H * D), weights("weights", chunk * H);
  KPoolTest::fill_uniform(rng, prepared, -3, 3);
  KPoolTest::fill_uniform(rng, weights, 0, 2);
  {  // an infinity and a tiny value among them (their terms past the first are 0)
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), prepared);
    h(H * D + 1) = std::numeric_limits<float>::infinity();
    h(H * D + 2) = 1.0e-30f;
    Kokkos::deep_copy(prepared, h);
  }
  F f;
  f.heads = H;
  f.cache.dim = D;
  f.batch.row_begin = row_begin;
  f.prepared = prepared.data();
  f.prepared_weights = weights.data();
  f.prepared_codes = false;
  f.row_hist = nullptr;
  f.terms = terms;
  f.warps = 1;
  f.depth = 1;
  f.rows_per_team = nrows;
  f.scratch_level = 0;
  int const HP = F::padded_heads(H), RW = F::row_words(D);
  int const DW = F::padded_dim(D) / S::per_reg;  // operand words of a (row, head)
  std::size_t const qwords = F::query_words(nrows, terms, H, D);
  std::uint32_t const sentinel = 0xA5A5A5A5u;
  Kokkos::View<std::uint32_t*, M> q_out("q_out", qwords);
  Kokkos::View<float*, M> w_out("w_out", static_cast<std::size_t>(nrows) * HP);
  using Policy = KPool::Details::KokkosExt::TeamPolicy<E>;
  int const team = KPool::Details::mma_lanes<E>::value == 1 ? 32 : 1;  // one warp
  Kokkos::parallel_for(
      "test_stage_queries",
      Policy(1, team).set_scratch_size(0, Kokkos::PerTeam(F::scratch_bytes(nrows, terms, H, D, 1, 1))),
      KOKKOS_LAMBDA(typename Policy::member_type const& member) {
        typename F::Tiles const s = f.tiles_of(member);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(member, static_cast<int>(qwords)),
                             [&](int i) { s.q[i] = sentinel; });
        member.team_barrier();
        f.stage_queries(member, s, t0, nrows);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(member, static_cast<int>(qwords)),
                             [&](int i) { q_out(i) = s.q[i]; });
        Kokkos::parallel_for(Kokkos::TeamThreadRange(member, nrows * HP),
                             [&](int i) { w_out(i) = s.w[i]; });
      });
  auto const hq = KPoolTest::on_host(q_out);
  auto const hw = KPoolTest::on_host(w_out);
  auto const hp = KPoolTest::on_host(prepared);
  auto const hwt = KPoolTest::on_host(weights);
  for (int i = 0; i < nrows; ++i)
    for (int h = 0; h < HP; ++h) {
      std::size_t const at = static_cast<std::size_t>(t0 - row_begin + i) * H + h;
      float const want_w = h < H ? hwt(at) : 0.0f;
      ASSERT_EQ(std::memcmp(&want_w, &hw(i * HP + h), 4), 0) << "weight of row " << i << " head " << h;
      for (int term = 0; term < terms; ++term) {
        std::size_t const base = ((static_cast<std::size_t>(i) * terms + term) * HP + h) * RW;
        for (int wd = 0; wd < RW; ++wd) {
          std::uint32_t want = sentinel;
          if (wd < DW) {
            want = 0;
            for (int e = 0; e < S::per_reg; ++e) {
              int const c = wd * S::per_reg + e;
              float const v = (h < H && c < D) ? hp(at * D + c) : 0.0f;
              std::uint32_t bits;
              if constexpr (Kind == MmaKind::bf16) {
                bits = KPool::Details::bf16_term(v, term);
              } else {
                bits = KPool::float16(v).bits;
              }
              want |= bits << (e * (32 / S::per_reg));
            }
          }
          ASSERT_EQ(hq(base + wd), want) << "row " << i << " head " << h << " term " << term
                                         << " word " << wd << (wd >= DW ? " (padding)" : "");
        }
      }
    }
}

TEST(StagedQueries, AreTheOperandBitsOfThePreparedValues) {
  for (int D : {18, 20, 32, 128})
    for (int H : {3, 8}) {
      expect_staged_queries<float, KPool::bfloat16, MmaKind::bf16>(D, H, 3);
      expect_staged_queries<KPool::bfloat16, KPool::bfloat16, MmaKind::bf16>(D, H, 1);
      expect_staged_queries<float, KPool::float16, MmaKind::f16>(D, H, 1);
    }
}

// ------------------------------------------------ the hardware MMA

#if defined(KOKKOS_ENABLE_CUDA)
// One warp's MMA on the device against the emulation, bit for bit: the
// operands are small integers, so every summation order gives the same f32
// result, and any difference is a fragment mapped to the wrong element.
template <MmaKind Kind>
void expect_device_mma(std::pair<int, int> (*ta)(int, int), std::pair<int, int> (*tb)(int, int)) {
  if (!KPool::Details::mma_device_supported<Kind>::value) GTEST_SKIP() << "arch";
  using S = MmaShape<Kind>;
  Rng rng(42);
  WarpOperands<Kind> w(rng, ta, tb);
  // Integers: small values only.
  auto small_word = [&]() {
    std::uint32_t word = 0;
    for (int e = 0; e < S::per_reg; ++e) {
      float const v = static_cast<float>(rng.below(7) - 3);
      std::uint32_t const bits = Kind == MmaKind::e4m3   ? KPool::float8_e4m3(v).bits
                                 : Kind == MmaKind::bf16 ? KPool::bfloat16(v).bits
                                                         : KPool::float16(v).bits;
      word |= bits << (e * (32 / S::per_reg));
    }
    return word;
  };
  for (int lane = 0; lane < 32; ++lane) {
    for (int r = 0; r < 4; ++r) w.a[lane][r] = small_word();
    for (int r = 0; r < 2; ++r) w.b[lane][r] = small_word();
    for (int i = 0; i < 4; ++i) w.c[lane][i] = static_cast<float>(rng.below(9) - 4);
  }
  Kokkos::View<std::uint32_t[32][6], Kokkos::CudaSpace> in("in");
  Kokkos::View<float[32][4], Kokkos::CudaSpace> acc("acc");
  auto hin = Kokkos::create_mirror_view(in);
  auto hacc = Kokkos::create_mirror_view(acc);
  for (int l = 0; l < 32; ++l) {
    for (int r = 0; r < 4; ++r) hin(l, r) = w.a[l][r];
    for (int r = 0; r < 2; ++r) hin(l, 4 + r) = w.b[l][r];
    for (int i = 0; i < 4; ++i) hacc(l, i) = w.c[l][i];
  }
  Kokkos::deep_copy(in, hin);
  Kokkos::deep_copy(acc, hacc);
  using Policy = Kokkos::TeamPolicy<Kokkos::Cuda>;
  Kokkos::parallel_for(
      "mma_device_check", Policy(1, 32), KOKKOS_LAMBDA(Policy::member_type const& m) {
        int const l = m.team_rank();
        float d[1][4] = {{acc(l, 0), acc(l, 1), acc(l, 2), acc(l, 3)}};
        std::uint32_t const a[1][4] = {{in(l, 0), in(l, 1), in(l, 2), in(l, 3)}};
        std::uint32_t const b[1][2] = {{in(l, 4), in(l, 5)}};
        KPool::Details::mma_warp<Kind, 1>(d, a, b);
        for (int i = 0; i < 4; ++i) acc(l, i) = d[0][i];
      });
  Kokkos::deep_copy(hacc, acc);
  float d[32][4];
  KPool::Details::mma_emulate<Kind>(d, w.a, w.b, w.c);
  for (int l = 0; l < 32; ++l)
    for (int i = 0; i < 4; ++i) EXPECT_EQ(hacc(l, i), d[l][i]) << "lane " << l << " element " << i;
}

TEST(MmaDevice, Bf16MatchesTheEmulation) { expect_device_mma<MmaKind::bf16>(ptx_a16, ptx_b16); }
TEST(MmaDevice, F16MatchesTheEmulation) { expect_device_mma<MmaKind::f16>(ptx_a16, ptx_b16); }
TEST(MmaDevice, E4m3MatchesTheEmulation) { expect_device_mma<MmaKind::e4m3>(ptx_a8, ptx_b8); }

// Each warp (team) chains `steps` MMAs of its tile's registers.
template <MmaKind Kind>
struct ChainedMma {
  Kokkos::View<std::uint32_t*, Kokkos::CudaSpace> in;
  Kokkos::View<float*, Kokkos::CudaSpace> out;
  int steps;
  KOKKOS_INLINE_FUNCTION void operator()(
      Kokkos::TeamPolicy<Kokkos::Cuda>::member_type const& m) const {
    int const t = m.league_rank(), l = m.team_rank();
    float d[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
    for (int st = 0; st < steps; ++st) {
      std::size_t const r = ((static_cast<std::size_t>(t) * steps + st) * 32 + l) * 6;
      std::uint32_t const a[1][4] = {{in(r), in(r + 1), in(r + 2), in(r + 3)}};
      std::uint32_t const b[1][2] = {{in(r + 4), in(r + 5)}};
      KPool::Details::mma_warp<Kind, 1>(d, a, b);
    }
    for (int i = 0; i < 4; ++i) out((static_cast<std::size_t>(t) * 32 + l) * 4 + i) = d[0][i];
  }
};

// Hopper's FP8 MMA accumulates with about 14 bits retained, not f32's 24
// (DeepSeek-V3 Technical Report, arXiv:2412.19437, section 3.3.2), which
// the small integers above cannot show. Serving-shaped data: rotated keys
// (16 pools) and queries (8 heads) of 128 channels, each row scaled by its
// UE8M0 power of two and coded in E4M3 as the serving profile does; each
// (pool, head) score is four chained m16n8k32 MMAs. The hardware's scores
// are compared with KPool's f32 emulation and with the exact sum, relative
// to S = sum_c |q_c k_c|. Each MMA step keeps ~14 bits of the largest
// magnitude it adds, at most S: an error of at most 2^-13 S a step, 2^-11 S
// over the four (docs/indexer.md, "The E4M3 MMA's accumulation"); the
// serving profile's tolerance on the E4M3 MMA, 2^-10 S between two scores,
// is two such errors. The measured error and whether the bound holds are
// printed either way, plainly, for the device run's summary: where it does
// not hold, the serving profile is to be built with
// KPool_SERVING_MMA_BF16=ON (the bf16 MMA, f32 accumulation) until a fix
// lands.
TEST(MmaDevice, E4m3AccumulationOnServingShapedData) {
  constexpr MmaKind Kind = MmaKind::e4m3;
  if (!KPool::Details::mma_device_supported<Kind>::value) GTEST_SKIP() << "arch";
  using S = MmaShape<Kind>;
  constexpr int D = 128, steps = D / S::k, tiles = 256;
  Rng rng(2027);
  // A row as the serving profile stores it: Gaussian-like values, rotated,
  // divided by the UE8M0 scale of its amax, coded in E4M3.
  auto serving_row = [&](std::vector<std::uint8_t>& codes, std::vector<double>& values) {
    std::vector<double> x(D);
    for (double& v : x) v = rng.uniform(-1, 1) + rng.uniform(-1, 1) + rng.uniform(-1, 1);
    KPoolSelectRef::wht(x);
    double amax = 1e-4;
    for (double v : x) amax = std::max(amax, std::fabs(v));
    double const scale = std::ldexp(1.0, static_cast<int>(std::ceil(std::log2(amax / 448.0))));
    codes.resize(D);
    values.resize(D);
    for (int c = 0; c < D; ++c) {
      codes[c] = KPoolSelectRef::fp8_encode(x[c] / scale);
      values[c] = KPoolSelectRef::fp8_decode(codes[c]);
    }
  };
  // Registers: [tile][step][lane][4 words of A, 2 of B].
  std::vector<std::uint32_t> regs(static_cast<std::size_t>(tiles) * steps * 32 * 6, 0);
  std::vector<double> exact(static_cast<std::size_t>(tiles) * S::m * S::n, 0.0);
  std::vector<double> mag(exact.size(), 0.0);
  std::vector<float> emulated(exact.size(), 0.0f);
  for (int t = 0; t < tiles; ++t) {
    std::vector<std::vector<std::uint8_t>> kc(S::m), qc(S::n);
    std::vector<std::vector<double>> kv(S::m), qv(S::n);
    for (int p = 0; p < S::m; ++p) serving_row(kc[p], kv[p]);
    for (int h = 0; h < S::n; ++h) serving_row(qc[h], qv[h]);
    float acc[32][4] = {};
    for (int st = 0; st < steps; ++st) {
      std::uint32_t a[32][4] = {}, b[32][2] = {};
      for (int lane = 0; lane < 32; ++lane) {
        for (int i = 0; i < S::a_elems; ++i) {
          auto const rc = ptx_a8(lane, i);
          a[lane][i / 4] |= std::uint32_t(kc[rc.first][st * S::k + rc.second]) << ((i % 4) * 8);
        }
        for (int i = 0; i < S::b_elems; ++i) {
          auto const rc = ptx_b8(lane, i);
          b[lane][i / 4] |= std::uint32_t(qc[rc.second][st * S::k + rc.first]) << ((i % 4) * 8);
        }
        std::uint32_t* r = &regs[((static_cast<std::size_t>(t) * steps + st) * 32 + lane) * 6];
        for (int w = 0; w < 4; ++w) r[w] = a[lane][w];
        for (int w = 0; w < 2; ++w) r[4 + w] = b[lane][w];
      }
      KPool::Details::mma_emulate<Kind>(acc, a, b, acc);
    }
    for (int lane = 0; lane < 32; ++lane)
      for (int i = 0; i < 4; ++i) {
        auto const rc = ptx_c(lane, i);
        std::size_t const o = (static_cast<std::size_t>(t) * S::m + rc.first) * S::n + rc.second;
        emulated[o] = acc[lane][i];
        for (int c = 0; c < D; ++c) {
          exact[o] += kv[rc.first][c] * qv[rc.second][c];
          mag[o] += std::fabs(kv[rc.first][c] * qv[rc.second][c]);
        }
      }
  }
  Kokkos::View<std::uint32_t*, Kokkos::CudaSpace> in("in", regs.size());
  Kokkos::View<float*, Kokkos::CudaSpace> out("out", static_cast<std::size_t>(tiles) * 32 * 4);
  Kokkos::deep_copy(in, Kokkos::View<std::uint32_t*, Kokkos::HostSpace,
                                     Kokkos::MemoryTraits<Kokkos::Unmanaged>>(regs.data(),
                                                                              regs.size()));
  Kokkos::parallel_for("mma_accumulation_check",
                       Kokkos::TeamPolicy<Kokkos::Cuda>(tiles, 32),
                       ChainedMma<Kind>{in, out, steps});
  auto const hw = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
  double worst_exact = 0, worst_emulated = 0, emulation_exact = 0;
  for (int t = 0; t < tiles; ++t)
    for (int lane = 0; lane < 32; ++lane)
      for (int i = 0; i < 4; ++i) {
        auto const rc = ptx_c(lane, i);
        std::size_t const o = (static_cast<std::size_t>(t) * S::m + rc.first) * S::n + rc.second;
        double const h = hw((static_cast<std::size_t>(t) * 32 + lane) * 4 + i);
        worst_exact = std::max(worst_exact, std::fabs(h - exact[o]) / mag[o]);
        worst_emulated = std::max(worst_emulated, std::fabs(h - emulated[o]) / mag[o]);
        emulation_exact = std::max(emulation_exact, std::fabs(emulated[o] - exact[o]) / mag[o]);
      }
  double const bound = std::ldexp(1.0, -11);  // 4 steps of 2^-13 S
  std::printf(
      "measured: E4M3 MMA accumulation over %d serving-shaped scores of %d channels: "
      "max |hardware - exact| = %.3g S (%.2f bits), max |hardware - f32 emulation| = %.3g S "
      "(f32 emulation - exact: %.3g S); the bound from ~14 retained bits is 2^-11 S = %.3g S\n",
      tiles * S::m * S::n, D, worst_exact, worst_exact > 0 ? -std::log2(worst_exact) : 99.0,
      worst_emulated, emulation_exact, bound);
  std::printf("SERVING PROFILE on the E4M3 MMA: %s\n",
              worst_exact <= bound
                  ? "within its tolerance (2^-11 S a score, 2^-10 S between two)"
                  : "OUTSIDE its tolerance: build with KPool_SERVING_MMA_BF16=ON (the bf16 MMA) "
                    "until a fix lands");
  EXPECT_LE(worst_exact, bound) << "the hardware MMA's accumulation is outside the serving "
                                   "profile's tensor-core tolerance";
}
#endif

}  // namespace
