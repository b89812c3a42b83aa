#ifndef KPOOL_POOL_STEP_OUTPUT_HPP
#define KPOOL_POOL_STEP_OUTPUT_HPP

#include <common/KPool_Exceptions.hpp>
#include <common/KPool_Types.hpp>
#include <common/detail/KPool_KokkosExt.hpp>

#include <cstdint>
#include <string>
#include <utility>

namespace KPool {

/// What StepOutput::to_host copies besides the count and the offsets.
enum class StepOutputParts {
  /// batch_row and pool_id of rows [0, count).
  ids,
  /// batch_row, pool_id and the pooled keys of rows [0, count) (count * D
  /// values: the large part).
  ids_and_pooled
};

/// A host copy of the last call's part of a StepOutput (StepOutput::to_host):
/// plain host views, sized for that call.
/// @tparam T the storage type of the pooled keys.
template <class T>
struct HostStepOutput {
  /// How many pools the call closed.
  std::uint32_t count = 0;
  /// [B + 1]: request r's rows are [offsets(r), offsets(r + 1)).
  Kokkos::View<std::uint32_t*, Kokkos::HostSpace> offsets;
  /// [count]: the request index of each row.
  Kokkos::View<std::int32_t*, Kokkos::HostSpace> batch_row;
  /// [count]: each row's pool id j (positions [jK, jK + K)).
  Kokkos::View<std::int32_t*, Kokkos::HostSpace> pool_id;
  /// [count, D] with StepOutputParts::ids_and_pooled, else empty.
  Kokkos::View<T**, Kokkos::LayoutRight, Kokkos::HostSpace> pooled;
  /// @return B, the batch size of the call.
  int batch_size() const { return static_cast<int>(offsets.extent(0)) - 1; }
};

/// Every pool a step closed, compacted on the device (docs/writers.md,
/// "Reading a StepOutput"). Allocate once, at the largest call you will
/// make, and reuse: the steps allocate nothing. One StepOutput serves both
/// KPool::step and KPool::decode_step.
///
/// After a step with batch size B: rows [0, count) hold the pools; request
/// r's are rows [offsets(r), offsets(r + 1)), in pool order (for step, its
/// ring_close pool first); batch_row(i) is the request index r of row i
/// (the batch row of that call, not the slot); pool_id(i) the pool's id j,
/// covering positions [jK, jK + K) of its sequence. count is offsets(B), on
/// the device: nothing waits for the host. To read it on the host, to_host()
/// copies the count, the offsets and the rows in one call (or deep_copy a
/// view to a host mirror; either waits for the step). Each call
/// overwrites rows [0, count), offsets [0, B] and the count; later rows
/// keep earlier calls' values.
///
/// @tparam T the storage type of the pooled keys (that of the ring).
/// @tparam MemorySpace where the output lives: the memory space of the
/// execution space the steps run on.
template <class T, class MemorySpace =
                       Kokkos::DefaultExecutionSpace::memory_space>
class StepOutput {
 public:
  /// The pooled keys' view, [capacity, D], LayoutRight.
  using pooled_type = Kokkos::View<T**, Kokkos::LayoutRight, MemorySpace>;
  /// batch_row() and pool_id(): [capacity], int32.
  using index_type = Kokkos::View<std::int32_t*, MemorySpace>;
  /// offsets(): [max_batch + 1], uint32.
  using offsets_type = Kokkos::View<std::uint32_t*, MemorySpace>;
  /// count(): a rank-0 view into offsets().
  using count_type = Kokkos::Subview<offsets_type, std::size_t>;

  /// Rows a call can need, known without reading device data:
  /// floor(total_tokens / K) + batch. A call's pools are either made of its
  /// own rows only (at most floor(total_tokens / K) of them) or a
  /// request's ring_close pool (at most one per request).
  ///
  /// For KPool::step, pass the most token rows a call carries
  /// (key.extent(0)); a call needs floor(key rows / K) + num_requests rows.
  /// For KPool::decode_step, pass B * next_n (the entries of positions,
  /// padding included); a call needs num_requests * ceil(next_n / K) rows,
  /// never more than this. One StepOutput serves both kinds when sized for
  /// the larger.
  /// @param total_tokens the most token rows (or decode entries) of a call.
  /// @param batch the largest batch size B.
  /// @param kpool K, tokens per pool.
  /// @return the row capacity to construct the StepOutput with.
  static std::size_t capacity_for(std::size_t total_tokens, int batch,
                                  int kpool) {
    return total_tokens / static_cast<std::size_t>(kpool) +
           static_cast<std::size_t>(batch);
  }

