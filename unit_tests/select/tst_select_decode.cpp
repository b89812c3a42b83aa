// The decode selection in one launch against the separate path (the
// fused kernel's prologue, its groups' words, its teams running together),
// what a 64 x 8192 decode selection launches, fences and allocates, that
// nothing waits for the host without validation, and the selection's
// launch shapes and key order (KPoolSelectScenario.hpp, as tst_select.cpp).

#include "KPoolSelectScenario.hpp"

#include <mutex>

namespace {

using namespace KPoolSelectTest;  // KPoolTest's names and SR too

template <class C>
class SelectDecode : public ::testing::Test {};
TYPED_TEST_SUITE(SelectDecode, Configs, ConfigName);

// ----------------------------------------------- decode in one launch

// A decode batch of the scenario's requests, each of next_n rows (the
// scenario has no dead or guard rows): row r's positions from its cache
// length, the first `pad[r]` entries left as padding (-1), which leaves
// the rows' positions as they were.
struct DecodeRows {
  int next_n = 1;
  std::vector<std::int32_t> positions;  // [B][next_n]
};
DecodeRows decode_rows(Scenario const& sc, int next_n, Rng& rng) {
  DecodeRows d;
  d.next_n = next_n;
  for (int r = 0; r < sc.B(); ++r) {
    int const pad = static_cast<int>(rng.below(static_cast<std::uint64_t>(next_n)));
    for (int i = 0; i < next_n; ++i)
      d.positions.push_back(
          i < pad ? -1
                  : static_cast<std::int32_t>(sc.batch.reference.cache_lengths[r]) + i);
  }
  return d;
}

// Rows whose first-digit histogram a tensor-core call built while scoring
// (check_row_histograms), over the whole run.
int& hist_rows_built() {
  static int n = 0;
  return n;
}

// After a call of one chunk whose histograms were poisoned (hist_poison)
// before it: each row's histogram in the workspace is the first-digit
// histogram of the keys the call wrote (every key but key_not_visible;
// positions never written still hold the poison ~0, no score's key), or
// still the poison where the call took no histograms (more rows a team,
// or a scoring launch that has no room for the counts: its preparation
// does not zero them either). Anything else (counts added to stale ones,
// zeros where none were built) fails.
constexpr std::uint32_t hist_poison = 0xA5A5A5A5u;
template <class T, class M>
void check_row_histograms(KPool::SelectWorkspace<T, M> const& ws, std::size_t rows) {
  using Key = typename KPool::SelectWorkspace<T, M>::key_type;
  constexpr int bins = KPool::Details::score_hist_bins;
  auto const keys = on_host(ws.keys());
  auto const hist = on_host(Kokkos::View<std::uint32_t*, M, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
      ws.row_histograms(), rows * bins));
  std::size_t const mv = ws.max_visible();
  for (std::size_t i = 0; i < rows; ++i) {
    std::vector<std::uint32_t> want(bins, 0u);
    for (std::size_t p = 0; p < mv; ++p) {
      Key const k = keys(i * mv + p);
      if (k != Key(KPool::Details::key_not_visible) && k != static_cast<Key>(~0ull))
        ++want[KPool::Details::first_digit(k)];
    }
    bool same = true, poison = true;
    std::uint64_t total = 0;
    for (int d = 0; d < bins; ++d) {
      same = same && hist(i * bins + d) == want[d];
      poison = poison && hist(i * bins + d) == hist_poison;
      total += want[d];
    }
    if (same && total > 0) ++hist_rows_built();
    if (same || poison) continue;
    for (int d = 0; d < bins; ++d)
      if (hist(i * bins + d) != want[d]) {
        ADD_FAILURE() << "row " << i << ": bin " << d << " of its histogram in the workspace "
                      << "holds " << hist(i * bins + d) << ", its keys " << want[d]
                      << " (neither built while scoring nor left untouched)";
        break;
      }
  }
}

