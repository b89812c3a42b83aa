// kpool_graph_capture: KPool steps captured into a CUDA graph (CUDA builds
// only; run by run_device.sh).
//
// Two steps with validation off (a general step mixing fresh prefills,
// chunk continuations, single-token decodes and an empty row, then a
// decode step with next_n = 2 on the same sequences) are captured with
// cudaStreamBeginCapture (global mode) on the stream of a Kokkos::Cuda
// instance. The graph is instantiated and launched twice, the ring reset to
// the same start before each launch, and every output (offsets, count,
// pooled rows, batch_row, pool_id) and the whole ring are compared bit for
// bit with the same two steps run eagerly. Once with the fused step, once
// with three launches.
//
// A launch that waits on the host (a functor passed through constant
// memory) or anything else that synchronizes breaks the capture: the
// program then names the step and exits 2. A difference in bits exits 1.
// Success prints "graph capture: OK" and exits 0.
//
// With Kokkos Kernels, a selection too: score_select (validation off, the
// automatic engine: tensor_cores on sm_80 and newer) over a rotated fp8
// cache, captured, replayed twice and compared with the eager call's
// pool_ids.

#include <KPool.hpp>

#include <Kokkos_Core.hpp>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace {

using Space = Kokkos::Cuda;
using Mem = Space::memory_space;
using T = KPool::bfloat16;

constexpr int kK = 4;
constexpr int kD = 128;
constexpr int kSlots = 8;
constexpr int kNextN = 2;

bool cuda_ok(cudaError_t e, char const* what) {
  if (e == cudaSuccess) return true;
  std::printf("graph capture: %s failed: %s\n", what, cudaGetErrorString(e));
  return false;
}

// splitmix64, so both runs see the same inputs on every machine.
std::uint64_t mix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
float uniform(std::uint64_t& s, float lo, float hi) {
  return lo + (hi - lo) * static_cast<float>(mix(s) >> 40) * 0x1.0p-24f;
}

template <class V>
void fill_random(Space const& space, V const& v, std::uint64_t seed, float lo,
                 float hi) {
  auto h = Kokkos::create_mirror_view(v);
  std::uint64_t s = seed;
  for (std::size_t i = 0; i < h.span(); ++i)
    h.data()[i] = typename V::non_const_value_type(uniform(s, lo, hi));
  Kokkos::deep_copy(space, v, h);
}

template <class V>
V index_view(Space const& space, char const* label,
             std::vector<typename V::non_const_value_type> const& values) {
  V v(Kokkos::view_alloc(space, std::string(label)), values.size());
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < values.size(); ++i) h(i) = values[i];
  Kokkos::deep_copy(space, v, h);
  return v;
}

// The two steps' inputs. General step: request r is sequence r (ring slot
// slots[r]) with cache_lengths[r] tokens before and rows[r] now.
struct Inputs {
  static constexpr int B = 6;
  std::vector<std::uint32_t> cache{0, 5, 13, 2, 7, 0};
  std::vector<std::uint32_t> rows{37, 3, 1, 0, 9, 64};
  std::vector<std::uint32_t> slots{5, 0, 3, 7, 1, 2};
  Kokkos::View<std::uint32_t*, Mem> row_offsets, cache_lengths, slot_idx;
  Kokkos::View<T**, Kokkos::LayoutRight, Mem> key, gate;
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> ape;
  Kokkos::View<T***, Kokkos::LayoutRight, Mem> dkey, dgate;
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, Mem> positions;

