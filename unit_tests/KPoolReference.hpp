// KPoolReference.hpp: an independent, serial host reference for the k-pool
// writers, written from the contract alone (docs/pools.md, docs/writers.md,
// docs/ring.md; no code shared with src/). Plain C++17, standard library
// only, all arithmetic in double.
//
// Conventions:
//  * Inputs (key, gate, ring) are the values *as stored*: callers round them
//    into the storage type first (round_to / round_all) so the reference sees
//    exactly what the library reads. The reference itself never rounds its
//    outputs; tests compare the library against it with a tolerance
//    (ulp() for 16-bit types, relative 1e-5 for f32, using the `scale`
//    outputs as the magnitude).
//  * "Not written" outputs are marked: pooled/scale rows with NaN, int ids
//    with INT32_MIN (kUntouched) for rows past num_requests.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace KPoolRef {

enum class DType { f32, f64, bf16, f16 };

inline const char* name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
  }
  return "?";
}

// Marker for outputs the contract says must not be touched.
constexpr std::int32_t kUntouched = std::numeric_limits<std::int32_t>::min();

inline double nan_value() { return std::numeric_limits<double>::quiet_NaN(); }

inline void require(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("KPoolRef: ") + what);
}

// ---------------------------------------------------------------------------
// Storage-type rounding
// ---------------------------------------------------------------------------
namespace detail {

// A binary floating-point format with `mant` stored fraction bits and an
// exponent field of `exp_bits` bits (IEEE layout, sign | exponent | fraction).
struct Format {
  int exp_bits;
  int mant;
  int bias() const { return (1 << (exp_bits - 1)) - 1; }
  int emin() const { return 1 - bias(); }  // exponent of the smallest normal
  int emax() const { return bias(); }      // exponent of the largest finite
  std::uint32_t exp_mask() const { return (1u << exp_bits) - 1u; }
};

constexpr Format kBF16{8, 7};
constexpr Format kF16{5, 10};

// Round the non-negative integer-plus-fraction q to an integer, ties to even.
// q is computed exactly (a power-of-two scaling of a double), so floor/compare
// are exact.
inline double round_half_even(double q) {
  double fl = std::floor(q);
  double frac = q - fl;  // exact
  if (frac > 0.5) return fl + 1.0;
  if (frac < 0.5) return fl;
  // exact tie: pick the even neighbour
  return (std::fmod(fl, 2.0) == 0.0) ? fl : fl + 1.0;
}

// Encode the exact value of x (a double) into format f, round-to-nearest-even.
// Works on the real value: find the exponent of |x|, the quantum (spacing) of
// the format at that exponent, and round |x| / quantum to an integer.
inline std::uint32_t encode(Format f, double x) {
  const std::uint32_t sign = std::signbit(x) ? 1u : 0u;
  const std::uint32_t sign_bit = sign << (f.exp_bits + f.mant);
  const std::uint32_t inf_bits = sign_bit | (f.exp_mask() << f.mant);
  if (std::isnan(x)) {
    // quiet NaN: all-ones exponent, top fraction bit set
    return sign_bit | (f.exp_mask() << f.mant) | (1u << (f.mant - 1));
  }
  const double a = std::fabs(x);
  if (std::isinf(a)) return inf_bits;
  if (a == 0.0) return sign_bit;

  int e2 = 0;
  std::frexp(a, &e2);  // a = fr * 2^e2, fr in [0.5, 1)
  int e = e2 - 1;      // a in [2^e, 2^(e+1))
  if (e < f.emin()) {
    // subnormal range: fixed quantum 2^(emin - mant)
    const double q = round_half_even(std::ldexp(a, f.mant - f.emin()));
    // q <= 2^mant; q == 2^mant encodes the smallest normal, which is exactly
    // what the bit pattern (exponent field 1, fraction 0) means.
    return sign_bit | static_cast<std::uint32_t>(q);
  }
  double q = round_half_even(std::ldexp(a, f.mant - e));  // in [2^mant, 2^(mant+1)]
  if (q == std::ldexp(1.0, f.mant + 1)) {  // rounded up to the next binade
    q = std::ldexp(1.0, f.mant);
    e += 1;
  }
  if (e > f.emax()) return inf_bits;  // overflow (with unbounded exponent it
                                      // would round past the largest finite)
  const std::uint32_t field = static_cast<std::uint32_t>(e + f.bias());
  const std::uint32_t frac = static_cast<std::uint32_t>(q) - (1u << f.mant);
  return sign_bit | (field << f.mant) | frac;
}

inline double decode(Format f, std::uint32_t bits) {
  const bool neg = (bits >> (f.exp_bits + f.mant)) & 1u;
  const std::uint32_t field = (bits >> f.mant) & f.exp_mask();
  const std::uint32_t frac = bits & ((1u << f.mant) - 1u);
  double mag;
  if (field == f.exp_mask()) {
    mag = frac ? std::numeric_limits<double>::quiet_NaN()
               : std::numeric_limits<double>::infinity();
  } else if (field == 0) {
    mag = std::ldexp(static_cast<double>(frac), f.emin() - f.mant);
  } else {
    mag = std::ldexp(static_cast<double>(frac + (1u << f.mant)),
                     static_cast<int>(field) - f.bias() - f.mant);
  }
  return neg ? -mag : mag;
}

}  // namespace detail

