// The selection's top-k from keys alone (docs/indexer.md, "Selection"),
// every kernel variant: one-thread and many-thread teams, rows staged in
// team scratch or read from memory, candidates compacted or not (more ties
// than the candidate buffer holds), early exits, long rows split over
// teams, row chunks, 32- and 64-bit keys. The expectation is the ranking
// itself, computed here by sorting: keys descending, ties to the lower id,
// key 0 (not visible) never, ids ascending, then -1.

#include <KPoolTestUtils.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

template <class Key>
std::vector<std::int32_t> ranking(std::vector<Key> const& keys, int topk) {
  std::vector<std::int32_t> ids;
  for (std::size_t p = 0; p < keys.size(); ++p)
    if (keys[p] != 0) ids.push_back(static_cast<std::int32_t>(p));
  std::stable_sort(ids.begin(), ids.end(),
                   [&](std::int32_t a, std::int32_t b) { return keys[a] > keys[b]; });
  if (ids.size() > static_cast<std::size_t>(topk)) ids.resize(topk);
  std::sort(ids.begin(), ids.end());
  ids.resize(topk, -1);
  return ids;
}

// Row kinds: distinct random keys, a few values with many ties, one value
// for most of the row (more ties than the candidate buffer), keys equal in
// their top digits (several row passes), mostly not visible.
template <class Key>
std::vector<Key> make_row(std::mt19937_64& rng, int kind, std::size_t n) {
  std::vector<Key> row(n);
  Key const top = static_cast<Key>(~Key(0));
  for (std::size_t p = 0; p < n; ++p) {
    Key v = static_cast<Key>(rng());
    switch (kind) {
      case 0:
        break;
      case 1:
        v = static_cast<Key>(0x80000000u + 977u * (rng() % 7));
        break;
      case 2:
        v = rng() % 10 == 0 ? v : static_cast<Key>(top / 3);
        break;
      case 3:
        // Same top 20 bits, ties in the low ones.
        v = static_cast<Key>((top / 5) & ~Key(0xFFFFF)) | static_cast<Key>(rng() % 300);
        break;
      default:
        v = rng() % 8 == 0 ? v : Key(0);
        break;
    }
    if (rng() % 50 == 0) v = 0;  // not visible
    if (rng() % 70 == 0) v = 1;  // NaN
    row[p] = v;
  }
  return row;
}

struct TopkCase {
  std::vector<std::size_t> lengths;  // visible pools per row
  int topk;
};

// Runs the selection over the given rows (one request a row, K = 1) and
// compares every row with the ranking; `what` names a row's kind.
// The plan states of the split rows a check_rows call selected
// (SplitPlan::fallback, threshold, all), counted.
struct PlanStates {
  int count[3] = {0, 0, 0};
};

