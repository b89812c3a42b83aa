#!/usr/bin/env python3
"""Print a kpool_perf report (perf_report.json) as an aligned table.

Usage:
    python3 perf_table.py [REPORT]              # default: perf_report.json
    python3 perf_table.py --check [REPORT]      # validate the schema; exit 1
                                                # when a field is missing or
                                                # has the wrong type
    python3 perf_table.py --sort ratio REPORT   # sort by a column
                                                # (name, op, dtype, tokens,
                                                # batch, gbps, copy_gbps,
                                                # ratio, seconds)

Standard library only.
"""

import argparse
import json
import sys

TOP_FIELDS = {
    "backend": str,
    "threads": int,
    "kokkos_version": str,
    "cases": list,
}

CASE_FIELDS = {
    "name": str,
    "op": str,
    "dtype": str,
    "tokens": int,
    "batch": int,
    "bytes": int,
    "seconds": (int, float),
    "gbps": (int, float),
    "copy_gbps": (int, float),
    "ratio": (int, float),
}

# Compute-bound cases (the selection stage) report FLOP rates and the
# bytes they must move against a same-run copy of those bytes, and, with
# Kokkos Kernels, against a same-run GEMM of their FLOPs (`ratio` is then
# gflops / gemm_gflops; without it, the copy ratio).
FLOP_CASE_FIELDS = {
    "name": str,
    "op": str,
    "dtype": str,
    "tokens": int,
    "batch": int,
    "bytes": int,
    "flops": (int, float),
    "seconds": (int, float),
    "gflops": (int, float),
    "copy_gbps": (int, float),
    "copy_ratio": (int, float),
    "ratio": (int, float),
}

# Top-k cases (the selection alone over scored keys) report their time
# against a same-run pass reading the same keys once.
TOPK_CASE_FIELDS = {
    "name": str,
    "op": str,
    "dtype": str,
    "tokens": int,
    "batch": int,
    "bytes": int,
    "seconds": (int, float),
    "keys_read_seconds": (int, float),
    "ratio": (int, float),
}

OPTIONAL_CASE_FIELDS = {
    # The device's own time: batch_calls calls back to back with one
    # fence, per call (median of batches), and on CUDA a graph of them.
    "seconds_batched": (int, float),
    "graph_seconds": (int, float),
    "batch_calls": int,
    # Compute-bound cases: their tensor work on a GPU (e4m3, bf16x3, f32).
    "tensor": str,
    "gemm_gflops": (int, float),
    "stream_read_seconds": (int, float),
    "stream_ratio": (int, float),
    "runs": int,
    "launches": int,
    "copy_bytes": int,
    "copy_seconds": (int, float),
    "seconds_min": (int, float),
    "copy_seconds_min": (int, float),
    "ring": int,
    # Pool cache ops: the same step without the cache, timed in the same
    # loop, and the median of (cached / uncached) - 1.
    "baseline_op": str,
    "baseline_seconds": (int, float),
    "overhead": (int, float),
    "gemm_flops": (int, float),
    "gemm_seconds": (int, float),
    # Cached steps (step_fused_cache_fp8*, decode_step_cache_fp8*): the path
    # the cache write took, and the rule cached <= uncached + store_pools
    # (+ 5%), all three timed in one loop: per run cached / (uncached +
    # store_pools), its median (rule_ratio), 10th and 90th percentiles, the
    # same ratio of the fastest runs, and rule_ratio <= 1.05 (rule_holds).
    "cache_path": str,
    "uncached_seconds": (int, float),
    "store_pools_op": str,
    "store_pools_seconds": (int, float),
    "rule_ratio": (int, float),
    "rule_ratio_p10": (int, float),
    "rule_ratio_p90": (int, float),
    "rule_ratio_min_times": (int, float),
    # The same from process CPU time (all threads), which a shared
    # machine's time slicing does not inflate.
    "cpu_seconds": (int, float),
    "uncached_cpu_seconds": (int, float),
    "store_pools_cpu_seconds": (int, float),
    "rule_ratio_cpu": (int, float),
    "rule_ratio_cpu_min": (int, float),
    # Sharded selections (select_ranks*): the ranks and the bytes a query
    # row sends through the exchange.
    "ranks": int,
    "exchange_bytes_per_row": int,
}

# Fields a cached step case carries together (rule_holds is a JSON boolean).
RULE_FIELDS = ("cache_path", "uncached_seconds", "store_pools_seconds",
               "rule_ratio", "rule_holds")


def is_type(value, types):
    # bool is an int in Python; a JSON true/false is never a count.
    if isinstance(value, bool):
        return False
    return isinstance(value, types)


