// KPoolSelectReference.hpp: an independent, serial host reference for the
// selection stage, written from docs/indexer.md alone ("The pool cache",
// "Scoring", "Selection"); no code shared with src/. Plain C++17, standard
// library only, all arithmetic in double.
//
//  * The pool cache is modelled by its stored numbers: each entry's value
//    (an fp8 code or a number of the native type) and its scale; the
//    dequantized key is scale * value.
//  * Scores are exact-ish: f64 from the dequantized cache, the queries
//    rotated in f64.
//  * check_selection() applies docs/indexer.md's tolerance rule to a row the
//    library selected; select_exact() is the ranking itself (for planted
//    exact ties, where any conforming selection must take the lower ids).
//  * The serving profile ("The serving profile"): cache entries and query
//    rows quantized by KPoolCacheReference.hpp's serving_quantize (its f32
//    rotation, bf16 rounding, floored amax, UE8M0 scale); a query row then
//    scores with its E4M3 codes as values and its weight times its scale,
//    and S is taken over those quantized operands.
#pragma once

#include <KPoolCacheReference.hpp>
#include <KPoolReference.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace KPoolSelectRef {

using KPoolRef::DType;

// ---------------------------------------------------------------------------
// OCP FP8 E4M3FN: 1 sign, 4 exponent bits (bias 7), 3 mantissa bits,
// subnormals, max finite 448, no infinity, NaN = S.1111.111.
// ---------------------------------------------------------------------------

inline double fp8_decode(std::uint8_t b) {
  int const e = (b >> 3) & 15;
  int const m = b & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  // Normal: 2^(e-7) * (1 + m/8) = (8 + m) * 2^(e-10); subnormal: m * 2^-9.
  double const mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return (b & 0x80) ? -mag : mag;
}

// Round to nearest, ties to the even code, saturating at +-448. Codes
// 0x00..0x7E are the non-negative finite values in increasing order.
inline std::uint8_t fp8_encode(double x) {
  std::uint8_t const sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return static_cast<std::uint8_t>(sign | 0x7F);
  double const a = std::fabs(x);
  if (a >= 448) return static_cast<std::uint8_t>(sign | 0x7E);
  static std::vector<double> const value = [] {
    std::vector<double> v(0x7F);
    for (int c = 0; c < 0x7F; ++c) v[c] = fp8_decode(static_cast<std::uint8_t>(c));
    return v;
  }();
  int lo = 0, hi = 0x7E;  // value[lo] <= a < value[hi]
  while (hi - lo > 1) {
    int const mid = (lo + hi) / 2;
    if (value[mid] <= a)
      lo = mid;
    else
      hi = mid;
  }
  double const dl = a - value[lo];
  double const dh = value[hi] - a;
  int const best = dl < dh ? lo : dh < dl ? hi : ((lo & 1) == 0 ? lo : hi);
  return static_cast<std::uint8_t>(sign | best);
}

// ---------------------------------------------------------------------------
// R: the orthonormal Walsh-Hadamard transform (D a power of two), in f64.
// ---------------------------------------------------------------------------

inline void wht(std::vector<double>& v) {
  std::size_t const D = v.size();
  for (std::size_t h = 1; h < D; h *= 2)
    for (std::size_t i = 0; i < D; ++i)
      if ((i & h) == 0) {
        double const a = v[i], b = v[i + h];
        v[i] = a + b;
        v[i + h] = a - b;
      }
  double const norm = 1.0 / std::sqrt(static_cast<double>(D));
  for (double& x : v) x *= norm;
}

// ---------------------------------------------------------------------------
// The pool cache.
// ---------------------------------------------------------------------------

struct Cache {
  int num_blocks = 0, block_pools = 0, D = 0;
  bool fp8 = false;
  bool rotated = false;
  bool serving = false;            // the serving profile (fp8 only)
  std::vector<double> value;       // [num_blocks][block_pools][D] as numbers
  std::vector<std::uint8_t> code;  // fp8 codes, same shape (fp8 only)
  std::vector<double> scale;       // [num_blocks][block_pools]

  Cache(int blocks, int pools, int d, bool is_fp8, bool is_rotated)
      : num_blocks(blocks), block_pools(pools), D(d), fp8(is_fp8),
        rotated(is_rotated),
        value(static_cast<std::size_t>(blocks) * pools * d, 0.0),
        code(is_fp8 ? value.size() : 0, 0),
        scale(static_cast<std::size_t>(blocks) * pools, 1.0) {}

  std::size_t entry(int block, int e) const {
    return static_cast<std::size_t>(block) * block_pools + e;
  }
  double key(int block, int e, int c) const {
    return scale[entry(block, e)] * value[entry(block, e) * D + c];
  }

