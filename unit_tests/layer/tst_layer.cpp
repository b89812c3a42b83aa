// KPool::Layer (docs/api.md, "KPool::Layer"): one object per indexer layer.
// Its members run the low-level entry points on the objects it owns, so
// every result must equal, bit for bit, the low-level calls on objects
// built the same way: a chunked prefill, a decode round with drafts and a
// verify round that rewinds, each followed by a selection (with Kokkos
// Kernels). After a decode step the selection's rows come from positions,
// built on the device; the low-level selection here gets them built on the
// host from the rule docs/api.md states.

#include <KPoolTestUtils.hpp>

#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using namespace KPoolTest;

using namespace KPoolTest::OnDefaultSpace;

template <class T>
::testing::AssertionResult same_output(KPool::HostStepOutput<T> const& a,
                                       KPool::HostStepOutput<T> const& b) {
  if (a.count != b.count)
    return ::testing::AssertionFailure() << "count " << a.count << " vs " << b.count;
  if (a.batch_size() != b.batch_size()) return ::testing::AssertionFailure() << "batch size";
  for (int r = 0; r <= a.batch_size(); ++r)
    if (a.offsets(r) != b.offsets(r)) return ::testing::AssertionFailure() << "offsets " << r;
  for (std::uint32_t i = 0; i < a.count; ++i)
    if (a.batch_row(i) != b.batch_row(i) || a.pool_id(i) != b.pool_id(i))
      return ::testing::AssertionFailure() << "row " << i;
  if (a.pooled.span() != b.pooled.span() ||
      std::memcmp(a.pooled.data(), b.pooled.data(), a.pooled.span() * sizeof(T)) != 0)
    return ::testing::AssertionFailure() << "pooled";
  return ::testing::AssertionSuccess();
}

// What a Layer is built with, beyond its sizes.
struct Variant {
  bool rotate = false;
  bool serving = false;      // CacheProfile::serving (fp8 only)
  bool fused = false;        // CacheLayout::fused (serving only)
  bool adopt_cache = false;  // an engine-owned cache, over unmanaged Views
  bool share_workspace = false;  // a workspace shared with a second layer
  std::size_t select_rows = 0;   // the layer's own workspace rows (0: max_tokens)
  // The engine overwrites the buffers it gave a step (its index arrays and
  // block table) before the selection, as engines recycle their staging
  // buffers every step.
  bool overwrite = false;
};

// A copy of an index View, the engine's staging buffer for one call.
template <class V>
V staged(V const& v) {
  V s(std::string(v.label()) + "_staged", v.layout());
  Kokkos::deep_copy(s, v);
  return s;
}

// The engine reuses a staging buffer: garbage over every entry.
template <class V>
void recycle(V const& v, Rng& rng) {
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < h.span(); ++i)
    h.data()[i] = static_cast<typename V::value_type>(rng.next() % 97) - 5;
  Kokkos::deep_copy(v, h);
}

// A cache's bytes, whatever its layout.
template <class C>
std::vector<unsigned char> cache_bytes(KPool::PoolCache<C, M> const& c) {
  if (c.layout() == KPool::CacheLayout::fused) return raw_bytes(c.bytes());
  std::vector<unsigned char> v = raw_bytes(c.values());
  std::vector<unsigned char> const s = raw_bytes(c.scales());
  v.insert(v.end(), s.begin(), s.end());
  return v;
}

