// kpool_tracegen: writes a random, valid serving trace (docs/trace.md) to stdout,
// shaped like what a serving engine feeds the k-pool writers: sequences
// admitted into free ring slots, chunked prefills, decode calls with padded
// entries, batches reshuffled every call, finished sequences handing their
// slots to new ones. The same options always give the same trace.

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
  std::uint64_t fed;
  std::uint64_t target;  // finishes once fed reaches it
};

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
    std::uint64_t* dst = a == "--seed"        ? &seed
                         : a == "--kpool"     ? &K
                         : a == "--head-dim"  ? &D
                         : a == "--slots"     ? &slots
                         : a == "--sequences" ? &sequences
                         : a == "--calls"     ? &calls
                         : a == "--max-chunk" ? &max_chunk
                                              : nullptr;
    if (!dst) return bad("unknown option '" + a + "'");
    if (!parse_u64(v, *dst)) return bad("bad value '" + v + "' for " + a);
  }
  using L = KPoolTrace::Limits;
  if (K < 1 || K > 64) return bad("--kpool must be in [1, 64]");
  if (D < 1 || D > L::max_head_dim) return bad("--head-dim out of range");
  if (slots < 1 || slots > 4096) return bad("--slots must be in [1, 4096]");
  if (sequences > 1000000 || calls > 1000000 || max_chunk > 100000)
    return bad("--sequences, --calls or --max-chunk is too large");

  Rng rng{seed};
  std::string out;
  out += "kpool-trace 1\n";
  out += "head_dim " + std::to_string(D) + "\n";
  out += "kpool " + std::to_string(K) + "\n";
  out += "dtype " + dtype + "\n";
  out += "slots " + std::to_string(slots) + "\n";
  out += "seed " + std::to_string(seed) + "\n";

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
      live.push_back(s);
      ++admitted;
    }

    // This call's batch: most of the live sequences, in a fresh order.
    std::vector<std::size_t> rows;
    for (std::size_t i = 0; i < live.size(); ++i)
      if (rng.chance(80)) rows.push_back(i);
    rng.shuffle(rows);

    bool const decode = !rows.empty() && rng.chance(40);
    if (decode) {
      int const next_n = static_cast<int>(rng.range(1, 2 * K));
      out += "decode " + std::to_string(next_n) + "\n";
      for (std::size_t i : rows) {
        Live& s = live[i];
        // Real tokens: usually all next_n, sometimes fewer (the rest padded,
        // mostly at the end, sometimes in between).
        int real = rng.chance(70) ? next_n
                                  : static_cast<int>(rng.range(0, next_n));
        std::vector<char> is_real(next_n, 0);
        for (int j = 0; j < real; ++j) is_real[j] = 1;
        if (rng.chance(30)) rng.shuffle(is_real);
        out += "row " + std::to_string(s.seq) + " " + std::to_string(s.slot);
        for (int j = 0; j < next_n; ++j) {
          if (is_real[j])
            out += " " + std::to_string(s.fed++);
          else
            out += " -1";
        }
        out += "\n";
      }
    } else {
      out += "step\n";
      for (std::size_t i : rows) {
        Live& s = live[i];
        std::uint64_t n;
        if (rng.chance(15))
          n = 0;  // a row with nothing new
        else if (s.fed >= s.target || rng.chance(30))
          n = 1;  // decoding through the general step
        else
          n = std::min<std::uint64_t>(rng.range(1, std::max<std::uint64_t>(max_chunk, 1)),
                                      s.target - s.fed);
        out += "row " + std::to_string(s.seq) + " " + std::to_string(s.slot) +
               " " + std::to_string(s.fed) + " " + std::to_string(n) + "\n";
        s.fed += n;
      }
    }
    out += "end\n";

    // Sequences that reached their length finish (some run past it while
    // decoding); their slots go back to the pool.
    for (std::size_t i = live.size(); i-- > 0;) {
      if (live[i].fed >= live[i].target && rng.chance(50)) {
        free_slots.push_back(live[i].slot);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
    rng.shuffle(free_slots);
  }

  std::fwrite(out.data(), 1, out.size(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}
