// kpool_trace_check TRACE REPLAY_OUTPUT
//
// Checks kpool_replay's output for TRACE against the host reference
// (KPoolReference.hpp, f64): every sequence's printed pools are exactly the
// complete pools of the tokens it was fed (version 2: within its final
// length), each once, sorted, 'pools N' is right, and every value is within
// tolerance of a one-shot compress of the whole sequence as it stands: the
// values last sent for each position (streaming invariance and rewinds,
// docs/ring.md). Version 2 also: 'emitted E' counts one emission each time
// a pool's last member was sent, 'selects M' ends the output, and with an
// fp8 pool cache ('pool_cache fp8 | fp8_pow2') one 'cache' line follows
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
// Exit 0 with a summary on success, 1 at the first mismatch, 2 when an
// input cannot be read.

#include "KPoolTraceCheck.hpp"
#include "KPoolTrace.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>

namespace {

// Whether `in` opened `path`; if not, says why on stderr.
bool opened(std::ifstream const& in, char const* path) {
  if (in) return true;
  std::cerr << "kpool_trace_check: cannot read '" << path << "': " << std::strerror(errno)
            << '\n';
  return false;
}

}  // namespace

int main(int argc, char* argv[]) {
  if (!KPoolTraceCheck::inputs_match_trace_md()) {
    std::cerr << "kpool_trace_check: KPoolTrace::value disagrees with "
                 "docs/trace.md's formula\n";
    return 2;
  }
  if (argc != 3) {
    std::cerr << "usage: kpool_trace_check TRACE REPLAY_OUTPUT\n";
    return 2;
  }
  KPoolTrace::Trace trace;
  {
    std::ifstream in(argv[1]);
    if (!opened(in, argv[1])) return 2;
    try {
      trace = KPoolTrace::parse(in);
    } catch (KPoolTrace::TraceError const& e) {
      std::cerr << "kpool_trace_check: " << argv[1] << ": " << e.what() << '\n';
      return 2;
    }
  }
  std::ifstream in(argv[2]);
  if (!opened(in, argv[2])) return 2;
  try {
    std::cout << "kpool_trace_check: " << KPoolTraceCheck::check(trace, in) << '\n';
  } catch (KPoolTraceCheck::Mismatch const& e) {
    std::cout << "kpool_trace_check: MISMATCH: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
