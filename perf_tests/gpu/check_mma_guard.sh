#!/usr/bin/env bash
# Compiles mma_guard.cpp to PTX for sm_89 and sm_90, at this nvcc's own
# version and as CUDA 12.3 (KPOOL_CUDA_COMPILER_VERSION=12030), and checks
# that the E4M3 mma.sync is there exactly when the guard allows it (the
# static_asserts in mma_guard.cpp check mma_device_supported<e4m3>).
#   KOKKOS_CUDA=DIR KOKKOSKERNELS_CUDA=DIR [BUILD_DIR=build-cuda] perf_tests/gpu/check_mma_guard.sh
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
: "${KOKKOS_CUDA:?set KOKKOS_CUDA to a CUDA Kokkos install}"
build=${BUILD_DIR:-$repo/build-cuda}
[ -f "$build/include/KPool_Config.hpp" ] || { echo "check_mma_guard.sh: configure $build first (stage_binaries.sh does)" >&2; exit 2; }
export PATH=/usr/local/cuda/bin:$PATH
inc=(-I"$repo/src" -I"$build/include" -isystem "$KOKKOS_CUDA/include")
[ -n "${KOKKOSKERNELS_CUDA:-}" ] && inc+=(-isystem "$KOKKOSKERNELS_CUDA/include")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
for arch in sm_89 sm_90; do
  for version in own 12030; do
    defs=(-DEXPECT_E4M3=1)
    [ "$version" = own ] || defs=(-DEXPECT_E4M3=0 -DKPOOL_CUDA_COMPILER_VERSION="$version")
    ptx=$tmp/$arch.$version.ptx
    nvcc -x cu -std=c++17 -O3 --extended-lambda -arch="$arch" "${inc[@]}" "${defs[@]}" \
      --ptx "$repo/perf_tests/gpu/mma_guard.cpp" -o "$ptx"
    e4m3=$(grep -c 'mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32' "$ptx" || true)
    bf16=$(grep -c 'mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32' "$ptx" || true)
    want=1
    [ "$version" = own ] || want=0
    verdict=ok
    if [ "$e4m3" != "$want" ] || [ "$bf16" != 1 ]; then verdict=WRONG; status=1; fi
    echo "$arch, compiler version $version: E4M3 mma.sync $e4m3 (want $want), bf16 $bf16: $verdict"
  done
done
exit $status