inline std::uint16_t bf16_bits(float x) {
  return static_cast<std::uint16_t>(detail::encode(detail::kBF16, static_cast<double>(x)));
}
inline float bf16_value(std::uint16_t bits) {
  return static_cast<float>(detail::decode(detail::kBF16, bits));  // exact
}
inline std::uint16_t f16_bits(float x) {
  return static_cast<std::uint16_t>(detail::encode(detail::kF16, static_cast<double>(x)));
}
inline float f16_value(std::uint16_t bits) {
  return static_cast<float>(detail::decode(detail::kF16, bits));  // exact
}

// The value x becomes once stored in t. 16-bit types go through f32 first
// (the library computes in f32), then are rounded once more.
inline double round_to(DType t, double x) {
  switch (t) {
    case DType::f64: return x;
    case DType::f32: return static_cast<double>(static_cast<float>(x));
    case DType::bf16: return static_cast<double>(bf16_value(bf16_bits(static_cast<float>(x))));
    case DType::f16: return static_cast<double>(f16_value(f16_bits(static_cast<float>(x))));
  }
  return x;
}

// Precision p (significand bits including the implicit one) and smallest
// normal exponent of each storage type.
inline int precision(DType t) {
  switch (t) {
    case DType::f64: return 53;
    case DType::f32: return 24;
    case DType::bf16: return 8;
    case DType::f16: return 11;
  }
  return 53;
}
inline int min_normal_exponent(DType t) {
  switch (t) {
    case DType::f64: return -1022;
    case DType::f32: return -126;
    case DType::bf16: return -126;
    case DType::f16: return -14;
  }
  return -1022;
}

// Spacing of t's representable numbers at magnitude |x|: 2^(e - p + 1) for
// |x| in [2^e, 2^(e+1)) (the spacing just above a power of two), the subnormal
// spacing 2^(emin - p + 1) below the smallest normal. inf -> inf, NaN -> NaN.
inline double ulp(DType t, double x) {
  const double a = std::fabs(x);
  if (std::isnan(a) || std::isinf(a)) return a;
  const int p = precision(t);
  const int emin = min_normal_exponent(t);
  if (a < std::ldexp(1.0, emin)) return std::ldexp(1.0, emin - p + 1);
  int e2 = 0;
  std::frexp(a, &e2);
  return std::ldexp(1.0, (e2 - 1) - p + 1);
}

// ---------------------------------------------------------------------------
// Containers
// ---------------------------------------------------------------------------
struct Matrix {
  int rows = 0, cols = 0;
  std::vector<double> v;
  Matrix() = default;
  Matrix(int r, int c, double fill = 0.0)
      : rows(r), cols(c), v(static_cast<std::size_t>(r) * static_cast<std::size_t>(c), fill) {}
  double& at(int r, int c) { return v[static_cast<std::size_t>(r) * cols + c]; }
  double at(int r, int c) const { return v[static_cast<std::size_t>(r) * cols + c]; }
  const double* row(int r) const { return v.data() + static_cast<std::size_t>(r) * cols; }
  double* row(int r) { return v.data() + static_cast<std::size_t>(r) * cols; }
};

// Round every element of m as if stored in t.
inline void round_all(DType t, Matrix& m) {
  for (double& x : m.v) x = round_to(t, x);
}
inline void round_all(DType t, std::vector<double>& v) {
  for (double& x : v) x = round_to(t, x);
}

struct Batch {
  std::vector<std::uint32_t> row_offsets;    // [B+1]
  std::vector<std::uint32_t> cache_lengths;  // [B]
  std::vector<std::uint32_t> slot_idx;       // [B] (may be empty for compress/expand)
  int num_requests = 0;
};

