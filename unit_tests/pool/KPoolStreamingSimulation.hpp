// The harness of the streaming tests (tst_streaming.cpp): sequences cut
// into random chunks, decode runs and verify rounds with rewinds, sent
// through the steps with rows shuffled and slots reused (Simulation), each
// pool and cache entry held to a one-shot compress of its sequence.
#ifndef KPOOL_UNIT_TESTS_POOL_STREAMING_SIMULATION_HPP
#define KPOOL_UNIT_TESTS_POOL_STREAMING_SIMULATION_HPP

#include <KPoolCacheReference.hpp>
#include <KPoolTestUtils.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

namespace KPoolStreamingTest {

using namespace KPoolTest;

// A ragged batch of one request: n token rows from position c (to `slot`).
template <class Mem, class U32 = Kokkos::View<std::uint32_t*, Mem>>
KPool::Batch<Mem> one_request(std::uint32_t c, std::uint32_t n, U32 const& slot = U32()) {
  return KPool::ragged_batch(to_index_view<U32>(std::vector<std::uint32_t>{0, n}, "ro"),
                             to_index_view<U32>(std::vector<std::uint32_t>{c}, "cl"), slot, 1);
}

// One request's key and gate rows [length, D] compressed in one call (the
// one-shot reference a streamed sequence must match bit for bit): its
// length / K pools [pools, D], K = ape.rows, on the host.
template <class C>
auto one_shot_pools(Matrix const& key, Matrix const& gate, Matrix const& ape) {
  using T = typename C::value_type;
  using Mem = typename C::memory_space;
  int const length = key.rows;
  Kokkos::View<std::uint32_t*, Mem> offsets("offsets", 2);
  Kokkos::View<T**, Kokkos::LayoutRight, Mem> once("once", length / ape.rows, ape.cols);
  KPool::compress(typename C::execution_space(), to_view<T, Mem>(key, "key"),
                  to_view<T, Mem>(gate, "gate"), ape_view<Mem>(ape),
                  one_request<Mem>(0, length), offsets, once);
  return on_host(once);
}

// The cache a simulation's steps write (on = false: none).
struct CacheKind {
  bool on = false;
  bool fp8 = false;
  KPool::CacheScale scale = KPool::CacheScale::none;
  bool rotate = false;
  bool serving = false;  // the serving profile (fp8, pow2)