// The whole path of one layer, through a Layer and through the low-level
// entry points, compared after every call.
template <class T, class C>
void layer_matches_low_level(Variant const& v) {
  Rng rng(7 + (v.rotate ? 1 : 0) + (v.serving ? 2 : 0));
  E space;
  KPool::LayerConfig cfg = layer_config(4, 32, 4, 4, 3, 40, 12, 4);
  cfg.drafts = 2;
  cfg.rotate = v.rotate;
  cfg.max_context = 192;  // 48 pools a query row at most
  cfg.select_rows = v.select_rows;
  if (v.serving) cfg.profile = KPool::CacheProfile::serving;
  if (v.fused) cfg.layout = KPool::CacheLayout::fused;
  int const K = cfg.kpool, D = cfg.head_dim, H = cfg.num_heads;
  Kokkos::View<float**, Kokkos::LayoutRight, M> ape("ape", K, D);
  fill_uniform(rng, ape, -1, 1);
  KPool::CacheScale const scale = !std::is_same<C, KPool::float8_e4m3>::value
                                      ? KPool::CacheScale::none
                                  : v.serving ? KPool::CacheScale::pow2
                                              : KPool::CacheScale::amax;
  KPool::CacheProfile const profile = cfg.profile;

  // The engine's own buffers, when the layer adopts them: plain
  // allocations the layer sees through unmanaged Views.
  using Bytes = Kokkos::View<std::uint8_t**, Kokkos::LayoutRight, M>;
  using Values = Kokkos::View<C***, Kokkos::LayoutRight, M>;
  using Scales = Kokkos::View<float**, Kokkos::LayoutRight, M>;
  using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
  std::size_t const block_bytes = static_cast<std::size_t>(cfg.block_pools) * (D + 4);
  Bytes engine_bytes("engine_bytes", cfg.num_blocks, block_bytes);
  Values engine_values("engine_values", cfg.num_blocks, cfg.block_pools, D);
  Scales engine_scales("engine_scales", cfg.num_blocks, cfg.block_pools);
  KPool::LayerBuffers<T, C, M> buffers;
  if (v.adopt_cache) {
    if (v.fused)
      buffers.cache = KPool::PoolCache<C, M>(
          Kokkos::View<std::uint8_t**, Kokkos::LayoutRight, M, Unmanaged>(
              engine_bytes.data(), cfg.num_blocks, block_bytes),
          cfg.block_pools, D, K, v.rotate);
    else
      buffers.cache = KPool::PoolCache<C, M>(
          Kokkos::View<C***, Kokkos::LayoutRight, M, Unmanaged>(
              engine_values.data(), cfg.num_blocks, cfg.block_pools, D),
          Kokkos::View<float**, Kokkos::LayoutRight, M, Unmanaged>(
              engine_scales.data(), cfg.num_blocks, cfg.block_pools),
          K, scale, v.rotate, profile);
  }
  std::size_t const visible = 48;
  KPool::SelectWorkspace<T, M> ws(space, cfg.max_tokens, visible, H, D);
  // A second layer of the same shape sharing the first one's workspace
  // (selecting in turns on one instance).
  if (v.share_workspace) buffers.workspace = KPool::SelectWorkspace<T, M>(space, 7, visible, H, D);
  KPool::Layer<T, C, M> layer(space, cfg, ape, buffers);
  KPool::LayerBuffers<T, C, M> others;
  others.workspace = buffers.workspace;
  KPool::Layer<T, C, M> other(space, cfg, ape, others);

  // The same objects, by hand.
  int const R = KPool::Ring<T, M>::serving_length(K, cfg.drafts);
  EXPECT_EQ(layer.ring().ring_length(), R);
  EXPECT_EQ(layer.cache().kpool(), K);
  EXPECT_EQ(layer.cache().scale(), scale);
  EXPECT_EQ(layer.cache().profile(), profile);
  EXPECT_EQ(layer.cache().layout(), cfg.layout);
  EXPECT_EQ(layer.config().max_visible, 48u);
  if (v.adopt_cache) {
    EXPECT_EQ(layer.cache().values_data(),
              v.fused ? reinterpret_cast<C*>(engine_bytes.data()) : engine_values.data())
        << "the layer adopts the engine's buffer, in place";
  }
  KPool::Ring<T, M> ring(space, cfg.max_slots, K, D, R);
  Bytes ref_bytes("ref_bytes", cfg.num_blocks, block_bytes);
  KPool::PoolCache<C, M> cache =
      v.fused ? KPool::PoolCache<C, M>(ref_bytes, cfg.block_pools, D, K, v.rotate)
              : KPool::PoolCache<C, M>(space, cfg.num_blocks, cfg.block_pools, D, K, scale,
                                       v.rotate, profile);
  KPool::StepOutput<T, M> out(
      space, KPool::StepOutput<T, M>::capacity_for(cfg.max_tokens, cfg.max_batch, K),
      cfg.max_batch, D);
  if (v.share_workspace) {
    EXPECT_EQ(layer.workspace().keys().data(), buffers.workspace.keys().data());
    EXPECT_EQ(other.workspace().keys().data(), buffers.workspace.keys().data());
  }
  int const topk = 3;
  int const width = KPool::select_tokens_width(topk, K);
  // Row r's blocks: 4r .. 4r + 3 (16 pools, 64 positions); row 2 unused.
  I2 const table = [&] {
    I2 t("block_table", cfg.max_batch, 4);
    auto h = Kokkos::create_mirror_view(t);
    for (int r = 0; r < cfg.max_batch; ++r)
      for (int c = 0; c < 4; ++c) h(r, c) = 4 * r + c;
    Kokkos::deep_copy(t, h);
    return t;
  }();
  KPool::Options opts = test_options<E>();

  auto const compare = [&](char const* when) {
    SCOPED_TRACE(when);
    EXPECT_EQ(raw_bytes(layer.ring().tail()), raw_bytes(ring.tail())) << "ring";
    EXPECT_EQ(cache_bytes(layer.cache()), cache_bytes(cache)) << "cache";
    EXPECT_TRUE(same_output(layer.output().to_host(space, KPool::StepOutputParts::ids_and_pooled),
                            out.to_host(space, KPool::StepOutputParts::ids_and_pooled)));
  };

  // The layer's selection against select_tokens with the rows given.
  auto const select = [&](char const* when, std::size_t rows, U32 const& ro, U32 const& cl,
                          int live) {
    SCOPED_TRACE(when);
    Kokkos::View<T***, Kokkos::LayoutRight, M> q("q", rows, H, D);
    Kokkos::View<float**, Kokkos::LayoutRight, M> w("weights", rows, H);
    fill_uniform(rng, q, -1, 1);
    fill_uniform(rng, w, 0, 1);
    I2 a("tokens_layer", rows, width), b("tokens", rows, width);
    Kokkos::deep_copy(a, -9);
    Kokkos::deep_copy(b, -9);
    if (v.share_workspace) {
      // The other layer selects first, through the same workspace.
      I2 c("tokens_other", rows, width);
      other.select_tokens(space, q, w, topk, c, opts);
    }
    layer.select_tokens(space, q, w, topk, a, opts);
    auto const batch = KPool::ragged_batch(ro, cl, live);
    KPool::select_tokens(space, q, w, topk, batch, KPool::paged(cache, table), b, ws, opts);
    EXPECT_EQ(raw_bytes(a), raw_bytes(b)) << "tokens";
    I2 ids_a("ids_layer", rows, topk), ids_b("ids", rows, topk);
    layer.score_select(space, q, w, topk, ids_a, opts);
    KPool::score_select(space, q, w, topk, batch, KPool::paged(cache, table), ids_b, ws, opts);
    EXPECT_EQ(raw_bytes(ids_a), raw_bytes(ids_b)) << "pool ids";
    // Something was selected: the comparison is not of two empty outputs.
    auto const h = on_host(a);
    int selected = 0;
    for (std::size_t i = 0; i < h.span(); ++i) selected += h.data()[i] >= 0 ? 1 : 0;
    EXPECT_GT(selected, 0);
  };

  // Chunked prefill: two chunks of two sequences (slots 2 and 0).
  std::vector<std::vector<std::uint32_t>> chunks[2] = {
      {{0, 21, 34}, {0, 0}},    // 21 and 13 tokens
      {{0, 9, 12}, {21, 13}}};  // 9 and 3 more
  for (auto const& chunk : chunks) {
    U32 const ro = to_index_view<U32>(chunk[0], "row_offsets");
    U32 const cl = to_index_view<U32>(chunk[1], "cache_lengths");
    U32 const slots = to_index_view<U32>(std::vector<std::uint32_t>{2, 0}, "slot_idx");
    std::size_t const rows = chunk[0].back();
    Kokkos::View<T**, Kokkos::LayoutRight, M> key("key", rows, D), gate("gate", rows, D);
    fill_uniform(rng, key, -2, 2);
    fill_uniform(rng, gate, -3, 3);
    U32 const ro_s = staged(ro), cl_s = staged(cl), slots_s = staged(slots);
    I2 const table_s = staged(table);
    auto const batch_s = KPool::ragged_batch(ro_s, cl_s, slots_s, 2);
    layer.step(space, key, gate, batch_s, table_s, opts);
    other.step(space, key, gate, batch_s, table_s, opts);
    KPool::step(space, ring, key, gate, ape, KPool::ragged_batch(ro, cl, slots, 2),
                KPool::paged(cache, table), out, opts);
    if (v.overwrite) {
      recycle(ro_s, rng);
      recycle(cl_s, rng);
      recycle(slots_s, rng);
      recycle(table_s, rng);
    }
    compare("prefill chunk");
    select("selection after the prefill chunk", rows, ro, cl, 2);
  }

  // Decode rounds: the next token and 2 drafts a row (B = 3, 2 live; row 1
  // padded), then a verify round that rejects drafts and re-sends from the
  // first rejected one (a rewind the serving ring length allows).
  int const next_n = 3;
  std::vector<std::vector<std::int32_t>> rounds = {
      {30, 31, 32, 16, 17, -1, -1, -1, -1},
      {31, 32, 33, 17, 18, 19, -1, -1, -1},  // rewinds 33 -> 31, 18 -> 17
      {-1, 34, 35, 20, -1, -1, 5, 6, 7}};    // left padding; row 2 dead
  for (auto const& pos : rounds) {
    auto const positions = positions_view<M>(pos, next_n);
    U32 const slots = to_index_view<U32>(std::vector<std::uint32_t>{2, 0, 3}, "slot_idx");
    Kokkos::View<T***, Kokkos::LayoutRight, M> key("key", 3, next_n, D),
        gate("gate", 3, next_n, D);
    fill_uniform(rng, key, -2, 2);
    fill_uniform(rng, gate, -3, 3);
    auto const positions_s = staged(positions);
    U32 const slots_s = staged(slots);
    I2 const table_s = staged(table);
    auto const batch_s = KPool::decode_batch(positions_s, slots_s, 2);
    layer.step(space, key, gate, batch_s, table_s, opts);
    other.step(space, key, gate, batch_s, table_s, opts);
    KPool::step(space, ring, key, gate, ape, KPool::decode_batch(positions, slots, 2),
                KPool::paged(cache, table), out, opts);
    if (v.overwrite) {
      recycle(positions_s, rng);
      recycle(slots_s, rng);
      recycle(table_s, rng);
    }
    compare("decode round");
    // Row r owns rows [3r, 3r + 3), entry i at position p - i' + i for its
    // first real entry (i', p).
    std::vector<std::uint32_t> ro{0, 3, 6, 9}, cl(3, 0);
    for (int r = 0; r < 3; ++r)
      for (int i = 0; i < next_n; ++i)
        if (pos[r * next_n + i] >= 0) {
          cl[r] = static_cast<std::uint32_t>(pos[r * next_n + i] - i);
          break;
        }
    EXPECT_EQ(layer.batch_rows(), 9u);
    select("selection after the decode round", 9, to_index_view<U32>(ro, "ro"),
           to_index_view<U32>(cl, "cl"), 2);
  }
}