  // Writes Q(R(x)) at (block, e): x as stored in the pools' type t.
  // Native caches round R(x) into t (scale 1); fp8 caches scale by
  // amax / 448 (f32), or its next power of two (pow2).
  void store(int block, int e, std::vector<double> x, DType t, bool pow2 = false) {
    if (serving) {
      // x as stored (exact in f32): the serving profile's own arithmetic.
      KPoolCacheRef::CacheKind const kind{DType::f32, true, KPoolCacheRef::Scale::pow2,
                                          rotated, true};
      KPoolCacheRef::Entry const q = KPoolCacheRef::quantize(kind, x);
      scale[entry(block, e)] = q.scale;
      for (int c = 0; c < D; ++c) set_code(block, e, c, q.bytes[c]);
      return;
    }
    if (rotated) wht(x);
    std::size_t const base = entry(block, e) * D;
    if (!fp8) {
      for (int c = 0; c < D; ++c) value[base + c] = KPoolRef::round_to(t, x[c]);
      scale[entry(block, e)] = 1.0;
      return;
    }
    double amax = 0;
    for (double v : x)
      if (std::isfinite(v)) amax = std::max(amax, std::fabs(v));
    double s = static_cast<float>(amax / 448.0);
    if (pow2 && amax > 0) s = std::ldexp(1.0, static_cast<int>(std::ceil(std::log2(s))));
    if (amax == 0) s = 1;
    scale[entry(block, e)] = s;
    for (int c = 0; c < D; ++c) set_code(block, e, c, fp8_encode(static_cast<float>(x[c] / s)));
  }

  // Raw entry writes, for planted contents (duplicates, NaN, stale data).
  void set_code(int block, int e, int c, std::uint8_t b) {
    code[entry(block, e) * D + c] = b;
    value[entry(block, e) * D + c] = fp8_decode(b);
  }
  void set_value(int block, int e, int c, double v) { value[entry(block, e) * D + c] = v; }
  void copy_entry(int from_block, int from_e, int to_block, int to_e) {
    for (int c = 0; c < D; ++c) {
      value[entry(to_block, to_e) * D + c] = value[entry(from_block, from_e) * D + c];
      if (fp8) code[entry(to_block, to_e) * D + c] = code[entry(from_block, from_e) * D + c];
    }
    scale[entry(to_block, to_e)] = scale[entry(from_block, from_e)];
  }
};

// ---------------------------------------------------------------------------
// Scoring.
// ---------------------------------------------------------------------------

// Pools visible to the query at position pos: floor((pos + 1) / K).
inline std::int64_t visible(std::int64_t pos, int K) { return (pos + 1) / K; }

// relu passing NaN.
inline double relu(double x) { return std::isnan(x) ? x : (x > 0 ? x : 0.0); }

// One query row: q [H][D] as stored, weights [H], rotated like the cache.
struct Query {
  int H = 0, D = 0;
  std::vector<double> rq;  // R(q[h]) [H][D]
  std::vector<double> w;   // [H]

  // serving: each q[h] (exact in f32) quantized as a serving row; rq holds
  // its E4M3 codes as values and w[h] the weight times the row's scale.
  Query(std::vector<double> const& q, std::vector<double> const& weights, int heads,
        int d, bool rotated, bool serving = false)
      : H(heads), D(d), rq(q), w(weights) {
    if (serving) {
      for (int h = 0; h < H; ++h) {
        std::vector<float> v(D);
        for (int c = 0; c < D; ++c) v[c] = static_cast<float>(q[h * D + c]);
        if (rotated) KPoolCacheRef::rotate(v);
        KPoolCacheRef::Entry const e = KPoolCacheRef::serving_quantize(v);
        for (int c = 0; c < D; ++c) rq[h * D + c] = fp8_decode(e.bytes[c]);
        w[h] = weights[h] * e.scale;
      }
      return;
    }
    if (!rotated) return;
    for (int h = 0; h < H; ++h) {
      std::vector<double> v(q.begin() + h * D, q.begin() + (h + 1) * D);
      wht(v);
      std::copy(v.begin(), v.end(), rq.begin() + h * D);
    }
  }

  // score = sum_h w_h relu(R(q_h) . k); `mag` receives
  // sum_h |w_h| sum_c |R(q_h)[c] k[c]|, the pool's term of S.
  double score(std::vector<double> const& k, double* mag = nullptr) const {
    double s = 0, m = 0;
    for (int h = 0; h < H; ++h) {
      double dot = 0, abs_dot = 0;
      for (int c = 0; c < D; ++c) {
        dot += rq[h * D + c] * k[c];
        abs_dot += std::fabs(rq[h * D + c] * k[c]);
      }
      s += w[h] * relu(dot);
      m += std::fabs(w[h]) * abs_dot;
    }
    if (mag) *mag = m;
    return s;
  }
};

// The dequantized key of pool p of a sequence with block table row `table`.
inline std::vector<double> cached_key(Cache const& cache,
                                      std::vector<std::int32_t> const& table,
                                      std::int64_t p) {
  int const block = table[static_cast<std::size_t>(p / cache.block_pools)];
  int const e = static_cast<int>(p % cache.block_pools);
  std::vector<double> k(cache.D);
  for (int c = 0; c < cache.D; ++c) k[c] = cache.key(block, e, c);
  return k;
}

