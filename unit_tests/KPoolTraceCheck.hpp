#ifndef KPOOL_TRACE_CHECK_HPP
#define KPOOL_TRACE_CHECK_HPP

// The check of a replay's output against the host reference, shared by
// kpool_trace_check (the trace tests) and fuzz/fuzz_trace.cpp.
//
// Checks kpool_replay's output for TRACE against the host reference
// (KPoolReference.hpp, f64): every sequence's printed pools are exactly the
// complete pools of the tokens it was fed (version 2: within its final
// length), each once, sorted, 'pools N' is right, and every value is within
// tolerance of a one-shot compress of the whole sequence as it stands: the
// values last sent for each position (streaming invariance and rewinds,
// docs/ring.md). Version 2 also: 'emitted E' counts one emission each time
// a pool's last member was sent, 'selects M' ends the output, and with an
// fp8 pool cache ('pool_cache fp8 | fp8_pow2 | fp8_serving') one 'cache' line follows
// 'emitted E' per printed pool, in the same order, holding exactly the
// independent cache reference's Q(R(x)) (KPoolCacheReference.hpp, bit for
// bit: scale and every E4M3 value) of the pool as printed. The printed pool
// values are the stored ones exactly (storage types other than f64 are
// exact in f32's %.9g), and they are checked against the f64 reference
// within tolerance above; Q(R(x)) of the f64 reference itself would not be
// a sound target, since a pool one ulp off in T may quantize differently.
//
// Select lines ('select SEQ POS id ...', before 'selects M'): one per query
// token of the trace's select blocks, sorted by seq, then pos, then block
// order; each row's ids ascending, distinct, visible (below floor((pos + 1)
// / K)), min(topk, visible) of them; and the selection meets docs/indexer.md's
// tolerance rule (KPoolSelectReference.hpp: f64 scores of the dequantized
// cache, queries rotated in f64) over the cache as the select block saw it.
// A pool's cache entry at that time is Q(R(x)) (KPoolCacheReference.hpp) of
// its printed value whenever its members' values were the same then as at
// the end (exact). A pool re-sent after the select block (a rewind) had
// another value then, which nothing prints: it still counts for S (from
// the f64 reference), but is left out of the score comparison, so such a
// row is checked against the pools known exactly (the summary counts
// them).

#include "KPoolCacheReference.hpp"
#include "KPoolReference.hpp"
#include "KPoolSelectReference.hpp"
#include "KPoolTrace.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <istream>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace KPoolTraceCheck {

struct Printed {
  std::uint32_t seq;
  std::int64_t pool;
  std::vector<double> values;
  int line;
};

inline KPoolRef::DType ref_type(KPoolTrace::DType t) {
  switch (t) {
    case KPoolTrace::DType::f32: return KPoolRef::DType::f32;
    case KPoolTrace::DType::f64: return KPoolRef::DType::f64;
    case KPoolTrace::DType::bf16: return KPoolRef::DType::bf16;
    case KPoolTrace::DType::f16: return KPoolRef::DType::f16;
  }
  return KPoolRef::DType::f64;
}

/// The first way a replay's output disagrees with the trace: what() is
/// the line kpool_trace_check prints after "MISMATCH: ".
struct Mismatch : std::runtime_error {
  explicit Mismatch(std::string const& what) : std::runtime_error(what) {}
};

[[noreturn]] inline void mismatch(std::string const& what) { throw Mismatch(what); }

inline bool to_int(std::string const& s, std::int64_t& v) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  long long const x = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return false;
  v = x;
  return true;
}

// Values are f32 printed with %.9g: read them back as the f32 they were
// (strtod would keep the decimal's extra digits, off by up to 1e-9).
inline bool to_value(std::string const& s, double& v) {
  if (s.empty()) return false;
  char* end = nullptr;
  v = static_cast<double>(std::strtof(s.c_str(), &end));
  return *end == '\0';
}

inline std::vector<std::string> split(std::string const& line) {
  std::istringstream in(line);
  std::vector<std::string> f;
  std::string w;
  while (in >> w) f.push_back(w);
  return f;
}

