// fuzz_sequence: the input's bytes decode into a sequence of calls over the
// three slots of one ring (docs/ring.md): prefill chunks, continuations,
// decode steps and speculative rounds with rejected drafts re-sent, through
// every entry point that reads or moves a slot (KPool::step fused and
// unfused with a pool cache, the decode step with one, ring_close +
// compress + seed_tail in their ring forms, tail_update's ring form), and
// Ring::reset, seed_tail's ring form, deep rewinds, forward gaps and
// mid-pool starts between them.
//
// Every call is held to an executable model of the contract
// (docs/ring.md, SEMANTICS "Rewinds" and "No gaps"), written here from the
// text: per slot, whether it holds anything, the positions it holds
// [start, L), H, and the values last sent for each position.
//   - A call the model accepts, validated or not, returns and emits
//     exactly the pools whose last member it sends, each bit for bit a
//     one-shot KPool::compress of the values last sent for its members; a
//     step's pools are in the pool cache with the same bits.
//   - A validated call the model refuses is refused by KPool by name (the
//     argument that carries c, the model's first refused row, value c),
//     with the ring (entries and state), the outputs and the cache byte for
//     byte as they were.
//   - An unvalidated call the model refuses runs under AddressSanitizer
//     (no read or write outside the caller's buffers, which are
//     allocations of exactly their size); its slots are then reset in both.
//   - The model checks itself: a start it accepts has the pending pool's
//     earlier members at their ring indices with their last-sent values.
//
// Input layout (missing bytes read as 0): K (one of 1, 2, 3, 4), R / K (1,
// 2 or 4), then up to 40 operations, each an op byte, a flags byte (bit 0:
// validate) and the op's fields (fuzz/README.md).

#include <KPool.hpp>

#include <Kokkos_Core.hpp>

#include "FuzzSupport.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace KPoolFuzz {
char const* const harness_name = "fuzz_sequence";
}

namespace {

using namespace KPoolFuzz;
using E = Kokkos::DefaultHostExecutionSpace;
using M = E::memory_space;
using T = float;
template <class DataType>
using U = Kokkos::View<DataType, Kokkos::LayoutRight, M, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

constexpr int kSlots = 3, kD = 4, kMaxPosition = 128, kBlockPools = 4;
constexpr int kBlocksPerSlot = kMaxPosition / kBlockPools;  // K = 1: one pool a position
constexpr int kOps = 40;

using Row = std::vector<T>;  // one position's key or gate, D values

// The contract's model of one slot.
struct SlotModel {
  bool holds = false;  // false: fresh or reset
  long start = 0, length = 0, high = 0;
  std::map<long, Row> key, gate;  // the values last sent, by position
  // The ring itself: which position's values each index last received.
  std::vector<long> ring_position;
  std::vector<Row> ring_key, ring_gate;
};

enum class Verdict { ok, fresh_mid_pool, gap, before_start, too_deep };

// SEMANTICS, "Rewinds" and "No gaps", for a call that reads the ring and
// sends positions [c, c + n), n > 0.
Verdict judge(SlotModel const& s, long c, int K, int R) {
  if (c == 0) return Verdict::ok;  // a new sequence
  long const base = c / K * K;
  if (!s.holds) return c % K == 0 ? Verdict::ok : Verdict::fresh_mid_pool;
  if (c > s.length) return Verdict::gap;
  if (c % K != 0 && base < s.start) return Verdict::before_start;
  if (s.high - base > R) return Verdict::too_deep;
  return Verdict::ok;
}

struct Model {
  int K = 1, R = 1;
  SlotModel slot[kSlots];

  void reset(int s) {
    SlotModel& m = slot[s];
    m.holds = false;
    m.start = m.length = m.high = 0;
    m.key.clear();
    m.gate.clear();
  }

