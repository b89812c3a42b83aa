// A slot's state and the no-gaps rule (docs/ring.md, "What a slot holds"
// and "No gaps"): a call may not start past what its slot holds. The
// reproduction of issue #49 (K = 4, one slot, validation on) through every
// entry point that reads the ring: the general step (fused, three
// launches), the decode step, the writers' ring forms (ring_close, then
// compress and seed_tail) and tail_update's ring form. A refused call
// names the slot, c and what the slot holds, and leaves the ring (its
// entries and its state), the outputs and the pool cache byte for byte
// as they were; an accepted one emits exactly the reference's pools of
// the values last sent.

#include <KPoolTestUtils.hpp>

#include <map>
#include <string>
#include <vector>

namespace {

using namespace KPoolTest;

template <class C>
class Slots : public ::testing::Test {};
TYPED_TEST_SUITE(Slots, Configs, ConfigName);

enum class Path { fused, unfused, decode, writers, tail_update };

char const* path_name(Path p) {
  switch (p) {
    case Path::fused: return "fused step";
    case Path::unfused: return "three-launch step";
    case Path::decode: return "decode step";
    case Path::writers: return "ring_close, compress, seed_tail";
    case Path::tail_update: return "tail_update";
  }
  return "?";
}

// One sequence at a time in slot 0 of a K = 4 ring, sent through `path`,
// with a native pool cache behind the steps. Every send carries new
// values (a revision a position), and the emitted pools are recorded.
template <class C>
class OneSlot {
  using T = typename C::value_type;
  using E = typename C::execution_space;
  using M = typename C::memory_space;
  using U32 = Kokkos::View<std::uint32_t*, M>;
  using I32 = Kokkos::View<std::int32_t*, M>;
  using I2 = Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M>;

 public:
  static constexpr int K = 4, D = 8, rows = 64, blocks = 64;

  OneSlot(Path path, int R)
      : path_(path),
        ape_(random_ape(rng_, K, D)),
        ring_(E(), 1, K, D, R),
        out_(E(), KPool::StepOutput<T, M>::capacity_for(rows, 1, K), 1, D),
        cache_(E(), blocks, 1, D, K),
        table_("block_table", 1, blocks),
        pooled_("pooled", rows, D),
        rc_pooled_("ring_close.pooled", 1, D),
        closed_("closed_pool", 1),
        offsets_("pool_row_offsets", 2),
        tu_pooled_("tail_update.pooled", 1, rows / K + 1, D),
        tu_closed_("tail_update.closed_pool", 1, rows / K + 1) {
    auto t = Kokkos::create_mirror_view(table_);
    for (int b = 0; b < blocks; ++b) t(0, b) = b;
    Kokkos::deep_copy(table_, t);
    fill_uniform(rng_, ring_.tail(), -2, 2);  // what a former sequence left
  }

  KPool::Ring<T, M>& ring() { return ring_; }

  // Every call of the session validates.
  static KPool::Options validated() {
    KPool::Options o = test_options<E>();
    o.validate = true;
    return o;
  }

