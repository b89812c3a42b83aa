#!/usr/bin/env python3
"""The selection's kernels on an H200, by arithmetic: two methods a case, the larger kept.

    cost_model.py                       # the table, then every assumption with its source
    cost_model.py --json                # {"cases": {NAME: {"us", "limit_us", "method", ...}}}
    cost_model.py --markdown            # docs/performance.md's table ("The cost model")
    cost_model.py --resources TSV       # a fresh cuda_kernel_resources.py report
    cost_model.py --measured REPORT     # the model against a device run's kpool_perf report
    cost_model.py --describe LINES      # limits from kpool_perf --describe --lines output

The two methods:

  - bandwidth: the bytes a case must move over the bandwidth its bytes in
    flight sustain (Little's law: in flight / latency, at most the HBM's
    sustained 4 TB/s), or its FLOPs at the rate mma.sync reaches, whichever
    is slower. It assumes every resident warp always has its tiles in
    flight: the model docs/performance.md used before issue #45.
  - latency: what each team does, one after the other (query staging, the
    chain of loads before each tile, the tile's MMA work, the fused
    kernel's claims, ticket and releases, the top-k's passes), times the
    rounds of resident teams its launch needs, plus the launches' gaps.

The launch shapes are today's, computed here by the formulas of the
launch code (each printed with the file and function it copies: a change
there must change this script). Registers come from the CUDA build's
report (kernel_resources_sm90.tsv beside this file, or --resources), and
give the resident teams an SM with the SM's register file, warp and block
limits. The H200's limits are h200_limits.py's, from the bytes and FLOPs
kpool_perf counts for the same cases (ctest cost_model checks both).

Every latency and cost below is an assumption until a device run measures
it (perf_tests/gpu/run_device.sh); --measured puts the model beside it.
"""
import csv
import json
import math
import os
import re
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
import h200_limits  # noqa: E402

ASSUMED = {}


def assume(name, value, unit, source):
    """A figure the model stands on, kept with its unit and source."""
    ASSUMED[name] = (value, unit, source)
    return value


# The H200 (SXM).
SMS = assume("sms", 132, "SMs", "H200 SXM: the GH100 of the H100 SXM, 132 SMs "
             "(../shared/design/SELECTION_ON_GPUS.md)")
CLOCK = assume("clock", 1.98e9, "Hz", "H200 boost clock (SELECTION_ON_GPUS.md)")
REGS_SM = assume("regs_sm", 65536, "registers an SM", "compute capability 9.0 "
                 "(CUDA C++ Programming Guide, 'Technical Specifications')")
REG_UNIT = assume("reg_unit", 256, "registers", "a warp's register allocation "
                  "granularity, compute capability 9.0 (CUDA occupancy calculator)")
WARPS_SM = assume("warps_sm", 64, "warps an SM", "compute capability 9.0")
BLOCKS_SM = assume("blocks_sm", 32, "blocks an SM", "compute capability 9.0")
SMEM_SM = assume("smem_sm", 228 * 1024, "bytes", "shared memory an SM, 1 KiB of it "
                 "reserved a block (compute capability 9.0)")
THREADS_SM = 2048
HBM = assume("hbm", h200_limits.MEM, "bytes/s", "sustained copy (h200_limits.py)")
LAT_HBM = assume("lat_hbm", 0.6e-6, "s", "a load from HBM under a streaming load: "
                 "Hopper's is commonly put at 0.5-0.7 us (docs/performance.md's "
                 "assumption since the key pipeline)")
LAT_SMEM = assume("lat_smem", 30 / 1.98e9, "s", "a shared-memory load's latency, about "
                  "30 cycles (Hopper); assumption")
LAT_L2 = assume("lat_l2", 0.2e-6, "s", "a load or atomic served by L2 under load "
                "(Hopper's unloaded L2 hit is about 260 cycles, 0.13 us); assumption")
RELEASE = assume("release", 0.2e-6, "s", "the release half of an atom.acq_rel.gpu by one "
                 "thread after a team barrier (KokkosExt::fetch_add_acq_rel): the team's "
                 "earlier stores reach L2 first, about one L2 round trip; assumption")
GAP = assume("launch_gap", 1.5e-6, "s", "between two kernels of a CUDA graph "
             "(SELECTION_ON_GPUS.md: ~1-2 us a graph node)")
BARRIER = assume("barrier", 0.02e-6, "s", "a team barrier of 128 threads arriving "
                 "together (about 40 cycles); assumption")
SCAN = assume("team_scan", 0.1e-6, "s", "one chunk of a Kokkos team scan of 128 "
              "values in shared memory (warp shuffles, two barriers); a team of 512's "
              "taken at the same cost (one more level of shuffles); assumption")
SMEM_BW = assume("smem_bytes_cycle", 128, "bytes a cycle an SM", "shared-memory "
                 "bandwidth: 32 banks of 4 bytes (compute capability 9.0); binds the MMA "
                 "fragments' loads (fragment_bytes)")
L2_SM = assume("l2_sm_bytes", 64, "bytes a cycle", "what one SM reads from L2 at most "
               "(the SM's L2 path, as on Ampere); binds the split plan's merge, one team "
               "reading 64 x 4 KiB of 16-bit counts; assumption")