// The engine recycles the buffers it gave each step before the selection:
// the layer selects from its own copy, the same bits as the low-level calls
// on the original batch (a layer holding the engine's handles would read
// garbage).
TEST(Layer, SelectsTheStepsBatchAfterTheEngineReusedItsBuffers) {
  Variant v;
  v.overwrite = true;
  layer_matches_low_level<float, float>(v);
  v.rotate = true;
  layer_matches_low_level<KPool::bfloat16, KPool::float8_e4m3>(v);
}

TEST(Layer, NativeCacheMatchesTheLowLevelCallsBitForBit) {
  layer_matches_low_level<float, float>(Variant{});
}

TEST(Layer, Fp8RotatedCacheMatchesTheLowLevelCallsBitForBit) {
  Variant v;
  v.rotate = true;
  layer_matches_low_level<KPool::bfloat16, KPool::float8_e4m3>(v);
}

// LayerConfig says the serving profile and the fused layout: the layer
// builds that cache itself, and selects in chunks of 5 query rows.
TEST(Layer, ServingProfileInTheFusedLayoutMatchesTheLowLevelCalls) {
  Variant v;
  v.rotate = v.serving = v.fused = true;
  v.select_rows = 5;
  layer_matches_low_level<KPool::bfloat16, KPool::float8_e4m3>(v);
}