// A 'cache SEQ POOL SCALE v...' line.
struct PrintedCache {
  std::uint32_t seq;
  std::int64_t pool;
  float scale;
  std::vector<float> values;
  int line;
};

// A 'select SEQ POS id ...' line.
struct PrintedSelect {
  std::uint32_t seq;
  std::int64_t pos;
  std::vector<std::int64_t> ids;
  int line;
};

// What follows the pool lines in a version 2 output.
struct Tail {
  std::int64_t emitted = -1;
  std::vector<PrintedCache> cache;
  std::vector<PrintedSelect> selects_printed;
  std::int64_t selects = -1;
};

// An E4M3 value or a scale as printed (%.9g of an f32): the f32 itself.
inline bool to_float(std::string const& s, float& v) {
  if (s.empty()) return false;
  char* end = nullptr;
  v = std::strtof(s.c_str(), &end);
  return *end == '\0';
}

// A 'pool' or 'cache' line's seq and pool id (fields 1 and 2), and its
// line number.
template <class Entry>
void read_seq_and_pool(std::vector<std::string> const& f, std::string const& at, int ln,
                       Entry& e) {
  std::int64_t a = 0, b = 0;
  if (!to_int(f[1], a) || a < 0 || a > 0xFFFFFFFFll)
    mismatch(at + "malformed seq '" + f[1] + "'");
  if (!to_int(f[2], b)) mismatch(at + "malformed pool id '" + f[2] + "'");
  e.seq = static_cast<std::uint32_t>(a);
  e.pool = b;
  e.line = ln;
}

// Its D values, fields first .. first + D - 1, each read by `read`
// (to_value for a pool line, to_float for a cache line).
template <class Entry, class Read>
void read_values(std::vector<std::string> const& f, std::string const& at, std::size_t first,
                 int D, Read const& read, Entry& e) {
  e.values.resize(D);
  for (int i = 0; i < D; ++i)
    if (!read(f[first + i], e.values[i]))
      mismatch(at + "malformed value '" + f[first + i] + "'");
}

