// fuzz_trace: arbitrary bytes to the trace reader (example/KPoolTrace.hpp)
// and, when they parse, to the replay (example/KPoolReplay.hpp, what
// kpool_replay runs) and the reference checker
// (unit_tests/KPoolTraceCheck.hpp, what kpool_trace_check runs).
//
// Properties, each an abort when broken (fuzz/README.md):
//   - a refused input is a KPoolTrace::TraceError whose what() is
//     "trace:LINE: message", LINE within the input, the message not empty
//     and free of control bytes;
//     nothing else escapes the parser (no std::out_of_range, no bad_alloc:
//     the parser's Limits refuse what nobody could allocate);
//   - a trace that parses replays: KPool refuses nothing the parser passed
//     (no KPool::InvalidArgument, no error of the replay's own checks),
//     but for the ring's depth rule, which the reader leaves to KPool: a
//     rewind deeper than the ring holds is refused by KPool, at the same
//     trace line and with the same error by the fused and unfused steps;
//   - the replay's output passes the reference check;
//   - the fused and the unfused steps print the same bytes.
// The parser runs with small size limits (fuzz_limits), and traces whose
// replay would cost more than a small budget (the caps below) are parsed
// only: the fuzzer keeps many executions a second.
//
//   fuzz_trace [libFuzzer options] [CORPUS...]      (fuzz/corpus/trace/)

#include "KPoolReplay.hpp"
#include "KPoolTrace.hpp"
#include "KPoolTraceCheck.hpp"

#include <KPool.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <sstream>
#include <string>