  explicit Inputs(Space const& space) {
    std::vector<std::uint32_t> offsets{0};
    for (int r = 0; r < B; ++r) offsets.push_back(offsets.back() + rows[r]);
    row_offsets = index_view<decltype(row_offsets)>(space, "row_offsets", offsets);
    cache_lengths = index_view<decltype(cache_lengths)>(space, "cache_lengths", cache);
    slot_idx = index_view<decltype(slot_idx)>(space, "slot_idx", slots);
    std::size_t const total = offsets.back();
    key = decltype(key)(Kokkos::view_alloc(space, "key"), total, kD);
    gate = decltype(gate)(Kokkos::view_alloc(space, "gate"), total, kD);
    ape = decltype(ape)(Kokkos::view_alloc(space, "ape"), kK, kD);
    dkey = decltype(dkey)(Kokkos::view_alloc(space, "dkey"), B, kNextN, kD);
    dgate = decltype(dgate)(Kokkos::view_alloc(space, "dgate"), B, kNextN, kD);
    positions = decltype(positions)(Kokkos::view_alloc(space, "positions"), B, kNextN);
    fill_random(space, key, 1, -2, 2);
    fill_random(space, gate, 2, -4, 4);
    fill_random(space, ape, 3, -1, 1);
    fill_random(space, dkey, 4, -2, 2);
    fill_random(space, dgate, 5, -4, 4);
    // The decode step continues every sequence; the last row's second token
    // is padding.
    auto hp = Kokkos::create_mirror_view(positions);
    for (int r = 0; r < B; ++r)
      for (int i = 0; i < kNextN; ++i)
        hp(r, i) = (r == B - 1 && i == 1) ? -1
                                          : static_cast<std::int32_t>(cache[r] + rows[r] + i);
    Kokkos::deep_copy(space, positions, hp);
  }
};

// A ring and the two steps' outputs.
struct State {
  KPool::Ring<T, Mem> ring;
  KPool::StepOutput<T, Mem> general, decode;
  State(Space const& space, std::size_t tokens)
      : ring(space, kSlots, kK, kD),
        general(space, KPool::StepOutput<T, Mem>::capacity_for(tokens, Inputs::B, kK),
                Inputs::B, kD),
        decode(space, KPool::StepOutput<T, Mem>::capacity_for(Inputs::B * kNextN, Inputs::B, kK),
               Inputs::B, kD) {}
};

void run_steps(Space const& space, State& s, Inputs const& in, bool fused) {
  KPool::Options o;
  o.validate = false;
  o.fused = fused;
  KPool::step(space, s.ring, in.key, in.gate, in.ape, in.row_offsets,
              in.cache_lengths, in.slot_idx, Inputs::B, s.general, o);
  KPool::decode_step(space, s.ring, in.dkey, in.dgate, in.ape, in.positions,
                     in.slot_idx, Inputs::B, s.decode, o);
}

// Everything a step leaves behind, on the host, as bytes.
struct Snapshot {
  std::vector<unsigned char> bytes;
  std::uint32_t general_count = 0, decode_count = 0;
};

template <class V>
void append(std::vector<unsigned char>& out, V const& v, std::size_t rows) {
  auto const h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  std::size_t const n =
      v.extent(0) == 0 ? 0 : rows * (h.span() / v.extent(0)) * sizeof(typename V::value_type);
  unsigned char const* p = reinterpret_cast<unsigned char const*>(h.data());
  out.insert(out.end(), p, p + n);
}

void append_output(Snapshot& snap, KPool::StepOutput<T, Mem> const& out,
                   std::uint32_t& count) {
  auto const offsets = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out.offsets());
  count = offsets(Inputs::B);
  append(snap.bytes, out.offsets(), Inputs::B + 1);
  append(snap.bytes, out.pooled(), count);
  append(snap.bytes, out.batch_row(), count);
  append(snap.bytes, out.pool_id(), count);
}

Snapshot snapshot(State const& s) {
  Kokkos::fence();
  Snapshot snap;
  append_output(snap, s.general, snap.general_count);
  append_output(snap, s.decode, snap.decode_count);
  append(snap.bytes, s.ring.tail(), s.ring.tail().extent(0));
  return snap;
}

