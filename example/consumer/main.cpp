// A KPool consumer to copy: one indexer layer through a short serving
// session, all of it through one KPool::Layer, checked as it goes.
//
//  1. Chunked prefill: sequences A (slot 0) and B (slot 1) prefilled in
//     chunks of 7 tokens through Layer::step; chunks end mid-pool, so pools
//     close across calls. Every pool also lands in the layer's pool cache.
//  2. Speculative decoding with verification: each row of a decode batch
//     (Layer::step) sends the next token and 2 drafts (next_n = 3). The
//     verifier accepts some drafts; the next round re-sends from the first
//     rejected one, rewinding the sequence. A rejected draft's key is
//     wrong, so a pool built from it is wrong until it is re-sent; the
//     layer's ring is Ring::serving_length(K, 2) long, so the rewind is
//     safe.
//  3. After every decode round, the selection of that batch: the layer's
//     score_select and select_tokens, whose rows come
//     from the decode positions on the device; each token row is checked
//     against the expansion rule for its pool ids.
//  4. Slot reuse: B finishes, C takes slot 1 (and B's cache blocks) with a
//     prefill, in the same step as a decode of A.
//  5. At the end, every pool of A and C (the latest one received for each
//     id) equals bit for bit a one-shot KPool::compress of the accepted
//     tokens (streaming invariance, rewinds included), and the cache holds
//     exactly those pools (a native cache stores them unchanged).
//
// Any mismatch prints what differs and exits with status 1.

#include <KPool.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace {

using T = KPool::bfloat16;  // the storage type: float, double, bfloat16, float16
using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
using Layer = KPool::Layer<T, T, Mem>;  // a native cache (or KPool::float8_e4m3)
constexpr int K = 4;         // tokens per pool
constexpr int D = 128;       // channels of a key
constexpr int H = 4;         // indexer query heads
constexpr int kDrafts = 2;   // drafts a decode row sends besides the next token
constexpr int kNextN = 1 + kDrafts;
constexpr int kMaxBatch = 2;
constexpr int kChunk = 7;  // prefill chunk: not a multiple of K
constexpr int kMaxTokens = kMaxBatch * kChunk;
constexpr int kBlockPools = 4;
constexpr int kBlocksPerSeq = 4;  // 16 pools, 64 tokens a sequence
constexpr int kTopk = 2;

void require(bool ok, std::string const& what) {
  if (!ok) {
    std::printf("MISMATCH: %s\n", what.c_str());
    std::exit(1);
  }
}

// Stand-ins for the model's keys (which = 0), gate scores (1), ape (2) and
// queries (3): deterministic, in [-2, 2), a function of the position only
// (so a sequence's tokens are the same however they are batched), and
// another value for a rejected draft (`wrong`).
float input(int seq, int pos, int c, int which, bool wrong = false) {
  std::uint64_t z = 0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(seq + 1) ^
                    (static_cast<std::uint64_t>(pos) * 0xC2B2AE3D27D4EB4Full) ^
                    (static_cast<std::uint64_t>(c) * 0x165667B19E3779F9ull + which) ^
                    (wrong ? 0x5DEECE66Dull : 0ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>((z >> 40) & 0xFFFFFF) / 16777216.0f * 4.0f - 2.0f;
}

Kokkos::View<std::uint32_t*, Mem> device_u32(std::string const& label,
                                             std::vector<std::uint32_t> const& v) {
  Kokkos::View<std::uint32_t*, Mem> d(label, v.size());
  auto h = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < v.size(); ++i) h(i) = v[i];
  Kokkos::deep_copy(d, h);
  return d;
}

struct Sequence {
  int id;
  int slot;
  int first_block;                      // blocks [first_block, + kBlocksPerSeq)
  int length = 0;                       // accepted tokens
  std::map<int, std::vector<T>> pools;  // pool id -> the latest pooled key received
};

// The batch's block table: row r holds rows[r]'s blocks.
Kokkos::View<std::int32_t**, Mem> block_table(std::vector<Sequence*> const& rows) {
  Kokkos::View<std::int32_t**, Mem> t("block_table", rows.size(), kBlocksPerSeq);
  auto h = Kokkos::create_mirror_view(t);
  for (std::size_t r = 0; r < rows.size(); ++r)
    for (int c = 0; c < kBlocksPerSeq; ++c) h(r, c) = rows[r]->first_block + c;
  Kokkos::deep_copy(t, h);
  return t;
}