// Reads kpool_replay's output: pool lines then 'pools N', nothing else in
// version 1; in version 2 then 'emitted E', 'cache' lines when the trace
// has an fp8 pool cache (`cache_lines`), 'select' lines, and 'selects M'.
inline std::vector<Printed> read_output(std::istream& in, int D, int version,
                                 bool cache_lines, Tail& tail) {
  std::vector<Printed> out;
  std::string line;
  int ln = 0;
  // 0: pool lines; 1: after 'pools N'; 2: after 'emitted E'; 3: done.
  int stage = 0;
  while (std::getline(in, line)) {
    ++ln;
    auto const at = "output line " + std::to_string(ln) + ": ";
    if (stage == 3 || (stage == 1 && version == 1))
      mismatch(at + "text after the '" +
               std::string(version == 1 ? "pools N" : "selects M") + "' line");
    auto const f = split(line);
    std::int64_t a = 0, b = 0;
    if (stage == 2 && !f.empty() && f[0] == "select") {
      if (f.size() < 3)
        mismatch(at + "a select line has a seq, a position and the ids, got '" + line +
                 "'");
      PrintedSelect sel;
      if (!to_int(f[1], a) || a < 0 || a > 0xFFFFFFFFll)
        mismatch(at + "malformed seq '" + f[1] + "'");
      sel.seq = static_cast<std::uint32_t>(a);
      if (!to_int(f[2], sel.pos) || sel.pos < 0)
        mismatch(at + "malformed position '" + f[2] + "'");
      for (std::size_t i = 3; i < f.size(); ++i) {
        if (!to_int(f[i], b)) mismatch(at + "malformed pool id '" + f[i] + "'");
        sel.ids.push_back(b);
      }
      sel.line = ln;
      tail.selects_printed.push_back(std::move(sel));
      continue;
    }
    if (stage == 2 && !f.empty() && f[0] == "cache") {
      if (!tail.selects_printed.empty())
        mismatch(at + "a 'cache' line after the 'select' lines");
      if (!cache_lines)
        mismatch(at + "a 'cache' line, but the trace's pool cache is not fp8");
      if (f.size() != static_cast<std::size_t>(4 + D))
        mismatch(at + "a cache line has " + std::to_string(3 + D) +
                 " fields (seq, pool, scale, " + std::to_string(D) +
                 " values), got " + std::to_string(f.size() - 1));
      PrintedCache c;
      read_seq_and_pool(f, at, ln, c);
      if (!to_float(f[3], c.scale)) mismatch(at + "malformed scale '" + f[3] + "'");
      read_values(f, at, 4, D, [](std::string const& s, float& v) { return to_float(s, v); }, c);
      tail.cache.push_back(std::move(c));
      continue;
    }
    if (stage == 1 || stage == 2) {
      char const* want = stage == 1 ? "emitted" : "selects";
      if (f.size() != 2 || f[0] != want)
        mismatch(at + "expected '" + want + " N', got '" + line + "'");
      if (!to_int(f[1], a) || a < 0)
        mismatch(at + "malformed count '" + f[1] + "'");
      (stage == 1 ? tail.emitted : tail.selects) = a;
      ++stage;
      continue;
    }
    if (f.size() == 2 && f[0] == "pools") {
      if (!to_int(f[1], a)) mismatch(at + "malformed count '" + f[1] + "'");
      if (a != static_cast<std::int64_t>(out.size()))
        mismatch(at + "'pools " + f[1] + "' but " +
                 std::to_string(out.size()) + " pool lines were printed");
      stage = 1;
      continue;
    }
    if (f.empty() || f[0] != "pool")
      mismatch(at + "neither a 'pool' line nor 'pools N': '" + line + "'");
    if (f.size() != static_cast<std::size_t>(3 + D))
      mismatch(at + "a pool line has " + std::to_string(2 + D) +
               " fields (seq, pool, " + std::to_string(D) + " values), got " +
               std::to_string(f.size() - 1));
    Printed p;
    read_seq_and_pool(f, at, ln, p);
    read_values(f, at, 3, D, [](std::string const& s, double& v) { return to_value(s, v); }, p);
    out.push_back(std::move(p));
  }
  if (stage == 0) mismatch("the output has no 'pools N' line");
  if (version >= 2 && stage != 3)
    mismatch(std::string("the output does not end with ") +
             (stage == 1 ? "'emitted E' and 'selects M' lines"
                         : "a 'selects M' line"));
  return out;
}

// The replay and this checker share KPoolTrace::value, so a slip in it
// would pass unseen: pin it to values worked out from docs/trace.md's formula
// independently (exact: every value is a multiple of 2^-22).
inline bool inputs_match_trace_md() {
  struct Golden {
    std::uint64_t seed, seq, pos, c, which;
    double expected;
  };
  Golden const golden[] = {
      {12345, 0, 13, 0, 0, -0.3297903537750244},
      {12345, 1, 2, 127, 1, 0.6680431365966797},
      {7, 9, 0, 0, 0, -1.3935754299163818},
      {18446744073709551615ull, 4294967295ull, 2147483646, 65535, 1,
       0.7006607055664062},
  };
  for (auto const& g : golden)
    if (static_cast<double>(KPoolTrace::value(g.seed, g.seq, g.pos, g.c,
                                              g.which)) != g.expected)
      return false;
  // ape[m][c] = value(0, m, c, 2) under the trace's seed.
  return static_cast<double>(KPoolTrace::ape_value(12345, 3, 5)) ==
             0.0289306640625 &&
         static_cast<double>(KPoolTrace::ape_value(0, 3, 5)) ==
             1.9753193855285645;
}

// ---------------------------------------------------------------- selection

// The cache as a select block saw one sequence: the dequantized key of each
// pool it could see, and whether that key is known exactly.
struct SeenPools {
  std::vector<std::vector<double>> keys;
  std::vector<bool> exact;
};

// One query token of a select block, with the pools its row saw.
struct ExpectedSelect {
  std::uint32_t seq;
  std::uint64_t pos;
  std::uint32_t revision;  // of the values last sent for pos
  std::size_t seen;        // index into the SeenPools
};