  // Positions [c, c + n) to slot 0; the bookkeeping moves only when the
  // call returns.
  void send(int c, int n) {
    Matrix key(n, D), gate(n, D);
    values(c, n, key, gate);
    E space;
    KPool::Options o = validated();
    U32 const slot = to_index_view<U32>(std::vector<std::uint32_t>{0}, "slot_idx");
    U32 const ro = to_index_view<U32>(std::vector<std::uint32_t>{0, std::uint32_t(n)}, "ro");
    U32 const cl = to_index_view<U32>(std::vector<std::uint32_t>{std::uint32_t(c)}, "cl");
    auto const ragged = KPool::ragged_batch(ro, cl, slot, 1);
    std::vector<std::int32_t> pos(n);
    for (int i = 0; i < n; ++i) pos[i] = c + i;
    auto const decode = KPool::decode_batch(positions_view<M>(pos, n), slot, 1);
    auto const k2 = to_view<T, M>(key, "key"), g2 = to_view<T, M>(gate, "gate");
    auto const k3 = to_view3<T, M>(key, n, "key"), g3 = to_view3<T, M>(gate, n, "gate");
    auto const ape = ape_view<M>(ape_);
    std::map<int, std::vector<T>> emitted;
    switch (path_) {
      case Path::fused:
      case Path::unfused:
      case Path::decode: {
        o.fused = path_ == Path::fused;
        auto paged = KPool::paged(cache_, table_);
        if (path_ == Path::decode)
          KPool::step(space, ring_, k3, g3, ape, decode, paged, out_, o);
        else
          KPool::step(space, ring_, k2, g2, ape, ragged, paged, out_, o);
        std::uint32_t const count = on_host(out_.count())();
        auto const ids = on_host(out_.pool_id());
        auto const pooled = on_host(out_.pooled());
        for (std::uint32_t i = 0; i < count; ++i) emitted[ids(i)] = row(pooled, i);
        break;
      }
      case Path::writers: {
        KPool::ring_close(space, ring_, k2, g2, ape, ragged, rc_pooled_, closed_, o);
        KPool::compress(space, k2, g2, ape, KPool::ragged_batch(ro, cl, 1), offsets_, pooled_,
                        o);
        KPool::seed_tail(space, ring_, k2, g2, ragged, o);
        emitted = writers_pools(c);
        break;
      }
      case Path::tail_update: {
        KPool::tail_update(space, ring_, k3, g3, ape, decode, tu_pooled_, tu_closed_, o);
        auto const ids = on_host(tu_closed_);
        auto const pooled = on_host(tu_pooled_);
        for (std::size_t j = 0; j < ids.extent(1) && ids(0, j) >= 0; ++j) {
          std::vector<T> v(D);
          for (int ch = 0; ch < D; ++ch) v[ch] = pooled(0, j, ch);
          emitted[ids(0, j)] = v;
        }
        break;
      }
    }
    record(c, n, key, gate, emitted);
  }

  // seed_tail's ring form: positions [c, c + n) into slot 0, no pool.
  void seed(int c, int n) {
    Matrix key(n, D), gate(n, D);
    values(c, n, key, gate);
    E space;
    KPool::Options const o = validated();
    U32 const slot = to_index_view<U32>(std::vector<std::uint32_t>{0}, "slot_idx");
    KPool::seed_tail(
        space, ring_, to_view<T, M>(key, "key"), to_view<T, M>(gate, "gate"),
        KPool::ragged_batch(
            to_index_view<U32>(std::vector<std::uint32_t>{0, std::uint32_t(n)}, "ro"),
            to_index_view<U32>(std::vector<std::uint32_t>{std::uint32_t(c)}, "cl"), slot, 1),
        o);
    record(c, n, key, gate, {});
  }

  // A new sequence will take the slot.
  void reset() {
    ring_.reset(E(), 0);
    last_.clear();
    emitted_.clear();
  }

  // Every byte the entry points may write: the ring's entries and state,
  // the step output, the writers' outputs and the cache.
  std::vector<unsigned char> bytes() const {
    std::vector<unsigned char> v;
    auto add = [&](auto const& view) {
      auto const b = raw_bytes(view);
      v.insert(v.end(), b.begin(), b.end());
    };
    add(ring_.tail());
    add(ring_.state());
    add(out_.pooled());
    add(out_.pool_id());
    add(out_.batch_row());
    add(out_.offsets());
    add(out_.count());
    add(cache_.values());
    add(pooled_);
    add(rc_pooled_);
    add(closed_);
    add(offsets_);
    add(tu_pooled_);
    add(tu_closed_);
    return v;
  }

