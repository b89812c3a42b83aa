// One layer of a k-pooled sparse-attention indexer, served in miniature:
// three requests arrive, their prompts are prefilled in chunks of 10
// tokens, then they decode speculatively (the next token plus three drafts
// a step, the verifier accepting a prefix of the drafts and the next step
// re-sending from the first rejected one: a rewind). Every step
//
//   1. pools and cache: KPool::step (prefill, and every other verify
//      round) or KPool::step with a decode batch closes the pools whose last token
//      arrived and, in the same launches, writes them, rotated and
//      quantized to fp8, into the layer's paged pool cache;
//   2. selection: KPool::select_tokens scores every visible pool of the
//      cache for every token the step sent (32 heads), keeps the best 4
//      and returns the token positions sparse attention reads.
//
// The program prints what each step closed and what its last query token
// selected, and checks every step against one-shot work on the sequences as
// they now stand: every pool equals a one-shot step of the whole sequence
// bit for bit, every cache entry equals that step's pools stored by
// KPool::store_pools byte for byte, and every selected token row equals a
// KPool::select_tokens over that one-shot cache. It ends with OK.

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

using T = KPool::bfloat16;
using C = KPool::float8_e4m3;
using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
using U32 = Kokkos::View<std::uint32_t*, Mem>;
using I32 = Kokkos::View<std::int32_t**, Mem>;
constexpr int K = 4;        // tokens per pool
constexpr int D = 128;      // channels per key
constexpr int H = 32;       // indexer heads
constexpr int kTopk = 4;    // pools selected per query token
constexpr int kDrafts = 3;  // speculative drafts a step
constexpr int kChunk = 10;  // prefill chunk: not a multiple of K
constexpr int kBlockPools = 4;
constexpr int kMaxSlots = 4;
constexpr int kMaxBatch = 3;
constexpr int kMaxTokens = kMaxBatch * kChunk;
constexpr int kMaxPools = 32;  // pools a sequence may reach
constexpr int kRounds = 6;     // verify rounds

void require(bool ok, std::string const& what) {
  if (!ok) {
    std::printf("MISMATCH: %s\n", what.c_str());
    std::exit(1);
  }
}

// Deterministic stand-ins for the model's keys (which = 0), gate scores
// (1), ape (2), indexer queries (3) and head weights (4). The r-th re-send
// of a position gets new values (which + 8 r), as a rejected draft's
// replacement would.
float input(int seq, int pos, int c, int which) {
  std::uint64_t z = 0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(seq + 1) ^
                    (static_cast<std::uint64_t>(pos) * 0xC2B2AE3D27D4EB4Full) ^
                    (static_cast<std::uint64_t>(c) * 0x165667B19E3779F9ull + which);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<float>((z >> 40) & 0xFFFFFF) / 16777216.0f * 4.0f - 2.0f;
}

struct Sequence {
  Sequence(int id, int ring_slot, int prompt_tokens)
      : seq(id), slot(ring_slot), prompt(prompt_tokens) {}
  int seq;
  int slot;
  int prompt;
  int length = 0;                       // L: where its last call ended
  std::vector<int> sends;               // times each position was sent
  std::vector<std::int32_t> blocks;     // its cache blocks, in pool order
  std::map<int, std::vector<T>> pools;  // pool id -> value last emitted

  int revision(int pos) const { return sends[pos] - 1; }  // of the values last sent
  float key(int pos, int c) const { return input(seq, pos, c, 0 + 8 * revision(pos)); }
  float gate(int pos, int c) const { return input(seq, pos, c, 1 + 8 * revision(pos)); }
  float query(int pos, int h, int c) const {
    return input(seq, pos, h * D + c, 3 + 8 * revision(pos));
  }
  float weight(int pos, int h) const { return input(seq, pos, h, 4 + 8 * revision(pos)); }
};

// One batch row of a call: positions [start, start + n) of a sequence.
struct Row {
  Sequence* s;
  int start;
  int n;
};

U32 device_u32(std::string const& label, std::vector<std::uint32_t> const& v) {
  U32 d(label, v.size());
  auto h = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < v.size(); ++i) h(i) = v[i];
  Kokkos::deep_copy(d, h);
  return d;
}

