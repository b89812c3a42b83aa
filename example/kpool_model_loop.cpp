// A whole model's indexer, served in miniature: several layers, each a
// KPool::Layer with an fp8 cache in the serving profile, in the fused
// layout (DeepGEMM's) over the engine's own buffer, all sharing one
// selection workspace. A forward pass runs the layers in order, and each
// layer's step and selection are queued before the next layer's, so the
// layers take turns with the workspace on one execution space instance.
//
//  1. Chunked prefill: three sequences with prompts of 29, 11 and 42 tokens
//     arrive together and are prefilled in chunks of at most 16 tokens a
//     sequence (Layer::step): chunks end mid-pool, and a sequence that has
//     finished its prompt leaves the batch.
//  2. Speculative decoding: each round (a decode batch) a sequence sends
//     its next token and 2 drafts; the verifier accepts some of the drafts
//     and the next round re-sends from the first rejected one (a rewind,
//     safe with the layer's ring of Ring::serving_length(K, 2) positions).
//     A rejected draft carries other keys and queries than the token that
//     replaces it.
//  3. After every step, every layer selects for every token the step sent
//     (Layer::select_tokens): the best pools of its cache, expanded to the
//     token positions sparse attention reads.
//
// Checks, on every selection of every layer:
//  - the token rows are a selection: min(topk, visible) pools, each one the
//    query can see (p < floor((pos + 1) / K)), in ascending order, each
//    expanded to its K positions, unused slots -1, then the positions of the
//    query's incomplete pool;
//  - the model with the shared workspace selects exactly what a second
//    model selects whose layers each own a workspace big enough for a whole
//    call (so sharing it, and selecting in row chunks of the shared one,
//    changes nothing).
// Any failure prints what differs and exits with status 1; success ends
// with OK.
//
// Usage: kpool_model_loop [layers] [--selections FILE]   (default 4 layers)
// --selections FILE writes every selection, a line a query token of each
// layer ("layer L seq S pos P" and its token row), in call order: what
// python/examples/indexer.py --stand-ins writes for the same schedule.

#include <KPool.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>


namespace {

using T = KPool::bfloat16;      // keys, gates and queries
using C = KPool::float8_e4m3;   // the cache: fp8 with one f32 scale a pool
using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
using Layer = KPool::Layer<T, C, Mem>;
using Workspace = KPool::SelectWorkspace<T, Mem>;
using Tokens = Kokkos::View<std::int32_t**, Kokkos::LayoutRight, Kokkos::HostSpace>;

constexpr int K = 4;             // tokens per pool
constexpr int D = 128;           // channels of a key and of a query head
constexpr int H = 8;             // indexer query heads
constexpr int kTopk = 3;         // pools selected per query token
constexpr int kDrafts = 2;       // drafts a decode row sends besides the next token
constexpr int kNextN = 1 + kDrafts;
constexpr int kChunk = 16;       // prefill tokens a sequence sends per step
constexpr int kMaxBatch = 3;
constexpr int kMaxTokens = kMaxBatch * kChunk;  // >= kMaxBatch * kNextN too
constexpr int kMaxContext = 96;  // the longest sequence, in tokens
constexpr int kBlockPools = 4;
constexpr int kBlocksPerSeq = kMaxContext / K / kBlockPools;
constexpr int kSelectRows = 16;  // the shared workspace's rows: selections run in chunks
constexpr int kRounds = 5;       // speculative rounds

// --selections FILE: where every selection is written (null: nowhere).
std::FILE* selections_out = nullptr;

void require(bool ok, std::string const& what) {
  if (!ok) {
    std::printf("FAILED: %s\n", what.c_str());
    std::exit(1);
  }
}

// Stand-ins for what the model computes: a deterministic value in [-1, 1)
// for (layer, sequence, position, channel, kind), kind 0 a key, 1 a gate
// score, 2 a query, 3 a head weight, 4 ape. A rejected draft's values are
// other values than those of the token later sent at its position.
float model_value(int layer, int seq, int pos, int channel, int kind, bool rejected = false) {
  std::uint64_t x = static_cast<std::uint64_t>(layer + 1) << 56 ^
                    static_cast<std::uint64_t>(seq + 1) << 48 ^
                    static_cast<std::uint64_t>(pos + 1) << 24 ^
                    static_cast<std::uint64_t>(channel) << 4 ^
                    static_cast<std::uint64_t>(kind) << 1 ^ (rejected ? 1u : 0u);
  for (int round = 0; round < 2; ++round) {
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 29;
  }
  return static_cast<float>(x >> 40) / 8388608.0f - 1.0f;
}

struct Sequence {
  int id;
  int prompt;      // prompt tokens
  int length = 0;  // tokens accepted so far
};

// One batch row of a call: positions [start, start + count) of a
// sequence; the first `right` of them are the sequence's own tokens, the
// rest rejected drafts.
struct Row {
  Sequence const* seq;
  int start;
  int count;
  int right;
};

// A call's batch, described once on the device for every layer (a layer
// keeps references to these views until its selection is queued).
struct Call {
  bool decode = false;  // a decode batch (each row next_n tokens) or a ragged one
  std::vector<Row> rows;
  int query_rows = 0;   // the step's tokens: the selection's query rows
  Kokkos::View<std::uint32_t*, Mem> row_offsets, cache_lengths, slot_idx;
  Kokkos::View<std::int32_t**, Mem> positions, block_table;
};

Kokkos::View<std::uint32_t*, Mem> device_u32(std::string const& label,
                                             std::vector<std::uint32_t> const& v) {
  Kokkos::View<std::uint32_t*, Mem> d(label, v.size());
  auto h = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < v.size(); ++i) h(i) = v[i];
  Kokkos::deep_copy(d, h);
  return d;
}

