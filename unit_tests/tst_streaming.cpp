// Streaming invariance (docs/writers.md, "What the tests check" 2): random
// sequences cut into random chunks and decode runs, batch rows shuffled
// every call, each sequence keeping its slot for life and a finished
// sequence's slot taken by a new one, give exactly the pools of a one-shot
// compress of each whole sequence, each once.
//
// With verify rounds ("Oracle properties" 4): a row sends the next token
// plus S drafts, a random prefix of the drafts is accepted, and the
// sequence's next row re-sends from the first rejected position with new
// values (a rewind), through decode_step and through step, fused and
// unfused, with the serving ring length. Every pool as last emitted equals,
// bit for bit, a one-shot compress of the values last sent.

#include <KPoolTestUtils.hpp>

#include <algorithm>
#include <map>

namespace {

using namespace KPoolTest;

template <class C>
class Streaming : public ::testing::Test {};
TYPED_TEST_SUITE(Streaming, Configs, ConfigName);

// Inputs are a function of (sequence, position, channel, sending), never of
// how the tokens were batched; each re-send of a position (`revision`)
// gets new values.
double input(std::uint64_t seq, std::uint64_t pos, int c, int which, DType t,
             int revision = 0) {
  Rng r((seq * 0x9E3779B97F4A7C15ull) ^ (pos * 0xC2B2AE3D27D4EB4Full) ^
        (static_cast<std::uint64_t>(c) * 0x165667B19E3779F9ull + which +
         8 * static_cast<std::uint64_t>(revision)));
  return KPoolRef::round_to(t, r.uniform(which ? -5 : -2, which ? 5 : 2));
}

struct Sequence {
  int id;
  int slot;
  int fed = 0;  // where its next row starts: the accepted tokens
  int length;   // finishes once fed reaches it
  int verify = -1;  // the row of this call is a verify round from here
};

template <class C>
class Simulation {
  using T = typename C::value_type;
  using E = typename C::execution_space;
  using Mem = typename C::memory_space;

 public:
  // drafts = S > 0 adds verify rounds, with the serving ring length.
  Simulation(int K, int D, std::uint64_t seed, int drafts = 0)
      : K_(K), D_(D), drafts_(drafts), rng_(seed), ape_(random_ape(rng_, K, D)),
        ring_(E(), slots_, K, D, KPool::Ring<T, Mem>::serving_length(K, drafts)),
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
      // Once its prompt is in, a sequence mostly decodes in verify rounds.
      for (Sequence* s : rows)
        s->verify = drafts_ > 0 && s->fed > 0 && rng_.below(3) != 0 ? s->fed : -1;
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
      std::vector<int> const& sends = sends_[id];
      for (int p = 0; p < fed; ++p)
        for (int c = 0; c < D_; ++c) {
          key.at(p, c) = input(id, p, c, 0, C::dtype, sends[p] - 1);
          gate.at(p, c) = input(id, p, c, 1, C::dtype, sends[p] - 1);
        }
      int const pools = fed / K_;
      int got = 0;
      for (auto const& kv : produced_)
        if (kv.first.first == id && kv.first.second < pools) ++got;
      ASSERT_EQ(got, pools) << "pools produced";
      // A rejected draft may have completed a pool past the final length;
      // without drafts nothing is produced there.
      if (drafts_ == 0) {
        for (auto const& kv : produced_)
          ASSERT_FALSE(kv.first.first == id && kv.first.second >= pools)
              << "pool " << kv.first.second << " is past the sequence's length";
      }
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
  int rewinds() const { return rewinds_; }
  // Emissions past the first of a pool (a re-sent last member).
  int re_emissions() const { return emitted_ - pools_seen(); }
  int emitted() const { return emitted_; }
  // Every emission a row's sent positions account for: one per position
  // that ends a pool ("Rewinds": a pool is emitted each time its last
  // member is sent).
  int expected_emissions() const { return expected_emitted_; }
  bool used_both_step_paths() const { return fused_calls_ > 0 && unfused_calls_ > 0; }

