#!/usr/bin/env python3
"""ctest h200_limits (label unit): h200_limits.py's limits, from the bytes
and FLOPs kpool_perf itself describes for tier 1's cases (kpool_perf
--describe, nothing run), against docs/performance.md's table "The H200's
limit, case by case" and the two figures the design is held to: the decode
selection of 64 rows x 8192 pools in the serving profile at 17.3 us (its
cache read at 4 TB/s), one row of 2^20 pools at about 35 us.

    test_h200_limits.py KPOOL_PERF REPO
"""
import os
import re
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
import h200_limits  # noqa: E402


def fail(msg):
    print("h200_limits test: FAILED: " + msg)
    sys.exit(1)


def main(kpool_perf, repo):
    cases = [l.strip() for l in open(os.path.join(here, "tier1_cases.txt"))
             if l.strip() and not l.startswith("#")]
    with tempfile.TemporaryDirectory() as tmp:
        lines = os.path.join(tmp, "cases.jsonl")
        subprocess.run([kpool_perf, "--describe", "--cases", ",".join(cases),
                        "--lines", lines, "--out", os.path.join(tmp, "report.json")],
                       check=True, stdout=subprocess.DEVNULL, cwd=tmp)
        described = {c["name"]: c for c in h200_limits.load(lines)}
        # A run killed mid-line: the last line cut short is left out, the
        # others stay.
        cut = os.path.join(tmp, "cut.jsonl")
        text = open(lines).read()
        with open(cut, "w") as f:
            f.write(text[: len(text) - 20])
        if len(h200_limits.load(cut)) != len(described) - 1:
            fail("a line cut short is not left out alone")
    missing = [c for c in cases if c not in described]
    if missing:
        fail("kpool_perf does not describe " + ", ".join(missing))
    limits = {n: h200_limits.limit(c)[0] * 1e6 for n, c in described.items()}

    # The figures the design is held to (issue #45, docs/performance.md).
    serving = limits["select_decode_b64_p8k/bf16/select_fused_serving"]
    if abs(serving - 17.3) > 0.02 * 17.3:
        fail("decode 64 x 8192 serving: %.2f us, not 17.3 us" % serving)
    long_row = limits["select_decode_b1_p1m/bf16/select_serving"]
    if abs(long_row - 35.0) > 0.05 * 35.0:
        fail("one row of 2^20 pools: %.2f us, not about 35 us" % long_row)

    # docs/performance.md's table, row by row.
    doc = open(os.path.join(repo, "docs", "performance.md")).read()
    section = doc.split("### The H200's limit, case by case", 1)
    if len(section) != 2:
        fail("docs/performance.md has no section \"The H200's limit, case by case\"")
    rows = re.findall(r"^\| `([^`]+)` \| ([0-9,]+) \| ([0-9.e+]+|-) \| ([0-9.]+) \|",
                      section[1], re.M)
    seen = set()
    for name, nbytes, _flops, limit_us in rows:
        if name not in described:
            fail("docs/performance.md lists %s, which is not a tier-1 case" % name)
        if int(nbytes.replace(",", "")) != described[name]["bytes"]:
            fail("%s: docs/performance.md says %s bytes, kpool_perf %d"
                 % (name, nbytes, described[name]["bytes"]))
        if abs(float(limit_us) - limits[name]) > 0.01 + 0.005 * limits[name]:
            fail("%s: docs/performance.md says %s us, h200_limits.py %.2f us"
                 % (name, limit_us, limits[name]))
        seen.add(name)
    if seen != set(cases):
        fail("docs/performance.md's table lacks " + ", ".join(sorted(set(cases) - seen)))
    for n in cases:
        print("%-50s %8.2f us  (%s)" % (n, limits[n], h200_limits.limit(described[n])[1]))
    print("h200_limits test: OK")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