// Sequence s uses ring slot s and cache blocks [s * kBlocksPerSeq, ...) in
// every layer.
Call make_call(bool decode, std::vector<Row> const& rows) {
  Call call;
  call.decode = decode;
  call.rows = rows;
  int const B = static_cast<int>(rows.size());
  std::vector<std::uint32_t> offsets{0}, lengths, slots;
  for (Row const& r : rows) {
    offsets.push_back(offsets.back() + static_cast<std::uint32_t>(r.count));
    lengths.push_back(static_cast<std::uint32_t>(r.start));
    slots.push_back(static_cast<std::uint32_t>(r.seq->id));
  }
  call.query_rows = static_cast<int>(offsets.back());
  call.row_offsets = device_u32("row_offsets", offsets);
  call.cache_lengths = device_u32("cache_lengths", lengths);
  call.slot_idx = device_u32("slot_idx", slots);
  call.block_table = Kokkos::View<std::int32_t**, Mem>("block_table", B, kBlocksPerSeq);
  auto table = Kokkos::create_mirror_view(call.block_table);
  for (int r = 0; r < B; ++r)
    for (int b = 0; b < kBlocksPerSeq; ++b) table(r, b) = rows[r].seq->id * kBlocksPerSeq + b;
  Kokkos::deep_copy(call.block_table, table);
  if (decode) {
    call.positions = Kokkos::View<std::int32_t**, Mem>("positions", B, kNextN);
    auto pos = Kokkos::create_mirror_view(call.positions);
    for (int r = 0; r < B; ++r)
      for (int i = 0; i < kNextN; ++i) pos(r, i) = rows[r].start + i;
    Kokkos::deep_copy(call.positions, pos);
  }
  return call;
}

// The model: its layers, in order.
struct Model {
  // The engine's pool caches, one allocation for every layer: layer l's
  // blocks are engine_cache(l, :, :), block_pools * (D + 4) bytes a block
  // (the entries, then their f32 scales). The layers adopt them in place.
  Kokkos::View<std::uint8_t***, Kokkos::LayoutRight, Mem> engine_cache;
  std::vector<Layer> layers;
};

