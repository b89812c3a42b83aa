// A sharded KPool::Layer in one process (docs/ranks.md, "A sharded
// Layer"): what it refuses, by name, before anything is written (a shard
// that is not one, no communicator or one of another rank, no max_topk,
// an adopted cache of another shard, a selection's topk past max_topk);
// and that its steps write exactly this rank's pools: each rank's cache,
// read through its own block table, is the whole layer's cache restricted
// to the pools the rank owns. (Its selections, which need the ranks
// together, are tst_mpi's: bit for bit the whole layer's under mpiexec.)

#include <KPoolTestUtils.hpp>

#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using namespace KPoolTest;

using namespace KPoolTest::OnDefaultSpace;

// A communicator that says who it is and gathers nothing: enough for a
// layer that steps, or refuses before its selection gathers.
class NoGather : public KPool::Communicator<E> {
 public:
  NoGather(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_gather_host(void const*, void*, std::size_t) override {
    throw std::logic_error("NoGather: a gather was asked for");
  }
  void all_gather(E const&, void const*, void*, std::size_t) override {
    throw std::logic_error("NoGather: a gather was asked for");
  }

 private:
  int rank_, size_;
};

constexpr int K = 4, D = 16, H = 2, bp = 2, row_blocks = 8;

KPool::LayerConfig config() {
  KPool::LayerConfig cfg = layer_config(K, D, H, 2, 2, 64, 2 * row_blocks, bp);
  cfg.max_context = row_blocks * bp * K;
  return cfg;
}

template <class C>
using Layer = KPool::Layer<float, C, M>;
template <class C>
using Buffers = KPool::LayerBuffers<float, C, M>;

TEST(LayerShard, RefusesByName) {
  E space;
  Kokkos::View<float**, M> ape("ape", K, D);
  using C = KPool::float8_e4m3;
  auto const refused = [&](KPool::LayerConfig const& c, Buffers<C> const& b,
                           char const* argument, char const* value, char const* words) {
    try {
      Layer<C> const bad(space, c, ape, b);
      ADD_FAILURE() << "accepted: " << words;
    } catch (KPool::InvalidArgument const& e) {
      EXPECT_EQ(e.entry_point(), "KPool::Layer");
      EXPECT_EQ(e.argument(), argument);
      EXPECT_EQ(e.value(), value);
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  KPool::LayerConfig cfg = config();
  cfg.shard = KPool::Shard{1, 3, 2};
  cfg.max_topk = 4;
  Buffers<C> none;
  refused(cfg, none, "communicator", "", "is empty: a sharded layer (config.shard.ranks = 3)");
  Buffers<C> other;
  other.communicator = std::make_shared<NoGather>(2, 3);
  refused(cfg, other, "communicator", "rank 2 of 3", "is not config.shard's rank 1 of 3");
  other.communicator = std::make_shared<NoGather>(1, 2);
  refused(cfg, other, "communicator", "rank 1 of 2", "is not config.shard's rank 1 of 3");
  Buffers<C> ok;
  ok.communicator = std::make_shared<NoGather>(1, 3);
  KPool::LayerConfig no_topk = cfg;
  no_topk.max_topk = 0;
  refused(no_topk, ok, "config", "0", "a sharded layer sizes its exchange by it");
  KPool::LayerConfig bad = cfg;
  bad.shard = KPool::Shard{3, 3, 1};
  refused(bad, ok, "config", "{3, 3, 1}", "is not a shard");
  bad.shard = KPool::Shard{0, 2, 0};
  refused(bad, ok, "config", "{0, 2, 0}", "is not a shard");
  // An adopted cache of another shard; an unsharded one becomes this
  // rank's share.
  Buffers<C> adopt = ok;
  KPool::PoolCache<C, M> const cache(space, 2 * row_blocks, bp, D, K);
  adopt.cache = cache.sharded(KPool::Shard{0, 3, 2});
  refused(cfg, adopt, "cache", "{0, 3, 2}", "does not match config.shard = {1, 3, 2}");
  adopt.cache = cache;
  Layer<C> const taken(space, cfg, ape, adopt);
  EXPECT_EQ(taken.cache().shard().rank, 1);
  EXPECT_EQ(taken.cache().shard().ranks, 3);
  EXPECT_EQ(taken.cache().values().data(), cache.values().data());
  // An unsharded config needs no communicator and ignores max_topk.
  Layer<C> const whole(space, config(), ape);
  EXPECT_FALSE(whole.cache().shard().sharded());
}

// A selection past max_topk is refused before the ranks are asked.
TEST(LayerShard, ASelectionPastMaxTopkIsRefused) {
  E space;
  Rng rng(4);
  Kokkos::View<float**, M> ape("ape", K, D);
  fill_uniform(rng, ape, -1, 1);
  KPool::LayerConfig cfg = config();
  cfg.shard = KPool::Shard{0, 2, 1};
  cfg.max_topk = 2;
  Buffers<float> b;
  b.communicator = std::make_shared<NoGather>(0, 2);
  Layer<float> layer(space, cfg, ape, b);
  U32 const ro = to_index_view<U32>(std::vector<std::uint32_t>{0, 12}, "row_offsets");
  U32 const cl = to_index_view<U32>(std::vector<std::uint32_t>{0}, "cache_lengths");
  U32 const slots = to_index_view<U32>(std::vector<std::uint32_t>{0}, "slot_idx");
  Kokkos::View<float**, M> key("key", 12, D), gate("gate", 12, D);
  fill_uniform(rng, key, -2, 2);
  fill_uniform(rng, gate, -3, 3);
  std::vector<std::int32_t> t;
  for (int c = 0; c < row_blocks; ++c) t.push_back(c);
  layer.step(space, key, gate, KPool::ragged_batch(ro, cl, slots, 1), positions_view<M>(t, row_blocks),
             test_options<E>());
  Kokkos::View<float***, M> q("q", 12, H, D);
  Kokkos::View<float**, M> w("w", 12, H);
  I2 ids("ids", 12, 3);
  Kokkos::deep_copy(ids, -9);
  auto const before = raw_bytes(ids);
  try {
    layer.score_select(space, q, w, 3, ids, test_options<E>());
    ADD_FAILURE() << "topk 3 past max_topk 2 taken";
  } catch (KPool::InvalidArgument const& e) {
    EXPECT_EQ(e.entry_point(), "KPool::Layer::score_select");
    EXPECT_EQ(e.argument(), "topk");
    EXPECT_EQ(e.value(), "3");
    EXPECT_NE(std::string(e.what()).find("LayerConfig::max_topk = 2"), std::string::npos);
  }
  EXPECT_EQ(raw_bytes(ids), before);
}

// Each rank's layer, stepped like the whole one (a prefill, then a decode
// step), holds exactly its own pools: its cache read at local pool l of
// row r (block table(r, l / bp), entry l % bp) is the whole cache's pool
// global(l), byte for byte, and nothing else of its cache is written.
template <class C>
void check_rank_caches(KPool::CacheProfile profile, int W, int u) {
  SCOPED_TRACE(::testing::Message() << W << " ranks, interleave " << u);
  E space;
  Rng rng(100 + W * 10 + u);
  KPool::Options const o = test_options<E>();
  Kokkos::View<float**, M> ape("ape", K, D);
  fill_uniform(rng, ape, -1, 1);
  KPool::LayerConfig cfg = config();
  cfg.profile = profile;
  cfg.drafts = 1;
  Layer<C> whole(space, cfg, ape);
  std::vector<Layer<C>> ranks;
  for (int r = 0; r < W; ++r) {
    KPool::LayerConfig c = cfg;
    c.shard = KPool::Shard{r, W, u};
    c.max_topk = 1;
    Buffers<C> b;
    b.communicator = std::make_shared<NoGather>(r, W);
    ranks.emplace_back(space, c, ape, b);
  }
  std::vector<std::int32_t> t;
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < row_blocks; ++c) t.push_back(r * row_blocks + c);
  I2 const table = positions_view<M>(t, row_blocks);
  U32 const ro = to_index_view<U32>(std::vector<std::uint32_t>{0, 37, 58}, "row_offsets");
  U32 const cl = to_index_view<U32>(std::vector<std::uint32_t>{0, 0}, "cache_lengths");
  U32 const slots = to_index_view<U32>(std::vector<std::uint32_t>{0, 1}, "slot_idx");
  Kokkos::View<float**, M> key("key", 58, D), gate("gate", 58, D);
  fill_uniform(rng, key, -2, 2);
  fill_uniform(rng, gate, -3, 3);
  auto const batch = KPool::ragged_batch(ro, cl, slots, 2);
  whole.step(space, key, gate, batch, table, o);
  for (auto& l : ranks) l.step(space, key, gate, batch, table, o);
  I2 const positions = positions_view<M>({37, 38, 21, 22}, 2);
  Kokkos::View<float***, M> dkey("dkey", 2, 2, D), dgate("dgate", 2, 2, D);
  fill_uniform(rng, dkey, -2, 2);
  fill_uniform(rng, dgate, -3, 3);
  whole.step(space, dkey, dgate, KPool::decode_batch(positions, slots, 2), table, o);
  for (auto& l : ranks) l.step(space, dkey, dgate, KPool::decode_batch(positions, slots, 2), table, o);
  int const pools[2] = {39 / K, 23 / K};

  // A cache's bytes: pool entry (block, i) as its values and its scale.
  auto const entries = [&](KPool::PoolCache<C, M> const& c) {
    auto const v = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), c.values());
    auto const s = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), c.scales());
    return [v, s](int block, int i) {
      std::vector<unsigned char> e(sizeof(C) * D + sizeof(float));
      std::memcpy(e.data(), &v(block, i, 0), sizeof(C) * D);
      std::memcpy(e.data() + sizeof(C) * D, &s(block, i), sizeof(float));
      return e;
    };
  };
  auto const want = entries(whole.cache());
  for (int r = 0; r < W; ++r) {
    SCOPED_TRACE(::testing::Message() << "rank " << r);
    KPool::Shard const s{r, W, u};
    auto const got = entries(ranks[static_cast<std::size_t>(r)].cache());
    std::vector<std::vector<bool>> written(2 * row_blocks, std::vector<bool>(bp, false));
    for (int row = 0; row < 2; ++row) {
      int const local = static_cast<int>(s.local_count(pools[row]));
      for (int l = 0; l < local; ++l) {
        int const g = static_cast<int>(s.global(l));
        ASSERT_EQ(s.owner(g), r);
        int const lb = t[row * row_blocks + l / bp], gb = t[row * row_blocks + g / bp];
        EXPECT_EQ(got(lb, l % bp), want(gb, g % bp)) << "row " << row << " local pool " << l;
        written[lb][l % bp] = true;
      }
    }
    std::vector<unsigned char> const zero(sizeof(C) * D + sizeof(float), 0);
    for (int b = 0; b < 2 * row_blocks; ++b)
      for (int i = 0; i < bp; ++i)
        if (!written[b][i]) {
          EXPECT_EQ(got(b, i), zero) << "block " << b << " entry " << i;
        }
  }
}

TEST(LayerShard, EachRanksStepsWriteItsOwnPools) {
  check_rank_caches<float>(KPool::CacheProfile::exact, 2, 1);
  check_rank_caches<KPool::float8_e4m3>(KPool::CacheProfile::serving, 3, 2);
  check_rank_caches<KPool::float8_e4m3>(KPool::CacheProfile::exact, 4, 1);
}

}  // namespace
