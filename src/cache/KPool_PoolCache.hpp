#ifndef KPOOL_CACHE_POOL_CACHE_HPP
#define KPOOL_CACHE_POOL_CACHE_HPP

// The paged pool cache of one layer (docs/indexer.md, "The pool cache"):
//   values [num_blocks][block_pools][D]  element type C
//   scales [num_blocks][block_pools]     f32
// Pool p of the sequence in batch row r lives at block
// block_table(r, p / block_pools), entry p % block_pools, holding
// Q(R(x)) of the pooled key x.

#include <common/KPool_Exceptions.hpp>
#include <common/KPool_Float8.hpp>
#include <common/KPool_Shard.hpp>
#include <common/KPool_Types.hpp>
#include <common/detail/KPool_KokkosExt.hpp>

#include <algorithm>
#include <cstddef>
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

/// How a cache quantizes (docs/indexer.md, "The serving profile"): `exact`
/// keeps R(x) in f32 until the one rounding into C; `serving` reproduces
/// the engines that serve GLM-5 byte for byte (R(x) rounded to bf16, amax
/// floored at 1e-4, UE8M0 scale ceil_ue8m0(amax * f32(1/448))), and the
/// selections over such a cache quantize their queries the same way. The
/// serving profile needs an fp8 cache with scale pow2.
enum class CacheProfile { exact, serving };

inline char const* cache_profile_name(CacheProfile p) {
  return p == CacheProfile::exact ? "exact" : "serving";
}

/// Where a cache's bytes live. `split` (the default): a values view
/// [num_blocks][block_pools][D] and a scales view [num_blocks][block_pools].
/// `fused`: one caller-owned byte buffer in the layout DeepGEMM's paged
/// logits kernel and vLLM's indexer cache read: per block, the
/// block_pools * D E4M3 bytes of its entries (entry-major), then its
/// block_pools f32 scales (docs/indexer.md, "The engines' byte layout").
enum class CacheLayout { split, fused };

inline char const* cache_layout_name(CacheLayout l) {
  return l == CacheLayout::split ? "split" : "fused";
}

/// A per-layer paged pool cache. C is the cache element type: a storage
/// type (a native cache, C = the pools' storage type) or float8_e4m3.
/// The views are plain LayoutRight views, so an engine can hand them to
/// its own kernels; a serving cache may instead wrap the engines' own
/// fused byte buffer (CacheLayout::fused).
template <class C, class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
class PoolCache {
  static_assert(Details::holds_cache_element_type<C, PoolCache>());

 public:
  using value_type = C;
  using memory_space = MemorySpace;
  using values_type = Kokkos::View<C***, Kokkos::LayoutRight, MemorySpace>;
  using scales_type = Kokkos::View<float**, Kokkos::LayoutRight, MemorySpace>;
  /// The fused layout's buffer: [num_blocks][>= block_pools * (D + 4)]
  /// bytes, blocks stride(0) bytes apart.
  using bytes_type = Kokkos::View<std::uint8_t**, Kokkos::LayoutRight, MemorySpace>;

  static constexpr bool is_fp8 = std::is_same<C, float8_e4m3>::value;

  PoolCache() = default;

  /// A zero-filled cache for pools of `kpool` tokens (values and scales 0,
  /// filled on `space`), in the split layout. The cache remembers K: the
  /// steps refuse to write it from a ring of another K, and score_select
  /// and select_tokens refuse a `kpool` argument other than K (a K mismatch
  /// would otherwise give silently wrong visible pools).
  /// @param space the instance the zero fill is queued on.
  /// @param num_blocks blocks of the cache (>= 1).
  /// @param block_pools pools a block holds (>= 1).
  /// @param head_dim D, channels of a pooled key (>= 1).
  /// @param kpool K, tokens per pool (>= 1).
  /// @param scale the fp8 scale mode (default amax for fp8, none native).
  /// @param rotate whether pools are stored rotated (D a power of two).
  /// @param profile exact, or serving (fp8 with scale pow2 only).
  /// @throws KPool::InvalidArgument (entry point "KPool::PoolCache") for
  /// sizes or kpool below 1, an fp8 cache with scale none, a native cache
  /// with a scale other than none, rotation with a head_dim that is not a
  /// power of two, or the serving profile on a native cache or with a
  /// scale other than pow2.
  template <class ExecutionSpace,
            class = std::enable_if_t<Kokkos::is_execution_space<ExecutionSpace>::value>>
  PoolCache(ExecutionSpace const& space, int num_blocks, int block_pools,
            int head_dim, int kpool,
            CacheScale scale = is_fp8 ? CacheScale::amax : CacheScale::none,
            bool rotate = false, CacheProfile profile = CacheProfile::exact)
      : scale_(scale), profile_(profile), rotate_(rotate), kpool_(kpool) {
    allocate(space, num_blocks, block_pools, head_dim, kpool, scale,
             rotate, profile);
  }