INFLIGHT = assume("loads_in_flight", 8, "loads a thread", "independent loads a thread "
                  "keeps in flight in a strided loop (nvcc's unrolling); read the SASS "
                  "when a device is lent")
MMA_CYC = assume("mma_cycles", 16, "cycles", "one mma.sync of a warp, issued with its "
                 "four independent accumulators (Hopper's mma.sync at about half its "
                 "wgmma rate); assumption")
MMA_RATE = assume("mma_sync_fraction", 0.5, "of the tensor peak", "what mma.sync "
                  "reaches of Hopper's wgmma peak; assumption")
EPI_CYC = assume("epilogue_cycles", 300, "cycles", "a warp's relu, weight and head sum "
                 "over one 16-pool tile of 32 heads (ScoreMmaFunctor's epilogue), "
                 "counted from the code")
FOLD_SAVED = {"serving": assume("fold_saved_serving", 49, "cycles", "the epilogue's fold "
                                "(relu, weights, the lane's heads) where a group's 32 heads are "
                                "all the row's: no head checked, a lane's 2 weights an N tile "
                                "loaded once; its PTX instructions between a row's last MMA "
                                "and its head sum, 117 before, 68 now (nvcc 13, sm_90), a "
                                "cycle each off epilogue_cycles, counted"),
              "exact": assume("fold_saved_exact", 75, "cycles", "the same in the exact "
                              "profile's kernel (each product scaled by its pool's scale, "
                              "now 2 loads a lane): 161 PTX instructions before, 86 now, "
                              "counted")}
KEYS_SAVED = {"serving": assume("keys_saved_serving", 30, "cycles", "the epilogue's key "
                                "writes in the serving kernel: a group's lanes 0 and 1 each "
                                "write one of its two pools at once, where lane 0 wrote both "
                                "in turn; its PTX instructions from the head sum's first "
                                "shuffle to the next MMA, 111 before, 81 now (nvcc 13, "
                                "sm_90), a cycle each off epilogue_cycles, counted"),
              "exact": assume("keys_saved_exact", 0, "cycles", "the exact kernels still "
                              "write both pools from lane 0 (the bf16 keys' kernel has no "
                              "registers to spare under its cap)")}
CVT_CYC = {"serving": assume("cvt_serving", 12, "cycles a value", "a query value to its "
                             "E4M3 code (float_to_e4m3_bits, portable form), counted"),
           "exact": assume("cvt_exact", 12, "cycles a value", "a query value to its three "
                           "bf16 terms, one conversion each (ScoreMmaFunctor::operand_terms), "
                           "counted")}
HIST_CYC = assume("hist_count_cycles", 20, "cycles a tile", "a lane's two shared-memory "
                  "atomic adds (its two pools' first digits) in a tile's epilogue, where the "
                  "scoring builds the row's histogram (ScoreMmaFunctor::score_tile); assumption")
BANK_CYC = assume("bank_conflict_cycles", 16, "cycles", "a warp's shared-memory read "
                  "whose 32 addresses are 16 words apart: 16-way bank conflicts, a cycle "
                  "each (compute capability 9.0: 32 banks of 4 bytes)")
PREP = assume("prepare_row_head", 1.0e-6, "s", "one (row, head)'s preparation by 64 "
              "threads: rotation, amax, codes (docs/performance.md, the fused prologue)")
PREP_WARP = assume("prepare_warp_item", LAT_HBM + (7 * 40 + 150 + 4 * CVT_CYC["serving"]) / CLOCK,
                   "s", "one (row, head)'s preparation by a warp (PrepareQueriesFunctor's "
                   "launch, 4 a team of 128): its loads (an HBM round trip), 7 butterfly "
                   "stages of 2 pairs a lane (4 shared loads and stores and a warp sync, "
                   "about 40 cycles a stage), the amax over the lanes (5 shuffle steps, "
                   "about 150 cycles), 4 codes a lane; counted from the code")

