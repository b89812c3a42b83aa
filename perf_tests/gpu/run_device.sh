#!/usr/bin/env bash
# The CUDA check on a GPU machine, in tiers, from programs staged here by
# stage_binaries.sh (nothing is compiled there):
#
#   perf_tests/gpu/run_device.sh [--tier 1|2] [--bin DIR]
#
# Tier 1 (at most 4 minutes of device time, start and transfers included;
# its parts' limits add up to 160 s: docs/verification.md, "Tier 1's
# budget") runs what decides the design:
#   mma        tst_score_mma's hardware tests: the tensor-core MMA against
#              the emulation bit for bit, and the E4M3 MMA's accumulation on
#              serving-shaped data against the serving profile's tolerance
#              (a line saying plainly whether it holds)
#   e4m3       tst_device_bits: the hardware E4M3 conversion against KPool's
#              on every exponent and the saturation and subnormal edges
#   graph      kpool_graph_capture: steps, a ragged selection and a decode
#              selection (fused and separate) captured into CUDA graphs and
#              replayed, other calls between the replays, give the eager bits
#   sanitizer  compute-sanitizer memcheck, racecheck and synccheck over a
#              small subset: the fused and separate decode selection, the
#              MMA engine's exactness, a long row's split top-k
#   perf       kpool_perf on exactly the cases of tier1_cases.txt, each
#              case's JSON line and summary line appended under OUT as it
#              ends, then each against the H200's limit (h200_limits.py)
#              and against the cost model's figure (cost_model.py
#              --measured: the model to be replaced by the measurements)
# Tier 2 runs the rest: every unit-test program in full (and under the three
# sanitizers), the hardware E4M3 conversion on all 2^32 floats, the whole
# perf suite.
#
# Each part writes its log and one summary line under OUT (default
# <repo>/device-out) as soon as it ends, so a run cut short still returns
# what it measured. Where no CUDA device answers (nvidia-smi -L fails, as on
# a machine without a GPU), each program is still started, to show that it
# loads and fails cleanly, and its part is reported as skipped with the
# reason it printed: a dry run takes seconds.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tier=1
bin=${PREBUILT:-$repo/.device/bin}
while [ $# -gt 0 ]; do
  case "$1" in
    --tier) tier=${2:?--tier needs 1 or 2}; shift 2 ;;
    --bin) bin=${2:?--bin needs a folder}; shift 2 ;;
    -h|--help) sed -n '2,30p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "run_device.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
case "$tier" in 1|2) ;; *) echo "run_device.sh: --tier is 1 or 2, not '$tier'" >&2; exit 2 ;; esac
out=${OUT:-$repo/device-out}
mkdir -p "$out"
if [ ! -d "$bin" ]; then
  echo "run_device.sh: no staged programs in $bin (perf_tests/gpu/stage_binaries.sh makes them)" >&2
  exit 2
fi
bin=$(cd "$bin" && pwd)
export LD_LIBRARY_PATH="$bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH=/usr/local/cuda/bin:$PATH
export OMP_PROC_BIND=false
summary=$out/summary_tier$tier.txt
: >"$summary"
{
  date -u
  echo "tier $tier, programs from $bin"
  cat "$bin/STAGED.txt" 2>/dev/null
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
} >"$out/env.txt"

no_gpu=""
if ! command -v nvidia-smi >/dev/null 2>&1; then
  no_gpu="no CUDA device (no nvidia-smi)"
elif ! gpus=$(nvidia-smi -L 2>&1) || [ -z "$gpus" ]; then
  no_gpu="no CUDA device (nvidia-smi -L: $(printf '%s' "$gpus" | head -n 1))"
fi
if [ -n "$no_gpu" ]; then
  # Without a driver the programs load against CUDA's stub library (staged
  # beside them), so that they reach their own device check.
  [ -d "$bin/nogpu" ] && export LD_LIBRARY_PATH="$bin/nogpu:$LD_LIBRARY_PATH"
fi

note() { echo "$*" | tee -a "$summary"; sync; }

# run_limited SECONDS LOG PROGRAM ARGS...: rc = its exit status (124 when
# it ran out of time); the shell's note of a program killed by a signal
# goes to LOG with the program's own output.
run_limited() {
  local limit=$1 log=$2
  shift 2
  ( timeout "$limit" "$@" </dev/null; echo "$?" >"$log.rc" ) >"$log" 2>&1
  rc=$(cat "$log.rc")
  rm -f "$log.rc"
}

# part NAME SECONDS PROGRAM ARGS...: runs PROGRAM (from the staged folder)
# with a time limit, its output in OUT/NAME.log, one summary line.
part() {
  local name=$1 limit=$2 prog=$3
  shift 3
  local exe=$bin/$prog log=$out/$name.log
  if [ ! -x "$exe" ]; then
    note "$name: skipped: $prog was not staged (stage_binaries.sh --tier $tier)"
    return 0
  fi
  local t0=$SECONDS rc=0
  if [ -n "$no_gpu" ]; then
    # Started all the same, briefly: it must load and refuse cleanly.
    run_limited 20 "$log" "$exe" "$@"
    local why
    why=$(grep -m 1 -E 'what\(\)' "$log" | sed 's/^ *//' | cut -c 1-200)
    [ -n "$why" ] || why=$(grep -m 1 -i -E 'cuda|device|gpu|error' "$log" | cut -c 1-200)
    note "$name: skipped: $no_gpu; $prog started and exited $rc: ${why:-$(head -n 1 "$log" | cut -c 1-160)}"
    return 0
  fi
  run_limited "$limit" "$log" "$exe" "$@"
  local status=ok
  [ "$rc" -eq 124 ] && status="TIMED OUT after ${limit} s"
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && status="FAILED (exit $rc)"
  note "$name: $status in $((SECONDS - t0)) s: $(grep -h -E '^\[  (PASSED|FAILED|SKIPPED) |graph capture:|kpool_perf:.*cases' "$log" | tr '\n' ' ' | cut -c 1-240)"
  # What the tests measured and printed for the record.
  grep -h -E 'measured|hardware E4M3 of NaN|first differing|accumulation|SERVING PROFILE' "$log" >>"$summary" 2>/dev/null
  sync
}