template <class Key, class What>
void check_rows(std::vector<std::vector<Key>> const& rows, int topk, int team_size,
                std::size_t chunk_rows, KPool::Details::SelectSplit split,
                What const& what, PlanStates* states = nullptr) {
  using E = Kokkos::DefaultExecutionSpace;
  using M = E::memory_space;
  namespace D = KPool::Details;
  E space;
  TopkCase c;
  c.topk = topk;
  for (auto const& row : rows) c.lengths.push_back(row.size());
  int const R = static_cast<int>(c.lengths.size());
  std::size_t const max_visible =
      std::max<std::size_t>(1, *std::max_element(c.lengths.begin(), c.lengths.end()));

  Kokkos::View<std::uint32_t*, M> offsets("offsets", R + 1), lengths("lengths", R);
  auto ho = Kokkos::create_mirror_view(offsets);
  auto hl = Kokkos::create_mirror_view(lengths);
  for (int r = 0; r <= R; ++r) ho(r) = r;
  for (int r = 0; r < R; ++r) hl(r) = static_cast<std::uint32_t>(c.lengths[r]);
  // A row at position cache_length sees cache_length + 1 pools at K = 1.
  for (int r = 0; r < R; ++r) hl(r) -= 1;
  Kokkos::deep_copy(offsets, ho);
  Kokkos::deep_copy(lengths, hl);

  Kokkos::View<Key*, M> keys("keys", chunk_rows * max_visible);
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> out("out", R, c.topk);
  Kokkos::deep_copy(out, -7);
  std::size_t const segs =
      max_visible > split.from ? (max_visible + split.segment - 1) / split.segment : 0;
  Kokkos::View<std::uint32_t*, M> hist(
      "hist", chunk_rows * D::split_region_words(std::max<std::size_t>(segs, 1)));
  Kokkos::View<std::uint32_t*, M> plans(
      "plans", chunk_rows * D::split_plan_words(std::max<std::size_t>(segs, 1)));
  // The long rows' tickets, zero between launches (the workspace's
  // fused_tickets): checked after every launch.
  Kokkos::View<std::uint32_t*, M> tickets("tickets", chunk_rows);
  D::SplitArgs args;
  args.seg_hist = hist.data();
  args.plans = plans.data();
  args.tickets = tickets.data();
  args.segs = static_cast<int>(segs);
  args.from = split.from;
  args.segment = split.segment;
  D::SelectBatch batch;
  batch.row_offsets = offsets;
  batch.cache_lengths = lengths;
  batch.num_requests = R;
  batch.kpool = 1;
  batch.total_rows = static_cast<std::uint64_t>(R);
  batch.max_visible = max_visible;
  KPool::Options o;
  o.team_size = team_size;
  D::Checker const chk("tst_select_topk");
  auto hk = Kokkos::create_mirror_view(keys);
  for (std::size_t b = 0; b < static_cast<std::size_t>(R); b += chunk_rows) {
    std::size_t const e = std::min<std::size_t>(R, b + chunk_rows);
    for (std::size_t t = b; t < e; ++t)
      std::copy(rows[t].begin(), rows[t].end(), hk.data() + (t - b) * max_visible);
    Kokkos::deep_copy(keys, hk);
    batch.row_begin = b;
    batch.row_end = e;
    D::launch_select<false>(chk, space, batch, static_cast<Key const*>(keys.data()),
                            D::View2<std::int32_t, M>(out), c.topk, args, o);
    space.fence();
    auto const ht = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), tickets);
    for (std::size_t t = 0; t < chunk_rows; ++t)
      ASSERT_EQ(ht(t), 0u) << "ticket of chunk row " << t << " left set, rows from " << b;
    if (states && segs > 0) {
      auto const hp = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), plans);
      for (std::size_t t = b; t < e; ++t)
        if (c.lengths[t] > split.from) {
          std::uint32_t const st =
              hp((t - b) * D::split_plan_words(segs) + D::SplitPlan::state);
          ASSERT_LT(st, 3u) << "row " << t;
          ++states->count[st];
        }
    }
  }
  auto const h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
  for (int r = 0; r < R; ++r) {
    std::vector<std::int32_t> const want = ranking(rows[r], c.topk);
    for (int j = 0; j < c.topk; ++j)
      ASSERT_EQ(h(r, j), want[j]) << "row " << r << " (" << what(r) << ", "
                                  << c.lengths[r] << " pools) column " << j
                                  << ", topk " << c.topk << ", team size " << team_size;
  }
}

// Rows of the given lengths, of the make_row kinds in turn.
template <class Key>
void check(TopkCase const& c, int team_size, std::size_t chunk_rows,
           KPool::Details::SelectSplit split, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<Key>> rows;
  for (std::size_t r = 0; r < c.lengths.size(); ++r)
    rows.push_back(make_row<Key>(rng, static_cast<int>(r % 5), c.lengths[r]));
  check_rows(rows, c.topk, team_size, chunk_rows, split,
             [](int r) { return "kind " + std::to_string(r % 5); });
}

