// Streaming invariance (docs/writers.md, "What the tests check" 2): random
// sequences cut into random chunks and decode runs, batch rows shuffled
// every call, each sequence keeping its slot for life and a finished
// sequence's slot taken by a new one, give exactly the pools of a one-shot
// compress of each whole sequence, each once.
//
// With verify rounds ("Oracle properties" 4): a row sends the next token
// plus S drafts, a random prefix of the drafts is accepted, and the
// sequence's next row re-sends from the first rejected position with new
// values (a rewind), through step with a decode batch and a ragged one
// (fused and unfused), with the serving ring length. Every pool as last
// emitted equals, bit for bit, a one-shot compress of the values last sent.
//
// With a pool cache (docs/indexer.md, "The pool cache"), passed to every
// step and decode step, each sequence's cache entries (values and scales)
// as the steps wrote them are byte-identical to those store_pools writes
// from a one-shot compress of the whole final sequence, and to the
// independent reference's Q(R(x)) of its pools (KPoolCacheReference.hpp),
// for native and fp8 (amax, pow2) caches, rotated and not.

#include "KPoolStreamingSimulation.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <type_traits>

namespace {

using namespace KPoolTest;
using namespace KPoolStreamingTest;

template <class C>
class Streaming : public ::testing::Test {};
TYPED_TEST_SUITE(Streaming, Configs, ConfigName);


// Each simulation writes one cache kind (or none), the kinds taken in turn
// so that every kind of the storage type runs at each head_dim.
TYPED_TEST(Streaming, ChunkedAndDecodedSequencesGiveOneShotPools) {
  std::vector<int> const ks = k_grid();
  for (std::size_t i = 0; i < ks.size(); ++i)
    for (int D : {7, 128}) {
      int const K = ks[i];
      std::vector<CacheKind> const kinds = cache_kinds(TypeParam::dtype, D);
      CacheKind const kind = kinds[i % kinds.size()];
      SCOPED_TRACE(shape(K, D) + ", " + cache_name(kind));
      Simulation<TypeParam> sim(K, D, 7919 * K + D, 0, kind);
      sim.run(60);
      sim.verify();
      // The run exercised what it claims to.
      EXPECT_GT(sim.pools_seen(), 10);
      EXPECT_GT(sim.slot_reuses(), 0);
      if (kind.on) {
        EXPECT_TRUE(sim.used_every_path());
        EXPECT_GT(sim.cache_entries_checked(), 10);
      }
    }
}

// Verify rounds with S drafts and the serving ring length R = K *
// next_pow2(ceil((K + S) / K)), on both step paths and every storage type.
// Cache kinds in turn as above; rewinds re-emit pools, whose entries the
// re-emission overwrites.
TYPED_TEST(Streaming, RejectedDraftsReSentGiveOneShotPools) {
  int i = 0;
  for (int S : {1, 3, 7})
    for (int K : {1, 3, 4}) {
      // K = 4, D = 128: the fast path; D = 8: small rotated caches.
      int const D = K == 4 && S == 3 ? 128 : S == 7 ? 8 : 7;
      std::vector<CacheKind> const kinds = cache_kinds(TypeParam::dtype, D);
      CacheKind const kind = kinds[(i++ + 1) % kinds.size()];
      SCOPED_TRACE(shape(K, D) + " S=" + std::to_string(S) + ", " + cache_name(kind));
      Simulation<TypeParam> sim(K, D, 6007 * K + 31 * S + D, S, kind);
      sim.run(40);
      sim.verify();
      if (kind.on) {
        EXPECT_GT(sim.cache_entries_checked(), 10);
      }
      EXPECT_EQ(sim.emitted(), sim.expected_emissions())
          << "a pool is emitted each time its last member is sent";
      EXPECT_GT(sim.rewinds(), 5);
      EXPECT_GT(sim.re_emissions(), 0);
      EXPECT_TRUE(sim.used_both_step_paths());
    }
}

// The serving profile's cache (docs/indexer.md, "The serving profile"),
// written by every step path, with and without rotation, with verify
// rounds whose rewinds re-emit pools: byte-identical to the reference and
// to store_pools of the one-shot pools, as the other caches.
TYPED_TEST(Streaming, ServingCachesStreamAndRewind) {
  if constexpr (TypeParam::dtype != DType::f64) {
    int i = 0;
    for (int D : {128, 8})
      for (bool rotate : {false, true}) {
        int const K = D == 128 ? 4 : 3;
        int const S = rotate ? 3 : 0;
        CacheKind const kind{true, true, KPool::CacheScale::pow2, rotate, true};
        SCOPED_TRACE(shape(K, D) + " S=" + std::to_string(S) + ", " + cache_name(kind));
        Simulation<TypeParam> sim(K, D, 4099 * K + D + i++, S, kind);
        sim.run(40);
        sim.verify();
        EXPECT_GT(sim.cache_entries_checked(), 10);
        EXPECT_TRUE(sim.used_both_step_paths());
        if (S > 0) {
          EXPECT_GT(sim.rewinds(), 5);
          EXPECT_GT(sim.re_emissions(), 0);
        }
      }
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

  DraftScenario(int D, int R, Path path, int slots = 1)
      : D_(D), path_(path), ape_(random_ape(rng_, K, D)), ring_(E(), slots, K, D, R),
        out_(E(), 64, 1, D) {}

  KPool::Ring<T, Mem>& ring() { return ring_; }

  // Sends positions [c, c + n) to `slot`, the r-th sending of each with
  // revision r; the bookkeeping moves only when the call returns.
  void send(int c, int n, bool validate = true, std::uint32_t slot_id = 0) {
    Matrix key(n, D_), gate(n, D_);
    for (int i = 0; i < n; ++i) {
      int const rev = sends_.count(c + i) ? sends_.at(c + i) : 0;
      for (int ch = 0; ch < D_; ++ch) {
        key.at(i, ch) = input(5, c + i, ch, 0, C::dtype, rev);
        gate.at(i, ch) = input(5, c + i, ch, 1, C::dtype, rev);
      }
    }
    E space;
    auto const slot = to_index_view<U32>(std::vector<std::uint32_t>{slot_id}, "slot_idx");
    KPool::Options o = test_options<E>();
    o.validate = validate;
    if (path_ == Path::decode) {
      std::vector<std::int32_t> pos(n);
      for (int i = 0; i < n; ++i) pos[i] = c + i;
      KPool::step(space, ring_, to_view3<T, Mem>(key, n, "key"),
                  to_view3<T, Mem>(gate, n, "gate"), ape_view<Mem>(ape_),
                  KPool::decode_batch(positions_view<Mem>(pos, n), slot, 1), out_, o);
    } else {
      o.fused = path_ == Path::fused;
      KPool::step(space, ring_, to_view<T, Mem>(key, "key"), to_view<T, Mem>(gate, "gate"),
                  ape_view<Mem>(ape_), one_request<Mem>(c, n, slot), out_, o);
    }
    std::uint32_t const count = on_host(out_.count())();
    auto const ids = on_host(out_.pool_id());
    auto const pooled = on_host(out_.pooled());
    for (std::uint32_t o = 0; o < count; ++o) {
      std::vector<T>& v = last_[ids(o)];
      v.resize(D_);
      for (int ch = 0; ch < D_; ++ch) v[ch] = pooled(o, ch);
    }
    for (int i = 0; i < n; ++i) ++sends_[c + i];
    length_ = c + n;
  }

  // The ring's bytes and its slots' state, to show a refused call wrote
  // nothing.
  std::vector<unsigned char> ring_state() const {
    std::vector<unsigned char> v = raw_bytes(ring_.tail());
    std::vector<unsigned char> const s = raw_bytes(ring_.state());
    v.insert(v.end(), s.begin(), s.end());
    return v;
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
    auto const h = one_shot_pools<C>(key, gate, ape_);
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
        if (R == K) {
          // 7 rejected: the re-send from it needs pool 1's members 4 to 6,
          // which the drafts 8 and 9 overwrote. The ring knows (H = 10):
          // refused, nothing written.
          std::vector<unsigned char> const before = run.ring_state();
          try {
            run.send(7, 4);
            ADD_FAILURE() << "a rewind past the ring's depth was accepted";
          } catch (KPool::InvalidArgument const& e) {
            EXPECT_EQ(e.argument(), path == S::Path::decode ? "positions" : "cache_lengths");
            EXPECT_EQ(e.row(), 0);
            EXPECT_EQ(e.value(), "7");
            EXPECT_NE(std::string(e.what()).find(
                          "slot 0 deeper than the ring holds: H - floor(c/K)*K = 10 - 4 = 6 > R = 4"),
                      std::string::npos)
                << e.what();
          }
          EXPECT_EQ(run.ring_state(), before);
          EXPECT_TRUE(run.matches_one_shot()) << "after the refusal";
          // Unchecked, the rewind goes through within the caller's buffers
          // and the re-emitted pool 1 mixes in the drafts' keys.
          run.send(7, 4, /*validate=*/false);
          EXPECT_FALSE(run.matches_one_shot())
              << "a K-entry ring should have lost pool 1's members to the drafts";
        } else {
          run.send(7, 4);  // 7 rejected: re-send from it, plus new drafts
          EXPECT_TRUE(run.matches_one_shot());
        }
      }
}

// The depth rule at its boundary (docs/ring.md): with K = 4 and R = 8, a
// restart at c reaches back to floor(c/K)*K; H - floor(c/K)*K = R is
// allowed, R + 1 refused; the case of the issue that found the rule
// unchecked (position 70 re-sent from 61 on R = 8) refused.
TYPED_TEST(Streaming, TheRingRefusesRewindsPastItsDepth) {
  using S = DraftScenario<TypeParam>;
  for (auto path : {S::Path::decode, S::Path::fused, S::Path::unfused}) {
    SCOPED_TRACE("path " + std::to_string(static_cast<int>(path)));
    {
      S run(8, 8, path);
      run.send(0, 12);  // H = 12
      run.send(5, 3);   // 12 - 4 = 8 = R: allowed
      EXPECT_TRUE(run.matches_one_shot());
      run.send(8, 5);  // H = 13
      std::vector<unsigned char> const before = run.ring_state();
      EXPECT_THROW(run.send(7, 2), KPool::InvalidArgument);  // 13 - 4 = 9 > R
      EXPECT_EQ(run.ring_state(), before);
      run.send(9, 4);  // 13 - 8 = 5: allowed
      EXPECT_TRUE(run.matches_one_shot());
    }
    {
      S run(8, 8, path);
      run.send(0, 64);
      for (int pos = 64; pos < 70; ++pos) run.send(pos, 1);  // H = 70
      EXPECT_THROW(run.send(61, 3), KPool::InvalidArgument);   // 70 - 60 = 10 > 8
      EXPECT_THROW(run.send(63, 3), KPool::InvalidArgument);   // the same pool 15
      run.send(64, 8);  // 70 - 64 = 6: allowed
      EXPECT_TRUE(run.matches_one_shot());
    }
  }
}

// A slot's H belongs to the sequence in it: a new sequence starting at 0
// resets it by its first call; one that starts past 0 (a prefix cached
// elsewhere) needs Ring::reset, without which its start reads as a rewind
// of the former sequence (deeper than the ring holds here; past its
// length, a gap: tst_slots.cpp).
TYPED_TEST(Streaming, ASlotsDepthMarkResetsWithANewSequence) {
  using S = DraftScenario<TypeParam>;
  using E = typename TypeParam::execution_space;
  for (auto path : {S::Path::decode, S::Path::fused, S::Path::unfused}) {
    SCOPED_TRACE("path " + std::to_string(static_cast<int>(path)));
    S run(8, 8, path, /*slots=*/2);
    run.send(0, 40, true, 1);  // a former sequence in slot 1: H = 40
    EXPECT_EQ(on_host(run.ring().high())(1), 40u);
    EXPECT_EQ(on_host(run.ring().high())(0), 0u);
    run.send(0, 3, true, 1);  // a new one from 0: H = 3
    EXPECT_EQ(on_host(run.ring().high())(1), 3u);
    run.send(3, 37, true, 1);  // H = 40 again
    // A sequence taking slot 1 at position 16 (its pools 0 to 3 cached):
    // 40 - 16 > R without a reset.
    EXPECT_THROW(run.send(16, 2, true, 1), KPool::InvalidArgument);
    E space;
    run.ring().reset(space, 1);
    EXPECT_EQ(on_host(run.ring().high())(1), 0u);
    run.send(16, 2, true, 1);
    EXPECT_EQ(on_host(run.ring().high())(1), 18u);
    EXPECT_THROW(run.ring().reset(space, 2), KPool::InvalidArgument);
    EXPECT_THROW(run.ring().reset(space, -1), KPool::InvalidArgument);
  }
}

}  // namespace
