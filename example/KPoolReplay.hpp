#ifndef KPOOL_REPLAY_HPP
#define KPOOL_REPLAY_HPP

// The replay of a serving trace (docs/trace.md, versions 1 and 2) through
// KPool::step (ragged and decode batches) and KPool::score_select, and the
// text it prints: what kpool_replay runs and fuzz/fuzz_trace.cpp drives,
// one copy.
// KPoolReplay::replay_trace needs Kokkos initialized; every view it makes
// is gone when it returns.

#include "KPoolTrace.hpp"

#include <KPool.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace KPoolReplay {


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

// A replay across ranks (kpool_replay --ranks, docs/ranks.md): every rank
// runs every call, its pool cache is its shard (interleave pools a run),
// the selections go through the ranks' exchange, and the cache entries are
// gathered, so every rank ends with what one rank replays. No
// communicator: one rank, the whole cache.
struct Ranks {
  KPool::Communicator<ExecSpace>* comm = nullptr;
  int interleave = 1;
  KPool::Shard shard() const {
    return comm == nullptr ? KPool::Shard{}
                           : KPool::Shard{comm->rank(), comm->size(), interleave};
  }
};
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
  // fused: a serving cache in the engines' fused byte layout
  // (--cache-layout fused), over a buffer of this program's.
  Cache(ExecSpace const& space, KPoolTrace::Trace const& t, KPool::CacheScale scale,
        int block_pools, bool fused, Ranks const& ranks)
      : kpool_(t.kpool), block_pools_(block_pools), ranks_(ranks), shard_(ranks.shard()) {
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
    // A rank's blocks hold its own pools only.
    for (auto const& e : reach)
      total += (shard_.local_count(e.second) + block_pools_u - 1) / block_pools_u;
    if (total > 0x7FFFFFFFull)
      throw std::runtime_error("the trace's pools need more cache blocks than a "
                               "block number holds");
    int const blocks = static_cast<int>(std::max<std::uint64_t>(total, 1));
    bool const serving = t.pool_cache == KPoolTrace::PoolCache::fp8_serving;
    if (fused && !serving)
      throw std::runtime_error("--cache-layout fused needs a trace with pool_cache fp8_serving");
    if constexpr (std::is_same<C, KPool::float8_e4m3>::value) {
      if (fused) {
        typename KPool::PoolCache<C, MemSpace>::bytes_type bytes(
            "kpool_replay::fused_cache", blocks,
            static_cast<std::size_t>(block_pools_) * (t.head_dim + 4));
        cache_ = KPool::PoolCache<C, MemSpace>(bytes, block_pools_, t.head_dim, t.kpool, t.rotate)
                     .sharded(shard_);
        return;
      }
    }
    cache_ = KPool::PoolCache<C, MemSpace>(
                 space, blocks, block_pools_, t.head_dim, t.kpool, scale, t.rotate,
                 serving ? KPool::CacheProfile::serving : KPool::CacheProfile::exact)
                 .sharded(shard_);
  }

  // call(cache, block_table) with the block's block table: row r holds its
  // sequence's blocks (new ones for pools seen the first time; on a shard,
  // of the rank's own pools), -1 past them.
  template <class Call>
  void with(ExecSpace const& space, KPoolTrace::Block const& b, Call const& call) {
    std::size_t width = 1;
    for (auto const& r : b.rows) {
      std::vector<std::int32_t>& have = blocks_[r.seq];
      std::uint64_t const end = shard_.local_count((r.cache_len + r.n_new) / kpool_);
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
  // written but printed nowhere); across ranks, each rank reads its own
  // pools' and the ranks gather them.
  void read(ExecSpace const& space, ReplayResult& result) const {
    if constexpr (std::is_same<C, KPool::float8_e4m3>::value) {
      space.fence();
      bool const fused = cache_.layout() == KPool::CacheLayout::fused;
      auto const values =
          Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), cache_.values());
      auto const scales =
          Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), cache_.scales());
      auto const bytes =
          Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), cache_.bytes());
      int const D = cache_.head_dim();
      result.has_cache_lines = true;
      for (auto const& p : result.emitted) {
        if (shard_.owner(static_cast<std::uint64_t>(p.id)) != shard_.rank) continue;
        auto const local = static_cast<std::int64_t>(shard_.local(static_cast<std::uint64_t>(p.id)));
        std::vector<std::int32_t> const& have = blocks_.at(p.seq);
        std::int32_t const block = have.at(static_cast<std::size_t>(local / block_pools_));
        int const entry = static_cast<int>(local % block_pools_);
        CacheEntry e;
        e.values.resize(D);
        if (fused) {
          // docs/indexer.md, "The engines' byte layout": the block's
          // entries, then its scales.
          std::size_t const scale_at =
              static_cast<std::size_t>(block_pools_) * D + 4 * static_cast<std::size_t>(entry);
          std::memcpy(&e.scale, &bytes(block, scale_at), sizeof(float));
          for (int c = 0; c < D; ++c)
            e.values[c] = static_cast<float>(KPool::float8_e4m3::from_bits(
                bytes(block, static_cast<std::size_t>(entry) * D + c)));
        } else {
          e.scale = scales(block, entry);
          for (int c = 0; c < D; ++c)
            e.values[c] = static_cast<float>(values(block, entry, c));
        }
        result.cache[PoolKey(p.seq, p.id)] = std::move(e);
      }
      if (ranks_.comm != nullptr && shard_.ranks > 1) gather(result.cache, D);
    } else {
      (void)space;
      (void)result;
    }
  }

 private:
  // Every rank's entries on every rank: counts first, then the entries
  // (seq, id, scale, D values as 32-bit words), padded to the largest.
  void gather(std::map<PoolKey, CacheEntry>& cache, int D) const {
    std::size_t const per = 3 + static_cast<std::size_t>(D);
    std::vector<std::uint32_t> mine;
    for (auto const& kv : cache) {
      mine.push_back(kv.first.first);
      mine.push_back(static_cast<std::uint32_t>(kv.first.second));
      std::uint32_t w;
      std::memcpy(&w, &kv.second.scale, 4);
      mine.push_back(w);
      for (float v : kv.second.values) {
        std::memcpy(&w, &v, 4);
        mine.push_back(w);
      }
    }
    int const W = shard_.ranks;
    std::uint64_t const count = mine.size();
    std::vector<std::uint64_t> counts(static_cast<std::size_t>(W));
    ranks_.comm->all_gather_host(&count, counts.data(), sizeof count);
    std::uint64_t const most = *std::max_element(counts.begin(), counts.end());
    mine.resize(most);
    std::vector<std::uint32_t> all(most * static_cast<std::size_t>(W));
    ranks_.comm->all_gather_host(mine.data(), all.data(), most * 4);
    for (int r = 0; r < W; ++r)
      for (std::uint64_t i = 0; i + per <= counts[r]; i += per) {
        std::uint32_t const* w = all.data() + static_cast<std::size_t>(r) * most + i;
        CacheEntry e;
        std::memcpy(&e.scale, &w[2], 4);
        e.values.resize(D);
        std::memcpy(e.values.data(), &w[3], 4 * static_cast<std::size_t>(D));
        cache[PoolKey(w[0], static_cast<std::int32_t>(w[1]))] = std::move(e);
      }
  }

  int kpool_;
  int block_pools_;
  Ranks ranks_;
  KPool::Shard shard_;
  KPool::PoolCache<C, MemSpace> cache_;
  std::map<std::uint32_t, std::vector<std::int32_t>> blocks_;
  std::int32_t next_ = 0;
};