// Scores of pools [0, n) and S (docs/indexer.md, "Selection"). Pools with
// counted[p] false are not candidates (bad blocks with validation off).
struct RowScores {
  std::vector<double> score;
  std::vector<bool> counted;
  double S = 0;
};

inline RowScores score_row(Cache const& cache, std::vector<std::int32_t> const& table,
                           Query const& q, std::int64_t n,
                           std::vector<bool> const* counted = nullptr) {
  RowScores r;
  r.score.resize(static_cast<std::size_t>(n));
  r.counted.assign(static_cast<std::size_t>(n), true);
  for (std::int64_t p = 0; p < n; ++p) {
    if (counted && !(*counted)[static_cast<std::size_t>(p)]) {
      r.counted[static_cast<std::size_t>(p)] = false;
      r.score[static_cast<std::size_t>(p)] = 0;
      continue;
    }
    double mag = 0;
    r.score[static_cast<std::size_t>(p)] = q.score(cached_key(cache, table, p), &mag);
    if (std::isfinite(mag)) r.S = std::max(r.S, mag);
  }
  return r;
}

// ---------------------------------------------------------------------------
// Selection.
// ---------------------------------------------------------------------------

// The ranking itself: higher score first, NaN below every number, ties to
// the lower id; the first min(topk, candidates) in ascending id order.
inline std::vector<std::int32_t> select_exact(RowScores const& r, int topk) {
  std::vector<std::int32_t> ids;
  for (std::size_t p = 0; p < r.score.size(); ++p)
    if (r.counted[p]) ids.push_back(static_cast<std::int32_t>(p));
  auto const better = [&](std::int32_t a, std::int32_t b) {
    double const sa = r.score[a], sb = r.score[b];
    bool const na = std::isnan(sa), nb = std::isnan(sb);
    if (na != nb) return nb;  // the number ranks above NaN
    if (!na && sa != sb) return sa > sb;
    return a < b;
  };
  std::stable_sort(ids.begin(), ids.end(), better);
  if (ids.size() > static_cast<std::size_t>(topk)) ids.resize(topk);
  std::sort(ids.begin(), ids.end());
  return ids;
}

// docs/indexer.md's rule for one row of pool_ids (`got`, topk entries): the
// first min(topk, candidates) entries are distinct candidates in ascending
// order, the rest -1; every selected pool's score is at least every
// unselected candidate's minus 1e-5 * S; NaN ranks below every number.
// Returns an empty string when the row conforms, else what is wrong.
inline std::string check_selection(RowScores const& r, int topk,
                                   std::int32_t const* got) {
  std::ostringstream why;
  std::size_t candidates = 0;
  for (bool c : r.counted) candidates += c ? 1 : 0;
  std::size_t const k = std::min<std::size_t>(topk, candidates);
  std::vector<bool> chosen(r.score.size(), false);
  for (std::size_t j = 0; j < static_cast<std::size_t>(topk); ++j) {
    std::int32_t const id = got[j];
    if (j >= k) {
      if (id != -1) why << "column " << j << " is " << id << ", expected -1; ";
      continue;
    }
    if (id < 0 || static_cast<std::size_t>(id) >= r.score.size() || !r.counted[id]) {
      why << "column " << j << " holds " << id << ", not a visible pool; ";
      continue;
    }
    if (j > 0 && got[j - 1] >= id)
      why << "column " << j << " (" << id << ") does not ascend; ";
    chosen[id] = true;
  }
  if (!why.str().empty()) return why.str();
  double min_sel = std::numeric_limits<double>::infinity();
  double max_rest = -std::numeric_limits<double>::infinity();
  bool nan_selected = false, number_left = false;
  std::int32_t min_id = -1, max_id = -1;
  for (std::size_t p = 0; p < r.score.size(); ++p) {
    if (!r.counted[p]) continue;
    double const s = r.score[p];
    if (chosen[p]) {
      if (std::isnan(s))
        nan_selected = true;
      else if (s < min_sel) {
        min_sel = s;
        min_id = static_cast<std::int32_t>(p);
      }
    } else if (!std::isnan(s)) {
      number_left = true;
      if (s > max_rest) {
        max_rest = s;
        max_id = static_cast<std::int32_t>(p);
      }
    }
  }
  if (nan_selected && number_left)
    why << "a NaN pool is selected while pool " << max_id << " (score " << max_rest
        << ") is not; ";
  if (min_sel < max_rest - 1e-5 * r.S)
    why << "selected pool " << min_id << " scores " << min_sel << " but unselected pool "
        << max_id << " scores " << max_rest << " (S = " << r.S << "); ";
  return why.str();
}

}  // namespace KPoolSelectRef
