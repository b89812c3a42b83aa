// kpool_graph_capture: KPool calls captured into a CUDA graph and replayed
// (run by run_device.sh on a GPU; on every other backend, the ctest
// graph_capture, label unit, replays them as eager calls, which holds the
// rest of the contract: the same launches on the same buffers give the
// same bits every time).
//
// Two steps with validation off (a general step mixing fresh prefills,
// chunk continuations, single-token decodes and an empty row, then a
// decode step with next_n = 2 on the same sequences) are recorded, on CUDA
// with cudaStreamBeginCapture (global mode) on the stream of a Kokkos::Cuda
// instance. They are replayed twice, the ring reset to the same start
// before each, and every output (offsets, count, pooled rows, batch_row,
// pool_id) and the whole ring are compared bit for bit with the same two
// steps run eagerly. Once with the fused step, once with three launches.
//
// Then the selections: score_select over a rotated fp8 cache (validation
// off, the automatic engine: tensor_cores on sm_80 and newer) on a ragged
// batch, and on a decode batch (the form a serving engine's decode step
// takes) with the fused one-launch path and the separate one (the
// default). Each is recorded once and replayed 3 times, an eager
// selection on other queries on the same workspace before each replay;
// every replay must give the eager call's pool ids. The fused path keeps
// its counters in the workspace and puts them back to zero for the next
// call: a replay after other calls shows that it did.
//
// A launch that waits on the host (a functor passed through constant
// memory) or anything else that synchronizes breaks the capture: the
// program then names the call and exits 2. A difference in bits exits 1.
// Success prints "graph capture: OK" and exits 0.

#include <KPool.hpp>

#include <Kokkos_Core.hpp>
#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime.h>
#endif

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
using T = KPool::bfloat16;
#if defined(KOKKOS_ENABLE_CUDA)
constexpr bool kCuda = std::is_same<Space, Kokkos::Cuda>::value;
using Stream = cudaStream_t;
#else
constexpr bool kCuda = false;
using Stream = void*;
#endif

constexpr int kK = 4;
constexpr int kD = 128;
constexpr int kSlots = 8;
constexpr int kNextN = 2;

// Calls recorded once and replayed: on CUDA a graph captured on the
// instance's stream; elsewhere the calls themselves, run again at each
// replay.
class Recorded {
 public:
  Recorded(Space const& space, Stream stream) : space_(space), stream_(stream) {}
  Recorded(Recorded const&) = delete;
  Recorded& operator=(Recorded const&) = delete;
  ~Recorded() {
#if defined(KOKKOS_ENABLE_CUDA)
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
#endif
  }

  // "" when recorded, else why the calls broke the capture.
  std::string record(std::function<void()> const& calls) {
    space_.fence();
    if constexpr (kCuda) {
#if defined(KOKKOS_ENABLE_CUDA)
      cudaError_t e = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal);
      if (e != cudaSuccess) return std::string("cudaStreamBeginCapture: ") + cudaGetErrorString(e);
      std::string broken;
      try {
        calls();
      } catch (std::exception const& x) {
        broken = x.what();
      }
      e = cudaStreamEndCapture(stream_, &graph_);
      if (broken.empty() && e != cudaSuccess) broken = cudaGetErrorString(e);
      if (broken.empty() && cudaGraphInstantiateWithFlags(&exec_, graph_, 0) != cudaSuccess)
        broken = "cudaGraphInstantiate failed";
      return broken;
#endif
    } else {
      calls_ = calls;
    }
    return "";
  }

  // Runs the recorded calls once and waits for them; false on a CUDA error.
  bool replay() {
    if constexpr (kCuda) {
#if defined(KOKKOS_ENABLE_CUDA)
      cudaError_t e = cudaGraphLaunch(exec_, stream_);
      if (e == cudaSuccess) e = cudaStreamSynchronize(stream_);
      if (e != cudaSuccess) {
        std::printf("graph capture: replay failed: %s\n", cudaGetErrorString(e));
        return false;
      }
#endif
    } else {
      calls_();
      space_.fence();
    }
    return true;
  }

 private:
  Space space_;
  Stream stream_;
  std::function<void()> calls_;
