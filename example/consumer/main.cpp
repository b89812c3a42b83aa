// A KPool consumer to copy: one layer's pooled keys through a short serving
// session, checked as it goes.
//
//  1. Chunked prefill: two sequences, A (slot 0) and B (slot 1), prefilled in
//     chunks of 7 tokens through KPool::step; chunks end mid-pool, so pools
//     close across calls.
//  2. Speculative decode, next_n = 2: each KPool::decode_step row carries
//     the next token and a draft token; a row without a draft pads its
//     second entry with -1.
//  3. Slot reuse: B finishes, C takes slot 1 with a prefill, in the same
//     KPool::step as a single-token decode of A (a sequence may move
//     between the two kinds of step).
//  4. Every pool, read back on the host, must have come exactly once, from
//     the right request, and equal bit for bit a one-shot KPool::compress
//     of its whole sequence (streaming invariance).
//  5. KPool::expand_topk turns selected pool ids into token positions; the
//     result is checked against the rule in docs/writers.md.
//  6. With Kokkos Kernels (KPOOL_HAS_KOKKOSKERNELS), a selection through
//     the installed package: KPool::score_select over a small hand-filled
//     pool cache.
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
constexpr int K = 4;    // tokens per pool
constexpr int D = 128;  // channels of a key
constexpr int kMaxSlots = 2;
constexpr int kMaxBatch = 2;
constexpr int kChunk = 7;      // prefill chunk: not a multiple of K
constexpr int kNextN = 2;      // decode: the next token and one draft
constexpr int kMaxTokens = kMaxBatch * kChunk;

void require(bool ok, std::string const& what) {
  if (!ok) {
    std::printf("MISMATCH: %s\n", what.c_str());
    std::exit(1);
  }
}

// Stand-ins for the model's keys (which = 0), gate scores (1) and ape (2):
// deterministic, in [-2, 2), and a function of the position only, so a
// sequence's tokens are the same however they are batched.
float input(int seq, int pos, int c, int which) {
  std::uint64_t z = 0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(seq + 1) ^
                    (static_cast<std::uint64_t>(pos) * 0xC2B2AE3D27D4EB4Full) ^
                    (static_cast<std::uint64_t>(c) * 0x165667B19E3779F9ull + which);
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
  int length = 0;                          // tokens sent so far
  std::map<int, std::vector<T>> pools;     // pool id -> pooled key, as received
};

// The layer's state, allocated once: the steps allocate nothing.
struct Layer {
  Exec space;
  Kokkos::View<float**, Mem> ape;
  KPool::Ring<T, Mem> ring;
  KPool::StepOutput<T, Mem> out;

  Layer()
      : ape("ape", K, D),
        ring(space, kMaxSlots, K, D),
        // One output for both kinds of step: prefill calls carry up to
        // kMaxTokens rows, decode calls kMaxBatch * kNextN entries.
        out(space,
            std::max(KPool::StepOutput<T, Mem>::capacity_for(kMaxTokens, kMaxBatch, K),
                     KPool::StepOutput<T, Mem>::capacity_for(kMaxBatch * kNextN,
                                                             kMaxBatch, K)),
            kMaxBatch, D) {
    auto h = Kokkos::create_mirror_view(ape);
    for (int m = 0; m < K; ++m)
      for (int c = 0; c < D; ++c) h(m, c) = 0.25f * input(-1, m, c, 2);
    Kokkos::deep_copy(ape, h);
  }
};

