// The harness of the validation tests (tst_validation.cpp): a World of
// valid inputs for every entry point of the writers, the entry points
// themselves (Entry), what a refusal must name (Expect), and what an
// unvalidated call with bad data may write (Allowed, run_unvalidated).
#ifndef KPOOL_UNIT_TESTS_POOL_VALIDATION_WORLD_HPP
#define KPOOL_UNIT_TESTS_POOL_VALIDATION_WORLD_HPP

#include <KPoolTestUtils.hpp>

#include <functional>
#include <limits>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace KPoolValidationTest {

using namespace KPoolTest;

static_assert(std::is_base_of<std::invalid_argument, KPool::InvalidArgument>::value,
              "KPool::InvalidArgument must be a std::invalid_argument");

using namespace KPoolTest::OnDefaultSpace;
using T = KPool::bfloat16;
using I32 = Kokkos::View<std::int32_t*, M>;
using V2 = Kokkos::View<T**, Kokkos::LayoutRight, M>;
using V3 = Kokkos::View<T***, Kokkos::LayoutRight, M>;
using V4 = Kokkos::View<T****, Kokkos::LayoutRight, M>;
using Ring = KPool::Ring<T, M>;
using Out = KPool::StepOutput<T, M>;

constexpr int K = 4;
constexpr int kSlots = 8;
constexpr std::uint32_t kInt32Max = std::numeric_limits<std::int32_t>::max();

enum class Entry {
  compress,
  ring_close,
  seed_tail,
  tail_update,
  step_fused,
  step_unfused,
  decode_step,
  expand_topk,
  pool_row_offsets
};

inline std::string entry_name(Entry e) {
  switch (e) {
    case Entry::compress: return "KPool::compress";
    case Entry::ring_close: return "KPool::ring_close";
    case Entry::seed_tail: return "KPool::seed_tail";
    case Entry::tail_update: return "KPool::tail_update";
    case Entry::step_fused:
    case Entry::step_unfused: return "KPool::step";
    case Entry::decode_step: return "KPool::step";
    case Entry::expand_topk: return "KPool::expand_topk";
    case Entry::pool_row_offsets: return "KPool::compute_pool_row_offsets";
  }
  return "?";
}

inline std::string label(Entry e) {
  return entry_name(e) + (e == Entry::step_fused     ? " (fused)"
                          : e == Entry::step_unfused ? " (three launches)"
                          : e == Entry::decode_step  ? " (decode)"
                                                     : "");
}

// The entry points that take a ragged batch (row_offsets, cache_lengths).
std::vector<Entry> const kRagged = {
    Entry::compress,     Entry::ring_close,  Entry::seed_tail,
    Entry::step_fused,   Entry::step_unfused, Entry::expand_topk,
    Entry::pool_row_offsets};
// Those of them that use the ring (slot_idx).
std::vector<Entry> const kRaggedRing = {Entry::ring_close, Entry::seed_tail,
                                        Entry::step_fused, Entry::step_unfused};
// Those that read key and gate.
std::vector<Entry> const kRaggedKeys = {Entry::compress, Entry::ring_close,
                                        Entry::seed_tail, Entry::step_fused,
                                        Entry::step_unfused};
std::vector<Entry> const kDecode = {Entry::tail_update, Entry::decode_step};

template <class V>
void random_bytes(V const& v, Rng& rng) {
  auto h = Kokkos::create_mirror_view(v);
  auto* p = reinterpret_cast<unsigned char*>(h.data());
  std::size_t const n = h.span() * sizeof(typename V::value_type);
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<unsigned char>(rng.next());
  Kokkos::deep_copy(v, h);
}

// One valid call of every entry point, K = 4, bf16; tests break one thing.
//
// Ragged batch, B = 5, four live requests (cache length, rows):
//   (0, 9): two compress pools, one seeded;  (5, 3): closes pool 1;
//   (10, 0): empty;  (6, 2): closes pool 1.  Row 4 is dead, with garbage.
// Decode batch, B = 4, next_n = 3, three live rows; row 3 is dead.
// expand_topk: pool_ids has 16 rows, two past the live ones.
struct World {
  Rng rng{20240611};
  E space;
  int D;
  KPool::Options opts;

