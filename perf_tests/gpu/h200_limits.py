#!/usr/bin/env python3
"""Each case of a kpool_perf report against the H200's limits, one line a case.

    h200_limits.py perf_report.json

The limit of a case is the larger of its memory time and its compute time on
an H200 (SXM, 141 GB HBM3e), from these assumptions:
  - memory: 4.0 TB/s sustained (of 4.8 TB/s peak);
  - dense tensor peaks: 1979 TFLOP/s E4M3 (the serving profile's MMA), 989
    TFLOP/s bf16 (the exact profile's MMA, three bf16 terms of the rotated
    query a product); 67 TFLOP/s f32 on the CUDA cores (the tiles and
    team_gemm engines);
  - the selection reads each request's visible pools once: D + 4 bytes a
    pool of an fp8 cache (D = 128), whatever the number of query rows;
  - a case with a byte count (steps, top-k) moves exactly those bytes.
`ratio` = measured seconds / limit (1.0 is the limit; the closer, the better).
"""
import json
import re
import sys

MEM = 4.0e12
PEAK = {"e4m3": 1979e12, "bf16": 989e12, "f32": 67e12}
D = 128
ENTRY = D + 4  # an fp8 cache entry and its f32 scale


def select_limit(name, op, flops):
    m = re.search(r"select_decode_b(\d+)_p(\d+)k", name)
    if m:
        pools = int(m.group(1)) * int(m.group(2)) * 1024
    else:
        m = re.search(r"select_prefill_q(\d+)k_p(\d+)k", name)
        if not m:
            return None, ""
        pools = int(m.group(2)) * 1024
    memory = pools * ENTRY / MEM
    if op == "select_serving":
        compute, what = flops / PEAK["e4m3"], "E4M3 tensor"
    elif op in ("select", "select_tensor_cores"):
        compute, what = 3 * flops / PEAK["bf16"], "3 bf16 terms, tensor"
    else:
        compute, what = flops / PEAK["f32"], "f32 CUDA cores"
    if memory >= compute:
        return memory, f"{pools * ENTRY / 1e6:.1f} MB of cache at 4 TB/s"
    return compute, f"{flops / 1e9:.1f} GFLOP at the {what} peak"


def main(path):
    cases = json.load(open(path))["cases"]
    print("case | op | measured | H200 limit | ratio (measured / limit) | limit from")
    for c in cases:
        name, op, seconds = c["name"], c["op"], c["seconds"]
        if "flops" in c:
            limit, why = select_limit(name, op, c["flops"])
        elif c.get("bytes"):
            limit, why = c["bytes"] / MEM, f"{c['bytes'] / 1e6:.2f} MB at 4 TB/s"
        else:
            limit, why = None, ""
        if limit is None:
            print(f"{name} | {op} | {seconds * 1e6:.1f} us | - | - | no limit known")
            continue
        print(f"{name} | {op} | {seconds * 1e6:.1f} us | {limit * 1e6:.2f} us | "
              f"{seconds / limit:.1f} | {why}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
