#ifndef KPOOL_RANKS_SHARD_SELECT_HPP
#define KPOOL_RANKS_SHARD_SELECT_HPP

/// @file
/// The indexer across ranks (docs/ranks.md): a pool cache sharded over W
/// ranks (PoolCache::sharded), and one global selection, bit for bit the
/// one a single rank makes over the whole cache. Each rank scores and
/// selects its own visible pools (shard_select_local), the ranks exchange
/// their local top-k through a Communicator (an all-gather of W * topk
/// (id, key) pairs a query row), and every rank merges them with KPool's
/// rule (shard_select_merge). score_select with a Communicator does all
/// three, after the ranks agree that the call is good on every one.

#include <cache/KPool_PagedCache.hpp>
#include <common/KPool_Batch.hpp>
#include <common/KPool_Exceptions.hpp>
#include <common/KPool_Options.hpp>
#include <common/KPool_Shard.hpp>
#include <common/detail/KPool_Launch.hpp>
#include <common/detail/KPool_Validate.hpp>
#include <ranks/KPool_Communicator.hpp>
#include <ranks/detail/KPool_ShardMerge.hpp>
#include <select/KPool_ScoreSelect.hpp>
#include <select/KPool_SelectTokens.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace KPool {

/// The exchange buffers of a sharded selection: what this rank sends (its
/// local top-k of every query row: local pool ids and keys) and what it
/// receives (every rank's), and the merge's counts. Allocate once, for the
/// largest call (rows of q, topk) and the ranks; the sharded selections
/// allocate nothing.
/// Memory: (ranks + 1) * max_tokens * topk * (4 + key bytes) for the
/// exchange (key bytes: 4, 8 for f64 queries), 4 * max_tokens *
/// (ranks * topk + 1) for the merge and 8 * max_tokens for the token
/// rows' positions.
/// @tparam T the queries' storage type, as the SelectWorkspace's.
template <class T, class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
class ShardWorkspace {
 public:
  using storage_type = T;
  using memory_space = MemorySpace;
  /// A score as the selection's order-preserving key.
  using key_type = typename SelectWorkspace<T, MemorySpace>::key_type;
  using bytes_type = Kokkos::View<unsigned char*, MemorySpace>;

  ShardWorkspace() = default;

  /// Allocates the buffers on `space` (labelled KPool::ShardWorkspace::send,
  /// ...::recv, ...::merge_counts, ...::row_positions).
  /// @param max_tokens the most query rows a call has.
  /// @param topk the largest topk a call asks for.
  /// @param ranks the ranks the cache is sharded over.
  /// @throws KPool::InvalidArgument (entry point "KPool::ShardWorkspace")
  /// for sizes below 1.
  template <class ExecutionSpace>
  ShardWorkspace(ExecutionSpace const& space, std::size_t max_tokens, int topk, int ranks)
      : max_tokens_(max_tokens), topk_(topk), ranks_(ranks) {
    Details::Checker const chk("KPool::ShardWorkspace");
    if (max_tokens < 1) chk.fail_scalar("max_tokens", 0, "is not at least 1");
    if (topk < 1) chk.fail_scalar("topk", topk, "is not at least 1");
    if (ranks < 1) chk.fail_scalar("ranks", ranks, "is not at least 1");
    std::uint64_t const bytes = payload_bytes(max_tokens, topk);
    send_ = bytes_type(Kokkos::view_alloc(space, Kokkos::WithoutInitializing,
                                          "KPool::ShardWorkspace::send"),
                       bytes);
    recv_ = bytes_type(Kokkos::view_alloc(space, Kokkos::WithoutInitializing,
                                          "KPool::ShardWorkspace::recv"),
                       bytes * static_cast<std::uint64_t>(ranks));
    counts_ = Kokkos::View<std::int32_t*, MemorySpace>(
        Kokkos::view_alloc(space, Kokkos::WithoutInitializing,
                           "KPool::ShardWorkspace::merge_counts"),
        max_tokens * (static_cast<std::size_t>(ranks) * topk + 1));
    row_positions_ = Kokkos::View<std::int64_t*, MemorySpace>(
        Kokkos::view_alloc(space, Kokkos::WithoutInitializing,
                           "KPool::ShardWorkspace::row_positions"),
        max_tokens);
  }