  // What a call that sent [c, end) leaves: the slot holds [start, end),
  // after what it held when the call continues it; `stashed` the positions
  // written to the ring, in order.
  void sent(int s, long c, long end, std::vector<Row> const& key, std::vector<Row> const& gate,
            std::vector<long> const& stashed) {
    SlotModel& m = slot[s];
    bool const continues = c != 0 && m.holds && c <= m.length && end >= m.start;
    if (!continues) {
      m.key.clear();
      m.gate.clear();
    }
    for (auto it = m.key.lower_bound(end); it != m.key.end();) it = m.key.erase(it);
    for (auto it = m.gate.lower_bound(end); it != m.gate.end();) it = m.gate.erase(it);
    m.start = continues ? std::min(m.start, c) : c;
    m.high = continues ? std::max(m.high, end) : end;
    m.length = end;
    m.holds = true;
    for (long p = c; p < end; ++p) {
      m.key[p] = key[p - c];
      m.gate[p] = gate[p - c];
    }
    for (long p : stashed) {
      int const idx = static_cast<int>(p % R);
      m.ring_position[idx] = p;
      m.ring_key[idx] = key[p - c];
      m.ring_gate[idx] = gate[p - c];
    }
  }

  // The model's own check: an accepted start at c has the pending pool's
  // earlier members in the ring with their last-sent values.
  void members_in_ring(int s, long c) const {
    SlotModel const& m = slot[s];
    for (long p = c / K * K; p < c; ++p) {
      int const idx = static_cast<int>(p % R);
      auto const k = m.key.find(p);
      if (m.ring_position[idx] != p || k == m.key.end() || m.ring_key[idx] != k->second ||
          m.ring_gate[idx] != m.gate.at(p))
        defect("the contract accepts a start at " + std::to_string(c) + " in slot " +
               std::to_string(s) + " whose member " + std::to_string(p) +
               " is not in the ring (model)");
    }
  }
};

// One row of a call: its slot, the positions it sends [c, c + n).
struct RowCall {
  int slot = 0;
  long c = 0;
  int n = 0;
  int pad = 0;  // decode: padding entries before the first real one
};

class Sequence {
 public:
  Sequence(Bytes& in, int K, int R)
      : in_(in),
        ring_(E(), kSlots, K, kD, R),
        out_(E(), KPool::StepOutput<T, M>::capacity_for(kSlots * (2 * 8 + 2), kSlots, K), kSlots,
             kD),
        cache_(E(), kSlots * kBlocksPerSlot, kBlockPools, kD, K),
        vals_(in.u8()) {
    model_.K = K;
    model_.R = R;
    for (SlotModel& s : model_.slot) {
      s.ring_position.assign(R, -1);
      s.ring_key.assign(R, Row(kD, 0));
      s.ring_gate.assign(R, Row(kD, 0));
    }
    // What a former user left in the ring and the cache.
    fill_host(ring_.tail().data(), ring_.tail().span());
    fill_host(cache_.values().data(), cache_.values().span());
  }

  void run() {
    for (int op = 0; op < kOps && !in_.empty(); ++op) {
      int const kind = in_.pick(7);
      bool const validate = (in_.u8() & 1) != 0;
      switch (kind) {
        case 0: ragged(Path::fused, validate); break;
        case 1: ragged(Path::unfused, validate); break;
        case 2: decode(Path::decode, validate); break;
        case 3: ragged(Path::writers, validate); break;
        case 4: decode(Path::tail_update, validate); break;
        case 5: {
          int const s = in_.pick(kSlots);
          ring_.reset(E(), s);
          model_.reset(s);
          break;
        }
        case 6: seed(validate); break;
      }
    }
  }

 private:
  enum class Path { fused, unfused, decode, writers, tail_update };

  template <class P>
  void fill_host(P* p, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) p[i] = vals_.next();
  }

  int K() const { return model_.K; }

  // A row's start relative to what its slot holds: continue, rewind, gap,
  // a new sequence, a pool boundary, or any small position.
  long start_for(int s) {
    SlotModel const& m = model_.slot[s];
    int const how = in_.pick(6), d = 1 + in_.pick(2 * model_.R + K());
    switch (how) {
      case 0: return m.length;
      case 1: return std::max(0L, m.length - d);
      case 2: return m.length + d % (K() + 2);
      case 3: return 0;
      case 4: return static_cast<long>(in_.pick(kMaxPosition / K())) * K();
      default: return in_.pick(kMaxPosition);
    }
  }

  // 1 to 3 rows on distinct slots, each sending at most `most` positions,
  // within kMaxPosition.
  std::vector<RowCall> rows(int most) {
    int const B = 1 + in_.pick(kSlots);
    int const first = in_.pick(kSlots);
    std::vector<RowCall> v(B);
    for (int r = 0; r < B; ++r) {
      v[r].slot = (first + r) % kSlots;
      v[r].c = std::min<long>(start_for(v[r].slot), kMaxPosition - 1);
      v[r].n = std::min<int>(in_.pick(most + 1), static_cast<int>(kMaxPosition - v[r].c));
    }
    return v;
  }