// The layer's state, allocated once: the steps and selections allocate
// nothing.
struct Layer {
  Exec space;
  Kokkos::View<float**, Mem> ape{"ape", K, D};
  int ring_length = KPool::Ring<T, Mem>::serving_length(K, kDrafts);
  KPool::Ring<T, Mem> ring{space, kMaxSlots, K, D, ring_length};
  KPool::StepOutput<T, Mem> out{
      space,
      std::max(KPool::StepOutput<T, Mem>::capacity_for(kMaxTokens, kMaxBatch, K),
               KPool::StepOutput<T, Mem>::capacity_for(kMaxBatch * (1 + kDrafts),
                                                       kMaxBatch, K)),
      kMaxBatch, D};
  int num_blocks = kMaxBatch * kMaxPools / kBlockPools;
  KPool::PoolCache<C, Mem> cache{space, num_blocks, kBlockPools, D, K,
                                 KPool::CacheScale::amax, /*rotate=*/true};
  KPool::SelectWorkspace<T, Mem> workspace{space, kMaxTokens, kMaxPools, H, D};
  std::int32_t next_block = 0;

  Layer() {
    auto h = Kokkos::create_mirror_view(ape);
    for (int m = 0; m < K; ++m)
      for (int c = 0; c < D; ++c) h(m, c) = 0.25f * input(99, m, c, 2);
    Kokkos::deep_copy(ape, h);
  }

  // The call's block table: each row's sequence gets blocks (from a shared
  // free list, so sequences interleave) for every pool the call can close.
  I32 block_table(std::vector<Row> const& rows) {
    std::size_t width = 1;
    for (Row const& r : rows) {
      int const pools = (r.start + r.n) / K;
      while (static_cast<int>(r.s->blocks.size()) * kBlockPools < pools) {
        require(next_block < num_blocks, "the cache is out of blocks");
        r.s->blocks.push_back(next_block++);
      }
      width = std::max(width, r.s->blocks.size());
    }
    I32 table("block_table", rows.size(), width);
    auto h = Kokkos::create_mirror_view(table);
    for (std::size_t r = 0; r < rows.size(); ++r)
      for (std::size_t c = 0; c < width; ++c)
        h(r, c) = c < rows[r].s->blocks.size() ? rows[r].s->blocks[c] : -1;
    Kokkos::deep_copy(table, h);
    return table;
  }
};

// A call's rows as a ragged batch: offsets and first positions.
void ragged(std::vector<Row> const& rows, std::vector<std::uint32_t>& offsets,
            std::vector<std::uint32_t>& starts) {
  offsets.assign(1, 0);
  starts.clear();
  for (Row const& r : rows) {
    offsets.push_back(offsets.back() + r.n);
    starts.push_back(r.start);
  }
}

// Reads back what a step closed, remembers each pool as last emitted, and
// prints it.
void collect(Layer const& layer, std::vector<Row> const& rows) {
  std::uint32_t count = 0;
  Kokkos::deep_copy(count, layer.out.count());
  auto const row = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), layer.out.batch_row());
  auto const id = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), layer.out.pool_id());
  auto const pooled = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), layer.out.pooled());
  std::printf("  closed %u pool%s:", count, count == 1 ? "" : "s");
  for (std::uint32_t i = 0; i < count; ++i) {
    Sequence& s = *rows[row(i)].s;
    std::vector<T>& v = s.pools[id(i)];
    v.assign(D, T(0.0f));
    for (int c = 0; c < D; ++c) v[c] = pooled(i, c);
    std::printf(" s%d/p%d", s.seq, id(i));
  }
  std::printf("\n");
}