// B, checked against the arrays and num_requests.
inline int batch_size(const Batch& b) {
  require(!b.row_offsets.empty(), "row_offsets must have B+1 entries");
  const int B = static_cast<int>(b.row_offsets.size()) - 1;
  require(static_cast<int>(b.cache_lengths.size()) == B, "cache_lengths must have B entries");
  require(b.num_requests >= 0 && b.num_requests <= B, "num_requests must be in [0, B]");
  require(b.row_offsets[0] == 0, "row_offsets must start at 0");
  for (int r = 0; r < B; ++r)
    require(b.row_offsets[r] <= b.row_offsets[r + 1], "row_offsets must be non-decreasing");
  return B;
}

// The ring: data[((slot*2 + which)*R + i)*D + c]; which 0 = keys, 1 = gates;
// position pos lives at ring index i = pos % R. R, the ring length, is a
// multiple of K and at least K ("The ring"); R = K unless given.
struct Ring {
  int max_slots = 0, K = 0, D = 0, R = 0;
  std::vector<double> data;
  Ring(int max_slots_, int K_, int D_) : Ring(max_slots_, K_, D_, K_) {}
  Ring(int max_slots_, int K_, int D_, int R_)
      : max_slots(max_slots_), K(K_), D(D_), R(R_),
        data(static_cast<std::size_t>(max_slots_) * 2 * R_ * D_, 0.0) {
    require(K_ >= 1 && R_ >= K_ && R_ % K_ == 0,
            "the ring length must be a multiple of K, at least K");
  }
  std::size_t index(int slot, int which, int i, int c) const {
    return ((static_cast<std::size_t>(slot) * 2 + which) * R + i) * D + c;
  }
  // The ring index of absolute position pos.
  int of(std::int64_t pos) const { return static_cast<int>(pos % R); }
  double& at(int slot, int which, int i, int c) { return data[index(slot, which, i, c)]; }
  double at(int slot, int which, int i, int c) const { return data[index(slot, which, i, c)]; }
};

// R = K * next_pow2(ceil((K + S) / K)): the ring length serving engines use
// for S draft tokens a step ("Oracle properties" 4).
inline int serving_ring_length(int K, int S) {
  int pools = (K + S + K - 1) / K;
  int p2 = 1;
  while (p2 < pools) p2 *= 2;
  return K * p2;
}

// ---------------------------------------------------------------------------
// One pool
// ---------------------------------------------------------------------------
// Per channel c: logit[m] = gate[m][c] + ape[m][c]; w = softmax over m with
// the maximum subtracted; out[c] = sum_m w[m] * key[m][c];
// scale[c] = sum_m w[m] * |key[m][c]| (magnitude for relative tolerances).
inline void pool_with_scale(const Matrix& ape, const std::vector<const double*>& keys,
                            const std::vector<const double*>& gates, double* out, double* scale) {
  const int K = ape.rows;
  const int D = ape.cols;
  require(static_cast<int>(keys.size()) == K && static_cast<int>(gates.size()) == K,
          "pool needs exactly K key and K gate rows");
  std::vector<double> logit(K), w(K);
  for (int c = 0; c < D; ++c) {
    double mx = -std::numeric_limits<double>::infinity();
    for (int m = 0; m < K; ++m) {
      logit[m] = gates[m][c] + ape.at(m, c);
      if (logit[m] > mx) mx = logit[m];
    }
    double sum = 0.0;
    for (int m = 0; m < K; ++m) {
      w[m] = std::exp(logit[m] - mx);
      sum += w[m];
    }
    double acc = 0.0, mag = 0.0;
    for (int m = 0; m < K; ++m) {
      const double wm = w[m] / sum;
      acc += wm * keys[m][c];
      mag += wm * std::fabs(keys[m][c]);
    }
    out[c] = acc;
    if (scale) scale[c] = mag;
  }
}

inline void pool(const Matrix& ape, const std::vector<const double*>& keys,
                 const std::vector<const double*>& gates, double* out) {
  pool_with_scale(ape, keys, gates, out, nullptr);
}

// ---------------------------------------------------------------------------
// compress: every pool made entirely of this call's tokens
// ---------------------------------------------------------------------------
struct CompressOut {
  std::vector<std::uint32_t> pool_row_offsets;  // [B+1]
  Matrix pooled;                                // [total, D]
  Matrix scale;                                 // [total, D]
  std::vector<std::int64_t> pool_id;            // [total]
  std::vector<int> request;                     // [total]
};