// `shared`: every layer selects with this workspace; empty, each layer
// allocates its own (LayerConfig::select_rows rows, here max_tokens).
Model make_model(Exec const& space, int num_layers, Workspace const& shared) {
  KPool::LayerConfig config;
  config.kpool = K;
  config.head_dim = D;
  config.num_heads = H;
  config.max_slots = kMaxBatch;
  config.drafts = kDrafts;  // ring length Ring::serving_length(K, kDrafts)
  config.max_batch = kMaxBatch;
  config.max_tokens = kMaxTokens;
  config.num_blocks = kMaxBatch * kBlocksPerSeq;
  config.block_pools = kBlockPools;
  config.profile = KPool::CacheProfile::serving;  // fp8, pow2 scales: the engines' bytes
  config.layout = KPool::CacheLayout::fused;       // entries and scales in one buffer
  config.rotate = true;
  config.max_context = kMaxContext;  // rows see at most ceil(96 / K) = 24 pools
  Model model;
  std::size_t const block_bytes = static_cast<std::size_t>(kBlockPools) * (D + 4);
  model.engine_cache = decltype(model.engine_cache)(
      Kokkos::view_alloc(space, "engine_kv_cache"), num_layers, config.num_blocks, block_bytes);
  using EngineBytes = Kokkos::View<std::uint8_t**, Kokkos::LayoutRight, Mem,
                                   Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  model.layers.reserve(static_cast<std::size_t>(num_layers));
  for (int l = 0; l < num_layers; ++l) {
    Kokkos::View<float**, Mem> ape("ape", K, D);
    auto h = Kokkos::create_mirror_view(ape);
    for (int m = 0; m < K; ++m)
      for (int c = 0; c < D; ++c) h(m, c) = 0.5f * model_value(l, 0, m, c, 4);
    Kokkos::deep_copy(ape, h);
    KPool::LayerBuffers<T, C, Mem> buffers;
    buffers.workspace = shared;  // empty: the layer allocates its own
    // The layer's cache is its slice of the engine's buffer, adopted in place.
    buffers.cache = KPool::PoolCache<C, Mem>(
        EngineBytes(&model.engine_cache(l, 0, 0), config.num_blocks, block_bytes), kBlockPools,
        D, K, config.rotate);
    model.layers.emplace_back(space, config, ape, buffers);
  }
  return model;
}

// Fills `v`, a LayoutRight view whose leading extents hold the call's
// `rows` query rows in order, with value(t, i), the i-th value of row t: a
// stand-in for a tensor the model wrote.
template <class V, class F>
V filled(V const& v, std::size_t rows, F const& value) {
  auto h = Kokkos::create_mirror_view(v);
  std::size_t const width = h.size() / rows;
  for (std::size_t t = 0; t < rows; ++t)
    for (std::size_t i = 0; i < width; ++i) h.data()[t * width + i] = value(t, i);
  Kokkos::deep_copy(v, h);
  return v;
}

// One forward pass over the call: for each layer in turn, its step and
// then its selection, as a model runs a layer's indexer before that
// layer's sparse attention and the next layer. Returns each layer's token
// rows.
std::vector<Tokens> forward(Exec const& space, Model& model, Call const& call) {
  // Query row t of the call: its batch row and position.
  std::vector<Row const*> row_of;
  std::vector<int> pos_of;
  for (Row const& r : call.rows)
    for (int i = 0; i < r.count; ++i) {
      row_of.push_back(&r);
      pos_of.push_back(r.start + i);
    }
  std::size_t const rows = static_cast<std::size_t>(call.query_rows);
  std::size_t const B = call.rows.size();
  int const width = KPool::select_tokens_width(kTopk, K);
  std::vector<Tokens> selected;
  for (int l = 0; l < static_cast<int>(model.layers.size()); ++l) {
    Layer& layer = model.layers[l];
    auto value = [&](int kind, std::size_t t, std::size_t i) {
      Row const& r = *row_of[t];
      bool const rejected = pos_of[t] - r.start >= r.right;
      return model_value(l, r.seq->id, pos_of[t], static_cast<int>(i), kind, rejected);
    };
    auto key = [&](std::size_t t, std::size_t c) { return T(value(0, t, c)); };
    auto gate = [&](std::size_t t, std::size_t c) { return T(value(1, t, c)); };
    if (call.decode) {  // key, gate [B, next_n, D]
      using V3 = Kokkos::View<T***, Kokkos::LayoutRight, Mem>;
      V3 const k = filled(V3("key", B, kNextN, D), rows, key);
      V3 const g = filled(V3("gate", B, kNextN, D), rows, gate);
      layer.step(space, k, g,
                 KPool::decode_batch(call.positions, call.slot_idx, static_cast<int>(B)),
                 call.block_table);
    } else {  // key, gate [tokens, D]
      using V2 = Kokkos::View<T**, Kokkos::LayoutRight, Mem>;
      V2 const k = filled(V2("key", rows, D), rows, key);
      V2 const g = filled(V2("gate", rows, D), rows, gate);
      layer.step(space, k, g,
                 KPool::ragged_batch(call.row_offsets, call.cache_lengths, call.slot_idx,
                                     static_cast<int>(B)),
                 call.block_table);
    }
    // The selection for every token the step sent: q [rows, H, D] (value
    // i of row t is head i / D, channel i % D), weights [rows, H].
    auto const q = filled(Kokkos::View<T***, Kokkos::LayoutRight, Mem>("q", rows, H, D), rows,
                          [&](std::size_t t, std::size_t i) { return T(value(2, t, i)); });
    auto const weights =
        filled(Kokkos::View<float**, Kokkos::LayoutRight, Mem>("weights", rows, H), rows,
               [&](std::size_t t, std::size_t h) { return value(3, t, h); });
    Kokkos::View<std::int32_t**, Kokkos::LayoutRight, Mem> tokens("tokens", rows, width);
    layer.select_tokens(space, q, weights, kTopk, tokens);
    selected.push_back(Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), tokens));
  }
  space.fence();  // (on a host space the mirrors are the views themselves)
  return selected;
}