# The launch code's constants (src/).
TEAM_THREADS = 128          # select_shape: a CUDA team of the recommended size
SPLIT_THREADS = 512         # split_shape: split_team_threads (KPool_SelectCall.hpp)
MMA_TILE = 16               # KPool_ScoreMmaFunctor.hpp: mma_tile_pools, a warp's tile
HEADS, DIM = 32, 128
ENTRY = DIM + 4             # an fp8 pool entry with its scale (docs/indexer.md)
TOPK = 512
BINS = 2048                 # select_bins (KPool_TopkCore.hpp)
SPLIT_FROM, SEGMENT = 1 << 16, 1 << 14  # SelectSplit (KPool_TopkCore.hpp)
COUNT_BYTES = 2             # a segment's suffix count (split_counts, KPool_TopkCore.hpp)
PREFILL_ROWS = 4            # rows a scoring team under the default scratch
SHAPES = {
    "tile_splits": "src/score/detail/KPool_ScoreLaunch.hpp: tile_splits "
                   "(concurrency()/64 teams on a device, at most a tile each)",
    "mma_warps": "src/score/detail/KPool_ScoreLaunch.hpp: the tensor-core launch "
                 "(4 warps serving, 3 exact; the fused kernel rounds 3 down to 2)",
    "rows": "src/score/detail/KPool_ScoreLaunch.hpp: tile_shape (a decode row a "
            "group; 4 prefill rows a team under the default scratch)",
    "select": "src/select/detail/KPool_SelectCall.hpp: select_shape (a team of 128 "
              "a row)",
    "split": "src/select/detail/KPool_TopkCore.hpp: SelectSplit (rows past 2^16 "
             "pools, segments of 2^14, two launches before the selection, the "
             "plan made by a row's last segment team); "
             "src/select/detail/KPool_SelectCall.hpp: split_shape (their teams: the "
             "largest power of two up to 512 the kernel allows)",
    "prepare": "src/score/detail/KPool_ScorePrepare.hpp: a warp a (row, head), 4 a team of 128",
    "ring": "src/score/detail/KPool_ScoreLaunch.hpp: launch_score_mma_kind, the deepest "
            "key ring up to 3 that fits the level-0 scratch",
    "hist": "src/score/detail/KPool_ScoreLaunch.hpp: launch_score_mma_kind (one query row "
            "a team, rows of at most 65535 pools, the 4 KiB of counts in the level-0 scratch)",
    "persistent": "src/score/detail/KPool_ScoreLaunch.hpp: persistent_teams, the "
                  "tensor-core engine's scoring launch but the fused kernel's",
}
# The tensor-core engine's register cap under its launch bounds
# (KPool_ScoreMmaFunctor.hpp: LaunchBounds<128, 3>, mma_register_cap).
MMA_REG_CAP = REGS_SM // (3 * 128) // 8 * 8
CANDIDATES = 1024           # candidate_capacity (KPool_TopkCore.hpp)


def select_scratch(pools, topk=TOPK):
    """The top-k team's level-0 scratch (select_plan, SelectFunctor::
    scratch_bytes): the histogram, shared words, 2 x topk ids and the full
    candidate buffer, and the row itself where all of it fits (the staged
    kernel), else without the row."""
    fixed = BINS * 4 + 8 * 8 + 2 * topk * 4 + CANDIDATES * 8
    return fixed + pools * 4 if row_staged(pools, topk) else fixed


def row_staged(pools, topk=TOPK):
    """Whether the top-k team stages the row in its scratch (the staged
    kernel: select_plan, SelectFunctor::select_row's stage_row_hist), so
    that its partition walks the row in shared memory, not in L2."""
    fixed = BINS * 4 + 8 * 8 + 2 * topk * 4 + CANDIDATES * 8
    return fixed + pools * 4 + 2 * 64 <= SCRATCH0
# The fused decode selection's kernel has no launch bounds: at most 255
# registers a thread (FuseScoreSelect::register_cap, KPool_TopkFused.hpp).
FUSED_REG_CAP = 255

# A case: the kpool_perf case whose bytes and FLOPs give its limit, and its shape.
CASES = {
    "decode_64x8192_serving": dict(perf="select_decode_b64_p8k/bf16/select_fused_serving",
                                   kind="decode", rows=64, pools=8192, profile="serving"),
    "decode_64x8192_exact": dict(perf="select_decode_b64_p8k/bf16/select_fused",
                                 kind="decode", rows=64, pools=8192, profile="exact"),
    # The same selection on the separate path (prepare, score, select).
    "decode_64x8192_serving_separate": dict(perf="select_decode_b64_p8k/bf16/select_serving",
                                            kind="decode", rows=64, pools=8192,
                                            profile="serving", separate=True),
    "decode_64x8192_exact_separate": dict(perf="select_decode_b64_p8k/bf16/select",
                                          kind="decode", rows=64, pools=8192, profile="exact",
                                          separate=True),
    "topk_64x8192": dict(perf="topk_b64_p8k/f32/topk", kind="topk", rows=64, pools=8192),
    "topk_1x1048576": dict(perf="topk_b1_p1m/f32/topk", kind="topk", rows=1, pools=1 << 20),
    "select_1x1048576_serving": dict(perf="select_decode_b1_p1m/bf16/select_serving",
                                     kind="long", rows=1, pools=1 << 20, profile="serving"),
    "prefill_2048x2048_serving": dict(perf="select_prefill_q2k_p2k/bf16/select_serving",
                                      kind="prefill", rows=2048, pools=2048,
                                      profile="serving"),
    "prefill_2048x2048_exact": dict(perf="select_prefill_q2k_p2k/bf16/select",
                                    kind="prefill", rows=2048, pools=2048, profile="exact"),
}
# What each kernel's name matches in the register report, by profile
# (MmaKind 2 is E4M3, the serving profile; 0 is bf16, the exact one).
KERNELS = {
    "fused/serving": r"FusedSelectFunctor<Kokkos::Cuda, KPool::Details::ScoreMmaFunctor<[^>]*\)2,",
    "fused/exact": r"FusedSelectFunctor<Kokkos::Cuda, KPool::Details::ScoreMmaFunctor<[^>]*\)0,",
    "score/serving": r"^KPool::Details::ScoreMmaFunctor<[^>]*\)2,",
    "score/exact": r"^KPool::Details::ScoreMmaFunctor<[^>]*\)0,",
    "prepare": r"^KPool::Details::PrepareQueriesFunctor<",
    "select": r"^KPool::Details::SelectFunctor<",
    "segment_hist": r"^KPool::Details::SegmentHistFunctor<",
    "segment_partition": r"^KPool::Details::SegmentPartitionFunctor<",
}


