#ifndef KPOOL_TRACE_HPP
#define KPOOL_TRACE_HPP

// The serving-trace format, versions 1 and 2 (docs/trace.md): data model,
// parser and the deterministic input function. Host only, header only, no
// Kokkos, so the replay program, the generator and the checker all read
// traces the same way. Everything a trace says is in the parsed Trace
// (header, blocks, each row's revisions, each sequence's history), so a new
// output of the replay needs no change here.

#include <algorithm>
#include <cstdint>
#include <istream>
#include <iterator>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace KPoolTrace {

/// `s` with every control byte (below 0x20, and 0x7F) written as \xHH: a
/// message quotes the trace's own bytes, and a NUL would cut what() short.
inline std::string escape_control(std::string const& s) {
  std::string out;
  for (char ch : s) {
    unsigned char const b = static_cast<unsigned char>(ch);
    if (b >= 0x20 && b != 0x7F) {
      out += ch;
      continue;
    }
    char const hex[] = "0123456789abcdef";
    out += "\\x";
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

/// A broken trace: the 1-based line it was found on and what is wrong.
/// what() reads "trace:LINE: message", the replay program's error line;
/// control bytes of the input the message quotes are escaped.
struct TraceError : std::runtime_error {
  int line;
  std::string message;
  TraceError(int line_, std::string const& message_)
      : std::runtime_error("trace:" + std::to_string(line_) + ": " + escape_control(message_)),
        line(line_),
        message(escape_control(message_)) {}
};

enum class DType { f32, f64, bf16, f16 };

inline char const* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
  }
  return "?";
}

/// The pool cache's element type (docs/indexer.md): the storage type itself, or
/// E4M3 with the amax or the power-of-two scale mode, or E4M3 in the
/// serving profile (bf16-rounded rotation, 1e-4 floor, UE8M0 scales; its
/// select blocks quantize the queries the same way).
enum class PoolCache { native, fp8, fp8_pow2, fp8_serving };

inline char const* pool_cache_name(PoolCache c) {
  switch (c) {
    case PoolCache::native: return "native";
    case PoolCache::fp8: return "fp8";
    case PoolCache::fp8_pow2: return "fp8_pow2";
    case PoolCache::fp8_serving: return "fp8_serving";
  }
  return "?";
}

/// Sizes past which a trace is refused, so that a declared size nobody can
/// allocate is a TraceError on its line rather than a bad_alloc later.
/// "Elements" count values of the storage type. The defaults are what
/// kpool_replay and kpool_trace_check read with; fuzz/fuzz_trace.cpp parses
/// with smaller ones, so that no input of a few bytes costs a gigabyte.
struct Limits {
  std::uint64_t max_head_dim = 65536;
  std::uint64_t max_kpool = 4096;
  std::uint64_t max_slots = 1u << 20;
  std::uint64_t max_next_n = 65536;
  std::uint64_t max_index_heads = 4096;
  std::uint64_t max_index_topk = 1u << 20;
  /// One array: the ring, one block's key or gate (or queries), the pooled
  /// output, one select block's pool ids.
  std::uint64_t max_elements = 1ull << 26;
  /// Every token the trace feeds (or queries), times head_dim (what the
  /// output and a checker's per-sequence inputs grow with).
  std::uint64_t max_total_elements = 1ull << 28;
};

enum class BlockKind { step, decode, select };

inline char const* block_name(BlockKind k) {
  switch (k) {
    case BlockKind::step: return "step";
    case BlockKind::decode: return "decode";
    case BlockKind::select: return "select";
  }
  return "?";
}

/// One batch row.
///   step:   cache_len and n_new as written;
///   decode: positions (next_n entries, -1 = padded), n_new = the real
///           ones, cache_len = the first real one (the sequence's length
///           before the row when none is real);
///   select: cache_len = first, n_new = n (query positions
///           first .. first + n - 1), slot = the sequence's slot.
/// A row covers positions [cache_len, cache_len + n_new).
struct Row {
  std::uint32_t seq = 0;
  std::uint32_t slot = 0;
  std::uint64_t cache_len = 0;
  std::uint64_t n_new = 0;
  std::vector<std::int32_t> positions;
  /// Revisions of positions cache_len, cache_len + 1, ...: the r-th re-send
  /// of a position (r = 0 its first sending) has revision r (docs/trace.md,
  /// "Rewinds"). In a select row, the revision of the values last sent for
  /// each queried position. Positions past the vector's end have revision
  /// 0 (it holds only re-sent positions in a step or decode row, at most R).
  std::vector<std::uint32_t> revisions;
  /// The row starts below the sequence's length (a step or decode rewind).
  bool rewinds = false;
  /// select: the row queries the sequence's latest tokens (first + n is
  /// its length when the block is read), as a serving engine's decode
  /// step does.
  bool at_length = false;
  int line = 0;

