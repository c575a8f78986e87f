#!/usr/bin/env bash
# Builds the libFuzzer harnesses (clang, ASan + UBSan, in build-fuzz) and runs each for
# SECONDS_PER_HARNESS seconds (default 20) on a scratch copy of its seeds
# (tests/fuzz/corpus/<harness>) and regressions (tests/fuzz/regressions/<harness>).
# Prints per harness the executions, the coverage libFuzzer reached (cov: edges, ft:
# features) and the findings; exits non-zero when any harness found something (a Finding, a
# crash, a sanitizer report, a leak, an out-of-memory or a timeout). The inputs that caused
# them are kept under build-fuzz/findings/<harness>/.
#   tests/fuzz/run.sh [SECONDS_PER_HARNESS] [HARNESS...]    (default: every harness)
# Environment: PIPIT_FUZZ_BUILD (build folder, default build-fuzz), PIPIT_FUZZ_JOBS (build
# jobs and harnesses run at once, default nproc), PIPIT_FUZZ_RSS_MB (memory limit per
# harness, default 2048).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)

seconds=${1:-20}
if (($# > 0)); then shift; fi
build=${PIPIT_FUZZ_BUILD:-build-fuzz}
jobs=${PIPIT_FUZZ_JOBS:-$(nproc)}
rss_mb=${PIPIT_FUZZ_RSS_MB:-2048}
harnesses=("$@")
if ((${#harnesses[@]} == 0)); then
  for dir in tests/fuzz/corpus/*/; do harnesses+=("$(basename "$dir")"); done
fi

scratch=$(mktemp -d "${TMPDIR:-/tmp}/pipit-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT

echo "=== fuzz build ($build: clang, libFuzzer, ASan + UBSan; -O1, asserts on) ==="
# The same options as tools/test.sh's sanitizer build, which this build folder can share.
# The build's output is shown only when it fails.
# OpenBLAS for GEMM: clang's OpenMP runtime (libomp) and the GNU one oneDNN is built against
# should not share a process.
if ! { cmake -S . -B "$build" -DCMAKE_CXX_COMPILER=clang++ -DPIPIT_SANITIZE=ON \
         -DPIPIT_FUZZ=ON -DPIPIT_CUDA=OFF -DPIPIT_GEMM=OPENBLAS -DPIPIT_BUILD_SAMPLES=OFF \
         -DCMAKE_BUILD_TYPE=Debug \
         -DCMAKE_CXX_FLAGS_DEBUG="-O1 -gline-tables-only" &&
       cmake --build "$build" -j"$jobs" --target "${harnesses[@]/#/fuzz_}"; } >"$scratch/build.log" 2>&1; then
  cat "$scratch/build.log"
  echo "fuzz: the build failed"
  exit 1
fi
findings_dir="$root/$build/findings"
failed=()

# Runs harness $1 and leaves its table row in $scratch/$1/row and, when it found something,
# the first lines of the report in $scratch/$1/report.
fuzz_one() {
  local h=$1
  local work="$scratch/$h"
  mkdir -p "$work/corpus" "$work/artifacts" "$work/tmp"
  for src in "tests/fuzz/corpus/$h" "tests/fuzz/regressions/$h"; do
    if [[ -d "$src" ]] && compgen -G "$src/*" >/dev/null; then cp "$src"/* "$work/corpus/"; fi
  done
  # Decoders that read files get them under TMPDIR: keep those in the scratch folder.
  local rc=0
  TMPDIR="$work/tmp" OMP_NUM_THREADS=1 "$build/tests/fuzz/fuzz_$h" \
    -max_total_time="$seconds" -rss_limit_mb="$rss_mb" -timeout=30 -print_final_stats=1 \
    -dict=tests/fuzz/json.dict \
    -artifact_prefix="$work/artifacts/" "$work/corpus" >"$work/log" 2>&1 || rc=$?

  local execs cov ft corp artifacts slow summary
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -1)
  last=$(grep -E '^#[0-9]+.*cov: ' "$work/log" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
  artifacts=$(ls "$work/artifacts")
  # Slow units (over 10 s, e.g. a module config declaring hundreds of MB of weights, which
  # build_module allocates and initialises by design) are reported but are not findings.
  slow=$(grep -c '^slow-unit-' <<<"$artifacts" || true)
  artifacts=$(grep -v '^slow-unit-' <<<"$artifacts" || true)
  if ((rc != 0)) || [[ -n "$artifacts" ]]; then
    mkdir -p "$findings_dir/$h"
    cp "$work/log" "$findings_dir/$h/log"
    if [[ -n "$artifacts" ]]; then cp "$work/artifacts"/* "$findings_dir/$h/"; fi
    summary="exit $rc, ${artifacts//$'\n'/ } (kept in $build/findings/$h)"
  else
    summary=none
  fi
  if ((slow > 0)); then summary+=" ($slow slow inputs)"; fi
  printf '%-22s %10s %8s %8s %7s  %s\n' "$h" "${execs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" \
    "$summary" >"$work/row"
  if ((rc != 0)) || [[ -n "$artifacts" ]]; then
    { grep -E '==pipit-fuzz==|ERROR: |SUMMARY: |runtime error' "$work/log" || true; } |
      head -5 | sed 's/^/    /' >"$work/report"
  fi
}

# Each harness is one process on one core: run as many at a time as there are cores.
running=0
for h in "${harnesses[@]}"; do
  if ((running >= jobs)); then
    wait -n
    running=$((running - 1))
  fi
  fuzz_one "$h" &
  running=$((running + 1))
done
wait

printf '\n%-22s %10s %8s %8s %7s  %s\n' harness execs cov ft corpus findings
for h in "${harnesses[@]}"; do
  if [[ ! -f "$scratch/$h/row" ]]; then
    echo "$h: its run ended before its row was written"
    failed+=("$h")
  elif cat "$scratch/$h/row" && [[ -f "$scratch/$h/report" ]]; then
    failed+=("$h")
    cat "$scratch/$h/report"
  fi
done

if ((${#failed[@]} > 0)); then
  echo "fuzz: findings in ${failed[*]}: reproduce with $build/tests/fuzz/fuzz_<harness> <input>"
  exit 1
fi
echo "fuzz: no findings"