  /// The bytes one rank sends for a call of `rows` query rows: each row's
  /// topk local ids (int32), then their keys.
  static std::size_t payload_bytes(std::size_t rows, int topk) {
    return Details::shard_payload<key_type>(rows, topk).bytes;
  }

  std::size_t max_tokens() const { return max_tokens_; }
  int topk() const { return topk_; }
  int ranks() const { return ranks_; }
  bool is_allocated() const { return send_.data() != nullptr; }
  /// This rank's payload: payload_bytes(rows, topk) bytes from the start.
  bytes_type const& send() const { return send_; }
  /// Every rank's payload, rank r's at r * payload_bytes(rows, topk).
  bytes_type const& recv() const { return recv_; }
  /// The merge's counts (internal).
  std::int32_t* merge_counts() const { return counts_.data(); }
  /// Each row's positions count, for the token rows (internal).
  std::int64_t* row_positions() const { return row_positions_.data(); }

 private:
  std::size_t max_tokens_ = 0;
  int topk_ = 0;
  int ranks_ = 0;
  bytes_type send_;
  bytes_type recv_;
  Kokkos::View<std::int32_t*, MemorySpace> counts_;
  Kokkos::View<std::int64_t*, MemorySpace> row_positions_;
};

namespace Details {

// The shapes a sharded call needs of its exchange (always checked).
template <class T, class M, class C>
void check_shard_exchange(Checker const& chk, PagedCache<C, M> const& cache, int topk,
                          std::size_t rows, ShardWorkspace<T, M> const& exchange) {
  if (!exchange.is_allocated())
    chk.fail("exchange", "", -1, "an empty ShardWorkspace",
             "has no storage (construct it with a size)");
  Shard const& s = cache.cache.shard();
  if (exchange.ranks() != s.ranks)
    chk.fail("exchange", "ranks", -1, std::to_string(exchange.ranks()),
             "does not match the cache's shard, " + shard_name(s));
  if (topk > exchange.topk())
    chk.fail_scalar("topk", topk,
                    "is more than the exchange's topk = " + std::to_string(exchange.topk()));
  if (rows > exchange.max_tokens())
    chk.fail("q", "extent 0", -1, std::to_string(rows),
             "is more query rows than the exchange's max_tokens = " +
                 std::to_string(exchange.max_tokens()));
}

// What each rank tells the others before a sharded selection: its shard
// and call, and the error its checks threw, if any (fixed size, plain
// bytes, for Communicator::all_gather_host).
struct ShardHeader {
  std::int32_t failed = 0;
  std::int32_t rank = 0, ranks = 0, interleave = 0, topk = 0, key_bytes = 0;
  std::int64_t rows = 0, row = -1;
  char entry[64] = {}, argument[64] = {}, where[128] = {}, value[128] = {};
  char problem[640] = {};
};

template <std::size_t N>
void put_text(char (&dst)[N], std::string const& s) {
  std::size_t const n = std::min(N - 1, s.size());
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

// Every rank's header; then, on every rank alike: the first rank's error,
// or a shard or call that does not match the group's, thrown as one
// KPool::InvalidArgument (naming the rank it is about).
template <class ExecutionSpace>
void agree_on_shards(Communicator<ExecutionSpace>& comm, ShardHeader const& mine,
                     std::string const& entry) {
  int const W = comm.size();
  std::vector<ShardHeader> all(static_cast<std::size_t>(W));
  comm.all_gather_host(&mine, all.data(), sizeof(ShardHeader));
  for (int r = 0; r < W; ++r) {
    ShardHeader const& h = all[static_cast<std::size_t>(r)];
    if (!h.failed) continue;
    std::string const where = std::string(h.where);
    throw InvalidArgument(h.entry, h.argument,
                          (where.empty() ? "" : where + ", ") + "on rank " + std::to_string(r),
                          h.row, h.value, h.problem);
  }
  ShardHeader const& first = all[0];
  for (int r = 0; r < W; ++r) {
    ShardHeader const& h = all[static_cast<std::size_t>(r)];
    Shard const s{h.rank, h.ranks, h.interleave};
    std::string const on = "on rank " + std::to_string(r);
    if (h.ranks != W || h.rank != r)
      throw InvalidArgument(entry, "cache", "shard, " + on, -1, shard_name(s),
                            "does not match the communicator's rank " + std::to_string(r) +
                                " of " + std::to_string(W));
    if (h.interleave != first.interleave)
      throw InvalidArgument(entry, "cache", "shard, " + on, -1, shard_name(s),
                            "does not match rank 0's interleave = " +
                                std::to_string(first.interleave));
    if (h.topk != first.topk)
      throw InvalidArgument(entry, "topk", on, -1, std::to_string(h.topk),
                            "does not match rank 0's topk = " + std::to_string(first.topk));
    if (h.rows != first.rows)
      throw InvalidArgument(entry, "q", "extent 0, " + on, -1, std::to_string(h.rows),
                            "does not match rank 0's rows = " + std::to_string(first.rows));
    if (h.key_bytes != first.key_bytes)
      throw InvalidArgument(entry, "q", on, -1, std::to_string(8 * h.key_bytes) + "-bit keys",
                            "do not match rank 0's " + std::to_string(8 * first.key_bytes) +
                                "-bit keys (the queries' storage types differ)");
  }
}

}  // namespace Details

namespace Details {

// shard_select_local's work, its errors named after `chk`'s entry point.
template <class ExecutionSpace, class C, class MemorySpace, class QView, class WeightsView,
          class T>
void shard_local_call(Checker const& chk, ExecutionSpace const& space,
                      PagedCache<C, MemorySpace> const& cache, QView const& q,
                      WeightsView const& weights, int topk, Batch<MemorySpace> const& batch,
                      SelectWorkspace<T, MemorySpace>& workspace,
                      ShardWorkspace<T, MemorySpace>& exchange, Options const& options) {
  using Key = typename ShardWorkspace<T, MemorySpace>::key_type;
  std::size_t const rows = q.extent(0);
  if (topk < 1) chk.fail_scalar("topk", topk, "is not at least 1");
  check_shard_exchange(chk, cache, topk, rows, exchange);
  ShardPayload const payload = shard_payload<Key>(rows, topk);
  using Ids = Kokkos::View<std::int32_t**, Kokkos::LayoutRight, MemorySpace,
                           Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  Ids const ids(reinterpret_cast<std::int32_t*>(exchange.send().data()), rows,
                static_cast<std::size_t>(topk));
  // Every row dead until the selection writes it (the payload is the
  // exchange's scratch: a call refused below leaves nothing else written).
  if (rows > 0) Kokkos::deep_copy(space, ids, shard_dead_row);
  score_select_batch<false>(chk, space, cache, q, weights, topk, batch, "pool_ids", ids,
                            workspace, options,
                            static_cast<void*>(exchange.send().data() + payload.keys_offset));
}

}  // namespace Details

/// A rank's part of a sharded selection (docs/ranks.md): scores this
/// rank's visible pools of every query row and selects its local top-k
/// into exchange.send() (the local pool ids ascending, -1 after them, and
/// their keys), for the exchange. Rows of no live request are marked so
/// that the merge leaves them untouched. The same rules, launches and
/// errors as score_select over this rank's pools (the selection kernels
/// write the keys as well), plus one fill of the payload's ids.
/// @param cache this rank's shard of the cache (PoolCache::sharded) and
/// its block table of local pools.
/// @param exchange built for at least q's rows, topk, and the cache's ranks.
template <class ExecutionSpace, class QView, class WeightsView, class C, class MemorySpace,
          class T>
void shard_select_local(ExecutionSpace const& space, QView const& q, WeightsView const& weights,
                        int topk, Batch<MemorySpace> const& batch,
                        PagedCache<C, MemorySpace> const& cache,
                        SelectWorkspace<T, MemorySpace>& workspace,
                        ShardWorkspace<T, MemorySpace>& exchange,
                        Options const& options = Options()) {
  Details::shard_local_call(Details::Entry("KPool::shard_select_local"), space, cache, q,
                            weights, topk, batch, workspace, exchange, options);
}

namespace Details {

// The merge into pool ids (Expand false) or token rows (true, with the
// batch's positions), its errors named after `chk`'s entry point.
template <bool Expand, class ExecutionSpace, class C, class MemorySpace, class OutView, class T>
void shard_merge_call(Checker const& chk, ExecutionSpace const& space,
                      PagedCache<C, MemorySpace> const& cache, int topk,
                      Batch<MemorySpace> const& batch, char const* out_name, OutView const& out,
                      ShardWorkspace<T, MemorySpace>& exchange, Options const& options) {
  using Key = typename ShardWorkspace<T, MemorySpace>::key_type;
  std::size_t const rows = out.extent(0);
  int const K = cache.cache.kpool();
  if (topk < 1) chk.fail_scalar("topk", topk, "is not at least 1");
  std::uint64_t const width =
      Expand ? expanded_width(static_cast<std::uint64_t>(topk), K, true)
             : static_cast<std::uint64_t>(topk);
  if (width > 0x7FFFFFFF) chk.fail_scalar("topk", topk, "times kpool is too wide a token row");
  chk.extent_is(out_name, 1, out.extent(1), width, Expand ? "topk * K + K - 1" : "topk");
  check_shard_exchange(chk, cache, topk, rows, exchange);
  if (Expand) {
    if (batch.is_decode())
      chk.extent_is(out_name, 0, rows, batch.size() * batch.next_n(),
                    "B * next_n of the decode batch");
    chk.num_requests_within(batch.num_requests, batch.size());
  }
  if (rows == 0) return;
  ShardMergeFunctor<ExecutionSpace, Key, Expand> f;
  if constexpr (Expand) {
    ShardRowPositions<ExecutionSpace> p;
    p.num_requests = batch.num_requests;
    p.out = exchange.row_positions();
    if (batch.is_decode()) {
      p.positions = batch.positions;
      p.next_n = static_cast<int>(batch.next_n());
    } else {
      p.ragged.row_offsets = batch.row_offsets;
      p.ragged.cache_lengths = batch.cache_lengths;
      p.ragged.num_requests = batch.num_requests;
      p.ragged.kpool = K;
      p.ragged.total_rows = rows;
      p.ragged.max_visible = 1;
      p.ragged.row_begin = 0;
      p.ragged.row_end = rows;
    }
    launch_range(space, chk.entry_point() + "::shard_row_positions", rows, p);
    f.row_positions = exchange.row_positions();
  }
  f.recv = exchange.recv().data();
  f.payload = shard_payload<Key>(rows, topk);
  f.counts = exchange.merge_counts();
  f.out = View2<std::int32_t, MemorySpace>(out);
  f.out_columns = static_cast<int>(out.extent(1));
  f.kpool = K;
  f.ranks = cache.cache.shard().ranks;
  f.interleave = cache.cache.shard().interleave;
  f.topk = topk;
  LaunchShape shape;
  shape.league = league_for(chk, out_name, rows, 1);
  shape.team_size = power_of_two_floor(team_size_for(space, f, 1, options.team_size));
  launch(space, chk.entry_point() + "::shard_merge", shape, f);
}

}  // namespace Details

/// The merge of a sharded selection (docs/ranks.md): from every rank's
/// payload in exchange.recv() (rank r's at r * payload_bytes(rows, topk)),
/// the global top-k of each live row into pool_ids [rows, topk], ids of
/// the sequence ascending, -1 after them: higher key first, ties to the
/// lower pool id. One launch, a team a row; rows no request owns are left
/// as they are.
template <class ExecutionSpace, class C, class MemorySpace, class PoolIdsView, class T>
void shard_select_merge(ExecutionSpace const& space, int topk,
                        PagedCache<C, MemorySpace> const& cache, PoolIdsView const& pool_ids,
                        ShardWorkspace<T, MemorySpace>& exchange,
                        Options const& options = Options()) {
  KPOOL_IMPL_CHECK_OUTPUT_VIEW(PoolIdsView, std::int32_t, 2, ExecutionSpace, "pool_ids");
  Details::shard_merge_call<false>(Details::Entry("KPool::shard_select_merge"), space, cache,
                                   topk, Batch<MemorySpace>(), "pool_ids", pool_ids, exchange,
                                   options);
}

/// The same merge written as select_tokens' rows (docs/ranks.md): each
/// row's selected pools as token positions, then the always-selected tail
/// ([rows, topk * K + K - 1], as select_tokens writes them), from the
/// batch's positions. Two launches (the rows' positions, the merge).
/// @param batch the call's batch (ragged or decode), as the local step's.
template <class ExecutionSpace, class C, class MemorySpace, class TokensView, class T>
void shard_select_merge_tokens(ExecutionSpace const& space, int topk,
                               Batch<MemorySpace> const& batch,
                               PagedCache<C, MemorySpace> const& cache, TokensView const& tokens,
                               ShardWorkspace<T, MemorySpace>& exchange,
                               Options const& options = Options()) {
  KPOOL_IMPL_CHECK_OUTPUT_VIEW(TokensView, std::int32_t, 2, ExecutionSpace, "tokens");
  Details::shard_merge_call<true>(Details::Entry("KPool::shard_select_merge_tokens"), space,
                                  cache, topk, batch, "tokens", tokens, exchange, options);
}

namespace Details {

// The Communicator forms: the local step (its errors caught), the ranks'
// agreement, the exchange, the merge into pool ids or token rows.
template <bool Expand, class ExecutionSpace, class C, class MemorySpace, class QView,
          class WeightsView, class OutView, class T>
void shard_call(std::string const& entry, ExecutionSpace const& space,
                PagedCache<C, MemorySpace> const& cache, QView const& q,
                WeightsView const& weights, int topk, Batch<MemorySpace> const& batch,
                char const* out_name, OutView const& out,
                SelectWorkspace<T, MemorySpace>& workspace,
                ShardWorkspace<T, MemorySpace>& exchange, Communicator<ExecutionSpace>& comm,
                Options const& options) {
  using Key = typename ShardWorkspace<T, MemorySpace>::key_type;
  Entry const chk(entry);  // the call's profiling region, and its errors' name
  Shard const& s = cache.cache.shard();
  ShardHeader mine;
  mine.rank = s.rank;
  mine.ranks = s.ranks;
  mine.interleave = s.interleave;
  mine.topk = topk;
  mine.key_bytes = static_cast<std::int32_t>(sizeof(Key));
  mine.rows = static_cast<std::int64_t>(q.extent(0));
  try {
    int const K = cache.cache.kpool();
    chk.extent_is(out_name, 0, out.extent(0), q.extent(0), "the rows of q");
    if (topk >= 1)
      chk.extent_is(out_name, 1, out.extent(1),
                    Expand ? expanded_width(static_cast<std::uint64_t>(topk), K, true)
                           : static_cast<std::uint64_t>(topk),
                    Expand ? "topk * K + K - 1" : "topk");
    if (s.ranks != comm.size() || s.rank != comm.rank())
      chk.fail("cache", "shard", -1, shard_name(s),
               "does not match the communicator's rank " + std::to_string(comm.rank()) +
                   " of " + std::to_string(comm.size()));
    shard_local_call(chk, space, cache, q, weights, topk, batch, workspace, exchange, options);
  } catch (InvalidArgument const& e) {
    mine.failed = 1;
    mine.row = e.row();
    put_text(mine.entry, e.entry_point());
    put_text(mine.argument, e.argument());
    put_text(mine.where, e.where());
    put_text(mine.value, e.value());
    put_text(mine.problem, e.problem());
  }
  agree_on_shards(comm, mine, entry);
  std::size_t const bytes = ShardWorkspace<T, MemorySpace>::payload_bytes(q.extent(0), topk);
  comm.all_gather(space, exchange.send().data(), exchange.recv().data(), bytes);
  shard_merge_call<Expand>(chk, space, cache, topk, batch, out_name, out, exchange, options);
}

}  // namespace Details

/// score_select over a cache sharded across the ranks of `comm`
/// (docs/ranks.md): the same pool_ids, bit for bit, as score_select over
/// the whole cache on one rank. Every rank of the group calls it with the
/// same batch, q, weights and topk, and its own shard of the cache. First
/// the ranks exchange a small header (Communicator::all_gather_host): an
/// error on any rank (its checks, a shard or call that does not match the
/// group's) is then thrown on every rank, the same KPool::InvalidArgument,
/// naming the rank, with nothing written and no rank left waiting. Then
/// shard_select_local, Communicator::all_gather of the payloads and
/// shard_select_merge, on `space`.
/// @param exchange built for q's rows, topk and comm.size() ranks.
/// @param comm the group; comm.rank() must be the cache's shard rank.
template <class ExecutionSpace, class QView, class WeightsView, class C, class MemorySpace,
          class PoolIdsView, class T>
void score_select(ExecutionSpace const& space, QView const& q, WeightsView const& weights,
                  int topk, Batch<MemorySpace> const& batch,
                  PagedCache<C, MemorySpace> const& cache, PoolIdsView const& pool_ids,
                  SelectWorkspace<T, MemorySpace>& workspace,
                  ShardWorkspace<T, MemorySpace>& exchange,
                  Communicator<ExecutionSpace>& comm, Options const& options = Options()) {
  KPOOL_IMPL_CHECK_OUTPUT_VIEW(PoolIdsView, std::int32_t, 2, ExecutionSpace, "pool_ids");
  Details::shard_call<false>("KPool::score_select", space, cache, q, weights, topk, batch,
                             "pool_ids", pool_ids, workspace, exchange, comm, options);
}

/// select_tokens over a cache sharded across the ranks of `comm`
/// (docs/ranks.md): the same token rows, bit for bit, as select_tokens
/// over the whole cache on one rank; as the score_select form above, its
/// merge written as token positions (shard_select_merge_tokens).
/// @param tokens [T, topk * K + K - 1] int32, written for the live rows.
template <class ExecutionSpace, class QView, class WeightsView, class C, class MemorySpace,
          class TokensView, class T>
void select_tokens(ExecutionSpace const& space, QView const& q, WeightsView const& weights,
                   int topk, Batch<MemorySpace> const& batch,
                   PagedCache<C, MemorySpace> const& cache, TokensView const& tokens,
                   SelectWorkspace<T, MemorySpace>& workspace,
                   ShardWorkspace<T, MemorySpace>& exchange,
                   Communicator<ExecutionSpace>& comm, Options const& options = Options()) {
  KPOOL_IMPL_CHECK_OUTPUT_VIEW(TokensView, std::int32_t, 2, ExecutionSpace, "tokens");
  Details::shard_call<true>("KPool::select_tokens", space, cache, q, weights, topk, batch,
                            "tokens", tokens, workspace, exchange, comm, options);
}

}  // namespace KPool

#endif
