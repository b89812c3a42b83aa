#!/usr/bin/env bash
# KPool setup, the README's first command. On a fresh Debian machine it
#   1. installs the Debian packages the build needs,
#   2. finds a Kokkos with the OpenMP backend, or builds Kokkos (OpenMP +
#      Serial) from Debian's trilinos source package into a cache folder
#      outside the build tree, reused by later runs,
#   3. finds a Kokkos Kernels, or builds Kokkos Kernels (ETI off, Debian's
#      OpenBLAS as its BLAS) from the same source package into the same
#      cache folder; the blas and team_gemm scoring engines and the perf
#      suite's gemm baselines need it (the rest of KPool does not),
#   4. configures and builds KPool (tests, examples, perf suite) for this
#      machine's SIMD,
#   5. runs the main example (one layer's whole indexer path).
#
# Environment:
#   Kokkos_ROOT         use this Kokkos install and skip building Kokkos
#   KokkosKernels_ROOT  use this Kokkos Kernels install (otherwise one
#                       installed beside Kokkos_ROOT, otherwise KPool builds
#                       one when the Kokkos is 3.4, the version the trilinos
#                       source package carries)
#   KPOOL_BUILD_DIR     build folder (default: <repo>/build)
#   KPOOL_CACHE_DIR     where a built Kokkos and Kokkos Kernels are kept
#                       (default: ~/.cache/kpool)
#   KPOOL_JOBS          parallel build jobs (default: nproc)
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
# libopenblas-dev: the BLAS under Kokkos Kernels' host KokkosBlas::gemm.
# libopenmpi-dev, openmpi-bin: KPool::mpi and its tests (ctest -L mpi,
# docs/ranks.md); the core never needs them.
# libtorch-dev, python3-torch, python3-pytest: KPool::torch, the
# torch.ops.kpool operators and the Python package kpool, and their pytest
# suite (ctest torch_ops; docs/torch.md); the core never needs them.
packages=(cmake g++ make libgtest-dev libopenblas-dev libopenmpi-dev openmpi-bin
  libtorch-dev python3-torch python3-pytest)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  as_root apt-get update -q
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# Debian's trilinos source package, downloaded and unpacked at most once a
# run: packages/kokkos and packages/kokkos-kernels in one tar step.
work=
trilinos=
trilinos_source() {
  [ -n "$trilinos" ] && return 0
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
  local tarball
  tarball=$(ls "$work"/trilinos_*.orig.tar.* | head -n 1)
  say "unpacking packages/kokkos and packages/kokkos-kernels from $(basename "$tarball")"
  tar -xf "$tarball" -C "$work" --wildcards '*/packages/kokkos/*' '*/packages/kokkos-kernels/*'
  trilinos=$(find "$work" -maxdepth 2 -type d -path '*/packages' -print -quit)
  rm -f "$tarball"
}

# Builds the CMake project in $1 with the configure arguments after $2 and
# installs it into $2, atomically: a half-built install never looks complete.
# $2/.kpool-complete records what it was built against.
build_into() {
  local src=$1 dest=$2 stamp=$3
  shift 3
  local name prefix
  name=$(basename "$dest")
  prefix=$cache/.$name-partial-$$
  rm -rf "$prefix" "$work/build-$name"
  cmake -S "$src" -B "$work/build-$name" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_CXX_STANDARD=17 \
    -DCMAKE_POSITION_INDEPENDENT_CODE=ON "$@" >"$work/configure-$name.log" 2>&1 ||
    { cat "$work/configure-$name.log"; exit 1; }
  cmake --build "$work/build-$name" -j "$jobs" >"$work/build-$name.log" ||
    { tail -n 50 "$work/build-$name.log"; exit 1; }
  cmake --install "$work/build-$name" >/dev/null
  printf '%s\n' "$stamp" >"$prefix/.kpool-complete"
  mkdir -p "$cache"
  rm -rf "$dest"
  mv "$prefix" "$dest"
  rm -rf "$work/build-$name"
}

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
    trilinos_source
    build_into "$trilinos/kokkos" "$kokkos" "trilinos" \
      -DKokkos_ENABLE_OPENMP=ON -DKokkos_ENABLE_SERIAL=ON
    say "Kokkos installed in $kokkos"
  fi