// Kokkos Tools events of the selections (kpool_replay --launch-log): for
// each select block, the kernels begun, fences, deep copies and
// allocations while its KPool::score_select call runs. The fences Kokkos
// 4.x adds before each callback of a tool set after initialization exist
// only because the log listens, and are not counted.
class LaunchLog {
 public:
  struct Call {
    std::size_t block = 0;
    bool decode = false;
    std::vector<std::string> kernels;
    int fences = 0;
    int copies = 0;
    std::vector<std::string> allocations;
  };

  static LaunchLog& get() {
    static LaunchLog log;
    return log;
  }
  // Listens from now on (kpool_replay, before the replay).
  void start() {
    on_ = true;
    namespace X = Kokkos::Tools::Experimental;
    X::set_begin_parallel_for_callback(&LaunchLog::on_kernel);
    X::set_begin_parallel_reduce_callback(&LaunchLog::on_kernel);
    X::set_begin_parallel_scan_callback(&LaunchLog::on_kernel);
    X::set_begin_fence_callback(&LaunchLog::on_fence);
    X::set_begin_deep_copy_callback(&LaunchLog::on_copy);
    X::set_allocate_data_callback(&LaunchLog::on_allocation);
  }
  void stop() {
    namespace X = Kokkos::Tools::Experimental;
    X::set_begin_parallel_for_callback(nullptr);
    X::set_begin_parallel_reduce_callback(nullptr);
    X::set_begin_parallel_scan_callback(nullptr);
    X::set_begin_fence_callback(nullptr);
    X::set_begin_deep_copy_callback(nullptr);
    X::set_allocate_data_callback(nullptr);
    on_ = false;
  }
  bool listening() const { return on_; }
  // Records what f does as select block `block`'s call; whatever was
  // queued before has finished, and f's work finishes before the record
  // closes (neither fence is recorded).
  template <class F>
  void record(ExecSpace const& space, std::size_t block, bool decode, F&& f) {
    if (!on_) {
      f();
      return;
    }
    space.fence();
    {
      std::lock_guard<std::mutex> const hold(lock_);
      calls_.emplace_back();
      calls_.back().block = block;
      calls_.back().decode = decode;
      armed_ = true;
    }
    f();
    {
      std::lock_guard<std::mutex> const hold(lock_);
      armed_ = false;
    }
    space.fence();
  }
  // One line a call: "select BLOCK decode|ragged kernels N fences F copies
  // C allocations A", then the kernels' and allocations' names, one a line.
  std::string text() const {
    std::string s;
    for (Call const& c : calls_) {
      s += "select " + std::to_string(c.block) + (c.decode ? " decode" : " ragged") +
           " kernels " + std::to_string(c.kernels.size()) + " fences " +
           std::to_string(c.fences) + " copies " + std::to_string(c.copies) +
           " allocations " + std::to_string(c.allocations.size()) + "\n";
      for (std::string const& k : c.kernels) s += "  kernel " + k + "\n";
      for (std::string const& a : c.allocations) s += "  allocation " + a + "\n";
    }
    return s;
  }