namespace {

// Replay budget, in elements of the storage type.
constexpr std::uint64_t max_token_elements = 1u << 14;   // every token fed * D
constexpr std::uint64_t max_ring_elements = 1u << 18;    // slots * ring * D
constexpr std::uint64_t max_decode_elements = 1u << 16;  // rows * next_n * D, all blocks
constexpr std::uint64_t max_select_work = 1u << 20;      // tokens * pools * H * D, all blocks
constexpr std::size_t max_blocks = 128;

// The parser's size limits for fuzzing: the default ones let a trace of a
// hundred bytes feed 2^28 values, which parses in seconds and replays in
// minutes under the sanitizers; these keep every rule reachable at a size
// that runs in milliseconds.
KPoolTrace::Limits fuzz_limits() {
  KPoolTrace::Limits l;
  l.max_head_dim = 256;
  l.max_kpool = 64;
  l.max_slots = 1024;
  l.max_next_n = 256;
  l.max_index_heads = 16;
  l.max_index_topk = 4096;
  l.max_elements = 1u << 16;
  l.max_total_elements = 1u << 16;
  return l;
}

[[noreturn]] void defect(std::string const& what, std::string const& input) {
  std::fprintf(stderr, "fuzz_trace: DEFECT: %s\n--- input ---\n%s\n--- end ---\n",
               what.c_str(), input.c_str());
  std::abort();
}

bool within_budget(KPoolTrace::Trace const& t) {
  std::uint64_t const D = static_cast<std::uint64_t>(t.head_dim);
  if (t.blocks.size() > max_blocks) return false;
  if (t.total_tokens + t.select_queries > max_token_elements / D) return false;
  if (static_cast<std::uint64_t>(t.slots) * static_cast<std::uint64_t>(t.ring) * D >
      max_ring_elements)
    return false;
  std::uint64_t decode = 0, select = 0;
  for (auto const& b : t.blocks) {
    if (b.kind == KPoolTrace::BlockKind::decode)
      decode += b.rows.size() * static_cast<std::uint64_t>(b.next_n) * D;
    if (b.kind == KPoolTrace::BlockKind::select)
      for (auto const& r : b.rows)
        select += r.n_new * ((r.cache_len + r.n_new) / t.kpool + 1) *
                  static_cast<std::uint64_t>(t.index_heads) * D;
    if (decode > max_decode_elements || select > max_select_work) return false;
  }
  return true;
}

// A deterministic choice from the input, so that a crash reproduces.
std::uint64_t hash_of(std::string const& s) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// The replay's output, or for a rewind KPool refuses by the ring's depth
// rule, "refused at LINE: what()" (compared across the two paths).
std::string replay(KPoolTrace::Trace const& t, KPool::Options const& options,
                   KPool::ScoreEngine engine, int block_pools, std::string const& input,
                   bool& refused) {
  int line = 0;
  refused = false;
  try {
    return KPoolReplay::replay_trace(t, options, block_pools, /*fused_layout=*/false, line,
                                     KPoolReplay::Ranks(), engine);
  } catch (KPool::InvalidArgument const& e) {
    std::string const what = e.what();
    if ((e.argument() == "cache_lengths" || e.argument() == "positions") &&
        what.find("deeper than the ring holds") != std::string::npos && line > 0) {
      refused = true;
      return "refused at " + std::to_string(line) + ": " + what;
    }
    defect("the replay (" + std::string(options.fused ? "fused" : "unfused") +
               ") of a trace the parser accepted failed at trace line " +
               std::to_string(line) + ": " + what,
           input);
  } catch (std::exception const& e) {
    defect("the replay (" + std::string(options.fused ? "fused" : "unfused") +
               ") of a trace the parser accepted failed at trace line " +
               std::to_string(line) + ": " + e.what(),
           input);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // One host thread (the fuzzer runs one input at a time; overwrite=0 keeps
  // a caller's choice), no binding notes.
  setenv("OMP_NUM_THREADS", "1", 0);
  setenv("OMP_PROC_BIND", "false", 0);
  Kokkos::initialize();
  std::atexit([] { Kokkos::finalize(); });
  if (!KPoolTraceCheck::inputs_match_trace_md()) {
    std::fprintf(stderr, "fuzz_trace: KPoolTrace::value disagrees with docs/trace.md\n");
    std::abort();
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  std::string const input(reinterpret_cast<char const*>(data), size);
  KPoolTrace::Trace trace;
  try {
    std::istringstream in(input);
    trace = KPoolTrace::parse(in, fuzz_limits());
  } catch (KPoolTrace::TraceError const& e) {
    // "trace:LINE: message", LINE one of the input's lines (or 1 for an
    // empty input).
    std::size_t lines = 1;
    for (char c : input) lines += c == '\n';
    std::string const want = "trace:" + std::to_string(e.line) + ": " + e.message;
    // No control byte of the input in it (a NUL would cut what() short).
    bool control = false;
    for (char c : want) control = control || static_cast<unsigned char>(c) < 0x20 || c == 0x7F;
    if (e.line < 1 || static_cast<std::size_t>(e.line) > lines || e.message.empty() ||
        control || want != e.what())
      defect("a refusal that does not read 'trace:LINE: message' with LINE in 1.." +
                 std::to_string(lines) + ": '" + e.what() + "'",
             input);
    return 0;
  }
  if (!within_budget(trace)) return 0;

  std::uint64_t const h = hash_of(input);
  KPool::Options options;
  KPool::ScoreEngine const engines[] = {
      KPool::ScoreEngine::automatic, KPool::ScoreEngine::register_tiles,
      KPool::ScoreEngine::team_gemm, KPool::ScoreEngine::blas};
  // The selections' engine is their workspace's.
  KPool::ScoreEngine const engine = engines[h % 4];
  int const block_pools = 1 + static_cast<int>((h >> 2) % 16);

  options.fused = true;
  bool refused = false, refused_unfused = false;
  std::string const fused = replay(trace, options, engine, block_pools, input, refused);
  options.fused = false;
  std::string const unfused = replay(trace, options, engine, block_pools, input,
                                       refused_unfused);
  if (fused != unfused)
    defect("the fused and the unfused replay print different outputs:\n" + fused +
               "--- unfused ---\n" + unfused,
           input);
  if (refused) return 0;
  try {
    std::istringstream out(fused);
    KPoolTraceCheck::check(trace, out);
  } catch (KPoolTraceCheck::Mismatch const& e) {
    defect(std::string("the replay's output fails the reference check: ") + e.what() +
               "\n--- output ---\n" + fused,
           input);
  }
  return 0;
}
