#!/usr/bin/env bash
# KPool fuzzers (fuzz/README.md, docs/validation.md): what .ci/run calls
# after the unit suites. It
#   1. installs Debian's clang and libFuzzer (clang-16, libfuzzer-16-dev,
#      its sanitizer runtimes, libomp-16-dev for the OpenMP Kokkos) when
#      they are missing,
#   2. configures build-fuzz with that clang, KPool_ENABLE_FUZZERS=ON,
#      against the Kokkos (and Kokkos Kernels) cmake/setup.sh found or built,
#   3. builds fuzz_trace and fuzz_api (-fsanitize=fuzzer,address,undefined,
#      alignment included, every report fatal),
#   4. runs each for KPOOL_FUZZ_SECONDS (default 60) from its committed seed
#      corpus (fuzz/corpus/), failing on the first crash, leak, sanitizer
#      report or harness abort (the input is left in build-fuzz/artifacts/).
#
# Environment:
#   Kokkos_ROOT, KokkosKernels_ROOT, KPOOL_CACHE_DIR, KPOOL_JOBS: as for
#                        cmake/setup.sh
#   KPOOL_FUZZ_BUILD_DIR build folder (default: <repo>/build-fuzz)
#   KPOOL_FUZZ_SECONDS   seconds each fuzzer runs (default 60; 0 builds only)
#   KPOOL_FUZZ_CLANG     clang version (default 16; 15 works too)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${KPOOL_FUZZ_BUILD_DIR:-$repo/build-fuzz}
cache=${KPOOL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kpool}
jobs=${KPOOL_JOBS:-$(nproc)}
seconds=${KPOOL_FUZZ_SECONDS:-60}
v=${KPOOL_FUZZ_CLANG:-16}

say() { printf '[kpool fuzz] %s\n' "$*"; }
as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@";
  elif command -v sudo >/dev/null 2>&1; then sudo "$@";
  else say "need root for: $*"; exit 1; fi
}

# 1. Packages -----------------------------------------------------------------
packages=("clang-$v" "libfuzzer-$v-dev" "libclang-rt-$v-dev" "libomp-$v-dev")
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  as_root apt-get -o DPkg::Lock::Timeout=600 update -q
  as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 \
    install -y -q --no-install-recommends "${missing[@]}"
fi

# 2. Configure ----------------------------------------------------------------
Kokkos_ROOT=${Kokkos_ROOT:-$cache/kokkos-trilinos-openmp}
export Kokkos_ROOT
kk=()
if [ -n "${KokkosKernels_ROOT:-}" ]; then
  kk=(-DKokkosKernels_ROOT="$KokkosKernels_ROOT")
elif [ -d "$cache/kokkos-kernels-trilinos" ]; then
  kk=(-DKokkosKernels_ROOT="$cache/kokkos-kernels-trilinos")
fi
cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER="clang++-$v" -DKPool_ENABLE_FUZZERS=ON -DKPool_ENABLE_DEPRECATED=OFF \
  -DKPool_ENABLE_TESTS=OFF -DKPool_ENABLE_PERF_TESTS=OFF -DKPool_ENABLE_EXAMPLES=OFF \
  -DKPool_ENABLE_TORCH=OFF \
  -DKokkos_ROOT="$Kokkos_ROOT" "${kk[@]}" >/dev/null

# 3. Build --------------------------------------------------------------------
cmake --build "$build" --target kpool_fuzzers -j "$jobs"

# 4. Run ----------------------------------------------------------------------
[ "$seconds" -gt 0 ] || exit 0
for f in "$build"/fuzz/fuzz_*; do
  [ -x "$f" ] || continue
  name=$(basename "$f")
  say "$name: ${seconds} s"
  sh "$build/fuzz/run_$name.sh" "$seconds"
done