// first, align and full of one request (docs/writers.md, "compress").
struct CompressPlan {
  std::int64_t first = 0, align = 0, full = 0;
};
inline CompressPlan compress_plan(std::int64_t K, std::int64_t c, std::int64_t n) {
  CompressPlan p;
  const std::int64_t end = c + n;
  p.first = (c + K - 1) / K;  // ceil(c / K)
  p.align = (K - c % K) % K;
  const std::int64_t f = end / K - p.first;
  p.full = f > 0 ? f : 0;
  return p;
}

inline CompressOut compress(const Matrix& key, const Matrix& gate, const Matrix& ape,
                            const Batch& batch) {
  const int B = batch_size(batch);
  const int K = ape.rows;
  const int D = ape.cols;
  require(K >= 1, "K must be >= 1");
  require(key.cols == D && gate.cols == D, "key/gate must have D columns");
  CompressOut out;
  out.pool_row_offsets.assign(B + 1, 0);
  for (int r = 0; r < B; ++r) {
    std::int64_t full = 0;
    if (r < batch.num_requests) {
      const std::int64_t c = batch.cache_lengths[r];
      const std::int64_t n = std::int64_t(batch.row_offsets[r + 1]) - batch.row_offsets[r];
      full = compress_plan(K, c, n).full;
    }
    out.pool_row_offsets[r + 1] = static_cast<std::uint32_t>(out.pool_row_offsets[r] + full);
  }
  const int total = static_cast<int>(out.pool_row_offsets[B]);
  out.pooled = Matrix(total, D, nan_value());
  out.scale = Matrix(total, D, nan_value());
  out.pool_id.assign(total, -1);
  out.request.assign(total, -1);

  std::vector<const double*> keys(K), gates(K);
  for (int r = 0; r < batch.num_requests; ++r) {
    const std::int64_t c = batch.cache_lengths[r];
    const std::int64_t n = std::int64_t(batch.row_offsets[r + 1]) - batch.row_offsets[r];
    const CompressPlan p = compress_plan(K, c, n);
    for (std::int64_t j = 0; j < p.full; ++j) {
      for (int m = 0; m < K; ++m) {
        const int row = static_cast<int>(batch.row_offsets[r] + p.align + j * K + m);
        require(row < key.rows && row < gate.rows, "compress reads past key/gate");
        keys[m] = key.row(row);
        gates[m] = gate.row(row);
      }
      const int o = static_cast<int>(out.pool_row_offsets[r] + j);
      pool_with_scale(ape, keys, gates, out.pooled.row(o), out.scale.row(o));
      out.pool_id[o] = p.first + j;
      out.request[o] = r;
    }
  }
  return out;
}

// ---------------------------------------------------------------------------
// ring_close: the one pending pool the ring already partly holds
// ---------------------------------------------------------------------------
struct RingCloseOut {
  Matrix pooled;                          // [B, D]; NaN where nothing closes
  Matrix scale;                           // [B, D]; NaN where nothing closes
  std::vector<std::int32_t> closed_pool;  // [B]; -1 none; kUntouched past num_requests
};

inline RingCloseOut ring_close(const Matrix& key, const Matrix& gate, const Matrix& ape,
                               const Batch& batch, const Ring& ring) {
  const int B = batch_size(batch);
  const int K = ape.rows;
  const int D = ape.cols;
  require(K >= 1 && ring.K == K && ring.D == D, "ring shape must match ape");
  require(key.cols == D && gate.cols == D, "key/gate must have D columns");
  require(static_cast<int>(batch.slot_idx.size()) >= batch.num_requests, "slot_idx too short");
  RingCloseOut out;
  out.pooled = Matrix(B, D, nan_value());
  out.scale = Matrix(B, D, nan_value());
  out.closed_pool.assign(B, kUntouched);
  std::vector<const double*> keys(K), gates(K);
  for (int r = 0; r < batch.num_requests; ++r) {
    const std::int64_t c = batch.cache_lengths[r];
    const std::int64_t n = std::int64_t(batch.row_offsets[r + 1]) - batch.row_offsets[r];
    const std::int64_t have = c % K;
    if (have == 0 || have + n < K) {
      out.closed_pool[r] = -1;
      continue;
    }
    const int slot = static_cast<int>(batch.slot_idx[r]);
    require(slot < ring.max_slots, "slot_idx out of range");
    const std::int64_t p = c / K;
    for (int m = 0; m < K; ++m) {
      if (m < have) {
        keys[m] = &ring.data[ring.index(slot, 0, ring.of(p * K + m), 0)];
        gates[m] = &ring.data[ring.index(slot, 1, ring.of(p * K + m), 0)];
      } else {
        const int row = static_cast<int>(batch.row_offsets[r] + (m - have));
        keys[m] = key.row(row);
        gates[m] = gate.row(row);
      }
    }
    pool_with_scale(ape, keys, gates, out.pooled.row(r), out.scale.row(r));
    out.closed_pool[r] = static_cast<std::int32_t>(c / K);
  }
  return out;
}