// pool_ids (or token rows) of a decode Batch selection of the scenario.
// With `died`, the workspace first holds what a fused launch that died
// mid-way may leave (every group's words set), and reset_counters puts
// them back to zero on the call's space.
template <class E, class T, class C>
std::vector<std::int32_t> run_decode_with(Scenario const& sc, DecodeRows const& d,
                                          EngineOptions const& options, bool tokens,
                                          std::size_t ws_rows, bool died = false) {
  using M = typename E::memory_space;
  Inputs<E, T, C> in(sc);
  int const width = tokens ? KPool::select_tokens_width(sc.s.topk, sc.s.K) : sc.s.topk;
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> out("out", sc.rows, width);
  Kokkos::deep_copy(out, kSentinel);
  KPool::SelectWorkspace<T, M> ws(in.space, ws_rows, sc.max_visible, sc.s.H, sc.s.D,
                                  workspace_engine<M>(options.engine));
  // Every key poisoned with the highest key there is: a selection that read
  // a key before its scoring team wrote it would select it.
  Kokkos::deep_copy(ws.keys(), static_cast<typename KPool::SelectWorkspace<T, M>::key_type>(~0ull));
  auto const positions = positions_view<M>(d.positions, d.next_n);
  auto const batch = KPool::decode_batch(positions, sc.B());
  auto const paged = KPool::paged(in.cache, in.table);
  Kokkos::View<std::uint32_t*, M, Kokkos::MemoryTraits<Kokkos::Unmanaged>> const words(
      ws.fused_tickets(), 3 * ws_rows);
  if (died) {
    Kokkos::deep_copy(words, 5u);
    ws.reset_counters(in.space);
    auto const h = on_host(words);
    std::size_t set = 0;
    for (std::size_t i = 0; i < h.extent(0); ++i) set += h(i) != 0u;
    EXPECT_EQ(set, 0u) << "words reset_counters left set";
    if (set != 0) return {};  // the fused call would wait for them forever
  }
  auto const call = [&](Kokkos::View<T***, Kokkos::LayoutRight, M> const& q) {
    if (tokens)
      KPool::select_tokens(in.space, q, in.w, sc.s.topk, batch, paged, out, ws, options);
    else
      KPool::score_select(in.space, q, in.w, sc.s.topk, batch, paged, out, ws, options);
  };
  // First a call on other queries (zeros), then, after every prepared
  // query value is poisoned with NaN, the call itself on the same
  // workspace: a fused call prepares its own queries (its groups' words
  // back to zero after the first), and scores none before it is prepared.
  call(Kokkos::View<T***, Kokkos::LayoutRight, M>("zero q", sc.rows, sc.s.H, sc.s.D));
  using A = typename KPool::SelectWorkspace<T, M>::score_type;
  Kokkos::deep_copy(
      Kokkos::View<A*, M, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
          ws.prepared_queries(), ws_rows * static_cast<std::size_t>(sc.s.H * sc.s.D)),
      std::numeric_limits<A>::quiet_NaN());
  bool const check_hist = options.engine == KPool::ScoreEngine::tensor_cores &&
                          options.score_histograms && ws.row_histograms() != nullptr &&
                          ws_rows >= static_cast<std::size_t>(sc.rows);
  if (check_hist)
    Kokkos::deep_copy(Kokkos::View<std::uint32_t*, M, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
                          ws.row_histograms(), ws_rows * KPool::Details::score_hist_bins),
                      hist_poison);
  call(in.q);
  if (check_hist) check_row_histograms(ws, ws_rows);
  auto const after = on_host(words);
  for (std::size_t i = 0; i < after.extent(0); ++i)
    EXPECT_EQ(after(i), 0u) << "the fused call left word " << i << " of its groups' words";
  auto const h = on_host(out);
  return std::vector<std::int32_t>(h.data(), h.data() + h.size());
}

template <class E, class T>
std::vector<std::int32_t> run_decode(Scenario const& sc, DecodeRows const& d,
                                     EngineOptions const& o, bool tokens, std::size_t ws_rows,
                                     bool died = false) {
  if constexpr (!std::is_same<T, double>::value) {
    if (sc.s.fp8)
      return run_decode_with<E, T, KPool::float8_e4m3>(sc, d, o, tokens, ws_rows, died);
  }
  return run_decode_with<E, T, T>(sc, d, o, tokens, ws_rows, died);
}

// The engine's options (team_size as options_for's) with the decode
// selection `how`: the fused call's and the separate one's differ in
// nothing else.
template <class E>
EngineOptions decode_options(KPool::DecodeSelection how, KPool::ScoreEngine engine,
                             int team_size = -1) {
  EngineOptions o = options_for<E>(engine, team_size);
  o.decode_selection = how;
  return o;
}

// The engines a fused decode selection takes on E (every team engine the
// call takes: tensor_cores only where its plan takes the cache).
template <class E, class T>
std::vector<KPool::ScoreEngine> fused_engines(Shape const& s) {
  std::vector<KPool::ScoreEngine> e;
  for (KPool::ScoreEngine engine : tie_exact_engines<E>()) {
    bool const fp8 = s.fp8 && !std::is_same<T, double>::value;
    bool const mma_ok = fp8 ? KPool::Details::mma_plan<E, T, KPool::float8_e4m3>(s.rotated,
                                                                                s.serving)
                                  .usable
                            : KPool::Details::mma_plan<E, T, T>(s.rotated, s.serving).usable;
    if (engine == KPool::ScoreEngine::tensor_cores && !mma_ok) continue;
    bool const tiles_ok = fp8 ? KPool::Details::tiles_fit<E, T, KPool::float8_e4m3>(s.H, s.D)
                              : KPool::Details::tiles_fit<E, T, T>(s.H, s.D);
    if (engine == KPool::ScoreEngine::tiles && !tiles_ok) continue;
    e.push_back(engine);
  }
  return e;
}

