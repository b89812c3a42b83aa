#!/usr/bin/env python3
"""Each case of a kpool_perf report against the H200's limits, one line a case.

    h200_limits.py REPORT            # perf_report.json, or --lines JSON lines
    h200_limits.py --json REPORT     # {"cases": {NAME: {"limit_us", "from", ...}}}

A case's limit comes from what the case itself says it moves, never from
its name: `bytes` (the least traffic its op needs, counted by kpool_perf
from the batch: for a selection, each request's visible pools read once,
an fp8 entry of D + 4 bytes, plus the queries, weights, ids and index
arrays) and, for a compute-bound case, `flops` and `tensor` (the kind of
work on a GPU). The limit is the larger of

  - memory: bytes / 4.0 TB/s (sustained, of the H200's 4.8 TB/s peak);
  - compute: flops at the peak of its kind: "e4m3" 1979 TFLOP/s (the
    serving profile's E4M3 MMA), "bf16x3" three bf16 MMAs a FLOP at 989
    TFLOP/s (the exact profile: three bf16 terms of the rotated query),
    "f32" 67 TFLOP/s on the CUDA cores (the other engines).

These are the limits docs/performance.md's GPU figures are set against.
The measured time is the device's own where the report has it: a
CUDA graph's per-call time, else the per-call time of a batch of calls
with one fence, else the fenced per-call time. `ratio` = measured / limit
(1.0 is the limit; the closer, the better).
"""
import json
import sys

MEM = 4.0e12  # bytes a second, sustained
PEAK = {"e4m3": 1979e12, "bf16x3": 989e12 / 3.0, "f32": 67e12}
PEAK_WHAT = {"e4m3": "E4M3 tensor", "bf16x3": "3 bf16 terms, tensor",
             "f32": "f32 CUDA cores"}


def limit(case):
    """(seconds, why) of a case's H200 limit, or (None, why)."""
    nbytes = case.get("bytes", 0)
    flops = case.get("flops", 0.0)
    tensor = case.get("tensor", "")
    if not nbytes and not flops:
        return None, "no bytes or FLOPs in the case"
    memory = nbytes / MEM
    compute = flops / PEAK[tensor] if flops and tensor in PEAK else 0.0
    if memory >= compute:
        return memory, "%.1f MB at 4 TB/s" % (nbytes / 1e6)
    return compute, "%.2f GFLOP at the %s peak" % (flops / 1e9, PEAK_WHAT[tensor])


def measured(case):
    """(seconds, how) the device took for one call, the best figure there is."""
    for field, how in (("graph_seconds", "graph"), ("seconds_batched", "batched"),
                       ("seconds", "fenced")):
        if case.get(field, 0) > 0:
            return case[field], how
    return None, ""


def load(path):
    """The cases of a report: a perf_report.json, or kpool_perf --lines output
    (a header line, then a case a line; a run cut short keeps its lines)."""
    with open(path) as f:
        text = f.read()
    try:
        return json.loads(text)["cases"]
    except (ValueError, KeyError):
        cases = []
        for line in text.splitlines():
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                continue  # a line cut short by a kill
            if "name" in obj:
                cases.append(obj)
        return cases


def main(argv):
    as_json = "--json" in argv
    paths = [a for a in argv if a != "--json"]
    if len(paths) != 1:
        sys.exit(__doc__)
    cases = load(paths[0])
    out = {}
    if not as_json:
        print("case | measured | how | H200 limit | ratio (measured / limit) | limit from")
    for c in cases:
        lim, why = limit(c)
        got, how = measured(c)
        out[c["name"]] = {"limit_us": None if lim is None else lim * 1e6, "from": why,
                          "us": None if got is None else got * 1e6, "how": how}
        if as_json:
            continue
        if lim is None:
            print(f"{c['name']} | - | - | - | - | {why}")
        elif got is None:
            print(f"{c['name']} | - | - | {lim * 1e6:.2f} us | - | {why}")
        else:
            print(f"{c['name']} | {got * 1e6:.1f} us | {how} | {lim * 1e6:.2f} us | "
                  f"{got / lim:.1f} | {why}")
    if as_json:
        print(json.dumps({"cases": out}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
