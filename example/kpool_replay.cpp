// kpool_replay: runs a serving trace (docs/trace.md, versions 1 and 2)
// through KPool::step and KPool::decode_step and prints the pools it
// produced, so that two builds or backends can be compared pool by pool.
// A version 2 trace's steps also write the pool cache its header asks for,
// an fp8 cache's entries are printed as read from it ('cache' lines), and
// its select blocks run KPool::score_select over that cache ('select'
// lines: the pool ids each query token selected).
//
//   kpool_replay [--fused | --unfused] [--engine E] [--block-pools N] [TRACE | -]

#include "KPoolTrace.hpp"

#include <KPool.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>
#include <map>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#define KPOOL_REPLAY_HAVE_DUP 1
#endif

namespace {

char const usage_text[] =
    "usage: kpool_replay [--fused | --unfused] [--engine E] [--block-pools N]\n"
    "                    [TRACE | -]\n"
    "\n"
    "Replays a KPool serving trace (format: docs/trace.md) through KPool::step and\n"
    "KPool::decode_step on Kokkos' default execution space and prints the\n"
    "pools produced, sorted by sequence then pool id, then 'pools N'. A\n"
    "version 1 trace prints every pool produced; a version 2 trace (rings\n"
    "longer than kpool, rewinds, the pool cache) the pools complete within\n"
    "each sequence's final length as last emitted, then 'emitted E', the\n"
    "fp8 pool cache's entries ('cache' lines), the pools each select block's\n"
    "query tokens selected ('select' lines, through KPool::score_select over\n"
    "the cache the steps wrote) and 'selects M'.\n"
    "Reads standard input when TRACE is '-' or absent.\n"
    "\n"
    "  --fused     one launch per step for ring_close, compress, seed_tail\n"
    "              (the default)\n"
    "  --unfused   three launches per step (Options::fused = false)\n"
    "  --engine E  the selection's scoring engine (Options::score_engine):\n"
    "              automatic (the default), register_tiles, tiles, team_gemm, blas\n"
    "  --block-pools N\n"
    "              pools a block of the pool cache holds (default 16; the\n"
    "              output does not depend on it)\n"
    "  --help      print this and exit\n"
    "\n"
    "Exit status: 0 on success; 2 for a bad command line, an unreadable file\n"
    "or a broken trace ('trace:LINE: what is wrong' on stderr, nothing on\n"
    "stdout).\n";

struct Pool {
  std::uint32_t seq;
  std::int32_t id;
  std::vector<float> values;
};

using PoolKey = std::pair<std::uint32_t, std::int32_t>;  // seq, pool id

// What the query token at `pos` of `seq` selected in the `block`-th select
// block: its row of pool_ids without the -1 entries (ascending).
struct Selection {
  std::uint32_t seq;
  std::uint64_t pos;
  std::size_t block;
  std::vector<std::int32_t> ids;
};

// A pool's entry in an fp8 pool cache: its scale and its E4M3 values, as
// numbers.
struct CacheEntry {
  float scale = 0;
  std::vector<float> values;
};

// What a replay produced, for the output. Every emission in call order
// (a version 2 trace prints the last one of each pool), and, for an fp8
// pool cache, the entry of every pool emitted, read from the cache after
// the last call.
struct ReplayResult {
  std::vector<Pool> emitted;
  bool has_cache_lines = false;
  std::map<PoolKey, CacheEntry> cache;
  std::vector<Selection> selections;  // in block order
};

using ExecSpace = Kokkos::DefaultExecutionSpace;
using MemSpace = ExecSpace::memory_space;
template <class T, int Rank>
struct ViewOf;
template <class T>
struct ViewOf<T, 1> {
  using type = Kokkos::View<T*, Kokkos::LayoutRight, MemSpace>;
};
template <class T>
struct ViewOf<T, 2> {
  using type = Kokkos::View<T**, Kokkos::LayoutRight, MemSpace>;
};
template <class T>
struct ViewOf<T, 3> {
  using type = Kokkos::View<T***, Kokkos::LayoutRight, MemSpace>;
};
template <class T, int Rank>
using ViewT = typename ViewOf<T, Rank>::type;

template <class T>
T storage(float x) {
  return T(x);  // float -> storage type, nearest even (exact for f32/f64)
}

// The pools the last call left in `out`, attributed to the block's seqs.
template <class T>
void collect(ExecSpace const& space, KPool::StepOutput<T, MemSpace> const& out,
             KPoolTrace::Block const& block, int D, std::vector<Pool>& pools) {
  space.fence();
  std::uint32_t n = 0;
  Kokkos::deep_copy(n, out.count());
  if (n > out.capacity())
    throw std::runtime_error("KPool reported " + std::to_string(n) +
                             " pools, more than the output's capacity " +
                             std::to_string(out.capacity()));
  if (n == 0) return;
  auto const range = std::make_pair(std::size_t(0), std::size_t(n));
  auto const rows = Kokkos::create_mirror_view_and_copy(
      Kokkos::HostSpace(), Kokkos::subview(out.batch_row(), range));
  auto const ids = Kokkos::create_mirror_view_and_copy(
      Kokkos::HostSpace(), Kokkos::subview(out.pool_id(), range));
  auto const vals = Kokkos::create_mirror_view_and_copy(
      Kokkos::HostSpace(), Kokkos::subview(out.pooled(), range, Kokkos::ALL));
  for (std::size_t i = 0; i < n; ++i) {
    std::int32_t const r = rows(i);
    if (r < 0 || static_cast<std::size_t>(r) >= block.rows.size())
      throw std::runtime_error("KPool reported pool " + std::to_string(i) +
                               " from batch row " + std::to_string(r) +
                               ", outside the block's " +
                               std::to_string(block.rows.size()) + " rows");
    Pool p;
    p.seq = block.rows[r].seq;
    p.id = ids(i);
    p.values.resize(D);
    for (int c = 0; c < D; ++c) p.values[c] = static_cast<float>(vals(i, c));
    pools.push_back(std::move(p));
  }
}

// The calls of a replay without a pool cache (version 1).
struct NoCache {
  template <class Call>
  void with(ExecSpace const&, KPoolTrace::Block const&, Call const& call) {
    call();
  }
  void read(ExecSpace const&, ReplayResult&) const {}
};

// The pool cache a version 2 replay passes to every step and decode step
// (docs/trace.md, "Header"), of element type C. Its block size is this
// program's choice (docs/trace.md: it never changes the output;
// --block-pools, 16 pools a block by default), each sequence's blocks
// taken in order as its pools appear, none shared, so an ended sequence's
// entries stay as its calls left them. Select blocks read it through the
// same block tables.
template <class C>
class Cache {
 public:
  Cache(ExecSpace const& space, KPoolTrace::Trace const& t, KPool::CacheScale scale,
        int block_pools)
      : kpool_(t.kpool), block_pools_(block_pools) {
    std::uint64_t const block_pools_u = static_cast<std::uint64_t>(block_pools);
    // Every block any row will need: one per 16 pools of the highest pool
    // a sequence's rows reach.
    std::map<std::uint32_t, std::uint64_t> reach;
    for (auto const& b : t.blocks) {
      if (b.kind == KPoolTrace::BlockKind::select) continue;
      for (auto const& r : b.rows) {
        std::uint64_t& e = reach[r.seq];
        e = std::max(e, (r.cache_len + r.n_new) / t.kpool);
      }
    }
    std::uint64_t total = 0;
    for (auto const& e : reach) total += (e.second + block_pools_u - 1) / block_pools_u;
    if (total > 0x7FFFFFFFull)
      throw std::runtime_error("the trace's pools need more cache blocks than a "
                               "block number holds");
    cache_ = KPool::PoolCache<C, MemSpace>(
        space, static_cast<int>(std::max<std::uint64_t>(total, 1)), block_pools_,
        t.head_dim, scale, t.rotate);
  }