// Reads the step's output on the host (one call) and files each pool under
// its sequence. `expected[r]` lists the pool ids request r must have
// closed, in order.
void collect(Exec const& space, Layer const& layer, std::vector<Sequence*> const& rows,
             std::vector<std::vector<int>> const& expected, std::string const& call) {
  KPool::HostStepOutput<T> const h =
      layer.output().to_host(space, KPool::StepOutputParts::ids_and_pooled);
  std::printf("%-34s closed %u pool%s:", call.c_str(), h.count, h.count == 1 ? "" : "s");
  require(h.batch_size() == static_cast<int>(rows.size()), call + ": batch size");
  for (std::size_t r = 0; r < rows.size(); ++r) {
    Sequence& s = *rows[r];
    std::uint32_t const n = h.offsets(r + 1) - h.offsets(r);
    require(n == expected[r].size(), call + ": sequence " + std::to_string(s.id) + " closed " +
                                         std::to_string(n) + " pools, expected " +
                                         std::to_string(expected[r].size()));
    for (std::uint32_t k = 0; k < n; ++k) {
      std::uint32_t const i = h.offsets(r) + k;
      require(h.batch_row(i) == static_cast<int>(r), call + ": wrong batch_row");
      require(h.pool_id(i) == expected[r][k],
              call + ": closed pool " + std::to_string(h.pool_id(i)) + ", expected " +
                  std::to_string(expected[r][k]));
      std::vector<T>& v = s.pools[h.pool_id(i)];  // a re-sent pool replaces its first version
      v.assign(&h.pooled(i, 0), &h.pooled(i, 0) + D);
      std::printf(" %c/p%d", 'A' + s.id, h.pool_id(i));
    }
  }
  std::printf("\n");
}

// Pools whose last member is in [begin, end): their ids, in order.
std::vector<int> closing(int begin, int end) {
  std::vector<int> ids;
  for (int p = begin / K; p < end / K; ++p) ids.push_back(p);
  return ids;
}

// One general step: row r sends n[r] accepted tokens of rows[r].
void step(Exec const& space, Layer& layer, std::vector<Sequence*> const& rows,
          std::vector<int> const& n, std::string const& call) {
  std::vector<std::uint32_t> offsets{0}, cache, slots;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    offsets.push_back(offsets.back() + n[r]);
    cache.push_back(rows[r]->length);
    slots.push_back(rows[r]->slot);
  }
  // A real engine writes these from its model; here each call allocates its own.
  Kokkos::View<T**, Mem> key("key", offsets.back(), D), gate("gate", offsets.back(), D);
  auto hk = Kokkos::create_mirror_view(key);
  auto hg = Kokkos::create_mirror_view(gate);
  std::vector<std::vector<int>> expected;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    for (int i = 0; i < n[r]; ++i)
      for (int c = 0; c < D; ++c) {
        hk(offsets[r] + i, c) = T(input(rows[r]->id, rows[r]->length + i, c, 0));
        hg(offsets[r] + i, c) = T(input(rows[r]->id, rows[r]->length + i, c, 1));
      }
    expected.push_back(closing(rows[r]->length, rows[r]->length + n[r]));
  }
  Kokkos::deep_copy(key, hk);
  Kokkos::deep_copy(gate, hg);
  layer.step(space, key, gate,
             KPool::ragged_batch(device_u32("row_offsets", offsets),
                                 device_u32("cache_lengths", cache),
                                 device_u32("slot_idx", slots), static_cast<int>(rows.size())),
             block_table(rows));
  collect(space, layer, rows, expected, call);
  for (std::size_t r = 0; r < rows.size(); ++r) rows[r]->length += n[r];
}

