#ifndef KPOOL_OPTIONS_HPP
#define KPOOL_OPTIONS_HPP

#include <KPool_Config.hpp>

namespace KPool {

/// Per-call settings every entry point takes last.
struct Options {
  /// Check every argument before launching anything (see README,
  /// "Validation"). Checks that need device data fence the execution space
  /// instance and copy the small per-request arrays to the host. Turn off
  /// where inputs are validated upstream; device code still never writes
  /// outside the ring or the outputs. The default comes from the CMake
  /// option KPool_ENABLE_VALIDATION.
  bool validate = KPOOL_VALIDATE_BY_DEFAULT != 0;
  /// Threads per team; 0 lets the execution space choose (Kokkos'
  /// recommendation on devices, 1 on hosts). Capped at what the space
  /// allows.
  int team_size = 0;
  /// KPool::step only: one launch for ring_close, compress and seed_tail
  /// (true) or three (false). Both give the same bits.
  bool fused = true;
};

}  // namespace KPool

#endif
