#ifndef KPOOL_RING_HPP
#define KPOOL_RING_HPP

#include <KPool_Exceptions.hpp>
#include <KPool_Types.hpp>
#include <details/KPool_DetailsKokkosExt.hpp>

#include <string>

namespace KPool {

/// The per-sequence ring of pending pool members (SEMANTICS.md, "The
/// ring"): tail(slot, 0, m, c) keys, tail(slot, 1, m, c) gate scores, the
/// token at position pos stored at ring index pos % K. Batch rows address
/// it through slot_idx; a sequence keeps its slot for life.
template <class T, class MemorySpace =
                       Kokkos::DefaultExecutionSpace::memory_space>
class Ring {
  static_assert(is_storage_type<T>::value,
                "KPool::Ring holds float, double, KPool::bfloat16 or "
                "KPool::float16");

 public:
  using value_type = T;
  using memory_space = MemorySpace;
  using tail_type = Kokkos::View<T****, Kokkos::LayoutRight, MemorySpace>;

  Ring() = default;

  /// Allocates [max_slots, 2, kpool, head_dim], zero-filled on `space`
  /// (asynchronously, like any work queued there).
  template <class ExecutionSpace>
  Ring(ExecutionSpace const& space, int max_slots, int kpool, int head_dim) {
    if (max_slots < 1 || kpool < 1 || head_dim < 1)
      throw InvalidArgument(
          "KPool::Ring", max_slots < 1 ? "max_slots" : kpool < 1 ? "kpool" : "head_dim", "", -1,
          std::to_string(max_slots < 1 ? max_slots : kpool < 1 ? kpool : head_dim),
          "must be at least 1");
    tail_ = tail_type(Kokkos::view_alloc(space, "KPool::Ring::tail"),
                      max_slots, 2, kpool, head_dim);
  }

  tail_type const& tail() const { return tail_; }
  int max_slots() const { return static_cast<int>(tail_.extent(0)); }
  int kpool() const { return static_cast<int>(tail_.extent(2)); }
  int head_dim() const { return static_cast<int>(tail_.extent(3)); }

 private:
  tail_type tail_;
};

}  // namespace KPool

#endif