struct SelectSummary {
  std::size_t lines = 0;
  std::size_t exact_rows = 0;    // every visible pool known exactly
  std::size_t partial_rows = 0;  // some visible pool re-sent later
  std::size_t selected = 0;      // ids checked
};

inline KPoolCacheRef::CacheKind cache_kind(KPoolTrace::Trace const& t, KPoolRef::DType dt) {
  bool const fp8 = t.pool_cache != KPoolTrace::PoolCache::native;
  return KPoolCacheRef::CacheKind{
      dt, fp8,
      !fp8 ? KPoolCacheRef::Scale::none
           : t.pool_cache == KPoolTrace::PoolCache::fp8 ? KPoolCacheRef::Scale::amax
                                                        : KPoolCacheRef::Scale::pow2,
      t.rotate, t.pool_cache == KPoolTrace::PoolCache::fp8_serving};
}

// The cached key of a pool of value x (as stored in T): Q(R(x)),
// dequantized, in the rotated domain the scores use.
inline std::vector<double> cached_key(KPoolCacheRef::CacheKind const& kind,
                               std::vector<double> const& x) {
  KPoolCacheRef::Entry const e = KPoolCacheRef::quantize(kind, x);
  return KPoolCacheRef::dequantize(kind, e, static_cast<int>(x.size()), false);
}

