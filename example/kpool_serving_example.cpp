// A serving loop in miniature: three requests arrive, their prompts are
// prefilled in chunks of 10 tokens, then they decode two tokens a step
// (speculative decoding, the second token sometimes rejected). Every step,
// KPool builds the pooled keys whose last token arrived, and this program
// prints them. At the end every pool is checked against a one-shot
// compress of the whole sequence: streaming must not change a single bit.

#include <KPool.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace {

using T = KPool::bfloat16;
using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
constexpr int K = 4;    // tokens per pool
constexpr int D = 128;  // channels per key
constexpr int kChunk = 10;  // not a multiple of K: chunks end mid-pool

// Deterministic stand-ins for the model's keys and gate scores.
float input(int seq, int pos, int c, int which) {
  std::uint64_t z = 0x9E3779B97F4A7C15ull * (seq + 1) ^ (pos * 0xC2B2AE3D27D4EB4Full) ^
                    (c * 0x165667B19E3779F9ull + which);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<float>((z >> 40) & 0xFFFFFF) / 16777216.0f * 4.0f - 2.0f;
}

struct Request {
  int seq;
  int slot;
  int prompt;
  int fed = 0;
};

using Pools = std::map<std::pair<int, int>, std::vector<T>>;  // (seq, pool)

template <class V>
V host_filled(std::string const& label, std::vector<typename V::value_type> const& v) {
  V d(label, v.size());
  auto h = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < v.size(); ++i) h(i) = v[i];
  Kokkos::deep_copy(d, h);
  return d;
}