  // The model's verdict on a call: the first refused row, or -1, and the
  // rule it breaks.
  int first_refused(std::vector<RowCall> const& v, Verdict* why = nullptr) const {
    for (std::size_t r = 0; r < v.size(); ++r) {
      if (v[r].n == 0) continue;
      Verdict const j = judge(model_.slot[v[r].slot], v[r].c, K(), model_.R);
      if (j == Verdict::ok) continue;
      if (why) *why = j;
      return static_cast<int>(r);
    }
    return -1;
  }

  // The words of KPool's error for each rule (docs/ring.md).
  static char const* words(Verdict v) {
    switch (v) {
      case Verdict::fresh_mid_pool: return "starts a sequence mid-pool";
      case Verdict::gap: return "is a gap";
      case Verdict::before_start: return "needs the pending pool's earlier members";
      case Verdict::too_deep: return "deeper than the ring holds";
      case Verdict::ok: break;
    }
    return "";
  }

  // Every byte a call may write, KPool's and the caller's.
  std::vector<unsigned char> snapshot(Arena const& a) const {
    std::vector<unsigned char> v = a.snapshot();
    auto add = [&](auto const& view) {
      auto const* p = reinterpret_cast<unsigned char const*>(view.data());
      v.insert(v.end(), p, p + view.span() * sizeof(typename std::decay_t<decltype(view)>::value_type));
    };
    add(ring_.tail());
    add(ring_.state());
    add(out_.pooled());
    add(out_.pool_id());
    add(out_.batch_row());
    add(out_.offsets());
    add(out_.count());
    add(cache_.values());
    return v;
  }

  // Runs `call` as the model says it must go: refused by name with
  // nothing written, or returning (then true).
  template <class F>
  bool judged(std::vector<RowCall> const& v, bool validate, char const* argument,
              Arena const& a, F&& call) {
    Verdict why = Verdict::ok;
    int const bad = first_refused(v, &why);
    if (bad >= 0 && !validate) {
      // Only the sanitizers hold it; the slots are then abandoned.
      try {
        call();
      } catch (KPool::InvalidArgument const& x) {
        defect(std::string("an unvalidated call was refused: ") + x.what());
      }
      E().fence();
      for (RowCall const& r : v) {
        ring_.reset(E(), r.slot);
        model_.reset(r.slot);
      }
      return false;
    }
    std::vector<unsigned char> const before = snapshot(a);
    try {
      call();
      E().fence();
    } catch (KPool::InvalidArgument const& x) {
      E().fence();
      if (bad < 0) defect(std::string("a call the contract allows was refused: ") + x.what());
      if (x.argument() != argument || x.row() != bad ||
          x.value() != std::to_string(v[bad].c) ||
          std::string(x.what()).find(words(why)) == std::string::npos)
        defect(std::string("refused otherwise than the contract says (row ") +
               std::to_string(bad) + ", c = " + std::to_string(v[bad].c) + "): " + x.what());
      if (snapshot(a) != before) defect(std::string("a refused call wrote: ") + x.what());
      return false;
    }
    if (bad >= 0)
      defect("a call the contract refuses was accepted: row " + std::to_string(bad) +
             ", slot " + std::to_string(v[bad].slot) + ", c = " + std::to_string(v[bad].c));
    return true;
  }

  // New values for n positions.
  std::vector<Row> fresh(int n) {
    std::vector<Row> v(n, Row(kD));
    for (Row& r : v)
      for (T& x : r) x = vals_.next();
    return v;
  }

  // Pools a row emits: those whose last member it sends.
  std::vector<long> closing(RowCall const& r) const {
    std::vector<long> p;
    for (long q = r.c; q < r.c + r.n; ++q)
      if (q % K() == K() - 1) p.push_back(q / K());
    return p;
  }

