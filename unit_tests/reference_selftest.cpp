// Sanity checks of the host reference (KPoolReference.hpp) itself, on cases
// small enough to work out by hand. Standalone: no gtest, no Kokkos.
//   g++ -std=c++17 -O1 -Wall -Wextra -I unit_tests unit_tests/reference_selftest.cpp
#include "KPoolReference.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <vector>

using namespace KPoolRef;

static int g_pass = 0, g_fail = 0;

#define CHECK(cond)                                                         \
  do {                                                                      \
    if (cond) {                                                             \
      ++g_pass;                                                             \
    } else {                                                                \
      ++g_fail;                                                             \
      std::printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);           \
    }                                                                       \
  } while (0)

#define CHECK_EQ(a, b)                                                      \
  do {                                                                      \
    auto va_ = (a);                                                         \
    auto vb_ = (b);                                                         \
    if (va_ == vb_) {                                                       \
      ++g_pass;                                                             \
    } else {                                                                \
      ++g_fail;                                                             \
      std::printf("FAIL %s:%d: %s == %s (%.17g vs %.17g)\n", __FILE__,      \
                  __LINE__, #a, #b, double(va_), double(vb_));              \
    }                                                                       \
  } while (0)

#define CHECK_NEAR(a, b, tol)                                               \
  do {                                                                      \
    double va_ = (a), vb_ = (b);                                            \
    if (std::fabs(va_ - vb_) <= (tol)) {                                    \
      ++g_pass;                                                             \
    } else {                                                                \
      ++g_fail;                                                             \
      std::printf("FAIL %s:%d: |%s - %s| <= %g (%.17g vs %.17g)\n",         \
                  __FILE__, __LINE__, #a, #b, double(tol), va_, vb_);       \
    }                                                                       \
  } while (0)

static float fbits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
static std::uint32_t bitsf(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Pool of K rows given as plain arrays, D channels (rows of keys/gates).
static std::vector<double> pool_of(const Matrix& ape, const Matrix& keys, const Matrix& gates) {
  std::vector<const double*> k, g;
  for (int m = 0; m < ape.rows; ++m) {
    k.push_back(keys.row(m));
    g.push_back(gates.row(m));
  }
  std::vector<double> out(ape.cols);
  pool(ape, k, g, out.data());
  return out;
}

static Matrix mat(int r, int c, std::vector<double> vals) {
  Matrix m(r, c);
  m.v = std::move(vals);
  return m;
}

// ---------------------------------------------------------------------------
static void test_bf16() {
  CHECK_EQ(bf16_bits(1.0f), 0x3F80);
  CHECK_EQ(bf16_bits(-2.0f), 0xC000);
  CHECK_EQ(bf16_bits(0.0f), 0x0000);
  CHECK_EQ(bf16_bits(-0.0f), 0x8000);
  // 1 + 2^-8 is exactly halfway between 0x3F80 (even) and 0x3F81 -> 0x3F80
  CHECK_EQ(bf16_bits(fbits(0x3F808000u)), 0x3F80);
  // 1 + 3*2^-8 halfway between 0x3F81 and 0x3F82 (even) -> 0x3F82
  CHECK_EQ(bf16_bits(fbits(0x3F818000u)), 0x3F82);
  // just above / below a tie
  CHECK_EQ(bf16_bits(fbits(0x3F808001u)), 0x3F81);
  CHECK_EQ(bf16_bits(fbits(0x3F817FFFu)), 0x3F81);
  // negative tie, symmetric
  CHECK_EQ(bf16_bits(fbits(0xBF818000u)), 0xBF82);
  // overflow: max bf16 is 0x7F7F; float max rounds past it -> inf
  CHECK_EQ(bf16_bits(fbits(0x7F7FFFFFu)), 0x7F80);
  CHECK_EQ(bf16_bits(fbits(0x7F7F7FFFu)), 0x7F7F);
  // tie between 0x7F7F (odd) and 2^128 (even) -> inf
  CHECK_EQ(bf16_bits(fbits(0x7F7F8000u)), 0x7F80);
  CHECK_EQ(bf16_bits(fbits(0xFF7FFFFFu)), 0xFF80);
  CHECK_EQ(bf16_bits(INFINITY), 0x7F80);
  CHECK_EQ(bf16_bits(-INFINITY), 0xFF80);
  // NaN stays NaN (including a NaN whose payload is only in the low 16 bits)
  {
    std::uint16_t b = bf16_bits(NAN);
    CHECK((b & 0x7F80) == 0x7F80 && (b & 0x007F) != 0);
    b = bf16_bits(fbits(0x7F800001u));
    CHECK((b & 0x7F80) == 0x7F80 && (b & 0x007F) != 0);
    CHECK(std::isnan(bf16_value(b)));
  }
  // subnormals: bf16 quantum there is 2^-133 (float bit 16)
  CHECK_EQ(bf16_bits(fbits(0x00000001u)), 0x0000);  // 2^-149 -> 0
  CHECK_EQ(bf16_bits(fbits(0x00008000u)), 0x0000);  // exactly half of 2^-133: tie -> 0
  CHECK_EQ(bf16_bits(fbits(0x00008001u)), 0x0001);
  CHECK_EQ(bf16_bits(fbits(0x00018000u)), 0x0002);  // 1.5 quanta: tie -> 2
  CHECK_EQ(bf16_bits(fbits(0x007FFFFFu)), 0x0080);  // largest float subnormal -> smallest normal
  CHECK_EQ(bf16_bits(fbits(0x00800000u)), 0x0080);
  // values
  CHECK_EQ(bf16_value(0x3F80), 1.0f);
  CHECK_EQ(bf16_value(0x4049), 3.140625f);
  CHECK_EQ(bf16_value(0x0001), std::ldexp(1.0f, -133));
  CHECK_EQ(bf16_value(0x7F7F), fbits(0x7F7F0000u));
  CHECK(std::isinf(bf16_value(0xFF80)) && bf16_value(0xFF80) < 0);
  CHECK_EQ(bf16_bits(3.14159265f), 0x4049);

  // Round trip of every non-NaN bf16 pattern.
  int rt_bad = 0;
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    float v = bf16_value(static_cast<std::uint16_t>(b));
    if (std::isnan(v)) continue;
    if (bf16_bits(v) != b || bitsf(v) != (b << 16)) ++rt_bad;
  }
  CHECK_EQ(rt_bad, 0);

  // Cross-check against the classic bias trick on random floats (a test-only
  // second method; the reference itself does not use it).
  std::mt19937 rng(7);
  int diff = 0;
  for (int i = 0; i < 2000000; ++i) {
    std::uint32_t u = rng();
    float f = fbits(u);
    if (std::isnan(f)) continue;
    std::uint32_t trick = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    if (bf16_bits(f) != trick) ++diff;
  }
  CHECK_EQ(diff, 0);
}

static void test_f16() {
  CHECK_EQ(f16_bits(1.0f), 0x3C00);
  CHECK_EQ(f16_bits(-2.0f), 0xC000);
  CHECK_EQ(f16_bits(-0.0f), 0x8000);
  CHECK_EQ(f16_bits(0.1f), 0x2E66);
  CHECK_EQ(f16_bits(65504.0f), 0x7BFF);
  CHECK_EQ(f16_bits(65519.0f), 0x7BFF);
  CHECK_EQ(f16_bits(65520.0f), 0x7C00);  // tie between 65504 (odd) and 65536 -> inf
  CHECK_EQ(f16_bits(1e6f), 0x7C00);
  CHECK_EQ(f16_bits(-1e6f), 0xFC00);
  CHECK_EQ(f16_bits(INFINITY), 0x7C00);
  CHECK_EQ(f16_bits(1.0f + std::ldexp(1.0f, -11)), 0x3C00);       // tie -> even
  CHECK_EQ(f16_bits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);   // tie -> even
  CHECK_EQ(f16_bits(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3C01);
  // subnormals: quantum 2^-24
  CHECK_EQ(f16_bits(std::ldexp(1.0f, -24)), 0x0001);
  CHECK_EQ(f16_bits(std::ldexp(1.0f, -25)), 0x0000);       // tie -> 0
  CHECK_EQ(f16_bits(3 * std::ldexp(1.0f, -25)), 0x0002);   // 1.5 quanta -> 2
  CHECK_EQ(f16_bits(std::ldexp(1.0f, -26)), 0x0000);
  CHECK_EQ(f16_bits(std::ldexp(1.0f, -14)), 0x0400);
  CHECK_EQ(f16_bits(1023.5f * std::ldexp(1.0f, -24)), 0x0400);  // tie -> even (1024)
  CHECK_EQ(f16_bits(-std::ldexp(1.0f, -24)), 0x8001);
  {
    std::uint16_t b = f16_bits(NAN);
    CHECK((b & 0x7C00) == 0x7C00 && (b & 0x03FF) != 0);
    CHECK(std::isnan(f16_value(b)));
  }
  CHECK_EQ(f16_value(0x3C00), 1.0f);
  CHECK_EQ(f16_value(0x0001), std::ldexp(1.0f, -24));
  CHECK_EQ(f16_value(0x7BFF), 65504.0f);
  CHECK_EQ(f16_value(0x3555), 0.333251953125f);
  CHECK_EQ(f16_value(0x8400), -std::ldexp(1.0f, -14));
  CHECK(std::isinf(f16_value(0x7C00)));

  int rt_bad = 0;
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    float v = f16_value(static_cast<std::uint16_t>(b));
    if (std::isnan(v)) continue;
    if (f16_bits(v) != b) ++rt_bad;
  }
  CHECK_EQ(rt_bad, 0);

#if defined(__FLT16_MAX__)
  // Cross-check against the compiler's _Float16 conversion.
  std::mt19937 rng(11);
  int diff = 0;
  for (int i = 0; i < 2000000; ++i) {
    std::uint32_t u = rng();
    // bias exponents toward the f16 range half of the time
    if (i & 1) u = (u & 0x8000FFFFu) | ((0x30u + (u >> 16) % 0x20u) << 23) | (u & 0x007F0000u);
    float f = fbits(u);
    if (std::isnan(f)) continue;
    _Float16 h = static_cast<_Float16>(f);
    std::uint16_t hb;
    std::memcpy(&hb, &h, 2);
    if (f16_bits(f) != hb) ++diff;
    if (f16_value(hb) != static_cast<float>(h)) ++diff;
  }
  CHECK_EQ(diff, 0);
#endif
}

static void test_round_to_and_ulp() {
  CHECK_EQ(round_to(DType::f64, 0.1), 0.1);
  CHECK_EQ(round_to(DType::f32, 0.1), 0.100000001490116119384765625);
  CHECK_EQ(round_to(DType::f32, 1.0 + std::ldexp(1.0, -24)), 1.0);  // tie -> even
  CHECK_EQ(round_to(DType::f32, 1.0 + 3 * std::ldexp(1.0, -24)), 1.0 + std::ldexp(1.0, -22));
  CHECK(std::isinf(round_to(DType::f32, 1e39)));
  CHECK_EQ(round_to(DType::bf16, 1.0 + std::ldexp(1.0, -8)), 1.0);
  CHECK_EQ(round_to(DType::bf16, 3.0 / 7.0), double(bf16_value(bf16_bits(float(3.0 / 7.0)))));
  // Goes through f32 first: 1 + 2^-8 + 2^-40 rounds to the f32 tie 1 + 2^-8,
  // which then ties to even in bf16 (a direct rounding would give 1 + 2^-7).
  CHECK_EQ(round_to(DType::bf16, 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40)), 1.0);
  CHECK_EQ(round_to(DType::f16, 0.1), 0.0999755859375);
  CHECK(std::isinf(round_to(DType::f16, 70000.0)));
  CHECK(std::isnan(round_to(DType::bf16, std::nan(""))));

  CHECK_EQ(ulp(DType::f64, 1.0), std::ldexp(1.0, -52));
  CHECK_EQ(ulp(DType::f32, 1.0), std::ldexp(1.0, -23));
  CHECK_EQ(ulp(DType::f32, -3.0), std::ldexp(1.0, -22));
  CHECK_EQ(ulp(DType::bf16, 1.0), std::ldexp(1.0, -7));
  CHECK_EQ(ulp(DType::bf16, 1.99), std::ldexp(1.0, -7));
  CHECK_EQ(ulp(DType::f16, 1.0), std::ldexp(1.0, -10));
  CHECK_EQ(ulp(DType::f16, 1000.0), 0.5);
  CHECK_EQ(ulp(DType::f16, 0.0), std::ldexp(1.0, -24));
  CHECK_EQ(ulp(DType::f16, 1e-6), std::ldexp(1.0, -24));
  CHECK_EQ(ulp(DType::bf16, 1e-40), std::ldexp(1.0, -133));
  CHECK_EQ(ulp(DType::f32, 1e-40), std::ldexp(1.0, -149));
  // ulp is the gap to the next representable number above a normal value
  CHECK_EQ(double(f16_value(0x3C01)) - 1.0, ulp(DType::f16, 1.0));
  CHECK_EQ(double(bf16_value(0x4049 + 1)) - double(bf16_value(0x4049)), ulp(DType::bf16, 3.140625));
}

// ---------------------------------------------------------------------------
static void test_pool() {
  // K = 1: the single weight is 1, the pool is the key itself.
  {
    Matrix ape = mat(1, 3, {0.5, -7.0, 100.0});
    Matrix k = mat(1, 3, {1.25, -3.0, 42.0});
    Matrix g = mat(1, 3, {9.0, 0.0, -50.0});
    auto out = pool_of(ape, k, g);
    CHECK_EQ(out[0], 1.25);
    CHECK_EQ(out[1], -3.0);
    CHECK_EQ(out[2], 42.0);
  }
  // Equal logits (gates + ape equal per channel): the mean of the keys.
  {
    Matrix ape = mat(4, 1, {0.0, 0.0, 0.0, 0.0});
    Matrix k = mat(4, 1, {1.0, 2.0, 3.0, 6.0});
    Matrix g = mat(4, 1, {0.0, 0.0, 0.0, 0.0});
    CHECK_EQ(pool_of(ape, k, g)[0], 3.0);
    // gate and ape cancel: logits 2, 2, 2, 2
    Matrix ape2 = mat(4, 1, {1.0, 2.0, 0.0, -1.0});
    Matrix g2 = mat(4, 1, {1.0, 0.0, 2.0, 3.0});
    CHECK_NEAR(pool_of(ape2, k, g2)[0], 3.0, 1e-15);
  }
  // Huge logit gap: one key selected, independently per channel.
  {
    Matrix ape(2, 2, 0.0);
    Matrix k = mat(2, 2, {5.0, 5.0,
                          7.0, 7.0});
    Matrix g = mat(2, 2, {0.0, 1000.0,
                          1000.0, 0.0});
    auto out = pool_of(ape, k, g);
    CHECK_EQ(out[0], 7.0);  // channel 0 prefers member 1
    CHECK_EQ(out[1], 5.0);  // channel 1 prefers member 0
    // max subtraction keeps huge logits finite
    Matrix g_big = mat(2, 2, {1e300, 1e300, 1e300, 1e300});
    auto out2 = pool_of(ape, k, g_big);
    CHECK_EQ(out2[0], 6.0);
  }
  // Logit gap ln 3: weights 1/4, 3/4 -> 4/4 + 3*8/4 = 7. Scale of signed keys.
  {
    Matrix ape = mat(2, 1, {0.0, std::log(3.0)});
    Matrix k = mat(2, 1, {4.0, 8.0});
    Matrix g(2, 1, 0.0);
    CHECK_NEAR(pool_of(ape, k, g)[0], 7.0, 1e-14);
    Matrix k2 = mat(2, 1, {-4.0, 8.0});
    Matrix ape0(2, 1, 0.0);
    std::vector<const double*> kk{k2.row(0), k2.row(1)}, gg{g.row(0), g.row(1)};
    double out, sc;
    pool_with_scale(ape0, kk, gg, &out, &sc);
    CHECK_EQ(out, 2.0);
    CHECK_EQ(sc, 6.0);
  }
}

// ---------------------------------------------------------------------------
// K = 2, D = 1, gates and ape all 0, so every pool is the mean of its keys.
// Token rows of this call: key[row] = 10*row.
//   r0: c=1, n=5 -> rows 0..4, end 6, have 1, first 1, align 1, full 2
//       ring_close: pool 0 = {ring[slot2][0] = 100, row 0 = 0} -> 50
//       compress:   pool 1 = rows 1,2 -> 15; pool 2 = rows 3,4 -> 35
//       seed_tail:  the last R = 2 positions: max(1, 6 - 2) = 4 -> pos 4, 5 =
//                   rows 3, 4 -> ring[slot2][0] = 30, ring[slot2][1] = 40
//   r1: c=0, n=0 -> nothing anywhere (closed -1)
//   r2: c=3, n=2 -> rows 5,6, end 5, have 1, first 2, full max(0, 2-2) = 0
//       ring_close: pool 1 = {ring[slot1][0] = 7, row 5 = 50} -> 28.5
//       seed_tail:  max(3, 5 - 2) = 3 -> pos 3 = row 5 -> ring[slot1][1] = 50,
//                   pos 4 = row 6 -> ring[slot1][0] = 60
//   r3: dead (num_requests = 3), rows 7,8, slot 3: untouched
static void test_general_step_example() {
  const int K = 2, D = 1;
  Matrix ape(K, D, 0.0);
  Matrix key(9, D), gate(9, D, 0.0);
  for (int i = 0; i < 9; ++i) key.at(i, 0) = 10.0 * i;
  Batch b;
  b.row_offsets = {0, 5, 5, 7, 9};
  b.cache_lengths = {1, 0, 3, 0};
  b.slot_idx = {2, 0, 1, 3};
  b.num_requests = 3;
  Ring ring(4, K, D);
  ring.at(2, 0, 0, 0) = 100.0;
  ring.at(1, 0, 0, 0) = 7.0;
  ring.at(3, 0, 0, 0) = -1.0;
  ring.at(3, 0, 1, 0) = -2.0;

  RingCloseOut rc = ring_close(key, gate, ape, b, ring);
  CHECK_EQ(rc.closed_pool[0], 0);
  CHECK_EQ(rc.pooled.at(0, 0), 50.0);
  CHECK_EQ(rc.scale.at(0, 0), 50.0);
  CHECK_EQ(rc.closed_pool[1], -1);
  CHECK(std::isnan(rc.pooled.at(1, 0)));
  CHECK_EQ(rc.closed_pool[2], 1);
  CHECK_EQ(rc.pooled.at(2, 0), 28.5);
  CHECK_EQ(rc.closed_pool[3], kUntouched);
  CHECK(std::isnan(rc.pooled.at(3, 0)));

  CompressOut co = compress(key, gate, ape, b);
  CHECK(co.pool_row_offsets == (std::vector<std::uint32_t>{0, 2, 2, 2, 2}));
  CHECK_EQ(co.pooled.rows, 2);
  CHECK_EQ(co.pooled.at(0, 0), 15.0);
  CHECK_EQ(co.pooled.at(1, 0), 35.0);
  CHECK_EQ(co.pool_id[0], 1);
  CHECK_EQ(co.pool_id[1], 2);
  CHECK_EQ(co.request[0], 0);
  CHECK_EQ(co.request[1], 0);

  Ring before = ring;
  seed_tail(key, gate, b, ring);
  CHECK_EQ(ring.at(2, 0, 0, 0), 30.0);
  CHECK_EQ(ring.at(2, 0, 1, 0), 40.0);
  CHECK_EQ(ring.at(1, 0, 0, 0), 60.0);
  CHECK_EQ(ring.at(1, 0, 1, 0), 50.0);
  CHECK_EQ(ring.at(1, 1, 0, 0), 0.0);
  for (int slot : {1, 2})
    for (int i = 0; i < 2; ++i) ring.at(slot, 0, i, 0) = before.at(slot, 0, i, 0);
  CHECK(ring.data == before.data);  // nothing else written (slot 3 of the dead row included)

  // Only a dead row would produce pools: nothing is produced.
  Batch dead = b;
  dead.num_requests = 0;
  CompressOut co0 = compress(key, gate, ape, dead);
  CHECK(co0.pool_row_offsets == (std::vector<std::uint32_t>{0, 0, 0, 0, 0}));
  CHECK_EQ(co0.pooled.rows, 0);

  // n < K - have: K = 4, c = 1, n = 2 -> no close, no compress, seed pos 1,2.
  {
    Matrix ape4(4, 1, 0.0);
    Matrix k2 = mat(2, 1, {3.0, 4.0}), g2(2, 1, 0.0);
    Batch s;
    s.row_offsets = {0, 2};
    s.cache_lengths = {1};
    s.slot_idx = {0};
    s.num_requests = 1;
    Ring r4(1, 4, 1);
    CHECK_EQ(ring_close(k2, g2, ape4, s, r4).closed_pool[0], -1);
    CHECK_EQ(compress(k2, g2, ape4, s).pooled.rows, 0);
    seed_tail(k2, g2, s, r4);
    CHECK_EQ(r4.at(0, 0, 0, 0), 0.0);
    CHECK_EQ(r4.at(0, 0, 1, 0), 3.0);
    CHECK_EQ(r4.at(0, 0, 2, 0), 4.0);
    CHECK_EQ(r4.at(0, 0, 3, 0), 0.0);
  }
}

// A 2-token K = 2 sequence, keys {2, 6}, gates {0, ln 3}: pool 0 = 2/4 + 18/4 = 5.
// Fed one token at a time through the general step and through tail_update,
// and all at once through compress / one_shot: all four agree.
static void test_two_token_sequence() {
  const int K = 2, D = 1;
  Matrix ape(K, D, 0.0);
  Matrix key = mat(2, 1, {2.0, 6.0});
  Matrix gate = mat(2, 1, {0.0, std::log(3.0)});
  const double want = one_shot(key, gate, ape).at(0, 0);
  CHECK_NEAR(want, 5.0, 1e-14);
  CHECK_EQ(one_shot(key, gate, ape).rows, 1);

  // General step, token 0 then token 1.
  {
    Ring ring(1, K, D);
    Batch s;
    s.row_offsets = {0, 1};
    s.cache_lengths = {0};
    s.slot_idx = {0};
    s.num_requests = 1;
    Matrix k0 = mat(1, 1, {2.0}), g0 = mat(1, 1, {0.0});
    CHECK_EQ(ring_close(k0, g0, ape, s, ring).closed_pool[0], -1);  // have = 0
    CHECK_EQ(compress(k0, g0, ape, s).pooled.rows, 0);                // full = 0
    seed_tail(k0, g0, s, ring);                                       // pos 0 -> idx 0
    CHECK_EQ(ring.at(0, 0, 0, 0), 2.0);
    s.cache_lengths = {1};
    Matrix k1 = mat(1, 1, {6.0}), g1 = mat(1, 1, {std::log(3.0)});
    RingCloseOut rc = ring_close(k1, g1, ape, s, ring);  // have 1, 1 + 1 >= 2
    CHECK_EQ(rc.closed_pool[0], 0);
    CHECK_EQ(rc.pooled.at(0, 0), want);
    CHECK_EQ(compress(k1, g1, ape, s).pooled.rows, 0);  // first 1, floor(2/2) - 1 = 0
    seed_tail(k1, g1, s, ring);  // the last R = 2 positions: max(1, 0) = 1 -> pos 1
    CHECK_EQ(ring.at(0, 0, 0, 0), 2.0);
    CHECK_EQ(ring.at(0, 0, 1, 0), 6.0);
    CHECK_EQ(ring.at(0, 1, 1, 0), std::log(3.0));
  }
  // tail_update, next_n = 1 twice.
  {
    Ring ring(1, K, D);
    std::vector<std::uint32_t> slots{0};
    Matrix k0 = mat(1, 1, {2.0}), g0 = mat(1, 1, {0.0});
    TailUpdateOut t0 = tail_update(1, k0, g0, ape, {0}, slots, 1, ring);
    CHECK_EQ(t0.M, 1);
    CHECK_EQ(t0.closed_pool[0], -1);
    Matrix k1 = mat(1, 1, {6.0}), g1 = mat(1, 1, {std::log(3.0)});
    TailUpdateOut t1 = tail_update(1, k1, g1, ape, {1}, slots, 1, ring);
    CHECK_EQ(t1.closed_pool[0], 0);
    CHECK_EQ(t1.pooled[0], want);
  }
  // Whole sequence in one compress.
  {
    Batch s;
    s.row_offsets = {0, 2};
    s.cache_lengths = {0};
    s.num_requests = 1;
    CompressOut co = compress(key, gate, ape, s);
    CHECK_EQ(co.pooled.rows, 1);
    CHECK_EQ(co.pooled.at(0, 0), want);
    CHECK_EQ(co.pool_id[0], 0);
  }
}

// tail_update, K = 2, next_n = 3 (M = 2), D = 1, gates/ape 0 (pool = mean).
//   r0 slot 0, ring idx 0 holds pos 0 (value 1); positions {1,2,3}, keys {3,5,9}
//      pos 1 -> idx 1, closes pool 0 = (1 + 3)/2 = 2
//      pos 2 -> idx 0; pos 3 -> idx 1, closes pool 1 = (5 + 9)/2 = 7
//   r1 slot 1: positions {4, -1, -1}, key 11 -> stashed at idx 0, nothing closes
//   r2 dead, slot 2: would close, but untouched
static void test_tail_update_example() {
  const int K = 2, D = 1;
  Matrix ape(K, D, 0.0);
  Matrix key = mat(9, 1, {3, 5, 9, 11, 12, 13, 20, 21, 22});
  Matrix gate(9, 1, 0.0);
  Ring ring(3, K, D);
  ring.at(0, 0, 0, 0) = 1.0;
  ring.at(2, 0, 0, 0) = -5.0;
  std::vector<std::int32_t> pos{1, 2, 3, 4, -1, -1, 0, 1, -1};
  std::vector<std::uint32_t> slots{0, 1, 2};
  Ring before = ring;
  TailUpdateOut t = tail_update(3, key, gate, ape, pos, slots, 2, ring);
  CHECK_EQ(t.M, 2);
  CHECK(t.closed_pool == (std::vector<std::int32_t>{0, 1, -1, -1, kUntouched, kUntouched}));
  CHECK_EQ(t.pooled[0], 2.0);
  CHECK_EQ(t.pooled[1], 7.0);
  CHECK(std::isnan(t.pooled[2]) && std::isnan(t.pooled[3]));
  CHECK(std::isnan(t.pooled[4]) && std::isnan(t.pooled[5]));
  CHECK_EQ(ring.at(0, 0, 0, 0), 5.0);
  CHECK_EQ(ring.at(0, 0, 1, 0), 9.0);
  CHECK_EQ(ring.at(1, 0, 0, 0), 11.0);
  CHECK_EQ(ring.at(1, 0, 1, 0), 0.0);
  CHECK_EQ(ring.at(2, 0, 0, 0), before.at(2, 0, 0, 0));
  CHECK_EQ(ring.at(2, 0, 1, 0), before.at(2, 0, 1, 0));

  // K = 1: every token closes its own pool; M = next_n.
  Matrix ape1(1, 1, 0.0);
  Ring r1(1, 1, 1);
  TailUpdateOut t1 = tail_update(2, mat(2, 1, {4.0, 8.0}), Matrix(2, 1, 0.0), ape1, {6, 7}, {0}, 1, r1);
  CHECK_EQ(t1.M, 2);
  CHECK(t1.closed_pool == (std::vector<std::int32_t>{6, 7}));
  CHECK_EQ(t1.pooled[0], 4.0);
  CHECK_EQ(t1.pooled[1], 8.0);
}

// expand_topk, K = 2, pool_topk = 2, tail_always -> width 2*2 + 1 = 5.
//   request 0: c = 3, rows 0,1; request 1 dead (row 2).
//   row 0: i 0, visible 4, ids {1, 2}:  pool 1 -> {2,3} ((1+1)*2 = 4 <= 4);
//          pool 2 -> -1,-1 (6 > 4); tail: 4 % 2 = 0 -> -1.   => {2,3,-1,-1,-1}
//   row 1: i 1, visible 5, ids {-1, 0}: {-1,-1, 0,1}; tail j=0 < 1 -> 5-1+0 = 4
//                                                            => {-1,-1,0,1,4}
//   row 2: dead, keeps its prior 99s.
// A ring longer than K: K = 2, R = 4, D = 1, gates and ape 0 (pool = mean),
// one slot. Positions map to ring index pos % 4.
//   seed_tail, c = 0, n = 7 (keys 10 * pos): the last 4 positions 3..6 ->
//     idx 3, 0, 1, 2 hold 30, 40, 50, 60; nothing else.
//   ring_close, c = 5 (have 1, pool 2 = positions 4, 5), row key 99:
//     member 0 from idx (2*2 + 0) % 4 = 0 (40), member 1 the row -> 69.5
//   tail_update, positions {7, 8, 9}, keys {1, 2, 3}: 7 -> idx 3, closes
//     pool 3 from idx 2, 3 = {60, 1} -> 30.5; 8 -> idx 0; 9 -> idx 1,
//     closes pool 4 from idx 0, 1 = {2, 3} -> 2.5
//   rewind: tail_update, positions {8, 9} with keys {20, 30} re-sends 8, 9:
//     pool 4 again from idx 0, 1 -> 25
static void test_long_ring_example() {
  const int K = 2, D = 1, R = 4;
  Matrix ape(K, D, 0.0);
  Ring ring(1, K, D, R);
  CHECK_EQ(ring.R, 4);
  CHECK_EQ(serving_ring_length(4, 0), 4);
  CHECK_EQ(serving_ring_length(4, 1), 8);   // ceil(5/4) = 2 -> 2 pools
  CHECK_EQ(serving_ring_length(4, 3), 8);   // ceil(7/4) = 2
  CHECK_EQ(serving_ring_length(4, 5), 16);  // ceil(9/4) = 3 -> 4 pools
  CHECK_EQ(serving_ring_length(4, 7), 16);
  CHECK_EQ(serving_ring_length(1, 3), 4);
  CHECK_EQ(serving_ring_length(3, 1), 6);
  Matrix key(7, D), gate(7, D, 0.0);
  for (int i = 0; i < 7; ++i) key.at(i, 0) = 10.0 * i;
  Batch s;
  s.row_offsets = {0, 7};
  s.cache_lengths = {0};
  s.slot_idx = {0};
  s.num_requests = 1;
  seed_tail(key, gate, s, ring);
  CHECK(ring.data == (std::vector<double>{40, 50, 60, 30, 0, 0, 0, 0}));

  Batch c5 = s;
  c5.row_offsets = {0, 1};
  c5.cache_lengths = {5};
  RingCloseOut rc = ring_close(mat(1, 1, {99.0}), Matrix(1, 1, 0.0), ape, c5, ring);
  CHECK_EQ(rc.closed_pool[0], 2);
  CHECK_EQ(rc.pooled.at(0, 0), 69.5);

  TailUpdateOut t = tail_update(3, mat(3, 1, {1, 2, 3}), Matrix(3, 1, 0.0), ape, {7, 8, 9},
                                {0}, 1, ring);
  CHECK(t.closed_pool == (std::vector<std::int32_t>{3, 4}));
  CHECK_EQ(t.pooled[0], 30.5);
  CHECK_EQ(t.pooled[1], 2.5);
  TailUpdateOut again = tail_update(2, mat(2, 1, {20, 30}), Matrix(2, 1, 0.0), ape, {8, 9},
                                    {0}, 1, ring);
  CHECK(again.closed_pool == (std::vector<std::int32_t>{4}));
  CHECK_EQ(again.pooled[0], 25.0);
}

// The #58454 scenario, K = 4, D = 1, gates and ape 0 (pool = mean), keys
// numbered by sending: positions 0..5 one per call (keys 0..5), a verify
// call [6, 7, 8, 9] (keys 6, 7, 8, 9: the next token and drafts 7..9), then
// the re-send [7, 8, 9, 10] (keys 107, 108, 109, 110). Pool 1 = positions
// 4..7 is emitted by the verify (from draft 7) and again by the re-send:
// (4 + 5 + 6 + 107) / 4 = 30.5. With R = K = 4 the drafts 8 and 9 went to
// ring indices 0 and 1, over positions 4 and 5, so the re-sent pool reads
// (8 + 9 + 6 + 107) / 4 = 32.5 instead. With R = 8 (serving_ring_length(4,
// 3)) it is right.
static void test_rewind_needs_the_ring() {
  const int K = 4, D = 1;
  Matrix ape(K, D, 0.0);
  for (int R : {4, 8}) {
    Ring ring(1, K, D, R);
    for (int pos = 0; pos < 6; ++pos)
      tail_update(1, mat(1, 1, {double(pos)}), Matrix(1, 1, 0.0), ape, {pos}, {0}, 1, ring);
    TailUpdateOut v = tail_update(4, mat(4, 1, {6, 7, 8, 9}), Matrix(4, 1, 0.0), ape,
                                  {6, 7, 8, 9}, {0}, 1, ring);
    CHECK(v.closed_pool == (std::vector<std::int32_t>{1}));
    CHECK_EQ(v.pooled[0], 5.5);  // (4 + 5 + 6 + 7) / 4, draft 7's value
    // The re-send through the general step: c = 7, rows 107..110.
    Batch b;
    b.row_offsets = {0, 4};
    b.cache_lengths = {7};
    b.slot_idx = {0};
    b.num_requests = 1;
    Matrix k = mat(4, 1, {107, 108, 109, 110});
    RingCloseOut rc = ring_close(k, Matrix(4, 1, 0.0), ape, b, ring);
    CHECK_EQ(rc.closed_pool[0], 1);
    CHECK_EQ(rc.pooled.at(0, 0), R == 4 ? 32.5 : 30.5);
  }
}

static void test_expand_topk_example() {
  Batch b;
  b.row_offsets = {0, 2, 3};
  b.cache_lengths = {3, 0};
  b.num_requests = 1;
  std::vector<std::int32_t> ids{1, 2, -1, 0, 0, 0};
  std::vector<std::int32_t> out(15, 99);
  expand_topk(2, ids, 2, b, true, out);
  CHECK(out == (std::vector<std::int32_t>{2, 3, -1, -1, -1,
                                          -1, -1, 0, 1, 4,
                                          99, 99, 99, 99, 99}));
  std::vector<std::int32_t> out2(12, 99);
  expand_topk(2, ids, 2, b, false, out2);
  CHECK(out2 == (std::vector<std::int32_t>{2, 3, -1, -1,
                                           -1, -1, 0, 1,
                                           99, 99, 99, 99}));
  // Garbage ids never become indices, and (pid+1)*K does not overflow.
  b.num_requests = 2;
  std::vector<std::int32_t> big{2147483647, -7, 5, 1, 0, 0};
  b.cache_lengths = {100, 1};
  std::vector<std::int32_t> out3(12, 99);
  expand_topk(2, big, 2, b, false, out3);
  // row 0: visible 101: INT_MAX -> -1,-1; -7 -> -1,-1
  // row 1: visible 102: pool 5 -> 10,11; pool 1 -> 2,3
  // row 2 (request 1, c 1, i 0): visible 2: pool 0 twice -> 0,1,0,1
  CHECK(out3 == (std::vector<std::int32_t>{-1, -1, -1, -1, 10, 11, 2, 3, 0, 1, 0, 1}));
  // K = 4, tail only (pool_topk = 0): visible 7 -> tail {4, 5, 6}; visible 8 -> all -1
  Batch t;
  t.row_offsets = {0, 2};
  t.cache_lengths = {6};
  t.num_requests = 1;
  std::vector<std::int32_t> out4;
  expand_topk(4, {}, 0, t, true, out4);
  CHECK(out4 == (std::vector<std::int32_t>{4, 5, 6, -1, -1, -1}));
}

static void test_one_shot() {
  // K = 2, 5 tokens -> 2 pools (token 4 pending), gates/ape 0.
  Matrix ape(2, 2, 0.0);
  Matrix key = mat(5, 2, {1, -1, 3, -3, 5, 10, 7, 20, 100, 100});
  Matrix gate(5, 2, 0.0);
  Matrix p = one_shot(key, gate, ape);
  Matrix s = one_shot_scale(key, gate, ape);
  CHECK_EQ(p.rows, 2);
  CHECK_EQ(p.cols, 2);
  CHECK_EQ(p.at(0, 0), 2.0);
  CHECK_EQ(p.at(0, 1), -2.0);
  CHECK_EQ(p.at(1, 0), 6.0);
  CHECK_EQ(p.at(1, 1), 15.0);
  CHECK_EQ(s.at(0, 1), 2.0);
}

// Streaming invariance of the reference with itself: random sequences fed in
// random chunks (general step) mixed with decode steps (tail_update, padded),
// batch rows shuffled each call, a dead row appended. Every pool must be
// produced exactly once and equal (bitwise: same inputs, same order) the
// one-shot pool.
static void test_streaming_invariance() {
  std::mt19937 rng(1234);
  const int Ks[] = {1, 2, 3, 4, 8};
  int mismatches = 0, duplicates = 0, missing = 0, checked = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int K = Ks[trial % 5];
    const int D = 1 + trial % 4;
    const int S = 3;
    std::uniform_real_distribution<double> U(-2.0, 2.0);
    Matrix ape(K, D);
    for (double& x : ape.v) x = U(rng);
    std::vector<int> L(S);
    std::vector<Matrix> key(S), gate(S);
    for (int s = 0; s < S; ++s) {
      L[s] = static_cast<int>(rng() % (6 * K + 5));
      key[s] = Matrix(L[s], D);
      gate[s] = Matrix(L[s], D);
      for (double& x : key[s].v) x = U(rng);
      for (double& x : gate[s].v) x = U(rng);
    }
    std::vector<int> fed(S, 0);
    std::vector<std::uint32_t> slot_of{4, 1, 2};  // sequence s lives in slot_of[s]
    Ring ring(5, K, D);
    for (double& x : ring.data) x = 1e9;  // garbage must never be read
    std::vector<std::map<std::int64_t, std::vector<double>>> got(S);
    auto record = [&](int s, std::int64_t p, const double* v) {
      if (got[s].count(p)) ++duplicates;
      got[s][p] = std::vector<double>(v, v + D);
    };
    auto all_done = [&] {
      for (int s = 0; s < S; ++s)
        if (fed[s] < L[s]) return false;
      return true;
    };
    int guard = 0;
    while (!all_done() && guard++ < 1000) {
      std::vector<int> order{0, 1, 2};
      std::shuffle(order.begin(), order.end(), rng);
      if (rng() % 3 != 0) {
        // general step
        Batch b;
        b.row_offsets = {0};
        std::vector<int> take;
        for (int s : order) {
          int n = static_cast<int>(rng() % (2 * K + 3));
          n = std::min(n, L[s] - fed[s]);
          take.push_back(n);
          b.row_offsets.push_back(b.row_offsets.back() + n);
          b.cache_lengths.push_back(fed[s]);
          b.slot_idx.push_back(slot_of[s]);
        }
        // dead row with tokens and the spare slot 0
        b.row_offsets.push_back(b.row_offsets.back() + 3);
        b.cache_lengths.push_back(1);
        b.slot_idx.push_back(0);
        b.num_requests = S;
        const int T = static_cast<int>(b.row_offsets.back());
        Matrix k(T, D, 1e9), g(T, D, 1e9);
        for (int r = 0; r < S; ++r) {
          const int s = order[r];
          for (int i = 0; i < take[r]; ++i)
            for (int c = 0; c < D; ++c) {
              k.at(b.row_offsets[r] + i, c) = key[s].at(fed[s] + i, c);
              g.at(b.row_offsets[r] + i, c) = gate[s].at(fed[s] + i, c);
            }
        }
        RingCloseOut rc = ring_close(k, g, ape, b, ring);
        CompressOut co = compress(k, g, ape, b);
        seed_tail(k, g, b, ring);
        for (int r = 0; r < S; ++r)
          if (rc.closed_pool[r] >= 0) record(order[r], rc.closed_pool[r], rc.pooled.row(r));
        if (rc.closed_pool[S] != kUntouched) ++mismatches;
        for (int o = 0; o < co.pooled.rows; ++o)
          record(order[co.request[o]], co.pool_id[o], co.pooled.row(o));
        for (int r = 0; r < S; ++r) fed[order[r]] += take[r];
      } else {
        // decode step: up to next_n real tokens per row, padding interleaved
        const int next_n = 1 + static_cast<int>(rng() % (2 * K));
        const int B = S + 1;
        Matrix k(B * next_n, D, 1e9), g(B * next_n, D, 1e9);
        std::vector<std::int32_t> pos(B * next_n, -1);
        std::vector<std::uint32_t> slots;
        std::vector<int> take;
        for (int r = 0; r < S; ++r) {
          const int s = order[r];
          slots.push_back(slot_of[s]);
          int n = std::min(static_cast<int>(rng() % (next_n + 1)), L[s] - fed[s]);
          take.push_back(n);
          // choose which of the next_n entries are real, keep order
          std::vector<int> idx(next_n);
          for (int i = 0; i < next_n; ++i) idx[i] = i;
          std::shuffle(idx.begin(), idx.end(), rng);
          idx.resize(n);
          std::sort(idx.begin(), idx.end());
          for (int t = 0; t < n; ++t) {
            const int row = r * next_n + idx[t];
            pos[row] = fed[s] + t;
            for (int c = 0; c < D; ++c) {
              k.at(row, c) = key[s].at(fed[s] + t, c);
              g.at(row, c) = gate[s].at(fed[s] + t, c);
            }
          }
        }
        slots.push_back(0);
        for (int i = 0; i < next_n; ++i) pos[S * next_n + i] = i;  // dead row
        TailUpdateOut tu = tail_update(next_n, k, g, ape, pos, slots, S, ring);
        for (int r = 0; r < S; ++r)
          for (int j = 0; j < tu.M; ++j) {
            const std::int32_t p = tu.closed_pool[static_cast<std::size_t>(r) * tu.M + j];
            if (p >= 0) record(order[r], p, tu.pooled.data() + (static_cast<std::size_t>(r) * tu.M + j) * D);
          }
        for (int j = 0; j < tu.M; ++j)
          if (tu.closed_pool[static_cast<std::size_t>(S) * tu.M + j] != kUntouched) ++mismatches;
        for (int r = 0; r < S; ++r) fed[order[r]] += take[r];
      }
    }
    for (int s = 0; s < S; ++s) {
      Matrix want = one_shot(key[s], gate[s], ape);
      if (static_cast<int>(got[s].size()) != want.rows) ++missing;
      for (int p = 0; p < want.rows; ++p) {
        auto it = got[s].find(p);
        if (it == got[s].end()) continue;
        ++checked;
        for (int c = 0; c < D; ++c)
          if (it->second[c] != want.at(p, c)) ++mismatches;
      }
    }
  }
  CHECK_EQ(mismatches, 0);
  CHECK_EQ(duplicates, 0);
  CHECK_EQ(missing, 0);
  CHECK(checked > 200);
}

int main() {
  test_bf16();
  test_f16();
  test_round_to_and_ulp();
  test_pool();
  test_general_step_example();
  test_two_token_sequence();
  test_tail_update_example();
  test_long_ring_example();
  test_rewind_needs_the_ring();
  test_expand_topk_example();
  test_one_shot();
  test_streaming_invariance();
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail == 0 ? 0 : 1;
}