  // The pools emitted since the last reset are exactly the pools `want`,
  // each the reference's pool of the values last sent for its members.
  ::testing::AssertionResult emitted(std::vector<int> const& want) const {
    std::vector<int> got;
    for (auto const& e : emitted_) got.push_back(e.first);
    if (got != want) {
      auto f = ::testing::AssertionFailure() << "pools emitted:";
      for (int p : got) f << " " << p;
      return f;
    }
    for (auto const& [p, v] : emitted_) {
      Matrix key(K, D), gate(K, D);
      for (int m = 0; m < K; ++m) {
        auto const it = last_.find(p * K + m);
        if (it == last_.end())
          return ::testing::AssertionFailure() << "pool " << p << " has an unsent member";
        for (int ch = 0; ch < D; ++ch) {
          key.at(m, ch) = it->second.first[ch];
          gate.at(m, ch) = it->second.second[ch];
        }
      }
      Matrix const ref = KPoolRef::one_shot(key, gate, ape_);
      Matrix const scale = KPoolRef::one_shot_scale(key, gate, ape_);
      auto const r = pool_matches(C::dtype, v.data(), 1, ref.row(0), scale.row(0), D);
      if (!r) return ::testing::AssertionFailure() << "pool " << p << ": " << r.message();
    }
    return ::testing::AssertionSuccess();
  }

 private:
  // Values of positions [c, c + n), a new revision of each.
  void values(int c, int n, Matrix& key, Matrix& gate) {
    for (int i = 0; i < n; ++i) {
      int const rev = revision_[c + i];
      for (int ch = 0; ch < D; ++ch) {
        key.at(i, ch) = input(49, c + i, ch, 0, C::dtype, rev);
        gate.at(i, ch) = input(49, c + i, ch, 1, C::dtype, rev);
      }
    }
  }

  template <class H>
  static std::vector<T> row(H const& h, std::size_t i) {
    std::vector<T> v(D);
    for (int ch = 0; ch < D; ++ch) v[ch] = h(i, ch);
    return v;
  }

  // The writers' pools: ring_close's, then compress's from ceil(c / K) on.
  std::map<int, std::vector<T>> writers_pools(int c) {
    std::map<int, std::vector<T>> e;
    auto const closed = on_host(closed_);
    if (closed(0) >= 0) e[closed(0)] = row(on_host(rc_pooled_), 0);
    auto const off = on_host(offsets_);
    auto const pooled = on_host(pooled_);
    int const first = (c + K - 1) / K;
    for (std::uint32_t j = off(0); j < off(1); ++j) e[first + static_cast<int>(j)] = row(pooled, j);
    return e;
  }

  void record(int c, int n, Matrix const& key, Matrix const& gate,
              std::map<int, std::vector<T>> const& emitted) {
    for (int i = 0; i < n; ++i) {
      ++revision_[c + i];
      last_[c + i] = {std::vector<double>(key.row(i), key.row(i) + D),
                      std::vector<double>(gate.row(i), gate.row(i) + D)};
    }
    for (auto const& [p, v] : emitted) emitted_[p] = v;
  }

