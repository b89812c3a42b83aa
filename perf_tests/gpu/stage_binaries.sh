#!/usr/bin/env bash
# Builds the device programs with nvcc on this machine (no GPU needed) and
# stages them, stripped, with the shared libraries they need beyond the C
# library and the CUDA driver, in one folder that travels to a GPU machine
# for run_device.sh (ignored by git; at most 64 MiB, the most a device run
# carries):
#
#   KOKKOS_CUDA=DIR KOKKOSKERNELS_CUDA=DIR perf_tests/gpu/stage_binaries.sh [--tier 1|2] [DEST]
#
#   KOKKOS_CUDA          a CUDA Kokkos install (HOPPER90 for an H100 or H200;
#                        its bin/nvcc_wrapper compiles KPool)
#   KOKKOSKERNELS_CUDA   a Kokkos Kernels built against it (optional: the
#                        team_gemm engine, and a same-run GEMM beside the perf
#                        suite's selection cases; every tier-1 case runs
#                        without it, timed against a same-run copy of its bytes)
#   BUILD_DIR            the CUDA build of KPool (default <repo>/build-cuda)
#   DEST                 default <repo>/.device/bin
#
# Tier 1 builds tst_score_mma, tst_device_bits, tst_select, tst_select_topk
# (the sanitizer part's subset), kpool_graph_capture and kpool_perf; tier 2
# every unit-test program and the examples too. CUDA's compute-sanitizer is
# staged too where the CUDA install has it. STAGED.txt says what was staged:
# the programs, Kokkos, whether Kokkos Kernels is in, the sanitizer, and the
# cases tier 1's perf part runs (tier1_cases.txt). KPool never builds Kokkos:
# docs/building.md ("CUDA, step by step") says how to build one.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tier=1
dest=$repo/.device/bin
while [ $# -gt 0 ]; do
  case "$1" in
    --tier) tier=${2:?--tier needs 1 or 2}; shift 2 ;;
    -h|--help) sed -n '2,20p' "${BASH_SOURCE[0]}"; exit 0 ;;
    -*) echo "stage_binaries.sh: unknown option '$1'" >&2; exit 2 ;;
    *) dest=$1; shift ;;
  esac
done
case "$tier" in 1|2) ;; *) echo "stage_binaries.sh: --tier is 1 or 2" >&2; exit 2 ;; esac
: "${KOKKOS_CUDA:?set KOKKOS_CUDA to a CUDA Kokkos install}"
build=${BUILD_DIR:-$repo/build-cuda}
export PATH=/usr/local/cuda/bin:$PATH

kernels=(-DKPool_ENABLE_KOKKOSKERNELS=OFF)
if [ -n "${KOKKOSKERNELS_CUDA:-}" ]; then
  kernels=(-DKokkosKernels_ROOT="$KOKKOSKERNELS_CUDA")
else
  echo "stage_binaries.sh: KOKKOSKERNELS_CUDA unset: no team_gemm engine, no same-run GEMM beside the selection cases (their copy baselines stay)" >&2
fi
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_COMPILER="$KOKKOS_CUDA/bin/nvcc_wrapper" -DKokkos_ROOT="$KOKKOS_CUDA" \
    ${kernels[@]+"${kernels[@]}"}
fi
if [ "$tier" = 1 ]; then
  cmake --build "$build" -j "${KPOOL_JOBS:-$(nproc)}" \
    --target tst_score_mma tst_device_bits tst_select tst_select_topk kpool_graph_capture kpool_perf
else
  cmake --build "$build" -j "${KPOOL_JOBS:-$(nproc)}"
fi

rm -rf "$dest"
mkdir -p "$dest/lib" "$dest/nogpu"
progs=("$build/unit_tests/tst_score_mma" "$build/unit_tests/tst_device_bits"
       "$build/unit_tests/tst_select" "$build/unit_tests/tst_select_topk"
       "$build/unit_tests/kpool_graph_capture" "$build/perf_tests/kpool_perf")
if [ "$tier" = 2 ]; then
  progs=("$build"/unit_tests/tst_* "$build/unit_tests/kpool_graph_capture"
         "$build/perf_tests/kpool_perf" "$build/example/kpool_replay"
         "$build/example/kpool_serving_example")
fi
for f in "${progs[@]}"; do
  case "$f" in *.cmake) continue ;; esac
  [ -x "$f" ] || { echo "stage_binaries.sh: $f was not built" >&2; exit 1; }
  strip -o "$dest/$(basename "$f")" "$f"
  # Shared libraries past the C library and the driver (libcuda comes with
  # the GPU machine's driver): the C++ runtime, OpenMP, GoogleTest.
  ldd "$f" | awk '/=> \// {print $1, $3}' | while read -r name path; do
    case "$name" in
      libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libcuda.so*) ;;
      *) [ -f "$dest/lib/$name" ] || cp -L "$path" "$dest/lib/$name" ;;
    esac
  done
done
# A machine without a driver loads the programs against CUDA's stub library,
# so that a dry run shows them start and refuse cleanly (run_device.sh puts
# this folder on the library path only where no GPU answers).
stub=/usr/local/cuda/lib64/stubs/libcuda.so
[ -f "$stub" ] && cp -L "$stub" "$dest/nogpu/libcuda.so.1"
sanitizer="not staged (the CUDA install here has none; run_device.sh looks for one on the GPU machine)"
for d in /usr/local/cuda/compute-sanitizer "${CUDA_HOME:-/usr/local/cuda}/compute-sanitizer"; do
  if [ -x "$d/compute-sanitizer" ]; then
    cp -a "$d" "$dest/compute-sanitizer"
    sanitizer="staged from $d"
    break
  fi
done
{
  echo "staged $(date -u +%Y-%m-%dT%H:%M:%SZ), tier $tier, from $(git -C "$repo" rev-parse --short HEAD 2>/dev/null)"
  grep -h 'define KOKKOS_VERSION ' "$KOKKOS_CUDA"/include/KokkosCore_config.h 2>/dev/null
  grep -h '^#define KOKKOS_ARCH_[A-Z]*[0-9][0-9]' "$KOKKOS_CUDA"/include/KokkosCore_config.h 2>/dev/null
  nvcc --version | tail -n 2
  if [ -n "${KOKKOSKERNELS_CUDA:-}" ]; then
    echo "Kokkos Kernels: $KOKKOSKERNELS_CUDA (team_gemm engine; selection cases timed beside a GEMM too)"
  else
    echo "Kokkos Kernels: none (selection cases timed beside a same-run copy of their bytes only)"
  fi
  echo "compute-sanitizer: $sanitizer"
  echo "programs: $(cd "$dest" && ls -d tst_* kpool_* 2>/dev/null | paste -sd' ' -)"
  echo "tier 1 perf cases (kpool_perf --cases, perf_tests/gpu/tier1_cases.txt):"
  grep -v '^#' "$repo/perf_tests/gpu/tier1_cases.txt" | sed 's/^/  /'
} >"$dest/STAGED.txt"
cat "$dest/STAGED.txt"
bytes=$(du -sb "$dest" | cut -f 1)
echo "stage_binaries.sh: $dest, $((bytes / 1024 / 1024)) MiB"
ls -l "$dest" "$dest/lib"
if [ "$bytes" -gt $((64 * 1024 * 1024)) ]; then
  echo "stage_binaries.sh: more than the 64 MiB a device run carries" >&2
  exit 1
fi
