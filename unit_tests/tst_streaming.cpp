// Streaming invariance (docs/writers.md, "What the tests check" 2): random
// sequences cut into random chunks and decode runs, batch rows shuffled
// every call, each sequence keeping its slot for life and a finished
// sequence's slot taken by a new one, give exactly the pools of a one-shot
// compress of each whole sequence, each once.

#include <KPoolTestUtils.hpp>

#include <algorithm>
#include <map>

namespace {

using namespace KPoolTest;

template <class C>
class Streaming : public ::testing::Test {};
TYPED_TEST_SUITE(Streaming, Configs, ConfigName);

// Inputs are a function of (sequence, position, channel), never of how the
// tokens were batched.
double input(std::uint64_t seq, std::uint64_t pos, int c, int which, DType t) {
  Rng r((seq * 0x9E3779B97F4A7C15ull) ^ (pos * 0xC2B2AE3D27D4EB4Full) ^
        (static_cast<std::uint64_t>(c) * 0x165667B19E3779F9ull + which));
  return KPoolRef::round_to(t, r.uniform(which ? -5 : -2, which ? 5 : 2));
}

struct Sequence {
  int id;
  int slot;
  int fed = 0;
  int length;
};

template <class C>
class Simulation {
  using T = typename C::value_type;
  using E = typename C::execution_space;
  using Mem = typename C::memory_space;

 public:
  Simulation(int K, int D, std::uint64_t seed)
      : K_(K), D_(D), rng_(seed), ape_(random_ape(rng_, K, D)),
        ring_(E(), slots_, K, D),
        out_(E(), KPool::StepOutput<T, Mem>::capacity_for(max_tokens_, max_batch_, K),
             max_batch_, D) {
    for (int s = 0; s < slots_; ++s) free_.push_back(s);
  }

  void run(int calls) {
    for (int call = 0; call < calls; ++call) {
      admit();
      std::vector<Sequence*> rows;
      for (auto& s : live_)
        if (s.fed < s.length && rng_.below(5) != 0) rows.push_back(&s);
      for (std::size_t i = rows.size(); i > 1; --i)
        std::swap(rows[i - 1], rows[rng_.below(static_cast<int>(i))]);
      if (rows.empty()) continue;
      if (rng_.below(3) == 0)
        decode(rows);
      else
        general(rows);
      retire();
    }
  }

  // Every complete pool of every sequence, each exactly once, bit for bit
  // a one-shot compress of the whole sequence and within tolerance of the
  // f64 reference.
  void verify() {
    E space;
    for (auto const& [id, fed] : fed_) {
      SCOPED_TRACE("sequence " + std::to_string(id) + " of " + std::to_string(fed) + " tokens");
      Matrix key(fed, D_), gate(fed, D_);
      for (int p = 0; p < fed; ++p)
        for (int c = 0; c < D_; ++c) {
          key.at(p, c) = input(id, p, c, 0, C::dtype);
          gate.at(p, c) = input(id, p, c, 1, C::dtype);
        }
      int const pools = fed / K_;
      int got = 0;
      for (auto const& kv : produced_)
        if (kv.first.first == id) ++got;
      ASSERT_EQ(got, pools) << "pools produced";
      if (pools == 0) continue;
      Matrix const ref = KPoolRef::one_shot(key, gate, ape_);
      Matrix const scale = KPoolRef::one_shot_scale(key, gate, ape_);
      using U32 = Kokkos::View<std::uint32_t*, Mem>;
      U32 offsets("offsets", 2);
      Kokkos::View<T**, Kokkos::LayoutRight, Mem> once("once", pools, D_);
      KPool::compress(space, to_view<T, Mem>(key, "key"), to_view<T, Mem>(gate, "gate"),
                      ape_view<Mem>(ape_),
                      to_index_view<U32>(std::vector<std::uint32_t>{0, std::uint32_t(fed)}, "ro"),
                      to_index_view<U32>(std::vector<std::uint32_t>{0}, "cl"), 1, offsets,
                      once);
      auto const h = on_host(once);
      for (int p = 0; p < pools; ++p) {
        auto const it = produced_.find({id, p});
        ASSERT_NE(it, produced_.end()) << "pool " << p << " never produced";
        for (int c = 0; c < D_; ++c)
          ASSERT_TRUE(same_bits(it->second[c], h(p, c)))
              << "pool " << p << " channel " << c << ": streamed "
              << to_double(it->second[c]) << ", one-shot " << to_double(h(p, c));
        ASSERT_TRUE(pool_matches(C::dtype, it->second.data(), 1, ref.row(p), scale.row(p), D_))
            << "pool " << p;
      }
    }
  }

