#ifndef KPOOL_TRACE_HPP
#define KPOOL_TRACE_HPP

// The serving-trace format, version 1 (docs/trace.md): data model, parser and the
// deterministic input function. Host only, header only, no Kokkos, so the
// replay program, the generator and the checker all read traces the same way.

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

/// A broken trace: the 1-based line it was found on and what is wrong.
/// what() reads "trace:LINE: message", the replay program's error line.
struct TraceError : std::runtime_error {
  int line;
  std::string message;
  TraceError(int line_, std::string message_)
      : std::runtime_error("trace:" + std::to_string(line_) + ": " + message_),
        line(line_),
        message(std::move(message_)) {}
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

/// Sizes past which a trace is refused, so that a declared size nobody can
/// allocate is a TraceError on its line rather than a bad_alloc later.
/// "Elements" count values of the storage type.
struct Limits {
  static constexpr std::uint64_t max_head_dim = 65536;
  static constexpr std::uint64_t max_kpool = 4096;
  static constexpr std::uint64_t max_slots = 1u << 20;
  static constexpr std::uint64_t max_next_n = 65536;
  /// One array: the ring, one block's key or gate, the pooled output.
  static constexpr std::uint64_t max_elements = 1ull << 26;
  /// Every token the trace feeds, times head_dim (what the output and a
  /// checker's per-sequence inputs grow with).
  static constexpr std::uint64_t max_total_elements = 1ull << 28;
};

/// One batch row. In a step block, cache_len and n_new; in a decode block,
/// positions (next_n entries, -1 = padded) and n_new = the real ones.
struct Row {
  std::uint32_t seq = 0;
  std::uint32_t slot = 0;
  std::uint64_t cache_len = 0;
  std::uint64_t n_new = 0;
  std::vector<std::int32_t> positions;
  int line = 0;
};

struct Block {
  bool decode = false;
  int next_n = 0;  // decode only
  int line = 0;    // the `step` / `decode` line
  std::vector<Row> rows;
  std::uint64_t tokens = 0;  // step: sum of n_new (rows of key and gate)
};

/// What the trace fed a sequence, over its whole life.
struct Sequence {
  std::uint32_t slot = 0;
  std::uint64_t fed = 0;  // tokens fed: pools [0, fed / K) are complete
  int first_line = 0;
  bool finished = false;  // its slot went to another sequence
};

struct Trace {
  int version = 1;
  int head_dim = 0;
  int kpool = 0;
  DType dtype = DType::f32;
  std::uint32_t slots = 0;
  std::uint64_t seed = 0;
  std::vector<Block> blocks;
  std::map<std::uint32_t, Sequence> sequences;
  std::uint64_t total_tokens = 0;

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

/// key[seq][pos][c], before rounding into the storage type.
inline float key_value(std::uint64_t seed, std::uint64_t seq, std::uint64_t pos,
                       std::uint64_t c) {
  return value(seed, seq, pos, c, 0);
}
/// gate[seq][pos][c], before rounding into the storage type.
inline float gate_value(std::uint64_t seed, std::uint64_t seq,
                        std::uint64_t pos, std::uint64_t c) {
  return value(seed, seq, pos, c, 1);
}
/// ape[m][c] = value(0, m, c, 2): seq 0, position m, under the trace's seed
/// like every other input; kept f32.
inline float ape_value(std::uint64_t seed, std::uint64_t m, std::uint64_t c) {
  return value(seed, 0, m, c, 2);
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

class Parser {
 public:
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

  void handle(int ln, std::vector<std::string> const& f) {
    if (f.empty()) return;
    std::string const& d = f[0];
    if (header_done_ < 6) return header(ln, f);
    if (std::find(std::begin(header_), std::end(header_), d) !=
        std::end(header_))
      throw TraceError(ln, "header directive '" + d +
                               "' after the header (it came first, at line " +
                               std::to_string(header_lines_[0]) + ")");
    if (d == "step" || d == "decode") return open(ln, f);
    if (d == "row") {
      if (!open_) throw TraceError(ln, "'row' outside a step or decode block");
      return row(ln, f);
    }
    if (d == "end") {
      if (!open_) throw TraceError(ln, "'end' without a step or decode block");
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
      case 0:
        if (parse_u(v, std::numeric_limits<std::uint64_t>::max(), "version",
                    ln) != 1)
          throw TraceError(ln, "unsupported trace version " + v +
                                   " (this reader knows version 1)");
        t_.version = 1;
        break;
      case 1:
        t_.head_dim = static_cast<int>(
            parse_size(v, Limits::max_head_dim, "head_dim", ln));
        break;
      case 2:
        t_.kpool =
            static_cast<int>(parse_size(v, Limits::max_kpool, "kpool", ln));
        if (sat_mul(t_.kpool, t_.head_dim) > Limits::max_elements)
          throw TraceError(ln, "kpool * head_dim is too large");
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
      case 4: {
        t_.slots = static_cast<std::uint32_t>(
            parse_size(v, Limits::max_slots, "slots", ln));
        std::uint64_t const ring =
            sat_mul(sat_mul(t_.slots, 2), sat_mul(t_.kpool, t_.head_dim));
        if (ring > Limits::max_elements)
          throw TraceError(ln, "the ring (slots * 2 * kpool * head_dim = " +
                                   std::to_string(ring) +
                                   " values) is too large (at most " +
                                   std::to_string(Limits::max_elements) + ")");
        break;
      }
      case 5:
        t_.seed = parse_u(v, std::numeric_limits<std::uint64_t>::max(),
                          "seed", ln);
        break;
    }
    header_lines_[header_done_++] = ln;
  }

  void open(int ln, std::vector<std::string> const& f) {
    if (open_)
      throw TraceError(ln, "'" + f[0] + "' inside the block opened at line " +
                               std::to_string(block_.line) +
                               " (missing 'end')");
    block_ = Block();
    block_.line = ln;
    if (f[0] == "step") {
      if (f.size() != 1) throw TraceError(ln, "'step' takes no fields");
    } else {
      if (f.size() != 2)
        throw TraceError(ln, "'decode' takes one field (next_n)");
      block_.decode = true;
      block_.next_n =
          static_cast<int>(parse_size(f[1], Limits::max_next_n, "next_n", ln));
    }
    open_ = true;
    seqs_in_block_.clear();
    slots_in_block_.clear();
  }

  void row(int ln, std::vector<std::string> const& f) {
    std::size_t const want = block_.decode ? 3 + block_.next_n : 5;
    if (f.size() != want)
      throw TraceError(
          ln, "a " + std::string(block_.decode ? "decode" : "step") +
                  " row has " + std::to_string(want - 1) + " fields (" +
                  (block_.decode ? "seq slot pos_0 .. pos_" +
                                       std::to_string(block_.next_n - 1)
                                 : std::string("seq slot cache_len n_new")) +
                  "), got " + std::to_string(f.size() - 1));
    Row r;
    r.line = ln;
    r.seq = static_cast<std::uint32_t>(parse_u(f[1], 0xFFFFFFFFull, "seq", ln));
    r.slot =
        static_cast<std::uint32_t>(parse_u(f[2], 0xFFFFFFFFull, "slot", ln));
    if (block_.decode) {
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
    auto const sb = seqs_in_block_.emplace(r.seq, ln);
    if (!sb.second)
      throw TraceError(ln, "sequence " + seq +
                               " appears twice in the block (first at line " +
                               std::to_string(sb.first->second) + ")");
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
      if (s.finished) {
        auto const& by = finished_by_[r.seq];
        throw TraceError(ln, "sequence " + seq + " finished when slot " +
                                 std::to_string(s.slot) +
                                 " went to sequence " +
                                 std::to_string(by.first) + " (line " +
                                 std::to_string(by.second) +
                                 ") and must not appear again");
      }
      if (s.slot != r.slot)
        throw TraceError(ln, "sequence " + seq + " has slot " +
                                 std::to_string(s.slot) + " (since line " +
                                 std::to_string(s.first_line) +
                                 "), not slot " + slot);
    }
    Sequence& s = it->second;

    if (block_.decode) {
      std::uint64_t next = s.fed;
      for (int i = 0; i < block_.next_n; ++i) {
        std::int32_t const p = r.positions[i];
        if (p < 0) continue;
        if (static_cast<std::uint64_t>(p) != next)
          throw TraceError(
              ln, "sequence " + seq + ": position " + std::to_string(p) +
                      " (pos_" + std::to_string(i) + ") should be " +
                      std::to_string(next) +
                      " (real positions continue the tokens fed, one by one)");
        ++next;
      }
      r.cache_len = s.fed;
    } else if (r.cache_len != s.fed) {
      throw TraceError(ln, "sequence " + seq + ": cache_len " +
                               std::to_string(r.cache_len) + " should be " +
                               std::to_string(s.fed) +
                               " (the tokens already fed)");
    }
    if (s.fed + r.n_new > 0x7FFFFFFFull)
      throw TraceError(ln, "sequence " + seq +
                               " grows past 2^31 - 1 tokens (int32 positions)");
    std::uint64_t const D = static_cast<std::uint64_t>(t_.head_dim);
    std::uint64_t const total = t_.total_tokens + r.n_new;
    if (sat_mul(total, D) > Limits::max_total_elements)
      throw TraceError(ln, "the trace feeds too many tokens (" +
                               std::to_string(total) + " of head_dim " +
                               std::to_string(D) + ": at most " +
                               std::to_string(Limits::max_total_elements) +
                               " values in all)");
    std::uint64_t const rows = block_.rows.size() + 1;
    std::uint64_t const tokens = block_.tokens + r.n_new;
    std::uint64_t const block_values =
        block_.decode ? sat_mul(sat_mul(rows, block_.next_n), D)
                      : sat_mul(tokens + rows, D);  // key rows + output rows
    if (block_values > Limits::max_elements)
      throw TraceError(ln, "the block opened at line " +
                               std::to_string(block_.line) +
                               " is too large (" +
                               std::to_string(block_values) +
                               " values per array, at most " +
                               std::to_string(Limits::max_elements) + ")");
    s.fed += r.n_new;
    t_.total_tokens = total;
    if (!block_.decode) block_.tokens = tokens;
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
      throw TraceError(block_.line,
                       std::string("the ") +
                           (block_.decode ? "decode" : "step") +
                           " block opened here has no 'end'");
  }

  Trace t_;
  int header_done_ = 0;
  int header_lines_[6] = {0, 0, 0, 0, 0, 0};
  bool open_ = false;
  Block block_;
  std::map<std::uint32_t, int> seqs_in_block_;   // seq -> line
  std::map<std::uint32_t, int> slots_in_block_;  // slot -> line
  std::map<std::uint32_t, std::uint32_t> holder_;  // slot -> current seq
  std::map<std::uint32_t, std::pair<std::uint32_t, int>> finished_by_;
};

}  // namespace Details

/// Reads a whole trace, checking every rule of docs/trace.md; throws TraceError.
inline Trace parse(std::istream& in) {
  Details::Parser p;
  return p.parse(in);
}

}  // namespace KPoolTrace

#endif