  /// A serving-profile fp8 cache (scale pow2) over a caller-owned buffer in
  /// the fused layout: `bytes` is [num_blocks][at least block_pools * (D +
  /// 4)], block b's entry e at byte b * stride(0) + e * D, its f32 scale at
  /// byte b * stride(0) + block_pools * D + 4 * e (DeepGEMM's
  /// kv_cache_cast_to_fp8 layout, docs/indexer.md). Nothing is allocated
  /// or filled; the cache reads and writes `bytes` in place.
  /// Throws KPool::InvalidArgument (entry point "KPool::PoolCache") unless
  /// C is float8_e4m3, the sizes are at least 1, extent 1 holds a block,
  /// block_pools * D and stride(0) are multiples of 4 and the data pointer
  /// is 4-byte aligned (so every scale is an aligned f32), and D is a power
  /// of two when rotate.
  /// `kpool`: K, tokens per pool (>= 1), as the allocating constructor
  /// takes it, after head_dim.
  PoolCache(bytes_type const& bytes, int block_pools, int head_dim, int kpool,
            bool rotate = false)
      : scale_(CacheScale::pow2),
        profile_(CacheProfile::serving),
        layout_(CacheLayout::fused),
        rotate_(rotate),
        kpool_(kpool) {
    auto const fail = [](std::string const& arg, std::string const& value,
                         std::string const& problem) {
      throw InvalidArgument("KPool::PoolCache", arg, "", -1, value, problem);
    };
    if (!is_fp8)
      fail("bytes", storage_name<C>(),
           "is the element type of a native cache; the fused layout holds "
           "fp8_e4m3 entries (PoolCache<KPool::float8_e4m3>)");
    int const num_blocks =
        static_cast<int>(std::min<std::size_t>(bytes.extent(0), 0x7FFFFFFF));
    check(num_blocks, block_pools, head_dim, kpool,
          CacheScale::pow2, rotate, CacheProfile::serving);
    std::size_t const need =
        static_cast<std::size_t>(block_pools) * (static_cast<std::size_t>(head_dim) + 4);
    if (bytes.extent(1) < need)
      fail("bytes", std::to_string(bytes.extent(1)),
           "is extent 1, fewer than the block_pools * (head_dim + 4) = " +
               std::to_string(need) + " bytes a block needs");
    if ((static_cast<std::int64_t>(block_pools) * head_dim) % 4 != 0)
      fail("head_dim", std::to_string(head_dim),
           "times block_pools = " + std::to_string(block_pools) +
               " is not a multiple of 4, so the f32 scales after a block's "
               "entries would not be aligned");
    std::size_t const stride = bytes.extent(0) > 1 ? bytes.stride(0) : need;
    if (stride % 4 != 0)
      fail("bytes", std::to_string(stride),
           "is stride 0, not a multiple of 4 (the f32 scales would not be aligned)");
    if (reinterpret_cast<std::uintptr_t>(bytes.data()) % 4 != 0)
      fail("bytes", "data()", "is not 4-byte aligned (the f32 scales would not be)");
    bytes_ = bytes;
    set_sizes(num_blocks, block_pools, head_dim);
    values_data_ = reinterpret_cast<C*>(bytes.data());
    scales_data_ = reinterpret_cast<float*>(
        bytes.data() + static_cast<std::size_t>(block_pools) * head_dim);
    values_block_stride_ = static_cast<std::int64_t>(stride);
    scales_block_stride_ = static_cast<std::int64_t>(stride / 4);
  }