// Decode (next_n 1) and speculative (next_n 3) batches of 1, 5 and 16
// requests, which split their rows' pools over many teams, a few and one
// (a host's splits fill 4 teams a thread); rows that see fewer pools than
// topk, none, or hundreds; native, fp8 and serving caches, 4 to 32 heads;
// workspaces of every row and of one request's rows (chunks). The fused selection (one launch) equals the separate one
// (two) bit for bit, for pool ids and token rows, on every team engine,
// and conforms to the reference; so do the tensor-core engine's default
// (automatic) and its persistent fused launch of 3 teams.
TYPED_TEST(SelectDecode, DecodeSelectionInOneLaunchIsTheTwoLaunchesBitForBit) {
  using E = typename TypeParam::execution_space;
  using T = typename TypeParam::value_type;
  bool const f64 = TypeParam::dtype == DType::f64;  // no fp8 cache serves f64
  struct Case {
    Shape s;
    int next_n, B;
  };
  std::vector<Case> cases;
  for (int next_n : {1, 3})
    for (int B : {1, 5, 16}) cases.push_back({{4, 4, 64, 16, !f64, true, 16}, next_n, B});
  cases.push_back({{2, 8, 7, 12, false, false, 5}, 3, 5});
  cases.push_back({{2, 8, 7, 12, false, false, 5}, 1, 16});
  cases.push_back({{1, 8, 128, 32, false, true, 8}, 1, 5});
  if (!f64) {
    cases.push_back({{4, 32, 128, 32, true, true, 16, true}, 1, 5});
    cases.push_back({{4, 32, 128, 32, true, true, 16, true}, 3, 1});
  }
  Rng rng(77);
  std::uint64_t seed = 700;
  int compared = 0;
  int const built_before = hist_rows_built();
  bool mma_decode = false;  // a tensor-core call of one row a request ran
  for (Case const& cs : cases) {
    Shape const& s = cs.s;
    int const next_n = cs.next_n, B = cs.B;
    std::vector<std::pair<std::uint32_t, std::uint32_t>> live;
    for (int r = 0; r < B; ++r) {
      // Row 1 sees fewer pools than topk, row 2 at most one.
      std::uint32_t const c = r == 1   ? static_cast<std::uint32_t>(s.K * (s.topk / 2))
                              : r == 2 ? 0u
                                       : static_cast<std::uint32_t>(rng.below(600));
      live.push_back({c, static_cast<std::uint32_t>(next_n)});
    }
    if (B == 1) live[0].first = 1100;  // one long row over many teams
    Scenario const sc = make_scenario(s, TypeParam::dtype, live, B, 0, ++seed);
    DecodeRows const d = decode_rows(sc, next_n, rng);
    for (KPool::ScoreEngine engine : fused_engines<E, T>(s))
      for (bool tokens : {false, true}) {
        // Token rows from a workspace of one request's rows (chunks), for
        // one batch size.
        if (tokens && B != 5) continue;
        std::size_t const ws_rows = static_cast<std::size_t>(tokens ? next_n : sc.rows);
        SCOPED_TRACE(describe(s) + " engine " + KPool::Details::engine_name(engine) +
                     " next_n " + std::to_string(next_n) + " B " + std::to_string(B) +
                     (tokens ? " tokens" : " pool ids") + " workspace rows " +
                     std::to_string(ws_rows));
        EngineOptions const fused = decode_options<E>(KPool::DecodeSelection::fused, engine);
        EngineOptions const separate = decode_options<E>(KPool::DecodeSelection::separate, engine);
        std::vector<std::int32_t> const x = run_decode<E, T>(sc, d, fused, tokens, ws_rows);
        std::vector<std::int32_t> const y = run_decode<E, T>(sc, d, separate, tokens, ws_rows);
        EXPECT_EQ(x, y);
        if (!tokens) {
          EXPECT_TRUE(conforms(sc, x));
          // The tensor-core engine's default (automatic: fused for the
          // serving profile in device shapes, separate otherwise), and its
          // persistent fused launch of 3 teams whose shares cross the 16
          // requests' groups (the default's shares, 2 a thread, cross
          // them in the run above).
          if (engine == KPool::ScoreEngine::tensor_cores) {
            EngineOptions const automatic =
                decode_options<E>(KPool::DecodeSelection::automatic, engine);
            std::vector<std::int32_t> const z =
                run_decode<E, T>(sc, d, automatic, tokens, ws_rows);
            EXPECT_EQ(z, y) << "automatic";
            if (B == 16) {
              EngineOptions persistent = fused;
              persistent.scoring_teams = 3;
              std::vector<std::int32_t> const p =
                  run_decode<E, T>(sc, d, persistent, tokens, ws_rows);
              EXPECT_EQ(p, y) << "fused, scoring_teams 3";
            }
            // Without histograms built while scoring (the top-k counts
            // every row itself), fused and separate; and one scoring team
            // (one team's counts a row, where the others merge many).
            for (EngineOptions o : {fused, separate}) {
              o.score_histograms = false;
              EXPECT_EQ((run_decode<E, T>(sc, d, o, tokens, ws_rows)), y)
                  << "score_histograms false, "
                  << (o.decode_selection == KPool::DecodeSelection::fused ? "fused" : "separate");
            }
            EngineOptions one = separate;
            one.scoring_teams = 1;
            EXPECT_EQ((run_decode<E, T>(sc, d, one, tokens, ws_rows)), y) << "scoring_teams 1";
            mma_decode = mma_decode || next_n == 1;
          }
        }
        ++compared;
      }
  }
  EXPECT_GT(compared, 20) << "too few engines took the fused call";
  // Device shapes build the rows' histograms while the tensor-core engine
  // scores one row a request (check_row_histograms found them right).
  if (KPool::Details::device_shapes<E>::value && mma_decode) {
    EXPECT_GT(hist_rows_built(), built_before) << "no call built a row's histogram";
  }
}