  // The emitted pools, (row, pool id) -> values, against one-shot compress
  // of the model's values (after the call) and, for the steps, the cache.
  void expect_pools(std::vector<RowCall> const& v, std::map<std::pair<int, long>, Row> const& got,
                    bool cached) {
    std::map<std::pair<int, long>, Row> want_ids;
    std::vector<std::pair<int, long>> order;
    for (std::size_t r = 0; r < v.size(); ++r)
      for (long p : closing(v[r])) order.emplace_back(static_cast<int>(r), p);
    if (order.size() != got.size())
      defect("emitted " + std::to_string(got.size()) + " pools, the contract " +
             std::to_string(order.size()));
    if (order.empty()) return;
    // One request a pool, K rows each, at c = p * K.
    int const P = static_cast<int>(order.size());
    std::vector<T> key(P * K() * kD), gate(P * K() * kD);
    std::vector<std::uint32_t> offsets(P + 1), lengths(P);
    for (int i = 0; i < P; ++i) {
      auto const [r, p] = order[i];
      SlotModel const& m = model_.slot[v[r].slot];
      offsets[i + 1] = (i + 1) * K();
      lengths[i] = static_cast<std::uint32_t>(p * K());
      for (int j = 0; j < K(); ++j)
        for (int ch = 0; ch < kD; ++ch) {
          key[(i * K() + j) * kD + ch] = m.key.at(p * K() + j)[ch];
          gate[(i * K() + j) * kD + ch] = m.gate.at(p * K() + j)[ch];
        }
    }
    std::vector<std::uint32_t> pro(P + 1);
    std::vector<T> once(P * kD);
    KPool::compress(E(), U<const T**>(key.data(), P * K(), kD), U<const T**>(gate.data(), P * K(), kD),
                    U<const float**>(ape_.data(), K(), kD),
                    KPool::ragged_batch(U<const std::uint32_t*>(offsets.data(), P + 1),
                                        U<const std::uint32_t*>(lengths.data(), P), P),
                    U<std::uint32_t*>(pro.data(), P + 1), U<T**>(once.data(), P, kD));
    E().fence();
    for (int i = 0; i < P; ++i) {
      auto const it = got.find(order[i]);
      if (it == got.end())
        defect("pool " + std::to_string(order[i].second) + " of row " +
               std::to_string(order[i].first) + " was not emitted");
      if (std::memcmp(it->second.data(), &once[i * kD], kD * sizeof(T)) != 0)
        defect("pool " + std::to_string(order[i].second) + " of row " +
               std::to_string(order[i].first) + " differs from a one-shot compress");
      if (cached) {
        long const p = order[i].second;
        int const block = v[order[i].first].slot * kBlocksPerSlot + static_cast<int>(p / kBlockPools);
        if (std::memcmp(&cache_.values()(block, p % kBlockPools, 0), &once[i * kD],
                        kD * sizeof(T)) != 0)
          defect("the cache entry of pool " + std::to_string(p) + " differs from the pool");
      }
    }
  }

  // Each row's blocks: its slot's.
  U<std::int32_t**> table(Arena& a, std::vector<RowCall> const& v) {
    auto t = a.input<U<std::int32_t**>>(v.size(), kBlocksPerSlot);
    for (std::size_t r = 0; r < v.size(); ++r)
      for (int j = 0; j < kBlocksPerSlot; ++j) t(r, j) = v[r].slot * kBlocksPerSlot + j;
    return t;
  }

  std::map<std::pair<int, long>, Row> step_pools() const {
    std::map<std::pair<int, long>, Row> got;
    std::uint32_t const count = out_.count()();
    for (std::uint32_t o = 0; o < count; ++o)
      got[{out_.batch_row()(o), out_.pool_id()(o)}] =
          Row(&out_.pooled()(o, 0), &out_.pooled()(o, 0) + kD);
    return got;
  }