// Returns 0 when both replays match the eager run, 1 on a difference, 2
// when capturing fails.
int check(Space const& space, cudaStream_t stream, Inputs const& in, bool fused) {
  char const* mode = fused ? "fused" : "three-launch";
  std::size_t const tokens = in.key.extent(0);
  State eager(space, tokens);
  run_steps(space, eager, in, fused);
  Snapshot const want = snapshot(eager);
  if (want.general_count == 0 || want.decode_count == 0) {
    std::printf("graph capture (%s): the steps closed no pool (%u, %u); the check would be empty\n",
                mode, want.general_count, want.decode_count);
    return 1;
  }

  State graph(space, tokens);
  Kokkos::fence();
  cudaGraph_t g = nullptr;
  if (!cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal),
               "cudaStreamBeginCapture"))
    return 2;
  std::string broken;
  try {
    run_steps(space, graph, in, fused);
  } catch (std::exception const& e) {
    broken = e.what();
  }
  cudaError_t const end = cudaStreamEndCapture(stream, &g);
  if (!broken.empty() || end != cudaSuccess) {
    std::printf("graph capture (%s): the steps broke the capture: %s%s\n", mode,
                broken.empty() ? "" : broken.c_str(),
                end != cudaSuccess ? cudaGetErrorString(end) : "");
    if (g) cudaGraphDestroy(g);
    return 2;
  }
  cudaGraphExec_t exec = nullptr;
  if (!cuda_ok(cudaGraphInstantiateWithFlags(&exec, g, 0), "cudaGraphInstantiate")) {
    cudaGraphDestroy(g);
    return 2;
  }
  int status = 0;
  for (int replay = 0; replay < 2 && status == 0; ++replay) {
    // The ring back to the state the eager run started from (zeros).
    Kokkos::deep_copy(space, graph.ring.tail(), T(0.0f));
    space.fence();
    if (!cuda_ok(cudaGraphLaunch(exec, stream), "cudaGraphLaunch") ||
        !cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize")) {
      status = 2;
      break;
    }
    Snapshot const got = snapshot(graph);
    if (got.general_count != want.general_count ||
        got.decode_count != want.decode_count || got.bytes != want.bytes) {
      std::size_t first = 0;
      while (first < got.bytes.size() && first < want.bytes.size() &&
             got.bytes[first] == want.bytes[first])
        ++first;
      std::printf("graph capture (%s): replay %d differs from the eager steps "
                  "(pools %u/%u vs %u/%u, first differing byte %zu of %zu)\n",
                  mode, replay, got.general_count, got.decode_count,
                  want.general_count, want.decode_count, first, want.bytes.size());
      status = 1;
    }
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
  if (status == 0)
    std::printf("graph capture (%s): 2 steps, %u + %u pools, 2 replays bit-identical to eager\n",
                mode, want.general_count, want.decode_count);
  return status;
}