// Engine-owned caches (unmanaged Views of the engine's allocations), in
// both layouts, adopted in place; two layers sharing one workspace.
TEST(Layer, AdoptsAnEngineOwnedCacheAndSharesAWorkspace) {
  Variant v;
  v.rotate = v.serving = v.fused = v.adopt_cache = v.share_workspace = true;
  layer_matches_low_level<KPool::bfloat16, KPool::float8_e4m3>(v);
  Variant split;
  split.rotate = split.serving = split.adopt_cache = split.share_workspace = true;
  layer_matches_low_level<KPool::bfloat16, KPool::float8_e4m3>(split);
  Variant native;
  native.adopt_cache = native.share_workspace = true;
  layer_matches_low_level<float, float>(native);
}

// What the layer adopts must be what its config says, and a workspace
// must be sized at all: each refused by name.
TEST(Layer, AdoptedBuffersMustMatchTheConfig) {
  E space;
  KPool::LayerConfig cfg = layer_config(4, 32, 4, 2, 2, 8, 4, 4);
  cfg.max_context = 64;
  cfg.profile = KPool::CacheProfile::serving;
  Kokkos::View<float**, M> ape("ape", 4, 32);
  using L = KPool::Layer<KPool::bfloat16, KPool::float8_e4m3, M>;
  auto const refused = [&](KPool::LayerConfig const& c,
                           KPool::LayerBuffers<KPool::bfloat16, KPool::float8_e4m3, M> const& b,
                           char const* argument, char const* value, char const* words) {
    expect_refused([&] { L const bad(space, c, ape, b); },
                   {"KPool::Layer", argument, value, words});
  };
  KPool::LayerBuffers<KPool::bfloat16, KPool::float8_e4m3, M> b;
  // An exact-profile cache for a serving layer.
  b.cache = KPool::PoolCache<KPool::float8_e4m3, M>(space, 4, 4, 32, 4);
  refused(cfg, b, "cache", "exact", "does not match config.profile = serving");
  // A cache of another K.
  b.cache = KPool::PoolCache<KPool::float8_e4m3, M>(space, 4, 4, 32, 2, KPool::CacheScale::pow2,
                                                    false, KPool::CacheProfile::serving);
  refused(cfg, b, "cache", "2", "does not match config.kpool = 4");
  // num_blocks 0 takes the cache's; a different one is refused.
  b.cache = KPool::PoolCache<KPool::float8_e4m3, M>(space, 6, 4, 32, 4, KPool::CacheScale::pow2,
                                                    false, KPool::CacheProfile::serving);
  refused(cfg, b, "cache", "6", "does not match config.num_blocks = 4");
  KPool::LayerConfig c0 = cfg;
  c0.num_blocks = 0;
  L const adopted(space, c0, ape, b);
  EXPECT_EQ(adopted.config().num_blocks, 6);
  // The fused layout is the serving profile's.
  KPool::LayerConfig exact = cfg;
  exact.profile = KPool::CacheProfile::exact;
  exact.layout = KPool::CacheLayout::fused;
  refused(exact, {}, "config", "fused", "is the serving profile's layout");
  // Neither max_visible nor max_context.
  KPool::LayerConfig unsized = cfg;
  unsized.max_context = 0;
  refused(unsized, {}, "config", "0", "give the longest context (max_context");
  // A shared workspace with shorter rows than the layer's queries see.
  KPool::LayerBuffers<KPool::bfloat16, KPool::float8_e4m3, M> w;
  w.workspace = KPool::SelectWorkspace<KPool::bfloat16, M>(space, 8, 15, 4, 32);
  refused(cfg, w, "workspace", "15",
          "is less than the pools a query row of this layer may see (16: max_visible = 16 "
          "rounded up to whole blocks of 4)");
  // max_visible 17 is 5 whole blocks of 4 pools: the workspace holds 20.
  KPool::LayerConfig odd = cfg;
  odd.max_context = 68;
  w.workspace = KPool::SelectWorkspace<KPool::bfloat16, M>(space, 8, 17, 4, 32);
  refused(odd, w, "workspace", "17", "(20: max_visible = 17 rounded up to whole blocks of 4)");
  w.workspace = KPool::SelectWorkspace<KPool::bfloat16, M>(space, 8, 16, 2, 32);
  refused(cfg, w, "workspace", "2", "does not match config.num_heads = 4");
}