  // call(cache, block_table) with the block's block table: row r holds its
  // sequence's blocks (new ones for pools seen the first time), -1 past
  // them.
  template <class Call>
  void with(ExecSpace const& space, KPoolTrace::Block const& b, Call const& call) {
    std::size_t width = 1;
    for (auto const& r : b.rows) {
      std::vector<std::int32_t>& have = blocks_[r.seq];
      std::uint64_t const end = (r.cache_len + r.n_new) / kpool_;
      while (have.size() * static_cast<std::uint64_t>(block_pools_) < end)
        have.push_back(next_++);
      width = std::max(width, have.size());
    }
    ViewT<std::int32_t, 2> table("block_table", b.rows.size(), width);
    auto h = Kokkos::create_mirror_view(table);
    for (std::size_t r = 0; r < b.rows.size(); ++r) {
      std::vector<std::int32_t> const& have = blocks_[b.rows[r].seq];
      for (std::size_t c = 0; c < width; ++c) h(r, c) = c < have.size() ? have[c] : -1;
    }
    Kokkos::deep_copy(space, table, h);
    call(cache_, table);
  }

  // The entries of every pool emitted (an fp8 cache's; a native cache is
  // written but printed nowhere).
  void read(ExecSpace const& space, ReplayResult& result) const {
    if constexpr (std::is_same<C, KPool::float8_e4m3>::value) {
      space.fence();
      auto const values =
          Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), cache_.values());
      auto const scales =
          Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), cache_.scales());
      result.has_cache_lines = true;
      for (auto const& p : result.emitted) {
        std::vector<std::int32_t> const& have = blocks_.at(p.seq);
        std::int32_t const block = have.at(static_cast<std::size_t>(p.id / block_pools_));
        int const entry = p.id % block_pools_;
        CacheEntry e;
        e.scale = scales(block, entry);
        e.values.resize(cache_.head_dim());
        for (int c = 0; c < cache_.head_dim(); ++c)
          e.values[c] = static_cast<float>(values(block, entry, c));
        result.cache[PoolKey(p.seq, p.id)] = std::move(e);
      }
    } else {
      (void)space;
      (void)result;
    }
  }

 private:
  int kpool_;
  int block_pools_;
  KPool::PoolCache<C, MemSpace> cache_;
  std::map<std::uint32_t, std::vector<std::int32_t>> blocks_;
  std::int32_t next_ = 0;
};