// Sends the rows' tokens (general: a general step; otherwise a decode
// step, every row sending next_n = n tokens), which also writes the closed
// pools into the cache, and returns the call's block table.
I32 send(Layer& layer, std::vector<Row> const& rows, bool general) {
  int const B = static_cast<int>(rows.size());
  for (Row const& r : rows) {
    Sequence& s = *r.s;
    if (static_cast<int>(s.sends.size()) < r.start + r.n) s.sends.resize(r.start + r.n, 0);
    for (int pos = r.start; pos < r.start + r.n; ++pos) ++s.sends[pos];
  }
  std::vector<std::uint32_t> offsets, starts, slots;
  ragged(rows, offsets, starts);
  for (Row const& r : rows) slots.push_back(r.s->slot);
  I32 const table = layer.block_table(rows);
  if (general) {
    Kokkos::View<T**, Mem> key("key", offsets.back(), D), gate("gate", offsets.back(), D);
    auto hk = Kokkos::create_mirror_view(key);
    auto hg = Kokkos::create_mirror_view(gate);
    for (int r = 0; r < B; ++r)
      for (int i = 0; i < rows[r].n; ++i)
        for (int c = 0; c < D; ++c) {
          hk(offsets[r] + i, c) = T(rows[r].s->key(rows[r].start + i, c));
          hg(offsets[r] + i, c) = T(rows[r].s->gate(rows[r].start + i, c));
        }
    Kokkos::deep_copy(key, hk);
    Kokkos::deep_copy(gate, hg);
    auto const batch = KPool::ragged_batch(device_u32("row_offsets", offsets),
                                           device_u32("cache_lengths", starts),
                                           device_u32("slot_idx", slots), B);
    KPool::step(layer.space, layer.ring, key, gate, layer.ape, batch,
                KPool::paged(layer.cache, table), layer.out);
  } else {
    int const next_n = rows[0].n;
    Kokkos::View<T***, Mem> key("key", B, next_n, D), gate("gate", B, next_n, D);
    Kokkos::View<std::int32_t**, Mem> positions("positions", B, next_n);
    auto hk = Kokkos::create_mirror_view(key);
    auto hg = Kokkos::create_mirror_view(gate);
    auto hp = Kokkos::create_mirror_view(positions);
    for (int r = 0; r < B; ++r)
      for (int i = 0; i < next_n; ++i) {
        hp(r, i) = rows[r].start + i;
        for (int c = 0; c < D; ++c) {
          hk(r, i, c) = T(rows[r].s->key(rows[r].start + i, c));
          hg(r, i, c) = T(rows[r].s->gate(rows[r].start + i, c));
        }
      }
    Kokkos::deep_copy(key, hk);
    Kokkos::deep_copy(gate, hg);
    Kokkos::deep_copy(positions, hp);
    auto const batch = KPool::decode_batch(positions, device_u32("slot_idx", slots), B);
    KPool::step(layer.space, layer.ring, key, gate, layer.ape, batch,
                KPool::paged(layer.cache, table), layer.out);
  }
  collect(layer, rows);
  for (Row const& r : rows) r.s->length = r.start + r.n;
  return table;
}

// The queries and head weights of the tokens the rows sent.
struct Queries {
  Kokkos::View<T***, Mem> q;
  Kokkos::View<float**, Mem> weights;
  U32 row_offsets, cache_lengths;
};

Queries queries(std::vector<Row> const& rows) {
  std::vector<std::uint32_t> offsets, starts;
  ragged(rows, offsets, starts);
  Queries x;
  x.q = Kokkos::View<T***, Mem>("q", offsets.back(), H, D);
  x.weights = Kokkos::View<float**, Mem>("weights", offsets.back(), H);
  auto hq = Kokkos::create_mirror_view(x.q);
  auto hw = Kokkos::create_mirror_view(x.weights);
  for (std::size_t r = 0; r < rows.size(); ++r)
    for (int i = 0; i < rows[r].n; ++i) {
      int const pos = rows[r].start + i;
      for (int h = 0; h < H; ++h) {
        hw(offsets[r] + i, h) = rows[r].s->weight(pos, h);
        for (int c = 0; c < D; ++c) hq(offsets[r] + i, h, c) = T(rows[r].s->query(pos, h, c));
      }
    }
  Kokkos::deep_copy(x.q, hq);
  Kokkos::deep_copy(x.weights, hw);
  x.row_offsets = device_u32("row_offsets", offsets);
  x.cache_lengths = device_u32("cache_lengths", starts);
  return x;
}