  /// The fused constructor's earlier argument order (rotate before an
  /// optional K) does not compile, rather than reading `rotate` as K: K
  /// now follows head_dim, as in every other constructor.
  PoolCache(bytes_type const&, int, int, bool) = delete;
  /// @copydoc PoolCache(bytes_type const&, int, int, bool)
  PoolCache(bytes_type const&, int, int, bool, int) = delete;

  /// A cache over a caller's two buffers in the split layout (an engine's
  /// own allocation, e.g. unmanaged Views of its device pointers): `values`
  /// [num_blocks, block_pools, D] and `scales` [num_blocks, block_pools],
  /// both LayoutRight. Nothing is allocated or filled; the cache reads and
  /// writes them in place, with the settings given as the allocating
  /// constructor takes them.
  /// @throws KPool::InvalidArgument (entry point "KPool::PoolCache") as the
  /// allocating constructor, and when scales is not [num_blocks,
  /// block_pools] of values.
  PoolCache(values_type const& values, scales_type const& scales, int kpool,
            CacheScale scale = is_fp8 ? CacheScale::amax : CacheScale::none,
            bool rotate = false, CacheProfile profile = CacheProfile::exact)
      : values_(values),
        scales_(scales),
        scale_(scale),
        profile_(profile),
        rotate_(rotate),
        kpool_(kpool) {
    auto const extent = [](std::size_t e) {
      return static_cast<int>(std::min<std::size_t>(e, 0x7FFFFFFF));
    };
    int const num_blocks = extent(values.extent(0));
    int const block_pools = extent(values.extent(1));
    int const head_dim = extent(values.extent(2));
    check(num_blocks, block_pools, head_dim, kpool, scale, rotate, profile);
    if (scales.extent(0) != values.extent(0) || scales.extent(1) != values.extent(1))
      throw InvalidArgument("KPool::PoolCache", "scales", "", -1,
                            "[" + std::to_string(scales.extent(0)) + ", " +
                                std::to_string(scales.extent(1)) + "]",
                            "is not [num_blocks, block_pools] of values = [" +
                                std::to_string(num_blocks) + ", " +
                                std::to_string(block_pools) + "]");
    set_sizes(num_blocks, block_pools, head_dim);
    values_data_ = values_.data();
    scales_data_ = scales_.data();
    values_block_stride_ = static_cast<std::int64_t>(block_pools) * head_dim;
    scales_block_stride_ = block_pools;
  }

  /// [num_blocks, block_pools, D]: the cached (quantized, maybe rotated)
  /// pooled keys. Split layout only (empty in the fused layout: use bytes()).
  values_type const& values() const { return values_; }
  /// [num_blocks, block_pools]: one f32 scale per pool (1 in a native cache).
  /// Split layout only (empty in the fused layout: use bytes()).
  scales_type const& scales() const { return scales_; }
  /// The fused layout's buffer (empty in the split layout).
  bytes_type const& bytes() const { return bytes_; }

  int num_blocks() const { return num_blocks_; }
  int block_pools() const { return block_pools_; }
  int head_dim() const { return head_dim_; }
  CacheScale scale() const { return scale_; }
  CacheProfile profile() const { return profile_; }
  CacheLayout layout() const { return layout_; }
  /// K, the tokens per pool the cache was built for (0 only for a
  /// default-constructed cache, which holds nothing).
  int kpool() const { return kpool_; }
  /// Whether pools are stored rotated by the orthonormal Walsh-Hadamard
  /// transform.
  bool rotated() const { return rotate_; }
  /// False for a default-constructed cache.
  bool is_allocated() const { return values_data_ != nullptr; }
  /// The share of the sequences' pools this cache holds (docs/ranks.md):
  /// unsharded (one rank) unless made by sharded().
  Shard const& shard() const { return shard_; }

