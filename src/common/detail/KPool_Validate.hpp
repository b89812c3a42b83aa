#ifndef KPOOL_COMMON_DETAIL_VALIDATE_HPP
#define KPOOL_COMMON_DETAIL_VALIDATE_HPP

// Argument validation, run on the host before anything is launched. Checks
// on extents are free; checks on index data fence the caller's execution
// space instance (and only it) and copy only the per-request arrays
// (row_offsets, cache_lengths, slot_idx, positions) to the host, on that
// instance.

#include <common/KPool_Exceptions.hpp>
#include <common/KPool_Types.hpp>
#include <common/detail/KPool_KokkosExt.hpp>
#include <common/detail/KPool_Request.hpp>

#include <cstdint>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

// Compile-time checks of a View argument, with the argument's name and
// the expected type in the message: "KPool: 'row_offsets' must be a View of
// std::uint32_t (got std::int32_t)". Each check is a trait that holds for
// any type (a non-View fails the first and no other), so exactly one
// static_assert fires for a wrong argument; the entry points then skip
// their body (Details::view_ok, `if constexpr`), so no cascade of errors
// follows the message.
namespace KPool {
namespace Details {

template <class V, class = void>
struct view_facts {
  static constexpr bool is_view = false;
  static constexpr int rank = -1;
  using value = void;
  using memory_space = void;
  static constexpr bool is_const = false;
};
template <class V>
struct view_facts<V, std::enable_if_t<Kokkos::is_view<V>::value>> {
  static constexpr bool is_view = true;
  static constexpr int rank = static_cast<int>(V::rank);
  using value = typename V::non_const_value_type;
  using memory_space = typename V::memory_space;
  static constexpr bool is_const = std::is_const<typename V::value_type>::value;
};

// V is a View of Value (const allowed) of rank Rank in ES's memory space.
template <class V, class Value, int Rank, class ES>
constexpr bool view_ok() {
  using F = view_facts<V>;
  return F::is_view && F::rank == Rank &&
         std::is_same<typename F::value, Value>::value &&
         std::is_same<typename F::memory_space,
                      typename ES::memory_space>::value;
}

// A View's value type is Got, and Got is not Expected.
template <class V, class Expected, class Got>
constexpr bool wrong_value_is() {
  using F = view_facts<V>;
  return F::is_view && std::is_same<typename F::value, Got>::value &&
         !std::is_same<Expected, Got>::value;
}

}  // namespace Details
}  // namespace KPool

// One static_assert per common value type, so the message names the type
// found; other types get the last one.
#define KPOOL_IMPL_WRONG_VALUE(ViewType, Value, name, Got, got_name)          \
  static_assert(!::KPool::Details::wrong_value_is<ViewType, Value, Got>(),    \
                "KPool: '" name "' must be a View of " #Value " (got " got_name \
                ")")