// Reads a step's output on the host and files each pool under its sequence.
// `expected[r]` lists the pool ids request r must have closed, in order.
void collect(Layer const& layer, std::vector<Sequence*> const& rows,
             std::vector<std::vector<int>> const& expected, char const* call) {
  std::uint32_t count = 0;
  Kokkos::deep_copy(count, layer.out.count());
  auto const offsets = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), layer.out.offsets());
  auto const batch_row = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), layer.out.batch_row());
  auto const pool_id = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), layer.out.pool_id());
  auto const pooled = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), layer.out.pooled());
  std::printf("%-28s closed %u pool%s:", call, count, count == 1 ? "" : "s");
  require(offsets(0) == 0, std::string(call) + ": offsets(0) is not 0");
  require(offsets(rows.size()) == count, std::string(call) + ": count is not offsets(B)");
  for (std::size_t r = 0; r < rows.size(); ++r) {
    Sequence& s = *rows[r];
    std::uint32_t const n = offsets(r + 1) - offsets(r);
    require(n == expected[r].size(), std::string(call) + ": sequence " + std::to_string(s.id) +
                                         " closed " + std::to_string(n) + " pools, expected " +
                                         std::to_string(expected[r].size()));
    for (std::uint32_t k = 0; k < n; ++k) {
      std::uint32_t const i = offsets(r) + k;
      require(batch_row(i) == static_cast<int>(r), std::string(call) + ": wrong batch_row");
      require(pool_id(i) == expected[r][k], std::string(call) + ": sequence " +
                                                std::to_string(s.id) + " closed pool " +
                                                std::to_string(pool_id(i)) + ", expected " +
                                                std::to_string(expected[r][k]));
      require(s.pools.count(pool_id(i)) == 0, "pool " + std::to_string(pool_id(i)) +
                                                  " of sequence " + std::to_string(s.id) +
                                                  " arrived twice");
      std::vector<T>& v = s.pools[pool_id(i)];
      for (int c = 0; c < D; ++c) v.push_back(pooled(i, c));
      std::printf(" %c/p%d", 'A' + s.id, pool_id(i));
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

// One general step: row r sends n[r] tokens of rows[r], continuing it.
void step(Layer& layer, std::vector<Sequence*> const& rows, std::vector<int> const& n,
          char const* call) {
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
  KPool::step(layer.space, layer.ring, key, gate, layer.ape, device_u32("row_offsets", offsets),
              device_u32("cache_lengths", cache), device_u32("slot_idx", slots),
              static_cast<int>(rows.size()), layer.out);
  collect(layer, rows, expected, call);
  for (std::size_t r = 0; r < rows.size(); ++r) rows[r]->length += n[r];
}

// One decode step, next_n = 2: row r sends real[r] (1 or 2) tokens; the
// positions are absolute, and a missing draft is padding (-1).
void decode(Layer& layer, std::vector<Sequence*> const& rows, std::vector<int> const& real,
            char const* call) {
  int const B = static_cast<int>(rows.size());
  Kokkos::View<T***, Mem> key("key", B, kNextN, D), gate("gate", B, kNextN, D);
  Kokkos::View<std::int32_t**, Mem> positions("positions", B, kNextN);
  auto hk = Kokkos::create_mirror_view(key);
  auto hg = Kokkos::create_mirror_view(gate);
  auto hp = Kokkos::create_mirror_view(positions);
  std::vector<std::uint32_t> slots;
  std::vector<std::vector<int>> expected;
  for (int r = 0; r < B; ++r) {
    Sequence const& s = *rows[r];
    slots.push_back(s.slot);
    for (int i = 0; i < kNextN; ++i) {
      bool const is_real = i < real[r];
      hp(r, i) = is_real ? s.length + i : -1;
      for (int c = 0; c < D; ++c) {
        hk(r, i, c) = T(is_real ? input(s.id, s.length + i, c, 0) : 0.0f);
        hg(r, i, c) = T(is_real ? input(s.id, s.length + i, c, 1) : 0.0f);
      }
    }
    expected.push_back(closing(s.length, s.length + real[r]));
  }
  Kokkos::deep_copy(key, hk);
  Kokkos::deep_copy(gate, hg);
  Kokkos::deep_copy(positions, hp);
  KPool::decode_step(layer.space, layer.ring, key, gate, layer.ape, positions,
                     device_u32("slot_idx", slots), B, layer.out);
  collect(layer, rows, expected, call);
  for (int r = 0; r < B; ++r) rows[r]->length += real[r];
}

// Every pool complete in the sequence arrived once and equals, bit for bit,
// a one-shot compress of the whole sequence.
void check_against_one_shot(Layer const& layer, Sequence const& s) {
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
  KPool::compress(layer.space, key, gate, layer.ape,
                  device_u32("row_offsets", {0u, static_cast<std::uint32_t>(L)}),
                  device_u32("cache_lengths", {0u}), 1, pool_row_offsets, once);
  auto const h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), once);
  std::string const name = std::string("sequence ") + static_cast<char>('A' + s.id);
  require(static_cast<int>(s.pools.size()) == n_pools,
          name + " received " + std::to_string(s.pools.size()) + " pools, expected " +
              std::to_string(n_pools));
  for (int p = 0; p < n_pools; ++p) {
    auto const it = s.pools.find(p);
    require(it != s.pools.end(), name + ": pool " + std::to_string(p) + " never arrived");
    for (int c = 0; c < D; ++c)
      require(std::memcmp(&it->second[c], &h(p, c), sizeof(T)) == 0,
              name + ": pool " + std::to_string(p) + " channel " + std::to_string(c) +
                  " differs from the one-shot compress");
  }
  std::printf("%s: %d tokens, %d pools equal to a one-shot compress\n", name.c_str(), L,
              n_pools);
}