  std::uint32_t revision(std::uint64_t pos) const {
    std::uint64_t const i = pos - cache_len;
    return pos >= cache_len && i < revisions.size() ? revisions[i] : 0;
  }
};

struct Block {
  BlockKind kind = BlockKind::step;
  int next_n = 0;  // decode only
  int line = 0;    // the `step` / `decode` / `select` line
  std::vector<Row> rows;
  std::uint64_t tokens = 0;  // step: sum of n_new (rows of key and gate);
                             // select: query tokens
};

/// What the trace fed a sequence, over its whole life.
struct Sequence {
  std::uint32_t slot = 0;
  /// Its length L: where its last row ended (its last row at the end of
  /// the trace, or when its slot went to another sequence). Pools
  /// [0, fed / K) are complete; without rewinds, the tokens fed.
  std::uint64_t fed = 0;
  /// H: one past the highest position ever fed.
  std::uint64_t high = 0;
  /// How many times each position below `high` was sent.
  std::vector<std::uint32_t> sends;
  int first_line = 0;
  bool finished = false;  // its slot went to another sequence

  /// The revision of the values last sent for `pos` (< high).
  std::uint32_t last_revision(std::uint64_t pos) const {
    return sends[pos] - 1;
  }
};

struct Trace {
  int version = 1;
  int head_dim = 0;
  int kpool = 0;
  DType dtype = DType::f32;
  std::uint32_t slots = 0;
  std::uint64_t seed = 0;
  // Version 2 header lines; absent ones keep these defaults.
  int ring = 0;         // R, the ring length; kpool unless the header says
  int index_heads = 0;  // H of a selection; 0 = not given
  int index_topk = 0;   // topk of a selection; 0 = not given
  PoolCache pool_cache = PoolCache::native;
  bool rotate = false;

  std::vector<Block> blocks;
  std::map<std::uint32_t, Sequence> sequences;
  std::uint64_t total_tokens = 0;  // every sending of a position
  /// Pool emissions over the whole trace: one each time a pool's last
  /// member is sent (docs/trace.md, `emitted E`).
  std::uint64_t emissions = 0;
  std::uint64_t select_queries = 0;  // query tokens of every select block

  std::uint64_t complete_pools() const {
    std::uint64_t n = 0;
    for (auto const& s : sequences) n += s.second.fed / kpool;
    return n;
  }
};

// ---------------------------------------------------------------------------
// Inputs (docs/trace.md, "The inputs"): all u64 arithmetic wraps.

inline std::uint64_t mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// docs/trace.md's value(seq, pos, c, which) under the trace's seed. In [-2, 2),
/// exact in f32.
inline float value(std::uint64_t seed, std::uint64_t seq, std::uint64_t pos,
                   std::uint64_t c, std::uint64_t which) {
  std::uint64_t x = seed;
  x = mix(x ^ (seq * 0x9E3779B97F4A7C15ull));
  x = mix(x ^ (pos * 0xC2B2AE3D27D4EB4Full));
  x = mix(x ^ (c * 0x165667B19E3779F9ull + which));
  return static_cast<float>((x >> 40) & 0xFFFFFFu) / 16777216.0f * 4.0f - 2.0f;
}

