#!/usr/bin/env bash
# The CUDA check, run on a GPU machine in one go: the unit suite (with the
# tensor-core engine's own tests, tst_score_mma, and the engine in every
# tst_select scenario; tst_device_bits compares the hardware E4M3
# conversion with KPool's on all 2^32 floats), the CUDA graph capture check (kpool_graph_capture:
# two steps, then a selection) and the perf suite on the GPU, the perf
# cases recorded against the H200's limits (h200_targets.txt), and the
# same pooling timed as PyTorch eager operations; logs, perf_report.json
# and torch_pooling.json land in OUT.
#
# Two ways to get the programs there:
#   PREBUILT=DIR     programs built elsewhere with nvcc (stage_binaries.sh
#                    copies them into DIR): nothing is compiled here, which
#                    suits a machine without GoogleTest.
#   KOKKOS_CUDA=DIR  a CUDA-enabled Kokkos install (HOPPER90 for an H200):
#                    KPool is configured and built here (BUILD_DIR, default
#                    <repo>/build-cuda). This script never builds Kokkos.
#   KOKKOSKERNELS_CUDA=DIR  (with KOKKOS_CUDA, optional) a Kokkos Kernels
#                    built against that Kokkos: the selection stage and its
#                    tests and perf cases need it.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${OUT:-$repo/device-out}
mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
export OMP_PROC_BIND=false
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  nvcc --version 2>&1 | tail -n 2
} >"$out/env.txt"

if [ -n "${PREBUILT:-}" ]; then
  bin=$(cd "$PREBUILT" && pwd)
  tests=$(ls "$bin"/tst_* 2>/dev/null)
  perf=$bin/kpool_perf
  capture=$bin/kpool_graph_capture
else
  : "${KOKKOS_CUDA:?set PREBUILT to staged programs or KOKKOS_CUDA to a CUDA Kokkos}"
  grep -h 'define KOKKOS_VERSION ' "$KOKKOS_CUDA"/include/KokkosCore_config.h >>"$out/env.txt"
  build=${BUILD_DIR:-$repo/build-cuda}
  kernels=()
  if [ -n "${KOKKOSKERNELS_CUDA:-}" ]; then kernels=(-DKokkosKernels_ROOT="$KOKKOSKERNELS_CUDA"); fi
  if [ ! -f "$build/CMakeCache.txt" ]; then
    cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release \
      -DKokkos_ROOT="$KOKKOS_CUDA" -DCMAKE_CXX_COMPILER="$KOKKOS_CUDA/bin/nvcc_wrapper" \
      ${kernels[@]+"${kernels[@]}"} >"$out/configure.log" 2>&1 || { echo "configure failed"; tail -n 30 "$out/configure.log"; exit 1; }
  fi
  cmake --build "$build" -j "$(nproc)" >"$out/build.log" 2>&1 ||
    { echo "build failed"; grep -m 20 -A 5 error "$out/build.log"; exit 1; }
  tests=$(ls "$build"/unit_tests/tst_* 2>/dev/null | grep -v '\.cmake$')
  perf=$build/perf_tests/kpool_perf
  capture=$build/perf_tests/kpool_graph_capture
fi

# Unit suite: every test binary in full (each is a GoogleTest program).
pass=0; fail=0
for t in $tests; do
  if "$t" >"$out/unit_$(basename "$t").log" 2>&1; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
done
grep -h -E '^\[  (PASSED|FAILED) ' "$out"/unit_*.log >"$out/unit_summary.txt" 2>/dev/null
echo "unit: $pass programs passed, $fail failed"
cat "$out/unit_summary.txt"
# The hardware E4M3 conversion against KPool's on all 2^32 floats: its
# verdict decides whether KPool_ENABLE_HW_E4M3 may be turned on.
grep -h -E 'HardwareE4M3|hardware E4M3|first differing' "$out"/unit_tst_device_bits.log 2>/dev/null

# Two steps captured into a CUDA graph and replayed give the eager bits.
if [ -x "$capture" ]; then
  "$capture" >"$out/graph_capture.log" 2>&1
  echo "graph capture: exit $? $(tail -n 1 "$out/graph_capture.log")"
else
  echo "graph capture: $capture missing"
fi

"$perf" --out "$out/perf_report.json" >"$out/perf.log" 2>&1
echo "perf: exit $?"
python3 "$repo/perf_tests/perf_table.py" "$out/perf_report.json" >"$out/perf_table.txt" 2>&1
grep -E 'prefill_b1_64k/bf16|decode_b256|mixed_64c|select_' "$out/perf_table.txt"

# The selection and cached-step cases against the H200's limits
# (docs/indexer.md, "The tensor-core engine"): decode scoring + top-k of
# 64 x 8192 pools <= 40 us; prefill 2048 x 2048 >= 30% of the dense bf16
# tensor peak (990 TFLOP/s), counting the three bf16 query terms the
# exact profile multiplies; the step writing the fp8 cache >= 0.75 of the
# same-run copy bandwidth.
python3 - "$out/perf_report.json" >"$out/h200_targets.txt" 2>&1 <<'PY'
import json, sys
cases = json.load(open(sys.argv[1]))["cases"]
def find(name, op):
    return [c for c in cases if c["name"].startswith(name) and c["op"] == op]
for op in ("select", "select_tensor_cores", "select_team_gemm"):
    for c in find("select_decode_b64_p8k", op):
        us = c["seconds"] * 1e6
        print(f"decode 64 x 8192 {op}: {us:.1f} us (target <= 40: {'met' if us <= 40 else 'NOT met'})")
    for c in find("select_prefill_q2k_p2k", op):
        terms = 3 if op != "select_team_gemm" else 1
        tflops = terms * c["flops"] / c["seconds"] / 1e12
        share = tflops / 990.0
        print(f"prefill 2048 x 2048 {op}: {c['seconds']*1e6:.1f} us, {tflops:.1f} tensor TFLOP/s = "
              f"{share:.1%} of bf16 peak (target >= 30%: {'met' if share >= 0.30 else 'NOT met'})")
for c in cases:
    if "cache_fp8" in c["op"] or "serving" in c["op"]:
        r = c.get("ratio", 0.0)
        print(f"{c['name']} {c['op']}: {r:.2f} of copy bandwidth (target >= 0.75: "
              f"{'met' if r >= 0.75 else 'NOT met'})")
PY
cat "$out/h200_targets.txt"

python3 "$repo/perf_tests/gpu/torch_pooling.py" --tokens 65536 --batch 1 \
  --out "$out/torch_pooling.json" >"$out/torch.log" 2>&1
echo "torch: exit $? $(tail -n 1 "$out/torch.log")"