TEST(Layer, ConfigIsChecked) {
  E space;
  KPool::LayerConfig cfg = layer_config(4, 8, 2, 2, 2, 8, 2, 2);
  cfg.max_context = 13;
  Kokkos::View<float**, M> ape("ape", 4, 8), wrong("ape", 2, 8);
  KPool::Layer<float, float, M> const ok(space, cfg, ape);
  EXPECT_EQ(ok.ring().ring_length(), 4);  // serving_length(4, 0)
  EXPECT_EQ(ok.config().max_visible, 4u);  // ceil(13 / 4)
  EXPECT_EQ(ok.config().select_rows, 8u);  // max_tokens
  // ape [2, 8] for K = 4, then max_batch 0.
  expect_refused([&] { KPool::Layer<float, float, M> const bad(space, cfg, wrong); },
                 {"KPool::Layer", "ape"});
  cfg.max_batch = 0;
  expect_refused([&] { KPool::Layer<float, float, M> const bad(space, cfg, ape); },
                 {"KPool::Layer", "config", "0"});
}

// A layer of cfg's sizes with at most 4 visible pools a row and an ape of
// zeros, for the tests of its refusals.
KPool::Layer<float, float, M> refusing_layer(E const& space, KPool::LayerConfig cfg) {
  cfg.max_visible = 4;
  return KPool::Layer<float, float, M>(
      space, cfg, Kokkos::View<float**, M>("ape", cfg.kpool, cfg.head_dim));
}

