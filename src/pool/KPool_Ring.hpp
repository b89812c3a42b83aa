#ifndef KPOOL_POOL_RING_HPP
#define KPOOL_POOL_RING_HPP

#include <common/KPool_Exceptions.hpp>
#include <common/KPool_Types.hpp>
#include <common/detail/KPool_KokkosExt.hpp>
#include <common/detail/KPool_Request.hpp>

#include <cstdint>
#include <string>

namespace KPool {

/// The per-sequence ring of recent positions, one per layer (docs/ring.md):
/// tail(slot, 0, i, c) keys, tail(slot, 1, i, c) gate scores, the token at
/// position pos of the sequence in `slot` at ring index i = pos % R. Batch
/// rows address it through slot_idx; a sequence keeps its slot for life,
/// and a new sequence may take a finished one's slot without clearing it.
///
/// R, the ring length, is a multiple of kpool and at least kpool. R = K
/// serves plain decoding. Speculative decoding re-sends rejected drafts
/// (docs/ring.md, "Rewinds"): a call may restart a sequence at any c at or
/// below its length L provided
///
///     H - floor(c / K) * K <= R,
///
/// H being one past the highest position ever sent for that sequence, so
/// that the members of the pool pending at c are still in the ring. A
/// call may not start past what the slot holds (no gaps): c > L would
/// take the pending pool's earlier members from stale entries. A fresh or
/// reset slot holds nothing: its sequence starts at a pool boundary
/// (c % K == 0, the earlier pools from a prefix cache), or mid-pool only
/// after seed_tail has put [floor(c/K)*K, c) into the slot.
///
/// The ring keeps each slot's state on the device (state(): where the
/// positions it holds start, L and H), moved by the launches that write
/// the ring: with Options::validate, the steps, ring_close and
/// tail_update refuse a start the slot cannot serve, naming the slot, c
/// and what the slot holds, before anything is written. A call with
/// cache_length 0 (a decode row whose first real position is 0) starts a
/// new sequence in its slot; a sequence that takes a slot and starts past
/// 0 (a prefix already cached elsewhere) calls reset() first. A serving
/// engine sending the next token plus S drafts a step and re-sending from
/// the first rejected one needs R >= K + S; serving_length(K, S) gives the
/// size engines use.
///
/// The steps and the writers' ring forms take the ring itself; the
/// writers' forms that take its view, tail(), neither read nor move the
/// slots' state.
///
/// @tparam T the storage type (float, double, bfloat16, float16), that of
/// the keys and gates the steps take.
/// @tparam MemorySpace where the ring lives: the memory space of the
/// execution space the steps run on.
template <class T, class MemorySpace =
                       Kokkos::DefaultExecutionSpace::memory_space>
class Ring {
  static_assert(Details::holds_storage_type<T, Ring>());

 public:
  /// The storage type T.
  using value_type = T;
  /// The memory space the ring lives in.
  using memory_space = MemorySpace;
  /// The ring's view: [max_slots, 2, R, D], LayoutRight.
  using tail_type = Kokkos::View<T****, Kokkos::LayoutRight, MemorySpace>;
  /// The slots' state (state()): [max_slots][3] uint32, a slot's start, L
  /// and H (docs/ring.md, "What a slot holds").
  using state_type = Kokkos::View<std::uint32_t* [Details::slot_state_words],
                                  Kokkos::LayoutRight, MemorySpace>;
  /// The view of each slot's H (high()): [max_slots], uint32, a column of
  /// state().
  using high_type = Kokkos::View<std::uint32_t*, Kokkos::LayoutStride, MemorySpace>;

  /// The ring length for S draft tokens a step:
  /// K * next_pow2(ceil((K + S) / K)), the smallest power-of-two number of
  /// pools that holds a pending pool's K - 1 committed members, the next
  /// token and S drafts. S = 0 gives K.
  /// @param kpool K, tokens per pool (>= 1).
  /// @param drafts S, draft tokens sent a step besides the next token (>= 0).
  /// @return R for Ring(space, max_slots, kpool, head_dim, R).
  /// @throws KPool::InvalidArgument when kpool < 1, drafts < 0 or R would
  /// pass 2^31 - 1.
  static int serving_length(int kpool, int drafts) {
    if (kpool < 1 || drafts < 0)
      throw InvalidArgument(
          "KPool::Ring::serving_length", kpool < 1 ? "kpool" : "drafts", "", -1,
          std::to_string(kpool < 1 ? kpool : drafts),
          kpool < 1 ? "must be at least 1" : "must not be negative");
    long long const pools = (static_cast<long long>(kpool) + drafts + kpool - 1) / kpool;
    long long p2 = 1;
    while (p2 < pools) p2 *= 2;
    long long const R = p2 * kpool;
    if (R > 0x7FFFFFFF)
      throw InvalidArgument("KPool::Ring::serving_length", "drafts", "", -1,
                            std::to_string(drafts),
                            "needs a ring longer than 2^31 - 1 entries");
    return static_cast<int>(R);
  }