# The cases of the perf suite that decide the design, exactly.
tier1_cases=$(grep -v '^#' "$repo/perf_tests/gpu/tier1_cases.txt" | paste -sd, -)

# compute-sanitizer: the staged one, the machine's, or none.
sanitizer=""
for c in "$bin/compute-sanitizer/compute-sanitizer" "$(command -v compute-sanitizer 2>/dev/null)" \
         /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
  if [ -n "$c" ] && [ -x "$c" ]; then sanitizer=$c; break; fi
done
# sanitize NAME SECONDS FILTER: the three tools over the subset, each a
# third of the time; skipped with the reason where there is no tool.
sanitize() {
  local name=$1 limit=$2 each=$(( $2 / 3 ))
  if [ -z "$sanitizer" ]; then
    note "$name: skipped: no compute-sanitizer (not staged, not on PATH, not in /usr/local/cuda)"
    return 0
  fi
  if [ -n "$no_gpu" ]; then
    note "$name: skipped: $no_gpu; compute-sanitizer found at $sanitizer"
    return 0
  fi
  local tool prog filter
  for tool in memcheck racecheck synccheck; do
    for spec in "tst_select:SelectDecode/*bf16.DecodeSelectionInOneLaunchIsTheTwoLaunchesBitForBit" \
                "tst_score_mma:MmaDevice.*MatchesTheEmulation" \
                "tst_select_topk:SelectTopk.SelectsTheRankingWith32BitKeys"; do
      prog=${spec%%:*}
      filter=${spec#*:}
      [ -x "$bin/$prog" ] || { note "$name/$tool/$prog: skipped: $prog was not staged"; continue; }
      local log=$out/${name}_${tool}_$prog.log t0=$SECONDS
      run_limited $(( each / 3 )) "$log" "$sanitizer" --tool "$tool" --error-exitcode 9 \
        "$bin/$prog" --gtest_filter="$filter"
      local status=ok
      [ "$rc" -eq 124 ] && status="TIMED OUT"
      [ "$rc" -eq 9 ] && status="ERRORS REPORTED"
      [ "$rc" -ne 0 ] && [ "$rc" -ne 9 ] && [ "$rc" -ne 124 ] && status="FAILED (exit $rc)"
      note "$name/$tool/$prog: $status in $((SECONDS - t0)) s: $(grep -h -E 'ERROR SUMMARY|^\[  (PASSED|FAILED) ' "$log" | tr '\n' ' ' | cut -c 1-160)"
    done
  done
}

if [ "$tier" = 1 ]; then
  part mma 20 tst_score_mma --gtest_filter='MmaDevice.*:MmaFragments.*'
  part e4m3 15 tst_device_bits --gtest_filter='-*AllFloats*'
  part graph 15 kpool_graph_capture
  sanitize sanitizer 60
  part perf 50 kpool_perf --cases "$tier1_cases" --min-time 0.05 --out "$out/perf_tier1.json" \
    --lines "$out/perf_tier1.jsonl" --summary "$summary"
  report=$out/perf_tier1.jsonl
else
  for t in "$bin"/tst_*; do
    [ -x "$t" ] || continue
    part "unit_$(basename "$t")" 300 "$(basename "$t")"
  done
  for t in "$bin"/tst_*; do
    [ -x "$t" ] || continue
    for tool in memcheck racecheck synccheck; do
      if [ -n "$sanitizer" ] && [ -z "$no_gpu" ]; then
        run_limited 600 "$out/sanitize_${tool}_$(basename "$t").log" "$sanitizer" --tool "$tool" \
          --error-exitcode 9 "$t"
        note "sanitize/$tool/$(basename "$t"): exit $rc $(grep -h 'ERROR SUMMARY' "$out/sanitize_${tool}_$(basename "$t").log" | head -n 1)"
      fi
    done
  done
  part perf_full 600 kpool_perf --out "$out/perf_report.json" --lines "$out/perf_report.jsonl"
  report=$out/perf_report.jsonl
  # The same pooling as PyTorch eager operations, where torch is installed.
  if [ -z "$no_gpu" ] && python3 -c 'import torch' 2>/dev/null; then
    python3 "$repo/perf_tests/gpu/torch_pooling.py" --tokens 65536 --batch 1 \
      --out "$out/torch_pooling.json" >"$out/torch.log" 2>&1
    note "torch: exit $? $(tail -n 1 "$out/torch.log")"
  fi
fi

if [ -z "$no_gpu" ] && [ -s "$report" ]; then
  python3 "$repo/perf_tests/gpu/h200_limits.py" "$report" >"$out/h200_limits_tier$tier.txt" 2>&1
  cat "$out/h200_limits_tier$tier.txt" >>"$summary"
  cat "$out/h200_limits_tier$tier.txt"
  python3 "$repo/perf_tests/gpu/cost_model.py" --measured "$report" \
    >"$out/cost_model_tier$tier.txt" 2>&1
  grep -E '^[a-z_0-9]+ \(|measured:' "$out/cost_model_tier$tier.txt" >>"$summary"
fi
echo "summary: $summary"
