#ifndef KPOOL_POOL_CACHE_HPP
#define KPOOL_POOL_CACHE_HPP

// The paged pool cache of one layer (docs/indexer.md, "The pool cache"):
//   values [num_blocks][block_pools][D]  element type C
//   scales [num_blocks][block_pools]     f32
// Pool p of the sequence in batch row r lives at block
// block_table(r, p / block_pools), entry p % block_pools, holding
// Q(R(x)) of the pooled key x.

#include <KPool_Exceptions.hpp>
#include <KPool_Float8.hpp>
#include <KPool_Types.hpp>
#include <details/KPool_DetailsKokkosExt.hpp>

#include <cstdint>
#include <string>
#include <type_traits>

namespace KPool {

/// How an fp8 cache scales each pool (docs/indexer.md): `none` for native
/// caches (scale 1); `amax`: s = amax / 448 in f32; `pow2`: the smallest
/// power of two not below amax / 448 (UE8M0). s = 1 for a pool whose amax
/// is 0.
enum class CacheScale { none, amax, pow2 };

inline char const* cache_scale_name(CacheScale s) {
  return s == CacheScale::none ? "none" : s == CacheScale::amax ? "amax" : "pow2";
}

/// A per-layer paged pool cache. C is the cache element type: a storage
/// type (a native cache, C = the pools' storage type) or float8_e4m3.
/// The views are plain LayoutRight views, so an engine can hand them to
/// its own kernels.
template <class C, class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
class PoolCache {
  static_assert(is_cache_element_type<C>::value,
                "KPool::PoolCache: C must be float, double, KPool::bfloat16, "
                "KPool::float16 or KPool::float8_e4m3");

 public:
  using value_type = C;
  using memory_space = MemorySpace;
  using values_type = Kokkos::View<C***, Kokkos::LayoutRight, MemorySpace>;
  using scales_type = Kokkos::View<float**, Kokkos::LayoutRight, MemorySpace>;

  static constexpr bool is_fp8 = std::is_same<C, float8_e4m3>::value;

  PoolCache() = default;

  /// A zero-filled cache for pools of `kpool` tokens (values and scales 0,
  /// filled on `space`). The cache remembers K: the steps refuse to write
  /// it from a ring of another K, and score_select and select_tokens refuse
  /// a `kpool` argument other than K (a K mismatch would otherwise give
  /// silently wrong visible pools).
  /// @param space the instance the zero fill is queued on.
  /// @param num_blocks blocks of the cache (>= 1).
  /// @param block_pools pools a block holds (>= 1).
  /// @param head_dim D, channels of a pooled key (>= 1).
  /// @param kpool K, tokens per pool (>= 1).
  /// @param scale the fp8 scale mode (default amax for fp8, none native).
  /// @param rotate whether pools are stored rotated (D a power of two).
  /// @throws KPool::InvalidArgument (entry point "KPool::PoolCache") for
  /// sizes or kpool below 1, an fp8 cache with scale none, a native cache
  /// with a scale other than none, or rotation with a head_dim that is not
  /// a power of two.
  template <class ExecutionSpace>
  PoolCache(ExecutionSpace const& space, int num_blocks, int block_pools,
            int head_dim, int kpool,
            CacheScale scale = is_fp8 ? CacheScale::amax : CacheScale::none,
            bool rotate = false)
      : PoolCache(Build(), space, num_blocks, block_pools, head_dim, true,
                  kpool, scale, rotate) {}