// Reads back what a step closed and remembers it per sequence.
void collect(KPool::StepOutput<T, Mem> const& out, std::vector<Request*> const& rows,
             Pools& pools) {
  std::uint32_t count = 0;
  Kokkos::deep_copy(count, out.count());
  auto const row = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out.batch_row());
  auto const id = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out.pool_id());
  auto const pooled = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out.pooled());
  std::printf("  closed %u pool%s:", count, count == 1 ? "" : "s");
  for (std::uint32_t i = 0; i < count; ++i) {
    int const seq = rows[row(i)]->seq;
    std::vector<T> v(D);
    for (int c = 0; c < D; ++c) v[c] = pooled(i, c);
    pools[{seq, id(i)}] = v;
    std::printf(" s%d/p%d", seq, id(i));
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char* argv[]) {
  Kokkos::ScopeGuard guard(argc, argv);
  Exec space;
  std::printf("KPool %s serving example: K=%d, D=%d, %s, on %s\n", KPOOL_VERSION_STRING,
              K, D, KPool::storage_name<T>(), Exec::name());

  std::vector<Request> requests = {{0, 2, 37}, {1, 0, 20}, {2, 1, 9}};
  int const max_batch = static_cast<int>(requests.size());
  int const max_tokens = max_batch * kChunk;

  // Model parameter and per-layer state, allocated once.
  Kokkos::View<float**, Mem> ape("ape", K, D);
  {
    auto h = Kokkos::create_mirror_view(ape);
    for (int m = 0; m < K; ++m)
      for (int c = 0; c < D; ++c) h(m, c) = 0.25f * input(99, m, c, 2);
    Kokkos::deep_copy(ape, h);
  }
  KPool::Ring<T, Mem> ring(space, /*max_slots=*/4, K, D);
  KPool::StepOutput<T, Mem> out(
      space, KPool::StepOutput<T, Mem>::capacity_for(max_tokens, max_batch, K), max_batch, D);
  Pools pools;
  std::map<int, int> lengths;

  // Prefill: every request with prompt left gets up to kChunk tokens.
  for (int step = 0;; ++step) {
    std::vector<Request*> rows;
    for (auto& r : requests)
      if (r.fed < r.prompt) rows.push_back(&r);
    if (rows.empty()) break;
    std::vector<std::uint32_t> offsets{0}, cache, slots;
    for (Request* r : rows) {
      int const n = std::min(kChunk, r->prompt - r->fed);
      cache.push_back(r->fed);
      slots.push_back(r->slot);
      offsets.push_back(offsets.back() + n);
    }
    Kokkos::View<T**, Mem> key("key", offsets.back(), D), gate("gate", offsets.back(), D);
    auto hk = Kokkos::create_mirror_view(key);
    auto hg = Kokkos::create_mirror_view(gate);
    std::printf("prefill step %d:", step);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      std::printf(" s%d[%u..%u)", rows[i]->seq, cache[i], cache[i] + offsets[i + 1] - offsets[i]);
      for (std::uint32_t t = offsets[i]; t < offsets[i + 1]; ++t)
        for (int c = 0; c < D; ++c) {
          hk(t, c) = T(input(rows[i]->seq, cache[i] + (t - offsets[i]), c, 0));
          hg(t, c) = T(input(rows[i]->seq, cache[i] + (t - offsets[i]), c, 1));
        }
    }
    std::printf("\n");
    Kokkos::deep_copy(key, hk);
    Kokkos::deep_copy(gate, hg);
    using U32 = Kokkos::View<std::uint32_t*, Mem>;
    KPool::step(space, ring, key, gate, ape, host_filled<U32>("row_offsets", offsets),
                host_filled<U32>("cache_lengths", cache), host_filled<U32>("slot_idx", slots),
                static_cast<int>(rows.size()), out);
    collect(out, rows, pools);
    for (std::size_t i = 0; i < rows.size(); ++i) rows[i]->fed += offsets[i + 1] - offsets[i];
  }

  // Decode: two tokens a step; a rejected speculative token is padding (-1).
  int const next_n = 2;
  for (int step = 0; step < 6; ++step) {
    int const B = static_cast<int>(requests.size());
    std::vector<Request*> rows;
    Kokkos::View<T***, Mem> key("key", B, next_n, D), gate("gate", B, next_n, D);
    Kokkos::View<std::int32_t**, Mem> positions("positions", B, next_n);
    auto hk = Kokkos::create_mirror_view(key);
    auto hg = Kokkos::create_mirror_view(gate);
    auto hp = Kokkos::create_mirror_view(positions);
    std::vector<std::uint32_t> slots;
    std::printf("decode step %d:", step);
    for (int r = 0; r < B; ++r) {
      Request& q = requests[r];
      rows.push_back(&q);
      slots.push_back(q.slot);
      bool const rejected = (step + q.seq) % 3 == 0;
      for (int i = 0; i < next_n; ++i) {
        bool const real = i == 0 || !rejected;
        hp(r, i) = real ? q.fed + i : -1;
        for (int c = 0; c < D; ++c) {
          hk(r, i, c) = T(real ? input(q.seq, q.fed + i, c, 0) : 0.0f);
          hg(r, i, c) = T(real ? input(q.seq, q.fed + i, c, 1) : 0.0f);
        }
      }
      std::printf(" s%d+%d", q.seq, rejected ? 1 : 2);
    }
    std::printf("\n");
    Kokkos::deep_copy(key, hk);
    Kokkos::deep_copy(gate, hg);
    Kokkos::deep_copy(positions, hp);
    KPool::decode_step(space, ring, key, gate, ape, positions,
                       host_filled<Kokkos::View<std::uint32_t*, Mem>>("slot_idx", slots), B, out);
    collect(out, rows, pools);
    for (int r = 0; r < B; ++r) requests[r].fed += hp(r, 1) >= 0 ? 2 : 1;
  }

  // Check: each sequence's pools, exactly those complete, bit for bit a
  // one-shot compress of all its tokens.
  for (auto const& q : requests) {
    int const L = q.fed, n_pools = L / K;
    Kokkos::View<T**, Mem> key("key", L, D), gate("gate", L, D), once("once", n_pools, D);
    auto hk = Kokkos::create_mirror_view(key);
    auto hg = Kokkos::create_mirror_view(gate);
    for (int t = 0; t < L; ++t)
      for (int c = 0; c < D; ++c) {
        hk(t, c) = T(input(q.seq, t, c, 0));
        hg(t, c) = T(input(q.seq, t, c, 1));
      }
    Kokkos::deep_copy(key, hk);
    Kokkos::deep_copy(gate, hg);
    using U32 = Kokkos::View<std::uint32_t*, Mem>;
    U32 offsets("pool_row_offsets", 2);
    KPool::compress(space, key, gate, ape, host_filled<U32>("row_offsets", {0u, std::uint32_t(L)}),
                    host_filled<U32>("cache_lengths", {0u}), 1, offsets, once);
    auto const h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), once);
    int streamed = 0;
    for (auto const& p : pools) streamed += p.first.first == q.seq ? 1 : 0;
    if (streamed != n_pools) {
      std::printf("MISMATCH: sequence %d of %d tokens streamed %d pools, expected %d\n", q.seq, L,
                  streamed, n_pools);
      return 1;
    }
    for (int p = 0; p < n_pools; ++p) {
      auto const it = pools.find({q.seq, p});
      if (it == pools.end()) {
        std::printf("MISMATCH: sequence %d pool %d never closed\n", q.seq, p);
        return 1;
      }
      for (int c = 0; c < D; ++c)
        if (std::memcmp(&it->second[c], &h(p, c), sizeof(T)) != 0) {
          std::printf("MISMATCH: sequence %d pool %d channel %d: streamed %.9g, one-shot %.9g\n",
                      q.seq, p, c, static_cast<float>(it->second[c]), static_cast<float>(h(p, c)));
          return 1;
        }
    }
    std::printf("sequence %d: %d tokens, %d pools match a one-shot compress\n", q.seq, L, n_pools);
  }
  std::printf("OK\n");
  return 0;
}