  /// An empty output, to assign a constructed one to later; the steps
  /// reject it.
  StepOutput() = default;

  /// Allocates the output on `space` (labelled "KPool::StepOutput::pooled",
  /// "::batch_row", "::pool_id", "::offsets"); offsets is zero-filled, the
  /// rest left uninitialized.
  /// @tparam ExecutionSpace a Kokkos execution space whose memory space is
  /// MemorySpace.
  /// @param space the instance the allocations are queued on.
  /// @param capacity rows of pooled keys, e.g. capacity_for(...).
  /// @param max_batch the largest batch size B of a call.
  /// @param head_dim D, channels of a key.
  template <class ExecutionSpace>
  StepOutput(ExecutionSpace const& space, std::size_t capacity, int max_batch,
             int head_dim)
      : pooled_(Kokkos::view_alloc(space, Kokkos::WithoutInitializing,
                                   "KPool::StepOutput::pooled"),
                capacity, head_dim),
        batch_row_(Kokkos::view_alloc(space, Kokkos::WithoutInitializing,
                                      "KPool::StepOutput::batch_row"),
                   capacity),
        pool_id_(Kokkos::view_alloc(space, Kokkos::WithoutInitializing,
                                    "KPool::StepOutput::pool_id"),
                 capacity),
        offsets_(Kokkos::view_alloc(space, "KPool::StepOutput::offsets"),
                 static_cast<std::size_t>(max_batch) + 1),
        count_(Kokkos::subview(offsets_, std::size_t(0))) {}

  /// A step output over a caller's buffers (an engine's own allocation,
  /// e.g. unmanaged Views over its tensors): `pooled` [capacity, D],
  /// `batch_row` and `pool_id` [capacity], `offsets` [max_batch + 1], in
  /// MemorySpace. Nothing is allocated or filled: the steps write them in
  /// place, as the allocating constructor's. Until a step writes it, the
  /// output reads as holding a call of max_batch rows (batch_size(),
  /// count() = offsets(max_batch)): buffers a step filled, wrapped again
  /// with offsets [B + 1] for that step's B, read as what it wrote
  /// (store_pools, to_host).
  /// @param pooled the pools, [capacity, D].
  /// @param batch_row each pool's batch row, [capacity].
  /// @param pool_id each pool's id, [capacity].
  /// @param offsets each batch row's first pool, then the count, [max_batch + 1].
  /// @throws KPool::InvalidArgument (entry point "KPool::StepOutput") when
  /// capacity, D or max_batch is below 1, or batch_row or pool_id is not
  /// [capacity].
  StepOutput(pooled_type const& pooled, index_type const& batch_row,
             index_type const& pool_id, offsets_type const& offsets)
      : pooled_(pooled), batch_row_(batch_row), pool_id_(pool_id), offsets_(offsets) {
    auto const fail = [](char const* arg, std::string const& value,
                         std::string const& problem) {
      throw InvalidArgument("KPool::StepOutput", arg, "", -1, value, problem);
    };
    if (pooled.extent(0) < 1 || pooled.extent(1) < 1)
      fail("pooled", std::to_string(pooled.extent(0)) + " x " + std::to_string(pooled.extent(1)),
           "is empty: [capacity, D], each at least 1");
    if (pooled.extent(1) > 0x7FFFFFFF)
      fail("pooled", std::to_string(pooled.extent(1)), "is extent 1, D, above 2^31 - 1");
    if (batch_row.extent(0) != pooled.extent(0))
      fail("batch_row", std::to_string(batch_row.extent(0)),
           "is extent 0, not pooled's capacity = " + std::to_string(pooled.extent(0)));
    if (pool_id.extent(0) != pooled.extent(0))
      fail("pool_id", std::to_string(pool_id.extent(0)),
           "is extent 0, not pooled's capacity = " + std::to_string(pooled.extent(0)));
    if (offsets.extent(0) < 2 || offsets.extent(0) > 0x7FFFFFFF)
      fail("offsets", std::to_string(offsets.extent(0)),
           "is extent 0, not max_batch + 1 for a max_batch from 1 to 2^31 - 2");
    batch_ = static_cast<int>(offsets.extent(0)) - 1;
    count_ = Kokkos::subview(offsets_, offsets.extent(0) - 1);
  }

