// kpool_tracegen: writes a random, valid serving trace (docs/trace.md) to stdout,
// shaped like what a serving engine feeds the k-pool writers: sequences
// admitted into free ring slots, chunked prefills, decode calls with padded
// entries, batches reshuffled every call, finished sequences handing their
// slots to new ones. The same options always give the same trace.
//
// Speculative mode (--drafts S, a version 2 trace): once its prompt is in, a
// sequence mostly decodes in verify rounds, through step and decode blocks
// alike: the next token plus S drafts, a random prefix of the drafts
// accepted, and its next row re-sending from the first rejected position
// (a rewind), sometimes rewinding as deep as the ring allows. The other
// version 2 header lines (--ring, --index-heads, --index-topk,
// --pool-cache, --rotate) can be written too; with --index-heads and
// --index-topk the trace also has select blocks.

#include "KPoolTrace.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

namespace {

char const usage_text[] =
    "usage: kpool_tracegen [options] > TRACE\n"
    "\n"
    "  --seed S        PRNG seed and the trace's input seed (u64, default 1)\n"
    "  --dtype T       f32 | f64 | bf16 | f16 (default bf16)\n"
    "  --kpool K       tokens per pool (default 4)\n"
    "  --head-dim D    channels (default 16)\n"
    "  --slots S       ring slots, the most sequences alive at once "
    "(default 6)\n"
    "  --sequences N   sequences over the whole trace (default 12)\n"
    "  --calls C       step/decode blocks (default 40)\n"
    "  --max-chunk M   most tokens a step row feeds (default 24)\n"
    "\n"
    "Version 2 (any of these makes a version 2 trace):\n"
    "  --version V     1 or 2 (default 1, or 2 when an option below is given)\n"
    "  --drafts S      speculative mode: verify rounds of the next token plus\n"
    "                  S drafts, rejected drafts re-sent (rewinds)\n"
    "  --ring R        ring length, a multiple of kpool (default\n"
    "                  K * next_pow2(ceil((K + S) / K)), K without drafts)\n"
    "  --index-heads H, --index-topk N\n"
    "                  selection sizes; with both, select blocks too\n"
    "  --pool-cache C  native | fp8 | fp8_pow2 | fp8_serving\n"
    "  --rotate 0|1    Walsh-Hadamard rotation (head_dim a power of two)\n"
    "  --help          print this and exit\n";

// splitmix64: small, and a u64 seed gives a full-period stream.
struct Rng {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi].
  std::uint64_t range(std::uint64_t lo, std::uint64_t hi) {
    return lo + next() % (hi - lo + 1);
  }
  bool chance(int percent) { return range(1, 100) <= std::uint64_t(percent); }
  template <class V>
  void shuffle(V& v) {
    for (std::size_t i = v.size(); i > 1; --i)
      std::swap(v[i - 1], v[range(0, i - 1)]);
  }
};

struct Live {
  std::uint32_t seq;
  std::uint32_t slot;
  std::uint64_t fed;     // its length: where its last row ended
  std::uint64_t target;  // finishes once `next` reaches it
  std::uint64_t next;    // where its next row starts (accepted tokens)
  std::uint64_t high;    // one past the highest position sent
  bool seen;             // on a row already (a select row needs that)
};

// K * next_pow2(ceil((K + S) / K)): the ring serving engines size for S
// drafts (docs/writers.md).
std::uint64_t serving_ring(std::uint64_t K, std::uint64_t S) {
  std::uint64_t const pools = (K + S + K - 1) / K;
  std::uint64_t p2 = 1;
  while (p2 < pools) p2 *= 2;
  return K * p2;
}

bool parse_u64(std::string const& s, std::uint64_t& v) {
  if (s.empty() || s.size() > 20) return false;
  v = 0;
  for (char ch : s) {
    if (ch < '0' || ch > '9') return false;
    std::uint64_t const d = static_cast<std::uint64_t>(ch - '0');
    if (v > (~std::uint64_t(0) - d) / 10) return false;
    v = v * 10 + d;
  }
  return true;
}

}  // namespace

