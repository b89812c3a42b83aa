#!/usr/bin/env bash
# Copies a CUDA build's unit tests, perf suite and examples, stripped, into
# one folder (default <repo>/.device/bin, ignored by git) that travels to a
# GPU machine for run_device.sh (PREBUILT=that folder). About 45 MB.
#   perf_tests/gpu/stage_binaries.sh BUILD_DIR [DEST]
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:?usage: stage_binaries.sh BUILD_DIR [DEST]}
dest=${2:-$repo/.device/bin}
mkdir -p "$dest"
for f in "$build"/unit_tests/tst_* "$build"/perf_tests/kpool_perf \
         "$build"/perf_tests/kpool_graph_capture \
         "$build"/example/kpool_replay "$build"/example/kpool_serving_example; do
  case "$f" in *.cmake) continue ;; esac
  [ -x "$f" ] && strip -o "$dest/$(basename "$f")" "$f"
done
du -sh "$dest"