// The select blocks (docs/trace.md, "Blocks"): each runs one
// KPool::score_select over the cache the steps wrote so far, with the
// trace's queries and head weights, and records every query token's
// selection. One workspace and output for the largest block.
template <class T>
class Selector {
 public:
  Selector(ExecSpace const& space, KPoolTrace::Trace const& t) {
    std::uint64_t tokens = 0, visible = 1;
    for (auto const& b : t.blocks) {
      if (b.kind != KPoolTrace::BlockKind::select) continue;
      tokens = std::max(tokens, b.tokens);
      for (auto const& r : b.rows)
        visible = std::max(visible, (r.cache_len + r.n_new) / t.kpool);
    }
    if (tokens == 0) return;
    workspace_ = KPool::SelectWorkspace<T, MemSpace>(space, tokens, visible, t.index_heads,
                                                     t.head_dim);
    pool_ids_ = ViewT<std::int32_t, 2>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "pool_ids"), tokens, t.index_topk);
  }

  template <class ReplayCache>
  void run(ExecSpace const& space, KPoolTrace::Trace const& t,
           KPoolTrace::Block const& block, std::size_t index, ReplayCache& cache,
           KPool::Options const& options, ReplayResult& result) {
    if (block.tokens == 0) return;
    int const D = t.head_dim;
    int const H = t.index_heads;
    std::size_t const B = block.rows.size();
    std::size_t const rows = block.tokens;
    // q[t][h][c] and weights[t][h] of the values last sent for each query
    // position (the row's revisions), docs/trace.md.
    ViewT<T, 3> q(Kokkos::view_alloc(Kokkos::WithoutInitializing, "q"), rows, H, D);
    ViewT<float, 2> weights(Kokkos::view_alloc(Kokkos::WithoutInitializing, "weights"),
                            rows, H);
    ViewT<std::uint32_t, 1> row_offsets("row_offsets", B + 1);
    ViewT<std::uint32_t, 1> cache_lengths("cache_lengths", B);
    auto hq = Kokkos::create_mirror_view(q);
    auto hw = Kokkos::create_mirror_view(weights);
    auto ho = Kokkos::create_mirror_view(row_offsets);
    auto hc = Kokkos::create_mirror_view(cache_lengths);
    std::size_t t0 = 0;
    ho(0) = 0;
    for (std::size_t r = 0; r < B; ++r) {
      KPoolTrace::Row const& row = block.rows[r];
      for (std::uint64_t i = 0; i < row.n_new; ++i) {
        std::uint64_t const pos = row.cache_len + i;
        std::uint64_t const rev = row.revision(pos);
        for (int h = 0; h < H; ++h) {
          hw(t0 + i, h) = KPoolTrace::weight_value(t.seed, row.seq, pos, h, rev);
          for (int c = 0; c < D; ++c)
            hq(t0 + i, h, c) =
                storage<T>(KPoolTrace::query_value(t.seed, row.seq, pos, h, c, D, rev));
        }
      }
      t0 += row.n_new;
      ho(r + 1) = static_cast<std::uint32_t>(t0);
      hc(r) = static_cast<std::uint32_t>(row.cache_len);
    }
    Kokkos::deep_copy(space, q, hq);
    Kokkos::deep_copy(space, weights, hw);
    Kokkos::deep_copy(space, row_offsets, ho);
    Kokkos::deep_copy(space, cache_lengths, hc);
    auto const ids = Kokkos::subview(pool_ids_, std::make_pair(std::size_t(0), rows),
                                     Kokkos::ALL);
    cache.with(space, block, [&](auto&... pool_cache) {
      // A version 1 trace, whose replay has no cache, has no select blocks.
      if constexpr (sizeof...(pool_cache) == 2)
        select(space, row_offsets, cache_lengths, static_cast<int>(B), t, q, weights,
               pool_cache..., ids, options);
    });
    auto const h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), ids);
    t0 = 0;
    for (auto const& row : block.rows) {
      for (std::uint64_t i = 0; i < row.n_new; ++i) {
        Selection sel;
        sel.seq = row.seq;
        sel.pos = row.cache_len + i;
        sel.block = index;
        for (int j = 0; j < t.index_topk; ++j)
          if (h(t0 + i, j) >= 0) sel.ids.push_back(h(t0 + i, j));
        result.selections.push_back(std::move(sel));
      }
      t0 += row.n_new;
    }
  }

 private:
  template <class Offsets, class Lengths, class Q, class W, class PoolCache, class Table,
            class Ids>
  void select(ExecSpace const& space, Offsets const& row_offsets, Lengths const& cache_lengths,
              int B, KPoolTrace::Trace const& t, Q const& q, W const& weights,
              PoolCache const& pool_cache, Table const& table, Ids const& ids,
              KPool::Options const& options) {
    KPool::score_select(space, row_offsets, cache_lengths, table, B, t.kpool, q, weights,
                        pool_cache, t.index_topk, ids, workspace_, options);
  }

  KPool::SelectWorkspace<T, MemSpace> workspace_;
  ViewT<std::int32_t, 2> pool_ids_;
};