// One score_select call (decode rows and a prefill chunk) captured and
// replayed against the eager call.
int check_select(Space const& space, cudaStream_t stream) {
  using C = KPool::float8_e4m3;
  constexpr int H = 32, topk = 64, block_pools = 64;
  std::vector<std::uint32_t> cache{4000, 813, 0, 2047};
  std::vector<std::uint32_t> rows{1, 1, 40, 17};
  int const B = static_cast<int>(rows.size());
  std::vector<std::uint32_t> offsets{0};
  int max_blocks = 1, blocks = 0;
  std::size_t max_visible = 1;
  for (int r = 0; r < B; ++r) {
    offsets.push_back(offsets.back() + rows[r]);
    std::size_t const vis = (cache[r] + rows[r]) / kK;
    max_visible = vis > max_visible ? vis : max_visible;
    int const need = static_cast<int>((vis + block_pools - 1) / block_pools);
    max_blocks = need > max_blocks ? need : max_blocks;
    blocks += need;
  }
  std::size_t const T_rows = offsets.back();
  auto row_offsets = index_view<Kokkos::View<std::uint32_t*, Mem>>(space, "sel_offsets", offsets);
  auto cache_lengths = index_view<Kokkos::View<std::uint32_t*, Mem>>(space, "sel_lengths", cache);
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, Mem> table(
      Kokkos::view_alloc(space, "sel_table"), B, max_blocks);
  auto ht = Kokkos::create_mirror_view(table);
  int next = 0;
  for (int r = 0; r < B; ++r) {
    int const need = static_cast<int>(((cache[r] + rows[r]) / kK + block_pools - 1) / block_pools);
    for (int j = 0; j < max_blocks; ++j) ht(r, j) = j < need ? (next++ * 7) % blocks : -1;
  }
  Kokkos::deep_copy(space, table, ht);
  KPool::PoolCache<C, Mem> pools(space, blocks, block_pools, kD, kK, KPool::CacheScale::amax, true);
  fill_random(space, pools.values(), 11, -400, 400);
  fill_random(space, pools.scales(), 12, 0.001f, 0.01f);
  Kokkos::View<T***, Kokkos::LayoutRight, Mem> q(Kokkos::view_alloc(space, "sel_q"), T_rows, H, kD);
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> w(Kokkos::view_alloc(space, "sel_w"), T_rows, H);
  fill_random(space, q, 13, -1, 1);
  fill_random(space, w, 14, -0.5f, 1);
  // Without validation the workspace holds every pool the table addresses.
  std::size_t const table_pools = static_cast<std::size_t>(max_blocks) * block_pools;
  KPool::SelectWorkspace<T, Mem> ws(space, T_rows, table_pools > max_visible ? table_pools : max_visible, H, kD);
  using Ids = Kokkos::View<std::int32_t**, Kokkos::LayoutRight, Mem>;
  Ids want_ids(Kokkos::view_alloc(space, "sel_want"), T_rows, topk);
  Ids got_ids(Kokkos::view_alloc(space, "sel_got"), T_rows, topk);
  KPool::Options o;
  o.validate = false;
  auto select = [&](Ids const& out) {
    KPool::score_select(space, row_offsets, cache_lengths, table, B, kK, q, w, pools, topk,
                        out, ws, o);
  };
  select(want_ids);
  space.fence();
  cudaGraph_t g = nullptr;
  if (!cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal),
               "cudaStreamBeginCapture"))
    return 2;
  std::string broken;
  try {
    select(got_ids);
  } catch (std::exception const& e) {
    broken = e.what();
  }
  cudaError_t const end = cudaStreamEndCapture(stream, &g);
  if (!broken.empty() || end != cudaSuccess) {
    std::printf("graph capture (select): the selection broke the capture: %s%s\n",
                broken.empty() ? "" : broken.c_str(),
                end != cudaSuccess ? cudaGetErrorString(end) : "");
    if (g) cudaGraphDestroy(g);
    return 2;
  }
  cudaGraphExec_t exec = nullptr;
  if (!cuda_ok(cudaGraphInstantiateWithFlags(&exec, g, 0), "cudaGraphInstantiate")) {
    cudaGraphDestroy(g);
    return 2;
  }
  auto const want = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), want_ids);
  int status = 0;
  for (int replay = 0; replay < 2 && status == 0; ++replay) {
    Kokkos::deep_copy(space, got_ids, -7);
    space.fence();
    if (!cuda_ok(cudaGraphLaunch(exec, stream), "cudaGraphLaunch") ||
        !cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize")) {
      status = 2;
      break;
    }
    auto const got = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), got_ids);
    for (std::size_t i = 0; i < got.span(); ++i)
      if (got.data()[i] != want.data()[i]) {
        std::printf("graph capture (select): replay %d differs at row %zu column %zu\n",
                    replay, i / topk, i % topk);
        status = 1;
        break;
      }
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
  if (status == 0)
    std::printf("graph capture (select): score_select (%zu rows, engine %s), 2 replays "
                "identical to eager\n",
                T_rows,
                KPool::Details::mma_plan<Space, T, C>(true).on_device ? "tensor_cores"
                                                                       : "team_gemm");
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard guard(argc, argv);
  cudaStream_t stream = nullptr;
  if (!cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
               "cudaStreamCreate"))
    return 2;
  int status = 0;
  {
    // The instance runs on our stream, so its launches are what we capture.
    Space space(stream);
    Inputs const in(space);
    space.fence();
    for (bool fused : {true, false}) {
      int const s = check(space, stream, in, fused);
      status = s > status ? s : status;
    }
    int const s = check_select(space, stream);
    status = s > status ? s : status;
  }
  cudaStreamDestroy(stream);
  std::printf("graph capture: %s\n", status == 0 ? "OK" : "FAILED");
  return status;
}