  /// An empty ring, to assign a constructed one to later.
  Ring() = default;

  /// Allocates [max_slots, 2, kpool, head_dim] (R = kpool), zero-filled on
  /// `space`, asynchronously like any work queued there; the allocation is
  /// labelled "KPool::Ring::tail". max_slots * 2 * R * head_dim *
  /// sizeof(T) bytes, and 12 bytes a slot for its state
  /// ("KPool::Ring::state", zero: every slot fresh).
  /// @tparam ExecutionSpace a Kokkos execution space whose memory space is
  /// MemorySpace.
  /// @param space the instance the zero fill is queued on.
  /// @param max_slots sequences the ring can hold at once (>= 1).
  /// @param kpool K, tokens per pool (>= 1).
  /// @param head_dim D, channels of a key (>= 1).
  /// @throws KPool::InvalidArgument when an argument is below 1.
  template <class ExecutionSpace>
  Ring(ExecutionSpace const& space, int max_slots, int kpool, int head_dim)
      : Ring(space, max_slots, kpool, head_dim, kpool) {}

  /// Allocates [max_slots, 2, ring_length, head_dim], zero-filled on
  /// `space` like the constructor above, for rings longer than K
  /// (speculative decoding: ring_length = serving_length(kpool, S)).
  /// @tparam ExecutionSpace a Kokkos execution space whose memory space is
  /// MemorySpace.
  /// @param space the instance the zero fill is queued on.
  /// @param max_slots sequences the ring can hold at once (>= 1).
  /// @param kpool K, tokens per pool (>= 1).
  /// @param head_dim D, channels of a key (>= 1).
  /// @param ring_length R, a multiple of kpool, at least kpool.
  /// @throws KPool::InvalidArgument when an argument is below 1 or R is not
  /// a multiple of K at least K.
  template <class ExecutionSpace>
  Ring(ExecutionSpace const& space, int max_slots, int kpool, int head_dim,
       int ring_length)
      : kpool_(kpool) {
    char const* bad = max_slots < 1 ? "max_slots"
                      : kpool < 1   ? "kpool"
                      : head_dim < 1 ? "head_dim"
                                     : nullptr;
    if (bad)
      throw InvalidArgument(
          "KPool::Ring", bad, "", -1,
          std::to_string(max_slots < 1 ? max_slots : kpool < 1 ? kpool : head_dim),
          "must be at least 1");
    if (ring_length < kpool || ring_length % kpool != 0)
      throw InvalidArgument(
          "KPool::Ring", "ring_length", "", -1, std::to_string(ring_length),
          std::string("is not a valid ring length (") +
              (ring_length < kpool ? "less than" : "not a multiple of") +
              " kpool = " + std::to_string(kpool) + ")");
    tail_ = tail_type(Kokkos::view_alloc(space, "KPool::Ring::tail"),
                      max_slots, 2, ring_length, head_dim);
    state_ = state_type(Kokkos::view_alloc(space, "KPool::Ring::state"), max_slots);
  }