 private:
  // A host backend's threads call back at once (Kokkos::OpenMP grows its
  // team-scratch pool inside a parallel region): the callbacks lock.
  static void on_kernel(char const* name, std::uint32_t, std::uint64_t*) {
    LaunchLog& l = get();
    std::lock_guard<std::mutex> const hold(l.lock_);
    if (l.armed_) l.calls_.back().kernels.emplace_back(name ? name : "(no name)");
  }
  static void on_fence(char const* name, std::uint32_t, std::uint64_t*) {
    LaunchLog& l = get();
    std::lock_guard<std::mutex> const hold(l.lock_);
    if (l.armed_ && !(name && std::strstr(name, "Kokkos Profile Tool Fence")))
      ++l.calls_.back().fences;
  }
  static void on_copy(Kokkos::Tools::SpaceHandle, char const*, void const*,
                      Kokkos::Tools::SpaceHandle, char const*, void const*, std::uint64_t) {
    LaunchLog& l = get();
    std::lock_guard<std::mutex> const hold(l.lock_);
    if (l.armed_) ++l.calls_.back().copies;
  }
  static void on_allocation(Kokkos::Tools::SpaceHandle, char const* label, void const*,
                            std::uint64_t) {
    LaunchLog& l = get();
    std::lock_guard<std::mutex> const hold(l.lock_);
    if (l.armed_) l.calls_.back().allocations.emplace_back(label ? label : "(no label)");
  }

  bool on_ = false;
  bool armed_ = false;
  std::mutex lock_;
  std::vector<Call> calls_;
};

// A select block in the decode form (KPool::decode_batch), as a serving
// engine's decode step sends it: every row queries the latest next_n >= 1
// tokens of its sequence (KPoolTrace::Row::at_length), the same next_n
// for every row. Returns next_n, or 0 when the block is not so (it then
// runs as a ragged batch). Rows of fewer tokens would need padding, and a
// decode row spans next_n positions from its first (the pools it sees
// are counted so: docs/indexer.md), past a shorter row's length.
inline int decode_width(KPoolTrace::Block const& block) {
  if (block.rows.empty()) return 0;
  std::uint64_t const width = block.rows.front().n_new;
  for (auto const& r : block.rows)
    if (r.n_new != width || !r.at_length) return 0;
  return width == 0 || width > 0x7FFFFFFF ? 0 : static_cast<int>(width);
}