// A call past the sizes the layer was built for is refused in the config's
// words (the field and its value), naming the caller's argument, before
// anything is written; not as an error about the layer's private output.
TEST(Layer, CallsPastTheLayersSizesNameTheConfigField) {
  E space;
  KPool::Layer<float, float, M> layer =
      refusing_layer(space, layer_config(2, 8, 2, 4, 2, 6, 8, 2));
  I2 const table = positions_view<M>({0, 1, 2, 3, 4, 5}, 2);
  U32 const slots = to_index_view<U32>(std::vector<std::uint32_t>{0, 1, 2}, "slot_idx");
  U32 const lengths = to_index_view<U32>(std::vector<std::uint32_t>{0, 0, 0}, "cache_lengths");
  auto const ring_before = raw_bytes(layer.ring().tail());
  auto const expect = [&](auto const& call, char const* entry, char const* argument,
                          char const* value, char const* words) {
    expect_refused(call, {entry, argument, value, words});
    EXPECT_EQ(raw_bytes(layer.ring().tail()), ring_before) << entry << " wrote the ring";
  };
  // 8 token rows, 6 at most.
  Kokkos::View<float**, M> key8("key", 8, 8), gate8("gate", 8, 8);
  expect([&] {
    layer.step(space, key8, gate8,
               KPool::ragged_batch(
                   to_index_view<U32>(std::vector<std::uint32_t>{0, 4, 8}, "row_offsets"),
                   to_index_view<U32>(std::vector<std::uint32_t>{0, 0}, "cache_lengths"),
                   to_index_view<U32>(std::vector<std::uint32_t>{0, 1}, "slot_idx"), 2),
               table);
  }, "KPool::Layer::step", "key", "8",
         "is more token rows than LayerConfig::max_tokens = 6");
  // A batch of 3 rows, 2 at most.
  Kokkos::View<float**, M> key3("key", 3, 8), gate3("gate", 3, 8);
  expect([&] {
    layer.step(space, key3, gate3,
               KPool::ragged_batch(
                   to_index_view<U32>(std::vector<std::uint32_t>{0, 1, 2, 3}, "row_offsets"),
                   lengths, slots, 3),
               table);
  }, "KPool::Layer::step", "batch", "3",
         "is a batch of more rows than LayerConfig::max_batch = 2");
  // A decode batch of 2 x 4 entries (8 query rows, 6 at most), then of 3 rows.
  Kokkos::View<float***, M> dk("key", 2, 4, 8), dg("gate", 2, 4, 8);
  expect([&] {
    layer.step(space, dk, dg,
               KPool::decode_batch(positions_view<M>({0, 1, 2, 3, 0, 1, 2, 3}, 4), slots, 2),
               table);
  }, "KPool::Layer::step", "key", "8",
         "is more token rows than LayerConfig::max_tokens = 6");
  Kokkos::View<float***, M> dk3("key", 3, 1, 8), dg3("gate", 3, 1, 8);
  expect([&] {
    layer.step(space, dk3, dg3, KPool::decode_batch(positions_view<M>({0, 0, 0}, 1), slots, 3),
               table);
  }, "KPool::Layer::step", "batch", "3",
         "is a batch of more rows than LayerConfig::max_batch = 2");
  // Within the sizes: accepted.
  Kokkos::View<float**, M> key6("key", 6, 8), gate6("gate", 6, 8);
  EXPECT_NO_THROW(layer.step(
      space, key6, gate6,
      KPool::ragged_batch(
          to_index_view<U32>(std::vector<std::uint32_t>{0, 3, 6}, "row_offsets"),
          to_index_view<U32>(std::vector<std::uint32_t>{0, 0}, "cache_lengths"),
          to_index_view<U32>(std::vector<std::uint32_t>{0, 1}, "slot_idx"), 2),
      table));
}