def check(report):
    """Returns a list of problems (empty when the report is well formed)."""
    problems = []
    if not isinstance(report, dict):
        return ["top level is not a JSON object"]
    for field, types in TOP_FIELDS.items():
        if field not in report:
            problems.append("missing top-level field '%s'" % field)
        elif not is_type(report[field], types):
            problems.append("top-level field '%s' has type %s"
                            % (field, type(report[field]).__name__))
    cases = report.get("cases")
    if not isinstance(cases, list):
        return problems
    if not cases:
        problems.append("'cases' is empty")
    names = set()
    for i, case in enumerate(cases):
        where = "cases[%d]" % i
        if not isinstance(case, dict):
            problems.append("%s is not an object" % where)
            continue
        where = "cases[%d] (%s)" % (i, case.get("name", "?"))
        flop_case = "gflops" in case
        topk_case = "keys_read_seconds" in case
        required = (FLOP_CASE_FIELDS if flop_case else
                    TOPK_CASE_FIELDS if topk_case else CASE_FIELDS)
        for field, types in required.items():
            if field not in case:
                problems.append("%s: missing field '%s'" % (where, field))
            elif not is_type(case[field], types):
                problems.append("%s: field '%s' has type %s"
                                % (where, field, type(case[field]).__name__))
        for field, types in OPTIONAL_CASE_FIELDS.items():
            if field in case and not is_type(case[field], types):
                problems.append("%s: field '%s' has type %s"
                                % (where, field, type(case[field]).__name__))
        positive = (("seconds", "gflops", "copy_gbps", "ratio") if flop_case
                    else ("seconds", "keys_read_seconds", "ratio") if topk_case
                    else ("seconds", "gbps", "copy_gbps", "ratio"))
        for field in positive:
            v = case.get(field)
            if is_type(v, (int, float)) and not v > 0:
                problems.append("%s: '%s' is %r, not positive"
                                % (where, field, v))
        if any(f in case for f in RULE_FIELDS):
            for field in RULE_FIELDS:
                if field not in case:
                    problems.append("%s: missing field '%s'" % (where, field))
            holds = case.get("rule_holds")
            if "rule_holds" in case and not isinstance(holds, bool):
                problems.append("%s: field 'rule_holds' is not a boolean"
                                % where)
            elif (isinstance(holds, bool)
                  and is_type(case.get("rule_ratio"), (int, float))
                  and holds != (case["rule_ratio"] <= 1.05)):
                problems.append("%s: 'rule_holds' disagrees with 'rule_ratio'"
                                % where)
        if case.get("name") in names:
            problems.append("%s: duplicate name" % where)
        names.add(case.get("name"))
    return problems


def table(report, sort_key=None):
    cases = list(report.get("cases", []))
    if sort_key:
        reverse = sort_key in ("gbps", "copy_gbps", "gflops", "gemm_gflops",
                               "ratio", "seconds")
        cases.sort(key=lambda c: c.get(sort_key, 0), reverse=reverse)
    print("backend %s, %s threads, Kokkos %s, %d cases"
          % (report.get("backend", "?"), report.get("threads", "?"),
             report.get("kokkos_version", "?"), len(cases)))
    # Byte-bound cases give GB/s against a copy; compute-bound ones GF/s
    # against a GEMM (marked in the unit column), or without Kokkos Kernels
    # their bytes' rate against the copy. Pool cache ops also give
    # their overhead over the same step without a cache.
    header = ["name", "op", "dtype", "tokens", "batch", "rate",
              "baseline", "unit", "ratio", "ms", "overhead"]
    rows = []
    for c in cases:
        flop_case = "gflops" in c
        gemm = flop_case and "gemm_gflops" in c
        topk_case = "keys_read_seconds" in c
        overhead = ""
        if "overhead" in c:
            overhead = "%+.1f%% over %s" % (100.0 * c["overhead"],
                                            c.get("baseline_op", "?"))
        if "stream_read_seconds" in c:
            overhead = "streamed read %.4f ms, ratio %.2f" % (
                1e3 * c["stream_read_seconds"], c.get("stream_ratio", 0.0))
        if "rule_ratio" in c:
            overhead += "; %s, rule %.3f %s" % (
                c.get("cache_path", "?"), c["rule_ratio"],
                "holds" if c.get("rule_holds") else "FAILS")
        rows.append([
            str(c.get("name", "")),
            str(c.get("op", "")),
            str(c.get("dtype", "")),
            str(c.get("tokens", "")),
            str(c.get("batch", "")),
            "%.4f" % (1e3 * c.get("seconds", 0.0)) if topk_case else
            "%.2f" % c.get("gflops" if flop_case else "gbps", 0.0),
            "%.4f" % (1e3 * c.get("keys_read_seconds", 0.0)) if topk_case else
            "%.2f" % c.get("gemm_gflops" if gemm else "copy_gbps", 0.0),
            "ms vs keys read" if topk_case else
            "GF/s vs gemm" if gemm else
            "GF/s; GB/s vs copy" if flop_case else "GB/s vs copy",
            "%.2f" % c.get("ratio", 0.0),
            "%.4f" % (1e3 * c.get("seconds", 0.0)),
            overhead,
        ])
    widths = [max([len(header[i])] + [len(r[i]) for r in rows])
              for i in range(len(header))]
    left = {0, 1, 2, 7}

    def fmt(cells):
        return "  ".join(cell.ljust(widths[i]) if i in left
                         else cell.rjust(widths[i])
                         for i, cell in enumerate(cells)).rstrip()

    print(fmt(header))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print(fmt(r))


def main(argv):
    parser = argparse.ArgumentParser(
        description="Print or check a kpool_perf report.")
    parser.add_argument("report", nargs="?", default="perf_report.json")
    parser.add_argument("--check", action="store_true",
                        help="validate the schema; exit 1 on a problem")
    parser.add_argument("--sort", default=None,
                        choices=["name", "op", "dtype", "tokens", "batch",
                                 "gbps", "copy_gbps", "gflops", "gemm_gflops",
                                 "ratio", "seconds"])
    args = parser.parse_args(argv)
    try:
        with open(args.report) as f:
            report = json.load(f)
    except (OSError, ValueError) as e:
        print("perf_table.py: cannot read %s: %s" % (args.report, e),
              file=sys.stderr)
        return 1
    if args.check:
        problems = check(report)
        for p in problems:
            print("perf_table.py: %s: %s" % (args.report, p), file=sys.stderr)
        if problems:
            return 1
        print("perf_table.py: %s: %d cases, schema OK"
              % (args.report, len(report["cases"])))
        return 0
    table(report, args.sort)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