template <class T, class ReplayCache>
void run_step(ExecSpace const& space, KPool::Ring<T, MemSpace>& ring,
              ViewT<float, 2> const& ape, KPoolTrace::Trace const& t,
              KPoolTrace::Block const& block,
              KPool::StepOutput<T, MemSpace>& out, ReplayCache& cache,
              KPool::Options const& options) {
  int const D = t.head_dim;
  std::size_t const B = block.rows.size();
  ViewT<T, 2> key(Kokkos::view_alloc(Kokkos::WithoutInitializing, "key"),
                  block.tokens, D);
  ViewT<T, 2> gate(Kokkos::view_alloc(Kokkos::WithoutInitializing, "gate"),
                   block.tokens, D);
  ViewT<std::uint32_t, 1> row_offsets("row_offsets", B + 1);
  ViewT<std::uint32_t, 1> cache_lengths("cache_lengths", B);
  ViewT<std::uint32_t, 1> slot_idx("slot_idx", B);
  auto hk = Kokkos::create_mirror_view(key);
  auto hg = Kokkos::create_mirror_view(gate);
  auto ho = Kokkos::create_mirror_view(row_offsets);
  auto hc = Kokkos::create_mirror_view(cache_lengths);
  auto hs = Kokkos::create_mirror_view(slot_idx);
  std::size_t t0 = 0;
  ho(0) = 0;
  for (std::size_t r = 0; r < B; ++r) {
    KPoolTrace::Row const& row = block.rows[r];
    for (std::uint64_t i = 0; i < row.n_new; ++i) {
      std::uint64_t const pos = row.cache_len + i;
      std::uint64_t const rev = row.revision(pos);
      for (int c = 0; c < D; ++c) {
        hk(t0 + i, c) = storage<T>(KPoolTrace::key_value(t.seed, row.seq, pos, c, rev));
        hg(t0 + i, c) = storage<T>(KPoolTrace::gate_value(t.seed, row.seq, pos, c, rev));
      }
    }
    t0 += row.n_new;
    ho(r + 1) = static_cast<std::uint32_t>(t0);
    hc(r) = static_cast<std::uint32_t>(row.cache_len);
    hs(r) = row.slot;
  }
  Kokkos::deep_copy(space, key, hk);
  Kokkos::deep_copy(space, gate, hg);
  Kokkos::deep_copy(space, row_offsets, ho);
  Kokkos::deep_copy(space, cache_lengths, hc);
  Kokkos::deep_copy(space, slot_idx, hs);
  cache.with(space, block, [&](auto&... pool_cache) {
    KPool::step(space, ring, key, gate, ape, row_offsets, cache_lengths,
                slot_idx, static_cast<int>(B), out, pool_cache..., options);
  });
}