  // A ragged call: a fused or three-launch step with the cache, or the
  // writers' ring forms in order.
  void ragged(Path path, bool validate) {
    std::vector<RowCall> v = rows(2 * K() + 1);
    int const B = static_cast<int>(v.size());
    Arena a;
    std::vector<std::vector<Row>> keys(B), gates(B);
    auto ro = a.input<U<std::uint32_t*>>(B + 1);
    auto cl = a.input<U<std::uint32_t*>>(B);
    auto si = a.input<U<std::uint32_t*>>(B);
    ro(0) = 0;
    for (int r = 0; r < B; ++r) {
      keys[r] = fresh(v[r].n);
      gates[r] = fresh(v[r].n);
      ro(r + 1) = ro(r) + v[r].n;
      cl(r) = static_cast<std::uint32_t>(v[r].c);
      si(r) = static_cast<std::uint32_t>(v[r].slot);
    }
    int const rows_total = static_cast<int>(ro(B));
    auto key = a.input<U<T**>>(rows_total, kD);
    auto gate = a.input<U<T**>>(rows_total, kD);
    for (int r = 0; r < B; ++r)
      for (int i = 0; i < v[r].n; ++i)
        for (int ch = 0; ch < kD; ++ch) {
          key(ro(r) + i, ch) = keys[r][i][ch];
          gate(ro(r) + i, ch) = gates[r][i][ch];
        }
    auto const bt = table(a, v);
    auto const batch = KPool::ragged_batch(ro, cl, si, B);
    KPool::Options o;
    o.validate = validate;
    o.fused = path == Path::fused;
    auto const ape = U<const float**>(ape_.data(), K(), kD);
    // The writers' outputs.
    auto rc_pooled = a.output<U<T**>>(B, kD);
    auto rc_closed = a.output<U<std::int32_t*>>(B);
    auto offsets = a.output<U<std::uint32_t*>>(B + 1);
    int const most_pools = rows_total / K() + 1;
    auto pooled = a.output<U<T**>>(most_pools, kD);
    bool const returned = judged(v, validate, "cache_lengths", a, [&] {
      if (path == Path::writers) {
        KPool::ring_close(E(), ring_, key, gate, ape, batch, rc_pooled, rc_closed, o);
        KPool::compress(E(), key, gate, ape, KPool::ragged_batch(ro, cl, B), offsets, pooled, o);
        KPool::seed_tail(E(), ring_, key, gate, batch, o);
      } else {
        KPool::step(E(), ring_, key, gate, ape, batch, KPool::paged(cache_, bt), out_, o);
      }
    });
    if (!returned) return;
    for (int r = 0; r < B; ++r) {
      if (v[r].n == 0) continue;
      model_.members_in_ring(v[r].slot, v[r].c);
      long const end = v[r].c + v[r].n;
      std::vector<long> stashed;
      for (long p = std::max(v[r].c, end - model_.R); p < end; ++p) stashed.push_back(p);
      model_.sent(v[r].slot, v[r].c, end, keys[r], gates[r], stashed);
    }
    std::map<std::pair<int, long>, Row> got;
    if (path == Path::writers) {
      for (int r = 0; r < B; ++r) {
        if (rc_closed(r) >= 0) got[{r, rc_closed(r)}] = Row(&rc_pooled(r, 0), &rc_pooled(r, 0) + kD);
        long const first = (v[r].c + K() - 1) / K();
        for (std::uint32_t j = offsets(r); j < offsets(r + 1); ++j)
          got[{r, first + static_cast<long>(j - offsets(r))}] =
              Row(&pooled(j, 0), &pooled(j, 0) + kD);
      }
    } else {
      got = step_pools();
    }
    expect_pools(v, got, path != Path::writers);
  }

  // A decode call, next_n 1 to 2K a row, padding before and after: the
  // decode step with the cache, or tail_update's ring form.
  void decode(Path path, bool validate) {
    int const next_n = 1 + in_.pick(2 * K());
    std::vector<RowCall> v = rows(next_n);
    int const B = static_cast<int>(v.size());
    Arena a;
    auto positions = a.input<U<std::int32_t**>>(B, next_n);
    auto key = a.input<U<T***>>(B, next_n, kD);
    auto gate = a.input<U<T***>>(B, next_n, kD);
    auto si = a.input<U<std::uint32_t*>>(B);
    std::vector<std::vector<Row>> keys(B), gates(B);
    for (int r = 0; r < B; ++r) {
      v[r].pad = in_.pick(next_n - v[r].n + 1);
      keys[r] = fresh(v[r].n);
      gates[r] = fresh(v[r].n);
      si(r) = static_cast<std::uint32_t>(v[r].slot);
      for (int i = 0; i < next_n; ++i) {
        int const j = i - v[r].pad;
        bool const real = j >= 0 && j < v[r].n;
        positions(r, i) = real ? static_cast<std::int32_t>(v[r].c + j) : -1;
        for (int ch = 0; ch < kD; ++ch) {
          key(r, i, ch) = real ? keys[r][j][ch] : vals_.next();
          gate(r, i, ch) = real ? gates[r][j][ch] : vals_.next();
        }
      }
    }
    auto const bt = table(a, v);
    auto const batch = KPool::decode_batch(positions, si, B);
    KPool::Options o;
    o.validate = validate;
    auto const ape = U<const float**>(ape_.data(), K(), kD);
    int const most = (next_n + K() - 1) / K();
    auto tu_pooled = a.output<U<T***>>(B, most, kD);
    auto tu_closed = a.output<U<std::int32_t**>>(B, most);
    bool const returned = judged(v, validate, "positions", a, [&] {
      if (path == Path::tail_update)
        KPool::tail_update(E(), ring_, key, gate, ape, batch, tu_pooled, tu_closed, o);
      else
        KPool::step(E(), ring_, key, gate, ape, batch, KPool::paged(cache_, bt), out_, o);
    });
    if (!returned) return;
    for (int r = 0; r < B; ++r) {
      if (v[r].n == 0) continue;
      model_.members_in_ring(v[r].slot, v[r].c);
      std::vector<long> stashed;
      for (long p = v[r].c; p < v[r].c + v[r].n; ++p) stashed.push_back(p);
      model_.sent(v[r].slot, v[r].c, v[r].c + v[r].n, keys[r], gates[r], stashed);
    }
    std::map<std::pair<int, long>, Row> got;
    if (path == Path::tail_update) {
      for (int r = 0; r < B; ++r)
        for (int j = 0; j < most && tu_closed(r, j) >= 0; ++j)
          got[{r, tu_closed(r, j)}] = Row(&tu_pooled(r, j, 0), &tu_pooled(r, j, 0) + kD);
    } else {
      got = step_pools();
    }
    expect_pools(v, got, path == Path::decode);
  }