// expand_topk for some query tokens, against the rule of docs/writers.md.
void check_expand_topk(Layer const& layer, Sequence const& a, Sequence const& c) {
  // Query tokens: A's last 3 positions and C's last 2, as a ragged batch.
  std::vector<std::uint32_t> const offsets{0, 3, 5};
  std::vector<std::uint32_t> const cache{static_cast<std::uint32_t>(a.length - 3),
                                         static_cast<std::uint32_t>(c.length - 2)};
  int const rows = 5, pool_topk = 3;
  // Per token: the latest complete pool, pool 0, and an id that must never
  // become an index (a pool past the sequence, as a stale selection would give).
  Kokkos::View<std::int32_t**, Mem> pool_ids("pool_ids", rows, pool_topk);
  auto ids = Kokkos::create_mirror_view(pool_ids);
  std::vector<int> visible(rows);
  for (int t = 0; t < rows; ++t) {
    int const r = t < 3 ? 0 : 1;
    visible[t] = static_cast<int>(cache[r]) + (t - static_cast<int>(offsets[r])) + 1;
    ids(t, 0) = visible[t] / K - 1;
    ids(t, 1) = 0;
    ids(t, 2) = visible[t] / K + 5;
  }
  Kokkos::deep_copy(pool_ids, ids);
  bool const tail_always = true;
  int const width = KPool::expand_topk_width(pool_topk, K, tail_always);
  Kokkos::View<std::int32_t**, Mem> tokens("tokens", rows, width);
  KPool::expand_topk(layer.space, pool_ids, device_u32("row_offsets", offsets),
                     device_u32("cache_lengths", cache), 2, K, tail_always, tokens);
  auto const h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), tokens);
  for (int t = 0; t < rows; ++t) {
    int const v = visible[t];
    for (int j = 0; j < width; ++j) {
      int expect = -1;
      if (j < pool_topk * K) {
        int const pid = ids(t, j / K);
        if (pid >= 0 && (pid + 1) * K <= v) expect = pid * K + j % K;
      } else {
        int const tail = j - pool_topk * K;
        if (tail < v % K) expect = v - v % K + tail;
      }
      require(h(t, j) == expect, "expand_topk row " + std::to_string(t) + " column " +
                                     std::to_string(j) + ": " + std::to_string(h(t, j)) +
                                     ", expected " + std::to_string(expect));
      require(h(t, j) < v, "expand_topk row " + std::to_string(t) +
                               " points past what the token sees");
    }
  }
  std::printf("expand_topk: %d query tokens, %d columns each, as the rule says\n", rows,
              width);
}

