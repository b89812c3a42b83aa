#ifndef KPOOL_MPI_MPI_COMMUNICATOR_HPP
#define KPOOL_MPI_MPI_COMMUNICATOR_HPP

/// @file
/// KPool::MpiCommunicator: the sharded selection's all-gather over an MPI
/// communicator (docs/ranks.md). Only with the KPool::mpi target
/// (KPool_ENABLE_MPI), which brings MPI; KPool::kpool never needs it.
///
/// Device buffers go straight to MPI where the MPI is GPU-aware (Open MPI
/// built with CUDA support says so at run time, MPIX_Query_cuda_support);
/// otherwise they are staged through host buffers kept by the
/// communicator (grown once to the largest exchange). Either way the
/// caller's execution space instance is fenced first: MPI does not order
/// itself after a stream.

#include <common/KPool_Exceptions.hpp>
#include <common/detail/KPool_KokkosExt.hpp>
#include <ranks/KPool_Communicator.hpp>

#include <mpi.h>
#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h>
#endif

#include <climits>
#include <stdexcept>
#include <cstddef>
#include <string>
#include <vector>

namespace KPool {

/// Whether this MPI takes device (CUDA) pointers in its collectives, as
/// the library reports at run time (false where it cannot say).
inline bool mpi_takes_device_buffers() {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

/// A Communicator over an MPI communicator (not owned: it must outlive
/// this object, and MPI be initialized).
template <class ExecutionSpace>
class MpiCommunicator : public Communicator<ExecutionSpace> {
  using M = typename ExecutionSpace::memory_space;
  static constexpr bool host_memory =
      Kokkos::SpaceAccessibility<Kokkos::HostSpace, M>::accessible;

 public:
  /// @param comm the group; its ranks are the cache's shards.
  /// @param device_buffers pass device pointers to MPI directly (default:
  /// what mpi_takes_device_buffers() says). Host memory always goes
  /// directly.
  explicit MpiCommunicator(MPI_Comm comm, bool device_buffers = mpi_takes_device_buffers())
      : comm_(comm), direct_(host_memory || device_buffers) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_gather_host(void const* send, void* recv, std::size_t bytes) override {
    gather(send, recv, bytes);
  }

  void all_gather(ExecutionSpace const& space, void const* send, void* recv,
                  std::size_t bytes) override {
    Details::KokkosExt::fence(space, "KPool::MpiCommunicator::all_gather");
    if (direct_) {
      gather(send, recv, bytes);
      return;
    }
    using Bytes = Kokkos::View<unsigned char*, M, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    using HostBytes =
        Kokkos::View<unsigned char*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    std::size_t const all = bytes * static_cast<std::size_t>(size_);
    if (host_send_.size() < bytes) host_send_.resize(bytes);
    if (host_recv_.size() < all) host_recv_.resize(all);
    Kokkos::deep_copy(space, HostBytes(host_send_.data(), bytes),
                      Bytes(static_cast<unsigned char*>(const_cast<void*>(send)), bytes));
    Details::KokkosExt::fence(space, "KPool::MpiCommunicator::all_gather: staged");
    gather(host_send_.data(), host_recv_.data(), bytes);
    Kokkos::deep_copy(space, Bytes(static_cast<unsigned char*>(recv), all),
                      HostBytes(host_recv_.data(), all));
  }

 private:
  void gather(void const* send, void* recv, std::size_t bytes) const {
    if (bytes > static_cast<std::size_t>(INT_MAX))
      throw InvalidArgument("KPool::MpiCommunicator", "bytes", "", -1, std::to_string(bytes),
                            "is more than one MPI_Allgather of bytes carries (INT_MAX)");
    int const rc = MPI_Allgather(send, static_cast<int>(bytes), MPI_BYTE, recv,
                                 static_cast<int>(bytes), MPI_BYTE, comm_);
    if (rc != MPI_SUCCESS)
      throw std::runtime_error("KPool::MpiCommunicator: MPI_Allgather failed (" +
                               std::to_string(rc) + ")");
  }

  MPI_Comm comm_;
  bool direct_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<unsigned char> host_send_, host_recv_;
};

}  // namespace KPool

#endif