  // ragged
  std::vector<std::uint32_t> row_offsets{0, 9, 12, 12, 14, 3};
  std::vector<std::uint32_t> cache_lengths{0, 5, 10, 6, 0xFFFFFFF0u};
  std::vector<std::uint32_t> slot_idx{3, 0, 6, 2, 1000};
  int num_requests = 4;
  V2 key, gate;
  F2 ape;
  Ring ring;  // the steps and the ring writers
  V4 tail;    // empty, or a tail of a shape no Ring has for the writers (their checks of it)
  // decode
  int Bd = 4, next_n = 3;
  std::vector<std::int32_t> positions{3, 4, 5, 8, -1, 9, -1, -1, -1, 7, 2, 100};
  std::vector<std::uint32_t> dslots{2, 5, 7, 2};
  int dnum = 3;
  V3 key3, gate3;
  // expand_topk (K from the cache the ids come from); compute_pool_row_offsets reads key, ape
  I2 pool_ids;
  KPool::PoolCache<float, M> ids_cache{space, 1, 1, 1, K};
  bool tail_always = true;
  // outputs, exact sizes
  U32 c_offsets;
  V2 c_pooled;
  V2 rc_pooled;
  I32 rc_closed;
  V3 tu_pooled;
  I2 tu_closed;
  Out step_out, decode_out;
  I2 ex_out;
  U32 pro_offsets;

  explicit World(int head_dim = 8) : D(head_dim) {
    opts = test_options<E>();
    opts.validate = true;
    key = V2("key", 14, D);
    gate = V2("gate", 14, D);
    fill(key, -2, 2);
    fill(gate, -4, 4);
    ape = ape_view<M>(random_ape(rng, K, D));
    ring = Ring(space, kSlots, K, D);
    load_ring(ring, random_ring(rng, DType::bf16, kSlots, K, D));
    key3 = V3("key3", Bd, next_n, D);
    gate3 = V3("gate3", Bd, next_n, D);
    fill(key3, -2, 2);
    fill(gate3, -4, 4);
    pool_ids = I2("pool_ids", 16, 2);
    {
      auto h = Kokkos::create_mirror_view(pool_ids);
      for (std::size_t i = 0; i < h.span(); ++i)
        h.data()[i] = static_cast<std::int32_t>(rng.below(6)) - 1;
      Kokkos::deep_copy(pool_ids, h);
    }
    c_offsets = U32("compress.pool_row_offsets", 6);
    c_pooled = V2("compress.pooled", 2, D);
    rc_pooled = V2("ring_close.pooled", 5, D);
    rc_closed = I32("ring_close.closed_pool", 5);
    tu_pooled = V3("tail_update.pooled", Bd, 1, D);
    tu_closed = I2("tail_update.closed_pool", Bd, 1);
    step_out = Out(space, Out::capacity_for(14, 4, K), 5, D);
    decode_out = Out(space, 3, Bd, D);
    ex_out = I2("expand_topk.out", 16, KPool::expand_topk_width(2, K, true));
    pro_offsets = U32("compute_pool_row_offsets.out", 6);
    scramble_outputs();
  }

  template <class V>
  void fill(V const& v, double lo, double hi) {
    auto h = Kokkos::create_mirror_view(v);
    for (std::size_t i = 0; i < h.span(); ++i)
      h.data()[i] = to_storage<T>(KPoolRef::round_to(DType::bf16, rng.uniform(lo, hi)));
    Kokkos::deep_copy(v, h);
  }

  // Random bytes in every output, so that any write shows.
  void scramble_outputs() {
    space.fence();
    random_bytes(c_offsets, rng);
    random_bytes(c_pooled, rng);
    random_bytes(rc_pooled, rng);
    random_bytes(rc_closed, rng);
    random_bytes(tu_pooled, rng);
    random_bytes(tu_closed, rng);
    for (Out* o : {&step_out, &decode_out})
      if (o->max_batch() >= 0) {
        random_bytes(o->pooled(), rng);
        random_bytes(o->batch_row(), rng);
        random_bytes(o->pool_id(), rng);
        random_bytes(o->offsets(), rng);
      }
    random_bytes(ex_out, rng);
    random_bytes(pro_offsets, rng);
  }

  template <class V, class X>
  static V index_view(std::vector<X> const& v, std::string const& name) {
    return to_index_view<V>(v, name);
  }

  I2 positions_view() const {
    return int_matrix_view<M>(positions, Bd, next_n, "positions");
  }