  /// A ring over a caller's buffers (an engine's own allocation, e.g.
  /// unmanaged Views over its tensors): `tail` [max_slots, 2, R, D] and
  /// `state` [max_slots][3], both LayoutRight in MemorySpace. Nothing is
  /// allocated or filled: the ring reads and writes them in place, so
  /// `state` must be zero for slots that hold nothing (a fresh buffer
  /// zero-filled, or the state an earlier ring over the same buffers left).
  /// @param tail the ring entries, [max_slots, 2, R, D].
  /// @param state the slots' state, [max_slots][3] (state()).
  /// @param kpool K, tokens per pool (>= 1).
  /// @throws KPool::InvalidArgument (entry point "KPool::Ring") when kpool
  /// or an extent of tail is below 1, extent 1 of tail is not 2, R is not a
  /// multiple of K at least K, or state's extent 0 is not tail's.
  Ring(tail_type const& tail, state_type const& state, int kpool) : kpool_(kpool) {
    auto const fail = [](char const* arg, std::string const& value,
                         std::string const& problem) {
      throw InvalidArgument("KPool::Ring", arg, "", -1, value, problem);
    };
    if (kpool < 1) fail("kpool", std::to_string(kpool), "must be at least 1");
    for (int d = 0; d < 4; ++d)
      if (tail.extent(d) < 1)
        fail("tail", "extent " + std::to_string(d) + " = 0",
             "is empty: the ring is [max_slots, 2, R, D], each at least 1");
    if (tail.extent(0) > 0x7FFFFFFF || tail.extent(2) > 0x7FFFFFFF ||
        tail.extent(3) > 0x7FFFFFFF)
      fail("tail", "an extent above 2^31 - 1", "is more than a ring of int sizes holds");
    if (tail.extent(1) != 2)
      fail("tail", std::to_string(tail.extent(1)),
           "is extent 1, not 2 (a slot holds a key and a gate row per entry)");
    std::size_t const R = tail.extent(2);
    if (R < static_cast<std::size_t>(kpool) || R % static_cast<std::size_t>(kpool) != 0)
      fail("tail", std::to_string(R),
           std::string("is extent 2, R, not a valid ring length (") +
               (R < static_cast<std::size_t>(kpool) ? "less than" : "not a multiple of") +
               " kpool = " + std::to_string(kpool) + ")");
    if (state.extent(0) != tail.extent(0))
      fail("state", std::to_string(state.extent(0)),
           "is extent 0, not tail's max_slots = " + std::to_string(tail.extent(0)));
    tail_ = tail;
    state_ = state;
  }

  /// Forgets the history of one slot (it holds nothing, as a fresh one),
  /// for a sequence that takes the slot and starts at a cache_length above
  /// 0: at a pool boundary, or mid-pool after seed_tail. A sequence
  /// starting at 0 needs no reset: its first call starts the slot anew.
  /// Queued on `space`; nothing waits for the host.
  /// @param space the instance the steps run on.
  /// @param slot the slot, below max_slots().
  /// @throws KPool::InvalidArgument when slot is out of range (nothing
  /// written).
  template <class ExecutionSpace>
  void reset(ExecutionSpace const& space, int slot) {
    if (slot < 0 || slot >= max_slots())
      throw InvalidArgument("KPool::Ring::reset", "slot", "", -1,
                            std::to_string(slot),
                            "is not a slot of a ring of max_slots = " +
                                std::to_string(max_slots()));
    Kokkos::deep_copy(space,
                      Kokkos::subview(state_, static_cast<std::size_t>(slot), Kokkos::ALL),
                      std::uint32_t(0));
  }

  /// Forgets the history of every slot (each holds nothing), queued on
  /// `space`.
  /// @param space the instance the steps run on.
  template <class ExecutionSpace>
  void reset(ExecutionSpace const& space) {
    Kokkos::deep_copy(space, state_, std::uint32_t(0));
  }

  /// The raw view, for the individual writers (ring_close, seed_tail,
  /// tail_update) and for inspection.
  /// @return [max_slots, 2, R, D].
  tail_type const& tail() const { return tail_; }
  /// @return the slots, extent 0 of tail().
  int max_slots() const { return static_cast<int>(tail_.extent(0)); }
  /// @return K, tokens per pool.
  int kpool() const { return kpool_; }
  /// @return R, the positions each slot keeps (extent 2 of tail()).
  int ring_length() const { return static_cast<int>(tail_.extent(2)); }
  /// @return D, channels of a key.
  int head_dim() const { return static_cast<int>(tail_.extent(3)); }

  /// The slots' state, moved on the device by the launches that write the
  /// ring and read by validation (docs/ring.md, "What a slot holds"):
  /// state(s, 0) where the positions slot s holds start, state(s, 1) L,
  /// where its last call ended, state(s, 2) H, one past the highest
  /// position sent since its sequence started; H = 0: the slot holds
  /// nothing (fresh, or reset()).
  /// @return [max_slots][3], uint32.
  state_type const& state() const { return state_; }

  /// The view of H, one past the highest position sent to each slot since
  /// its sequence started (cache_length 0) or reset(): column 2 of state().
  /// @return [max_slots], uint32.
  high_type high() const { return Kokkos::subview(state_, Kokkos::ALL, 2); }

 private:
  tail_type tail_;
  state_type state_;
  int kpool_ = 0;
};

}  // namespace KPool

#endif
