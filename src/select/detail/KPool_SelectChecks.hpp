#ifndef KPOOL_SELECT_DETAIL_SELECT_CHECKS_HPP
#define KPOOL_SELECT_DETAIL_SELECT_CHECKS_HPP

// The checks of score_select and select_tokens (KPool_SelectCall.hpp):
// the shapes (always), and the data rules of a ragged and of a decode
// batch (under Options::validate), each naming the argument, the row and
// the value before anything is written.

#include <cache/KPool_PagedCache.hpp>
#include <common/KPool_Batch.hpp>
#include <common/KPool_Float8.hpp>
#include <common/KPool_Options.hpp>
#include <common/KPool_Types.hpp>
#include <common/detail/KPool_CacheFunctors.hpp>
#include <common/detail/KPool_Launch.hpp>
#include <common/detail/KPool_Validate.hpp>
#include <common/detail/KPool_Views.hpp>
#include <score/KPool_ScoreEngines.hpp>
#include <common/detail/KPool_Scoring.hpp>
#include <select/detail/KPool_ExpandTopkFunctor.hpp>

#include <cstdint>
#include <string>
#include <type_traits>

namespace KPool {
namespace Details {

// A request whose rows see `visible` pools: within the workspace's
// max_visible (else named by `argument` and `value`, `what` leading the
// words), and every block they live in assigned and below num_blocks.
// On a shard, its own pools of those count against max_visible.
inline void check_visible_pools(Checker const& chk, HostBlockTable const& table,
                                std::int64_t row, char const* argument, std::int64_t value,
                                std::string const& what, std::uint64_t visible,
                                std::size_t max_visible, int num_blocks, int block_pools,
                                Shard const& shard) {
  std::uint64_t const held = shard.local_count(visible);
  if (held > max_visible)
    chk.fail_row(argument, row, value,
                 what + " makes " + std::to_string(visible) + " visible pools" +
                     (shard.sharded() ? ", " + std::to_string(held) + " of them on " +
                                            shard_name(shard) + ", "
                                      : ", ") +
                     "more than the workspace's max_visible = " + std::to_string(max_visible));
  check_pool_blocks(chk, table, row, 0, static_cast<std::int64_t>(visible), num_blocks,
                    block_pools, "visible", shard);
}

// The data rules (docs/indexer.md, "Bad input"): the ragged batch's own rules,
// then per live request with rows: its visible pools fit the workspace's
// rows, and every block they live in is assigned and below num_blocks.
template <class ExecutionSpace, class Offsets, class Lengths, class Table>
void check_select_batch(Checker const& chk, ExecutionSpace const& space,
                        Offsets const& row_offsets, Lengths const& cache_lengths,
                        Table const& block_table, int num_requests,
                        std::size_t rows, int kpool, int num_blocks,
                        int block_pools, std::size_t max_visible, Shard const& shard) {
  HostBatch const hb = check_ragged_batch(
      chk, space, row_offsets, cache_lengths,
      static_cast<Offsets const*>(nullptr), num_requests, rows, kpool, 0, "q");
  std::size_t const n = static_cast<std::size_t>(num_requests);
  HostBlockTable const table = host_block_table(space, block_table, n);
  for (std::size_t r = 0; r < n; ++r) {
    std::uint64_t const count = hb.row_offsets[r + 1] - hb.row_offsets[r];
    if (count == 0) continue;
    std::uint64_t const c = hb.cache_lengths[r];
    std::uint64_t const visible = (c + count) / static_cast<std::uint64_t>(kpool);
    auto const row = static_cast<std::int64_t>(r);
    check_visible_pools(chk, table, row, "cache_lengths", static_cast<std::int64_t>(c),
                        "plus the request's " + std::to_string(count) + " query rows",
                        visible, max_visible, num_blocks, block_pools, shard);
  }
}

// Without validation, the workspace holds every pool a row can see, by
// the sizes alone (free): the pools a row of the block table addresses,
// its columns times the cache's block_pools (on a shard its own pools: a
// rank's table holds only them); the kernels see no pool past the table.
// A row that saw more than max_visible would be cut short, and whether one
// does is in the index data, which validation reads (check_visible_pools,
// the exact count) and this does not.
template <class Cache, class Table, class Workspace>
void check_workspace_holds_table(Checker const& chk, Cache const& cache, Table const& block_table,
                                 Workspace const& workspace) {
  std::uint64_t const addressed = static_cast<std::uint64_t>(block_table.extent(1)) *
                                  static_cast<std::uint64_t>(cache.block_pools());
  if (addressed > workspace.max_visible())
    chk.fail("workspace", "max_visible", -1, std::to_string(workspace.max_visible()),
             "is less than the " + std::to_string(addressed) +
                 " pools a row of block_table addresses (" +
                 std::to_string(block_table.extent(1)) + " blocks of " +
                 std::to_string(cache.block_pools()) +
                 " pools): a row that saw more would be cut short (size the workspace "
                 "for the block table, or pass only the columns the rows need)");
}

// The shapes of a selection call (always checked, free): the scalars, the
// cache, q, weights, the output's width, the batch and the workspace.
template <bool Expand, class T, class RowOffsetsView, class CacheLengthsView,
          class BlockTableView, class QView, class WeightsView, class Cache,
          class OutView, class Workspace>
void check_select_shapes(Checker const& chk, RowOffsetsView const& row_offsets,
                         CacheLengthsView const& cache_lengths,
                         BlockTableView const& block_table, int num_requests,
                         int kpool, QView const& q, WeightsView const& weights,
                         Cache const& cache, int topk, char const* out_name,
                         OutView const& out, Workspace const& workspace,
                         bool decode = false, bool scores = false) {
  using C = typename Cache::value_type;
  if (!scores && topk < 1) chk.fail_scalar("topk", topk, "is not at least 1");
  if (!cache.is_allocated())
    chk.fail("cache", "", -1, "an empty PoolCache",
             "has no storage (construct it with a size)");
  // K is the cache's (a retired form's own kpool must repeat it, below).
  if (cache.kpool() < 1)
    chk.fail("cache", "kpool", -1, std::to_string(cache.kpool()),
             "is not at least 1: the cache was built without its K "
             "(PoolCache(space, num_blocks, block_pools, head_dim, kpool))");
  // A cache built with its K must be read with that K: another one gives
  // other visible pools, silently.
  if (cache.kpool() != kpool)
    chk.fail_scalar("kpool", kpool,
                    "does not match the kpool of the cache = " +
                        std::to_string(cache.kpool()) +
                        " (the K it was built for)");
  if (std::is_same<C, float8_e4m3>::value && std::is_same<T, double>::value)
    chk.fail("q", "", -1, storage_name<T>(),
             "is not a storage type an fp8 cache serves (f32, bf16 or f16)");
  int const D = cache.head_dim();
  if (cache.rotated() && (D & (D - 1)) != 0)
    chk.fail("cache", "head_dim", -1, std::to_string(D),
             "is not a power of two, which a rotated cache needs");
  chk.extent_is("q", 2, q.extent(2), static_cast<std::size_t>(D),
                "the cache's head_dim");
  if (q.extent(1) < 1 || q.extent(1) > 0x7FFFFFFF)
    chk.fail("q", "extent 1", -1, std::to_string(q.extent(1)),
             "is not a usable number of heads");
  std::size_t const rows = q.extent(0);
  int const H = static_cast<int>(q.extent(1));
  chk.extent_is("weights", 0, weights.extent(0), rows, "the rows of q");
  chk.extent_is("weights", 1, weights.extent(1), static_cast<std::size_t>(H),
                "the heads of q");
  std::uint64_t const width =
      Expand ? expanded_width(static_cast<std::uint64_t>(topk), kpool, true)
             : static_cast<std::uint64_t>(topk);
  if (!scores && width > 0x7FFFFFFF)
    chk.fail_scalar("topk", topk, "times kpool is too wide a token row");
  chk.extent_is(out_name, 0, out.extent(0), rows, "the rows of q");
  if (!scores)
    chk.extent_is(out_name, 1, out.extent(1), width, Expand ? "topk * K + K - 1" : "topk");
  // A decode batch's shape is checked by its entry point (its rows are
  // its positions).
  if (!decode) chk.batch_shape(row_offsets, cache_lengths, num_requests);
  // As store_pools: a row for every live request.
  chk.extent_at_least("block_table", 0, block_table.extent(0),
                      static_cast<std::size_t>(num_requests), "rows of the live requests");
  if (!workspace.is_allocated())
    chk.fail("workspace", "", -1, "an empty SelectWorkspace",
             "has no storage (construct it with a size)");
  chk.extent_is("q", 1, static_cast<std::size_t>(H),
                static_cast<std::size_t>(workspace.num_heads()),
                "the workspace's num_heads");
  // Scores: a column for every pool a row may see.
  if (scores)
    chk.extent_at_least(out_name, 1, out.extent(1), workspace.max_visible(),
                        "pools a row may see (the workspace's max_visible)");
  chk.extent_is("q", 2, static_cast<std::size_t>(D),
                static_cast<std::size_t>(workspace.head_dim()),
                "the workspace's head_dim");
  if (rows > 0x7FFFFFFF)
    chk.fail("q", "extent 0", -1, std::to_string(rows), "is too many query rows");
}

// Validation of a decode batch's selection, whole, before any chunk runs
// (so a bad row in a later chunk writes nothing, and errors name the
// batch's own rows): a live row's first real entry (r, i) has its position
// p >= i, so that base_r = p - i is a position; its next_n rows see
// (base_r + next_n) / K pools, within the workspace's max_visible and
// int32 positions; and every block they live in is assigned and below
// num_blocks.
template <class ExecutionSpace, class M, class Table>
void check_decode_select_batch(Checker const& chk, ExecutionSpace const& space,
                               View2<const std::int32_t, M> const& positions,
                               Table const& block_table, int num_requests, int kpool,
                               int num_blocks, int block_pools, std::size_t max_visible,
                               Shard const& shard) {
  std::size_t const n = static_cast<std::size_t>(num_requests);
  std::size_t const next_n = positions.extent(1);
  if (n == 0 || next_n == 0) return;
  auto const h = host_readable(
      space, Kokkos::subview(positions, std::make_pair(std::size_t(0), n), Kokkos::ALL));
  HostBlockTable const table = host_block_table(space, block_table, n);
  for (std::size_t r = 0; r < n; ++r) {
    auto const row = static_cast<std::int64_t>(r);
    std::uint64_t base = 0;
    for (std::size_t i = 0; i < next_n; ++i) {
      std::int32_t const p = h(r, i);
      if (p < 0) continue;
      if (static_cast<std::size_t>(p) < i)
        chk.fail_row("positions", row, p,
                     "is the first real position of the row, at entry " + std::to_string(i) +
                         ": the entries before it would be positions below 0");
      base = static_cast<std::uint64_t>(p) - i;
      break;
    }
    if (base + next_n > max_sequence_length)
      chk.fail_row("positions", row, static_cast<std::int64_t>(base),
                   "is the row's first position; with its " + std::to_string(next_n) +
                       " rows it passes " + std::to_string(max_sequence_length) +
                       ", the longest sequence KPool indexes (int32 positions)");
    std::uint64_t const visible = (base + next_n) / static_cast<std::uint64_t>(kpool);
    check_visible_pools(chk, table, row, "positions", static_cast<std::int64_t>(base),
                        "is the row's first position, and with its " +
                            std::to_string(next_n) + " rows it",
                        visible, max_visible, num_blocks, block_pools, shard);
  }
}

}  // namespace Details
}  // namespace KPool

#endif  // KPOOL_SELECT_DETAIL_SELECT_CHECKS_HPP