// Row t at position pos is a selection: see the header.
void check_selection(Tokens const& tok, std::size_t t, int pos, std::string const& where) {
  int const visible = (pos + 1) / K, used = std::min(kTopk, visible);
  int previous = -1;
  for (int j = 0; j < kTopk; ++j) {
    int const first = tok(t, j * K);
    int const p = first < 0 ? -1 : first / K;
    if (j < used)
      require(first >= 0 && first % K == 0 && p < visible && p > previous,
              where + ": slot " + std::to_string(j) + " holds token " + std::to_string(first) +
                  ", not the first token of a new visible pool (" + std::to_string(visible) +
                  " visible)");
    else
      require(first == -1, where + ": slot " + std::to_string(j) + " is used, but only " +
                                std::to_string(visible) + " pools are visible");
    for (int m = 0; m < K; ++m)
      require(tok(t, j * K + m) == (p < 0 ? -1 : p * K + m),
              where + ": slot " + std::to_string(j) + " is not pool " + std::to_string(p) +
                  " expanded");
    previous = p;
  }
  for (int m = 0; m < K - 1; ++m) {
    int const expect = m < (pos + 1) % K ? visible * K + m : -1;
    require(tok(t, kTopk * K + m) == expect,
            where + ": tail column " + std::to_string(m) + " holds " +
                std::to_string(tok(t, kTopk * K + m)) + ", expected " + std::to_string(expect));
  }
}

