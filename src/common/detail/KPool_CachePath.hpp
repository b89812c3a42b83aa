#ifndef KPOOL_COMMON_DETAIL_CACHE_PATH_HPP
#define KPOOL_COMMON_DETAIL_CACHE_PATH_HPP

// Where a cached step writes its pools into the pool cache (docs/indexer.md,
// "The pool cache"; docs/performance.md, "Writing the pool cache"). The one place that
// chooses.
//
//   in_step      inside the step's own launch: each pool goes from the
//                registers that made it to the cache (team_items' hooks);
//   second_pass  a second launch on the same execution space instance over
//                the step's output rows, store_pools' functor: rows [0,
//                count), count read on the device, so nothing waits for the
//                host. It goes through the same row writer as store_pools
//                (cache_write_row / cache_team_write), whatever the cache's
//                quantization.
//
// Both store the same bytes (the quantizer is the same; the pools are the
// same bits, in the output row or in registers). Devices, and hosts taking
// the device launch shapes, write in the step: there the step is bound by
// memory traffic, which the write does not add to. A host's step is bound
// by arithmetic, and the write inside it also costs the step's input stream
// while the core runs it; there each path takes whichever the perf suite
// measured cheaper (perf_tests/kpool_perf.cpp, ops *_cache_fp8_in_step and
// *_cache_fp8_second_pass; docs/performance.md's table).

#include <common/detail/KPool_Launch.hpp>

#include <cstddef>
#include <type_traits>

namespace KPool {
namespace Details {

enum class CacheWritePath { automatic, in_step, second_pass };

// The work whose pools a step writes: a step's prefill and continuation
// items (by the pools' storage type), or decode_step's rows.
enum class CacheItems { step, decode };

// The host table, from the perf suite on an x86 host (docs/performance.md,
// "Writing the pool cache": 1 and 2 threads, prefill at batch 1 and 8, decode at batch
// 256, the mixed batch; CPU time over the uncached step). T is the pools'
// storage type.
//  - 16-bit pools of a step's prefill and continuation items: the second
//    pass. Written in the step they cost +47 to +75%, more than the step
//    plus a standalone store_pools; by the pass +22 to +60%.
//  - f32 (and f64) pools of a step's items: in the step. Their pooling
//    loop stages each pool into scratch from registers (host_stages_cache):
//    +9 to +36% at 64K prefill against +11 to +32% by the pass, and the
//    pass's second launch (waking the thread pool once more) makes it the
//    dearer one at 2 threads.
//  - decode rows: by the size of the call (cache_write_path_for): in the
//    step below host_decode_pass_requests requests, by the second pass
//    from there. A small decode call is a few microseconds, where the
//    pass's second launch (waking the thread pool once more) costs up to
//    a third of the call: in the step it keeps the rule at 0.72-0.84, by
//    the pass 0.99-1.07 (batch 1, an Intel Xeon VM, 2 threads,
//    2026-12-04). From 64 requests the pass keeps it everywhere measured
//    (0.71-1.01 on that host) while the write in the step runs past it on
//    some hosts: 1.04-1.10 at batch 256 and 512 with bf16 keys there
//    (0.87-0.94 on the AMD EPYC VM of the table, where the pass also
//    held, 0.97-0.99).
// This function gives the path of calls whose size does not decide it,
// and of the smallest decode calls.
template <class T, CacheItems Items>
constexpr CacheWritePath host_cache_write_path() {
  if constexpr (Items == CacheItems::decode)
    return CacheWritePath::in_step;
  else if constexpr (sizeof(T) == 2)
    return CacheWritePath::second_pass;  // bf16, f16
  else
    return CacheWritePath::in_step;  // f32, f64
}

// Decode calls of at least this many requests write the cache by the
// second pass on hosts (above).
constexpr int host_decode_pass_requests = 64;

// Whether the path of a cached call depends on its size: decode calls on
// hosts, the path not forced.
template <class ExecutionSpace, CacheItems Items,
          CacheWritePath Forced = CacheWritePath::automatic>
constexpr bool cache_write_path_by_size() {
  return Forced == CacheWritePath::automatic && !device_shapes<ExecutionSpace>::value &&
         Items == CacheItems::decode;
}

// The path a cached step takes: Forced when a test forces one (any
// backend: both are correct everywhere), else in the step on devices and
// with device shapes, else the host table.
template <class ExecutionSpace, class T, CacheItems Items,
          CacheWritePath Forced = CacheWritePath::automatic>
constexpr CacheWritePath cache_write_path() {
  if constexpr (Forced != CacheWritePath::automatic)
    return Forced;
  else if constexpr (device_shapes<ExecutionSpace>::value)
    return CacheWritePath::in_step;
  else
    return host_cache_write_path<T, Items>();
}

// The path a cached call of `requests` requests takes.
template <class ExecutionSpace, class T, CacheItems Items,
          CacheWritePath Forced = CacheWritePath::automatic>
constexpr CacheWritePath cache_write_path_for(std::size_t requests) {
  if constexpr (cache_write_path_by_size<ExecutionSpace, Items, Forced>())
    return requests >= static_cast<std::size_t>(host_decode_pass_requests)
               ? CacheWritePath::second_pass
               : CacheWritePath::in_step;
  else
    return cache_write_path<ExecutionSpace, T, Items, Forced>();
}

}  // namespace Details
}  // namespace KPool

#endif