// The selection of the decode batch just sent: q row r * next_n + i is
// entry (r, i). Each real entry's token row must be its pool ids expanded
// (docs/indexer.md): pool p gives p * K .. p * K + K - 1, an unused pool
// slot -1s, then the positions of its incomplete pool, then -1.
void select_decode(Exec const& space, Layer& layer, std::vector<std::int32_t> const& pos) {
  int const rows = static_cast<int>(pos.size());
  Kokkos::View<T***, Mem> q("q", rows, H, D);
  Kokkos::View<float**, Mem> weights("weights", rows, H);
  auto hq = Kokkos::create_mirror_view(q);
  auto hw = Kokkos::create_mirror_view(weights);
  for (int t = 0; t < rows; ++t)
    for (int h = 0; h < H; ++h) {
      hw(t, h) = 0.5f + 0.25f * h;
      for (int c = 0; c < D; ++c) hq(t, h, c) = T(input(t, h, c, 3));
    }
  Kokkos::deep_copy(q, hq);
  Kokkos::deep_copy(weights, hw);
  int const width = KPool::select_tokens_width(kTopk, K);
  Kokkos::View<std::int32_t**, Mem> ids("pool_ids", rows, kTopk), tokens("tokens", rows, width);
  layer.score_select(space, q, weights, kTopk, ids);
  layer.select_tokens(space, q, weights, kTopk, tokens);
  auto const hi = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), ids);
  auto const ht = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), tokens);
  int checked = 0;
  for (int t = 0; t < rows; ++t) {
    if (pos[t] < 0) continue;  // padding: its row means nothing
    int const seen = pos[t] + 1, visible = seen / K;
    int const used = std::min(kTopk, visible);
    for (int j = 0; j < kTopk; ++j) {
      int const p = hi(t, j);
      require(j < used ? (p >= 0 && p < visible && (j == 0 || p > hi(t, j - 1))) : p == -1,
              "score_select row " + std::to_string(t) + " slot " + std::to_string(j) +
                  ": pool " + std::to_string(p) + " of " + std::to_string(visible));
    }
    for (int j = 0; j < width; ++j) {
      int expect = -1;
      if (j < kTopk * K) {
        int const p = hi(t, j / K);
        if (p >= 0) expect = p * K + j % K;
      } else if (j - kTopk * K < seen % K) {
        expect = visible * K + (j - kTopk * K);
      }
      require(ht(t, j) == expect, "select_tokens row " + std::to_string(t) + " column " +
                                      std::to_string(j) + ": " + std::to_string(ht(t, j)) +
                                      ", expected " + std::to_string(expect));
    }
    ++checked;
  }
  std::printf("%-34s %d query rows selected and expanded\n", "  selection", checked);
}

// One speculative round: row r sends its next token and kDrafts drafts;
// the verifier accepts accepted[r] of the drafts (the sequence grows by
// accepted[r] + 1). A rejected draft was a wrong token: its key and gate
// are wrong, and the next round re-sends from it (a rewind).
void verify_round(Exec const& space, Layer& layer, std::vector<Sequence*> const& rows,
                  std::vector<int> const& accepted, std::string const& call) {
  int const B = static_cast<int>(rows.size());
  Kokkos::View<T***, Mem> key("key", B, kNextN, D), gate("gate", B, kNextN, D);
  Kokkos::View<std::int32_t**, Mem> positions("positions", B, kNextN);
  auto hk = Kokkos::create_mirror_view(key);
  auto hg = Kokkos::create_mirror_view(gate);
  auto hp = Kokkos::create_mirror_view(positions);
  std::vector<std::uint32_t> slots;
  std::vector<std::vector<int>> expected;
  std::vector<std::int32_t> pos;
  for (int r = 0; r < B; ++r) {
    Sequence const& s = *rows[r];
    slots.push_back(s.slot);
    for (int i = 0; i < kNextN; ++i) {
      bool const wrong = i > accepted[r];  // drafts past the accepted ones
      hp(r, i) = s.length + i;
      pos.push_back(s.length + i);
      for (int c = 0; c < D; ++c) {
        hk(r, i, c) = T(input(s.id, s.length + i, c, 0, wrong));
        hg(r, i, c) = T(input(s.id, s.length + i, c, 1, wrong));
      }
    }
    expected.push_back(closing(s.length, s.length + kNextN));
  }
  Kokkos::deep_copy(key, hk);
  Kokkos::deep_copy(gate, hg);
  Kokkos::deep_copy(positions, hp);
  layer.step(space, key, gate, KPool::decode_batch(positions, device_u32("slot_idx", slots), B),
             block_table(rows));
  collect(space, layer, rows, expected, call);
  select_decode(space, layer, pos);
  for (int r = 0; r < B; ++r) rows[r]->length += accepted[r] + 1;
}