template <class T, class ReplayCache>
void run_decode(ExecSpace const& space, KPool::Ring<T, MemSpace>& ring,
                ViewT<float, 2> const& ape, KPoolTrace::Trace const& t,
                KPoolTrace::Block const& block,
                KPool::StepOutput<T, MemSpace>& out, ReplayCache& cache,
                KPool::Options const& options) {
  int const D = t.head_dim;
  int const N = block.next_n;
  std::size_t const B = block.rows.size();
  // Padded entries are zero: nothing may read them.
  ViewT<T, 3> key("key", B, N, D);
  ViewT<T, 3> gate("gate", B, N, D);
  ViewT<std::int32_t, 2> positions("positions", B, N);
  ViewT<std::uint32_t, 1> slot_idx("slot_idx", B);
  auto hk = Kokkos::create_mirror_view(key);
  auto hg = Kokkos::create_mirror_view(gate);
  auto hp = Kokkos::create_mirror_view(positions);
  auto hs = Kokkos::create_mirror_view(slot_idx);
  Kokkos::deep_copy(hk, storage<T>(0.0f));
  Kokkos::deep_copy(hg, storage<T>(0.0f));
  for (std::size_t r = 0; r < B; ++r) {
    KPoolTrace::Row const& row = block.rows[r];
    hs(r) = row.slot;
    for (int i = 0; i < N; ++i) {
      std::int32_t const pos = row.positions[i];
      hp(r, i) = pos;
      if (pos < 0) continue;
      std::uint64_t const rev = row.revision(static_cast<std::uint64_t>(pos));
      for (int c = 0; c < D; ++c) {
        hk(r, i, c) = storage<T>(KPoolTrace::key_value(t.seed, row.seq, pos, c, rev));
        hg(r, i, c) = storage<T>(KPoolTrace::gate_value(t.seed, row.seq, pos, c, rev));
      }
    }
  }
  Kokkos::deep_copy(space, key, hk);
  Kokkos::deep_copy(space, gate, hg);
  Kokkos::deep_copy(space, positions, hp);
  Kokkos::deep_copy(space, slot_idx, hs);
  cache.with(space, block, [&](auto&... pool_cache) {
    KPool::decode_step(space, ring, key, gate, ape, positions, slot_idx,
                       static_cast<int>(B), out, pool_cache..., options);
  });
}