// Rows of one value (zero queries: every pool ties), of NaN scores, of
// -inf weights and of large scores: the fused selection is the separate
// one bit for bit, ties to the lower ids, NaN below every number.
TYPED_TEST(SelectDecode, DecodeSelectionInOneLaunchOnTiesNanAndInfinities) {
  using E = typename TypeParam::execution_space;
  using T = typename TypeParam::value_type;
  Shape const s{2, 4, 64, 8, false, false, 16};
  // Two rows a request, and one (each team then scores one row: the
  // tensor-core engine builds the rows' histograms while scoring, with
  // device shapes; the histograms are checked against the keys).
  for (int nn : {2, 1}) {
    std::vector<std::pair<std::uint32_t, std::uint32_t>> live;
    for (int r = 0; r < 6; ++r)
      live.push_back({static_cast<std::uint32_t>(100 + 37 * r), static_cast<std::uint32_t>(nn)});
    Scenario sc = make_scenario(s, TypeParam::dtype, live, 6, 0, 911);
    std::size_t const row = static_cast<std::size_t>(s.H) * s.D;
    auto q_row = [&](int t) { return sc.q.begin() + static_cast<std::ptrdiff_t>(t * row); };
    std::fill(q_row(0), q_row(nn), 0.0);  // request 0: every pool ties
    sc.q[static_cast<std::size_t>(nn) * row] =
        std::numeric_limits<double>::quiet_NaN();  // request 1's first row: NaN everywhere
    for (int h = 0; h < s.H; ++h)                  // request 2's last row: -inf weights
      sc.w[(3 * nn - 1) * s.H + h] = -std::numeric_limits<double>::infinity();
    std::fill(q_row(4 * nn - 1), q_row(4 * nn), 8192.0);  // request 3's last: large products
    Rng rng(3);
    DecodeRows const d = decode_rows(sc, nn, rng);
    for (KPool::ScoreEngine engine : fused_engines<E, T>(s)) {
      SCOPED_TRACE(std::string(KPool::Details::engine_name(engine)) + " next_n " +
                   std::to_string(nn));
      EngineOptions const fused = decode_options<E>(KPool::DecodeSelection::fused, engine);
      EngineOptions const separate = decode_options<E>(KPool::DecodeSelection::separate, engine);
      std::size_t const ws_rows = static_cast<std::size_t>(6 * nn);
      std::vector<std::int32_t> const a = run_decode<E, T>(sc, d, fused, false, ws_rows);
      std::vector<std::int32_t> const b = run_decode<E, T>(sc, d, separate, false, ws_rows);
      EXPECT_EQ(a, b);
      // The top-k counting every row itself: the same bits.
      EngineOptions counted = separate;
      counted.score_histograms = false;
      EXPECT_EQ((run_decode<E, T>(sc, d, counted, false, ws_rows)), b) << "score_histograms false";
      // Request 0 ties everywhere: its rows take the lowest ids.
      for (int t = 0; t < nn; ++t)
        for (int j = 0; j < s.topk; ++j) EXPECT_EQ(a[t * s.topk + j], j) << "row " << t;
      EXPECT_TRUE(conforms(sc, a));
    }
  }
}

// Teams that run at the same time claim a group's queries together, and
// wait for one another's: on a host backend of at least 4 threads, teams
// of 1 and 2 threads (Options::team_size) run several at once, so the
// claims, the prepared counts and the waits of the fused kernel's prologue
// race as on a GPU (CI runs it with OMP_NUM_THREADS=4:
// tst_select.fused_teams_together, which fails if skipped). Rows of 16
// heads over many teams, call after call on one workspace: the fused
// selection is the separate one bit for bit, every time.
TEST(SelectDecodeFusion, TeamsRunningTogetherPrepareTheQueriesOnce) {
  using E = Kokkos::DefaultExecutionSpace;
  if (E().concurrency() < 4)
    GTEST_SKIP() << "needs a host backend of at least 4 threads (has " << E().concurrency()
                 << ")";
  Shape const s{4, 16, 64, 16, true, true, 16};
  int compared = 0;
  // One request (one group: a host backend deals a league to its threads
  // in contiguous runs, so only a group whose teams span the threads has
  // teams of one group running together), then 6.
  for (int B : {1, 6}) {
    std::vector<std::pair<std::uint32_t, std::uint32_t>> live;
    for (int r = 0; r < B; ++r) live.push_back({static_cast<std::uint32_t>(300 + 97 * r), 2});
    live[0].first = 4000;  // a row over many teams
    Scenario const sc = make_scenario(s, DType::f32, live, B, 0, 4242 + B);
    Rng rng(5);
    DecodeRows const d = decode_rows(sc, 2, rng);
    for (int team : {1, 2})
      for (KPool::ScoreEngine engine : fused_engines<E, float>(s)) {
        SCOPED_TRACE(std::string(KPool::Details::engine_name(engine)) + " team " +
                     std::to_string(team) + " B " + std::to_string(B));
        EngineOptions const fused = decode_options<E>(KPool::DecodeSelection::fused, engine, team);
        EngineOptions const separate =
            decode_options<E>(KPool::DecodeSelection::separate, engine, team);
        std::vector<std::int32_t> const want = run_decode<E, float>(sc, d, separate, false, 12);
        EXPECT_TRUE(conforms(sc, want));
        for (int round = 0; round < 4; ++round) {
          std::vector<std::int32_t> const got = run_decode<E, float>(sc, d, fused, false, 12);
          EXPECT_EQ(got, want) << "round " << round;
        }
        ++compared;
      }
  }
  EXPECT_GE(compared, 8);
}