inline SelectSummary check_selects(KPoolTrace::Trace const& trace, KPoolRef::DType dt,
                            std::vector<Printed> const& printed,
                            std::vector<PrintedSelect> const& lines) {
  int const K = trace.kpool;
  int const D = trace.head_dim;
  int const H = trace.index_heads;
  int const topk = trace.index_topk;
  KPoolCacheRef::CacheKind const kind = cache_kind(trace, dt);
  std::map<std::pair<std::uint32_t, std::int64_t>, Printed const*> final_pool;
  for (auto const& p : printed) final_pool[{p.seq, p.pool}] = &p;
  KPoolRef::Matrix ape(K, D);
  for (int m = 0; m < K; ++m)
    for (int c = 0; c < D; ++c) ape.at(m, c) = KPoolTrace::ape_value(trace.seed, m, c);

  // Walk the calls, counting each position's sendings, and at each select
  // block record what every row's sequence had in the cache.
  std::map<std::uint32_t, std::vector<std::uint32_t>> sends;
  std::vector<SeenPools> seen;
  std::vector<ExpectedSelect> expected;
  for (auto const& b : trace.blocks) {
    if (b.kind != KPoolTrace::BlockKind::select) {
      for (auto const& r : b.rows) {
        std::vector<std::uint32_t>& n = sends[r.seq];
        if (n.size() < r.cache_len + r.n_new) n.resize(r.cache_len + r.n_new, 0);
        for (std::uint64_t pos = r.cache_len; pos < r.cache_len + r.n_new; ++pos) ++n[pos];
      }
      continue;
    }
    for (auto const& r : b.rows) {
      if (r.n_new == 0) continue;
      std::vector<std::uint32_t> const& now = sends.at(r.seq);
      KPoolTrace::Sequence const& history = trace.sequences.at(r.seq);
      std::uint64_t const pools = (r.cache_len + r.n_new) / K;
      SeenPools sp;
      sp.keys.resize(pools);
      sp.exact.resize(pools);
      for (std::uint64_t p = 0; p < pools; ++p) {
        bool same = true;
        for (int m = 0; m < K; ++m) {
          std::uint64_t const pos = p * K + m;
          same = same && history.last_revision(pos) + 1 == now[pos];
        }
        auto const fin = final_pool.find({r.seq, static_cast<std::int64_t>(p)});
        sp.exact[p] = same && fin != final_pool.end();
        if (sp.exact[p]) {
          sp.keys[p] = cached_key(kind, fin->second->values);
          continue;
        }
        // Re-sent since: near enough for S from the f64 reference.
        KPoolRef::Matrix key(K, D), gate(K, D);
        for (int m = 0; m < K; ++m) {
          std::uint64_t const pos = p * K + m;
          for (int c = 0; c < D; ++c) {
            key.at(m, c) = KPoolRef::round_to(
                dt, KPoolTrace::key_value(trace.seed, r.seq, pos, c, now[pos] - 1));
            gate.at(m, c) = KPoolRef::round_to(
                dt, KPoolTrace::gate_value(trace.seed, r.seq, pos, c, now[pos] - 1));
          }
        }
        KPoolRef::Matrix const pooled = KPoolRef::one_shot(key, gate, ape);
        std::vector<double> x(D);
        for (int c = 0; c < D; ++c) x[c] = KPoolRef::round_to(dt, pooled.at(0, c));
        sp.keys[p] = cached_key(kind, x);
      }
      seen.push_back(std::move(sp));
      for (std::uint64_t i = 0; i < r.n_new; ++i) {
        std::uint64_t const pos = r.cache_len + i;
        expected.push_back({r.seq, pos, now[pos] - 1, seen.size() - 1});
      }
    }
  }
  std::stable_sort(expected.begin(), expected.end(),
                   [](ExpectedSelect const& a, ExpectedSelect const& b) {
                     return a.seq != b.seq ? a.seq < b.seq : a.pos < b.pos;
                   });
  if (lines.size() != expected.size())
    mismatch(std::to_string(lines.size()) + " select lines, but the trace's select "
             "blocks query " + std::to_string(expected.size()) + " tokens");

  SelectSummary sum;
  sum.lines = lines.size();
  for (std::size_t i = 0; i < lines.size(); ++i) {
    PrintedSelect const& got = lines[i];
    ExpectedSelect const& e = expected[i];
    std::string const at = "output line " + std::to_string(got.line) + ": ";
    if (got.seq != e.seq || got.pos != static_cast<std::int64_t>(e.pos))
      mismatch(at + "select seq " + std::to_string(got.seq) + " pos " +
               std::to_string(got.pos) + " where seq " + std::to_string(e.seq) + " pos " +
               std::to_string(e.pos) + " comes (sorted by seq, then pos, then block)");
    std::int64_t const visible = static_cast<std::int64_t>((e.pos + 1) / K);
    std::size_t const want = static_cast<std::size_t>(std::min<std::int64_t>(topk, visible));
    if (got.ids.size() != want)
      mismatch(at + std::to_string(got.ids.size()) + " pools selected, expected min(topk " +
               std::to_string(topk) + ", visible " + std::to_string(visible) + ")");
    std::vector<std::int32_t> row(static_cast<std::size_t>(topk), -1);
    for (std::size_t j = 0; j < got.ids.size(); ++j) {
      if (got.ids[j] < 0 || got.ids[j] >= visible)
        mismatch(at + "pool " + std::to_string(got.ids[j]) + " is not visible (pools 0.." +
                 std::to_string(visible - 1) + ")");
      if (j > 0 && got.ids[j] <= got.ids[j - 1])
        mismatch(at + "the ids do not ascend");
      row[j] = static_cast<std::int32_t>(got.ids[j]);
    }
    sum.selected += got.ids.size();

    // Scores of the visible pools, the query as the trace defines it.
    std::vector<double> q(static_cast<std::size_t>(H) * D), w(H);
    for (int h = 0; h < H; ++h) {
      w[h] = KPoolTrace::weight_value(trace.seed, e.seq, e.pos, h, e.revision);
      for (int c = 0; c < D; ++c)
        q[static_cast<std::size_t>(h) * D + c] = KPoolRef::round_to(
            dt, KPoolTrace::query_value(trace.seed, e.seq, e.pos, h, c, D, e.revision));
    }
    KPoolSelectRef::Query const query(q, w, H, D, trace.rotate, kind.serving);
    SeenPools const& sp = seen[e.seen];
    KPoolSelectRef::RowScores scores;
    scores.score.resize(static_cast<std::size_t>(visible));
    scores.counted.assign(static_cast<std::size_t>(visible), true);
    bool all_exact = true;
    for (std::int64_t p = 0; p < visible; ++p) {
      double mag = 0;
      scores.score[p] = query.score(sp.keys[p], &mag);
      // An approximate key's magnitude, with room to spare: S only widens.
      if (!sp.exact[p]) mag *= 1.01;
      if (std::isfinite(mag)) scores.S = std::max(scores.S, mag);
      all_exact = all_exact && sp.exact[p];
    }
    if (all_exact) {
      ++sum.exact_rows;
      std::string const why = KPoolSelectRef::check_selection(scores, topk, row.data());
      if (!why.empty()) mismatch(at + why);
      continue;
    }
    // Only the exactly known pools compete.
    ++sum.partial_rows;
    std::vector<bool> chosen(static_cast<std::size_t>(visible), false);
    for (std::int64_t id : got.ids) chosen[id] = true;
    double min_sel = std::numeric_limits<double>::infinity();
    double max_rest = -std::numeric_limits<double>::infinity();
    std::int64_t min_id = -1, max_id = -1;
    for (std::int64_t p = 0; p < visible; ++p) {
      if (!sp.exact[p]) continue;
      double const sc = scores.score[p];
      if (chosen[p] && sc < min_sel) {
        min_sel = sc;
        min_id = p;
      } else if (!chosen[p] && sc > max_rest) {
        max_rest = sc;
        max_id = p;
      }
    }
    if (min_sel < max_rest - 1e-5 * scores.S) {
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "selected pool %lld scores %.17g but unselected pool %lld scores "
                    "%.17g (S = %.17g)",
                    static_cast<long long>(min_id), min_sel, static_cast<long long>(max_id),
                    max_rest, scores.S);
      mismatch(at + buf);
    }
  }
  return sum;
}