  // seed_tail's ring form: one slot, positions [c, c + n) from a pool
  // boundary (the pending pool's earlier members of a mid-pool start),
  // or anywhere.
  void seed(bool validate) {
    RowCall r;
    r.slot = in_.pick(kSlots);
    r.c = in_.u8() & 1 ? static_cast<long>(in_.pick(kMaxPosition / K())) * K()
                       : static_cast<long>(in_.pick(kMaxPosition));
    r.n = std::min<int>(in_.pick(2 * K() + 1), static_cast<int>(kMaxPosition - r.c));
    Arena a;
    std::vector<Row> const key_rows = fresh(r.n), gate_rows = fresh(r.n);
    auto key = a.input<U<T**>>(r.n, kD);
    auto gate = a.input<U<T**>>(r.n, kD);
    for (int i = 0; i < r.n; ++i)
      for (int ch = 0; ch < kD; ++ch) {
        key(i, ch) = key_rows[i][ch];
        gate(i, ch) = gate_rows[i][ch];
      }
    auto ro = a.input<U<std::uint32_t*>>(2);
    auto cl = a.input<U<std::uint32_t*>>(1);
    auto si = a.input<U<std::uint32_t*>>(1);
    ro(0) = 0;
    ro(1) = static_cast<std::uint32_t>(r.n);
    cl(0) = static_cast<std::uint32_t>(r.c);
    si(0) = static_cast<std::uint32_t>(r.slot);
    KPool::Options o;
    o.validate = validate;
    try {
      KPool::seed_tail(E(), ring_, key, gate, KPool::ragged_batch(ro, cl, si, 1), o);
      E().fence();
    } catch (KPool::InvalidArgument const& x) {
      defect(std::string("seed_tail refused a valid call: ") + x.what());
    }
    if (r.n == 0) return;
    long const end = r.c + r.n;
    std::vector<long> stashed;
    for (long p = std::max(r.c, end - model_.R); p < end; ++p) stashed.push_back(p);
    model_.sent(r.slot, r.c, end, key_rows, gate_rows, stashed);
  }

  Bytes& in_;
  Model model_;
  KPool::Ring<T, M> ring_;
  KPool::StepOutput<T, M> out_;
  KPool::PoolCache<T, M> cache_;
  Values vals_;
  std::vector<float> ape_ = std::vector<float>(4 * kD);

 public:
  void set_ape() {
    for (float& x : ape_) x = vals_.next();
  }
};

void run(std::uint8_t const* data, std::size_t size) {
  Bytes in(data, size);
  int const K = 1 + in.pick(4);
  int const multiples[] = {1, 2, 4};
  int const R = K * multiples[in.pick(3)];
  Sequence s(in, K, R);
  s.set_ape();
  s.run();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("OMP_NUM_THREADS", "1", 0);
  setenv("OMP_PROC_BIND", "false", 0);
  Kokkos::initialize();
  std::atexit([] { Kokkos::finalize(); });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  run(data, size);
  return 0;
}