// A fused launch that dies mid-way can leave its groups' words set, and the
// next fused call through the workspace would wait for queries no team
// prepares: SelectWorkspace::reset_counters puts every word back to zero on
// the caller's space, after which the fused call selects what the separate
// path selects, on every engine the fused call takes.
TEST(SelectDecodeFusion, ResetCountersRecoversFromALaunchThatDied) {
  using E = Kokkos::DefaultExecutionSpace;
  Shape const s{4, 16, 64, 16, true, true, 16};
  Scenario const sc = make_scenario(s, DType::f32, {{300, 2}, {1000, 2}}, 2, 0, 77);
  Rng rng(3);
  DecodeRows const d = decode_rows(sc, 2, rng);
  int compared = 0;
  for (KPool::ScoreEngine engine : fused_engines<E, float>(s)) {
    SCOPED_TRACE(KPool::Details::engine_name(engine));
    EngineOptions const fused = decode_options<E>(KPool::DecodeSelection::fused, engine);
    EngineOptions const separate = decode_options<E>(KPool::DecodeSelection::separate, engine);
    std::vector<std::int32_t> const want = run_decode<E, float>(sc, d, separate, false, 12);
    std::vector<std::int32_t> const got =
        run_decode<E, float>(sc, d, fused, false, 12, /*died=*/true);
    EXPECT_EQ(got, want);
    ++compared;
  }
  EXPECT_GE(compared, 1);
}