 private:
  void admit() {
    while (!free_.empty() && rng_.below(3) != 0) {
      int const slot = free_.front();
      free_.erase(free_.begin());
      if (used_[slot]) ++reuses_;
      used_[slot] = true;
      live_.push_back(Sequence{next_id_++, slot, 0, 1 + rng_.below(12 * K_ + 9)});
      fed_[live_.back().id] = 0;
      sends_[live_.back().id].clear();
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
      take = s->verify >= 0 ? 1 + drafts_ : std::min(take, left);
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
      for (int i = 0; i < fed[r].second; ++i) {
        int const rev = send(fed[r].first->id, cache[r] + i);
        for (int c = 0; c < D_; ++c) {
          key.at(offsets[r] + i, c) = input(fed[r].first->id, cache[r] + i, c, 0, C::dtype, rev);
          gate.at(offsets[r] + i, c) = input(fed[r].first->id, cache[r] + i, c, 1, C::dtype, rev);
        }
      }
    using U32 = Kokkos::View<std::uint32_t*, Mem>;
    KPool::Options o = test_options<E>();
    o.fused = rng_.below(2) == 0;
    ++(o.fused ? fused_calls_ : unfused_calls_);
    KPool::step(E(), ring_, to_view<T, Mem>(key, "key"), to_view<T, Mem>(gate, "gate"),
                ape_view<Mem>(ape_), to_index_view<U32>(offsets, "row_offsets"),
                to_index_view<U32>(cache, "cache_lengths"), to_index_view<U32>(slot, "slot_idx"),
                n, out_, o);
    collect(rows);
    for (auto& f : fed) advance(*f.first, f.second);
  }

  // The decode step: next_n in 1..2K, padded entries anywhere in a row.
  void decode(std::vector<Sequence*> const& rows) {
    int const n = static_cast<int>(rows.size());
    int const B = n + rng_.below(2);
    int const next_n = std::max(1 + rng_.below(2 * K_), 1 + drafts_);
    std::vector<std::int32_t> positions(B * next_n, -1);
    std::vector<std::uint32_t> slot(B, 4242u);
    Kokkos::View<T***, Kokkos::LayoutRight, Mem> key("key", B, next_n, D_), gate("gate", B, next_n, D_);
    auto hk = Kokkos::create_mirror_view(key);
    auto hg = Kokkos::create_mirror_view(gate);
    std::vector<int> taken(n);
    for (int r = 0; r < n; ++r) {
      Sequence* s = rows[r];
      slot[r] = s->slot;
      int const real = s->verify >= 0 ? 1 + drafts_
                                      : std::min(rng_.below(next_n + 1), s->length - s->fed);
      std::vector<int> cols(next_n);
      for (int i = 0; i < next_n; ++i) cols[i] = i;
      for (int i = next_n; i > 1; --i) std::swap(cols[i - 1], cols[rng_.below(i)]);
      std::sort(cols.begin(), cols.begin() + real);
      for (int j = 0; j < real; ++j) {
        int const pos = s->fed + j;
        positions[r * next_n + cols[j]] = pos;
        int const rev = send(s->id, pos);
        for (int c = 0; c < D_; ++c) {
          hk(r, cols[j], c) = to_storage<T>(input(s->id, pos, c, 0, C::dtype, rev));
          hg(r, cols[j], c) = to_storage<T>(input(s->id, pos, c, 1, C::dtype, rev));
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
    for (int r = 0; r < n; ++r) advance(*rows[r], taken[r]);
  }

  // Records one sending of `pos`; returns its revision (0 the first).
  int send(int id, int pos) {
    std::vector<int>& sends = sends_[id];
    if (static_cast<int>(sends.size()) <= pos) sends.resize(pos + 1, 0);
    if (pos % K_ == K_ - 1) ++expected_emitted_;
    return sends[pos]++;
  }

  // After a row sent [fed, fed + n): the sequence's length is its end
  // (fed_, what verify() checks); a verify round then accepts a random
  // prefix of its drafts, and the next row re-sends from the first
  // rejected one.
  void advance(Sequence& s, int n) {
    if (s.fed < fed_[s.id]) ++rewinds_;
    fed_[s.id] = s.fed + n;
    s.fed += s.verify >= 0 ? 1 + rng_.below(drafts_ + 1) : n;
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
      ++emitted_;
      // The last emission counts (a re-sent pool replaces its value);
      // without drafts there is exactly one.
      bool const fresh = produced_.insert_or_assign(std::make_pair(id, int(hi(o))), v).second;
      if (drafts_ == 0) {
        ASSERT_TRUE(fresh) << "sequence " << id << " pool " << hi(o) << " produced twice";
      }
    }
  }

  int K_, D_, drafts_;
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
  std::map<int, std::vector<int>> sends_;  // per sequence, sendings per position
  int next_id_ = 0;
  int reuses_ = 0;
  int rewinds_ = 0;
  int emitted_ = 0;
  int expected_emitted_ = 0;
  int fused_calls_ = 0, unfused_calls_ = 0;
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

// Verify rounds with S drafts and the serving ring length R = K *
// next_pow2(ceil((K + S) / K)), on both step paths and every storage type.
TYPED_TEST(Streaming, RejectedDraftsReSentGiveOneShotPools) {
  for (int S : {1, 3, 7})
    for (int K : {1, 3, 4}) {
      int const D = K == 4 && S == 3 ? 128 : 7;  // K = 4, D = 128: the fast path
      SCOPED_TRACE(shape(K, D) + " S=" + std::to_string(S));
      Simulation<TypeParam> sim(K, D, 6007 * K + 31 * S + D, S);
      sim.run(40);
      sim.verify();
      EXPECT_EQ(sim.emitted(), sim.expected_emissions())
          << "a pool is emitted each time its last member is sent";
      EXPECT_GT(sim.rewinds(), 5);
      EXPECT_GT(sim.re_emissions(), 0);
      EXPECT_TRUE(sim.used_both_step_paths());
    }
}

// The vLLM #58454 scenario, K = 4: positions 0..5 one per call, a verify
// call [6, 7, 8, 9] (the next token and drafts 7..9; draft 7 completes pool
// 1), then, draft 7 rejected, the re-send [7, 8, 9, 10] with new values.
// Pool 1 is emitted again from its committed members 4..6 and the accepted
// 7. With a K-entry ring the drafts 8 and 9 have overwritten positions 4
// and 5 (ring indices 0 and 1), so the re-emitted pool is built from
// rejected drafts: it differs from a one-shot compress of the final
// sequence. With the serving ring length (8 for S = 3) it does not.
template <class C>
class DraftScenario {
  using T = typename C::value_type;
  using E = typename C::execution_space;
  using Mem = typename C::memory_space;
  using U32 = Kokkos::View<std::uint32_t*, Mem>;

 public:
  enum class Path { decode, fused, unfused };

  DraftScenario(int D, int R, Path path)
      : D_(D), path_(path), ape_(random_ape(rng_, K, D)), ring_(E(), 1, K, D, R),
        out_(E(), 16, 1, D) {}

  // Sends positions [c, c + n), the r-th sending of each with revision r.
  void send(int c, int n) {
    Matrix key(n, D_), gate(n, D_);
    for (int i = 0; i < n; ++i) {
      int const rev = sends_[c + i]++;
      for (int ch = 0; ch < D_; ++ch) {
        key.at(i, ch) = input(5, c + i, ch, 0, C::dtype, rev);
        gate.at(i, ch) = input(5, c + i, ch, 1, C::dtype, rev);
      }
    }
    E space;
    auto const slot = to_index_view<U32>(std::vector<std::uint32_t>{0}, "slot_idx");
    if (path_ == Path::decode) {
      std::vector<std::int32_t> pos(n);
      for (int i = 0; i < n; ++i) pos[i] = c + i;
      KPool::decode_step(space, ring_, to_view3<T, Mem>(key, n, "key"),
                         to_view3<T, Mem>(gate, n, "gate"), ape_view<Mem>(ape_),
                         positions_view<Mem>(pos, n), slot, 1, out_, test_options<E>());
    } else {
      KPool::Options o = test_options<E>();
      o.fused = path_ == Path::fused;
      KPool::step(space, ring_, to_view<T, Mem>(key, "key"), to_view<T, Mem>(gate, "gate"),
                  ape_view<Mem>(ape_),
                  to_index_view<U32>(std::vector<std::uint32_t>{0, std::uint32_t(n)}, "ro"),
                  to_index_view<U32>(std::vector<std::uint32_t>{std::uint32_t(c)}, "cl"), slot,
                  1, out_, o);
    }
    std::uint32_t const count = on_host(out_.count())();
    auto const ids = on_host(out_.pool_id());
    auto const pooled = on_host(out_.pooled());
    for (std::uint32_t o = 0; o < count; ++o) {
      std::vector<T>& v = last_[ids(o)];
      v.resize(D_);
      for (int ch = 0; ch < D_; ++ch) v[ch] = pooled(o, ch);
    }
    length_ = c + n;
  }

  // Whether every pool within the length, as last emitted, is bit for bit
  // a one-shot compress of the values last sent.
  ::testing::AssertionResult matches_one_shot() const {
    Matrix key(length_, D_), gate(length_, D_);
    for (int p = 0; p < length_; ++p)
      for (int ch = 0; ch < D_; ++ch) {
        key.at(p, ch) = input(5, p, ch, 0, C::dtype, sends_.at(p) - 1);
        gate.at(p, ch) = input(5, p, ch, 1, C::dtype, sends_.at(p) - 1);
      }
    int const pools = length_ / K;
    E space;
    U32 offsets("offsets", 2);
    Kokkos::View<T**, Kokkos::LayoutRight, Mem> once("once", pools, D_);
    KPool::compress(space, to_view<T, Mem>(key, "key"), to_view<T, Mem>(gate, "gate"),
                    ape_view<Mem>(ape_),
                    to_index_view<U32>(std::vector<std::uint32_t>{0, std::uint32_t(length_)}, "ro"),
                    to_index_view<U32>(std::vector<std::uint32_t>{0}, "cl"), 1, offsets, once);
    auto const h = on_host(once);
    for (int p = 0; p < pools; ++p) {
      auto const it = last_.find(p);
      if (it == last_.end()) return ::testing::AssertionFailure() << "pool " << p << " never emitted";
      for (int ch = 0; ch < D_; ++ch)
        if (!same_bits(it->second[ch], h(p, ch)))
          return ::testing::AssertionFailure()
                 << "pool " << p << " channel " << ch << ": last emitted "
                 << to_double(it->second[ch]) << ", one-shot " << to_double(h(p, ch));
    }
    return ::testing::AssertionSuccess();
  }

  static constexpr int K = 4;

 private:
  int D_;
  Path path_;
  Rng rng_{58454};
  Matrix ape_;
  KPool::Ring<T, Mem> ring_;
  KPool::StepOutput<T, Mem> out_;
  std::map<int, int> sends_;
  std::map<int, std::vector<T>> last_;
  int length_ = 0;
};

TYPED_TEST(Streaming, Vllm58454DraftsPastAPoolBoundaryNeedTheServingRing) {
  using S = DraftScenario<TypeParam>;
  int const K = S::K;
  int const serving = KPool::Ring<typename TypeParam::value_type,
                                  typename TypeParam::memory_space>::serving_length(K, 3);
  ASSERT_EQ(serving, 8);
  for (auto path : {S::Path::decode, S::Path::fused, S::Path::unfused})
    for (int D : {8, 128})
      for (int R : {K, serving}) {
        SCOPED_TRACE("path " + std::to_string(static_cast<int>(path)) + " D=" +
                     std::to_string(D) + " R=" + std::to_string(R));
        S run(D, R, path);
        for (int pos = 0; pos < 6; ++pos) run.send(pos, 1);
        run.send(6, 4);  // the next token 6 and drafts 7, 8, 9
        EXPECT_TRUE(run.matches_one_shot()) << "before any rewind";
        run.send(7, 4);  // 7 rejected: re-send from it, plus new drafts
        if (R == K)
          EXPECT_FALSE(run.matches_one_shot())
              << "a K-entry ring should have lost pool 1's members to the drafts";
        else
          EXPECT_TRUE(run.matches_one_shot());
      }
}

}  // namespace
