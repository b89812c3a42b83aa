#!/usr/bin/env bash
# The CUDA check, run on a GPU machine in one go: build KPool against a
# CUDA-enabled Kokkos, run the unit suite and the perf suite on the GPU,
# time the same pooling as PyTorch eager operations, and leave the logs,
# perf_report.json and torch_pooling.json in OUT.
#
#   KOKKOS_CUDA=/path/to/kokkos-cuda-install OUT=/some/dir perf_tests/gpu/run_device.sh
#
# KOKKOS_CUDA is a Kokkos install with Kokkos_ENABLE_CUDA and the GPU's
# arch (HOPPER90 for an H200); this script builds no Kokkos. With
# BUILD_DIR pointing at an existing build it skips configuring.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
: "${KOKKOS_CUDA:?set KOKKOS_CUDA to a CUDA-enabled Kokkos install}"
out=${OUT:-$repo/device-out}
build=${BUILD_DIR:-$repo/build-cuda}
mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
  nvcc --version | tail -n 2
  grep -h 'define KOKKOS_VERSION ' "$KOKKOS_CUDA"/include/KokkosCore_config.h || true
} >"$out/env.txt" 2>&1

if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release \
    -DKokkos_ROOT="$KOKKOS_CUDA" -DCMAKE_CXX_COMPILER="$KOKKOS_CUDA/bin/nvcc_wrapper" \
    >"$out/configure.log" 2>&1 || { echo "configure failed"; tail -n 30 "$out/configure.log"; exit 1; }
fi
cmake --build "$build" -j "$(nproc)" >"$out/build.log" 2>&1 ||
  { echo "build failed"; grep -m 20 -A 5 error "$out/build.log"; exit 1; }

(cd "$build" && ctest -L unit --output-on-failure --timeout 300) >"$out/unit.log" 2>&1
echo "unit: $(grep -E 'tests passed|tests failed' "$out/unit.log" | tail -n 1)"

(cd "$build" && ./perf_tests/kpool_perf --out "$out/perf_report.json") >"$out/perf.log" 2>&1
echo "perf: exit $?"
python3 "$repo/perf_tests/perf_table.py" "$out/perf_report.json" >"$out/perf_table.txt" 2>&1 || true

python3 "$repo/perf_tests/gpu/torch_pooling.py" --tokens 65536 --batch 1 \
  --out "$out/torch_pooling.json" >"$out/torch.log" 2>&1
echo "torch: exit $?"
cat "$out/torch.log" | tail -n 2
grep -E 'prefill_b1_64k/bf16/(compress|step_fused)|decode_b256' "$out/perf_table.txt" || true