  void run(Entry e) {
    U32 const ro = index_view<U32>(row_offsets, "row_offsets");
    U32 const cl = index_view<U32>(cache_lengths, "cache_lengths");
    U32 const si = index_view<U32>(slot_idx, "slot_idx");
    auto const batch = KPool::ragged_batch(ro, cl, num_requests);
    auto const ring_batch = KPool::ragged_batch(ro, cl, si, num_requests);
    auto const decode = KPool::decode_batch(positions_view(), index_view<U32>(dslots, "slot_idx"),
                                            dnum);
    // A tail set (no Ring has its shape) goes to the writers as the raw-tail forms: no slots.
    KPool::Options o = opts;
    switch (e) {
      case Entry::compress:
        KPool::compress(space, key, gate, ape, batch, c_offsets, c_pooled, o);
        break;
      // Each call is a batch of its own, not the next call of the same
      // sequences: the slots hold every position (as load_ring left them),
      // so that any start continues its sequence within the ring's depth,
      // and a call that returns leaves them so again (the slot rules are
      // tested in tst_streaming).
      case Entry::ring_close:
        if (tail.extent(0) == 0)
          KPool::ring_close(space, ring, key, gate, ape, ring_batch, rc_pooled, rc_closed, o);
        else
          KPool::Details::ring_close_impl(space, tail, key, gate, ape, ro, cl, si, num_requests,
                                          rc_pooled, rc_closed, o, {});
        break;
      case Entry::seed_tail:
        if (tail.extent(0) == 0)
          KPool::seed_tail(space, ring, key, gate, ring_batch, o);
        else
          KPool::Details::seed_tail_impl(space, tail, key, gate, ro, cl, si, num_requests, o, {});
        break;
      case Entry::tail_update:
        if (tail.extent(0) == 0)
          KPool::tail_update(space, ring, key3, gate3, ape, decode, tu_pooled, tu_closed, o);
        else
          KPool::Details::tail_update_impl(space, tail, key3, gate3, ape, decode.positions,
                                           decode.slot_idx, dnum, tu_pooled, tu_closed, o, {});
        break;
      case Entry::step_fused:
      case Entry::step_unfused:
        o.fused = e == Entry::step_fused;
        KPool::step(space, ring, key, gate, ape, ring_batch, step_out, o);
        break;
      case Entry::decode_step:
        KPool::step(space, ring, key3, gate3, ape, decode, decode_out, o);
        break;
      case Entry::expand_topk:
        KPool::expand_topk(space, pool_ids, tail_always, batch, ids_cache, ex_out, o);
        break;
      case Entry::pool_row_offsets:
        KPool::compute_pool_row_offsets(space, key, ape, batch, pro_offsets, o);
        break;
    }
    space.fence();
    hold_positions(ring, 0x7FFFFFFFu, 1);
  }
};

// Every writable byte, by part; a part's "rows" are its extent(0) (a ring
// slot for the ring).
struct Part {
  std::string name;
  std::vector<unsigned char> bytes;
  std::size_t rows = 0;
  std::size_t row_bytes() const { return rows ? bytes.size() / rows : 0; }
};
using Snapshot = std::vector<Part>;

template <class V>
void add(Snapshot& s, std::string const& name, V const& v) {
  auto const h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  auto const* p = reinterpret_cast<unsigned char const*>(h.data());
  s.push_back(Part{name,
                   std::vector<unsigned char>(
                       p, p + h.span() * sizeof(typename V::value_type)),
                   v.extent(0)});
}

inline Snapshot snapshot(World const& w) {
  Snapshot s;
  add(s, "ring", w.ring.tail());
  add(s, "ring.state", w.ring.state());
  if (w.tail.extent(0)) add(s, "tail", w.tail);
  add(s, "compress.pool_row_offsets", w.c_offsets);
  add(s, "compress.pooled", w.c_pooled);
  add(s, "ring_close.pooled", w.rc_pooled);
  add(s, "ring_close.closed_pool", w.rc_closed);
  add(s, "tail_update.pooled", w.tu_pooled);
  add(s, "tail_update.closed_pool", w.tu_closed);
  for (auto const& o : {std::make_pair("step", &w.step_out),
                        std::make_pair("decode_step", &w.decode_out)}) {
    if (o.second->max_batch() < 0) continue;
    std::string const n = o.first;
    add(s, n + ".pooled", o.second->pooled());
    add(s, n + ".batch_row", o.second->batch_row());
    add(s, n + ".pool_id", o.second->pool_id());
    add(s, n + ".offsets", o.second->offsets());
  }
  add(s, "expand_topk.out", w.ex_out);
  add(s, "compute_pool_row_offsets.out", w.pro_offsets);
  return s;
}

inline Part const& part(Snapshot const& s, std::string const& name) {
  for (Part const& p : s)
    if (p.name == name) return p;
  throw std::logic_error("no part " + name);
}