template <class Key>
void check_all(std::uint64_t seed) {
  KPool::Details::SelectSplit const no_split;
  std::vector<int> teams = {0};
  if (!KPool::Details::KokkosExt::is_device_backend<Kokkos::DefaultExecutionSpace>::value)
    teams = {0, 1, 3};
  for (int team : teams) {
    SCOPED_TRACE("team size " + std::to_string(team));
    // Short rows (staged in scratch with device shapes), some shorter
    // than topk.
    check<Key>({{2, 5, 40, 300, 700, 1, 16, 17, 900, 650}, 16}, team, 10, no_split, seed);
    // Longer rows (read from memory), more ties than candidates.
    check<Key>({{3000, 5000, 4500, 2500, 6000, 100}, 300}, team, 6, no_split, seed + 1);
    // topk 2048: a smaller candidate buffer; topk 5000: past a device's
    // fast scratch with device shapes (the wide kernel); topk 12000: the
    // wide kernel everywhere.
    check<Key>({{5000, 2100, 2047, 4096}, 2048}, team, 4, no_split, seed + 5);
    check<Key>({{9000, 5000, 7000}, 5000}, team, 3, no_split, seed + 6);
    check<Key>({{20000, 12000, 11999, 13000}, 12000}, team, 2, no_split, seed + 7);
    // The wide kernel with split rows in the workspace: it reads them whole.
    KPool::Details::SelectSplit wide_split;
    wide_split.from = 8000;
    wide_split.segment = 4096;
    check<Key>({{20000, 13000, 7000}, 12000}, team, 3, wide_split, seed + 8);
    // Row chunks of two rows.
    check<Key>({{600, 700, 20, 800, 500}, 64}, team, 2, no_split, seed + 2);
    // Long rows split over teams (segments of 512 past 1500 pools).
    KPool::Details::SelectSplit split;
    split.from = 1500;
    split.segment = 512;
    check<Key>({{4000, 1400, 3333, 2048, 5000}, 200}, team, 5, split, seed + 3);
    check<Key>({{4000, 1400, 3333, 2048, 5000}, 200}, team, 2, split, seed + 4);
  }
}

TEST(SelectTopk, SelectsTheRankingWith32BitKeys) { check_all<std::uint32_t>(11); }

TEST(SelectTopk, SelectsTheRankingWith64BitKeys) { check_all<std::uint64_t>(23); }

void check_full_segments(int team, PlanStates& states);

// The ordered scans (the partition, the tie rule over the candidates, the
// wide kernel's columns, a split row's segments) on teams of 4 and 8
// threads: every thread's run starts past keys other threads counted, so
// an increment that read the prefix (the tie rule's, once) goes wrong
// here, as it would on a GPU, while teams of 1 and 2 hide it. ctest runs
// this test once more with OMP_NUM_THREADS=8 (tst_select_topk.many_threads),
// so that a host backend has threads for such teams.
TEST(SelectTopk, OrderedScansOnTeamsOfManyThreads) {
  using Key = std::uint32_t;
  using E = Kokkos::DefaultExecutionSpace;
  int tried = 0;
  for (int team : {4, 8}) {
    if (!KPool::Details::KokkosExt::is_device_backend<E>::value && E().concurrency() < team)
      continue;
    ++tried;
    SCOPED_TRACE("team size " + std::to_string(team));
    KPool::Details::SelectSplit const no_split;
    // Ties at the threshold among fewer keys than the candidate buffer
    // holds (kinds 1 and 2): the tie rule over the candidates.
    check<Key>({{300, 40, 700, 1000, 1025, 2000, 310, 90, 600, 800}, 16}, team, 10, no_split, 41);
    check<Key>({{3000, 5000, 2500, 4000, 900}, 300}, team, 5, no_split, 42);
    // The wide kernel everywhere.
    check<Key>({{20000, 12001, 13000}, 12000}, team, 3, no_split, 43);
    // Split rows: the segments' partitions.
    KPool::Details::SelectSplit split;
    split.from = 1500;
    split.segment = 512;
    check<Key>({{4000, 3333, 5000, 2048, 1400}, 200}, team, 5, split, 44);
    // Split over one segment and over two.
    split.from = 300;
    check<Key>({{400, 513, 900, 1000, 200}, 64}, team, 5, split, 45);
    // Segments' counts at the 16-bit segment length, merged by the team.
    PlanStates states;
    check_full_segments(team, states);
  }
  if (tried == 0)
    GTEST_SKIP() << "the host backend has " << E().concurrency()
                 << " threads: tst_select_topk.many_threads runs this with 8";
}

