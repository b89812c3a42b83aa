#!/usr/bin/env python3
"""ctest kpool_perf_killed (label unit): a kpool_perf run killed midway
keeps the JSON lines of the cases that finished (--lines) and their
summary lines (--summary): it runs kpool_perf --quick, waits for two cases
to finish, kills it with SIGKILL, and reads back every line.

    test_report_survives.py KPOOL_PERF
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time


def main(kpool_perf):
    with tempfile.TemporaryDirectory() as tmp:
        lines = os.path.join(tmp, "cases.jsonl")
        summary = os.path.join(tmp, "summary.txt")
        report = os.path.join(tmp, "report.json")
        p = subprocess.Popen([kpool_perf, "--quick", "--lines", lines, "--summary", summary,
                              "--out", report], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, cwd=tmp)
        deadline = time.time() + 240
        cases = []
        while time.time() < deadline and p.poll() is None:
            time.sleep(0.05)
            if os.path.exists(lines):
                cases = [l for l in open(lines).read().split("\n")[:-1] if '"name"' in l]
                if len(cases) >= 2:
                    break
        if p.poll() is not None:
            print("kpool_perf ended (exit %s) before two cases were in; nothing to test"
                  % p.returncode)
            return 1
        p.send_signal(signal.SIGKILL)
        p.wait()
        if os.path.exists(report):
            print("the killed run wrote its end-of-run report: the test killed nothing")
            return 1
        text = open(lines).read()
        whole = text.split("\n")[:-1]  # what ended with a newline
        objs = [json.loads(l) for l in whole]
        if "backend" not in objs[0] or "fence_seconds" not in objs[0]:
            print("the first line is not the run's header: " + whole[0])
            return 1
        finished = [o for o in objs if "name" in o]
        if len(finished) < 2 or any("seconds" not in o for o in finished):
            print("fewer than two whole case lines survived")
            return 1
        said = open(summary).read().split("\n")[:-1]
        if len(said) < len(finished) or not all(
                s.startswith(o["name"] + ":") for s, o in zip(said, finished)):
            print("the summary lines do not match the cases")
            return 1
        print("kpool_perf killed after %d cases: %d JSON lines and %d summary lines kept"
              % (len(finished), len(finished), len(said)))
        return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
