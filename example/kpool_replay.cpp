// kpool_replay: runs a serving trace (docs/trace.md, versions 1 and 2)
// through KPool::step (ragged and decode batches) and prints the pools it
// produced, so that two builds or backends can be compared pool by pool.
// A version 2 trace's steps also write the pool cache its header asks for,
// an fp8 cache's entries are printed as read from it ('cache' lines), and
// its select blocks run KPool::score_select over that cache ('select'
// lines: the pool ids each query token selected).
//
//   kpool_replay [--fused | --unfused] [--engine E] [--block-pools N]
//                [--cache-layout split|fused] [TRACE | -]

#include "KPoolReplay.hpp"
#include "KPoolTrace.hpp"

#include <KPool.hpp>
#if KPOOL_REPLAY_MPI
#include <mpi/KPool_MpiCommunicator.hpp>
#endif

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>
#include <memory>
#include <new>
#include <string>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#define KPOOL_REPLAY_HAVE_DUP 1
#endif

namespace {

char const usage_text[] =
    "usage: kpool_replay [--fused | --unfused] [--engine E] [--block-pools N]\n"
    "                    [--cache-layout split|fused] [--ranks [--interleave N]]\n"
    "                    [--decode-selection S] [--no-validate] [--launch-log FILE]\n"
    "                    [TRACE | -]\n"
    "\n"
    "Replays a KPool serving trace (format: docs/trace.md) through KPool::step\n"
    "(ragged and decode batches) on Kokkos' default execution space and prints the\n"
    "pools produced, sorted by sequence then pool id, then 'pools N'. A\n"
    "version 1 trace prints every pool produced; a version 2 trace (rings\n"
    "longer than kpool, rewinds, the pool cache) the pools complete within\n"
    "each sequence's final length as last emitted, then 'emitted E', the\n"
    "fp8 pool cache's entries ('cache' lines), the pools each select block's\n"
    "query tokens selected ('select' lines, through KPool::score_select over\n"
    "the cache the steps wrote) and 'selects M'. A select block whose rows all\n"
    "query the same number of their sequences' latest tokens goes through the\n"
    "decode batch form (KPool::decode_batch), the path of a serving engine's\n"
    "decode step; any other through the ragged form.\n"
    "Reads standard input when TRACE is '-' or absent.\n"
    "\n"
    "  --fused     one launch per step for ring_close, compress, seed_tail\n"
    "              (the default)\n"
    "  --unfused   three launches per step (Options::fused = false)\n"
    "  --engine E  the selection's scoring engine (its SelectWorkspace's):\n"
    "              automatic (the default), register_tiles, tiles, team_gemm, blas\n"
    "  --block-pools N\n"
    "              pools a block of the pool cache holds (default 16; the\n"
    "              output does not depend on it)\n"
    "  --cache-layout L\n"
    "              split (the default) or fused: a pool_cache fp8_serving\n"
    "              cache in the engines' fused byte layout (docs/indexer.md;\n"
    "              the output does not depend on it)\n"
    "  --ranks     under mpiexec -n W: the pool cache sharded over the W ranks\n"
    "              (docs/ranks.md), each selection through the ranks' exchange;\n"
    "              rank 0 prints exactly what one rank prints (a kpool_replay\n"
    "              built with MPI, KPool_ENABLE_MPI)\n"
    "  --interleave N\n"
    "              with --ranks: pools a rank holds before the next rank's\n"
    "              (default 1; the output does not depend on it)\n"
    "  --decode-selection S\n"
    "              the decode form's selection (Options::decode_selection):\n"
    "              automatic (the default), fused (one launch), separate\n"
    "  --no-validate\n"
    "              Options::validate = false: no data check, so no host\n"
    "              synchronization, in every call\n"
    "  --launch-log FILE\n"
    "              writes what each select block's KPool::score_select call\n"
    "              launched, fenced, copied and allocated (Kokkos Tools) to\n"
    "              FILE: 'select BLOCK decode|ragged kernels N fences F copies\n"
    "              C allocations A', then each kernel's and allocation's name\n"
    "  --help      print this and exit\n"
    "\n"
    "Exit status: 0 on success; 2 for a bad command line, an unreadable file\n"
    "or a broken trace ('trace:LINE: what is wrong' on stderr, nothing on\n"
    "stdout).\n";


// Kokkos writes its own notes (OpenMP binding warnings, ...) to stdout,
// which belongs to the pools: while Kokkos lives, file descriptor 1 points
// at stderr.
class StdoutToStderr {
 public:
  StdoutToStderr() {
#ifdef KPOOL_REPLAY_HAVE_DUP
    std::cout.flush();
    std::fflush(stdout);
    saved_ = ::dup(1);
    if (saved_ >= 0 && ::dup2(2, 1) < 0) {
      ::close(saved_);
      saved_ = -1;
    }
#endif
  }
  ~StdoutToStderr() {
#ifdef KPOOL_REPLAY_HAVE_DUP
    std::cout.flush();
    std::fflush(stdout);
    if (saved_ >= 0) {
      ::dup2(saved_, 1);
      ::close(saved_);
    }
#endif
  }
  StdoutToStderr(StdoutToStderr const&) = delete;
  StdoutToStderr& operator=(StdoutToStderr const&) = delete;