  /// The pooled keys, in the storage type.
  /// @return [capacity, D]; rows [0, count) belong to the last call.
  pooled_type const& pooled() const { return pooled_; }
  /// The request each pool came from.
  /// @return [capacity]: batch_row()(i) is the request index r (the batch
  /// row of the last call) of row i.
  index_type const& batch_row() const { return batch_row_; }
  /// Each pool's id in its sequence.
  /// @return [capacity]: pool j covers positions [jK, jK + K).
  index_type const& pool_id() const { return pool_id_; }
  /// Where each request's pools start.
  /// @return [max_batch + 1]; entries [0, B] belong to the last call, whose
  /// request r has rows [offsets(r), offsets(r + 1)).
  offsets_type const& offsets() const { return offsets_; }
  /// How many pools the last call closed, on the device: offsets(B).
  /// @return a rank-0 view; read it with Kokkos::deep_copy(host_value, count()).
  count_type const& count() const { return count_; }

  /// @return the rows of pooled().
  std::size_t capacity() const { return pooled_.extent(0); }
  /// @return the largest batch a call may have; -1 for an empty output.
  int max_batch() const { return static_cast<int>(offsets_.extent(0)) - 1; }
  /// @return D, channels of a key.
  int head_dim() const { return static_cast<int>(pooled_.extent(1)); }
  /// @return B of the last call (0 before the first).
  int batch_size() const { return batch_; }

  /// The last call's results on the host, in one call: the count, the
  /// offsets [0, B] and rows [0, count) of batch_row and pool_id, and with
  /// StepOutputParts::ids_and_pooled the pooled keys too. Queues the copies
  /// on `space` after the step and waits for them (two fences: the count
  /// sizes the rest). Allocates the host views (labelled
  /// "KPool::StepOutput::host_*"): for reading results, not for the hot
  /// path of a serving loop.
  /// @param space the instance the step ran on.
  /// @param parts what to copy besides the count and the offsets.
  /// @return a HostStepOutput of the last call (count 0 before the first).
  template <class ExecutionSpace>
  HostStepOutput<T> to_host(ExecutionSpace const& space,
                            StepOutputParts parts = StepOutputParts::ids) const {
    using Kokkos::HostSpace;
    HostStepOutput<T> h;
    std::size_t const B = static_cast<std::size_t>(batch_);
    if (offsets_.extent(0) == 0) return h;
    h.offsets = Kokkos::View<std::uint32_t*, HostSpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing,
                           "KPool::StepOutput::host_offsets"),
        B + 1);
    Kokkos::deep_copy(space, h.offsets,
                      Kokkos::subview(offsets_, std::make_pair(std::size_t(0), B + 1)));
    space.fence();
    // A count past the capacity (only after a step whose bad data went
    // unchecked) reads what exists.
    std::size_t const n = std::min<std::size_t>(h.offsets(B), capacity());
    h.count = static_cast<std::uint32_t>(n);
    auto const rows = std::make_pair(std::size_t(0), n);
    h.batch_row = Kokkos::View<std::int32_t*, HostSpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing,
                           "KPool::StepOutput::host_batch_row"),
        n);
    h.pool_id = Kokkos::View<std::int32_t*, HostSpace>(
        Kokkos::view_alloc(Kokkos::WithoutInitializing,
                           "KPool::StepOutput::host_pool_id"),
        n);
    Kokkos::deep_copy(space, h.batch_row, Kokkos::subview(batch_row_, rows));
    Kokkos::deep_copy(space, h.pool_id, Kokkos::subview(pool_id_, rows));
    if (parts == StepOutputParts::ids_and_pooled) {
      h.pooled = Kokkos::View<T**, Kokkos::LayoutRight, HostSpace>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing,
                             "KPool::StepOutput::host_pooled"),
          n, pooled_.extent(1));
      Kokkos::deep_copy(space, h.pooled,
                        Kokkos::subview(pooled_, rows, Kokkos::ALL));
    }
    space.fence();
    return h;
  }

  /// Used by the steps (not by callers): points count() at offsets(batch)
  /// for a call of `batch` rows.
  /// @param batch the call's batch size B.
  /// @return the call's offsets, [0, B].
  offsets_type begin_call(int batch) {
    batch_ = batch;
    count_ = Kokkos::subview(offsets_, static_cast<std::size_t>(batch));
    return Kokkos::subview(
        offsets_, std::make_pair(std::size_t(0), static_cast<std::size_t>(batch) + 1));
  }

 private:
  pooled_type pooled_;
  index_type batch_row_;
  index_type pool_id_;
  offsets_type offsets_;
  count_type count_;
  int batch_ = 0;
};
}  // namespace KPool

#endif