// Runs the call through both models and checks every layer's selection.
void serve(Exec const& space, Model& model, Model& witness, Call const& call,
           std::string const& what) {
  std::vector<Tokens> const got = forward(space, model, call);
  std::vector<Tokens> const want = forward(space, witness, call);
  int const width = KPool::select_tokens_width(kTopk, K);
  for (std::size_t l = 0; l < got.size(); ++l) {
    std::size_t t = 0;
    for (Row const& r : call.rows)
      for (int i = 0; i < r.count; ++i, ++t) {
        std::string const where = what + ", layer " + std::to_string(l) + ", sequence " +
                                  std::to_string(r.seq->id) + " position " +
                                  std::to_string(r.start + i);
        check_selection(got[l], t, r.start + i, where);
        for (int j = 0; j < width; ++j)
          require(got[l](t, j) == want[l](t, j),
                  where + ": the shared workspace selected otherwise than a layer's own");
      }
  }
  if (selections_out)
    for (std::size_t l = 0; l < got.size(); ++l) {
      std::size_t t = 0;
      for (Row const& r : call.rows)
        for (int i = 0; i < r.count; ++i, ++t) {
          std::fprintf(selections_out, "layer %zu seq %d pos %d", l, r.seq->id, r.start + i);
          for (int j = 0; j < width; ++j) std::fprintf(selections_out, " %d", got[l](t, j));
          std::fprintf(selections_out, "\n");
        }
    }
  // What the last token of the call reads in the first and the last layer.
  std::size_t const last = static_cast<std::size_t>(call.query_rows) - 1;
  std::printf("%-40s %3d tokens; last one's pools:", what.c_str(), call.query_rows);
  for (std::size_t l = 0; l < got.size(); l += std::max<std::size_t>(1, got.size() - 1)) {
    std::printf(" layer %zu {", l);
    for (int j = 0; j < kTopk; ++j)
      if (got[l](last, j * K) >= 0) std::printf(" %d", got[l](last, j * K) / K);
    std::printf(" }");
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char* argv[]) {
  Kokkos::ScopeGuard guard(argc, argv);
  int num_layers = 4;
  for (int a = 1; a < argc; ++a) {
    std::string const arg = argv[a];
    if (arg == "--selections" && a + 1 < argc) {
      selections_out = std::fopen(argv[++a], "w");
      require(selections_out != nullptr, std::string("cannot write ") + argv[a]);
    } else {
      num_layers = std::atoi(argv[a]);
    }
  }
  require(num_layers >= 1, "the number of layers must be at least 1");
  Exec space;
  std::printf("KPool %s model loop: %d layers, K=%d, D=%d, H=%d, topk %d, on %s\n",
              KPOOL_VERSION_STRING, num_layers, K, D, H, kTopk, Exec::name());

  // One workspace for all layers: kSelectRows query rows of the most pools
  // a row sees. A call with more query rows selects in chunks of that many.
  Workspace shared(space, kSelectRows, (kMaxContext + K - 1) / K, H, D);
  Model model = make_model(space, num_layers, shared);
  Model witness = make_model(space, num_layers, Workspace());
  require(model.layers[0].workspace().keys().data() == shared.keys().data() &&
              model.layers[num_layers - 1].workspace().keys().data() == shared.keys().data(),
          "the layers do not share the workspace");
  for (int l = 0; l < num_layers; ++l)
    require(reinterpret_cast<std::uint8_t const*>(model.layers[l].cache().values_data()) ==
                &model.engine_cache(l, 0, 0),
            "a layer does not use its slice of the engine's cache buffer");
  std::printf("ring length %d, shared workspace of %d rows x %zu pools\n",
              model.layers[0].ring().ring_length(), kSelectRows, shared.max_visible());

  std::vector<Sequence> seqs{{0, 29}, {1, 11}, {2, 42}};

  // 1. Chunked prefill.
  for (int step = 1;; ++step) {
    std::vector<Row> rows;
    for (Sequence const& s : seqs) {
      int const n = std::min(kChunk, s.prompt - s.length);
      if (n > 0) rows.push_back({&s, s.length, n, n});
    }
    if (rows.empty()) break;
    serve(space, model, witness, make_call(false, rows), "prefill step " + std::to_string(step));
    for (Row const& r : rows) seqs[r.seq->id].length += r.count;
  }

  // 2. Speculative rounds: the verifier accepts (round + sequence) % 3 of a
  //    row's 2 drafts; the next round starts at the first rejected one.
  for (int round = 1; round <= kRounds; ++round) {
    std::vector<Row> rows;
    std::string accepted;
    for (Sequence const& s : seqs) {
      int const drafts_accepted = (round + s.id) % 3;
      rows.push_back({&s, s.length, kNextN, 1 + drafts_accepted});
      accepted += " " + std::to_string(drafts_accepted);
    }
    serve(space, model, witness, make_call(true, rows),
          "verify round " + std::to_string(round) + " (accepted" + accepted + ")");
    for (Row const& r : rows) seqs[r.seq->id].length += r.right;
  }

  // The two models' caches, written by the same steps into two engines'
  // buffers, hold the same bytes.
  auto const mine = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), model.engine_cache);
  auto const theirs =
      Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), witness.engine_cache);
  std::size_t written = 0;
  for (std::size_t i = 0; i < mine.size(); ++i) {
    require(mine.data()[i] == theirs.data()[i], "the two models' cache bytes differ");
    written += mine.data()[i] != 0;
  }
  require(written > 0, "no layer wrote its pools into the engine's buffer");
  if (selections_out) std::fclose(selections_out);
  std::printf("every selection of every layer checked, and equal to the one-workspace-a-layer model\n");
  std::printf("OK\n");
  return 0;
}