fi
if ! has_openmp "$kokkos"; then
  say "note: the Kokkos in $kokkos has no OpenMP backend; host runs are serial"
fi

# 3. Kokkos Kernels -----------------------------------------------------------
kokkos_version() {  # $1: a Kokkos install prefix
  local f
  f=$(find "$1" -name KokkosConfigVersion.cmake -print -quit 2>/dev/null || true)
  [ -n "$f" ] && sed -n 's/^set(PACKAGE_VERSION "\([0-9.]*\)").*/\1/p' "$f" | head -n 1
}
has_device() {  # $1: a Kokkos install prefix
  local cfg
  cfg=$(find "$1" -name KokkosCore_config.h -print -quit 2>/dev/null || true)
  [ -n "$cfg" ] && grep -qE '^#define KOKKOS_ENABLE_(CUDA|HIP|SYCL)' "$cfg"
}
has_kernels() {  # $1: an install prefix
  [ -n "$(find "$1" -name KokkosKernelsConfig.cmake -print -quit 2>/dev/null || true)" ]
}

kernels=${KokkosKernels_ROOT:-}
if [ -n "$kernels" ]; then
  say "using KokkosKernels_ROOT=$kernels"
elif [ -n "${Kokkos_ROOT:-}" ] && has_kernels "$Kokkos_ROOT"; then
  kernels=$Kokkos_ROOT
  say "using the Kokkos Kernels installed beside Kokkos in $kernels"
else
  kernels=$cache/kokkos-kernels-trilinos
  # What the cached build was made against: reused only for the same Kokkos.
  stamp="trilinos kokkos=$kokkos"
  if [ -f "$kernels/.kpool-complete" ] && [ "$(cat "$kernels/.kpool-complete")" = "$stamp" ] &&
    has_kernels "$kernels"; then
    say "reusing Kokkos Kernels in $kernels"
  else
    version=$(kokkos_version "$kokkos")
    # A device Kokkos needs its own compiler wrapper for Kokkos Kernels too:
    # that build is the user's (KokkosKernels_ROOT).
    if has_device "$kokkos"; then version="$version (a device build)"; fi
    case "$version" in
      3.4.[0-9][0-9] | 3.4.[0-9])
        say "building Kokkos Kernels (ETI off, OpenBLAS) from Debian's trilinos source package"
        trilinos_source
        # The Fortran name mangling of Debian's OpenBLAS is given, so no
        # Fortran compiler is needed to probe it.
        build_into "$trilinos/kokkos-kernels" "$kernels" "$stamp" \
          -DKokkos_ROOT="$kokkos" \
          -DKokkosKernels_ADD_DEFAULT_ETI=OFF \
          -DKokkosKernels_ENABLE_TPL_BLAS=ON -DKokkosKernels_ENABLE_TPL_LAPACK=OFF \
          -DBLAS_LIBRARIES=openblas "-DF77_BLAS_MANGLE=(name,NAME) name ## _"
        say "Kokkos Kernels installed in $kernels"
        ;;
      *)
        say "note: no Kokkos Kernels for Kokkos ${version:-of unknown version} in $kokkos;" \
          "set KokkosKernels_ROOT to one built against it for the blas and team_gemm engines"
        kernels=
        ;;
    esac
  fi
fi

# 4. KPool --------------------------------------------------------------------
say "configuring KPool in $build"
kernels_arg=()
if [ -n "$kernels" ]; then kernels_arg=(-DKokkosKernels_ROOT="$kernels"); fi
cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DKokkos_ROOT="$kokkos" \
  ${kernels_arg[@]+"${kernels_arg[@]}"} -DKPool_ENABLE_NATIVE_ARCH=ON "$@"
cmake --build "$build" -j "$jobs"

# 5. The main example ---------------------------------------------------------
# It is one layer's whole indexer path, selection included.
say "running the main example"
OMP_PROC_BIND=${OMP_PROC_BIND:-false} "$build/example/kpool_serving_example"