 private:
  int saved_ = -1;
};

int fail(int line, std::string const& what) {
  if (line > 0)
    std::cerr << "trace:" << line << ": " << what << '\n';
  else
    std::cerr << "kpool_replay: " << what << '\n';
  return 2;
}

// Kokkos' whole life, and every view's, is inside this function.
int replay_all(int argc, char* argv[], KPoolTrace::Trace const& trace,
               KPool::Options const& options, KPool::ScoreEngine engine, int block_pools,
               bool fused_layout, bool ranks, int interleave, std::string const& log_path,
               std::string& output) {
  int line = 0;
  try {
    Kokkos::ScopeGuard guard(argc, argv);
    try {
      KPoolReplay::Ranks group;
      group.interleave = interleave;
#if KPOOL_REPLAY_MPI
      std::unique_ptr<KPool::MpiCommunicator<KPoolReplay::ExecSpace>> comm;
      if (ranks) {
        comm = std::make_unique<KPool::MpiCommunicator<KPoolReplay::ExecSpace>>(MPI_COMM_WORLD);
        group.comm = comm.get();
      }
#else
      if (ranks) return fail(0, "--ranks needs a kpool_replay built with MPI (KPool_ENABLE_MPI)");
#endif
      KPoolReplay::LaunchLog& log = KPoolReplay::LaunchLog::get();
      if (!log_path.empty()) log.start();
      output = KPoolReplay::replay_trace(trace, options, block_pools, fused_layout, line, group,
                                         engine);
      if (log.listening()) {
        log.stop();
        std::ofstream out(log_path);
        out << log.text();
        if (!out.flush()) return fail(0, "cannot write the launch log '" + log_path + "'");
      }
    } catch (std::bad_alloc const&) {
      return fail(line, "out of memory replaying the trace");
    } catch (std::exception const& e) {
      return fail(line, e.what());
    }
  } catch (std::exception const& e) {
    return fail(0, e.what());
  } catch (...) {
    return fail(line, "unknown error");
  }
  return 0;
}

}  // namespace