// Replays the whole trace in storage type T, writing `cache`; `line`
// follows the block being run so a failure can name it.
template <class T, class ReplayCache>
ReplayResult replay_with(KPoolTrace::Trace const& t, KPool::Options const& options,
                         ReplayCache& cache, int& line) {
  ExecSpace const space;
  int const K = t.kpool;
  int const D = t.head_dim;

  ViewT<float, 2> ape("ape", K, D);
  auto ha = Kokkos::create_mirror_view(ape);
  for (int m = 0; m < K; ++m)
    for (int c = 0; c < D; ++c) ha(m, c) = KPoolTrace::ape_value(t.seed, m, c);
  Kokkos::deep_copy(space, ape, ha);

  // One output for the largest call.
  std::size_t capacity = 1;
  int max_batch = 1;
  for (auto const& b : t.blocks) {
    if (b.kind == KPoolTrace::BlockKind::select) continue;
    int const B = static_cast<int>(b.rows.size());
    max_batch = std::max(max_batch, B);
    std::size_t const need =
        b.kind == KPoolTrace::BlockKind::decode
            ? b.rows.size() * static_cast<std::size_t>((b.next_n + K - 1) / K)
            : KPool::StepOutput<T, MemSpace>::capacity_for(b.tokens, B, K);
    capacity = std::max(capacity, need);
  }
  KPool::Ring<T, MemSpace> ring(space, static_cast<int>(t.slots), K, D, t.ring);
  KPool::StepOutput<T, MemSpace> out(space, capacity, max_batch, D);
  Selector<T> selector(space, t);

  ReplayResult result;
  std::size_t index = 0;
  for (auto const& b : t.blocks) {
    line = b.line;
    switch (b.kind) {
      case KPoolTrace::BlockKind::decode:
        run_decode<T>(space, ring, ape, t, b, out, cache, options);
        break;
      case KPoolTrace::BlockKind::step:
        run_step<T>(space, ring, ape, t, b, out, cache, options);
        break;
      case KPoolTrace::BlockKind::select:
        selector.run(space, t, b, index++, cache, options, result);
        continue;
    }
    collect<T>(space, out, b, D, result.emitted);
  }
  line = 0;
  cache.read(space, result);
  space.fence();
  return result;
}

// A version 1 trace runs without a pool cache; a version 2 trace writes
// the one its header names (native: a cache of T, printed nowhere).
template <class T>
ReplayResult replay(KPoolTrace::Trace const& t, KPool::Options const& options,
                    int block_pools, int& line) {
  ExecSpace const space;
  if (t.version < 2) {
    NoCache none;
    return replay_with<T>(t, options, none, line);
  }
  if constexpr (!std::is_same<T, double>::value) {
    // The parser refuses an fp8 cache of f64 pools.
    if (t.pool_cache != KPoolTrace::PoolCache::native) {
      Cache<KPool::float8_e4m3> fp8(space, t,
                                    t.pool_cache == KPoolTrace::PoolCache::fp8
                                        ? KPool::CacheScale::amax
                                        : KPool::CacheScale::pow2,
                                    block_pools);
      return replay_with<T>(t, options, fp8, line);
    }
  }
  Cache<T> native(space, t, KPool::CacheScale::none, block_pools);
  return replay_with<T>(t, options, native, line);
}

void append_pool_line(std::string& s, Pool const& p) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "pool %u %d", static_cast<unsigned>(p.seq),
                static_cast<int>(p.id));
  s += buf;
  for (float v : p.values) {
    std::snprintf(buf, sizeof buf, " %.9g", static_cast<double>(v));
    s += buf;
  }
  s += '\n';
}

void append_count(std::string& s, char const* what, std::size_t n) {
  s += what;
  s += ' ';
  s += std::to_string(n);
  s += '\n';
}

bool by_seq_then_id(Pool const& a, Pool const& b) {
  return a.seq != b.seq ? a.seq < b.seq : a.id < b.id;
}

// Version 1: every pool produced, sorted (a pool produced twice is printed
// twice), then 'pools N'.
std::string format_v1(ReplayResult& r) {
  std::stable_sort(r.emitted.begin(), r.emitted.end(), by_seq_then_id);
  std::string s;
  for (auto const& p : r.emitted) append_pool_line(s, p);
  append_count(s, "pools", r.emitted.size());
  return s;
}

// cache SEQ POOL SCALE v_0 ... v_{D-1}: an fp8 cache entry, the scale and
// the E4M3 values as numbers.
void append_cache_line(std::string& s, PoolKey const& key, CacheEntry const& e) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "cache %u %d %.9g", static_cast<unsigned>(key.first),
                static_cast<int>(key.second), static_cast<double>(e.scale));
  s += buf;
  for (float v : e.values) {
    std::snprintf(buf, sizeof buf, " %.9g", static_cast<double>(v));
    s += buf;
  }
  s += '\n';
}