  /// The same storage as rank `s.rank` of a cache sharded over `s.ranks`
  /// ranks (docs/ranks.md): the steps write into it only the pools that
  /// rank holds, each at its local pool (local pool l in block
  /// block_table(r, l / block_pools), entry l % block_pools), and it is
  /// selected from only through the ranks' exchange (KPool::score_select
  /// with a Communicator, or KPool::shard_select_local and
  /// KPool::shard_select_merge). A handle, like the cache: no data is
  /// copied.
  /// @throws KPool::InvalidArgument (entry point "KPool::PoolCache") for
  /// ranks or interleave below 1, or a rank outside [0, ranks).
  PoolCache sharded(Shard const& s) const {
    auto const fail = [&](char const* arg, int value, std::string const& problem) {
      throw InvalidArgument("KPool::PoolCache", "shard", arg, -1, std::to_string(value),
                            problem);
    };
    if (s.ranks < 1) fail("ranks", s.ranks, "is not at least 1");
    if (s.interleave < 1) fail("interleave", s.interleave, "is not at least 1");
    if (s.rank < 0 || s.rank >= s.ranks)
      fail("rank", s.rank, "is not a rank of the " + std::to_string(s.ranks) + " ranks");
    PoolCache c = *this;
    c.shard_ = s;
    return c;
  }

  /// Addressing that holds in both layouts (what KPool's kernels use):
  /// entry e of block b holds its D values at values_data() + b *
  /// values_block_stride() + e * head_dim() and its scale at
  /// scales_data()[b * scales_block_stride() + e].
  C* values_data() const { return values_data_; }
  float* scales_data() const { return scales_data_; }
  std::int64_t values_block_stride() const { return values_block_stride_; }
  std::int64_t scales_block_stride() const { return scales_block_stride_; }

 private:
  template <class ExecutionSpace>
  void allocate(ExecutionSpace const& space, int num_blocks, int block_pools,
                int head_dim, int kpool, CacheScale scale,
                bool rotate, CacheProfile profile) {
    static_assert(Kokkos::SpaceAccessibility<ExecutionSpace, MemorySpace>::accessible,
                  "KPool::PoolCache: the execution space must reach the memory space");
    check(num_blocks, block_pools, head_dim, kpool, scale, rotate,
          profile);
    values_ = values_type(Kokkos::view_alloc(space, "KPool::PoolCache::values"),
                          num_blocks, block_pools, head_dim);
    scales_ = scales_type(Kokkos::view_alloc(space, "KPool::PoolCache::scales"),
                          num_blocks, block_pools);
    set_sizes(num_blocks, block_pools, head_dim);
    values_data_ = values_.data();
    scales_data_ = scales_.data();
    values_block_stride_ = static_cast<std::int64_t>(block_pools) * head_dim;
    scales_block_stride_ = block_pools;
  }

  void set_sizes(int num_blocks, int block_pools, int head_dim) {
    num_blocks_ = num_blocks;
    block_pools_ = block_pools;
    head_dim_ = head_dim;
  }

  static void check(int num_blocks, int block_pools, int head_dim,
                    int kpool, CacheScale scale, bool rotate,
                    CacheProfile profile) {
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
    if (kpool < 1)
      fail("kpool", std::to_string(kpool), "is not at least 1");
    if (is_fp8 && scale == CacheScale::none)
      fail("scale", "none",
           "is not a scale mode of an fp8 cache (use amax or pow2)");
    if (!is_fp8 && scale != CacheScale::none)
      fail("scale", cache_scale_name(scale),
           std::string("is not available to a native ") + storage_name<C>() +
               " cache (native caches have scale none)");
    if (profile == CacheProfile::serving && !is_fp8)
      fail("profile", "serving",
           std::string("is not available to a native ") + storage_name<C>() +
               " cache (the serving profile is fp8 with scale pow2)");
    if (profile == CacheProfile::serving && scale != CacheScale::pow2)
      fail("scale", cache_scale_name(scale),
           "is not the serving profile's scale mode (its UE8M0 scales are pow2)");
    if (rotate && (head_dim & (head_dim - 1)) != 0)
      fail("head_dim", std::to_string(head_dim),
           "is not a power of two, which a rotated cache needs");
  }

  values_type values_;
  scales_type scales_;
  bytes_type bytes_;
  C* values_data_ = nullptr;
  float* scales_data_ = nullptr;
  std::int64_t values_block_stride_ = 0;
  std::int64_t scales_block_stride_ = 0;
  int num_blocks_ = 0;
  int block_pools_ = 0;
  int head_dim_ = 0;
  CacheScale scale_ = CacheScale::none;
  CacheProfile profile_ = CacheProfile::exact;
  CacheLayout layout_ = CacheLayout::split;
  bool rotate_ = false;
  int kpool_ = 0;
  Shard shard_;
};

}  // namespace KPool

#endif