/// Checks kpool_replay's output `output` for `trace` (everything this
/// file's opening comment lists) and returns the summary kpool_trace_check
/// prints after "kpool_trace_check: "; throws Mismatch at the first
/// disagreement.
inline std::string check(KPoolTrace::Trace const& trace, std::istream& output) {
  int const K = trace.kpool;
  int const D = trace.head_dim;
  KPoolRef::DType const dt = ref_type(trace.dtype);
  bool const cache_lines =
      trace.version >= 2 && trace.pool_cache != KPoolTrace::PoolCache::native;

  Tail tail;
  std::vector<Printed> const printed =
      read_output(output, D, trace.version, cache_lines, tail);
  if (trace.version >= 2) {
    // One emission per sent position that ends a pool, counted here from
    // the trace's rows (rewinds re-emit).
    std::uint64_t want = 0;
    for (auto const& b : trace.blocks) {
      if (b.kind == KPoolTrace::BlockKind::select) continue;
      for (auto const& r : b.rows)
        want += (r.cache_len + r.n_new) / K - r.cache_len / K;
    }
    if (tail.emitted != static_cast<std::int64_t>(want))
      mismatch("'emitted " + std::to_string(tail.emitted) +
               "' but the trace's calls emit " + std::to_string(want) +
               " pools");
    if (tail.selects != static_cast<std::int64_t>(tail.selects_printed.size()))
      mismatch("'selects " + std::to_string(tail.selects) + "' but " +
               std::to_string(tail.selects_printed.size()) + " select lines were printed");
  }

  // Order: by seq, then pool id, each pool once.
  for (std::size_t i = 1; i < printed.size(); ++i) {
    Printed const& a = printed[i - 1];
    Printed const& b = printed[i];
    if (a.seq == b.seq && a.pool == b.pool)
      mismatch("seq " + std::to_string(b.seq) + " pool " +
               std::to_string(b.pool) + " is printed twice (output lines " +
               std::to_string(a.line) + " and " + std::to_string(b.line) + ")");
    if (a.seq > b.seq || (a.seq == b.seq && a.pool > b.pool))
      mismatch("output line " + std::to_string(b.line) + " (seq " +
               std::to_string(b.seq) + " pool " + std::to_string(b.pool) +
               ") is out of order after seq " + std::to_string(a.seq) +
               " pool " + std::to_string(a.pool));
  }

  // Which pools each sequence should have: exactly [0, fed / K).
  std::map<std::uint32_t, std::vector<Printed const*>> by_seq;
  for (auto const& p : printed) {
    auto const it = trace.sequences.find(p.seq);
    if (it == trace.sequences.end())
      mismatch("output line " + std::to_string(p.line) + ": seq " +
               std::to_string(p.seq) + " is not in the trace");
    std::int64_t const complete = static_cast<std::int64_t>(it->second.fed / K);
    if (p.pool < 0 || p.pool >= complete)
      mismatch("output line " + std::to_string(p.line) + ": seq " +
               std::to_string(p.seq) + " pool " + std::to_string(p.pool) +
               " is not complete (the sequence was fed " +
               std::to_string(it->second.fed) + " tokens, K = " +
               std::to_string(K) + ": pools 0.." +
               std::to_string(complete - 1) + ")");
    by_seq[p.seq].push_back(&p);
  }
  std::uint64_t const expected = trace.complete_pools();
  for (auto const& s : trace.sequences) {
    std::uint64_t const complete = s.second.fed / K;
    std::uint64_t const got = by_seq.count(s.first) ? by_seq[s.first].size() : 0;
    if (got != complete) {
      // Sorted and in range, so the first gap is the first missing pool.
      std::uint64_t missing = 0;
      if (got) {
        auto const& v = by_seq[s.first];
        while (missing < v.size() &&
               v[missing]->pool == static_cast<std::int64_t>(missing))
          ++missing;
      }
      mismatch("seq " + std::to_string(s.first) + " pool " +
               std::to_string(missing) + " is missing (fed " +
               std::to_string(s.second.fed) + " tokens: " +
               std::to_string(complete) + " complete pools, " +
               std::to_string(got) + " printed)");
    }
  }
  if (printed.size() != expected)
    mismatch("'pools " + std::to_string(printed.size()) + "' but the trace completes " +
             std::to_string(expected) + " pools");

  // Values against a one-shot compress of each whole sequence, as it
  // stands: each position's last-sent values (revision 0 in version 1).
  KPoolRef::Matrix ape(K, D);
  for (int m = 0; m < K; ++m)
    for (int c = 0; c < D; ++c) ape.at(m, c) = KPoolTrace::ape_value(trace.seed, m, c);
  double worst = 0.0;  // largest |got - ref| / tolerance
  for (auto const& entry : by_seq) {
    std::uint32_t const seq = entry.first;
    auto const& pools = entry.second;
    int const rows = static_cast<int>(pools.size()) * K;
    KPoolRef::Matrix key(rows, D), gate(rows, D);
    KPoolTrace::Sequence const& history = trace.sequences.at(seq);
    for (int pos = 0; pos < rows; ++pos) {
      std::uint64_t const rev = history.last_revision(pos);
      for (int c = 0; c < D; ++c) {
        key.at(pos, c) = KPoolRef::round_to(
            dt, KPoolTrace::key_value(trace.seed, seq, pos, c, rev));
        gate.at(pos, c) = KPoolRef::round_to(
            dt, KPoolTrace::gate_value(trace.seed, seq, pos, c, rev));
      }
    }
    KPoolRef::Matrix const ref = KPoolRef::one_shot(key, gate, ape);
    KPoolRef::Matrix const scale = KPoolRef::one_shot_scale(key, gate, ape);
    for (auto const* p : pools) {
      int const id = static_cast<int>(p->pool);
      for (int c = 0; c < D; ++c) {
        double const got = p->values[c];
        double const r = ref.at(id, c);
        double const s = scale.at(id, c);
        double tol;
        switch (dt) {
          case KPoolRef::DType::f64:
            // Printed as f32 (docs/trace.md): half an f32 ulp of the conversion.
            tol = 0.5 * KPoolRef::ulp(KPoolRef::DType::f32,
                                      std::max(std::fabs(r), std::fabs(got))) +
                  1e-12 * s + 1e-300;
            break;
          case KPoolRef::DType::f32:
            tol = 1e-5 * std::max(std::fabs(r), s);
            break;
          default:
            tol = KPoolRef::ulp(dt, r) + 1e-5 * s;
            break;
        }
        double const err = std::fabs(got - r);
        if (!(err <= tol)) {
          char buf[256];
          std::snprintf(buf, sizeof buf,
                        "seq %u pool %d channel %d (output line %d): got %.9g, "
                        "reference %.17g, |error| %.3g > tolerance %.3g",
                        static_cast<unsigned>(seq), id, c, p->line, got, r,
                        err, tol);
          mismatch(buf);
        }
        if (tol > 0) worst = std::max(worst, err / tol);
      }
    }
  }

  // The fp8 cache's entries: one per printed pool, in the same order, each
  // bit for bit the reference's Q(R(x)) of the pool's printed values.
  if (cache_lines) {
    if (tail.cache.size() != printed.size())
      mismatch(std::to_string(tail.cache.size()) + " cache lines for " +
               std::to_string(printed.size()) + " pools");
    KPoolCacheRef::CacheKind const kind = cache_kind(trace, dt);
    auto same = [](float a, float b) {
      return (std::isnan(a) && std::isnan(b)) ||
             std::memcmp(&a, &b, sizeof(float)) == 0;
    };
    for (std::size_t i = 0; i < printed.size(); ++i) {
      Printed const& p = printed[i];
      PrintedCache const& c = tail.cache[i];
      std::string const at = "output line " + std::to_string(c.line) + ": ";
      if (c.seq != p.seq || c.pool != p.pool)
        mismatch(at + "cache seq " + std::to_string(c.seq) + " pool " +
                 std::to_string(c.pool) + " where the pool lines have seq " +
                 std::to_string(p.seq) + " pool " + std::to_string(p.pool));
      KPoolCacheRef::Entry const want = KPoolCacheRef::quantize(kind, p.values);
      if (!same(c.scale, want.scale)) {
        char buf[200];
        std::snprintf(buf, sizeof buf,
                      "seq %u pool %lld: scale %.9g, Q(R(x)) of the printed pool "
                      "has %.9g",
                      static_cast<unsigned>(c.seq), static_cast<long long>(c.pool),
                      static_cast<double>(c.scale), static_cast<double>(want.scale));
        mismatch(at + buf);
      }
      for (int ch = 0; ch < D; ++ch) {
        float const w = static_cast<float>(KPoolCacheRef::e4m3_value(want.bytes[ch]));
        if (!same(c.values[ch], w)) {
          char buf[200];
          std::snprintf(buf, sizeof buf,
                        "seq %u pool %lld channel %d: cached %.9g, Q(R(x)) of the "
                        "printed pool has %.9g",
                        static_cast<unsigned>(c.seq), static_cast<long long>(c.pool), ch,
                        static_cast<double>(c.values[ch]), static_cast<double>(w));
          mismatch(at + buf);
        }
      }
    }
  }

  SelectSummary const sel =
      trace.version >= 2 ? check_selects(trace, dt, printed, tail.selects_printed)
                         : SelectSummary();

  std::uint64_t rewinds = 0;
  for (auto const& b : trace.blocks)
    for (auto const& r : b.rows) rewinds += r.rewinds ? 1 : 0;
  char summary[640];
  std::snprintf(
      summary, sizeof summary,
      "OK: %zu pools of %zu sequences (%zu blocks, dtype "
      "%s, K %d, D %d, version %d, ring %d, %llu rewinds, pool cache %s%s, "
      "%zu cache lines exact, %zu select lines: %zu rows against every visible "
      "pool, %zu against the pools not re-sent since, %zu ids); worst error %.3g "
      "of tolerance",
      printed.size(), trace.sequences.size(), trace.blocks.size(),
      KPoolTrace::dtype_name(trace.dtype), K, D, trace.version, trace.ring,
      static_cast<unsigned long long>(rewinds),
      KPoolTrace::pool_cache_name(trace.pool_cache), trace.rotate ? " rotated" : "",
      tail.cache.size(), sel.lines, sel.exact_rows, sel.partial_rows, sel.selected, worst);
  return summary;
}

}  // namespace KPoolTraceCheck

#endif  // KPOOL_TRACE_CHECK_HPP
