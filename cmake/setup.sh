#!/usr/bin/env bash
# KPool setup, the README's first command. On a fresh Debian machine it
#   1. installs the Debian packages the build needs,
#   2. finds a Kokkos with the OpenMP backend, or builds Kokkos (OpenMP +
#      Serial) from Debian's trilinos source package into a cache folder
#      outside the build tree, reused by later runs,
#   3. configures and builds KPool (tests, examples, perf suite) for this
#      machine's SIMD,
#   4. runs the main example.
#
# Environment:
#   Kokkos_ROOT      use this Kokkos install and skip step 2
#   KPOOL_BUILD_DIR  build folder (default: <repo>/build)
#   KPOOL_CACHE_DIR  where a built Kokkos is kept (default: ~/.cache/kpool)
#   KPOOL_JOBS       parallel build jobs (default: nproc)
# Extra arguments are passed to KPool's cmake configure step.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${KPOOL_BUILD_DIR:-$repo/build}
cache=${KPOOL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kpool}
jobs=${KPOOL_JOBS:-$(nproc)}

say() { printf '[kpool setup] %s\n' "$*"; }
as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@";
  elif command -v sudo >/dev/null 2>&1; then sudo "$@";
  else say "need root for: $*"; exit 1; fi
}

# 1. Packages -----------------------------------------------------------------
packages=(cmake g++ make libgtest-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  as_root apt-get update -q
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# 2. Kokkos -------------------------------------------------------------------
has_openmp() {  # $1: a Kokkos install prefix
  local cfg
  cfg=$(find "$1" -name KokkosCore_config.h -print -quit 2>/dev/null || true)
  [ -n "$cfg" ] && grep -q '^#define KOKKOS_ENABLE_OPENMP' "$cfg"
}

kokkos=${Kokkos_ROOT:-}
if [ -n "$kokkos" ]; then
  say "using Kokkos_ROOT=$kokkos"
else
  kokkos=$cache/kokkos-trilinos-openmp
  if [ -f "$kokkos/.kpool-complete" ] && has_openmp "$kokkos"; then
    say "reusing Kokkos in $kokkos"
  else
    say "building Kokkos (OpenMP + Serial) from Debian's trilinos source package"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    # apt-get source needs a deb-src entry; derive one from this machine's
    # own deb entries when there is none.
    if ! grep -rqsE '^(deb-src |Types:.*deb-src)' /etc/apt/sources.list /etc/apt/sources.list.d/; then
      say "adding deb-src entries mirroring the configured deb entries"
      src_list=$(mktemp)
      for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        sed -e 's/^Types:.*$/Types: deb-src/' "$f" >>"$src_list"
        echo >>"$src_list"
      done
      if [ -s "$src_list" ]; then
        as_root install -m 644 "$src_list" /etc/apt/sources.list.d/kpool-deb-src.sources
      fi
      if [ -f /etc/apt/sources.list ] && grep -qE '^deb ' /etc/apt/sources.list; then
        sed -n 's/^deb /deb-src /p' /etc/apt/sources.list >"$src_list"
        as_root install -m 644 "$src_list" /etc/apt/sources.list.d/kpool-deb-src.list
      fi
      rm -f "$src_list"
    fi
    as_root apt-get update -q
    (cd "$work" && apt-get source --download-only trilinos)
    tarball=$(ls "$work"/trilinos_*.orig.tar.* | head -n 1)
    say "unpacking packages/kokkos from $(basename "$tarball")"
    tar -xf "$tarball" -C "$work" --wildcards '*/packages/kokkos/*'
    src=$(find "$work" -maxdepth 3 -type d -path '*/packages/kokkos' -print -quit)
    prefix=$cache/.kokkos-partial-$$
    rm -rf "$prefix"
    cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_CXX_STANDARD=17 \
      -DKokkos_ENABLE_OPENMP=ON -DKokkos_ENABLE_SERIAL=ON \
      -DCMAKE_POSITION_INDEPENDENT_CODE=ON >"$work/configure.log" ||
      { cat "$work/configure.log"; exit 1; }
    cmake --build "$work/build" -j "$jobs" >"$work/build.log" ||
      { tail -n 50 "$work/build.log"; exit 1; }
    cmake --install "$work/build" >/dev/null
    touch "$prefix/.kpool-complete"
    mkdir -p "$cache"
    rm -rf "$kokkos"
    mv "$prefix" "$kokkos"
    say "Kokkos installed in $kokkos"
  fi
fi
if ! has_openmp "$kokkos"; then
  say "note: the Kokkos in $kokkos has no OpenMP backend; host runs are serial"
fi

# 3. KPool --------------------------------------------------------------------
say "configuring KPool in $build"
cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DKokkos_ROOT="$kokkos" \
  -DKPool_ENABLE_NATIVE_ARCH=ON "$@"
cmake --build "$build" -j "$jobs"

# 4. The main example ---------------------------------------------------------
say "running the main example"
OMP_PROC_BIND=${OMP_PROC_BIND:-false} "$build/example/kpool_serving_example"