def load_resources(path):
    """{kernel: {"regs", "spills", "stack", "smem"}}: the most of each over the
    kernel's instantiations, from a cuda_kernel_resources.py report (whole,
    or trimmed to the columns kernel_resources_sm90.tsv keeps)."""
    with open(path) as f:
        rows = list(csv.DictReader((l for l in f if not l.startswith("#")), delimiter="\t"))
    out = {}
    for key, pat in KERNELS.items():
        rx = re.compile(pat)
        hits = []
        for r in rows:
            name = r["demangled"]
            m = re.search(r"ParallelFor<(KPool::Details::.*?), Kokkos::TeamPolicy", name)
            if m:
                name = m.group(1)
            if rx.search(name):
                hits.append(r)
        if not hits:
            sys.exit("cost_model: %s has no kernel matching %s" % (path, pat))
        out[key] = {"regs": max(int(r["regs"]) for r in hits),
                    "spills": max(int(r["spill_st"]) + int(r["spill_ld"]) for r in hits),
                    "stack": max(int(r["stack_frame"]) for r in hits),
                    "smem": max(int(r["smem"]) for r in hits)}
    return out


def resident(res, threads, scratch=0):
    """Teams an SM and on the GPU: the register file, warps, blocks, shared memory."""
    warps = math.ceil(threads / 32)
    per_warp = math.ceil(res["regs"] * 32 / REG_UNIT) * REG_UNIT
    by_regs = (REGS_SM // per_warp) // warps
    by_warps = WARPS_SM // warps
    by_smem = SMEM_SM // (scratch + res["smem"] + 1024)
    per_sm = max(1, min(by_regs, by_warps, by_smem, BLOCKS_SM))
    return per_sm, per_sm * SMS


def tile_splits(groups, pools, team_pools):
    target = SMS * THREADS_SM // 64
    tiles = math.ceil(pools / team_pools)
    return max(1, min(math.ceil(target / groups), tiles))


def tile_chain():
    """A tile's dependent loads: the block id (L2), then its place, scale and
    packets (HBM) (ScoreMmaFunctor's tile loop)."""
    return LAT_L2 + LAT_HBM


SCRATCH0 = 40936           # modeled_device_scratch0 (KPool_Launch.hpp): an H200's level 0, Kokkos 4.6
MAX_DEPTH = 3               # ScoreMmaFunctor::max_depth: key tiles a warp's ring holds


HIST_SCRATCH = BINS * 2      # ScoreMmaFunctor's Layout::hist: 2048 16-bit counts
HIST_MAX_POOLS = 0xFFFF      # score_hist_max_pools (KPool_Scoring.hpp)


def mma_scratch(profile, rows, warps, depth, hist=False):
    """ScoreMmaFunctor::scratch_bytes for H = 32, D = 128: places, query
    operands, weights, `depth` key tiles a warp, scales (Layout), and the
    row's first-digit counts where it builds them."""
    per_reg = 4 if profile == "serving" else 2       # E4M3 or bf16 operands a word
    terms = 1 if profile == "serving" else 3
    rw = DIM // per_reg + 4
    slots = max(2, depth)
    a16 = lambda b: (b + 15) // 16 * 16
    return (a16(warps * slots * MMA_TILE * 8) + a16(rows * terms * HEADS * rw * 4)
            + a16(rows * HEADS * 4) + a16(warps * depth * MMA_TILE * rw * 4)
            + a16(warps * slots * 2 * MMA_TILE * 4) + (HIST_SCRATCH if hist else 0) + 16)


def builds_hist(profile, rows, warps, pools):
    """Whether the scoring builds its rows' first-digit histograms
    (launch_score_mma_kind): one query row a team, rows of at most
    HIST_MAX_POOLS pools, the counts beside the rows and warps, and for
    keys taken as they are (the serving profile's), which count in the key
    ring only, a ring of 2 beside them."""
    depth = 2 if profile == "serving" else 1
    return rows == 1 and pools <= HIST_MAX_POOLS and \
        mma_scratch(profile, rows, warps, depth, True) <= SCRATCH0


def key_depth(profile, rows, warps, hist=False):
    """The key ring the launcher takes (launch_score_mma_kind): the deepest up
    to MAX_DEPTH whose scratch fits beside the rows and warps, where the
    keys are operands as they are (the serving profile's E4M3; the exact
    profile's fp8 keys become bf16 operands as staged: 1, the register
    prefetch)."""
    d = 1
    if profile == "serving":
        while d < MAX_DEPTH and mma_scratch(profile, rows, warps, d + 1, hist) <= SCRATCH0:
            d += 1
    return d


def fragment_bytes(profile):
    """Shared-memory bytes one row's products over one 16-pool tile load
    as MMA fragments (ScoreMmaFunctor::score_tile): the keys (A, 16 pools x
    DIM operands, loaded once a k-step for every head and term) and the
    query (B, HEADS x DIM operands a term, loaded for every tile). E4M3
    operands are a byte, bf16 two; the exact profile's query has 3 terms.
    Every row of a team reloads both."""
    if profile == "serving":
        return MMA_TILE * DIM + HEADS * DIM
    return MMA_TILE * DIM * 2 + 3 * HEADS * DIM * 2


def tile_compute(profile, rows):
    """A warp's MMA work on one 16-pool tile for `rows` rows: the A fragments
    are reloaded for each row (ScoreMmaFunctor's row loop)."""
    k = 32 if profile == "serving" else 16
    mmas = (HEADS // 16) * (MMA_TILE // 8) * (DIM // k) * (1 if profile == "serving" else 3)
    epilogue = EPI_CYC - FOLD_SAVED[profile] - KEYS_SAVED[profile]
    return rows * (mmas * MMA_CYC + epilogue) / CLOCK


def scoring_team(profile, rows, pools, warps, fused, groups=1, depth=1, hist=False):
    """(seconds, parts, tiles a warp) of one scoring team: `pools` pools of
    each of `groups` row groups in turn (a persistent team's share crosses
    groups), the group's queries staged once, its tiles one pipeline:
    depth 1, the next tile's loads under this one's MMA; a ring of `depth`
    (score_ring), each iteration places the tile depth - 1 ahead from the
    block ids loaded an iteration before, loads the next one's ids, copies
    the placed tile's scale and packets asynchronously, then waits for its
    own tile, issued depth - 1 iterations before, and scores it: a period
    of the MMA, of the ids' L2 read, or of a tile's whole chain and MMA
    over the depth, whichever is longest."""
    threads = 32 * warps
    if profile == "serving":
        # The prepared E4M3 bytes as they are (stage_query_codes): the
        # group's rows x heads x D bytes in 16-byte packets over the team's
        # threads, a (row, head)'s weight with its first packet, one L2
        # round trip for each INFLIGHT packets a thread.
        packets = math.ceil(rows * HEADS * DIM / 16 / threads)
        staging = math.ceil(packets / INFLIGHT) * LAT_L2
    else:
        # The prepared f32 values in 16-byte packets over the team's
        # threads (stage_queries), each value split into its bf16 terms as
        # staged: one L2 round trip for each INFLIGHT packets a thread,
        # then the conversions.
        packets = math.ceil(rows * HEADS * DIM / 4 / threads)
        staging = (math.ceil(packets / INFLIGHT) * LAT_L2
                   + packets * 4 * CVT_CYC[profile] / CLOCK)
    tiles = max(1, math.ceil(pools / (MMA_TILE * warps)))
    chain, compute = tile_chain(), tile_compute(profile, rows)
    if depth > 1:
        period = max(compute, LAT_L2, (chain + compute) / depth)
    else:
        period = max(compute, chain)  # one tile ahead: the next tile's loads under this one's MMA
    walk = chain + (tiles - 1) * period + compute
    parts = {"staging": groups * staging, "tiles": groups * walk,
             "keys": groups * (LAT_L2 + 4 * BARRIER)}
    if hist:
        # The row's counts: zeroed before the group's staging, a shared
        # atomic add a key in the tiles' epilogue, then the nonzero bins
        # added to the workspace's (global atomics, not waited for) and a
        # barrier (ScoreMmaFunctor::merge_hist), a group's part at a time.
        parts["histogram"] = groups * (tiles * HIST_CYC / CLOCK + LAT_L2 + 2 * BARRIER)
    if fused:
        # A claim, the prepared count and the ticket (atomics), the last
        # two with release and acquire (KPool_TopkFused.hpp), a group's part
        # at a time.
        parts["protocol"] = groups * (3 * LAT_L2 + 2 * RELEASE)
    return sum(parts.values()), parts, groups * tiles


def digit_search(threads=TEAM_THREADS):
    """The threshold digit (find_digit, KPool_TopkTeam.hpp): a thread a run
    of BINS / threads bins rounded up to an odd length (17 for a team of
    128, 5 for one of 512), one team scan of the runs' sums, each run walked
    twice (its sum, then from its prefix), the runs `run` words apart in
    shared memory: gcd(run, 32)-way bank conflicts, none for an odd run
    (a run of 16 was 16-way)."""
    run = math.ceil(BINS / threads) | 1
    ways = math.gcd(run, 32)
    return SCAN + 2 * run * (BANK_CYC * ways / 16) / CLOCK


def topk_row(n, threads=TEAM_THREADS, built=False):
    """One team's top-k of a row of n keys read from L2 (SelectFunctor):
    a histogram pass (or, `built` while scoring, the row's 2048 counts
    read: load_hist), the threshold search as a team scan over the bins,
    the partition (two walks of a thread's run), the threshold bin's
    refinement (a second digit)."""
    per = math.ceil(n / threads)
    if built:
        hist = math.ceil(BINS / threads / INFLIGHT) * LAT_L2 + BARRIER
    else:
        hist = math.ceil(per / INFLIGHT) * LAT_L2 + per * 4 / CLOCK
    search = digit_search(threads)
    # The row's two walks: from L2, or from the team's scratch where the
    # first pass staged the row there.
    walk = LAT_SMEM if (not built and row_staged(n)) else LAT_L2
    partition = 2 * (walk + per * 4 / CLOCK) + SCAN + 4 * BARRIER
    refine = search + LAT_L2 + 4 * BARRIER
    return hist + search + partition + refine


def split_topk(n):
    """A long row's top-k: SegmentHist (whose last team of the row, by a
    ticket, makes the row's plan) and SegmentPartition in teams of
    SPLIT_THREADS (split_shape), then the selection in a team of
    TEAM_THREADS, three launches (KPool_TopkSplit.hpp). (seconds, segments,
    {part: seconds})."""
    t = SPLIT_THREADS
    segs = math.ceil(n / SEGMENT)
    per = math.ceil(SEGMENT / t)
    # A segment's keys into the histogram, then its suffix counts: a run of
    # bins a thread (odd length), one team scan over the runs
    # (team_ordered_scan), each run walked twice.
    run = math.ceil(BINS / t) | 1
    seg_hist = (math.ceil(per / INFLIGHT) * LAT_L2 + per * 4 / CLOCK + SCAN
                + 2 * run * 4 / CLOCK + 4 * BARRIER)
    # The plan's merge (merge_suffix_counts): a 16-byte load of 8 bins a
    # segment (16-bit counts, COUNT_BYTES each), independent, INFLIGHT of
    # them in flight a thread; or the row's segments x 4 KiB over what one
    # SM reads from L2, whichever is slower. Then the bins' differences
    # (three barriers). The plan follows the row's last count in the same
    # team, after its ticket (one release-acquire add, an L2 round trip).
    loads = math.ceil(BINS / (16 // COUNT_BYTES) / t) * segs
    merge = max(math.ceil(loads / INFLIGHT) * LAT_L2,
                segs * BINS * COUNT_BYTES / (L2_SM * CLOCK)) + 3 * BARRIER
    plan = merge + digit_search(t) + math.ceil(segs / t) * SCAN
    partition = 2 * (LAT_L2 + per * 4 / CLOCK) + SCAN
    finish = digit_search() + LAT_L2
    parts = {"segment counts": seg_hist, "ticket": LAT_L2, "plan": plan,
             "partition": partition, "finish": finish, "gaps": 2 * GAP}
    return sum(parts.values()), segs, parts


def in_flight_rate(teams, warps, depth=1):
    """Bytes a second the resident warps' tiles sustain, and the bytes in flight."""
    inflight = teams * warps * depth * MMA_TILE * ENTRY
    return min(HBM, inflight / LAT_HBM), inflight


def mma_time(flops, tensor):
    return flops / (h200_limits.PEAK[tensor] * MMA_RATE) if flops else 0.0


def model(c, res, limits):
    """A case's figures: both methods, the larger kept."""
    desc = limits[c["perf"]]
    nbytes, flops, tensor = desc["bytes"], desc.get("flops", 0.0), desc.get("tensor", "")
    out = {"perf_case": c["perf"], "bytes": nbytes, "flops": flops}
    notes = []
    if c["kind"] == "topk":
        if c["pools"] > SPLIT_FROM:
            lat, segs, parts = split_topk(c["pools"])
            notes.append("%d segments of 2^14, teams of %d, three launches (%s): %s"
                         % (segs, SPLIT_THREADS, SHAPES["split"],
                            ", ".join("%s %.2f" % (k, v * 1e6) for k, v in parts.items())))
        else:
            lat = topk_row(c["pools"])
            notes.append("one team of 128 a row, %d rows at once (%s)" % (c["rows"], SHAPES["select"]))
        bw = nbytes / HBM
        out.update(latency_us=lat * 1e6, bandwidth_us=bw * 1e6)
    else:
        profile = c["profile"]
        rows = PREFILL_ROWS if c["kind"] == "prefill" else 1
        groups = c["rows"] // rows
        fused = c["kind"] == "decode" and not c.get("separate", False)
        warps = 4 if profile == "serving" else (2 if fused else 3)
        kern = dict(res[("fused/" if fused else "score/") + profile])
        # The launched kernel's registers: the engine's launch bounds cap
        # them (the report's most is the unbounded instance Kokkos' team
        # size query compiles); the fused kernel has none.
        if not fused:
            kern["regs"] = min(kern["regs"], MMA_REG_CAP)
        splits = tile_splits(groups, c["pools"], MMA_TILE * warps)
        work = groups * splits
        per_sm, at_once = resident(kern, 32 * warps)
        if True:
            # Persistent (persistent_teams): the SMs times the teams an SM
            # holds under the register cap (the engine's launch bounds; 255,
            # none, for the fused kernel), each a contiguous share of the
            # virtual teams, one round.
            per_sm = max(1, REGS_SM // ((FUSED_REG_CAP if fused else MMA_REG_CAP) * 32 * warps))
            teams = min(work, SMS * per_sm)
            at_once, rounds = teams, 1
            share = work / teams
            share_groups = min(groups, math.ceil(share / splits) + (1 if share % splits else 0))
            pools = math.ceil(share * c["pools"] / splits / share_groups)
            how = "persistent, %.1f virtual teams a team over %d row groups (%s)" % (
                share, share_groups, SHAPES["persistent"])
        hist = c["kind"] != "long" and builds_hist(profile, rows, warps, c["pools"])
        depth = key_depth(profile, rows, warps, hist)
        team, parts, tiles = scoring_team(profile, rows, pools, warps, fused, share_groups, depth,
                                          hist)
        score = rounds * team
        notes.append("%d teams of %d warps for %d virtual teams (%d row groups x %d splits: %s), "
                     "%d resident (%d an SM at %d registers), %s; a team %.2f us: %s; %d tiles a warp, "
                     "%s (%s)"
                     % (teams, warps, work, groups, splits, SHAPES["tile_splits"], at_once, per_sm,
                        kern["regs"], how, team * 1e6,
                        ", ".join("%s %.2f" % (k, v * 1e6) for k, v in parts.items()), tiles,
                        ("a key ring of %d (%d bytes of scratch a team)"
                         % (depth, mma_scratch(profile, rows, warps, depth, hist))) if depth > 1
                        else "one tile ahead in registers", SHAPES["ring"]))
        notes.append("the rows' first-digit histograms %s (%s)"
                     % ("built while scoring: the top-k reads them instead of a pass"
                        if hist else "not built while scoring: the top-k counts each row",
                        SHAPES["hist"]))
        # What goes around the scoring.
        prep_items = c["rows"] * HEADS
        prep_teams = math.ceil(prep_items / 4)
        _, prep_at_once = resident(res["prepare"], 128)
        # Its rounds of resident teams, or its bytes (the bf16 queries read,
        # the prepared values written: E4M3 bytes in the serving profile,
        # f32 in the exact one) at the HBM rate, whichever is longer.
        prep_bytes = prep_items * DIM * (2 + (1 if profile == "serving" else 4))
        prepare = max(math.ceil(prep_teams / prep_at_once) * PREP_WARP, prep_bytes / HBM)
        if fused:
            # The first wave prepares the rows; the last row's top-k runs after it.
            around = PREP + topk_row(c["pools"], built=hist)
            notes.append("fused: one launch; the teams prepare each group's queries before "
                         "scoring it (%.1f us), the team that completes a group selects its "
                         "row (%.1f us)"
                         % (PREP * 1e6, topk_row(c["pools"], built=hist) * 1e6))
        elif c["kind"] == "long":
            top, segs, _ = split_topk(c["pools"])
            around = prepare + GAP + GAP + top
            notes.append("prepare %.1f us, the split top-k %.1f us (%d segments), launch gaps"
                         % (prepare * 1e6, top * 1e6, segs))
        else:
            # Its registers (no launch bounds: KPool_TopkCore.hpp) and its
            # scratch.
            _, sel_at_once = resident(res["select"], TEAM_THREADS, select_scratch(c["pools"]))
            top = math.ceil(c["rows"] / sel_at_once) * topk_row(c["pools"], built=hist)
            around = prepare + GAP + GAP + top
            notes.append("prepare %d teams, %.1f us (%s; %.1f MB of queries read and prepared "
                         "values written); top-k %.1f us (%d rows, %d at once); "
                         "two launch gaps" % (prep_teams, prepare * 1e6, SHAPES["prepare"],
                                              prep_bytes / 1e6,
                                              top * 1e6, c["rows"], sel_at_once))
        lat = score + around
        rate, inflight = in_flight_rate(at_once, warps, depth - 1 if depth > 1 else 1)
        duty = tiles * tile_chain() / team
        # The fragments' shared-memory traffic: a (row, tile) per
        # 2 x 16 x HEADS x DIM of the case's FLOPs, at every SM's bandwidth.
        row_tiles = flops / (2 * MMA_TILE * HEADS * DIM)
        smem = row_tiles * fragment_bytes(profile) / (SMS * SMEM_BW * CLOCK)
        bw = max(nbytes / rate, mma_time(flops, tensor), smem) + (around if not fused else 0.0)
        notes.append("MMA fragments from shared memory: %.2f GB (%d bytes a row and tile), "
                     "%.1f us at %d bytes a cycle an SM"
                     % (row_tiles * fragment_bytes(profile) / 1e9, fragment_bytes(profile),
                        smem * 1e6, SMEM_BW))
        out.update(latency_us=lat * 1e6, bandwidth_us=bw * 1e6,
                   in_flight_mb=inflight / 1e6, in_flight_effective_mb=inflight * min(1.0, duty) / 1e6,
                   registers=kern["regs"], teams=teams, resident=at_once, rounds=rounds)
        notes.append("in flight: %.2f MB if every resident warp always has a tile; %.2f MB "
                     "for the %.0f%% of a team's time its warps wait on tiles"
                     % (inflight / 1e6, inflight * min(1.0, duty) / 1e6, 100 * min(1.0, duty)))
    lim, why = h200_limits.limit(desc)
    out["limit_us"] = lim * 1e6
    out["limit_from"] = why
    if out["latency_us"] >= out["bandwidth_us"]:
        out["us"], out["method"] = out["latency_us"], "latency"
    else:
        out["us"], out["method"] = out["bandwidth_us"], "bandwidth"
    out["notes"] = notes
    return out


def describe_cases():
    """The bytes and FLOPs kpool_perf counts for each case, as the table
    below holds them (ctest cost_model checks it against kpool_perf
    --describe; --describe LINES takes them from such output instead)."""
    return {c["perf"]: dict(name=c["perf"], **DESCRIBED[c["perf"]]) for c in CASES.values()}


# kpool_perf --describe (docs/performance.md, "The H200's limit, case by case").
DESCRIBED = {
    "select_decode_b64_p8k/bf16/select_fused_serving":
        {"bytes": 69902852, "flops": 4.29497e9, "tensor": "e4m3"},
    "select_decode_b64_p8k/bf16/select_fused":
        {"bytes": 69902852, "flops": 4.29497e9, "tensor": "bf16x3"},
    "select_decode_b64_p8k/bf16/select_serving":
        {"bytes": 69902852, "flops": 4.29497e9, "tensor": "e4m3"},
    "select_decode_b64_p8k/bf16/select":
        {"bytes": 69902852, "flops": 4.29497e9, "tensor": "bf16x3"},
    "select_decode_b1_p1m/bf16/select_serving":
        {"bytes": 138487948, "flops": 8.58993e9, "tensor": "e4m3"},
    "select_prefill_q2k_p2k/bf16/select_serving":
        {"bytes": 21504140, "flops": 3.00606e10, "tensor": "e4m3"},
    "select_prefill_q2k_p2k/bf16/select":
        {"bytes": 21504140, "flops": 3.00606e10, "tensor": "bf16x3"},
    "topk_b64_p8k/f32/topk": {"bytes": 2097152},
    "topk_b1_p1m/f32/topk": {"bytes": 4194304},
}


def run(res, limits):
    return {n: model(c, res, limits) for n, c in CASES.items()}


def decode_choice(cases):
    """{profile: "fused" or "separate"}: the decode selection the model finds
    faster (issue #45, item 5: a device's default decode_selection)."""
    out = {}
    for profile in ("serving", "exact"):
        fused = cases["decode_64x8192_" + profile]["us"]
        separate = cases["decode_64x8192_%s_separate" % profile]["us"]
        out[profile] = {"choice": "fused" if fused <= separate else "separate",
                        "fused_us": fused, "separate_us": separate}
    return out


def markdown(cases):
    lines = ["| case | model (us) | method | latency (us) | bandwidth (us) | H200 limit (us) "
             "| model / limit |", "| --- | ---: | --- | ---: | ---: | ---: | ---: |"]
    for n, o in cases.items():
        lines.append("| `%s` | %.1f | %s | %.1f | %.1f | %.2f | %.1f |"
                     % (n, o["us"], o["method"], o["latency_us"], o["bandwidth_us"],
                        o["limit_us"], o["us"] / o["limit_us"]))
    return "\n".join(lines)


def main(argv):
    args = list(argv)

    def take(flag):
        if flag in args:
            i = args.index(flag)
            if i + 1 >= len(args):
                sys.exit(__doc__)
            v = args[i + 1]
            del args[i:i + 2]
            return v
        return None

    resources = take("--resources") or os.path.join(here, "kernel_resources_sm90.tsv")
    measured = take("--measured")
    described = take("--describe")
    flags = {a for a in args if a.startswith("--")}
    if set(args) - flags or flags - {"--json", "--markdown"}:
        sys.exit(__doc__)
    res = load_resources(resources)
    limits = describe_cases()
    if described:
        for c in h200_limits.load(described):
            if c["name"] in limits:
                limits[c["name"]] = c
    cases = run(res, limits)
    if measured:
        got = {c["name"]: c for c in h200_limits.load(measured)}
        for o in cases.values():
            m = got.get(o["perf_case"])
            sec, how = h200_limits.measured(m) if m else (None, "not in the report")
            o["measured_us"] = None if sec is None else sec * 1e6
            o["measured_how"] = how or "no time in the report"
    if "--json" in flags:
        print(json.dumps({"cases": cases, "kernels": res, "decode_selection": decode_choice(cases),
                          "assumptions": {k: {"value": v, "unit": u, "source": s}
                                          for k, (v, u, s) in ASSUMED.items()}}, indent=1))
        return
    if "--markdown" in flags:
        print(markdown(cases))
        return
    print(markdown(cases))
    print()
    for n, o in cases.items():
        print("%s (%s): %.1f us by %s, limit %.2f us (%s)"
              % (n, o["perf_case"], o["us"], o["method"], o["limit_us"], o["limit_from"]))
        for note in o["notes"]:
            print("    " + note)
        if measured:
            if o.get("measured_us") is None:
                print("    measured: " + o["measured_how"])
            else:
                print("    measured: %.1f us (%s): the model is %.2fx the measurement"
                      % (o["measured_us"], o["measured_how"], o["us"] / o["measured_us"]))
    print()
    for profile, d in decode_choice(cases).items():
        print("decode selection, %s profile: %s (fused %.1f us, separate %.1f us)"
              % (profile, d["choice"], d["fused_us"], d["separate_us"]))
    print()
    print("kernels (%s):" % resources)
    for k, r in res.items():
        print("    %-18s %3d registers, %d spilled, %d stack" % (k, r["regs"], r["spills"], r["stack"]))
    print("assumptions:")
    for k, (v, u, s) in ASSUMED.items():
        print("    %-18s %-10g %s: %s" % (k, v, u, s))


if __name__ == "__main__":
    main(sys.argv[1:])