  Path path_;
  Rng rng_{49};
  Matrix ape_;
  KPool::Ring<T, M> ring_;
  KPool::StepOutput<T, M> out_;
  KPool::PoolCache<T, M> cache_;
  I2 table_;
  Kokkos::View<T**, Kokkos::LayoutRight, M> pooled_, rc_pooled_;
  I32 closed_;
  U32 offsets_;
  Kokkos::View<T***, Kokkos::LayoutRight, M> tu_pooled_;
  I2 tu_closed_;
  std::map<int, int> revision_;
  std::map<int, std::pair<std::vector<double>, std::vector<double>>> last_;
  std::map<int, std::vector<T>> emitted_;
};

// `call` is refused by name: the argument that carries c, row 0, value c,
// a message with `words`; and nothing is written.
template <class Slot, class F>
::testing::AssertionResult refused(Slot& s, Path path, int c, std::string const& words,
                                   F&& call) {
  std::vector<unsigned char> const before = s.bytes();
  try {
    call();
    return ::testing::AssertionFailure() << "accepted";
  } catch (KPool::InvalidArgument const& e) {
    bool const decode = path == Path::decode || path == Path::tail_update;
    if (e.argument() != (decode ? "positions" : "cache_lengths") || e.row() != 0 ||
        e.value() != std::to_string(c) || std::string(e.what()).find(words) == std::string::npos)
      return ::testing::AssertionFailure() << "refused otherwise: " << e.what();
  }
  if (s.bytes() != before) return ::testing::AssertionFailure() << "a refused call wrote";
  return ::testing::AssertionSuccess();
}

constexpr Path kPaths[] = {Path::fused, Path::unfused, Path::decode, Path::writers,
                           Path::tail_update};

// The reproduction: 40 tokens sent, then a step at c = 42 (positions 40
// and 41 never sent) would build pool 10 from stale entries 32 and 33; a
// new sequence taking the reset slot at c = 102 without seed_tail would
// build pool 25 from the former sequence's entries. Both refused; the
// continuation at 40, a reset slot started at 100 and a reset slot seeded
// with [100, 102) then started at 102 accepted, with the reference's pools.
TYPED_TEST(Slots, AGapOrAnUnseededMidPoolStartIsRefused) {
  using S = OneSlot<TypeParam>;
  for (Path path : kPaths)
    for (int R : {4, 8}) {
      SCOPED_TRACE(std::string(path_name(path)) + ", R = " + std::to_string(R));
      S s(path, R);
      s.send(0, 40);
      EXPECT_TRUE(refused(s, path, 42,
                          "starts past what slot 0 holds: positions [0, 40), c > L = 40 is a gap",
                          [&] { s.send(42, 2); }));
      s.send(40, 4);
      EXPECT_TRUE(s.emitted({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));

      s.reset();
      EXPECT_TRUE(refused(s, path, 102,
                          "starts a sequence mid-pool, but slot 0 holds nothing (fresh or reset)",
                          [&] { s.send(102, 2); }));
      s.send(100, 6);
      EXPECT_TRUE(s.emitted({25}));
      // Before the slot's start: pool 24's members 96, 97 were never sent.
      EXPECT_TRUE(refused(s, path, 98,
                          "needs the pending pool's earlier members [96, 98), but slot 0 holds "
                          "positions [100, 106)",
                          [&] { s.send(98, 3); }));
      s.send(106, 2);  // continues: pool 26 from 104, 105 (in the ring) and 106, 107
      EXPECT_TRUE(s.emitted({25, 26}));

      s.reset();
      s.seed(100, 2);
      s.send(102, 2);
      EXPECT_TRUE(s.emitted({25}));
    }
}

// A slot's state, word by word, through a sequence's life: a new sequence
// at 0, a continuation, a rewind (L falls back, H stays), a refused start
// past L within H (the re-sent drafts' old values), a reset, a seeded
// mid-pool start.
TYPED_TEST(Slots, TheStateFollowsTheSequence) {
  using S = OneSlot<TypeParam>;
  S s(Path::fused, 8);
  auto const state = [&] {
    auto const h = on_host(s.ring().state());
    return std::vector<std::uint32_t>{h(0, 0), h(0, 1), h(0, 2)};
  };
  using W = std::vector<std::uint32_t>;
  EXPECT_EQ(state(), (W{0, 0, 0}));
  s.send(0, 10);
  EXPECT_EQ(state(), (W{0, 10, 10}));
  s.send(10, 3);
  EXPECT_EQ(state(), (W{0, 13, 13}));
  s.send(9, 2);  // a rewind: positions 11, 12 are rejected drafts now
  EXPECT_EQ(state(), (W{0, 11, 13}));
  EXPECT_TRUE(refused(s, Path::fused, 12, "c > L = 11 is a gap", [&] { s.send(12, 1); }));
  s.send(11, 1);
  EXPECT_EQ(state(), (W{0, 12, 13}));
  s.send(0, 2);  // a new sequence in the slot
  EXPECT_EQ(state(), (W{0, 2, 2}));
  s.reset();
  EXPECT_EQ(state(), (W{0, 0, 0}));
  s.seed(20, 3);
  EXPECT_EQ(state(), (W{20, 23, 23}));
  s.send(23, 1);
  EXPECT_EQ(state(), (W{20, 24, 24}));
  EXPECT_TRUE(s.emitted({5}));
}

}  // namespace