// Rows of `name` for which keep(row) holds are byte-for-byte unchanged.
inline ::testing::AssertionResult rows_unchanged(
    Snapshot const& before, Snapshot const& after, std::string const& name,
    std::function<bool(std::size_t)> const& keep) {
  Part const& a = part(before, name);
  Part const& b = part(after, name);
  if (a.bytes.size() != b.bytes.size())
    return ::testing::AssertionFailure() << name << " changed size";
  std::size_t const rb = a.row_bytes();
  for (std::size_t i = 0; i < a.bytes.size(); ++i)
    if (a.bytes[i] != b.bytes[i] && keep(rb ? i / rb : 0))
      return ::testing::AssertionFailure()
             << name << " row " << (rb ? i / rb : 0) << " (byte " << i
             << ") was written";
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult unchanged_except(Snapshot const& before,
                                            Snapshot const& after,
                                            std::set<std::string> const& skip) {
  if (before.size() != after.size())
    return ::testing::AssertionFailure() << "snapshot layout changed";
  for (Part const& p : before) {
    if (skip.count(p.name)) continue;
    auto const r =
        rows_unchanged(before, after, p.name, [](std::size_t) { return true; });
    if (!r) return r;
  }
  return ::testing::AssertionSuccess();
}

// What the rejection must say. `where` is the text between the argument and
// the value: "row <r>" by default when row >= 0, "extent <i>" for shapes,
// nothing for scalars.
struct Expect {
  std::string argument;
  std::int64_t row;
  std::string value;
  std::string where;
};

inline Expect at_row(std::string arg, std::int64_t row, std::uint64_t value) {
  return {std::move(arg), row, std::to_string(value), "row " + std::to_string(row)};
}
inline Expect at_extent(std::string arg, int extent, std::uint64_t value) {
  return {std::move(arg), -1, std::to_string(value),
          "extent " + std::to_string(extent)};
}
inline Expect scalar(std::string arg, std::int64_t value) {
  return {std::move(arg), -1, std::to_string(value), ""};
}

inline ::testing::AssertionResult check_message(std::string const& entry,
                                         KPool::InvalidArgument const& e,
                                         Expect const& x) {
  std::string const what = e.what();
  std::string const expected_text =
      entry + ": argument '" + x.argument + "'" +
      (x.where.empty() ? "" : ", " + x.where) + ": value " + x.value + " ";
  if (e.entry_point() != entry || e.argument() != x.argument ||
      e.row() != x.row || e.value() != x.value ||
      what.find(expected_text) != 0)
    return ::testing::AssertionFailure()
           << "got entry_point '" << e.entry_point() << "', argument '"
           << e.argument() << "', row " << e.row() << ", value '" << e.value()
           << "'\n  what(): " << what << "\n  expected what() to begin with: "
           << expected_text;
  // Also usable as the standard exception it derives from.
  std::invalid_argument const& base = e;
  if (std::string(base.what()) != what)
    return ::testing::AssertionFailure() << "what() differs through the base";
  return ::testing::AssertionSuccess();
}

// Runs `e` on `w`, which must throw KPool::InvalidArgument as `x` says and
// leave every output and the ring as they were.
inline ::testing::AssertionResult rejects(World& w, Entry e, Expect const& x) {
  Snapshot const before = snapshot(w);
  ::testing::AssertionResult result = ::testing::AssertionSuccess();
  try {
    w.run(e);
    result = ::testing::AssertionFailure() << "accepted the bad input";
  } catch (KPool::InvalidArgument const& ex) {
    result = check_message(entry_name(e), ex, x);
  } catch (std::exception const& ex) {
    result = ::testing::AssertionFailure()
             << "threw something other than KPool::InvalidArgument: "
             << ex.what();
  }
  w.space.fence();
  if (result) result = unchanged_except(before, snapshot(w), {});
  if (!result) result << "\n  (entry point " << label(e) << ")";
  return result;
}

inline void expect_rejected(World& w, std::vector<Entry> const& entries,
                     Expect const& x) {
  for (Entry e : entries) EXPECT_TRUE(rejects(w, e, x));
}

template <class F>
::testing::AssertionResult ctor_rejects(F&& make, Expect const& x,
                                        std::string const& entry = "KPool::Ring") {
  try {
    make();
  } catch (KPool::InvalidArgument const& ex) {
    return check_message(entry, ex, x);
  }
  return ::testing::AssertionFailure() << entry << " accepted it";
}

// What an unvalidated call with bad data may write, by entry point: the ring
// slots of `owned` (rows whose data is valid), and output rows the valid
// rows produce. Everything else must be byte-for-byte unchanged.
struct Allowed {
  std::set<std::uint32_t> ragged_slots;  // ring slots valid ragged rows own
  std::set<std::uint32_t> decode_slots;  // ring slots valid decode rows own
  std::vector<std::pair<std::uint32_t, std::uint32_t>> token_rows;  // expand
};

// Runs `e` with validation off: no exception, nothing outside what `a`
// allows written.
inline void run_unvalidated(World& w, Entry e, Allowed const& a) {
  SCOPED_TRACE(label(e) + " D=" + std::to_string(w.D));
  w.opts.validate = false;
  Snapshot const before = snapshot(w);
  try {
    w.run(e);
  } catch (std::exception const& ex) {
    ADD_FAILURE() << "threw with validation off: " << ex.what();
    return;
  }
  Snapshot const after = snapshot(w);
  std::set<std::string> written;
  bool const ring_writer = e == Entry::seed_tail || e == Entry::tail_update ||
                           e == Entry::step_fused || e == Entry::step_unfused ||
                           e == Entry::decode_step;
  if (ring_writer) {
    written.insert("ring");
    bool const decode = e == Entry::tail_update || e == Entry::decode_step;
    std::set<std::uint32_t> const& owned =
        decode ? a.decode_slots : a.ragged_slots;
    EXPECT_TRUE(rows_unchanged(before, after, "ring", [&](std::size_t s) {
      return owned.count(static_cast<std::uint32_t>(s)) == 0;
    })) << "a ring slot no valid row owns was written";
  }
  auto const dead = [](int live) {
    return [live](std::size_t r) { return r >= static_cast<std::size_t>(live); };
  };
  // A writer's pooled and closed_pool: rows past its `live` ones stay.
  auto const writes_live_rows = [&](std::string const& entry, int live) {
    for (char const* p : {".pooled", ".closed_pool"}) {
      written.insert(entry + p);
      EXPECT_TRUE(rows_unchanged(before, after, entry + p, dead(live)));
    }
  };
  switch (e) {
    case Entry::compress: {
      written = {"compress.pool_row_offsets", "compress.pooled"};
      // Rows past the pools the offsets announce are untouched.
      auto const off = on_host(w.c_offsets);
      std::size_t const count = off(static_cast<std::size_t>(w.num_requests));
      EXPECT_TRUE(rows_unchanged(before, after, "compress.pooled",
                                 [&](std::size_t r) { return r >= count; }));
      break;
    }
    case Entry::ring_close:
      writes_live_rows("ring_close", w.num_requests);
      break;
    case Entry::tail_update:
      writes_live_rows("tail_update", w.dnum);
      break;
    case Entry::step_fused:
    case Entry::step_unfused:
    case Entry::decode_step: {
      std::string const n = e == Entry::decode_step ? "decode_step" : "step";
      Out const& out = e == Entry::decode_step ? w.decode_out : w.step_out;
      for (char const* p : {".pooled", ".batch_row", ".pool_id", ".offsets"})
        written.insert(n + p);
      std::size_t const count = on_host(out.count())();
      for (char const* p : {".pooled", ".batch_row", ".pool_id"})
        EXPECT_TRUE(rows_unchanged(before, after, n + p,
                                   [&](std::size_t r) { return r >= count; }));
      break;
    }
    case Entry::expand_topk:
      written = {"expand_topk.out"};
      EXPECT_TRUE(rows_unchanged(before, after, "expand_topk.out",
                                 [&](std::size_t t) {
                                   for (auto const& be : a.token_rows)
                                     if (t >= be.first && t < be.second)
                                       return false;
                                   return true;
                                 }))
          << "a token row outside every live request was written";
      break;
    case Entry::pool_row_offsets:
      written = {"compute_pool_row_offsets.out"};
      break;
    case Entry::seed_tail:
      break;
  }
  EXPECT_TRUE(unchanged_except(before, after, written))
      << "an output of another entry point changed";
}

// The token rows each live request covers (expand_topk may write those).
inline std::vector<std::pair<std::uint32_t, std::uint32_t>> token_rows(World const& w) {
  std::vector<std::pair<std::uint32_t, std::uint32_t>> v;
  for (int r = 0; r < w.num_requests; ++r)
    v.emplace_back(w.row_offsets[r], w.row_offsets[r + 1]);
  return v;
}

inline std::vector<Entry> all_entries() {
  return {Entry::compress,     Entry::ring_close,  Entry::seed_tail,
          Entry::tail_update,  Entry::step_fused,  Entry::step_unfused,
          Entry::decode_step,  Entry::expand_topk, Entry::pool_row_offsets};
}

// D = 8 takes the generic kernels, D = 128 with K = 4 the compiled-shape fast
// path.
inline std::vector<int> defence_dims() { return {8, 128}; }

}  // namespace KPoolValidationTest

#endif
