#ifndef KPOOL_OPTIONS_HPP
#define KPOOL_OPTIONS_HPP

#include <KPool_Config.hpp>

namespace KPool {

/// Per-call settings, the optional last argument of every entry point.
///
/// A plain aggregate; in C++17 set fields one by one:
/// `KPool::Options o; o.validate = false;`.
struct Options {
  /// Check the arguments' data, not only their shapes, before launching
  /// anything (docs/validation.md): row_offsets, cache_lengths, slot_idx
  /// and decode positions. These checks fence the execution space instance
  /// and copy the small per-request arrays to the host, one host
  /// synchronization per call. Turn off where inputs are validated
  /// upstream (and to capture calls in a CUDA graph); device code still
  /// never writes outside the ring or the outputs. Defaults to
  /// KPOOL_VALIDATE_BY_DEFAULT (the CMake option KPool_ENABLE_VALIDATION).
  bool validate = KPOOL_VALIDATE_BY_DEFAULT != 0;
  /// Threads per team; 0 lets KPool choose (Kokkos' recommendation for
  /// the functor on devices, 1 on hosts). Capped at what the execution
  /// space allows. Never changes results.
  int team_size = 0;
  /// KPool::step only: one launch for ring_close, compress and seed_tail
  /// (true, the default) or three (false). Both give the same bits.
  bool fused = true;
};

}  // namespace KPool

#endif
