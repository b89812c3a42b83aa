#ifndef KPOOL_RING_HPP
#define KPOOL_RING_HPP

#include <KPool_Exceptions.hpp>
#include <KPool_Types.hpp>
#include <details/KPool_DetailsKokkosExt.hpp>

#include <string>

namespace KPool {

/// The per-sequence ring of pending pool members, one per layer
/// (docs/ring.md): tail(slot, 0, i, c) keys, tail(slot, 1, i, c) gate
/// scores, the token at position pos of the sequence in `slot` at ring
/// index i = pos % R. Here the ring length R is K. Batch rows address it
/// through slot_idx; a sequence keeps its slot for life, and a new
/// sequence may take a finished one's slot without clearing it.
///
/// KPool::step and KPool::decode_step take the ring itself; the individual
/// writers take its view, tail().
///
/// @tparam T the storage type (float, double, bfloat16, float16), that of
/// the keys and gates the steps take.
/// @tparam MemorySpace where the ring lives: the memory space of the
/// execution space the steps run on.
template <class T, class MemorySpace =
                       Kokkos::DefaultExecutionSpace::memory_space>
class Ring {
  static_assert(is_storage_type<T>::value,
                "KPool::Ring holds float, double, KPool::bfloat16 or "
                "KPool::float16");

 public:
  /// The storage type T.
  using value_type = T;
  /// The memory space the ring lives in.
  using memory_space = MemorySpace;
  /// The ring's view: [max_slots, 2, R, D], LayoutRight.
  using tail_type = Kokkos::View<T****, Kokkos::LayoutRight, MemorySpace>;

  /// An empty ring, to assign a constructed one to later.
  Ring() = default;

  /// Allocates [max_slots, 2, kpool, head_dim] (R = kpool), zero-filled on
  /// `space`, asynchronously like any work queued there; the allocation is
  /// labelled "KPool::Ring::tail". max_slots * 2 * R * head_dim *
  /// sizeof(T) bytes.
  /// @tparam ExecutionSpace a Kokkos execution space whose memory space is
  /// MemorySpace.
  /// @param space the instance the zero fill is queued on.
  /// @param max_slots sequences the ring can hold at once (>= 1).
  /// @param kpool K, tokens per pool (>= 1).
  /// @param head_dim D, channels of a key (>= 1).
  /// @throws KPool::InvalidArgument when an argument is below 1.
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

  /// The raw view, for the individual writers (ring_close, seed_tail,
  /// tail_update) and for inspection.
  /// @return [max_slots, 2, R, D].
  tail_type const& tail() const { return tail_; }
  /// @return the slots, extent 0 of tail().
  int max_slots() const { return static_cast<int>(tail_.extent(0)); }
  /// @return K, tokens per pool (extent 2 of tail() while R = K).
  int kpool() const { return static_cast<int>(tail_.extent(2)); }
  /// @return D, channels of a key.
  int head_dim() const { return static_cast<int>(tail_.extent(3)); }

 private:
  tail_type tail_;
};

}  // namespace KPool

#endif