// Rows of scores (as the scoring writes them: score_key) that stress the
// digits and the candidate buffers: uniform over [-2, 2) as the perf
// suite's keys, one value, ties at the threshold, narrow ranges, any bits,
// -inf and NaN, sorted either way, mostly not visible, two adjacent
// values, a range of magnitudes.
constexpr int score_kinds = 12;
char const* const score_kind_names[score_kinds] = {
    "uniform [-2, 2)", "one value",  "ties at the threshold", "[1, 1.0001)",
    "[1.3, 1.3001)",   "any bits",   "-inf and NaN",          "ascending",
    "descending",      "mostly not visible", "two adjacent values", "magnitudes"};

template <class Score>
std::vector<KPool::Details::score_key_t<Score>> make_score_row(std::mt19937_64& rng,
                                                               int kind, std::size_t n) {
  using Key = KPool::Details::score_key_t<Score>;
  std::uniform_real_distribution<Score> u(Score(0), Score(1));
  Score const inf = std::numeric_limits<Score>::infinity();
  Score const nan = std::numeric_limits<Score>::quiet_NaN();
  std::vector<Score> v(n);
  for (std::size_t p = 0; p < n; ++p) {
    Score const x = u(rng);
    switch (kind) {
      case 0: v[p] = 4 * x - 2; break;
      case 1: v[p] = Score(0.5); break;
      case 2: v[p] = x < Score(1) / 64 ? Score(2) : x < Score(0.5) ? Score(1) : x - 1; break;
      case 3: v[p] = 1 + x * Score(0.0001); break;
      case 4: v[p] = Score(1.3) + x * Score(0.0001); break;
      case 5: {
        Key const bits = static_cast<Key>(rng());
        Score f;
        std::memcpy(&f, &bits, sizeof f);
        v[p] = f;
        break;
      }
      case 6: v[p] = x < Score(0.4) ? -inf : x < Score(0.6) ? nan : 2 * x - 1; break;
      case 7:
      case 8: v[p] = 4 * x - 2; break;
      case 9: v[p] = x < Score(0.9) ? nan : 2 * x - 1; break;
      case 10: v[p] = x < Score(0.5) ? Score(1) : std::nextafter(Score(1), Score(2)); break;
      default: v[p] = std::exp(Score(40) * (x - Score(0.5))); break;
    }
  }
  if (kind == 7) std::sort(v.begin(), v.end());
  if (kind == 8) std::sort(v.begin(), v.end(), [](Score a, Score b) { return a > b; });
  std::vector<Key> keys(n);
  for (std::size_t p = 0; p < n; ++p) keys[p] = KPool::Details::score_key(v[p]);
  // Mostly not visible: key 0 (a bad block) rather than NaN.
  if (kind == 9)
    for (std::size_t p = 0; p < n; ++p)
      if (keys[p] == KPool::Details::key_nan) keys[p] = 0;
  return keys;
}

template <class Score>
void check_scores(int topk, std::vector<std::size_t> const& lengths,
                  KPool::Details::SelectSplit split, std::uint64_t seed,
                  PlanStates* states = nullptr) {
  using Key = KPool::Details::score_key_t<Score>;
  std::vector<int> teams = {0};
  if (!KPool::Details::KokkosExt::is_device_backend<Kokkos::DefaultExecutionSpace>::value)
    teams = {0, 2};
  std::mt19937_64 rng(seed);
  std::vector<std::vector<Key>> rows;
  std::vector<int> kinds;
  for (int kind = 0; kind < score_kinds; ++kind)
    for (std::size_t n : lengths) {
      rows.push_back(make_score_row<Score>(rng, kind, n));
      kinds.push_back(kind);
    }
  for (int team : teams)
    check_rows(rows, topk, team, rows.size(), split,
               [&](int r) { return std::string(score_kind_names[kinds[r]]); }, states);
}

