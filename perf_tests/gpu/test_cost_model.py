#!/usr/bin/env python3
"""ctest cost_model (label unit): perf_tests/gpu/cost_model.py keeps working.

- the bytes and FLOPs it holds for each case are those kpool_perf
  --describe counts now, and its limits are h200_limits.py's;
- --json gives every case issue #45 names, each with us, limit_us and
  method, the larger of its two methods;
- docs/performance.md's table is the script's --markdown output, and the
  decode selection docs/performance.md names is the model's choice;
- --measured puts a device run's report beside the model;
- a register report without a kernel the model needs is refused by name.

    test_cost_model.py KPOOL_PERF REPO
"""
import json
import os
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
import cost_model  # noqa: E402
import h200_limits  # noqa: E402

SCRIPT = os.path.join(here, "cost_model.py")
NAMES = ["decode_64x8192_serving", "decode_64x8192_exact", "topk_64x8192", "topk_1x1048576",
         "prefill_2048x2048_serving", "prefill_2048x2048_exact"]


def fail(msg):
    print("cost_model test: FAILED: " + msg)
    sys.exit(1)


def run(*args):
    return subprocess.run([sys.executable, SCRIPT] + list(args), capture_output=True,
                          text=True)


def main(kpool_perf, repo):
    perf = sorted(c["perf"] for c in cost_model.CASES.values())
    with tempfile.TemporaryDirectory() as tmp:
        lines = os.path.join(tmp, "cases.jsonl")
        subprocess.run([kpool_perf, "--describe", "--cases", ",".join(perf), "--lines", lines,
                        "--out", os.path.join(tmp, "report.json")],
                       check=True, stdout=subprocess.DEVNULL, cwd=tmp)
        described = {c["name"]: c for c in h200_limits.load(lines)}
        for name in perf:
            if name not in described:
                fail("kpool_perf does not describe " + name)
            held = cost_model.DESCRIBED[name]
            got = described[name]
            for field in ("bytes", "flops", "tensor"):
                a, b = held.get(field), got.get(field)
                same = a == b if field != "flops" or a is None or b is None \
                    else abs(a - b) <= 1e-5 * b
                if not same:
                    fail("%s: cost_model.py holds %s = %s, kpool_perf --describe %s"
                         % (name, field, a, b))

        out = run("--json", "--describe", lines)
        if out.returncode != 0:
            fail("--json: " + out.stderr)
        cases = json.loads(out.stdout)["cases"]
        for n in NAMES:
            if n not in cases:
                fail("--json has no case " + n)
        for n, c in cases.items():
            for field in ("us", "limit_us", "method"):
                if field not in c:
                    fail("%s has no %s" % (n, field))
            if not c["us"] > 0 or not c["limit_us"] > 0:
                fail("%s: us %s, limit_us %s" % (n, c["us"], c["limit_us"]))
            if c["us"] != max(c["latency_us"], c["bandwidth_us"]):
                fail("%s: %s us is not the larger of its methods" % (n, c["us"]))
            if c["method"] != ("latency" if c["latency_us"] >= c["bandwidth_us"] else "bandwidth"):
                fail("%s: method %s" % (n, c["method"]))
            lim = h200_limits.limit(described[c["perf_case"]])[0] * 1e6
            if abs(lim - c["limit_us"]) > 1e-9 * lim:
                fail("%s: limit %.3f us, h200_limits.py %.3f us" % (n, c["limit_us"], lim))
            # A model faster than the limit would be a model that is wrong.
            if c["us"] < c["limit_us"] * 0.999:
                fail("%s: the model's %.2f us is under the limit %.2f us"
                     % (n, c["us"], c["limit_us"]))

        # docs/performance.md: the script's table, and its choice.
        doc = open(os.path.join(repo, "docs", "performance.md")).read()
        table = run("--markdown").stdout.strip()
        if table not in doc:
            fail("docs/performance.md does not hold cost_model.py --markdown's table "
                 "(rerun it and paste the table under \"cost_model.py\")")
        choice = cost_model.decode_choice(cost_model.run(
            cost_model.load_resources(os.path.join(here, "kernel_resources_sm90.tsv")),
            cost_model.describe_cases()))["serving"]["choice"]
        if ("The model's decode selection: `%s`" % choice) not in doc:
            fail("docs/performance.md does not name the model's decode selection, " + choice)

        # A device run's report: the model beside it.
        report = os.path.join(tmp, "device.jsonl")
        with open(report, "w") as f:
            f.write(json.dumps({"backend": "Cuda"}) + "\n")
            f.write(json.dumps({"name": "topk_b64_p8k/f32/topk", "seconds": 9e-6,
                                "seconds_batched": 4e-6}) + "\n")
        out = run("--measured", report)
        if out.returncode != 0:
            fail("--measured: " + out.stderr)
        if "measured: 4.0 us (batched)" not in out.stdout:
            fail("--measured does not show the batched figure:\n" + out.stdout)
        if "measured: not in the report" not in out.stdout:
            fail("--measured does not say which cases the report lacks")

        # A register report without the fused kernel: refused by name.
        partial = os.path.join(tmp, "partial.tsv")
        with open(os.path.join(here, "kernel_resources_sm90.tsv")) as src, \
                open(partial, "w") as dst:
            dst.writelines(l for l in src if "FusedSelectFunctor" not in l)
        out = run("--resources", partial)
        if out.returncode == 0 or "FusedSelectFunctor" not in out.stderr + out.stdout:
            fail("a report without the fused kernel was not refused by name")
    for n in cases:
        c = cases[n]
        print("%-34s %7.1f us by %-9s (limit %6.2f us)" % (n, c["us"], c["method"], c["limit_us"]))
    print("cost_model test: OK")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