// Every complete pool of the sequence equals, bit for bit, a one-shot
// compress of its accepted tokens, and is what the cache holds.
void check_sequence(Exec const& space, Layer const& layer, Sequence const& s) {
  int const L = s.length, n_pools = L / K;
  Kokkos::View<T**, Mem> key("key", L, D), gate("gate", L, D), once("once", n_pools, D);
  auto hk = Kokkos::create_mirror_view(key);
  auto hg = Kokkos::create_mirror_view(gate);
  for (int pos = 0; pos < L; ++pos)
    for (int c = 0; c < D; ++c) {
      hk(pos, c) = T(input(s.id, pos, c, 0));
      hg(pos, c) = T(input(s.id, pos, c, 1));
    }
  Kokkos::deep_copy(key, hk);
  Kokkos::deep_copy(gate, hg);
  Kokkos::View<std::uint32_t*, Mem> pool_row_offsets("pool_row_offsets", 2);
  KPool::compress(space, key, gate, layer.ape(),
                  KPool::ragged_batch(
                      device_u32("row_offsets", {0u, static_cast<std::uint32_t>(L)}),
                      device_u32("cache_lengths", {0u}), 1),
                  pool_row_offsets, once);
  auto const h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), once);
  auto const cached =
      Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), layer.cache().values());
  std::string const name = std::string("sequence ") + static_cast<char>('A' + s.id);
  for (int p = 0; p < n_pools; ++p) {
    auto const it = s.pools.find(p);
    require(it != s.pools.end(), name + ": pool " + std::to_string(p) + " never arrived");
    int const block = s.first_block + p / kBlockPools, entry = p % kBlockPools;
    for (int c = 0; c < D; ++c) {
      require(std::memcmp(&it->second[c], &h(p, c), sizeof(T)) == 0,
              name + ": pool " + std::to_string(p) + " channel " + std::to_string(c) +
                  " differs from the one-shot compress");
      require(std::memcmp(&cached(block, entry, c), &h(p, c), sizeof(T)) == 0,
              name + ": the cache's pool " + std::to_string(p) + " channel " +
                  std::to_string(c) + " differs");
    }
  }
  std::printf("%s: %d tokens, %d pools equal to a one-shot compress, and cached\n",
              name.c_str(), L, n_pools);
}

}  // namespace

int main(int argc, char* argv[]) {
  Kokkos::ScopeGuard guard(argc, argv);
  std::printf("KPool %s consumer: K=%d, D=%d, H=%d, %s, on %s\n", KPOOL_VERSION_STRING, K, D,
              H, KPool::storage_name<T>(), Exec::name());
  Exec space;

  // The layer, allocated once: the steps and selections allocate nothing.
  KPool::LayerConfig config;
  config.kpool = K;
  config.head_dim = D;
  config.num_heads = H;
  config.max_slots = 2;
  config.drafts = kDrafts;  // ring length Ring::serving_length(K, kDrafts)
  config.max_batch = kMaxBatch;
  config.max_tokens = kMaxTokens;  // >= kMaxBatch * kNextN too
  config.num_blocks = 2 * kBlocksPerSeq;
  config.block_pools = kBlockPools;
  config.max_visible = kBlocksPerSeq * kBlockPools;
  Kokkos::View<float**, Mem> ape("ape", K, D);
  {
    auto h = Kokkos::create_mirror_view(ape);
    for (int m = 0; m < K; ++m)
      for (int c = 0; c < D; ++c) h(m, c) = 0.25f * input(-1, m, c, 2);
    Kokkos::deep_copy(ape, h);
  }
  Layer layer(space, config, ape);
  std::printf("ring length %d (K = %d, %d drafts)\n", layer.ring().ring_length(), K, kDrafts);
  Sequence a{0, 0, 0, 0, {}}, b{1, 1, kBlocksPerSeq, 0, {}}, c{2, 1, kBlocksPerSeq, 0, {}};

  // 1. Chunked prefill: A has a 19-token prompt, B 10. Batch rows need not
  //    follow slots: in the second call B is row 0.
  step(space, layer, {&a, &b}, {kChunk, kChunk}, "prefill A[0,7) B[0,7)");
  step(space, layer, {&b, &a}, {3, kChunk}, "prefill B[7,10) A[7,14)");
  step(space, layer, {&a}, {5}, "prefill A[14,19)");

  // 2, 3. Speculative rounds, each with its selection; accepting fewer than
  //    2 drafts rewinds the next round.
  verify_round(space, layer, {&a, &b}, {2, 0}, "verify A+3 B+1 (B rewinds)");
  verify_round(space, layer, {&a, &b}, {0, 1}, "verify A+1 B+2 (both rewind)");
  verify_round(space, layer, {&b, &a}, {2, 1}, "verify B+3 A+2");

  // 4. B is done; C takes its slot and blocks with a 9-token prefill, in the
  //    same step as a single-token decode of A.
  step(space, layer, {&c, &a}, {9, 1}, "prefill C[0,9), A+1 (step)");
  verify_round(space, layer, {&a, &c}, {1, 2}, "verify A+2 C+3");
  verify_round(space, layer, {&c, &a}, {0, 2}, "verify C+1 A+3");

  // 5. Every pool against a one-shot compress, and the cache.
  check_sequence(space, layer, a);
  check_sequence(space, layer, c);
  std::printf("OK\n");
  return 0;
}