#if defined(KOKKOS_ENABLE_CUDA)
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
#endif
};

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
  KPool::step(space, s.ring, in.key, in.gate, in.ape,
              KPool::ragged_batch(in.row_offsets, in.cache_lengths, in.slot_idx, Inputs::B),
              s.general, o);
  KPool::step(space, s.ring, in.dkey, in.dgate, in.ape,
              KPool::decode_batch(in.positions, in.slot_idx, Inputs::B), s.decode, o);
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
int check(Space const& space, Stream stream, Inputs const& in, bool fused) {
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
  Recorded rec(space, stream);
  std::string const broken = rec.record([&] { run_steps(space, graph, in, fused); });
  if (!broken.empty()) {
    std::printf("graph capture (%s): the steps broke the capture: %s\n", mode, broken.c_str());
    return 2;
  }
  for (int replay = 0; replay < 2; ++replay) {
    // The ring back to the state the eager run started from: zeros, every
    // slot holding nothing.
    Kokkos::deep_copy(space, graph.ring.tail(), T(0.0f));
    graph.ring.reset(space);
    space.fence();
    if (!rec.replay()) return 2;
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
      return 1;
    }
  }
  std::printf("graph capture (%s): 2 steps, %u + %u pools, 2 replays bit-identical to eager\n",
              mode, want.general_count, want.decode_count);
  return 0;
}

// The selections' inputs: a rotated fp8 cache of four requests' pools
// (cache lengths 4000, 813, 0 and 2047; block i of row r at (7 * n) % blocks),
// bf16 queries, one workspace.
struct Selection {
  using C = KPool::float8_e4m3;
  static constexpr int H = 32, topk = 64, block_pools = 64, B = 4;
  std::vector<std::uint32_t> cache{4000, 813, 0, 2047};
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, Mem> table;
  KPool::PoolCache<C, Mem> pools;
  KPool::SelectWorkspace<T, Mem> ws;

  explicit Selection(Space const& space) {
    int max_blocks = 1, blocks = 0;
    std::vector<int> need(B);
    for (int r = 0; r < B; ++r) {
      // The ragged rows (below) and a decode row of 3 tokens see at most
      // (c + 40) / K pools.
      std::size_t const vis = (cache[r] + 40) / kK;
      need[r] = static_cast<int>((vis + block_pools - 1) / block_pools);
      max_blocks = need[r] > max_blocks ? need[r] : max_blocks;
      blocks += need[r];
    }
    table = decltype(table)(Kokkos::view_alloc(space, "sel_table"), B, max_blocks);
    auto ht = Kokkos::create_mirror_view(table);
    int next = 0;
    for (int r = 0; r < B; ++r)
      for (int j = 0; j < max_blocks; ++j) ht(r, j) = j < need[r] ? (next++ * 7) % blocks : -1;
    Kokkos::deep_copy(space, table, ht);
    pools = KPool::PoolCache<C, Mem>(space, blocks, block_pools, kD, kK,
                                     KPool::CacheScale::amax, true);
    fill_random(space, pools.values(), 11, -400, 400);
    fill_random(space, pools.scales(), 12, 0.001f, 0.01f);
    // Without validation the workspace holds every pool the table
    // addresses (docs/validation.md); 64 rows, a chunk of them.
    ws = KPool::SelectWorkspace<T, Mem>(
        space, 64, static_cast<std::size_t>(max_blocks) * block_pools, H, kD);
  }

  Kokkos::View<T***, Kokkos::LayoutRight, Mem> queries(Space const& space, std::size_t rows,
                                                       std::uint64_t seed) const {
    Kokkos::View<T***, Kokkos::LayoutRight, Mem> q(Kokkos::view_alloc(space, "sel_q"), rows,
                                                   H, kD);
    fill_random(space, q, seed, -1, 1);
    return q;
  }
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> weights(Space const& space, std::size_t rows,
                                                          std::uint64_t seed) const {
    Kokkos::View<float**, Kokkos::LayoutRight, Mem> w(Kokkos::view_alloc(space, "sel_w"), rows,
                                                      H);
    fill_random(space, w, seed, -0.5f, 1);
    return w;
  }
};

using Ids = Kokkos::View<std::int32_t**, Kokkos::LayoutRight, Mem>;

// `select(q, w, out)` recorded once on the queries (q, w) and replayed 3
// times, an eager call on other queries (q2, w2) into another output
// before each; every replay must give the eager call's ids.
template <class Select, class Q, class W>
int replay_select(Space const& space, Stream stream, char const* what, std::size_t rows,
                  Select const& select, Q const& q, W const& w, Q const& q2, W const& w2) {
  int const topk = Selection::topk;
  Ids want(Kokkos::view_alloc(space, "sel_want"), rows, topk);
  Ids got(Kokkos::view_alloc(space, "sel_got"), rows, topk);
  Ids other(Kokkos::view_alloc(space, "sel_other"), rows, topk);
  select(q, w, want);
  space.fence();
  auto const want_h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), want);
  int selected = 0;
  for (std::size_t i = 0; i < want_h.span(); ++i) selected += want_h.data()[i] >= 0 ? 1 : 0;
  if (selected == 0) {
    std::printf("graph capture (%s): the eager selection is empty; the check would be too\n",
                what);
    return 1;
  }
  Recorded rec(space, stream);
  std::string const broken = rec.record([&] { select(q, w, got); });
  if (!broken.empty()) {
    std::printf("graph capture (%s): the selection broke the capture: %s\n", what,
                broken.c_str());
    return 2;
  }
  for (int replay = 0; replay < 3; ++replay) {
    select(q2, w2, other);  // other queries, the same workspace
    Kokkos::deep_copy(space, got, -7);
    space.fence();
    if (!rec.replay()) return 2;
    auto const h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), got);
    for (std::size_t i = 0; i < h.span(); ++i)
      if (h.data()[i] != want_h.data()[i]) {
        std::printf("graph capture (%s): replay %d differs at row %zu column %zu "
                    "(%d, eager %d)\n",
                    what, replay, i / topk, i % topk, h.data()[i], want_h.data()[i]);
        return 1;
      }
  }
  std::printf("graph capture (%s): %zu rows, engine %s, 3 replays after other calls "
              "identical to eager\n",
              what, rows,
              KPool::Details::mma_plan<Space, T, Selection::C>(true).on_device ? "tensor_cores"
                                                                                : "automatic");
  return 0;
}