int main(int argc, char* argv[]) {
  KPool::Options options;
  KPool::ScoreEngine engine = KPool::ScoreEngine::automatic;
  int block_pools = 16;
  int interleave = 1;
  bool ranks = false;
  bool fused_layout = false;
  std::string path = "-";
  std::string log_path;
  bool have_path = false;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << usage_text;
      return 0;
    } else if (a == "--fused") {
      options.fused = true;
    } else if (a == "--unfused") {
      options.fused = false;
    } else if (a == "--cache-layout") {
      std::string const v = i + 1 < argc ? argv[++i] : "";
      if (v != "split" && v != "fused") {
        std::cerr << "kpool_replay: bad value '" << v << "' for " << a << "\n\n"
                  << usage_text;
        return 2;
      }
      fused_layout = v == "fused";
    } else if (a == "--ranks") {
      ranks = true;
    } else if (a == "--no-validate") {
      options.validate = false;
    } else if (a == "--decode-selection") {
      std::string const v = i + 1 < argc ? argv[++i] : "";
      if (v == "automatic") options.decode_selection = KPool::DecodeSelection::automatic;
      else if (v == "fused") options.decode_selection = KPool::DecodeSelection::fused;
      else if (v == "separate") options.decode_selection = KPool::DecodeSelection::separate;
      else {
        std::cerr << "kpool_replay: bad value '" << v << "' for " << a << "\n\n"
                  << usage_text;
        return 2;
      }
    } else if (a == "--launch-log") {
      log_path = i + 1 < argc ? argv[++i] : "";
      if (log_path.empty()) {
        std::cerr << "kpool_replay: --launch-log needs a file\n\n" << usage_text;
        return 2;
      }
    } else if (a == "--engine" || a == "--block-pools" || a == "--interleave") {
      std::string const v = i + 1 < argc ? argv[++i] : "";
      bool ok = true;
      if (a == "--engine") {
        if (v == "automatic") engine = KPool::ScoreEngine::automatic;
        else if (v == "register_tiles") engine = KPool::ScoreEngine::register_tiles;
        else if (v == "team_gemm") engine = KPool::ScoreEngine::team_gemm;
        else if (v == "tiles") engine = KPool::ScoreEngine::tiles;
        else if (v == "blas") engine = KPool::ScoreEngine::blas;
        else ok = false;
      } else {
        ok = !v.empty() && v.size() < 7 &&
             std::all_of(v.begin(), v.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
        int const n = ok ? std::stoi(v) : 0;
        ok = ok && n >= 1;
        (a == "--interleave" ? interleave : block_pools) = n;
      }
      if (!ok) {
        std::cerr << "kpool_replay: bad value '" << v << "' for " << a << "\n\n"
                  << usage_text;
        return 2;
      }
    } else if (a.rfind("--kokkos-", 0) == 0) {
      // Kokkos' own (--kokkos-threads=N, ...): Kokkos reads them.
    } else if ((a.size() > 1 && a[0] == '-') || have_path) {
      std::cerr << "kpool_replay: "
                << (have_path && !(a.size() > 1 && a[0] == '-')
                        ? "more than one trace: '" + a + "'"
                        : "unknown option '" + a + "'")
                << "\n\n"
                << usage_text;
      return 2;
    } else {
      path = a;
      have_path = true;
    }
  }

  // The whole trace is read and checked before anything runs, so a broken
  // one produces no output at all.
  KPoolTrace::Trace trace;
  try {
    if (path == "-") {
      trace = KPoolTrace::parse(std::cin);
    } else {
      std::ifstream in(path);
      in.peek();  // a directory opens, then fails here
      if (!in || in.bad()) {
        std::cerr << "kpool_replay: cannot read '" << path
                  << "': " << std::strerror(errno) << '\n';
        return 2;
      }
      trace = KPoolTrace::parse(in);
    }
  } catch (KPoolTrace::TraceError const& e) {
    std::cerr << e.what() << '\n';
    return 2;
  } catch (std::exception const& e) {
    return fail(0, std::string("reading the trace: ") + e.what());
  }


  std::string output;
  int status;
  bool print = true;
#if KPOOL_REPLAY_MPI
  // Only with --ranks: a plain replay never starts MPI.
  if (ranks) {
    MPI_Init(&argc, &argv);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    print = rank == 0;
  }
#endif
  {
    StdoutToStderr const redirect;
    status = replay_all(argc, argv, trace, options, engine, block_pools, fused_layout, ranks,
                        interleave, log_path, output);
  }
#if KPOOL_REPLAY_MPI
  if (ranks) MPI_Finalize();
#endif
  if (status != 0) return status;
  if (!print) return 0;
  std::fwrite(output.data(), 1, output.size(), stdout);
  if (std::fflush(stdout) != 0) {
    std::cerr << "kpool_replay: writing the output failed\n";
    return 2;
  }
  return 0;
}