TEST(Layer, SelectionNeedsAStepFirst) {
  E space;
  KPool::Layer<float, float, M> layer =
      refusing_layer(space, layer_config(2, 8, 2, 2, 2, 4, 2, 2));
  Kokkos::View<float***, M> q("q", 4, 2, 8);
  Kokkos::View<float**, M> w("w", 4, 2);
  I2 tokens("tokens", 4, KPool::select_tokens_width(1, 2));
  expect_refused([&] { layer.select_tokens(space, q, w, 1, tokens); },
                 {"KPool::Layer::select_tokens", "layer", "", nullptr, Refusal::any_row,
                  "KPool::Layer::select_tokens: argument 'layer': has run no step yet: a "
                  "selection follows step(), whose batch it selects for"});
}

// After a decode step, entry (r, i) is position base_r + i: a row whose
// first real entry is at index i with a position below i has no such base,
// and validation refuses it (row and value named).
TEST(Layer, DecodeSelectionRefusesANegativeBase) {
  E space;
  KPool::LayerConfig cfg = layer_config(2, 8, 2, 2, 2, 6, 4, 2);
  cfg.drafts = 2;
  KPool::Layer<float, float, M> layer = refusing_layer(space, cfg);
  Kokkos::View<float***, M> key("key", 2, 3, 8), gate("gate", 2, 3, 8);
  U32 const slots = to_index_view<U32>(std::vector<std::uint32_t>{0, 1}, "slot_idx");
  I2 const table = positions_view<M>({0, 1, 2, 3}, 2);  // row r: blocks 2r, 2r + 1
  Kokkos::View<float***, M> q("q", 6, 2, 8);
  Kokkos::View<float**, M> w("w", 6, 2);
  I2 tokens("tokens", 6, KPool::select_tokens_width(1, 2));
  // Row 1: padding, then positions 0 and 1 (base -1).
  layer.step(space, key, gate,
             KPool::decode_batch(positions_view<M>({0, 1, 2, -1, 0, 1}, 3), slots, 2), table);
  // The batch form's own check.
  expect_refused([&] { layer.select_tokens(space, q, w, 1, tokens); },
                 {"KPool::select_tokens", "positions", "0", nullptr, 1});
  // Left padding with room below is a position like any other.
  layer.step(space, key, gate,
             KPool::decode_batch(positions_view<M>({3, 4, 5, -1, 2, 3}, 3), slots, 2), table);
  EXPECT_NO_THROW(layer.select_tokens(space, q, w, 1, tokens));
}

}  // namespace