// Every kind around topk (shorter rows, topk the row length, one more),
// in rows read whole and in split rows, whose threshold bin may hold more
// keys than the candidate buffer (compacted in the row's segment
// histograms on a host).
template <class Score>
void check_score_kinds(std::uint64_t seed) {
  KPool::Details::SelectSplit const no_split;
  KPool::Details::SelectSplit split;
  split.from = 1500;
  split.segment = 512;
  check_scores<Score>(200, {1, 199, 200, 201, 3000, 20000}, no_split, seed);
  check_scores<Score>(200, {199, 200, 201, 3000, 20000}, split, seed + 1);
  check_scores<Score>(2048, {2047, 2048, 2049, 5000, 30000}, no_split, seed + 2);
  PlanStates states;
  check_scores<Score>(2048, {2048, 5000, 30000}, split, seed + 3, &states);
  // Segments of 8192 pools: a region of 2 * 2048 words a segment holds the
  // candidates of a bin with a few thousand keys, not of a row of one
  // value, which the selection launch then takes whole (`fallback`).
  KPool::Details::SelectSplit wide;
  wide.from = 10000;
  wide.segment = 8192;
  check_scores<Score>(200, {20000, 30000}, wide, seed + 4, &states);
  // Every plan a split row can have was taken: its segments partitioned
  // it around a threshold, it had no more than k nonzero keys, or it was
  // taken whole.
  namespace P = KPool::Details::SplitPlan;
  EXPECT_GT(states.count[P::threshold], 0);
  EXPECT_GT(states.count[P::all], 0);
  EXPECT_GT(states.count[P::fallback], 0);
}

TEST(SelectTopk, ScoreDistributionsWith32BitKeys) { check_score_kinds<float>(31); }

// Rows split over one segment (past `from` but not past a segment), two
// (one of them a single pool) and many, beside a row read whole, on the
// teams Options::team_size forces (the backend's largest where it has
// fewer threads) and the split launches' own (split_shape: up to 512 on a
// device): every make_row kind (ties, NaN keys, mostly not visible) and
// every score kind (ties at the threshold, -inf and NaN), against the
// ranking.
template <class Score>
void check_split_segments(std::uint64_t seed) {
  using Key = KPool::Details::score_key_t<Score>;
  KPool::Details::SelectSplit split;
  split.from = 300;
  split.segment = 512;
  std::vector<std::size_t> const lengths = {400, 513, 900, 5000, 200};
  std::mt19937_64 rng(seed);
  std::vector<std::vector<Key>> rows;
  std::vector<std::string> what;
  for (int kind = 0; kind < 5; ++kind)
    for (std::size_t n : lengths) {
      rows.push_back(make_row<Key>(rng, kind, n));
      what.push_back("kind " + std::to_string(kind));
    }
  for (int kind = 0; kind < score_kinds; ++kind)
    for (std::size_t n : lengths) {
      rows.push_back(make_score_row<Score>(rng, kind, n));
      what.push_back(score_kind_names[kind]);
    }
  PlanStates states;
  for (int team : {0, 1, 32, 512})
    for (int topk : {16, 200})
      check_rows(rows, topk, team, rows.size(), split, [&](int r) { return what[r]; },
                 &states);
  namespace P = KPool::Details::SplitPlan;
  EXPECT_GT(states.count[P::threshold], 0);
  EXPECT_GT(states.count[P::all], 0);
}

// Split rows of segments of split_segment_max pools (the most a
// segment's 16-bit suffix counts hold) whose every key is nonzero: each
// full segment's count at bin 0 reaches the segment length, and with
// every key in the top bin (one value, or distinct keys) so does each of
// its counts, which the plan's merge and a host's sum add. Beside them
// keys spread over every bin (a plan with a threshold). Plan states
// into `states`.
void check_full_segments(int team, PlanStates& states) {
  using Key = std::uint32_t;
  namespace D = KPool::Details;
  D::SelectSplit split;
  split.segment = D::split_segment_max;
  split.from = split.segment;
  std::size_t const seg = split.segment;
  Key const top_bin = Key(D::select_bins - 1) << (32 - D::select_digit_bits);
  std::mt19937_64 rng(61);
  std::vector<std::vector<Key>> rows;
  rows.push_back(std::vector<Key>(2 * seg, top_bin | 0x1234u));
  rows.push_back(std::vector<Key>(2 * seg + 1, ~Key(0) - 5));
  std::vector<Key> distinct(3 * seg), spread(2 * seg + 7);
  for (Key& k : distinct) k = top_bin | static_cast<Key>(rng() % (Key(1) << 21));
  for (Key& k : spread) k = static_cast<Key>(rng() | 1u);
  rows.push_back(distinct);
  rows.push_back(spread);
  char const* const names[] = {"one value in the top bin", "one value, a segment of one more",
                               "distinct keys in the top bin", "keys in every bin"};
  for (int topk : {64, 2048})
    check_rows(rows, topk, team, rows.size(), split, [&](int r) { return names[r]; },
               &states);
}