#define KPOOL_IMPL_CHECK_VIEW(ViewType, Value, Rank, ExecSpace, name)          \
  static_assert(::KPool::Details::view_facts<ViewType>::is_view,              \
                "KPool: '" name "' must be a Kokkos::View of " #Value          \
                " (rank " #Rank ")");                                          \
  static_assert(!::KPool::Details::view_facts<ViewType>::is_view ||           \
                    ::KPool::Details::view_facts<ViewType>::rank == (Rank),     \
                "KPool: '" name "' must be a View of rank " #Rank " (of "     \
                #Value ")");                                                   \
  KPOOL_IMPL_WRONG_VALUE(ViewType, Value, name, std::int32_t, "std::int32_t"); \
  KPOOL_IMPL_WRONG_VALUE(ViewType, Value, name, std::uint32_t,                \
                         "std::uint32_t");                                     \
  KPOOL_IMPL_WRONG_VALUE(ViewType, Value, name, std::int64_t, "std::int64_t"); \
  KPOOL_IMPL_WRONG_VALUE(ViewType, Value, name, std::uint64_t,                \
                         "std::uint64_t");                                     \
  KPOOL_IMPL_WRONG_VALUE(ViewType, Value, name, float, "float");              \
  KPOOL_IMPL_WRONG_VALUE(ViewType, Value, name, double, "double");            \
  KPOOL_IMPL_WRONG_VALUE(ViewType, Value, name, ::KPool::bfloat16,            \
                         "KPool::bfloat16");                                   \
  KPOOL_IMPL_WRONG_VALUE(ViewType, Value, name, ::KPool::float16,             \
                         "KPool::float16");                                    \
  static_assert(                                                               \
      !::KPool::Details::view_facts<ViewType>::is_view ||                      \
          std::is_same<typename ::KPool::Details::view_facts<ViewType>::value, \
                       Value>::value ||                                        \
          std::is_same<typename ::KPool::Details::view_facts<ViewType>::value, \
                       std::int32_t>::value ||                                 \
          std::is_same<typename ::KPool::Details::view_facts<ViewType>::value, \
                       std::uint32_t>::value ||                                \
          std::is_same<typename ::KPool::Details::view_facts<ViewType>::value, \
                       std::int64_t>::value ||                                 \
          std::is_same<typename ::KPool::Details::view_facts<ViewType>::value, \
                       std::uint64_t>::value ||                                \
          std::is_same<typename ::KPool::Details::view_facts<ViewType>::value, \
                       float>::value ||                                        \
          std::is_same<typename ::KPool::Details::view_facts<ViewType>::value, \
                       double>::value ||                                       \
          std::is_same<typename ::KPool::Details::view_facts<ViewType>::value, \
                       ::KPool::bfloat16>::value ||                            \
          std::is_same<typename ::KPool::Details::view_facts<ViewType>::value, \
                       ::KPool::float16>::value,                               \
      "KPool: '" name "' must be a View of " #Value                            \
      " (got another value type)");                                            \
  static_assert(                                                               \
      !::KPool::Details::view_facts<ViewType>::is_view ||                      \
          std::is_same<                                                        \
              typename ::KPool::Details::view_facts<ViewType>::memory_space,   \
              typename ExecSpace::memory_space>::value,                        \
      "KPool: '" name "' must live in the execution space's memory space")

#define KPOOL_IMPL_CHECK_OUTPUT_VIEW(ViewType, Value, Rank, ExecSpace, name) \
  KPOOL_IMPL_CHECK_VIEW(ViewType, Value, Rank, ExecSpace, name);             \
  static_assert(!::KPool::Details::view_facts<ViewType>::is_const,           \
                "KPool: '" name "' is written and must not be const")

// The same checks as an expression: the static_asserts (each naming the
// argument), then whether the view is right. A list of them joined by &&
// is a function's checks and its verdict at once, so that an entry point
// can skip its body (`if constexpr`) and report only the failed assert.
#define KPOOL_IMPL_VIEW_OK(ViewType, Value, Rank, ExecSpace, name)          \
  ([] {                                                                    \
    KPOOL_IMPL_CHECK_VIEW(ViewType, Value, Rank, ExecSpace, name);         \
    return ::KPool::Details::view_ok<ViewType, Value, Rank, ExecSpace>();  \
  }())

#define KPOOL_IMPL_OUTPUT_VIEW_OK(ViewType, Value, Rank, ExecSpace, name)   \
  ([] {                                                                    \
    KPOOL_IMPL_CHECK_OUTPUT_VIEW(ViewType, Value, Rank, ExecSpace, name);  \
    return ::KPool::Details::view_ok<ViewType, Value, Rank, ExecSpace>() && \
           !::KPool::Details::view_facts<ViewType>::is_const;              \
  }())

namespace KPool {
namespace Details {

class Checker {
 public:
  explicit Checker(std::string entry_point) : entry_(std::move(entry_point)) {}

  std::string const& entry_point() const { return entry_; }

  [[noreturn]] void fail(std::string const& argument, std::string const& where,
                         std::int64_t row, std::string const& value,
                         std::string const& problem) const {
    throw InvalidArgument(entry_, argument, where, row, value, problem);
  }
  [[noreturn]] void fail_row(std::string const& argument, std::int64_t row,
                             std::int64_t value,
                             std::string const& problem) const {
    fail(argument, "row " + std::to_string(row), row, std::to_string(value),
         problem);
  }
  [[noreturn]] void fail_scalar(std::string const& argument,
                                std::int64_t value,
                                std::string const& problem) const {
    fail(argument, "", -1, std::to_string(value), problem);
  }

  // extent(dim) of `argument` must equal `expected`, which `source` names.
  void extent_is(std::string const& argument, int dim, std::size_t actual,
                 std::size_t expected, std::string const& source) const {
    if (actual != expected)
      fail(argument, "extent " + std::to_string(dim), -1,
           std::to_string(actual),
           "does not match " + source + " = " + std::to_string(expected));
  }
  void extent_at_least(std::string const& argument, int dim,
                       std::size_t actual, std::size_t needed,
                       std::string const& what) const {
    if (actual < needed)
      fail(argument, "extent " + std::to_string(dim), -1,
           std::to_string(actual),
           "is less than the " + std::to_string(needed) + " " + what);
  }

  // 0 <= num_requests <= B.
  void num_requests_within(int num_requests, std::size_t B) const {
    if (num_requests < 0)
      fail_scalar("num_requests", num_requests, "is negative");
    if (static_cast<std::size_t>(num_requests) > B)
      fail_scalar("num_requests", num_requests,
                  "exceeds the batch size B = " + std::to_string(B));
  }

  // The ragged batch's own shapes: row_offsets [B + 1], cache_lengths [B],
  // num_requests in [0, B]. Returns B.
  template <class Offsets, class Lengths>
  std::size_t batch_shape(Offsets const& row_offsets,
                          Lengths const& cache_lengths,
                          int num_requests) const {
    if (row_offsets.extent(0) < 1)
      fail("row_offsets", "extent 0", -1, "0",
           "leaves no room for B + 1 entries");
    std::size_t const B = row_offsets.extent(0) - 1;
    // Requests are indexed as int (num_requests, the offset scan).
    if (B > 0x7FFFFFFE)
      fail("row_offsets", "extent 0", -1, std::to_string(B + 1),
           "is too many requests (B + 1 entries, B at most 2^31 - 2)");
    extent_is("cache_lengths", 0, cache_lengths.extent(0), B,
              "the batch size B (row_offsets has B + 1 entries)");
    num_requests_within(num_requests, B);
    return B;
  }

  // kpool and head_dim, extents k_dim and k_dim + 1 of `source` (ape's
  // [K, D], or the ring's [slots, 2, K, D]).
  void pool_shape(std::size_t kpool, std::size_t head_dim,
                  std::string const& source = "ape", int k_dim = 0) const {
    std::string const k_where = "extent " + std::to_string(k_dim);
    std::string const d_where = "extent " + std::to_string(k_dim + 1);
    if (kpool < 1)
      fail(source, k_where, -1, std::to_string(kpool),
           "is not a valid kpool (K must be at least 1)");
    if (kpool > 0x7FFFFFFF)
      fail(source, k_where, -1, std::to_string(kpool), "is too large a kpool");
    if (head_dim < 1)
      fail(source, d_where, -1, std::to_string(head_dim),
           "is not a valid head_dim (D must be at least 1)");
    if (head_dim > 0x7FFFFFFF)
      fail(source, d_where, -1, std::to_string(head_dim),
           "is too large a head_dim");
  }

 private:
  std::string entry_;
};

// An entry point's profiling region and its checker, opened under its one
// name: the region covers the entry's whole body.
class Entry : public Checker {
 public:
  explicit Entry(std::string const& name) : Checker(name), region_(name) {}

 private:
  KokkosExt::ScopedProfileRegion region_;
};

// A small index array (already cut to the rows that matter) readable on
// the host, after the work queued on `space` (which may have written it)
// has finished. Only `space` is waited for and the copy runs on it: other
// instances (other streams) keep running. Memory the host can read is read
// in place.
template <class ExecutionSpace, class View>
auto host_readable(ExecutionSpace const& space, View const& v) {
  auto const h = KokkosExt::create_host_mirror_view_uninitialized(v);
  // A const view comes back as itself where the host reads it in place
  // (and is never copied to then).
  if constexpr (!std::is_const<typename std::decay_t<decltype(h)>::value_type>::value) {
    if (h.data() != v.data()) Kokkos::deep_copy(space, h, v);
  }
  KokkosExt::fence(space, "KPool: validation reads the index arrays");
  return h;
}

// The first n entries of a small index array on the host.
template <class ExecutionSpace, class View1D>
std::vector<typename View1D::non_const_value_type> host_copy(
    ExecutionSpace const& space, View1D const& v, std::size_t n) {
  auto const h = host_readable(
      space, Kokkos::subview(v, std::make_pair(std::size_t(0), n)));
  std::vector<typename View1D::non_const_value_type> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = h(i);
  return out;
}

// A ragged batch as validated on the host.
struct HostBatch {
  std::vector<std::uint32_t> row_offsets;    // [num_requests + 1]
  std::vector<std::uint32_t> cache_lengths;  // [num_requests]
  std::vector<RequestGeometry> geometry;     // [num_requests], R = K
  std::uint64_t full_pools = 0;              // sum of compress pools
  std::uint64_t closing = 0;                 // requests ring_close closes
  std::vector<std::uint32_t> slots;          // [num_requests] when checked
};

// A live row's (re)start of its slot's sequence: it sends positions
// [start, end) (the slot rules, check_slot_starts).
struct RingRestart {
  std::uint32_t slot;
  std::uint64_t start, end;
};

// Live slots below max_slots and distinct (docs/ring.md, "Slots").
// Returns the live slots.
template <class ExecutionSpace, class Slots>
std::vector<std::uint32_t> check_slots(Checker const& chk, ExecutionSpace const& space,
                                       Slots const& slot_idx, std::size_t n,
                                       int max_slots) {
  std::vector<std::uint32_t> slots = host_copy(space, slot_idx, n);
  std::unordered_map<std::uint32_t, std::size_t> owner;
  for (std::size_t r = 0; r < n; ++r) {
    if (slots[r] >= static_cast<std::uint32_t>(max_slots))
      chk.fail_row("slot_idx", static_cast<std::int64_t>(r), slots[r],
                   "is not below max_slots = " + std::to_string(max_slots));
    auto const ins = owner.emplace(slots[r], r);
    if (!ins.second)
      chk.fail_row("slot_idx", static_cast<std::int64_t>(r), slots[r],
                   "is already the slot of row " +
                       std::to_string(ins.first->second));
  }
  return slots;
}

// The data rules of a ragged batch whose shapes are already checked
// (docs/writers.md, "Ragged batches"; docs/ring.md): row_offsets starts at 0
// and never decreases, its live end fits the key rows, every sequence stays
// within int32 positions, live slots (when the writer uses the ring) are
// below max_slots and distinct.
template <class ExecutionSpace, class Offsets, class Lengths, class Slots>
HostBatch check_ragged_batch(Checker const& chk, ExecutionSpace const& space,
                             Offsets const& row_offsets,
                             Lengths const& cache_lengths, Slots const* slot_idx,
                             int num_requests, std::size_t key_rows,
                             int kpool, int max_slots,
                             char const* rows_of = "key and gate") {
  std::size_t const n = static_cast<std::size_t>(num_requests);
  HostBatch hb;
  hb.row_offsets = host_copy(space, row_offsets, n + 1);
  hb.cache_lengths = host_copy(space, cache_lengths, n);
  if (hb.row_offsets[0] != 0)
    chk.fail_row("row_offsets", 0, hb.row_offsets[0], "is not 0");
  for (std::size_t r = 1; r <= n; ++r) {
    if (hb.row_offsets[r] < hb.row_offsets[r - 1])
      chk.fail_row("row_offsets", static_cast<std::int64_t>(r),
                   hb.row_offsets[r],
                   "is less than row_offsets[" + std::to_string(r - 1) +
                       "] = " + std::to_string(hb.row_offsets[r - 1]));
  }
  if (hb.row_offsets[n] > key_rows)
    chk.fail_row("row_offsets", static_cast<std::int64_t>(n),
                 hb.row_offsets[n],
                 "exceeds the " + std::to_string(key_rows) + " rows of " +
                     rows_of);
  hb.geometry.resize(n);
  for (std::size_t r = 0; r < n; ++r) {
    std::uint64_t const rows = hb.row_offsets[r + 1] - hb.row_offsets[r];
    std::uint64_t const c = hb.cache_lengths[r];
    if (c + rows > max_sequence_length)
      chk.fail_row("cache_lengths", static_cast<std::int64_t>(r),
                   static_cast<std::int64_t>(c),
                   "plus the request's " + std::to_string(rows) +
                       " rows exceeds " + std::to_string(max_sequence_length) +
                       ", the longest sequence KPool indexes (int32 "
                       "positions)");
    // Validation counts pools only; the seed range (R) plays no part.
    hb.geometry[r] = request_geometry(c, rows, kpool, kpool);
    hb.full_pools += hb.geometry[r].full;
    hb.closing += hb.geometry[r].closes ? 1 : 0;
  }
  if (slot_idx) hb.slots = check_slots(chk, space, *slot_idx, n, max_slots);
  return hb;
}

// A validated ragged batch's rows as starts of their slots' sequences
// (hb.slots needed): row r sends positions [c, c + n).
inline std::vector<RingRestart> ragged_restarts(HostBatch const& hb) {
  std::vector<RingRestart> restarts;
  restarts.reserve(hb.geometry.size());
  for (std::size_t r = 0; r < hb.geometry.size(); ++r)
    restarts.push_back({hb.slots[r], hb.geometry[r].cache_length, hb.geometry[r].end});
  return restarts;
}

// The data rules of decode rows whose shapes are already checked: live
// slots below max_slots and distinct; real positions (>= 0) of a row
// consecutive, since a gap would close a pool from stale ring entries.
// A row's first real position may rewind below the sequence's length (the
// slot rules, check_slot_starts, from `restarts`).
// Returns the pools each live row closes; `pools`, when given, receives
// each live row's closed pool ids as a range [first, end) (consecutive
// positions close consecutive pools; empty when none); `restarts`, when
// given, each live row with a real position: its slot and the positions
// it sends.
template <class ExecutionSpace, class Positions, class Slots>
std::vector<int> check_decode_batch(
    Checker const& chk, ExecutionSpace const& space,
    Positions const& positions, Slots const& slot_idx, int num_requests,
    int kpool, int max_slots,
    std::vector<std::pair<std::int64_t, std::int64_t>>* pools = nullptr,
    std::vector<RingRestart>* restarts = nullptr) {
  std::size_t const next_n = positions.extent(1);
  std::size_t const n = static_cast<std::size_t>(num_requests);
  std::vector<std::uint32_t> const slots = check_slots(chk, space, slot_idx, n, max_slots);
  auto const h = host_readable(
      space, Kokkos::subview(positions, std::make_pair(std::size_t(0), n),
                             Kokkos::ALL));
  std::vector<int> closes(n, 0);
  for (std::size_t r = 0; r < n; ++r) {
    std::int64_t prev = -1;
    for (std::size_t i = 0; i < next_n; ++i) {
      std::int64_t const pos = h(r, i);
      if (pos < 0) continue;
      if (prev >= 0 && pos != prev + 1)
        chk.fail("positions",
                 "row " + std::to_string(r) + ", column " + std::to_string(i),
                 static_cast<std::int64_t>(r), std::to_string(pos),
                 "does not follow the row's previous real position " +
                     std::to_string(prev) + " (real positions must be "
                     "consecutive)");
      prev = pos;
      closes[r] += closes_pool(pos, kpool) ? 1 : 0;
    }
  }
  if (restarts) {
    restarts->clear();
    for (std::size_t r = 0; r < n; ++r) {
      std::int64_t first = -1, last = -1;
      for (std::size_t i = 0; i < next_n; ++i)
        if (h(r, i) >= 0) {
          if (first < 0) first = h(r, i);
          last = h(r, i);
        }
      restarts->push_back({slots[r], static_cast<std::uint64_t>(first < 0 ? 0 : first),
                           static_cast<std::uint64_t>(last + 1)});
    }
  }
  if (pools) {
    pools->assign(n, std::make_pair(std::int64_t(0), std::int64_t(0)));
    for (std::size_t r = 0; r < n; ++r)
      for (std::size_t i = 0; i < next_n; ++i) {
        std::int64_t const pos = h(r, i);
        if (!closes_pool(pos, kpool)) continue;
        std::int64_t const p = pos / kpool;
        auto& range = (*pools)[r];
        if (range.first == range.second) range.first = p;
        range.second = p + 1;
      }
  }
  return closes;
}

}  // namespace Details
}  // namespace KPool

#endif
