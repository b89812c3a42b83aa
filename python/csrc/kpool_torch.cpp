// torch.ops.kpool: KPool's indexer path (the step, the cache, scoring,
// selection, expansion) as PyTorch custom operators (docs/torch.md). Every op takes the caller's tensors as unmanaged Kokkos
// Views over their data pointers (nothing is copied), checks their dtype,
// device, shape and contiguity first (a RuntimeError naming the argument,
// nothing written), then makes the one KPool call it mirrors. The cache is
// the engines' fused fp8 layout (vLLM's indexer cache, DeepGEMM's paged
// logits input): a uint8 tensor [num_blocks, block_pools, D + 4] (or
// [num_blocks, block_pools, 1, D + 4]), in the serving profile.
//
// Kokkos is initialized on the first op and finalized by the Python
// package at interpreter exit (kpool/__init__.py calls kpool::_finalize).

#include <KPool.hpp>

#include <torch/library.h>
#include <ATen/core/Tensor.h>

#if defined(KOKKOS_ENABLE_CUDA)
#include <ATen/cuda/CUDAContext.h>
#endif

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

namespace {

using ExecSpace = Kokkos::DefaultExecutionSpace;
using Mem = ExecSpace::memory_space;
using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
template <class D>
using UView = Kokkos::View<D, Kokkos::LayoutRight, Mem, Unmanaged>;
using Cache = KPool::PoolCache<KPool::float8_e4m3, Mem>;

// Where the tensors must be: on the GPU for a device Kokkos, on the CPU for
// a host one.
constexpr bool kDeviceKokkos =
    !Kokkos::SpaceAccessibility<Kokkos::HostSpace, Mem>::accessible;

// ---------------------------------------------------------------------------
// Kokkos' lifetime and the workspaces

std::mutex& call_mutex() {
  static std::mutex m;
  return m;
}

bool& we_initialized() {
  static bool b = false;
  return b;
}

bool& we_finalized() {
  static bool b = false;
  return b;
}

void ensure_kokkos() {
  // Kokkos cannot start again once finalized (at interpreter exit).
  TORCH_CHECK(!we_finalized(),
              "kpool: Kokkos was finalized (kpool finalizes it at interpreter exit); no "
              "kpool op can run after that");
  if (!Kokkos::is_initialized()) {
    // Reads OMP_NUM_THREADS (through the OpenMP runtime PyTorch shares)
    // and the KOKKOS_* environment variables.
    Kokkos::initialize();
    we_initialized() = true;
  }
}

// One SelectWorkspace per query type, heads, head_dim and max_visible (the
// pools a block-table row addresses), grown in rows when a call needs more:
// after the first call of a shape, no op allocates.
struct WorkspaceKey {
  int type;
  int heads;
  int dim;
  std::size_t max_visible;
  bool operator<(WorkspaceKey const& o) const {
    return std::tie(type, heads, dim, max_visible) <
           std::tie(o.type, o.heads, o.dim, o.max_visible);
  }
};

std::size_t& workspace_limit_bytes() {
  static std::size_t limit = std::size_t(256) << 20;
  return limit;
}

template <class T>
struct TypeIndex;
template <>
struct TypeIndex<float> {
  static constexpr int value = 0;
};
template <>
struct TypeIndex<KPool::bfloat16> {
  static constexpr int value = 1;
};
template <>
struct TypeIndex<KPool::float16> {
  static constexpr int value = 2;
};

template <class T>
std::map<WorkspaceKey, KPool::SelectWorkspace<T, Mem>>& workspaces() {
  static std::map<WorkspaceKey, KPool::SelectWorkspace<T, Mem>> m;
  return m;
}

void release_workspaces() {
  workspaces<float>().clear();
  workspaces<KPool::bfloat16>().clear();
  workspaces<KPool::float16>().clear();
}

// The workspace for a call of `rows` query rows: as many rows as fit the
// limit on its key buffer (the call then selects in chunks of that many).
template <class T>
KPool::SelectWorkspace<T, Mem>& workspace_for(ExecSpace const& space, std::size_t rows,
                                              int heads, int dim, std::size_t max_visible) {
  using W = KPool::SelectWorkspace<T, Mem>;
  std::size_t const key_bytes = sizeof(typename W::key_type) * max_visible;
  std::size_t cap = workspace_limit_bytes() / key_bytes;
  if (cap < 1) cap = 1;
  std::size_t const want = rows < cap ? (rows < 1 ? 1 : rows) : cap;
  auto& m = workspaces<T>();
  WorkspaceKey const key{TypeIndex<T>::value, heads, dim, max_visible};
  auto it = m.find(key);
  if (it != m.end() && it->second.max_tokens() >= want) return it->second;
  W fresh(space, want, max_visible, heads, dim);
  if (it != m.end()) {
    it->second = std::move(fresh);
    return it->second;
  }
  return m.emplace(key, std::move(fresh)).first->second;
}

// ---------------------------------------------------------------------------
// Argument checks: a RuntimeError naming the op, the argument and what was
// expected, before anything is written.

[[noreturn]] void refuse(char const* op, char const* arg, std::string const& problem) {
  TORCH_CHECK(false, "kpool.", op, ": argument '", arg, "': ", problem,
              "; nothing was written");
}

std::string shape_of(at::Tensor const& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

void expect_tensor(char const* op, char const* arg, at::Tensor const& t, at::ScalarType type,
                   char const* type_name) {
  if (!t.defined()) refuse(op, arg, "is not given");
  if (t.scalar_type() != type)
    refuse(op, arg, std::string("has dtype ") + c10::toString(t.scalar_type()) +
                        ", expected " + type_name);
  bool const on_device = !t.device().is_cpu();
  if (on_device != kDeviceKokkos)
    refuse(op, arg,
           std::string("is on ") + t.device().str() + ", expected " +
               (kDeviceKokkos ? "the GPU this KPool was built for"
                              : "the CPU (this KPool is a host build)"));
  if (!t.is_contiguous()) refuse(op, arg, "is not contiguous (call .contiguous() first)");
}

void expect_dim(char const* op, char const* arg, at::Tensor const& t, int64_t dim,
                char const* layout) {
  if (t.dim() != dim)
    refuse(op, arg, "has shape " + shape_of(t) + ", expected " + layout);
}

void expect_size(char const* op, char const* arg, at::Tensor const& t, int64_t d,
                 int64_t want, char const* what) {
  if (t.size(d) != want)
    refuse(op, arg,
           "has shape " + shape_of(t) + ": extent " + std::to_string(d) + " is " +
               std::to_string(t.size(d)) + ", expected " + std::to_string(want) + " (" +
               what + ")");
}

// A batch's ring slots, int32 [B] read as KPool's uint32.
UView<std::uint32_t const*> slot_view(char const* op, at::Tensor const& slot_idx, int64_t b) {
  expect_tensor(op, "slot_idx", slot_idx, at::kInt, "int32");
  expect_dim(op, "slot_idx", slot_idx, 1, "[B]");
  expect_size(op, "slot_idx", slot_idx, 0, b, "B, the batch's rows");
  return UView<std::uint32_t const*>(
      reinterpret_cast<std::uint32_t const*>(slot_idx.data_ptr<int32_t>()), b);
}

// The batch: exactly one of the ragged pair (row_offsets, cache_lengths)
// and the decode positions.
struct TorchBatch {
  KPool::Batch<Mem> batch;
  int64_t num_requests = 0;
  int64_t next_n = 0;  // 0: ragged
};

TorchBatch make_batch(char const* op, c10::optional<at::Tensor> const& row_offsets,
                      c10::optional<at::Tensor> const& cache_lengths,
                      c10::optional<at::Tensor> const& positions,
                      at::Tensor const* slot_idx = nullptr) {
  bool const ragged = row_offsets.has_value() || cache_lengths.has_value();
  TorchBatch out;
  if (ragged && positions.has_value())
    refuse(op, "positions",
           "is given with row_offsets and cache_lengths: pass the ragged form (row_offsets, "
           "cache_lengths) or the decode form (positions), not both");
  if (ragged) {
    if (!row_offsets.has_value())
      refuse(op, "row_offsets", "is not given (the ragged form needs it with cache_lengths)");
    if (!cache_lengths.has_value())
      refuse(op, "cache_lengths", "is not given (the ragged form needs it with row_offsets)");
    expect_tensor(op, "row_offsets", *row_offsets, at::kInt, "int32");
    expect_tensor(op, "cache_lengths", *cache_lengths, at::kInt, "int32");
    expect_dim(op, "row_offsets", *row_offsets, 1, "[B + 1]");
    expect_dim(op, "cache_lengths", *cache_lengths, 1, "[B]");
    if (row_offsets->size(0) < 1) refuse(op, "row_offsets", "is empty, expected [B + 1]");
    int64_t const b = row_offsets->size(0) - 1;
    expect_size(op, "cache_lengths", *cache_lengths, 0, b, "B, one less than row_offsets");
    // int32 as the engines pass them, read as KPool's uint32: a negative
    // entry reads as a huge one, which validation refuses by value.
    UView<std::uint32_t const*> ro(
        reinterpret_cast<std::uint32_t const*>(row_offsets->data_ptr<int32_t>()),
        row_offsets->size(0));
    UView<std::uint32_t const*> cl(
        reinterpret_cast<std::uint32_t const*>(cache_lengths->data_ptr<int32_t>()), b);
    out.num_requests = b;
    if (slot_idx)
      out.batch = KPool::ragged_batch(ro, cl, slot_view(op, *slot_idx, b), static_cast<int>(b));
    else
      out.batch = KPool::ragged_batch(ro, cl, static_cast<int>(b));
    return out;
  }
  if (!positions.has_value())
    refuse(op, "positions",
           "is not given: pass the ragged form (row_offsets, cache_lengths) or the decode "
           "form (positions)");
  expect_tensor(op, "positions", *positions, at::kInt, "int32");
  expect_dim(op, "positions", *positions, 2, "[B, next_n]");
  UView<std::int32_t const**> pos(positions->data_ptr<int32_t>(), positions->size(0),
                                  positions->size(1));
  out.num_requests = positions->size(0);
  if (slot_idx)
    out.batch = KPool::decode_batch(pos, slot_view(op, *slot_idx, out.num_requests),
                                    static_cast<int>(out.num_requests));
  else
    out.batch = KPool::decode_batch(pos, static_cast<int>(out.num_requests));
  out.next_n = positions->size(1);
  return out;
}

// The engines' fused fp8 cache: uint8 [num_blocks, block_pools, D + 4] or
// [num_blocks, block_pools, 1, D + 4], block b's block_pools * D codes then
// its block_pools f32 scales.
Cache make_cache(char const* op, at::Tensor const& kv_cache, int64_t kpool, bool rotate) {
  expect_tensor(op, "kv_cache", kv_cache, at::kByte, "uint8 (fp8 E4M3 codes, then f32 scales)");
  if (!(kv_cache.dim() == 3 || (kv_cache.dim() == 4 && kv_cache.size(2) == 1)))
    refuse(op, "kv_cache",
           "has shape " + shape_of(kv_cache) +
               ", expected [num_blocks, block_pools, D + 4] or [num_blocks, block_pools, 1, "
               "D + 4]");
  int64_t const block_pools = kv_cache.size(1);
  int64_t const head_dim = kv_cache.size(kv_cache.dim() - 1) - 4;
  if (head_dim < 1) refuse(op, "kv_cache", "has a last extent below 5 (D + 4, D >= 1)");
  if (kpool < 1 || kpool > 0x7FFFFFFF)
    refuse(op, "kpool", "is " + std::to_string(kpool) + ", expected K >= 1");
  UView<std::uint8_t**> bytes(kv_cache.data_ptr<uint8_t>(), kv_cache.size(0),
                              block_pools * (head_dim + 4));
  return Cache(bytes, static_cast<int>(block_pools), static_cast<int>(head_dim),
               static_cast<int>(kpool), rotate);
}

UView<std::int32_t const**> make_block_table(char const* op, at::Tensor const& block_table,
                                             int64_t num_requests) {
  expect_tensor(op, "block_table", block_table, at::kInt, "int32");
  expect_dim(op, "block_table", block_table, 2, "[B, max_blocks]");
  if (block_table.size(0) < num_requests)
    refuse(op, "block_table",
           "has shape " + shape_of(block_table) + ": fewer rows than the batch's B = " +
               std::to_string(num_requests));
  return UView<std::int32_t const**>(block_table.data_ptr<int32_t>(), block_table.size(0),
                                     block_table.size(1));
}

// The storage type of a float32, bfloat16 or float16 tensor (checked).
void expect_storage(char const* op, char const* arg, at::Tensor const& t) {
  if (!t.defined()) refuse(op, arg, "is not given");
  if (!(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16 ||
        t.scalar_type() == at::kHalf))
    refuse(op, arg,
           std::string("has dtype ") + c10::toString(t.scalar_type()) +
               ", expected float32, bfloat16 or float16");
  expect_tensor(op, arg, t, t.scalar_type(), "");
}

template <class F>
void for_storage(at::ScalarType type, F&& f) {
  switch (type) {
    case at::kFloat: f(float{}); break;
    case at::kBFloat16: f(KPool::bfloat16{}); break;
    default: f(KPool::float16{}); break;
  }
}


// q [T, H, D] (or [B, next_n, H, D] for a decode batch) and weights [T, H].
struct Queries {
  int64_t rows, heads, dim;
};

Queries check_queries(char const* op, at::Tensor const& q, at::Tensor const& weights,
                      TorchBatch const& b, int64_t head_dim) {
  expect_storage(op, "q", q);
  Queries out{};
  if (q.dim() == 4 && b.next_n > 0) {
    expect_size(op, "q", q, 0, b.num_requests, "B, the rows of positions");
    expect_size(op, "q", q, 1, b.next_n, "next_n, the columns of positions");
    out = {q.size(0) * q.size(1), q.size(2), q.size(3)};
  } else {
    expect_dim(op, "q", q, 3,
               b.next_n > 0 ? "[B * next_n, H, D] or [B, next_n, H, D]" : "[T, H, D]");
    out = {q.size(0), q.size(1), q.size(2)};
  }
  if (out.dim != head_dim)
    refuse(op, "q",
           "has shape " + shape_of(q) + ": D = " + std::to_string(out.dim) +
               ", expected the cache's D = " + std::to_string(head_dim));
  if (out.heads < 1) refuse(op, "q", "has shape " + shape_of(q) + ": no heads");
  expect_tensor(op, "weights", weights, at::kFloat, "float32");
  expect_dim(op, "weights", weights, 2, "[T, H]");
  expect_size(op, "weights", weights, 0, out.rows, "T, the query rows");
  expect_size(op, "weights", weights, 1, out.heads, "H, q's heads");
  return out;
}

#if defined(KOKKOS_ENABLE_CUDA)
// One Kokkos::Cuda instance per stream PyTorch has run kpool ops on, made
// once (an instance over a stream holds scratch of its own), released
// before Kokkos is finalized. Used under the ops' lock.
std::map<cudaStream_t, Kokkos::Cuda>& stream_instances() {
  static std::map<cudaStream_t, Kokkos::Cuda> m;
  return m;
}
#endif

// The instance the op's work is queued on: PyTorch's current stream on
// CUDA, the default instance on hosts.
ExecSpace exec_space() {
#if defined(KOKKOS_ENABLE_CUDA)
  cudaStream_t const stream = at::cuda::getCurrentCUDAStream().stream();
  auto& m = stream_instances();
  auto it = m.find(stream);
  if (it == m.end()) it = m.emplace(stream, Kokkos::Cuda(stream)).first;
  return it->second;
#else
  return ExecSpace();
#endif
}

// Host builds return with the results in place, as a CPU op does; device
// builds leave the work queued on the caller's stream.
void finish(ExecSpace const& space) {
  if constexpr (!kDeviceKokkos) space.fence();
}

KPool::Options options_for(bool validate) {
  KPool::Options o;
  o.validate = validate;
  return o;
}

// Runs `body(space)` under the ops' lock, Kokkos initialized.
template <class Body>
void locked(Body&& body) {
  std::lock_guard<std::mutex> lock(call_mutex());
  ensure_kokkos();
  ExecSpace const space = exec_space();
  body(space);
  finish(space);
}

// Runs `body(space, q_view)` with q viewed as its KPool storage type, under
// the ops' lock.
template <class Body>
void with_queries(at::Tensor const& q, Queries const& s, Body&& body) {
  locked([&](ExecSpace const& space) {
    for_storage(q.scalar_type(), [&](auto tag) {
      using T = decltype(tag);
      body(space, UView<T const***>(reinterpret_cast<T const*>(q.data_ptr()), s.rows, s.heads,
                                    s.dim));
    });
  });
}

// KPool's own errors (the cache's constructor, the calls' checks) raised
// as a RuntimeError that starts with the op's name, then KPool's message.
template <class Body>
void guarded(char const* op, Body&& body) {
  try {
    body();
  } catch (KPool::InvalidArgument const& e) {
    TORCH_CHECK(false, "kpool.", op, ": ", e.what());
  }
}

UView<float const**> weights_view(at::Tensor const& weights) {
  return UView<float const**>(weights.data_ptr<float>(), weights.size(0), weights.size(1));
}

std::size_t addressed_pools(Cache const& cache, UView<std::int32_t const**> const& table) {
  std::size_t const p = table.extent(1) * static_cast<std::size_t>(cache.block_pools());
  return p < 1 ? 1 : p;
}

// ---------------------------------------------------------------------------
// The ops

void op_score(at::Tensor const& q, at::Tensor const& weights,
              c10::optional<at::Tensor> const& row_offsets,
              c10::optional<at::Tensor> const& cache_lengths,
              c10::optional<at::Tensor> const& positions, at::Tensor const& kv_cache,
              at::Tensor const& block_table, int64_t kpool, bool rotate,
              at::Tensor const& scores, bool validate) {
  char const* op = "score";
  guarded(op, [&] {
    TorchBatch const b = make_batch(op, row_offsets, cache_lengths, positions);
    Cache const cache = make_cache(op, kv_cache, kpool, rotate);
    auto const table = make_block_table(op, block_table, b.num_requests);
    Queries const s = check_queries(op, q, weights, b, cache.head_dim());
    expect_tensor(op, "scores", scores, at::kFloat, "float32");
    expect_dim(op, "scores", scores, 2, "[T, P]");
    expect_size(op, "scores", scores, 0, s.rows, "T, the query rows");
    std::size_t const visible = addressed_pools(cache, table);
    if (static_cast<std::size_t>(scores.size(1)) < visible)
      refuse(op, "scores",
             "has shape " + shape_of(scores) + ": fewer columns than the " +
                 std::to_string(visible) + " pools a block_table row addresses");
    UView<float**> out(scores.data_ptr<float>(), scores.size(0), scores.size(1));
    with_queries(q, s, [&](ExecSpace const& space, auto const& qv) {
      using T = typename std::decay_t<decltype(qv)>::non_const_value_type;
      auto& ws = workspace_for<T>(space, s.rows, s.heads, s.dim, visible);
      KPool::score(space, qv, weights_view(weights), b.batch, KPool::paged(cache, table), out,
                   ws, options_for(validate));
    });
  });
}

template <bool Tokens>
void select_op(char const* op, at::Tensor const& q, at::Tensor const& weights, int64_t topk,
               c10::optional<at::Tensor> const& row_offsets,
               c10::optional<at::Tensor> const& cache_lengths,
               c10::optional<at::Tensor> const& positions, at::Tensor const& kv_cache,
               at::Tensor const& block_table, int64_t kpool, bool rotate,
               at::Tensor const& out, bool validate) {
  char const* out_name = Tokens ? "tokens" : "pool_ids";
  guarded(op, [&] {
    TorchBatch const b = make_batch(op, row_offsets, cache_lengths, positions);
    Cache const cache = make_cache(op, kv_cache, kpool, rotate);
    auto const table = make_block_table(op, block_table, b.num_requests);
    Queries const s = check_queries(op, q, weights, b, cache.head_dim());
    if (topk < 1 || topk > 0x7FFFFFFF)
      refuse(op, "topk", "is " + std::to_string(topk) + ", expected at least 1");
    int64_t const width =
        Tokens ? KPool::select_tokens_width(static_cast<int>(topk), cache.kpool()) : topk;
    expect_tensor(op, out_name, out, at::kInt, "int32");
    expect_dim(op, out_name, out, 2, Tokens ? "[T, topk * K + K - 1]" : "[T, topk]");
    expect_size(op, out_name, out, 0, s.rows, "T, the query rows");
    expect_size(op, out_name, out, 1, width, Tokens ? "topk * K + K - 1" : "topk");
    UView<std::int32_t**> ov(out.data_ptr<int32_t>(), out.size(0), out.size(1));
    std::size_t const visible = addressed_pools(cache, table);
    with_queries(q, s, [&](ExecSpace const& space, auto const& qv) {
      using T = typename std::decay_t<decltype(qv)>::non_const_value_type;
      auto& ws = workspace_for<T>(space, s.rows, s.heads, s.dim, visible);
      if constexpr (Tokens)
        KPool::select_tokens(space, qv, weights_view(weights), static_cast<int>(topk), b.batch,
                             KPool::paged(cache, table), ov, ws, options_for(validate));
      else
        KPool::score_select(space, qv, weights_view(weights), static_cast<int>(topk), b.batch,
                            KPool::paged(cache, table), ov, ws, options_for(validate));
    });
  });
}

void op_score_select(at::Tensor const& q, at::Tensor const& weights, int64_t topk,
                     c10::optional<at::Tensor> const& row_offsets,
                     c10::optional<at::Tensor> const& cache_lengths,
                     c10::optional<at::Tensor> const& positions, at::Tensor const& kv_cache,
                     at::Tensor const& block_table, int64_t kpool, bool rotate,
                     at::Tensor const& pool_ids, bool validate) {
  select_op<false>("score_select", q, weights, topk, row_offsets, cache_lengths, positions,
                   kv_cache, block_table, kpool, rotate, pool_ids, validate);
}

void op_select_tokens(at::Tensor const& q, at::Tensor const& weights, int64_t topk,
                      c10::optional<at::Tensor> const& row_offsets,
                      c10::optional<at::Tensor> const& cache_lengths,
                      c10::optional<at::Tensor> const& positions, at::Tensor const& kv_cache,
                      at::Tensor const& block_table, int64_t kpool, bool rotate,
                      at::Tensor const& tokens, bool validate) {
  select_op<true>("select_tokens", q, weights, topk, row_offsets, cache_lengths, positions,
                  kv_cache, block_table, kpool, rotate, tokens, validate);
}

void op_expand_topk(at::Tensor const& pool_ids, bool tail_always, at::Tensor const& row_offsets,
                    at::Tensor const& cache_lengths, at::Tensor const& kv_cache, int64_t kpool,
                    at::Tensor const& out, bool validate) {
  char const* op = "expand_topk";
  guarded(op, [&] {
    TorchBatch const b = make_batch(op, row_offsets, cache_lengths, c10::nullopt);
    Cache const cache = make_cache(op, kv_cache, kpool, false);
    expect_tensor(op, "pool_ids", pool_ids, at::kInt, "int32");
    expect_dim(op, "pool_ids", pool_ids, 2, "[T, pool_topk]");
    int64_t const width =
        KPool::expand_topk_width(static_cast<int>(pool_ids.size(1)), cache.kpool(), tail_always);
    expect_tensor(op, "out", out, at::kInt, "int32");
    expect_dim(op, "out", out, 2, "[T, expand_topk_width(pool_topk, K, tail_always)]");
    expect_size(op, "out", out, 0, pool_ids.size(0), "T, pool_ids' rows");
    expect_size(op, "out", out, 1, width, "expand_topk_width(pool_topk, K, tail_always)");
    UView<std::int32_t const**> ids(pool_ids.data_ptr<int32_t>(), pool_ids.size(0),
                                    pool_ids.size(1));
    UView<std::int32_t**> ov(out.data_ptr<int32_t>(), out.size(0), out.size(1));
    locked([&](ExecSpace const& space) {
      KPool::expand_topk(space, ids, tail_always, b.batch, cache, ov, options_for(validate));
    });
  });
}

// A step's output over the caller's four tensors: pooled [capacity, D] of
// the storage type, batch_row and pool_id int32 [capacity], offsets int32
// [>= rows + 1] (read as uint32; its first rows + 1 entries are the
// output's).
template <class T>
KPool::StepOutput<T, Mem> step_output(char const* op, at::Tensor const& pooled,
                                      at::Tensor const& batch_row, at::Tensor const& pool_id,
                                      at::Tensor const& offsets, int64_t rows,
                                      at::ScalarType type, int64_t head_dim) {
  expect_tensor(op, "pooled", pooled, type, c10::toString(type));
  expect_dim(op, "pooled", pooled, 2, "[capacity, D]");
  expect_size(op, "pooled", pooled, 1, head_dim, "D");
  if (pooled.size(0) < 1) refuse(op, "pooled", "has no rows (capacity 0)");
  expect_tensor(op, "batch_row", batch_row, at::kInt, "int32");
  expect_dim(op, "batch_row", batch_row, 1, "[capacity]");
  expect_size(op, "batch_row", batch_row, 0, pooled.size(0), "capacity, pooled's rows");
  expect_tensor(op, "pool_id", pool_id, at::kInt, "int32");
  expect_dim(op, "pool_id", pool_id, 1, "[capacity]");
  expect_size(op, "pool_id", pool_id, 0, pooled.size(0), "capacity, pooled's rows");
  expect_tensor(op, "offsets", offsets, at::kInt, "int32");
  expect_dim(op, "offsets", offsets, 1, "[max_batch + 1]");
  int64_t const want = rows < 1 ? 2 : rows + 1;
  if (offsets.size(0) < want)
    refuse(op, "offsets",
           "has shape " + shape_of(offsets) + ", expected at least " + std::to_string(want) +
               " entries (B + 1)");
  using Out = KPool::StepOutput<T, Mem>;
  return Out(typename Out::pooled_type(reinterpret_cast<T*>(pooled.data_ptr()),
                                       pooled.size(0), pooled.size(1)),
             typename Out::index_type(batch_row.data_ptr<int32_t>(), batch_row.size(0)),
             typename Out::index_type(pool_id.data_ptr<int32_t>(), pool_id.size(0)),
             typename Out::offsets_type(
                 reinterpret_cast<std::uint32_t*>(offsets.data_ptr<int32_t>()), want));
}

void op_step(at::Tensor const& ring_tail, at::Tensor const& ring_state, at::Tensor const& key,
             at::Tensor const& gate, at::Tensor const& ape,
             c10::optional<at::Tensor> const& row_offsets,
             c10::optional<at::Tensor> const& cache_lengths,
             c10::optional<at::Tensor> const& positions, at::Tensor const& slot_idx,
             c10::optional<at::Tensor> const& kv_cache,
             c10::optional<at::Tensor> const& block_table, bool rotate,
             at::Tensor const& pooled, at::Tensor const& batch_row, at::Tensor const& pool_id,
             at::Tensor const& offsets, bool validate) {
  char const* op = "step";
  guarded(op, [&] {
    TorchBatch const b = make_batch(op, row_offsets, cache_lengths, positions, &slot_idx);
    expect_storage(op, "key", key);
    at::ScalarType const type = key.scalar_type();
    expect_tensor(op, "gate", gate, type, c10::toString(type));
    bool const decode = b.next_n > 0;
    expect_dim(op, "key", key, decode ? 3 : 2, decode ? "[B, next_n, D]" : "[T, D]");
    if (gate.sizes() != key.sizes())
      refuse(op, "gate", "has shape " + shape_of(gate) + ", expected key's " + shape_of(key));
    expect_tensor(op, "ape", ape, at::kFloat, "float32");
    expect_dim(op, "ape", ape, 2, "[K, D]");
    int64_t const kpool = ape.size(0), head_dim = ape.size(1);
    expect_size(op, "key", key, key.dim() - 1, head_dim, "D, ape's columns");
    if (decode) {
      expect_size(op, "key", key, 0, b.num_requests, "B, the rows of positions");
      expect_size(op, "key", key, 1, b.next_n, "next_n, the columns of positions");
    }
    expect_tensor(op, "ring_tail", ring_tail, type, c10::toString(type));
    expect_dim(op, "ring_tail", ring_tail, 4, "[max_slots, 2, R, D]");
    expect_tensor(op, "ring_state", ring_state, at::kInt, "int32");
    expect_dim(op, "ring_state", ring_state, 2, "[max_slots, 3]");
    expect_size(op, "ring_state", ring_state, 1, 3, "the 3 words of a slot's state");
    if (kv_cache.has_value() != block_table.has_value())
      refuse(op, kv_cache.has_value() ? "block_table" : "kv_cache",
             "is not given: pass kv_cache and block_table together, or neither");
    c10::optional<Cache> cache;
    UView<std::int32_t const**> table;
    if (kv_cache.has_value()) {
      cache = make_cache(op, *kv_cache, kpool, rotate);
      table = make_block_table(op, *block_table, b.num_requests);
    }
    for_storage(type, [&](auto tag) {
      using T = decltype(tag);
      using Ring = KPool::Ring<T, Mem>;
      Ring ring(typename Ring::tail_type(reinterpret_cast<T*>(ring_tail.data_ptr()),
                                         ring_tail.size(0), ring_tail.size(1),
                                         ring_tail.size(2), ring_tail.size(3)),
                typename Ring::state_type(
                    reinterpret_cast<std::uint32_t*>(ring_state.data_ptr<int32_t>()),
                    ring_state.size(0)),
                static_cast<int>(kpool));
      auto out = step_output<T>(op, pooled, batch_row, pool_id, offsets, b.num_requests, type,
                                head_dim);
      UView<float const**> av(ape.data_ptr<float>(), kpool, head_dim);
      T const* kp = reinterpret_cast<T const*>(key.data_ptr());
      T const* gp = reinterpret_cast<T const*>(gate.data_ptr());
      locked([&](ExecSpace const& space) {
        auto run = [&](auto const& kv, auto const& gv) {
          if (cache)
            KPool::step(space, ring, kv, gv, av, b.batch, KPool::paged(*cache, table), out,
                        options_for(validate));
          else
            KPool::step(space, ring, kv, gv, av, b.batch, out, options_for(validate));
        };
        if (decode)
          run(UView<T const***>(kp, key.size(0), key.size(1), key.size(2)),
              UView<T const***>(gp, key.size(0), key.size(1), key.size(2)));
        else
          run(UView<T const**>(kp, key.size(0), key.size(1)),
              UView<T const**>(gp, key.size(0), key.size(1)));
      });
    });
  });
}

void op_store_pools(at::Tensor const& pooled, at::Tensor const& batch_row,
                    at::Tensor const& pool_id, at::Tensor const& offsets,
                    c10::optional<at::Tensor> const& row_offsets,
                    c10::optional<at::Tensor> const& cache_lengths,
                    c10::optional<at::Tensor> const& positions, at::Tensor const& kv_cache,
                    at::Tensor const& block_table, int64_t kpool, bool rotate, bool validate) {
  char const* op = "store_pools";
  guarded(op, [&] {
    TorchBatch const b = make_batch(op, row_offsets, cache_lengths, positions);
    Cache cache = make_cache(op, kv_cache, kpool, rotate);
    auto const table = make_block_table(op, block_table, b.num_requests);
    expect_storage(op, "pooled", pooled);
    for_storage(pooled.scalar_type(), [&](auto tag) {
      using T = decltype(tag);
      // offsets' first B + 1 entries: the step's, for the batch's B rows.
      auto out = step_output<T>(op, pooled, batch_row, pool_id, offsets,
                                b.num_requests, pooled.scalar_type(), cache.head_dim());
      locked([&](ExecSpace const& space) {
        KPool::store_pools(space, out, b.batch, KPool::paged(cache, table),
                           options_for(validate));
      });
    });
  });
}

void op_set_workspace_limit(int64_t bytes) {
  TORCH_CHECK(bytes >= 1, "kpool.set_workspace_limit: argument 'bytes': ", bytes,
              " is not at least 1");
  std::lock_guard<std::mutex> lock(call_mutex());
  workspace_limit_bytes() = static_cast<std::size_t>(bytes);
}

void op_finalize() {
  std::lock_guard<std::mutex> lock(call_mutex());
  release_workspaces();
#if defined(KOKKOS_ENABLE_CUDA)
  stream_instances().clear();
#endif
  if (we_initialized() && Kokkos::is_initialized()) {
    Kokkos::finalize();
    we_finalized() = true;
  }
  we_initialized() = false;
}

bool op_is_initialized() { return Kokkos::is_initialized(); }

// The threads (host) or the concurrency (device) Kokkos runs with,
// initializing it first.
int64_t op_concurrency() {
  std::lock_guard<std::mutex> lock(call_mutex());
  ensure_kokkos();
  return ExecSpace().concurrency();
}

}  // namespace

// Registered for every backend (a catch-all kernel), so that a tensor on
// the wrong device reaches the ops' own check, which names it.
TORCH_LIBRARY(kpool, m) {
  m.def(
      "score(Tensor q, Tensor weights, Tensor? row_offsets, Tensor? cache_lengths, "
      "Tensor? positions, Tensor kv_cache, Tensor block_table, int kpool, bool rotate, "
      "Tensor(a!) scores, bool validate=True) -> ()",
      &op_score);
  m.def(
      "score_select(Tensor q, Tensor weights, int topk, Tensor? row_offsets, "
      "Tensor? cache_lengths, Tensor? positions, Tensor kv_cache, Tensor block_table, "
      "int kpool, bool rotate, Tensor(a!) pool_ids, bool validate=True) -> ()",
      &op_score_select);
  m.def(
      "select_tokens(Tensor q, Tensor weights, int topk, Tensor? row_offsets, "
      "Tensor? cache_lengths, Tensor? positions, Tensor kv_cache, Tensor block_table, "
      "int kpool, bool rotate, Tensor(a!) tokens, bool validate=True) -> ()",
      &op_select_tokens);
  m.def(
      "expand_topk(Tensor pool_ids, bool tail_always, Tensor row_offsets, "
      "Tensor cache_lengths, Tensor kv_cache, int kpool, Tensor(a!) out, "
      "bool validate=True) -> ()",
      &op_expand_topk);
  m.def(
      "step(Tensor(a!) ring_tail, Tensor(b!) ring_state, Tensor key, Tensor gate, Tensor ape, "
      "Tensor? row_offsets, Tensor? cache_lengths, Tensor? positions, Tensor slot_idx, "
      "Tensor(c!)? kv_cache, Tensor? block_table, bool rotate, Tensor(d!) pooled, "
      "Tensor(e!) batch_row, Tensor(f!) pool_id, Tensor(g!) offsets, bool validate=True) -> ()",
      &op_step);
  m.def(
      "store_pools(Tensor pooled, Tensor batch_row, Tensor pool_id, Tensor offsets, "
      "Tensor? row_offsets, Tensor? cache_lengths, Tensor? positions, Tensor(a!) kv_cache, "
      "Tensor block_table, int kpool, bool rotate, bool validate=True) -> ()",
      &op_store_pools);
  m.def("set_workspace_limit(int bytes) -> ()", &op_set_workspace_limit);
  m.def("_finalize() -> ()", &op_finalize);
  m.def("_is_initialized() -> bool", &op_is_initialized);
  m.def("concurrency() -> int", &op_concurrency);
}