  KPool::CacheProfile profile() const {
    return serving ? KPool::CacheProfile::serving : KPool::CacheProfile::exact;
  }
};

inline std::string cache_name(CacheKind const& k) {
  if (!k.on) return "no cache";
  return std::string(k.fp8 ? "fp8 " : "native ") + KPool::cache_scale_name(k.scale) +
         (k.rotate ? " rotated" : "") + (k.serving ? " serving" : "");
}

// Every cache kind for storage type t and head_dim D, "none" first.
inline std::vector<CacheKind> cache_kinds(DType t, int D) {
  std::vector<CacheKind> v{CacheKind{}};
  bool const pow2 = (D & (D - 1)) == 0;
  for (bool rotate : {false, true}) {
    if (rotate && !pow2) continue;
    v.push_back({true, false, KPool::CacheScale::none, rotate});
    if (t == DType::f64) continue;
    v.push_back({true, true, KPool::CacheScale::amax, rotate});
    v.push_back({true, true, KPool::CacheScale::pow2, rotate});
  }
  return v;
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
  // The fp8 cache type; f64 pools have none (their kinds are native only).
  using F8 = std::conditional_t<std::is_same<T, double>::value, T, KPool::float8_e4m3>;
  using Table = Kokkos::View<std::int32_t**, Kokkos::LayoutRight, Mem>;
  using U32 = Kokkos::View<std::uint32_t*, Mem>;

 public:
  // drafts = S > 0 adds verify rounds, with the serving ring length.
  // cache.on: every call writes that pool cache too.
  Simulation(int K, int D, std::uint64_t seed, int drafts = 0, CacheKind cache = {})
      : K_(K), D_(D), drafts_(drafts), rng_(seed), ape_(random_ape(rng_, K, D)),
        ring_(E(), slots_, K, D, KPool::Ring<T, Mem>::serving_length(K, drafts)),
        out_(E(), KPool::StepOutput<T, Mem>::capacity_for(max_tokens_, max_batch_, K),
             max_batch_, D),
        kind_(cache) {
    for (int s = 0; s < slots_; ++s) free_.push_back(s);
    if (kind_.on) grow_cache();
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
      auto const h = one_shot_pools<C>(key, gate, ape_);
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
      for (int p = 0; p < pools; ++p) {
        std::vector<T> v(D_);
        for (int c = 0; c < D_; ++c) v[c] = h(p, c);
        once_.push_back(OneShotPool{id, p, std::move(v)});
      }
    }
    if (kind_.fp8)
      verify_cache(fp8_);
    else if (kind_.on)
      verify_cache(native_);
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
  bool used_every_path() const { return used_both_step_paths() && decode_calls_ > 0; }
  // Pools whose cache entries were checked.
  int cache_entries_checked() const { return cache_checked_; }

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
      if (kind_.on) assign_blocks(live_.back());
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
    KPool::Options o = test_options<E>();
    o.fused = rng_.below(2) == 0;
    ++(o.fused ? fused_calls_ : unfused_calls_);
    auto const batch = KPool::ragged_batch(to_index_view<U32>(offsets, "row_offsets"),
                                           to_index_view<U32>(cache, "cache_lengths"),
                                           to_index_view<U32>(slot, "slot_idx"), n);
    auto const run_step = [&](auto&&... paged_cache) {
      KPool::step(E(), ring_, to_view<T, Mem>(key, "key"), to_view<T, Mem>(gate, "gate"),
                  ape_view<Mem>(ape_), batch, paged_cache..., out_, o);
    };
    with_cache(rows, B, run_step);
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
    auto const batch = KPool::decode_batch(pos_v, to_index_view<U32>(slot, "slot_idx"), n);
    auto const run_decode = [&](auto&&... paged_cache) {
      KPool::step(E(), ring_, key, gate, ape_view<Mem>(ape_), batch, paged_cache..., out_,
                  test_options<E>());
    };
    with_cache(rows, B, run_decode);
    ++decode_calls_;
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

  // Runs call() without a cache, or call(KPool::paged(cache, block_table))
  // with the simulation's, the table's row r holding rows[r]'s blocks (-1
  // past them) and garbage in the rows past num_requests.
  template <class Call>
  void with_cache(std::vector<Sequence*> const& rows, int B, Call const& call) {
    if (!kind_.on) {
      call();
      return;
    }
    int width = 1;
    for (Sequence* s : rows) width = std::max(width, static_cast<int>(blocks_[s->id].size()));
    Table table("block_table", B, width);
    auto h = Kokkos::create_mirror_view(table);
    for (int r = 0; r < B; ++r)
      for (int c = 0; c < width; ++c) {
        std::vector<std::int32_t> const* b =
            r < static_cast<int>(rows.size()) ? &blocks_[rows[r]->id] : nullptr;
        h(r, c) = b ? (c < static_cast<int>(b->size()) ? (*b)[c] : -1)
                    : static_cast<std::int32_t>(rng_.next());
      }
    Kokkos::deep_copy(table, h);
    if (kind_.fp8)
      call(KPool::paged(fp8_, table));
    else
      call(KPool::paged(native_, table));
  }

  // Enough blocks for every pool a sequence can complete, drafts past its
  // length included, in a random order of the cache's free blocks.
  void assign_blocks(Sequence const& s) {
    int const pools = (s.length + drafts_) / K_ + 1;
    int const n = (pools + block_pools_ - 1) / block_pools_;
    while (static_cast<int>(free_blocks_.size()) < n) grow_cache();
    std::vector<std::int32_t>& b = blocks_[s.id];
    b.assign(free_blocks_.end() - n, free_blocks_.end());
    free_blocks_.resize(free_blocks_.size() - n);
  }

  // Doubles the cache (at least 32 blocks), keeping what it holds.
  void grow_cache() {
    int const old = kind_.fp8 ? fp8_.num_blocks() : native_.num_blocks();
    int const n = std::max(32, 2 * old);
    if (kind_.fp8)
      fp8_ = grown(fp8_, n);
    else
      native_ = grown(native_, n);
    std::vector<std::int32_t> fresh(n - old);
    std::iota(fresh.begin(), fresh.end(), old);
    for (int i = static_cast<int>(fresh.size()); i > 1; --i)
      std::swap(fresh[i - 1], fresh[rng_.below(i)]);
    free_blocks_.insert(free_blocks_.begin(), fresh.begin(), fresh.end());
  }

  template <class Cc>
  KPool::PoolCache<Cc, Mem> grown(KPool::PoolCache<Cc, Mem> const& c, int blocks) const {
    KPool::PoolCache<Cc, Mem> g(E(), blocks, block_pools_, D_, K_, kind_.scale, kind_.rotate,
                                kind_.profile());
    if (c.is_allocated()) {
      auto const head = std::make_pair(0, c.num_blocks());
      Kokkos::deep_copy(Kokkos::subview(g.values(), head, Kokkos::ALL, Kokkos::ALL), c.values());
      Kokkos::deep_copy(Kokkos::subview(g.scales(), head, Kokkos::ALL), c.scales());
    }
    return g;
  }

  // The entries of every sequence's pools [0, pools): equal, byte for byte,
  // to the reference's Q(R(x)) of the pools as last emitted, and to what
  // store_pools writes from the one-shot compress of each whole sequence.
  template <class Cc>
  void verify_cache(KPool::PoolCache<Cc, Mem> const& streamed) {
    SCOPED_TRACE(cache_name(kind_));
    KPoolCacheRef::CacheKind const ref{
        C::dtype, kind_.fp8,
        kind_.scale == KPool::CacheScale::amax   ? KPoolCacheRef::Scale::amax
        : kind_.scale == KPool::CacheScale::pow2 ? KPoolCacheRef::Scale::pow2
                                                 : KPoolCacheRef::Scale::none,
        kind_.rotate, kind_.serving};
    // The one-shot pools through store_pools, batch row i = sequence
    // seqs[i], into a fresh cache with the same blocks.
    std::vector<int> seqs;
    for (auto const& o : once_)
      if (seqs.empty() || seqs.back() != o.seq) seqs.push_back(o.seq);
    int const B = std::max<int>(1, static_cast<int>(seqs.size()));
    int width = 1;
    for (int id : seqs) width = std::max(width, static_cast<int>(blocks_[id].size()));
    Table table("one_shot_table", B, width);
    auto ht = Kokkos::create_mirror_view(table);
    Kokkos::deep_copy(ht, -1);
    std::map<int, int> row_of;
    for (int i = 0; i < static_cast<int>(seqs.size()); ++i) {
      row_of[seqs[i]] = i;
      for (std::size_t c = 0; c < blocks_[seqs[i]].size(); ++c) ht(i, c) = blocks_[seqs[i]][c];
    }
    Kokkos::deep_copy(table, ht);
    std::size_t const n = once_.size();
    KPool::StepOutput<T, Mem> out(E(), std::max<std::size_t>(n, 1), B, D_);
    {
      out.begin_call(B);
      auto ho = Kokkos::create_mirror_view(out.offsets());
      Kokkos::deep_copy(ho, 0u);
      ho(B) = static_cast<std::uint32_t>(n);
      auto hp = Kokkos::create_mirror_view(out.pooled());
      auto hb = Kokkos::create_mirror_view(out.batch_row());
      auto hi = Kokkos::create_mirror_view(out.pool_id());
      for (std::size_t o = 0; o < n; ++o) {
        hb(o) = row_of[once_[o].seq];
        hi(o) = once_[o].pool;
        for (int c = 0; c < D_; ++c) hp(o, c) = once_[o].values[c];
      }
      Kokkos::deep_copy(out.offsets(), ho);
      Kokkos::deep_copy(out.pooled(), hp);
      Kokkos::deep_copy(out.batch_row(), hb);
      Kokkos::deep_copy(out.pool_id(), hi);
    }
    KPool::PoolCache<Cc, Mem> one_shot(E(), streamed.num_blocks(), block_pools_, D_, K_,
                                       kind_.scale, kind_.rotate, kind_.profile());
    KPool::store_pools(E(), out, KPool::ragged_batch(U32("ro", B + 1), U32("cl", B), B),
                       KPool::paged(one_shot, table), test_options<E>());

    auto const sv = on_host(streamed.values());
    auto const ss = on_host(streamed.scales());
    auto const ov = on_host(one_shot.values());
    auto const os = on_host(one_shot.scales());
    for (auto const& o : once_) {
      SCOPED_TRACE("sequence " + std::to_string(o.seq) + " pool " + std::to_string(o.pool));
      int const block = blocks_[o.seq][o.pool / block_pools_];
      int const entry = o.pool % block_pools_;
      Cc const* const got = &sv(block, entry, 0);
      ASSERT_EQ(std::memcmp(got, &ov(block, entry, 0), D_ * sizeof(Cc)), 0)
          << "streamed cache values differ from store_pools of the one-shot pools";
      ASSERT_EQ(std::memcmp(&ss(block, entry), &os(block, entry), sizeof(float)), 0)
          << "scale: streamed " << ss(block, entry) << ", one-shot " << os(block, entry);
      std::vector<double> x(D_);
      for (int c = 0; c < D_; ++c) x[c] = to_double(o.values[c]);
      KPoolCacheRef::Entry const want = KPoolCacheRef::quantize(ref, x);
      ASSERT_EQ(want.bytes.size(), D_ * sizeof(Cc));
      ASSERT_EQ(std::memcmp(got, want.bytes.data(), want.bytes.size()), 0)
          << "streamed cache values differ from the reference's Q(R(x))";
      ASSERT_EQ(std::memcmp(&ss(block, entry), &want.scale, sizeof(float)), 0)
          << "scale: streamed " << ss(block, entry) << ", reference " << want.scale;
      ++cache_checked_;
    }
  }

  struct OneShotPool {
    int seq;
    int pool;
    std::vector<T> values;
  };

  int K_, D_, drafts_;
  Rng rng_;
  Matrix ape_;
  static constexpr int slots_ = 6, max_batch_ = 12, max_tokens_ = 12 * (4 * 16 + 3);
  static constexpr int block_pools_ = 4;
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
  int fused_calls_ = 0, unfused_calls_ = 0, decode_calls_ = 0;
  CacheKind kind_;
  KPool::PoolCache<T, Mem> native_;
  KPool::PoolCache<F8, Mem> fp8_;
  std::map<int, std::vector<std::int32_t>> blocks_;  // per sequence
  std::vector<std::int32_t> free_blocks_;
  std::vector<OneShotPool> once_;  // verify()'s one-shot pools, by sequence
  int cache_checked_ = 0;
};

}  // namespace KPoolStreamingTest

#endif