// score_select on a ragged batch (two decode rows, a prefill chunk of 40,
// a continuation of 17), then on a decode batch (next_n = 3, the last row
// padded), fused and separate.
int check_select(Space const& space, Stream stream) {
  Selection sel(space);
  int const B = Selection::B, topk = Selection::topk;
  KPool::Options o;
  o.validate = false;
  int status = 0;
  {
    std::vector<std::uint32_t> rows{1, 1, 40, 17}, offsets{0};
    for (int r = 0; r < B; ++r) offsets.push_back(offsets.back() + rows[r]);
    auto ro = index_view<Kokkos::View<std::uint32_t*, Mem>>(space, "sel_offsets", offsets);
    auto cl = index_view<Kokkos::View<std::uint32_t*, Mem>>(space, "sel_lengths", sel.cache);
    std::size_t const n = offsets.back();
    auto const select = [&](auto const& q, auto const& w, Ids const& out) {
      KPool::score_select(space, q, w, topk, KPool::ragged_batch(ro, cl, B),
                          KPool::paged(sel.pools, sel.table), out, sel.ws, o);
    };
    int const st = replay_select(space, stream, "ragged select", n, select,
                                 sel.queries(space, n, 13), sel.weights(space, n, 14),
                                 sel.queries(space, n, 15), sel.weights(space, n, 16));
    status = st > status ? st : status;
  }
  int const next_n = 3;
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, Mem> positions(
      Kokkos::view_alloc(space, "sel_positions"), B, next_n);
  auto hp = Kokkos::create_mirror_view(positions);
  for (int r = 0; r < B; ++r)
    for (int i = 0; i < next_n; ++i)
      hp(r, i) = (r == B - 1 && i == next_n - 1) ? -1
                                                 : static_cast<std::int32_t>(sel.cache[r] + i);
  Kokkos::deep_copy(space, positions, hp);
  std::size_t const n = static_cast<std::size_t>(B) * next_n;
  for (KPool::DecodeSelection how :
       {KPool::DecodeSelection::fused, KPool::DecodeSelection::separate}) {
    KPool::Options p = o;
    p.decode_selection = how;
    auto const select = [&](auto const& q, auto const& w, Ids const& out) {
      KPool::score_select(space, q, w, topk, KPool::decode_batch(positions, B),
                          KPool::paged(sel.pools, sel.table), out, sel.ws, p);
    };
    char const* what = how == KPool::DecodeSelection::separate
                           ? "decode select, separate"
                           : "decode select, fused";
    int const st = replay_select(space, stream, what, n, select, sel.queries(space, n, 17),
                                 sel.weights(space, n, 18), sel.queries(space, n, 19),
                                 sel.weights(space, n, 20));
    status = st > status ? st : status;
  }
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard guard(argc, argv);
  Stream stream = nullptr;
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (kCuda) {
    cudaError_t const e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
      std::printf("graph capture: cudaStreamCreate failed: %s\n", cudaGetErrorString(e));
      return 2;
    }
  }
#endif
  int status = 0;
  {
    // On CUDA the instance runs on our stream, so its launches are what we
    // capture.
    Space space = [&] {
#if defined(KOKKOS_ENABLE_CUDA)
      if constexpr (kCuda) return Space(stream);
#endif
      return Space();
    }();
    Inputs const in(space);
    space.fence();
    for (bool fused : {true, false}) {
      int const s = check(space, stream, in, fused);
      status = s > status ? s : status;
    }
    int const s = check_select(space, stream);
    status = s > status ? s : status;
  }
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (kCuda) cudaStreamDestroy(stream);
#endif
  std::printf("graph capture: %s\n", status == 0 ? "OK" : "FAILED");
  return status;
}
