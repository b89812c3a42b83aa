#ifndef KPOOL_DETAILS_OFFSETS_FUNCTOR_HPP
#define KPOOL_DETAILS_OFFSETS_FUNCTOR_HPP

// Exclusive prefix sums of pools per request, on the device, with no host
// synchronization: scanning B + 1 entries leaves the total in the last.

#include <details/KPool_DetailsBatch.hpp>
#include <details/KPool_DetailsRequest.hpp>

#include <cstdint>

namespace KPool {
namespace Details {

// Ragged batches. compress counts its own pools; a step (StepMode) counts
// the ring_close pool too.
template <class MemorySpace, bool StepMode>
struct RaggedOffsetsFunctor {
  using value_type = std::uint32_t;
  RaggedBatch<MemorySpace> batch;
  View1<std::uint32_t, MemorySpace> offsets;

  KOKKOS_INLINE_FUNCTION void operator()(int r, value_type& update,
                                         bool final) const {
    value_type count = 0;
    if (r < batch.num_requests) {
      Request const q = batch.request(r);
      count = static_cast<value_type>(q.full()) +
              ((StepMode && q.closes()) ? 1u : 0u);
    }
    if (final) offsets(r) = update;
    update += count;
  }
};

// Decode rows: one pool per real position that ends a pool.
template <class MemorySpace>
struct DecodeOffsetsFunctor {
  using value_type = std::uint32_t;
  View2<const std::int32_t, MemorySpace> positions;
  View1<const std::uint32_t, MemorySpace> slot_idx;
  View1<std::uint32_t, MemorySpace> offsets;
  int num_requests;
  int kpool;
  int max_slots;

  KOKKOS_INLINE_FUNCTION void operator()(int r, value_type& update,
                                         bool final) const {
    value_type count = 0;
    if (r < num_requests && slot_idx(r) < static_cast<std::uint32_t>(max_slots)) {
      for (int i = 0; i < static_cast<int>(positions.extent(1)); ++i)
        count += closes_pool(positions(r, i), kpool) ? 1u : 0u;
    }
    if (final) offsets(r) = update;
    update += count;
  }
};

}  // namespace Details
}  // namespace KPool

#endif