// The select blocks (docs/trace.md, "Blocks"): each runs one
// KPool::score_select over the cache the steps wrote so far, with the
// trace's queries and head weights, and records every query token's
// selection: a block of decode rows (decode_width) through the decode
// batch form, the path a serving engine's decode step takes, any other
// through the ragged form. One workspace and output for the largest block.
template <class T>
class Selector {
 public:
  Selector(ExecSpace const& space, KPoolTrace::Trace const& t, KPool::ScoreEngine engine,
           Ranks const& ranks)
      : ranks_(ranks) {
    std::uint64_t tokens = 0, visible = 1;
    for (auto const& b : t.blocks) {
      if (b.kind != KPoolTrace::BlockKind::select) continue;
      tokens = std::max(tokens, b.tokens);
      for (auto const& r : b.rows)
        visible = std::max(visible, (r.cache_len + r.n_new) / t.kpool);
    }
    if (tokens == 0) return;
    // Built for the engine asked for: the workspace's, every selection's
    // (the blas engine stages its own buffers).
    workspace_ = KPool::SelectWorkspace<T, MemSpace>(space, tokens, visible, t.index_heads,
                                                     t.head_dim, engine);
    pool_ids_ = ViewT<std::int32_t, 2>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, "pool_ids"), tokens, t.index_topk);
    if (ranks_.comm != nullptr)
      exchange_ = KPool::ShardWorkspace<T, MemSpace>(space, tokens, t.index_topk,
                                                     ranks_.comm->size());
  }

  template <class ReplayCache>
  void run(ExecSpace const& space, KPoolTrace::Trace const& t,
           KPoolTrace::Block const& block, std::size_t index, ReplayCache& cache,
           KPool::Options const& options, ReplayResult& result) {
    if (block.tokens == 0) return;
    int const D = t.head_dim;
    int const H = t.index_heads;
    std::size_t const B = block.rows.size();
    int const next_n = decode_width(block);
    // Row r's first query row: row_offsets(r) (ragged), r * next_n (decode).
    std::vector<std::size_t> first(B + 1, 0);
    for (std::size_t r = 0; r < B; ++r)
      first[r + 1] = next_n > 0 ? (r + 1) * static_cast<std::size_t>(next_n)
                                : first[r] + block.rows[r].n_new;
    std::size_t const rows = first[B];
    // q[t][h][c] and weights[t][h] of the values last sent for each query
    // position (the row's revisions), docs/trace.md.
    ViewT<T, 3> q(Kokkos::view_alloc(Kokkos::WithoutInitializing, "q"), rows, H, D);
    ViewT<float, 2> weights(Kokkos::view_alloc(Kokkos::WithoutInitializing, "weights"),
                            rows, H);
    auto hq = Kokkos::create_mirror_view(q);
    auto hw = Kokkos::create_mirror_view(weights);
    for (std::size_t r = 0; r < B; ++r) {
      KPoolTrace::Row const& row = block.rows[r];
      for (std::uint64_t i = 0; i < row.n_new; ++i) {
        std::uint64_t const pos = row.cache_len + i;
        std::uint64_t const rev = row.revision(pos);
        for (int h = 0; h < H; ++h) {
          hw(first[r] + i, h) = KPoolTrace::weight_value(t.seed, row.seq, pos, h, rev);
          for (int c = 0; c < D; ++c)
            hq(first[r] + i, h, c) =
                storage<T>(KPoolTrace::query_value(t.seed, row.seq, pos, h, c, D, rev));
        }
      }
    }
    Kokkos::deep_copy(space, q, hq);
    Kokkos::deep_copy(space, weights, hw);
    auto const ids = Kokkos::subview(pool_ids_, std::make_pair(std::size_t(0), rows),
                                     Kokkos::ALL);
    auto const run_select = [&](auto const& batch) {
      cache.with(space, block, [&](auto&... pool_cache) {
        // A version 1 trace, whose replay has no cache, has no select blocks.
        if constexpr (sizeof...(pool_cache) == 2)
          LaunchLog::get().record(space, index, next_n > 0, [&]() {
            select(space, batch, t, q, weights, pool_cache..., ids, options);
          });
      });
    };
    if (next_n > 0) {
      ViewT<std::int32_t, 2> positions("positions", B, next_n);
      auto hp = Kokkos::create_mirror_view(positions);
      for (std::size_t r = 0; r < B; ++r)
        for (int i = 0; i < next_n; ++i)
          hp(r, i) = static_cast<std::int32_t>(block.rows[r].cache_len + i);
      Kokkos::deep_copy(space, positions, hp);
      run_select(KPool::decode_batch(positions, static_cast<int>(B)));
    } else {
      ViewT<std::uint32_t, 1> row_offsets("row_offsets", B + 1);
      ViewT<std::uint32_t, 1> cache_lengths("cache_lengths", B);
      auto ho = Kokkos::create_mirror_view(row_offsets);
      auto hc = Kokkos::create_mirror_view(cache_lengths);
      for (std::size_t r = 0; r <= B; ++r) ho(r) = static_cast<std::uint32_t>(first[r]);
      for (std::size_t r = 0; r < B; ++r)
        hc(r) = static_cast<std::uint32_t>(block.rows[r].cache_len);
      Kokkos::deep_copy(space, row_offsets, ho);
      Kokkos::deep_copy(space, cache_lengths, hc);
      run_select(KPool::ragged_batch(row_offsets, cache_lengths, static_cast<int>(B)));
    }
    auto const h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), ids);
    for (std::size_t r = 0; r < B; ++r) {
      KPoolTrace::Row const& row = block.rows[r];
      for (std::uint64_t i = 0; i < row.n_new; ++i) {
        Selection sel;
        sel.seq = row.seq;
        sel.pos = row.cache_len + i;
        sel.block = index;
        for (int j = 0; j < t.index_topk; ++j)
          if (h(first[r] + i, j) >= 0) sel.ids.push_back(h(first[r] + i, j));
        result.selections.push_back(std::move(sel));
      }
    }
  }

 private:
  template <class Batch, class Q, class W, class PoolCache, class Table, class Ids>
  void select(ExecSpace const& space, Batch const& batch, KPoolTrace::Trace const& t,
              Q const& q, W const& weights, PoolCache const& pool_cache, Table const& table,
              Ids const& ids, KPool::Options const& options) {
    if (ranks_.comm != nullptr) {
      // The cache's shard, through the ranks' exchange: the same ids.
      KPool::score_select(space, q, weights, t.index_topk, batch,
                          KPool::paged(pool_cache, table), ids, workspace_, exchange_,
                          *ranks_.comm, options);
      return;
    }
    KPool::score_select(space, q, weights, t.index_topk, batch, KPool::paged(pool_cache, table),
                        ids, workspace_, options);
  }

  Ranks ranks_;
  KPool::ShardWorkspace<T, MemSpace> exchange_;
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
  auto const batch =
      KPool::ragged_batch(row_offsets, cache_lengths, slot_idx, static_cast<int>(B));
  cache.with(space, block, [&](auto&... pool_cache) {
    if constexpr (sizeof...(pool_cache) == 0)
      KPool::step(space, ring, key, gate, ape, batch, out, options);
    else
      KPool::step(space, ring, key, gate, ape, batch, KPool::paged(pool_cache...), out,
                  options);
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
  auto const batch = KPool::decode_batch(positions, slot_idx, static_cast<int>(B));
  cache.with(space, block, [&](auto&... pool_cache) {
    if constexpr (sizeof...(pool_cache) == 0)
      KPool::step(space, ring, key, gate, ape, batch, out, options);
    else
      KPool::step(space, ring, key, gate, ape, batch, KPool::paged(pool_cache...), out,
                  options);
  });
}

// Replays the whole trace in storage type T, writing `cache`; `line`
// follows the block being run so a failure can name it.
template <class T, class ReplayCache>
ReplayResult replay_with(KPoolTrace::Trace const& t, KPool::Options const& options,
                         KPool::ScoreEngine engine, ReplayCache& cache, int& line,
                         Ranks const& ranks) {
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
  Selector<T> selector(space, t, engine, ranks);

  ReplayResult result;
  std::size_t index = 0;
  for (auto const& b : t.blocks) {
    line = b.line;
    try {
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
    } catch (KPool::InvalidArgument const& e) {
      // KPool names the batch row: the trace's row of the same index (the
      // ring's depth rule, which KPool checks and the reader leaves to it).
      if (b.kind != KPoolTrace::BlockKind::select && e.row() >= 0 &&
          static_cast<std::size_t>(e.row()) < b.rows.size())
        line = b.rows[static_cast<std::size_t>(e.row())].line;
      throw;
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
                    KPool::ScoreEngine engine, int block_pools, bool fused_layout, int& line,
                    Ranks const& ranks) {
  ExecSpace const space;
  if (t.version < 2) {
    // No cache to shard: every rank replays the whole trace alike.
    NoCache none;
    return replay_with<T>(t, options, engine, none, line, ranks);
  }
  if constexpr (!std::is_same<T, double>::value) {
    // The parser refuses an fp8 cache of f64 pools.
    if (t.pool_cache != KPoolTrace::PoolCache::native) {
      Cache<KPool::float8_e4m3> fp8(space, t,
                                    t.pool_cache == KPoolTrace::PoolCache::fp8
                                        ? KPool::CacheScale::amax
                                        : KPool::CacheScale::pow2,
                                    block_pools, fused_layout, ranks);
      return replay_with<T>(t, options, engine, fp8, line, ranks);
    }
  }
  Cache<T> native(space, t, KPool::CacheScale::none, block_pools, fused_layout, ranks);
  return replay_with<T>(t, options, engine, native, line, ranks);
}

inline void append_pool_line(std::string& s, Pool const& p) {
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

inline void append_count(std::string& s, char const* what, std::size_t n) {
  s += what;
  s += ' ';
  s += std::to_string(n);
  s += '\n';
}

inline bool by_seq_then_id(Pool const& a, Pool const& b) {
  return a.seq != b.seq ? a.seq < b.seq : a.id < b.id;
}

// Version 1: every pool produced, sorted (a pool produced twice is printed
// twice), then 'pools N'.
inline std::string format_v1(ReplayResult& r) {
  std::stable_sort(r.emitted.begin(), r.emitted.end(), by_seq_then_id);
  std::string s;
  for (auto const& p : r.emitted) append_pool_line(s, p);
  append_count(s, "pools", r.emitted.size());
  return s;
}

// cache SEQ POOL SCALE v_0 ... v_{D-1}: an fp8 cache entry, the scale and
// the E4M3 values as numbers.
inline void append_cache_line(std::string& s, PoolKey const& key, CacheEntry const& e) {
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
inline void append_select_line(std::string& s, Selection const& sel) {
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
inline void append_v2_tail(std::string& s, KPoolTrace::Trace const& /*t*/,
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
inline std::string format_v2(KPoolTrace::Trace const& t, ReplayResult const& r) {
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

inline std::string format(KPoolTrace::Trace const& t, ReplayResult& r) {
  return t.version == 1 ? format_v1(r) : format_v2(t, r);
}

/// Replays `trace` on Kokkos' default execution space and returns what
/// kpool_replay prints (docs/trace.md, "Output"). `line` follows the block
/// being run, so that when a call throws (KPool::InvalidArgument, a
/// std::runtime_error of the replay's own checks, std::bad_alloc) the
/// caller can name the trace line; it is 0 after the last block.
/// `fused_layout`: a pool_cache fp8_serving cache in the engines' fused
/// byte layout (the output does not depend on it).
/// `ranks`: a replay across ranks (kpool_replay --ranks): the same output.
/// `engine`: the selections' scoring engine (their SelectWorkspace's).
inline std::string replay_trace(KPoolTrace::Trace const& trace, KPool::Options const& options,
                                int block_pools, bool fused_layout, int& line,
                                Ranks const& ranks = Ranks(),
                                KPool::ScoreEngine engine = KPool::ScoreEngine::automatic) {
  ReplayResult result;
  switch (trace.dtype) {
    case KPoolTrace::DType::f32:
      result = replay<float>(trace, options, engine, block_pools, fused_layout, line, ranks);
      break;
    case KPoolTrace::DType::f64:
      result = replay<double>(trace, options, engine, block_pools, fused_layout, line, ranks);
      break;
    case KPoolTrace::DType::bf16:
      result = replay<KPool::bfloat16>(trace, options, engine, block_pools, fused_layout,
                                       line, ranks);
      break;
    case KPoolTrace::DType::f16:
      result = replay<KPool::float16>(trace, options, engine, block_pools, fused_layout,
                                      line, ranks);
      break;
  }
  return format(trace, result);
}

}  // namespace KPoolReplay

#endif  // KPOOL_REPLAY_HPP