/// key[seq][pos][c] of the given revision (the r-th re-send of pos uses
/// which + 8 r), before rounding into the storage type.
inline float key_value(std::uint64_t seed, std::uint64_t seq, std::uint64_t pos,
                       std::uint64_t c, std::uint64_t revision = 0) {
  return value(seed, seq, pos, c, 0 + 8 * revision);
}
/// gate[seq][pos][c] of the given revision, before rounding.
inline float gate_value(std::uint64_t seed, std::uint64_t seq,
                        std::uint64_t pos, std::uint64_t c,
                        std::uint64_t revision = 0) {
  return value(seed, seq, pos, c, 1 + 8 * revision);
}
/// ape[m][c] = value(0, m, c, 2): seq 0, position m, under the trace's seed
/// like every other input; kept f32.
inline float ape_value(std::uint64_t seed, std::uint64_t m, std::uint64_t c) {
  return value(seed, 0, m, c, 2);
}
/// q[seq][pos][h][c] (before rounding into the storage type) for a query at
/// `pos` whose values were last sent with `revision`.
inline float query_value(std::uint64_t seed, std::uint64_t seq,
                         std::uint64_t pos, std::uint64_t h, std::uint64_t c,
                         std::uint64_t head_dim, std::uint64_t revision = 0) {
  return value(seed, seq, pos, h * head_dim + c, 3 + 8 * revision);
}
/// weights[seq][pos][h], kept f32.
inline float weight_value(std::uint64_t seed, std::uint64_t seq,
                          std::uint64_t pos, std::uint64_t h,
                          std::uint64_t revision = 0) {
  return value(seed, seq, pos, h, 4 + 8 * revision);
}

// ---------------------------------------------------------------------------
// Parser.

namespace Details {

inline std::vector<std::string> fields_of(std::string const& line) {
  std::string s = line.substr(0, line.find('#'));
  std::vector<std::string> out;
  std::size_t i = 0;
  auto const space = [](char ch) {
    return ch == ' ' || ch == '\t' || ch == '\r';
  };
  while (i < s.size()) {
    while (i < s.size() && space(s[i])) ++i;
    std::size_t const b = i;
    while (i < s.size() && !space(s[i])) ++i;
    if (i > b) out.push_back(s.substr(b, i - b));
  }
  return out;
}

// A decimal unsigned integer no greater than `max`: digits only, no sign.
inline std::uint64_t parse_u(std::string const& tok, std::uint64_t max,
                             char const* what, int line) {
  if (tok.empty() ||
      !std::all_of(tok.begin(), tok.end(),
                   [](char ch) { return ch >= '0' && ch <= '9'; }))
    throw TraceError(line, std::string("malformed ") + what + " '" + tok +
                               "' (expected a decimal integer)");
  std::uint64_t v = 0;
  for (char ch : tok) {
    std::uint64_t const d = static_cast<std::uint64_t>(ch - '0');
    if (v > (max - d) / 10)
      throw TraceError(line, std::string(what) + " '" + tok +
                                 "' is out of range (at most " +
                                 std::to_string(max) + ")");
    v = v * 10 + d;
  }
  return v;
}

// A size that must be at least 1 and at most `max`.
inline std::uint64_t parse_size(std::string const& tok, std::uint64_t max,
                                char const* what, int line) {
  std::uint64_t const v =
      parse_u(tok, std::numeric_limits<std::uint64_t>::max(), what, line);
  if (v < 1)
    throw TraceError(line, std::string(what) + " must be at least 1");
  if (v > max)
    throw TraceError(line, std::string(what) + " " + tok +
                               " is too large (at most " +
                               std::to_string(max) + ")");
  return v;
}

inline std::uint64_t sat_mul(std::uint64_t a, std::uint64_t b) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a)
    return std::numeric_limits<std::uint64_t>::max();
  return a * b;
}

// Pools whose last member is among positions [c, end): one per position
// p * K + K - 1 in that range.
inline std::uint64_t pools_ending_in(std::uint64_t c, std::uint64_t end,
                                     std::uint64_t K) {
  return end / K - c / K;
}

class Parser {
 public:
  explicit Parser(Limits const& limits) : limits_(limits) {}