// Selection and expansion for every token the rows sent: token positions
// [rows, kTopk * K + K - 1].
I32 select(Layer& layer, KPool::PoolCache<C, Mem> const& cache, Queries const& x,
           I32 const& table, int B) {
  I32 tokens("tokens", x.q.extent(0), KPool::select_tokens_width(kTopk, K));
  KPool::select_tokens(layer.space, x.q, x.weights, kTopk,
                       KPool::ragged_batch(x.row_offsets, x.cache_lengths, B),
                       KPool::paged(cache, table), tokens, layer.workspace);
  return tokens;
}

// What the last query token of each row selected: its pools (token columns
// p * K .. p * K + K - 1) and the incomplete pool's tail.
template <class HostTokens>
void print_selection(std::vector<Row> const& rows, HostTokens const& tok) {
  int t = -1;
  for (Row const& r : rows) {
    t += r.n;
    int const pos = r.start + r.n - 1;
    std::printf("  s%d pos %d selects pools", r.s->seq, pos);
    for (int j = 0; j < kTopk; ++j)
      if (tok(t, j * K) >= 0) std::printf(" %d", tok(t, j * K) / K);
    std::printf(" + tail");
    for (int j = kTopk * K; j < static_cast<int>(tok.extent(1)); ++j)
      if (tok(t, j) >= 0) std::printf(" %d", tok(t, j));
    std::printf("\n");
  }
}

// One-shot work on the rows' sequences as they now stand: a single step of
// every whole sequence (fresh ring and output, no cache), its pools stored
// into a fresh cache by KPool::store_pools through the same block table,
// and the same queries selected over that cache. The streamed pools, cache entries and token rows must
// equal these, bit for bit.
void check_one_shot(Layer& layer, std::vector<Row> const& rows, I32 const& table,
                    Queries const& x, I32 const& tokens) {
  int const B = static_cast<int>(rows.size());
  std::vector<std::uint32_t> offsets{0}, zeros, slots;
  for (int r = 0; r < B; ++r) {
    offsets.push_back(offsets.back() + rows[r].s->length);
    zeros.push_back(0);
    slots.push_back(r);
  }
  Kokkos::View<T**, Mem> key("key", offsets.back(), D), gate("gate", offsets.back(), D);
  auto hk = Kokkos::create_mirror_view(key);
  auto hg = Kokkos::create_mirror_view(gate);
  for (int r = 0; r < B; ++r)
    for (int pos = 0; pos < rows[r].s->length; ++pos)
      for (int c = 0; c < D; ++c) {
        hk(offsets[r] + pos, c) = T(rows[r].s->key(pos, c));
        hg(offsets[r] + pos, c) = T(rows[r].s->gate(pos, c));
      }
  Kokkos::deep_copy(key, hk);
  Kokkos::deep_copy(gate, hg);
  KPool::Ring<T, Mem> ring(layer.space, B, K, D);
  KPool::StepOutput<T, Mem> out(
      layer.space, KPool::StepOutput<T, Mem>::capacity_for(offsets.back(), B, K), B, D);
  auto const batch = KPool::ragged_batch(device_u32("row_offsets", offsets),
                                         device_u32("cache_lengths", zeros),
                                         device_u32("slot_idx", slots), B);
  KPool::step(layer.space, ring, key, gate, layer.ape, batch, out);
  KPool::PoolCache<C, Mem> cache(layer.space, layer.num_blocks, kBlockPools, D, K,
                                 KPool::CacheScale::amax, /*rotate=*/true);
  KPool::store_pools(layer.space, out, batch, KPool::paged(cache, table));
  I32 const once = select(layer, cache, x, table, B);

  // Pools: rows [offsets(r), offsets(r + 1)) of the output are request r's
  // pools 0, 1, ... in order.
  auto const off = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out.offsets());
  auto const pooled = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out.pooled());
  auto const values = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), layer.cache.values());
  auto const scales = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), layer.cache.scales());
  auto const ref_values = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), cache.values());
  auto const ref_scales = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), cache.scales());
  for (int r = 0; r < B; ++r) {
    Sequence const& s = *rows[r].s;
    std::string const name = "sequence " + std::to_string(s.seq);
    int const n_pools = s.length / K;
    require(static_cast<int>(off(r + 1) - off(r)) == n_pools, name + ": one-shot pool count");
    for (int p = 0; p < n_pools; ++p) {
      auto const it = s.pools.find(p);
      require(it != s.pools.end(), name + ": pool " + std::to_string(p) + " never closed");
      for (int c = 0; c < D; ++c)
        require(std::memcmp(&it->second[c], &pooled(off(r) + p, c), sizeof(T)) == 0,
                name + ": pool " + std::to_string(p) + " channel " + std::to_string(c) +
                    " differs from a one-shot step");
      int const b = s.blocks[p / kBlockPools], e = p % kBlockPools;
      require(std::memcmp(&scales(b, e), &ref_scales(b, e), sizeof(float)) == 0 &&
                  std::memcmp(&values(b, e, 0), &ref_values(b, e, 0), D * sizeof(C)) == 0,
              name + ": cache entry of pool " + std::to_string(p) +
                  " differs from a one-shot store_pools");
    }
  }
  auto const got = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), tokens);
  auto const want = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), once);
  for (std::size_t t = 0; t < got.extent(0); ++t)
    for (std::size_t j = 0; j < got.extent(1); ++j)
      require(got(t, j) == want(t, j), "query row " + std::to_string(t) + " column " +
                                           std::to_string(j) + " selects " +
                                           std::to_string(got(t, j)) + ", one-shot " +
                                           std::to_string(want(t, j)));
  std::printf("  %zu query rows: pools, cache entries and selections equal one-shot work\n",
              got.extent(0));
}