TEST(SelectTopk, SegmentCountsAtTheSegmentLength) {
  std::vector<int> teams = {0};
  if (!KPool::Details::KokkosExt::is_device_backend<Kokkos::DefaultExecutionSpace>::value)
    teams = {0, 1, 2};
  PlanStates states;
  for (int team : teams) {
    SCOPED_TRACE("team size " + std::to_string(team));
    check_full_segments(team, states);
  }
  namespace P = KPool::Details::SplitPlan;
  EXPECT_GT(states.count[P::threshold], 0);
  EXPECT_GT(states.count[P::fallback], 0);
  // A segment past what a 16-bit count holds is refused before any launch.
  KPool::Details::SelectSplit longer;
  longer.from = 100;
  longer.segment = KPool::Details::split_segment_max + 1;
  std::vector<std::vector<std::uint32_t>> const rows = {std::vector<std::uint32_t>(200, 7u)};
  EXPECT_THROW(check_rows(rows, 16, 0, 1, longer, [](int) { return "one value"; }),
               KPool::InvalidArgument);
}

TEST(SelectTopk, SplitRowsOverOneTwoAndManySegments) {
  check_split_segments<float>(53);
  check_split_segments<double>(59);
}

// The selection's own launches (named after the checker, "tst_select_topk::"),
// recorded through Kokkos Tools while armed.
struct LaunchLog {
  bool armed = false;
  std::vector<std::string> names;
};
LaunchLog launch_log;
void on_select_launch(char const* name, std::uint32_t, std::uint64_t*) {
  std::string const n(name);
  if (launch_log.armed && n.rfind("tst_select_topk::", 0) == 0) launch_log.names.push_back(n);
}

// A split row takes three launches: its segments' counts, whose last team
// a row makes the row's plan; the partition; the selection. No plan
// launch between the counts and the partition.
TEST(SelectTopk, ASplitRowTakesThreeLaunches) {
  KPool::Details::SelectSplit split;
  split.from = 1500;
  split.segment = 512;
  std::mt19937_64 rng(61);
  std::vector<std::vector<std::uint32_t>> const rows = {make_row<std::uint32_t>(rng, 0, 4000),
                                                        make_row<std::uint32_t>(rng, 1, 700)};
  launch_log = LaunchLog();
  launch_log.armed = true;
  Kokkos::Tools::Experimental::set_begin_parallel_for_callback(on_select_launch);
  check_rows(rows, 64, 0, rows.size(), split, [](int r) { return r == 0 ? "split" : "short"; });
  Kokkos::Tools::Experimental::set_begin_parallel_for_callback(nullptr);
  launch_log.armed = false;
  std::vector<std::string> const want = {"tst_select_topk::select_segments",
                                         "tst_select_topk::select_split_partitions",
                                         "tst_select_topk::select"};
  EXPECT_EQ(launch_log.names, want);
}

TEST(SelectTopk, ScoreDistributionsWith64BitKeys) { check_score_kinds<double>(37); }

// Every candidate-buffer boundary: the threshold bin holding exactly
// the candidate capacity, one more, and topk at the row length.
TEST(SelectTopk, BoundaryCounts) {
  using Key = std::uint32_t;
  int const cap = KPool::Details::candidate_capacity;
  for (int team : {0, 2}) {
    KPool::Details::SelectSplit const no_split;
    check<Key>({{static_cast<std::size_t>(cap), static_cast<std::size_t>(cap) + 1,
                 static_cast<std::size_t>(cap) + 2, 2 * static_cast<std::size_t>(cap)},
                cap},
               team, 4, no_split, 5);
  }
}

}  // namespace