// ---------------------------------------------------------------------------
// seed_tail: the call's last R positions go into the ring
// ---------------------------------------------------------------------------
inline void seed_tail(const Matrix& key, const Matrix& gate, const Batch& batch, Ring& ring) {
  batch_size(batch);
  const int R = ring.R;
  const int D = ring.D;
  require(key.cols == D && gate.cols == D, "key/gate must have D columns");
  require(static_cast<int>(batch.slot_idx.size()) >= batch.num_requests, "slot_idx too short");
  for (int r = 0; r < batch.num_requests; ++r) {
    const std::int64_t c = batch.cache_lengths[r];
    const std::int64_t n = std::int64_t(batch.row_offsets[r + 1]) - batch.row_offsets[r];
    const std::int64_t end = c + n;
    const std::int64_t seed_start = end - R > c ? end - R : c;  // max(c, end - R)
    const int slot = static_cast<int>(batch.slot_idx[r]);
    require(slot < ring.max_slots, "slot_idx out of range");
    for (std::int64_t pos = seed_start; pos < end; ++pos) {
      const int row = static_cast<int>(batch.row_offsets[r] + (pos - c));
      const int idx = ring.of(pos);
      for (int ch = 0; ch < D; ++ch) {
        ring.at(slot, 0, idx, ch) = key.at(row, ch);
        ring.at(slot, 1, idx, ch) = gate.at(row, ch);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// tail_update: the decode writer
// ---------------------------------------------------------------------------
struct TailUpdateOut {
  int M = 0;                              // ceil(next_n / K)
  std::vector<double> pooled;             // [B][M][D], NaN where nothing closed
  std::vector<double> scale;              // [B][M][D]
  std::vector<std::int32_t> closed_pool;  // [B][M]; -1 padding; kUntouched past num_requests
};

inline TailUpdateOut tail_update(int next_n, const Matrix& key, const Matrix& gate,
                                 const Matrix& ape, const std::vector<std::int32_t>& positions,
                                 const std::vector<std::uint32_t>& slot_idx, int num_requests,
                                 Ring& ring) {
  const int K = ape.rows;
  const int D = ape.cols;
  require(next_n >= 1, "next_n must be >= 1");
  require(K >= 1 && ring.K == K && ring.D == D, "ring shape must match ape");
  require(key.cols == D && gate.cols == D, "key/gate must have D columns");
  require(positions.size() % static_cast<std::size_t>(next_n) == 0,
          "positions must be [B, next_n]");
  const int B = static_cast<int>(positions.size() / next_n);
  require(num_requests >= 0 && num_requests <= B, "num_requests must be in [0, B]");
  require(static_cast<int>(slot_idx.size()) >= num_requests, "slot_idx too short");
  require(key.rows >= num_requests * next_n && gate.rows >= num_requests * next_n,
          "key/gate must hold [B*next_n] rows");

  TailUpdateOut out;
  out.M = (next_n + K - 1) / K;
  const int M = out.M;
  out.pooled.assign(static_cast<std::size_t>(B) * M * D, nan_value());
  out.scale.assign(static_cast<std::size_t>(B) * M * D, nan_value());
  out.closed_pool.assign(static_cast<std::size_t>(B) * M, kUntouched);

  std::vector<const double*> keys(K), gates(K);
  for (int r = 0; r < num_requests; ++r) {
    const int slot = static_cast<int>(slot_idx[r]);
    require(slot < ring.max_slots, "slot_idx out of range");
    for (int j = 0; j < M; ++j) out.closed_pool[static_cast<std::size_t>(r) * M + j] = -1;
    int closed = 0;
    for (int i = 0; i < next_n; ++i) {
      const std::int32_t pos = positions[static_cast<std::size_t>(r) * next_n + i];
      if (pos < 0) continue;  // padded entry
      const int row = r * next_n + i;
      const int idx = ring.of(pos);
      for (int ch = 0; ch < D; ++ch) {
        ring.at(slot, 0, idx, ch) = key.at(row, ch);
        ring.at(slot, 1, idx, ch) = gate.at(row, ch);
      }
      if (pos % K == K - 1) {
        require(closed < M, "more than M pools close in one row (positions not consecutive?)");
        const std::int64_t p = pos / K;
        for (int m = 0; m < K; ++m) {
          keys[m] = &ring.data[ring.index(slot, 0, ring.of(p * K + m), 0)];
          gates[m] = &ring.data[ring.index(slot, 1, ring.of(p * K + m), 0)];
        }
        const std::size_t o = (static_cast<std::size_t>(r) * M + closed);
        pool_with_scale(ape, keys, gates, out.pooled.data() + o * D, out.scale.data() + o * D);
        out.closed_pool[o] = pos / K;
        ++closed;
      }
    }
  }
  return out;
}

// ---------------------------------------------------------------------------
// expand_topk: pool ids back to token positions
// ---------------------------------------------------------------------------
inline int expand_width(int K, int pool_topk, bool tail_always) {
  return pool_topk * K + (tail_always ? K - 1 : 0);
}

// out is [T][width]; if it is smaller it is grown (new entries kUntouched).
inline void expand_topk(int K, const std::vector<std::int32_t>& pool_ids, int pool_topk,
                        const Batch& batch, bool tail_always, std::vector<std::int32_t>& out) {
  const int B = batch_size(batch);
  require(K >= 1 && pool_topk >= 0, "K >= 1, pool_topk >= 0");
  const int width = expand_width(K, pool_topk, tail_always);
  std::size_t T = batch.row_offsets[B];
  if (pool_topk > 0) {
    require(pool_ids.size() % static_cast<std::size_t>(pool_topk) == 0,
            "pool_ids must be [T, pool_topk]");
    if (pool_ids.size() / pool_topk > T) T = pool_ids.size() / pool_topk;
    require(pool_ids.size() / pool_topk >= batch.row_offsets[batch.num_requests],
            "pool_ids has fewer rows than the live requests");
  }
  if (out.size() < T * width) out.resize(T * width, kUntouched);

  for (int b = 0; b < batch.num_requests; ++b) {
    for (std::uint32_t t = batch.row_offsets[b]; t < batch.row_offsets[b + 1]; ++t) {
      const std::int64_t i = t - batch.row_offsets[b];
      const std::int64_t visible = std::int64_t(batch.cache_lengths[b]) + i + 1;
      std::int32_t* o = out.data() + static_cast<std::size_t>(t) * width;
      for (int j = 0; j < pool_topk * K; ++j) {
        const std::int64_t pid = pool_ids[static_cast<std::size_t>(t) * pool_topk + j / K];
        if (pid < 0 || (pid + 1) * K > visible)
          o[j] = -1;
        else
          o[j] = static_cast<std::int32_t>(pid * K + j % K);
      }
      if (tail_always) {
        const std::int64_t in_tail = visible % K;
        for (int j = 0; j < K - 1; ++j)
          o[pool_topk * K + j] = (j < in_tail) ? static_cast<std::int32_t>(visible - in_tail + j) : -1;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// one_shot: every complete pool of one whole sequence (rows 0..L-1)
// ---------------------------------------------------------------------------
namespace detail {
inline void one_shot_impl(const Matrix& key, const Matrix& gate, const Matrix& ape, Matrix* pooled,
                          Matrix* scale) {
  const int K = ape.rows;
  const int D = ape.cols;
  require(K >= 1, "K must be >= 1");
  require(key.cols == D && gate.cols == D && key.rows == gate.rows, "key/gate shape");
  const int P = key.rows / K;
  Matrix out(P, D), sc(P, D);
  std::vector<const double*> keys(K), gates(K);
  for (int p = 0; p < P; ++p) {
    for (int m = 0; m < K; ++m) {
      keys[m] = key.row(p * K + m);
      gates[m] = gate.row(p * K + m);
    }
    pool_with_scale(ape, keys, gates, out.row(p), sc.row(p));
  }
  if (pooled) *pooled = std::move(out);
  if (scale) *scale = std::move(sc);
}
}  // namespace detail

inline Matrix one_shot(const Matrix& key, const Matrix& gate, const Matrix& ape) {
  Matrix out;
  detail::one_shot_impl(key, gate, ape, &out, nullptr);
  return out;
}
inline Matrix one_shot_scale(const Matrix& key, const Matrix& gate, const Matrix& ape) {
  Matrix sc;
  detail::one_shot_impl(key, gate, ape, nullptr, &sc);
  return sc;
}

}  // namespace KPoolRef