int main(int argc, char* argv[]) {
  std::uint64_t seed = 1, K = 4, D = 16, slots = 6, sequences = 12,
                calls = 40, max_chunk = 24;
  std::string dtype = "bf16";
  // Version 2; "unset" keeps a line out of the header.
  std::uint64_t const unset = ~std::uint64_t(0);
  std::uint64_t version = unset, drafts = 0, ring = unset, heads = unset,
                topk = unset, rotate = unset;
  std::string pool_cache;
  auto bad = [](std::string const& why) {
    std::cerr << "kpool_tracegen: " << why << "\n\n" << usage_text;
    return 2;
  };
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << usage_text;
      return 0;
    }
    if (i + 1 >= argc) return bad("unknown option or missing value: '" + a + "'");
    std::string const v = argv[++i];
    if (a == "--dtype") {
      if (v != "f32" && v != "f64" && v != "bf16" && v != "f16")
        return bad("unknown dtype '" + v + "'");
      dtype = v;
      continue;
    }
    if (a == "--pool-cache") {
      if (v != "native" && v != "fp8" && v != "fp8_pow2" && v != "fp8_serving")
        return bad("unknown pool cache '" + v + "'");
      pool_cache = v;
      continue;
    }
    std::uint64_t* dst = a == "--seed"        ? &seed
                         : a == "--kpool"     ? &K
                         : a == "--head-dim"  ? &D
                         : a == "--slots"     ? &slots
                         : a == "--sequences" ? &sequences
                         : a == "--calls"     ? &calls
                         : a == "--max-chunk" ? &max_chunk
                         : a == "--version"   ? &version
                         : a == "--drafts"    ? &drafts
                         : a == "--ring"      ? &ring
                         : a == "--index-heads" ? &heads
                         : a == "--index-topk"  ? &topk
                         : a == "--rotate"      ? &rotate
                                              : nullptr;
    if (!dst) return bad("unknown option '" + a + "'");
    if (!parse_u64(v, *dst)) return bad("bad value '" + v + "' for " + a);
  }
  KPoolTrace::Limits const L;
  if (K < 1 || K > 64) return bad("--kpool must be in [1, 64]");
  if (D < 1 || D > L.max_head_dim) return bad("--head-dim out of range");
  if (slots < 1 || slots > 4096) return bad("--slots must be in [1, 4096]");
  if (sequences > 1000000 || calls > 1000000 || max_chunk > 100000)
    return bad("--sequences, --calls or --max-chunk is too large");
  bool const v2_options = drafts > 0 || ring != unset || heads != unset ||
                          topk != unset || rotate != unset || !pool_cache.empty();
  if (version == unset) version = v2_options ? 2 : 1;
  if (version != 1 && version != 2) return bad("--version must be 1 or 2");
  if (version == 1 && v2_options)
    return bad("--drafts, --ring, --index-*, --pool-cache and --rotate make a "
               "version 2 trace");
  if (drafts > 64) return bad("--drafts must be in [0, 64]");
  if (ring == unset) ring = serving_ring(K, drafts);
  if (ring < K || ring % K != 0 || ring > 4096)
    return bad("--ring must be a multiple of --kpool, at least it, at most 4096");
  if ((heads != unset && (heads < 1 || heads > L.max_index_heads)) ||
      (topk != unset && (topk < 1 || topk > L.max_index_topk)))
    return bad("--index-heads or --index-topk out of range");
  if (rotate != unset && rotate > 1) return bad("--rotate must be 0 or 1");
  if (rotate == 1 && (D & (D - 1)) != 0)
    return bad("--rotate 1 needs --head-dim a power of two");
  if (!pool_cache.empty() && pool_cache != "native" && dtype == "f64")
    return bad("an fp8 --pool-cache needs a --dtype other than f64");
  bool const speculative = drafts > 0;
  bool const selects = heads != unset && topk != unset;

  Rng rng{seed};
  std::string out;
  out += "kpool-trace " + std::to_string(version) + "\n";
  out += "head_dim " + std::to_string(D) + "\n";
  out += "kpool " + std::to_string(K) + "\n";
  out += "dtype " + dtype + "\n";
  out += "slots " + std::to_string(slots) + "\n";
  out += "seed " + std::to_string(seed) + "\n";
  if (version == 2) {
    if (ring != K || speculative) out += "ring " + std::to_string(ring) + "\n";
    if (heads != unset) out += "index_heads " + std::to_string(heads) + "\n";
    if (topk != unset) out += "index_topk " + std::to_string(topk) + "\n";
    if (!pool_cache.empty()) out += "pool_cache " + pool_cache + "\n";
    if (rotate != unset) out += "rotate " + std::to_string(rotate) + "\n";
  }

  std::vector<Live> live;
  std::vector<std::uint32_t> free_slots;
  for (std::uint64_t s = 0; s < slots; ++s)
    free_slots.push_back(static_cast<std::uint32_t>(s));
  rng.shuffle(free_slots);
  std::uint64_t admitted = 0;
  std::uint32_t next_seq = static_cast<std::uint32_t>(rng.range(0, 5));
  // Lengths reach a few pools past one chunk, so prefills get chunked.
  std::uint64_t const longest = 3 * std::max<std::uint64_t>(max_chunk, 1) + 3 * K;

  for (std::uint64_t call = 0; call < calls; ++call) {
    if (live.empty() && admitted == sequences && call > 0) break;  // all done
    // Admit new sequences into free slots; a freed slot is reused as soon
    // as another sequence is waiting.
    while (admitted < sequences && !free_slots.empty() &&
           (live.empty() || rng.chance(60))) {
      Live s;
      s.seq = next_seq;
      next_seq += static_cast<std::uint32_t>(rng.range(1, 3));
      s.slot = free_slots.back();
      free_slots.pop_back();
      s.fed = 0;
      s.target = rng.chance(10) ? rng.range(0, K) : rng.range(0, longest);
      s.next = 0;
      s.high = 0;
      s.seen = false;
      live.push_back(s);
      ++admitted;
    }

    // This call's batch: most of the live sequences, in a fresh order.
    std::vector<std::size_t> rows;
    for (std::size_t i = 0; i < live.size(); ++i)
      if (rng.chance(80)) rows.push_back(i);
    rng.shuffle(rows);

    // Verify rounds (speculative mode only, so that other traces keep their
    // bytes): the next token plus `drafts` drafts from the accepted length.
    std::vector<char> verify(live.size(), 0);
    if (speculative)
      for (std::size_t i : rows) verify[i] = live[i].next > 0 && rng.chance(60);

    // A row sent [start, start + n): the sequence's length is its end; a
    // verify round then accepts a random prefix of its drafts, and the next
    // row re-sends from the first rejected one, now and then from as deep
    // as the ring allows.
    auto const sent = [&](Live& s, std::uint64_t start, std::uint64_t n,
                          bool verified) {
      s.seen = true;
      s.fed = start + n;
      s.high = std::max(s.high, s.fed);
      s.next = s.fed;
      if (!verified) return;
      s.next = start + 1 + rng.range(0, drafts);
      if (rng.chance(10)) {
        std::uint64_t const floor_pool =
            s.high > ring ? (s.high - ring + K - 1) / K * K : 0;
        if (floor_pool <= s.next) s.next = rng.range(floor_pool, s.next);
      }
      // Accept more while the rewind would be deeper than the ring (R < K
      // + S): restarting at the length itself always fits.
      while (s.next < s.fed && s.high - s.next / K * K > ring) ++s.next;
    };

    bool const decode = !rows.empty() && rng.chance(40);
    if (decode) {
      int next_n = static_cast<int>(rng.range(1, 2 * K));
      for (std::size_t i : rows)
        if (verify[i]) next_n = std::max(next_n, static_cast<int>(1 + drafts));
      out += "decode " + std::to_string(next_n) + "\n";
      for (std::size_t i : rows) {
        Live& s = live[i];
        // Real tokens: usually all next_n, sometimes fewer (the rest padded,
        // mostly at the end, sometimes in between).
        int real = verify[i] ? static_cast<int>(1 + drafts)
                   : rng.chance(70) ? next_n
                                    : static_cast<int>(rng.range(0, next_n));
        std::vector<char> is_real(next_n, 0);
        for (int j = 0; j < real; ++j) is_real[j] = 1;
        if (rng.chance(30)) rng.shuffle(is_real);
        out += "row " + std::to_string(s.seq) + " " + std::to_string(s.slot);
        std::uint64_t const start = s.next;
        std::uint64_t pos = start;
        for (int j = 0; j < next_n; ++j) {
          if (is_real[j])
            out += " " + std::to_string(pos++);
          else
            out += " -1";
        }
        out += "\n";
        if (real > 0)
          sent(s, start, static_cast<std::uint64_t>(real), verify[i]);
        else
          s.seen = true;
      }
    } else {
      out += "step\n";
      for (std::size_t i : rows) {
        Live& s = live[i];
        std::uint64_t n;
        if (verify[i])
          n = 1 + drafts;
        else if (rng.chance(15))
          n = 0;  // a row with nothing new (after a verify: a truncation)
        else if (s.next >= s.target || rng.chance(30))
          n = 1;  // decoding through the general step
        else
          n = std::min<std::uint64_t>(rng.range(1, std::max<std::uint64_t>(max_chunk, 1)),
                                      s.target - s.next);
        out += "row " + std::to_string(s.seq) + " " + std::to_string(s.slot) +
               " " + std::to_string(s.next) + " " + std::to_string(n) + "\n";
        sent(s, s.next, n, verify[i]);
      }
    }
    out += "end\n";

    // Selections query live sequences within their lengths: mostly their
    // latest tokens (a serving step's own queries, drafts included), now
    // and then earlier ones, now and then none.
    if (selects && rng.chance(40)) {
      out += "select\n";
      for (Live const& s : live) {
        if (!s.seen || !rng.chance(70)) continue;
        std::uint64_t const n =
            rng.chance(10) ? 0 : rng.range(0, std::min<std::uint64_t>(s.fed, 6));
        std::uint64_t const back = rng.chance(30) ? rng.range(0, s.fed - n) : 0;
        std::uint64_t const first = s.fed - n - back;
        out += "row " + std::to_string(s.seq) + " " + std::to_string(first) +
               " " + std::to_string(n) + "\n";
      }
      out += "end\n";
    }

    // Sequences that reached their length finish (some run past it while
    // decoding); their slots go back to the pool.
    for (std::size_t i = live.size(); i-- > 0;) {
      if (live[i].next >= live[i].target && rng.chance(50)) {
        free_slots.push_back(live[i].slot);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
    rng.shuffle(free_slots);
  }

  std::fwrite(out.data(), 1, out.size(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}