#if KPOOL_HAS_KOKKOSKERNELS
// One query over the 3 visible pools of a native f32 cache (K = 1, query at
// position 2): key p = (p, 0, ...), query (1, 0, ...), weight 1, so pool p
// scores p and the best two are pools 1 and 2.
void check_selection(Layer const& layer) {
  KPool::PoolCache<float, Mem> cache(layer.space, /*num_blocks=*/1, /*block_pools=*/4, D);
  auto hv = Kokkos::create_mirror_view(cache.values());
  auto hs = Kokkos::create_mirror_view(cache.scales());
  for (int p = 0; p < 4; ++p) {
    hs(0, p) = 1.0f;
    for (int c = 0; c < D; ++c) hv(0, p, c) = c == 0 ? static_cast<float>(p) : 0.0f;
  }
  Kokkos::deep_copy(cache.values(), hv);
  Kokkos::deep_copy(cache.scales(), hs);
  Kokkos::View<std::int32_t**, Mem> block_table("block_table", 1, 1), pool_ids("pool_ids", 1, 2);
  Kokkos::View<float***, Mem> q("q", 1, 1, D);
  Kokkos::View<float**, Mem> weights("weights", 1, 1);
  Kokkos::deep_copy(Kokkos::subview(q, 0, 0, 0), 1.0f);
  Kokkos::deep_copy(weights, 1.0f);
  KPool::SelectWorkspace<float, Mem> workspace(layer.space, /*max_tokens=*/1,
                                               /*max_visible=*/4, /*H=*/1, D);
  KPool::score_select(layer.space, device_u32("row_offsets", {0u, 1u}),
                      device_u32("cache_lengths", {2u}), block_table, 1, /*K=*/1, q,
                      weights, cache, /*topk=*/2, pool_ids, workspace);
  auto const h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), pool_ids);
  require(h(0, 0) == 1 && h(0, 1) == 2, "score_select chose pools " + std::to_string(h(0, 0)) +
                                            " and " + std::to_string(h(0, 1)) +
                                            ", expected 1 and 2");
  std::printf("score_select: pools 1 and 2 of 3, as their scores say\n");
}
#endif

}  // namespace

int main(int argc, char* argv[]) {
  Kokkos::ScopeGuard guard(argc, argv);
  std::printf("KPool %s consumer: K=%d, D=%d, %s, on %s\n", KPOOL_VERSION_STRING, K, D,
              KPool::storage_name<T>(), Exec::name());
  Layer layer;
  Sequence a{0, 0}, b{1, 1}, c{2, 1};

  // 1. Chunked prefill: A has a 19-token prompt, B 10. Batch rows need not
  //    follow slots: in the second call B is row 0.
  step(layer, {&a, &b}, {kChunk, kChunk}, "prefill A[0,7) B[0,7)");
  step(layer, {&b, &a}, {3, kChunk}, "prefill B[7,10) A[7,14)");
  step(layer, {&a}, {5}, "prefill A[14,19)");

  // 2. Speculative decode, next_n = 2; rows without a draft are padded.
  decode(layer, {&a, &b}, {2, 2}, "decode A+2 B+2");
  decode(layer, {&a, &b}, {1, 2}, "decode A+1 B+2");
  decode(layer, {&b, &a}, {2, 2}, "decode B+2 A+2");
  check_against_one_shot(layer, b);  // B is done

  // 3. Slot reuse: C takes B's slot with a 9-token prefill, starting at 0,
  //    in the same general step as a single-token decode of A.
  step(layer, {&c, &a}, {9, 1}, "prefill C[0,9), A+1 (step)");
  decode(layer, {&a, &c}, {2, 2}, "decode A+2 C+2");
  decode(layer, {&c, &a}, {2, 1}, "decode C+2 A+1");

  // 4. Every pool against a one-shot compress of its sequence.
  check_against_one_shot(layer, a);
  check_against_one_shot(layer, c);

  // 5. Pool ids back to token positions.
  check_expand_topk(layer, a, c);

  // 6. The selection stage, when KPool was built with Kokkos Kernels.
#if KPOOL_HAS_KOKKOSKERNELS
  check_selection(layer);
#endif
  std::printf("OK\n");
  return 0;
}