// select SEQ POS id id ...: what one query token selected.
void append_select_line(std::string& s, Selection const& sel) {
  s += "select " + std::to_string(sel.seq) + ' ' + std::to_string(sel.pos);
  for (std::int32_t id : sel.ids) {
    s += ' ';
    s += std::to_string(id);
  }
  s += '\n';
}

// Everything version 2 prints after 'pools N', in docs/trace.md's order:
// 'emitted E', the fp8 cache's entries of the printed pools (`printed`, in
// their order), the 'select' lines by seq, then pos, then block order,
// 'selects M'.
void append_v2_tail(std::string& s, KPoolTrace::Trace const& /*t*/,
                    ReplayResult const& r, std::vector<PoolKey> const& printed) {
  append_count(s, "emitted", r.emitted.size());
  if (r.has_cache_lines)
    for (PoolKey const& key : printed) append_cache_line(s, key, r.cache.at(key));
  std::vector<Selection const*> order;
  for (auto const& sel : r.selections) order.push_back(&sel);
  std::stable_sort(order.begin(), order.end(), [](Selection const* a, Selection const* b) {
    return a->seq != b->seq ? a->seq < b->seq : a->pos < b->pos;
  });
  for (Selection const* sel : order) append_select_line(s, *sel);
  append_count(s, "selects", order.size());
}

// Version 2: the pools complete within each sequence's final length, each
// with the value it was last emitted with, then the v2 tail.
std::string format_v2(KPoolTrace::Trace const& t, ReplayResult const& r) {
  std::map<PoolKey, Pool const*> last;
  for (auto const& p : r.emitted) last[PoolKey(p.seq, p.id)] = &p;
  std::string s;
  std::vector<PoolKey> printed;
  for (auto const& e : last) {
    auto const seq = t.sequences.find(e.first.first);
    std::uint64_t const complete =
        seq == t.sequences.end() ? 0 : seq->second.fed / t.kpool;
    if (e.first.second < 0 || static_cast<std::uint64_t>(e.first.second) >= complete)
      continue;
    append_pool_line(s, *e.second);
    printed.push_back(e.first);
  }
  append_count(s, "pools", printed.size());
  append_v2_tail(s, t, r, printed);
  return s;
}

std::string format(KPoolTrace::Trace const& t, ReplayResult& r) {
  return t.version == 1 ? format_v1(r) : format_v2(t, r);
}

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
               KPool::Options const& options, int block_pools, std::string& output) {
  int line = 0;
  try {
    Kokkos::ScopeGuard guard(argc, argv);
    try {
      ReplayResult result;
      switch (trace.dtype) {
        case KPoolTrace::DType::f32:
          result = replay<float>(trace, options, block_pools, line);
          break;
        case KPoolTrace::DType::f64:
          result = replay<double>(trace, options, block_pools, line);
          break;
        case KPoolTrace::DType::bf16:
          result = replay<KPool::bfloat16>(trace, options, block_pools, line);
          break;
        case KPoolTrace::DType::f16:
          result = replay<KPool::float16>(trace, options, block_pools, line);
          break;
      }
      output = format(trace, result);
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
  int block_pools = 16;
  std::string path = "-";
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
    } else if (a == "--engine" || a == "--block-pools") {
      std::string const v = i + 1 < argc ? argv[++i] : "";
      bool ok = true;
      if (a == "--engine") {
        if (v == "automatic") options.score_engine = KPool::ScoreEngine::automatic;
        else if (v == "register_tiles") options.score_engine = KPool::ScoreEngine::register_tiles;
        else if (v == "team_gemm") options.score_engine = KPool::ScoreEngine::team_gemm;
        else if (v == "tiles") options.score_engine = KPool::ScoreEngine::tiles;
        else if (v == "blas") options.score_engine = KPool::ScoreEngine::blas;
        else ok = false;
      } else {
        ok = !v.empty() && v.size() < 7 &&
             std::all_of(v.begin(), v.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
        if (ok) block_pools = std::stoi(v);
        ok = ok && block_pools >= 1;
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
  {
    StdoutToStderr const redirect;
    status = replay_all(argc, argv, trace, options, block_pools, output);
  }
  if (status != 0) return status;
  std::fwrite(output.data(), 1, output.size(), stdout);
  if (std::fflush(stdout) != 0) {
    std::cerr << "kpool_replay: writing the output failed\n";
    return 2;
  }
  return 0;
}
