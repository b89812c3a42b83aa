#ifndef KPOOL_RANKS_COMMUNICATOR_HPP
#define KPOOL_RANKS_COMMUNICATOR_HPP

/// @file
/// KPool::Communicator: the one collective a sharded selection needs
/// (docs/ranks.md), an all-gather, so that an engine can plug in MPI
/// (KPool::MpiCommunicator, target KPool::mpi), NCCL or its own process
/// group. KPool's core never needs a communication library.

#include <common/detail/KPool_KokkosExt.hpp>

#include <cstddef>
#include <cstring>

namespace KPool {

/// The ranks a sharded pool cache is spread over, as an all-gather.
/// Every rank of the group calls each operation the same number of times,
/// in the same order, with the same `bytes`.
/// @tparam ExecutionSpace the execution space whose instance orders the
/// device operation.
template <class ExecutionSpace>
class Communicator {
 public:
  virtual ~Communicator() = default;
  /// This rank, in [0, size()).
  virtual int rank() const = 0;
  /// The ranks of the group.
  virtual int size() const = 0;
  /// Host memory, blocking: every rank's `bytes` bytes of `send`, in rank
  /// order, into `recv` (size() * bytes). KPool exchanges a small fixed
  /// header this way before each sharded selection, so that an error on
  /// one rank is thrown on every rank and no rank is left waiting.
  virtual void all_gather_host(void const* send, void* recv, std::size_t bytes) = 0;
  /// Memory of ExecutionSpace's memory space: the same, ordered after the
  /// work queued on `space` before the call, and before the work queued on
  /// it after the call returns (an implementation may fence `space`, or
  /// queue the collective on its stream, as NCCL does).
  virtual void all_gather(ExecutionSpace const& space, void const* send, void* recv,
                          std::size_t bytes) = 0;
};

/// A group of one rank (an unsharded cache through the sharded entry
/// points; tests). Copies, on the host, with no synchronization.
template <class ExecutionSpace>
class SelfCommunicator : public Communicator<ExecutionSpace> {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_gather_host(void const* send, void* recv, std::size_t bytes) override {
    if (bytes > 0 && send != recv) std::memmove(recv, send, bytes);
  }
  void all_gather(ExecutionSpace const& space, void const* send, void* recv,
                  std::size_t bytes) override {
    using M = typename ExecutionSpace::memory_space;
    using Bytes = Kokkos::View<unsigned char*, M, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    if (bytes == 0 || send == recv) return;
    Kokkos::deep_copy(space, Bytes(static_cast<unsigned char*>(recv), bytes),
                      Bytes(static_cast<unsigned char*>(const_cast<void*>(send)), bytes));
  }
};

}  // namespace KPool

#endif