// A call the fused selection does not take, asked for by name: refused
// naming options.decode_selection, nothing written; automatic takes the two
// launches instead.
TEST(SelectDecodeFusion, RefusedByNameWhereTheCallDoesNotAllowIt) {
  using E = Kokkos::DefaultExecutionSpace;
  using M = E::memory_space;
  Shape const s{4, 4, 64, 8, true, true, 16};
  std::vector<std::pair<std::uint32_t, std::uint32_t>> const live = {{40, 1}, {90, 1}};
  Scenario const sc = make_scenario(s, DType::f32, live, 2, 0, 31);
  Inputs<E, float, KPool::float8_e4m3> in(sc);
  Rng rng(4);
  DecodeRows const d = decode_rows(sc, 1, rng);
  auto const positions = positions_view<M>(d.positions, 1);
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> ids("ids", sc.rows, s.topk);
  auto const attempt = [&](KPool::SelectWorkspace<float, M>& ws, KPool::Options const& o,
                           char const* words) {
    Kokkos::deep_copy(ids, kSentinel);
    try {
      KPool::score_select(in.space, in.q, in.w, s.topk, KPool::decode_batch(positions, 2),
                          KPool::paged(in.cache, in.table), ids, ws, o);
      ADD_FAILURE() << "a fused selection the call does not allow was taken";
    } catch (KPool::InvalidArgument const& e) {
      EXPECT_EQ(e.argument(), "options");
      EXPECT_EQ(e.value(), "fused");
      EXPECT_NE(std::string(e.what()).find("decode_selection"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
    auto const h = on_host(ids);
    for (std::size_t i = 0; i < h.span(); ++i) ASSERT_EQ(h.data()[i], kSentinel);
  };
  KPool::Options o = test_options<E>();
  o.decode_selection = KPool::DecodeSelection::fused;
  {
    SCOPED_TRACE("rows longer than the split length");
    KPool::SelectWorkspace<float, M> ws(in.space, 2, (std::size_t(1) << 16) + 1, s.H, s.D);
    attempt(ws, o, "split segments");
    // automatic selects, in two launches.
    KPool::Options a = o;
    a.decode_selection = KPool::DecodeSelection::automatic;
    KPool::score_select(in.space, in.q, in.w, s.topk, KPool::decode_batch(positions, 2),
                        KPool::paged(in.cache, in.table), ids, ws, a);
    auto const h = on_host(ids);
    EXPECT_TRUE(conforms(sc, std::vector<std::int32_t>(h.data(), h.data() + h.size())));
  }
  {
    // A topk whose buffers only the wide top-k holds (device shapes: past
    // about 3900 in a device team's fast scratch; a host's level 0 holds
    // any of these).
    int const wide_topk = 5000;
    if (KPool::Details::select_plan<E, std::uint32_t, false>(wide_topk, sc.max_visible)
            .kernel == KPool::Details::SelectKernel::wide) {
      SCOPED_TRACE("the wide top-k");
      KPool::SelectWorkspace<float, M> ws(in.space, 2, sc.max_visible, s.H, s.D);
      Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> wide("wide", sc.rows, wide_topk);
      Kokkos::deep_copy(wide, kSentinel);
      try {
        KPool::score_select(in.space, in.q, in.w, wide_topk, KPool::decode_batch(positions, 2),
                            KPool::paged(in.cache, in.table), wide, ws, o);
        ADD_FAILURE() << "a fused selection of the wide top-k was taken";
      } catch (KPool::InvalidArgument const& e) {
        EXPECT_EQ(e.argument(), "options");
        EXPECT_NE(std::string(e.what()).find("wide selection"), std::string::npos) << e.what();
      }
      auto const h = on_host(wide);
      for (std::size_t i = 0; i < h.span(); ++i) ASSERT_EQ(h.data()[i], kSentinel);
    } else {
      EXPECT_FALSE(KPool::Details::device_shapes<E>::value)
          << "a device team's fast scratch held 5000 ids twice";
    }
  }
  if (KPOOL_HAS_KOKKOSKERNELS && Kokkos::SpaceAccessibility<Kokkos::HostSpace, M>::accessible) {
    SCOPED_TRACE("blas");
    KPool::SelectWorkspace<float, M> ws(in.space, 2, sc.max_visible, s.H, s.D,
                                        KPool::ScoreEngine::blas);
    attempt(ws, o, "blas");
  }
}

// Kokkos Tools events while armed: kernels begun, fences, deep copies and
// allocations.
struct LaunchEvents {
  bool armed = false;
  std::vector<std::string> kernels;
  int fences = 0, deep_copies = 0;
  std::vector<std::string> allocations;
};
LaunchEvents launch_events;
// A host backend allocates its threads' scratch from every thread at once
// (Kokkos::OpenMP grows its team-scratch pool inside a parallel region), so
// the callbacks take a lock.
std::mutex launch_events_lock;

void on_kernel(char const* name, std::uint32_t, std::uint64_t*) {
  std::lock_guard<std::mutex> const hold(launch_events_lock);
  if (launch_events.armed) launch_events.kernels.emplace_back(name);
}
void on_any_fence(char const*, std::uint32_t, std::uint64_t*) {
  std::lock_guard<std::mutex> const hold(launch_events_lock);
  if (launch_events.armed) ++launch_events.fences;
}
void on_any_copy(Kokkos::Tools::SpaceHandle, char const*, void const*, Kokkos::Tools::SpaceHandle,
                 char const*, void const*, std::uint64_t) {
  std::lock_guard<std::mutex> const hold(launch_events_lock);
  if (launch_events.armed) ++launch_events.deep_copies;
}
void on_allocation(Kokkos::Tools::SpaceHandle, char const* label, void const*, std::uint64_t) {
  std::lock_guard<std::mutex> const hold(launch_events_lock);
  if (launch_events.armed) launch_events.allocations.emplace_back(label ? label : "(no label)");
}

// A decode selection of 64 rows x 8192 pools (the serving profile's fp8
// rotated cache), validation off: fused, one kernel scores and selects
// (after the rows' and the queries' own small launches), one fewer than
// separate; once warm (a host backend grows its team-scratch pool on a
// kernel's first launch), neither fences, copies or allocates.
TEST(SelectDecodeFusion, SixtyFourRowsOf8192PoolsInOneScoringLaunch) {
  using E = Kokkos::DefaultExecutionSpace;
  using M = E::memory_space;
  using T = float;
  int const K = 4, H = 4, D = 64, topk = 64, B = 64, pools = 8192, block_pools = 64;
  int const blocks = pools / block_pools;
  E space;
  KPool::PoolCache<KPool::float8_e4m3, M> cache(space, blocks, block_pools, D, K,
                                                KPool::CacheScale::pow2, true,
                                                KPool::CacheProfile::serving);
  {
    Rng rng(8);
    auto v = Kokkos::create_mirror_view(cache.values());
    auto sc = Kokkos::create_mirror_view(cache.scales());
    for (std::size_t i = 0; i < v.span(); ++i)
      v.data()[i] = KPool::float8_e4m3::from_bits(static_cast<std::uint8_t>(rng.below(0x7E)));
    for (std::size_t i = 0; i < sc.span(); ++i) sc.data()[i] = 1.0f;
    Kokkos::deep_copy(cache.values(), v);
    Kokkos::deep_copy(cache.scales(), sc);
  }
  // Every request reads the same blocks; its one row sees all 8192 pools.
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> table("table", B, blocks);
  std::vector<std::int32_t> pos(B);
  {
    auto h = Kokkos::create_mirror_view(table);
    for (int r = 0; r < B; ++r)
      for (int j = 0; j < blocks; ++j) h(r, j) = j;
    Kokkos::deep_copy(table, h);
    for (int r = 0; r < B; ++r) pos[r] = K * pools - 1 - r % K;
  }
  auto const positions = positions_view<M>(pos, 1);
  Kokkos::View<T***, Kokkos::LayoutRight, M> q("q", B, H, D);
  Kokkos::View<float**, Kokkos::LayoutRight, M> w("w", B, H);
  {
    Rng rng(9);
    fill_uniform(rng, q, -1, 1);
    fill_uniform(rng, w, 0, 1);
  }
  KPool::SelectWorkspace<T, M> ws(space, B, pools, H, D);
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> fused_ids("fused", B, topk),
      separate_ids("separate", B, topk);
  auto const paged = KPool::paged(cache, table);
  auto const batch = KPool::decode_batch(positions, B);
  auto const select = [&](KPool::DecodeSelection how,
                          Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> const& out) {
    KPool::Options o = test_options<E>();
    o.validate = false;
    o.decode_selection = how;
    // Cold: only the backend may allocate (its scratch pool), never KPool.
    launch_events = LaunchEvents();
    launch_events.armed = true;
    KPool::score_select(space, q, w, topk, batch, paged, out, ws, o);
    launch_events.armed = false;
    Kokkos::fence();
    for (std::string const& label : launch_events.allocations)
      EXPECT_EQ(label.find("KPool"), std::string::npos) << "a cold call allocated " << label;
    launch_events = LaunchEvents();
    launch_events.armed = true;
    KPool::score_select(space, q, w, topk, batch, paged, out, ws, o);
    launch_events.armed = false;
    Kokkos::fence();
    return launch_events;
  };
  Kokkos::Tools::Experimental::set_begin_parallel_for_callback(on_kernel);
  Kokkos::Tools::Experimental::set_begin_fence_callback(on_any_fence);
  Kokkos::Tools::Experimental::set_begin_deep_copy_callback(on_any_copy);
  Kokkos::Tools::Experimental::set_allocate_data_callback(on_allocation);
  LaunchEvents const f = select(KPool::DecodeSelection::fused, fused_ids);
  LaunchEvents const p = select(KPool::DecodeSelection::separate, separate_ids);
  LaunchEvents const a = select(KPool::DecodeSelection::automatic, separate_ids);
  Kokkos::Tools::Experimental::set_begin_parallel_for_callback(nullptr);
  Kokkos::Tools::Experimental::set_begin_fence_callback(nullptr);
  Kokkos::Tools::Experimental::set_begin_deep_copy_callback(nullptr);
  Kokkos::Tools::Experimental::set_allocate_data_callback(nullptr);
  auto const joined = [](std::vector<std::string> const& v) {
    std::string s;
    for (std::string const& k : v) s += k + "; ";
    return s;
  };
  auto const count = [](std::vector<std::string> const& v, std::string const& part) {
    return std::count_if(v.begin(), v.end(), [&](std::string const& k) {
      return k.find(part) != std::string::npos;
    });
  };
  // Fused: one kernel preparing the queries, scoring and selecting (the
  // rows are read from the positions: no launch builds them).
  ASSERT_EQ(f.kernels.size(), 1u) << joined(f.kernels);
  EXPECT_EQ(count(f.kernels, "+select"), 1) << joined(f.kernels);
  // Separate: the queries, the scoring, the top-k.
  EXPECT_EQ(p.kernels.size(), 3u) << joined(p.kernels);
  EXPECT_EQ(count(p.kernels, "prepare_queries"), 1) << joined(p.kernels);
  EXPECT_EQ(count(p.kernels, "+select"), 0) << joined(p.kernels);
  // The default: separate on every backend (the cost model's choice,
  // docs/performance.md).
  EXPECT_EQ(a.kernels, p.kernels) << joined(a.kernels);
  for (LaunchEvents const* e : {&f, &p}) {
    EXPECT_EQ(e->fences, 0);
    EXPECT_EQ(e->deep_copies, 0);
    EXPECT_TRUE(e->allocations.empty()) << "allocated " << joined(e->allocations);
  }
  EXPECT_EQ(raw_bytes(fused_ids), raw_bytes(separate_ids));
  // Every row selected topk distinct pools.
  auto const h = on_host(fused_ids);
  for (int r = 0; r < B; ++r) {
    std::vector<std::int32_t> row(h.data() + r * topk, h.data() + (r + 1) * topk);
    std::sort(row.begin(), row.end());
    EXPECT_TRUE(row.front() >= 0 && row.back() < pools &&
                std::adjacent_find(row.begin(), row.end()) == row.end())
        << "row " << r;
  }
}

// ------------------------------------------------------------ host sync

// Kokkos Tools events while armed: fences and deep copies.
struct HostEvents {
  bool armed = false;
  std::vector<std::string> fences;
  int deep_copies = 0;
};
HostEvents host_events;

void on_fence(char const* name, std::uint32_t, std::uint64_t*) {
  if (host_events.armed) host_events.fences.emplace_back(name);
}
void on_deep_copy(Kokkos::Tools::SpaceHandle, char const*, void const*,
                  Kokkos::Tools::SpaceHandle, char const*, void const*, std::uint64_t) {
  if (host_events.armed) ++host_events.deep_copies;
}

// With validation off, score_select and select_tokens queue their launches
// on the caller's instance and wait for nothing (no fence, no copy), so a
// serving step and its selection overlap other streams and can be captured
// in a CUDA graph: the engines that run on every space (tiles, team_gemm, and
// register_tiles on hosts). The BLAS engine fences by design.
TEST(SelectHostSync, WithoutValidationNothingWaitsForTheHost) {
  using E = Kokkos::DefaultExecutionSpace;
  using M = E::memory_space;
  using T = float;
  Shape const s{4, 4, 64, 8, true, true, 8};
  Scenario const sc = make_scenario(s, DType::f32, mixed_batch(), 6, 2, 21);
  Inputs<E, T, KPool::float8_e4m3> in(sc);
  auto const batch = KPool::ragged_batch(in.bv.row_offsets, in.bv.cache_lengths,
                                         sc.batch.device.num_requests);
  auto const paged = KPool::paged(in.cache, in.table);
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> ids("ids", sc.rows, s.topk);
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, M> tokens(
      "tokens", sc.rows, KPool::select_tokens_width(s.topk, s.K));
  std::vector<KPool::ScoreEngine> engines =
      built_engines({KPool::ScoreEngine::tiles, KPool::ScoreEngine::team_gemm});
  if (!KPool::Details::KokkosExt::is_device_backend<E>::value)
    engines.push_back(KPool::ScoreEngine::register_tiles);
  Kokkos::deep_copy(ids, kSentinel);
  Kokkos::fence();
  Kokkos::Tools::Experimental::set_begin_fence_callback(on_fence);
  Kokkos::Tools::Experimental::set_begin_deep_copy_callback(on_deep_copy);
  for (KPool::ScoreEngine engine : engines) {
    KPool::Options o = options_for<E>(engine);
    o.validate = false;
    KPool::SelectWorkspace<T, M> ws(in.space, sc.rows, workspace_visible(sc, o), s.H, s.D, engine);
    host_events = HostEvents();
    host_events.armed = true;
    KPool::score_select(in.space, in.q, in.w, s.topk, batch, paged, ids, ws, o);
    KPool::select_tokens(in.space, in.q, in.w, s.topk, batch, paged, tokens, ws, o);
    host_events.armed = false;
    Kokkos::fence();
    EXPECT_TRUE(host_events.fences.empty())
        << KPool::Details::engine_name(engine) << " fenced: " << host_events.fences.front();
    EXPECT_EQ(host_events.deep_copies, 0) << KPool::Details::engine_name(engine);
  }
  Kokkos::Tools::Experimental::set_begin_fence_callback(nullptr);
  Kokkos::Tools::Experimental::set_begin_deep_copy_callback(nullptr);
  // The same calls did select: the rows conform.
  auto const h = on_host(ids);
  EXPECT_TRUE(conforms(sc, std::vector<std::int32_t>(h.data(), h.data() + h.size())));
}

// ------------------------------------------------- implementation details

TEST(SelectDetails, Fp8DecodeMatchesTheCacheType) {
  for (int b = 0; b < 256; ++b) {
    auto const v = KPool::float8_e4m3::from_bits(static_cast<std::uint8_t>(b));
    float const want = static_cast<float>(v);
    float const got = KPool::Details::cache_value<float>(v);
    EXPECT_EQ(KPool::Details::KokkosExt::bit_cast<std::uint32_t>(got),
              KPool::Details::KokkosExt::bit_cast<std::uint32_t>(want))
        << "code " << b;
    double const ref = SR::fp8_decode(static_cast<std::uint8_t>(b));
    if (std::isnan(ref))
      EXPECT_TRUE(std::isnan(got));
    else
      EXPECT_EQ(static_cast<double>(got), ref) << "code " << b;
  }
}

// The selection's launch: a power-of-two team (its team scans need one on
// CUDA before Kokkos 3.7) not above what Options::team_size asked, and
// level-0 scratch within what a device team has, whatever topk is: the
// buffered kernel while its buffers fit, the wide kernel (the same scratch
// for every topk) past that.
template <class F>
void expect_select_shapes(F const& f, std::size_t bytes) {
  using E = Kokkos::DefaultExecutionSpace;
  E space;
  for (int requested = 0; requested <= 70; ++requested) {
    KPool::Options o;
    o.team_size = requested;
    KPool::Details::LaunchShape const shape =
        KPool::Details::select_shape(space, f, 100, bytes, o);
    ASSERT_GE(shape.team_size, 1);
    ASSERT_EQ(shape.team_size & (shape.team_size - 1), 0)
        << "team_size " << requested << " gave " << shape.team_size;
    if (requested > 0) {
      ASSERT_LE(shape.team_size, requested);
    }
    ASSERT_EQ(shape.scratch_level, 0);
    ASSERT_EQ(shape.scratch_bytes, bytes);
  }
}

TEST(SelectDetails, SelectLaunchTakesPowerOfTwoTeamsAndLevelZeroScratch) {
  using E = Kokkos::DefaultExecutionSpace;
  using Kernel = KPool::Details::SelectKernel;
  std::size_t const wide_bytes =
      KPool::Details::SelectWideFunctor<E, std::uint32_t, true>::scratch_bytes();
  for (std::size_t max_visible : {std::size_t(8192), std::size_t(1) << 20}) {
    for (int topk : {1, 512, 2048, 12000, 1 << 20}) {
      KPool::Details::SelectPlan const plan =
          KPool::Details::select_plan<E, std::uint32_t, true>(topk, max_visible);
      SCOPED_TRACE("topk " + std::to_string(topk) + ", max_visible " +
                   std::to_string(max_visible));
      EXPECT_LE(plan.scratch_bytes, KPool::Details::device_scratch0<E>());
      EXPECT_LE(plan.scratch_bytes, KPool::Details::scratch_max<E>(0));
      if (topk >= 12000) {
        // 2 * topk ids alone are past any device's fast scratch.
        EXPECT_EQ(plan.kernel, Kernel::wide);
        EXPECT_EQ(plan.scratch_bytes, wide_bytes);
      }
      if (topk <= 2048) {
        EXPECT_NE(plan.kernel, Kernel::wide);
        EXPECT_GE(plan.cap, 128);
      }
      if (plan.kernel == Kernel::wide) {
        KPool::Details::SelectWideFunctor<E, std::uint32_t, true> f{};
        expect_select_shapes(f, plan.scratch_bytes);
      } else {
        KPool::Details::SelectFunctor<E, std::uint32_t, true, false> f{};
        expect_select_shapes(f, plan.scratch_bytes);
      }
    }
  }
}

template <class F>
void check_key_order(std::vector<F> const& values) {
  using KPool::Details::score_key;
  for (F a : values)
    for (F b : values) {
      auto const ka = score_key(a), kb = score_key(b);
      if (std::isnan(a) || std::isnan(b)) {
        if (std::isnan(a) && std::isnan(b))
          EXPECT_EQ(ka, kb);
        else
          EXPECT_EQ(ka < kb, std::isnan(a)) << a << " vs " << b;
        continue;
      }
      EXPECT_EQ(ka < kb, a < b) << a << " vs " << b;
      EXPECT_EQ(ka == kb, a == b) << a << " vs " << b;
    }
  for (F a : values) EXPECT_GT(score_key(a), 0u) << "a score must rank above a pool that is not visible";
}

TEST(SelectDetails, KeysOrderLikeScores) {
  float const inf = std::numeric_limits<float>::infinity();
  float const nan = std::numeric_limits<float>::quiet_NaN();
  check_key_order<float>({-inf, -3.5f, -1e-30f, -0.0f, 0.0f, 1e-45f, 1.0f, 2.0f,
                          std::numeric_limits<float>::max(), inf, nan, -nan});
  double const dinf = std::numeric_limits<double>::infinity();
  double const dnan = std::numeric_limits<double>::quiet_NaN();
  check_key_order<double>({-dinf, -3.5, -1e-300, -0.0, 0.0, 4.9e-324, 1.0, 2.0, dinf,
                           dnan, -dnan});
}

}  // namespace