// A whole serving call: send, select for every token sent, print, check.
void serve(Layer& layer, std::vector<Row> const& rows, bool general) {
  I32 const table = send(layer, rows, general);
  Queries const x = queries(rows);
  I32 const tokens = select(layer, layer.cache, x, table, static_cast<int>(rows.size()));
  print_selection(rows, Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), tokens));
  check_one_shot(layer, rows, table, x, tokens);
}

}  // namespace

int main(int argc, char* argv[]) {
  Kokkos::ScopeGuard guard(argc, argv);
  Layer layer;
  std::printf(
      "KPool %s serving example: K=%d, D=%d, %s keys, fp8 rotated cache, %d heads, "
      "top %d pools, %d drafts (ring %d), on %s\n",
      KPOOL_VERSION_STRING, K, D, KPool::storage_name<T>(), H, kTopk, kDrafts,
      layer.ring_length, Exec::name());

  std::vector<Sequence> seqs = {{0, 2, 37}, {1, 0, 20}, {2, 1, 9}};

  // Chunked prefill: every request with prompt left sends up to kChunk
  // tokens; every prompt token is also a query.
  for (int step = 0;; ++step) {
    std::vector<Row> rows;
    for (auto& s : seqs)
      if (s.length < s.prompt) rows.push_back({&s, s.length, std::min(kChunk, s.prompt - s.length)});
    if (rows.empty()) break;
    std::printf("prefill step %d:", step);
    for (Row const& r : rows) std::printf(" s%d[%d..%d)", r.s->seq, r.start, r.start + r.n);
    std::printf("\n");
    serve(layer, rows, true);
  }

  // Speculative decoding: each round sends, from the accepted length, the
  // next token and kDrafts drafts (all four are queries); the verifier
  // accepts a prefix of the drafts, and the next round starts after it,
  // re-sending the rejected positions with new values. Rounds alternate
  // between a decode batch and a ragged one (both KPool::step).
  std::vector<int> accepted_length;
  for (auto const& s : seqs) accepted_length.push_back(s.length);
  for (int round = 0; round < kRounds; ++round) {
    bool const general = round % 2 == 1;
    std::vector<Row> rows;
    std::printf("verify round %d (%s):", round, general ? "ragged step" : "decode step");
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      Sequence& s = seqs[i];
      int const start = accepted_length[i];
      rows.push_back({&s, start, 1 + kDrafts});
      std::printf(" s%d[%d..%d)%s", s.seq, start, start + 1 + kDrafts,
                  start < s.length ? " (rewind)" : "");
    }
    std::printf("\n");
    serve(layer, rows, general);
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      int const accepted = (round * 7 + seqs[i].seq * 3) % (kDrafts + 1);
      accepted_length[i] += 1 + accepted;
    }
  }
  std::printf("OK\n");
  return 0;
}