  /// The original constructor, kept so existing code compiles: a cache
  /// that does not know its K (kpool() is 0), which the steps and the
  /// selections therefore cannot check against theirs. Prefer the
  /// constructor above, which takes K after head_dim.
  /// @param space the instance the zero fill is queued on.
  /// @param num_blocks blocks of the cache (>= 1).
  /// @param block_pools pools a block holds (>= 1).
  /// @param head_dim D (>= 1).
  /// @param scale the fp8 scale mode.
  /// @param rotate whether pools are stored rotated.
  /// @throws KPool::InvalidArgument as the constructor above.
  template <class ExecutionSpace>
  PoolCache(ExecutionSpace const& space, int num_blocks, int block_pools,
            int head_dim, CacheScale scale = is_fp8 ? CacheScale::amax : CacheScale::none,
            bool rotate = false)
      : PoolCache(Build(), space, num_blocks, block_pools, head_dim, false, 0,
                  scale, rotate) {}

  /// [num_blocks, block_pools, D]: the cached (quantized, maybe rotated)
  /// pooled keys.
  values_type const& values() const { return values_; }
  /// [num_blocks, block_pools]: one f32 scale per pool (1 in a native cache).
  scales_type const& scales() const { return scales_; }

  int num_blocks() const { return static_cast<int>(values_.extent(0)); }
  int block_pools() const { return static_cast<int>(values_.extent(1)); }
  int head_dim() const { return static_cast<int>(values_.extent(2)); }
  CacheScale scale() const { return scale_; }
  /// K, the tokens per pool the cache was built for; 0 when it was built
  /// without one (the K-less constructor), which nothing can check.
  int kpool() const { return kpool_; }
  /// Whether pools are stored rotated by the orthonormal Walsh-Hadamard
  /// transform.
  bool rotated() const { return rotate_; }
  /// False for a default-constructed cache.
  bool is_allocated() const { return values_.data() != nullptr; }

 private:
  struct Build {};
  // has_kpool false: the K-less constructor (kpool() is 0).
  template <class ExecutionSpace>
  PoolCache(Build, ExecutionSpace const& space, int num_blocks,
            int block_pools, int head_dim, bool has_kpool, int kpool,
            CacheScale scale, bool rotate)
      : scale_(scale), rotate_(rotate), kpool_(has_kpool ? kpool : 0) {
    static_assert(Kokkos::SpaceAccessibility<ExecutionSpace, MemorySpace>::accessible,
                  "KPool::PoolCache: the execution space must reach the memory space");
    check(num_blocks, block_pools, head_dim, has_kpool, kpool, scale, rotate);
    values_ = values_type(Kokkos::view_alloc(space, "KPool::PoolCache::values"),
                          num_blocks, block_pools, head_dim);
    scales_ = scales_type(Kokkos::view_alloc(space, "KPool::PoolCache::scales"),
                          num_blocks, block_pools);
  }

  static void check(int num_blocks, int block_pools, int head_dim,
                    bool has_kpool, int kpool, CacheScale scale, bool rotate) {
    auto const fail = [](std::string const& arg, std::string const& value,
                         std::string const& problem) {
      throw InvalidArgument("KPool::PoolCache", arg, "", -1, value, problem);
    };
    if (num_blocks < 1)
      fail("num_blocks", std::to_string(num_blocks), "is not at least 1");
    if (block_pools < 1)
      fail("block_pools", std::to_string(block_pools), "is not at least 1");
    if (head_dim < 1)
      fail("head_dim", std::to_string(head_dim), "is not at least 1");
    if (has_kpool && kpool < 1)
      fail("kpool", std::to_string(kpool), "is not at least 1");
    if (is_fp8 && scale == CacheScale::none)
      fail("scale", "none",
           "is not a scale mode of an fp8 cache (use amax or pow2)");
    if (!is_fp8 && scale != CacheScale::none)
      fail("scale", cache_scale_name(scale),
           std::string("is not available to a native ") + storage_name<C>() +
               " cache (native caches have scale none)");
    if (rotate && (head_dim & (head_dim - 1)) != 0)
      fail("head_dim", std::to_string(head_dim),
           "is not a power of two, which a rotated cache needs");
  }

  values_type values_;
  scales_type scales_;
  CacheScale scale_ = CacheScale::none;
  bool rotate_ = false;
  int kpool_ = 0;
};

}  // namespace KPool

#endif