  int pools_seen() const { return static_cast<int>(produced_.size()); }
  int sequences_seen() const { return static_cast<int>(fed_.size()); }
  int slot_reuses() const { return reuses_; }

 private:
  void admit() {
    while (!free_.empty() && rng_.below(3) != 0) {
      int const slot = free_.front();
      free_.erase(free_.begin());
      if (used_[slot]) ++reuses_;
      used_[slot] = true;
      live_.push_back(Sequence{next_id_++, slot, 0, 1 + rng_.below(12 * K_ + 9)});
      fed_[live_.back().id] = 0;
    }
  }

  void retire() {
    for (auto it = live_.begin(); it != live_.end();) {
      if (it->fed >= it->length) {
        free_.push_back(it->slot);
        it = live_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // The general step: chunks of any size, zero-token rows and one-token
  // decodes, garbage rows past num_requests.
  void general(std::vector<Sequence*> const& rows) {
    int const n = static_cast<int>(rows.size());
    int const B = n + rng_.below(3);
    std::vector<std::uint32_t> offsets{0}, cache, slot;
    std::vector<std::pair<Sequence*, int>> fed;
    for (Sequence* s : rows) {
      int const left = s->length - s->fed;
      int const kind = rng_.below(4);
      int take = kind == 0 ? 0 : kind == 1 ? 1 : 1 + rng_.below(4 * K_ + 3);
      take = std::min(take, left);
      cache.push_back(s->fed);
      slot.push_back(s->slot);
      offsets.push_back(offsets.back() + take);
      fed.emplace_back(s, take);
    }
    for (int r = n; r < B; ++r) {
      cache.push_back(static_cast<std::uint32_t>(rng_.next()));
      slot.push_back(static_cast<std::uint32_t>(rng_.next()));
      offsets.push_back(static_cast<std::uint32_t>(rng_.next()));
    }
    int const total = static_cast<int>(offsets[n]);
    Matrix key(std::max(total, 1), D_), gate(std::max(total, 1), D_);
    for (int r = 0; r < n; ++r)
      for (int i = 0; i < fed[r].second; ++i)
        for (int c = 0; c < D_; ++c) {
          key.at(offsets[r] + i, c) = input(fed[r].first->id, cache[r] + i, c, 0, C::dtype);
          gate.at(offsets[r] + i, c) = input(fed[r].first->id, cache[r] + i, c, 1, C::dtype);
        }
    using U32 = Kokkos::View<std::uint32_t*, Mem>;
    KPool::Options o = test_options<E>();
    o.fused = rng_.below(2) == 0;
    KPool::step(E(), ring_, to_view<T, Mem>(key, "key"), to_view<T, Mem>(gate, "gate"),
                ape_view<Mem>(ape_), to_index_view<U32>(offsets, "row_offsets"),
                to_index_view<U32>(cache, "cache_lengths"), to_index_view<U32>(slot, "slot_idx"),
                n, out_, o);
    collect(rows);
    for (auto& f : fed) {
      f.first->fed += f.second;
      fed_[f.first->id] = f.first->fed;
    }
  }

  // The decode step: next_n in 1..2K, padded entries anywhere in a row.
  void decode(std::vector<Sequence*> const& rows) {
    int const n = static_cast<int>(rows.size());
    int const B = n + rng_.below(2);
    int const next_n = 1 + rng_.below(2 * K_);
    std::vector<std::int32_t> positions(B * next_n, -1);
    std::vector<std::uint32_t> slot(B, 4242u);
    Kokkos::View<T***, Kokkos::LayoutRight, Mem> key("key", B, next_n, D_), gate("gate", B, next_n, D_);
    auto hk = Kokkos::create_mirror_view(key);
    auto hg = Kokkos::create_mirror_view(gate);
    std::vector<int> taken(n);
    for (int r = 0; r < n; ++r) {
      Sequence* s = rows[r];
      slot[r] = s->slot;
      int const real = std::min(rng_.below(next_n + 1), s->length - s->fed);
      std::vector<int> cols(next_n);
      for (int i = 0; i < next_n; ++i) cols[i] = i;
      for (int i = next_n; i > 1; --i) std::swap(cols[i - 1], cols[rng_.below(i)]);
      std::sort(cols.begin(), cols.begin() + real);
      for (int j = 0; j < real; ++j) {
        int const pos = s->fed + j;
        positions[r * next_n + cols[j]] = pos;
        for (int c = 0; c < D_; ++c) {
          hk(r, cols[j], c) = to_storage<T>(input(s->id, pos, c, 0, C::dtype));
          hg(r, cols[j], c) = to_storage<T>(input(s->id, pos, c, 1, C::dtype));
        }
      }
      taken[r] = real;
    }
    Kokkos::deep_copy(key, hk);
    Kokkos::deep_copy(gate, hg);
    Kokkos::View<std::int32_t**, Kokkos::LayoutRight, Mem> pos_v("positions", B, next_n);
    auto hp = Kokkos::create_mirror_view(pos_v);
    for (int r = 0; r < B; ++r)
      for (int i = 0; i < next_n; ++i) hp(r, i) = positions[r * next_n + i];
    Kokkos::deep_copy(pos_v, hp);
    KPool::decode_step(E(), ring_, key, gate, ape_view<Mem>(ape_), pos_v,
                       to_index_view<Kokkos::View<std::uint32_t*, Mem>>(slot, "slot_idx"), n,
                       out_, test_options<E>());
    collect(rows);
    for (int r = 0; r < n; ++r) {
      rows[r]->fed += taken[r];
      fed_[rows[r]->id] = rows[r]->fed;
    }
  }

  void collect(std::vector<Sequence*> const& rows) {
    std::uint32_t const count = on_host(out_.count())();
    auto const hb = on_host(out_.batch_row());
    auto const hi = on_host(out_.pool_id());
    auto const hp = on_host(out_.pooled());
    for (std::uint32_t o = 0; o < count; ++o) {
      ASSERT_LT(hb(o), static_cast<int>(rows.size()));
      int const id = rows[hb(o)]->id;
      std::vector<T> v(D_);
      for (int c = 0; c < D_; ++c) v[c] = hp(o, c);
      bool const fresh = produced_.emplace(std::make_pair(id, int(hi(o))), v).second;
      ASSERT_TRUE(fresh) << "sequence " << id << " pool " << hi(o) << " produced twice";
    }
  }

  int K_, D_;
  Rng rng_;
  Matrix ape_;
  static constexpr int slots_ = 6, max_batch_ = 12, max_tokens_ = 12 * (4 * 16 + 3);
  KPool::Ring<T, Mem> ring_;
  KPool::StepOutput<T, Mem> out_;
  std::vector<int> free_;
  std::map<int, bool> used_;
  std::vector<Sequence> live_;
  std::map<int, int> fed_;
  std::map<std::pair<int, int>, std::vector<T>> produced_;
  int next_id_ = 0;
  int reuses_ = 0;
};

TYPED_TEST(Streaming, ChunkedAndDecodedSequencesGiveOneShotPools) {
  for (int K : k_grid())
    for (int D : {7, 128}) {
      SCOPED_TRACE(shape(K, D));
      Simulation<TypeParam> sim(K, D, 7919 * K + D);
      sim.run(60);
      sim.verify();
      // The run exercised what it claims to.
      EXPECT_GT(sim.pools_seen(), 10);
      EXPECT_GT(sim.slot_reuses(), 0);
    }
}

}  // namespace