  Trace parse(std::istream& in) {
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
      ++n;
      handle(n, fields_of(line));
    }
    if (in.bad()) throw TraceError(std::max(n, 1), "read error");
    finish(n);
    return std::move(t_);
  }

 private:
  static constexpr char const* header_[6] = {"kpool-trace", "head_dim",
                                             "kpool",       "dtype",
                                             "slots",       "seed"};
  // Version 2: optional, after `seed`, in this order.
  static constexpr char const* optional_[5] = {
      "ring", "index_heads", "index_topk", "pool_cache", "rotate"};

  static int optional_index(std::string const& d) {
    for (int i = 0; i < 5; ++i)
      if (d == optional_[i]) return i;
    return -1;
  }

  void handle(int ln, std::vector<std::string> const& f) {
    if (f.empty()) return;
    std::string const& d = f[0];
    if (header_done_ < 6) return header(ln, f);
    int const opt = optional_index(d);
    if (opt >= 0) return optional_header(ln, f, opt);
    if (std::find(std::begin(header_), std::end(header_), d) !=
        std::end(header_))
      throw TraceError(ln, "header directive '" + d +
                               "' after the header (it came first, at line " +
                               std::to_string(header_lines_[0]) + ")");
    if (d == "step" || d == "decode" || d == "select") return open(ln, f);
    if (d == "row") {
      if (!open_)
        throw TraceError(ln, t_.version == 1
                                 ? "'row' outside a step or decode block"
                                 : "'row' outside a step, decode or select "
                                   "block");
      return row(ln, f);
    }
    if (d == "end") {
      if (!open_)
        throw TraceError(ln, t_.version == 1
                                 ? "'end' without a step or decode block"
                                 : "'end' without a step, decode or select "
                                   "block");
      if (f.size() != 1) throw TraceError(ln, "'end' takes no fields");
      close();
      return;
    }
    throw TraceError(ln, "unknown directive '" + d + "'");
  }

  void header(int ln, std::vector<std::string> const& f) {
    std::string const want = header_[header_done_];
    if (f[0] != want) {
      bool const known =
          std::find(std::begin(header_), std::end(header_), f[0]) !=
          std::end(header_);
      throw TraceError(
          ln, known ? "header out of order: expected '" + want + "', got '" +
                          f[0] + "' (the header is kpool-trace, head_dim, "
                                 "kpool, dtype, slots, seed)"
                    : "expected header directive '" + want + "', got '" +
                          f[0] + "'");
    }
    if (f.size() != 2)
      throw TraceError(ln, "'" + want + "' takes one field, got " +
                               std::to_string(f.size() - 1));
    std::string const& v = f[1];
    switch (header_done_) {
      case 0: {
        std::uint64_t const version = parse_u(
            v, std::numeric_limits<std::uint64_t>::max(), "version", ln);
        if (version != 1 && version != 2)
          throw TraceError(ln, "unsupported trace version " + v +
                                   " (this reader knows versions 1 and 2)");
        t_.version = static_cast<int>(version);
        break;
      }
      case 1:
        t_.head_dim = static_cast<int>(
            parse_size(v, limits_.max_head_dim, "head_dim", ln));
        break;
      case 2:
        t_.kpool =
            static_cast<int>(parse_size(v, limits_.max_kpool, "kpool", ln));
        if (sat_mul(t_.kpool, t_.head_dim) > limits_.max_elements)
          throw TraceError(ln, "kpool * head_dim is too large");
        t_.ring = t_.kpool;
        break;
      case 3:
        if (v == "f32") t_.dtype = DType::f32;
        else if (v == "f64") t_.dtype = DType::f64;
        else if (v == "bf16") t_.dtype = DType::bf16;
        else if (v == "f16") t_.dtype = DType::f16;
        else
          throw TraceError(ln, "unknown dtype '" + v +
                                   "' (expected f32, f64, bf16 or f16)");
        break;
      case 4:
        t_.slots = static_cast<std::uint32_t>(
            parse_size(v, limits_.max_slots, "slots", ln));
        check_ring_size(ln);
        break;
      case 5:
        t_.seed = parse_u(v, std::numeric_limits<std::uint64_t>::max(),
                          "seed", ln);
        break;
    }
    header_lines_[header_done_++] = ln;
  }

  void check_ring_size(int ln) const {
    std::uint64_t const ring =
        sat_mul(sat_mul(t_.slots, 2), sat_mul(t_.ring, t_.head_dim));
    if (ring > limits_.max_elements)
      throw TraceError(ln, "the ring (slots * 2 * " +
                               std::string(t_.ring == t_.kpool ? "kpool"
                                                               : "ring") +
                               " * head_dim = " + std::to_string(ring) +
                               " values) is too large (at most " +
                               std::to_string(limits_.max_elements) + ")");
  }

  // ring, index_heads, index_topk, pool_cache, rotate: version 2, each at
  // most once, in that order, before the first block.
  void optional_header(int ln, std::vector<std::string> const& f, int idx) {
    std::string const& d = f[0];
    if (t_.version < 2)
      throw TraceError(ln, "'" + d + "' is a version 2 header directive "
                                     "(this trace is version 1)");
    if (blocks_started_)
      throw TraceError(ln, "header directive '" + d +
                               "' after the first block (line " +
                               std::to_string(first_block_line_) + ")");
    if (optional_lines_[idx] != 0)
      throw TraceError(ln, "'" + d + "' appears twice in the header (first "
                                     "at line " +
                               std::to_string(optional_lines_[idx]) + ")");
    if (idx < optional_next_)
      throw TraceError(
          ln, "header out of order: '" + d + "' after '" +
                  optional_[optional_last_] +
                  "' (after seed come, each optional, ring, index_heads, "
                  "index_topk, pool_cache, rotate)");
    if (f.size() != 2)
      throw TraceError(ln, "'" + d + "' takes one field, got " +
                               std::to_string(f.size() - 1));
    std::string const& v = f[1];
    switch (idx) {
      case 0: {
        std::uint64_t const R = parse_size(
            v, std::numeric_limits<std::uint64_t>::max(), "ring", ln);
        std::uint64_t const K = static_cast<std::uint64_t>(t_.kpool);
        if (R < K || R % K != 0)
          throw TraceError(ln, "ring " + v + " is " +
                                   (R < K ? "less than" : "not a multiple of") +
                                   " kpool " + std::to_string(K) +
                                   " (the ring length is a multiple of kpool, "
                                   "at least kpool)");
        if (R > 0x7FFFFFFFull)
          throw TraceError(ln, "ring " + v + " is too large");
        t_.ring = static_cast<int>(R);
        check_ring_size(ln);
        break;
      }
      case 1:
        t_.index_heads = static_cast<int>(
            parse_size(v, limits_.max_index_heads, "index_heads", ln));
        break;
      case 2:
        t_.index_topk = static_cast<int>(
            parse_size(v, limits_.max_index_topk, "index_topk", ln));
        break;
      case 3:
        if (v == "native") t_.pool_cache = PoolCache::native;
        else if (v == "fp8") t_.pool_cache = PoolCache::fp8;
        else if (v == "fp8_pow2") t_.pool_cache = PoolCache::fp8_pow2;
        else if (v == "fp8_serving") t_.pool_cache = PoolCache::fp8_serving;
        else
          throw TraceError(ln, "unknown pool_cache '" + v +
                                   "' (expected native, fp8, fp8_pow2 or fp8_serving)");
        // docs/indexer.md: an fp8 cache of f64 pools is refused.
        if (t_.pool_cache != PoolCache::native && t_.dtype == DType::f64)
          throw TraceError(ln, "pool_cache " + v +
                                   " needs a dtype other than f64");
        break;
      case 4:
        if (v != "0" && v != "1")
          throw TraceError(ln, "malformed rotate '" + v + "' (expected 0 or 1)");
        t_.rotate = v == "1";
        // docs/indexer.md: the Walsh-Hadamard rotation needs D a power of two.
        if (t_.rotate && (t_.head_dim & (t_.head_dim - 1)) != 0)
          throw TraceError(ln, "rotate 1 needs head_dim a power of two, not " +
                                   std::to_string(t_.head_dim));
        break;
    }
    optional_lines_[idx] = ln;
    optional_next_ = idx + 1;
    optional_last_ = idx;
  }

  void open(int ln, std::vector<std::string> const& f) {
    if (open_)
      throw TraceError(ln, "'" + f[0] + "' inside the block opened at line " +
                               std::to_string(block_.line) +
                               " (missing 'end')");
    if (!blocks_started_) first_block_line_ = ln;
    blocks_started_ = true;
    block_ = Block();
    block_.line = ln;
    if (f[0] == "step") {
      if (f.size() != 1) throw TraceError(ln, "'step' takes no fields");
    } else if (f[0] == "decode") {
      if (f.size() != 2)
        throw TraceError(ln, "'decode' takes one field (next_n)");
      block_.kind = BlockKind::decode;
      block_.next_n =
          static_cast<int>(parse_size(f[1], limits_.max_next_n, "next_n", ln));
    } else {
      if (t_.version < 2)
        throw TraceError(ln, "'select' is a version 2 block (this trace is "
                             "version 1)");
      if (f.size() != 1) throw TraceError(ln, "'select' takes no fields");
      if (t_.index_heads == 0 || t_.index_topk == 0)
        throw TraceError(
            ln, std::string("a select block needs the header's ") +
                    (t_.index_heads == 0 && t_.index_topk == 0
                         ? "index_heads and index_topk"
                         : t_.index_heads == 0 ? "index_heads"
                                               : "index_topk") +
                    " (after seed and ring)");
      block_.kind = BlockKind::select;
    }
    open_ = true;
    seqs_in_block_.clear();
    slots_in_block_.clear();
  }

  void row(int ln, std::vector<std::string> const& f) {
    if (block_.kind == BlockKind::select) return select_row(ln, f);
    bool const decode = block_.kind == BlockKind::decode;
    std::size_t const want = decode ? 3 + block_.next_n : 5;
    if (f.size() != want)
      throw TraceError(
          ln, "a " + std::string(decode ? "decode" : "step") + " row has " +
                  std::to_string(want - 1) + " fields (" +
                  (decode ? "seq slot pos_0 .. pos_" +
                                std::to_string(block_.next_n - 1)
                          : std::string("seq slot cache_len n_new")) +
                  "), got " + std::to_string(f.size() - 1));
    Row r;
    r.line = ln;
    r.seq = static_cast<std::uint32_t>(parse_u(f[1], 0xFFFFFFFFull, "seq", ln));
    r.slot =
        static_cast<std::uint32_t>(parse_u(f[2], 0xFFFFFFFFull, "slot", ln));
    if (decode) {
      r.positions.resize(block_.next_n);
      for (int i = 0; i < block_.next_n; ++i) {
        std::string const& tok = f[3 + i];
        if (tok == "-1") {
          r.positions[i] = -1;
        } else if (!tok.empty() && tok[0] == '-') {
          throw TraceError(ln, "malformed position '" + tok +
                                   "' (a padded entry is -1)");
        } else {
          r.positions[i] = static_cast<std::int32_t>(
              parse_u(tok, 0x7FFFFFFF, "position", ln));
        }
        if (r.positions[i] >= 0) ++r.n_new;
      }
    } else {
      r.cache_len = parse_u(f[3], 0xFFFFFFFFull, "cache_len", ln);
      r.n_new = parse_u(f[4], 0xFFFFFFFFull, "n_new", ln);
    }
    std::string const seq = std::to_string(r.seq);
    std::string const slot = std::to_string(r.slot);

    if (r.slot >= t_.slots)
      throw TraceError(ln, "slot " + slot + " is outside [0, " +
                               std::to_string(t_.slots) + ")");
    once_in_block(ln, r.seq);
    auto const lb = slots_in_block_.emplace(r.slot, ln);
    if (!lb.second)
      throw TraceError(ln, "slot " + slot +
                               " is on two rows of the block (first at line " +
                               std::to_string(lb.first->second) + ")");

    auto it = t_.sequences.find(r.seq);
    if (it == t_.sequences.end()) {
      // A new sequence: whoever held the slot before has finished.
      auto h = holder_.find(r.slot);
      if (h != holder_.end()) {
        Sequence& old = t_.sequences[h->second];
        old.finished = true;
        finished_by_[h->second] = std::make_pair(r.seq, ln);
      }
      Sequence s;
      s.slot = r.slot;
      s.first_line = ln;
      it = t_.sequences.emplace(r.seq, s).first;
      holder_[r.slot] = r.seq;
    } else {
      Sequence const& s = it->second;
      if (s.finished) not_live(ln, r.seq, s);
      if (s.slot != r.slot)
        throw TraceError(ln, "sequence " + seq + " has slot " +
                                 std::to_string(s.slot) + " (since line " +
                                 std::to_string(s.first_line) +
                                 "), not slot " + slot);
    }
    Sequence& s = it->second;

    if (decode) {
      // Real positions are consecutive; in version 2 the first may rewind.
      std::int64_t prev = -1;
      bool first = true;
      for (int i = 0; i < block_.next_n; ++i) {
        std::int32_t const p = r.positions[i];
        if (p < 0) continue;
        std::uint64_t const pos = static_cast<std::uint64_t>(p);
        if (first && t_.version >= 2) {
          if (pos > s.fed)
            throw TraceError(
                ln, "sequence " + seq + ": position " + std::to_string(p) +
                        " (pos_" + std::to_string(i) +
                        ") is past the sequence's length " +
                        std::to_string(s.fed) +
                        " (a row may rewind, never skip ahead)");
        } else {
          std::uint64_t const next =
              first ? s.fed : static_cast<std::uint64_t>(prev) + 1;
          if (pos != next)
            throw TraceError(
                ln, "sequence " + seq + ": position " + std::to_string(p) +
                        " (pos_" + std::to_string(i) + ") should be " +
                        std::to_string(next) +
                        (first || t_.version < 2
                             ? " (real positions continue the tokens fed, "
                               "one by one)"
                             : " (real positions are consecutive)"));
        }
        if (first) r.cache_len = pos;
        first = false;
        prev = p;
      }
      if (first) r.cache_len = s.fed;  // nothing real
    } else if (r.cache_len != s.fed && t_.version < 2) {
      throw TraceError(ln, "sequence " + seq + ": cache_len " +
                               std::to_string(r.cache_len) + " should be " +
                               std::to_string(s.fed) +
                               " (the tokens already fed)");
    } else if (r.cache_len > s.fed) {
      throw TraceError(ln, "sequence " + seq + ": cache_len " +
                               std::to_string(r.cache_len) +
                               " is past the sequence's length " +
                               std::to_string(s.fed) +
                               " (a row may rewind, never skip ahead)");
    }
    std::uint64_t const end = r.cache_len + r.n_new;
    if (end > 0x7FFFFFFFull)
      throw TraceError(ln, "sequence " + seq +
                               " grows past 2^31 - 1 tokens (int32 positions)");
    std::uint64_t const D = static_cast<std::uint64_t>(t_.head_dim);
    std::uint64_t const total = t_.total_tokens + r.n_new;
    if (sat_mul(total, D) > limits_.max_total_elements)
      throw TraceError(ln, "the trace feeds too many tokens (" +
                               std::to_string(total) + " of head_dim " +
                               std::to_string(D) + ": at most " +
                               std::to_string(limits_.max_total_elements) +
                               " values in all)");
    std::uint64_t const rows = block_.rows.size() + 1;
    std::uint64_t const tokens = block_.tokens + r.n_new;
    std::uint64_t const block_values =
        decode ? sat_mul(sat_mul(rows, block_.next_n), D)
               : sat_mul(tokens + rows, D);  // key rows + output rows
    if (block_values > limits_.max_elements)
      throw TraceError(ln, "the block opened at line " +
                               std::to_string(block_.line) +
                               " is too large (" +
                               std::to_string(block_values) +
                               " values per array, at most " +
                               std::to_string(limits_.max_elements) + ")");

    // The row is valid: send its positions.
    r.rewinds = (r.n_new > 0 || !decode) && r.cache_len < s.fed;
    if (s.sends.size() < end) s.sends.resize(end, 0);
    for (std::uint64_t pos = r.cache_len; pos < end; ++pos)
      if (s.sends[pos] > 0) r.revisions.push_back(s.sends[pos]);
    for (std::uint64_t pos = r.cache_len; pos < end; ++pos) ++s.sends[pos];
    if (r.n_new > 0 || !decode) s.fed = end;
    s.high = std::max(s.high, end);
    t_.emissions += pools_ending_in(r.cache_len, end, t_.kpool);
    t_.total_tokens = total;
    if (!decode) block_.tokens = tokens;
    block_.rows.push_back(std::move(r));
  }

  void once_in_block(int ln, std::uint32_t seq) {
    auto const sb = seqs_in_block_.emplace(seq, ln);
    if (!sb.second)
      throw TraceError(ln, "sequence " + std::to_string(seq) +
                               " appears twice in the block (first at line " +
                               std::to_string(sb.first->second) + ")");
  }

  [[noreturn]] void not_live(int ln, std::uint32_t seq, Sequence const& s) {
    auto const& by = finished_by_[seq];
    throw TraceError(ln, "sequence " + std::to_string(seq) +
                             " finished when slot " + std::to_string(s.slot) +
                             " went to sequence " + std::to_string(by.first) +
                             " (line " + std::to_string(by.second) +
                             ") and must not appear again");
  }

  // row SEQ FIRST N: queries at positions first .. first + n - 1 of a live
  // sequence, within its length, each sequence once a block.
  void select_row(int ln, std::vector<std::string> const& f) {
    if (f.size() != 4)
      throw TraceError(ln, "a select row has 3 fields (seq first n), got " +
                               std::to_string(f.size() - 1));
    Row r;
    r.line = ln;
    r.seq = static_cast<std::uint32_t>(parse_u(f[1], 0xFFFFFFFFull, "seq", ln));
    r.cache_len = parse_u(f[2], 0xFFFFFFFFull, "first", ln);
    r.n_new = parse_u(f[3], 0xFFFFFFFFull, "n", ln);
    std::string const seq = std::to_string(r.seq);
    once_in_block(ln, r.seq);
    auto const it = t_.sequences.find(r.seq);
    if (it == t_.sequences.end())
      throw TraceError(ln, "sequence " + seq +
                               " has not been fed (a select row queries a "
                               "live sequence)");
    Sequence const& s = it->second;
    if (s.finished) not_live(ln, r.seq, s);
    if (r.cache_len + r.n_new > s.fed)
      throw TraceError(ln, "sequence " + seq + ": first + n = " +
                               std::to_string(r.cache_len + r.n_new) +
                               " is past the sequence's length " +
                               std::to_string(s.fed));
    std::uint64_t const HD = sat_mul(t_.index_heads, t_.head_dim);
    std::uint64_t const total = t_.select_queries + r.n_new;
    if (sat_mul(total, HD) > limits_.max_total_elements)
      throw TraceError(ln, "the trace queries too many tokens (" +
                               std::to_string(total) + " of index_heads * "
                               "head_dim " + std::to_string(HD) +
                               ": at most " +
                               std::to_string(limits_.max_total_elements) +
                               " values in all)");
    std::uint64_t const tokens = block_.tokens + r.n_new;
    std::uint64_t const block_values =
        std::max(sat_mul(tokens, HD), sat_mul(tokens, t_.index_topk));
    if (block_values > limits_.max_elements)
      throw TraceError(ln, "the block opened at line " +
                               std::to_string(block_.line) +
                               " is too large (" +
                               std::to_string(block_values) +
                               " values per array, at most " +
                               std::to_string(limits_.max_elements) + ")");
    r.slot = s.slot;
    r.at_length = r.cache_len + r.n_new == s.fed;
    r.revisions.reserve(r.n_new);
    for (std::uint64_t pos = r.cache_len; pos < r.cache_len + r.n_new; ++pos)
      r.revisions.push_back(s.last_revision(pos));
    t_.select_queries = total;
    block_.tokens = tokens;
    block_.rows.push_back(std::move(r));
  }

  void close() {
    t_.blocks.push_back(std::move(block_));
    block_ = Block();
    open_ = false;
  }

  void finish(int n) {
    int const ln = std::max(n, 1);
    if (header_done_ < 6)
      throw TraceError(ln, std::string("the trace ends before header "
                                       "directive '") +
                               header_[header_done_] + "'");
    if (open_)
      throw TraceError(block_.line, std::string("the ") +
                                        block_name(block_.kind) +
                                        " block opened here has no 'end'");
  }

  Trace t_;
  int header_done_ = 0;
  int header_lines_[6] = {0, 0, 0, 0, 0, 0};
  int optional_lines_[5] = {0, 0, 0, 0, 0};
  int optional_next_ = 0;  // the first optional header line still allowed
  int optional_last_ = 0;  // the last one given
  bool blocks_started_ = false;
  int first_block_line_ = 0;
  bool open_ = false;
  Block block_;
  std::map<std::uint32_t, int> seqs_in_block_;   // seq -> line
  std::map<std::uint32_t, int> slots_in_block_;  // slot -> line
  Limits limits_;
  std::map<std::uint32_t, std::uint32_t> holder_;  // slot -> current seq
  std::map<std::uint32_t, std::pair<std::uint32_t, int>> finished_by_;
};

}  // namespace Details

/// Reads a whole trace, checking every rule of docs/trace.md (versions 1
/// and 2) and the sizes in `limits`; throws TraceError.
inline Trace parse(std::istream& in, Limits const& limits = Limits()) {
  Details::Parser p(limits);
  return p.parse(in);
}

}  // namespace KPoolTrace

#endif
