#!/usr/bin/env bash
# Every GPU check of the CUDA backend in one run, for the few minutes a GPU is at hand:
# the [cuda] test cases one process each (a crash loses one case, not the rest), the rest of
# the suite, the GEMM, attention and GPT-2 benchmarks against PyTorch on the same GPU, and
# train_gpt on the GPU with 1, 2 and 4 pipeline stages. Each step has a time limit; logs go to
# OUT_DIR (one file per step) and a summary to stdout. Pack gpu_attention, gpu_linear,
# gpu_kernels and generate_speed too:
#   bash ../shared/tools/gpu_pack.sh build .gpu/pack.tar.xz pipit_tests train_gpt gpu_gemm \
#     gpu_gpt2 gpu_attention gpu_linear gpu_kernels generate_speed tcp_throughput pipit-worker
# tools/gpu_prepare.sh builds the mutants the mutants step runs and packs them with the rest;
# and put the GPU machine's libnvrtc folder on LD_LIBRARY_PATH beside libcublas', libcudnn's
# and libcudart's (the cuDNN frontend links NVRTC; gpu_pack.sh leaves CUDA's libraries out).
#
# usage: bash tools/gpu_check.sh [BUILD_DIR] [OUT_DIR] [STEPS]
#   BUILD_DIR: a Release build with CUDA (default build); OUT_DIR: default gpu-logs;
#   STEPS: comma-separated subset of
#   info,cuda,suite,asan,mutants,gemm,linear,kernels,bias_grad,attention,gpt2,graph,train,
#   parity,generate
#   (default all but asan; asan runs BUILD_DIR's pipit_tests "[cuda]" as an ASan build; mutants
#   runs each mutant of tools/gpu_mutants.sh on the GPU case that must catch it, and a mutant
#   that passes its case is a test that needs fixing;
#   bias_grad is gpu_kernels' weight-gradient split rows; graph times GPT-2 small's bf16 step
#   (tied head, vocabulary padded to 50304) launched kernel by kernel and replayed as one CUDA
#   graph (cuda::Graph), pipit alone, the medians side by side; parity trains GPT-2 small's
#   shape 20 steps in bf16 on the GPU (its fused kernels) and on the CPU, prints the losses side
#   by side and whether they differ by at most 0.005; generate is bench/generate_speed --device
#   cuda, which appends to the bench/RESULTS.md of the source folder it was built in).
#   PIPIT_GPT2_FLAGS: flags for bench/gpu_gpt2.py (default --profile; issue 31's comparison:
#   --modes bf16 --tied --vocab-multiple 64 --attention cudnn --compile --llmc LLMC_BINARY);
#   PIPIT_GPT2_SECONDS: its time limit (default 420).
set -uo pipefail
cd "$(dirname "$0")/.."
# The suite's fixtures (tests/data) from this checkout, not the build machine's path.
export PIPIT_TEST_DATA="$(pwd)/tests/data"
build=$(realpath "${1:-build}")
out=$(realpath -m "${2:-gpu-logs}")
steps=",${3:-info,cuda,suite,mutants,gemm,linear,kernels,bias_grad,attention,gpt2,graph,train,parity,generate},"
mkdir -p "$out"

want() { [[ $steps == *",$1,"* ]]; }
# Runs "$@" under a time limit, output to $out/$1.log-style file named by the caller.
limited() {
  local seconds=$1 log=$2
  shift 2
  timeout -k 5 "$seconds" "$@" >>"$log" 2>&1
  local rc=$?
  [[ $rc == 124 || $rc == 137 ]] && echo "TIMED OUT after ${seconds}s: $*" >>"$log"
  return $rc
}

if want info; then
  {
    nvidia-smi
    echo "--- libraries not found:"
    ldd "$build/pipit_tests" | grep "not found"
    ldd "$build/pipit_tests" | grep -E "cublas|cudnn|cudart"
    lscpu | grep -E "Model name|^CPU\(s\)"
  } >"$out/info.log" 2>&1
  echo "info: $(grep -m1 -oE 'NVIDIA [A-Z0-9]+[^|]*' "$out/info.log" | head -1)"
fi

# One process per [cuda] case; a comma in a name is a separator to Catch2 unless escaped.
run_cases() {
  local binary=$1 log=$2 seconds=$3
  : >"$log"
  local passed=0 failed=0
  while IFS= read -r name; do
    [[ -z $name ]] && continue
    local start=$SECONDS verdict=ok case_log=$log.case
    : >"$case_log"
    if limited "$seconds" "$case_log" "$binary" "${name//,/\\,}" -d yes; then
      passed=$((passed + 1))
      grep -q "skipped: " "$case_log" && verdict=SKIP
    else
      failed=$((failed + 1))
      verdict=FAIL
    fi
    echo "    $verdict $((SECONDS - start))s  $name"
    { echo "### $verdict $name"; cat "$case_log"; } >>"$log"
    rm -f "$case_log"
  done < <("$binary" --list-test-names-only "[cuda]")
  echo "$(basename "$log" .log): $passed passed, $failed failed"
}

suite_pid=
if want suite; then
  # The CPU suite meanwhile: it needs the CPU, the [cuda] cases the GPU.
  limited 420 "$out/suite.log" "$build/pipit_tests" "~[cuda]" &
  suite_pid=$!
fi
want cuda && run_cases "$build/pipit_tests" "$out/cuda.log" 150
want asan && ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=0 \
  run_cases "$build/pipit_tests" "$out/asan.log" 240
if [[ -n $suite_pid ]]; then
  wait "$suite_pid"
  echo "suite (~[cuda]): rc=$? $(grep -E '^test cases|^All tests passed' "$out/suite.log" | tail -1)"
fi

if want mutants; then
  # shellcheck source=tools/gpu_mutants.sh
  source tools/gpu_mutants.sh
  for ((i = 0; i < ${#gpu_mutants[@]}; i += 4)); do
    name=${gpu_mutants[i]} case=${gpu_mutants[i + 3]}
    if [[ ! -x $build/$name ]]; then
      echo "mutant $name: not in $build (tools/gpu_prepare.sh builds it)"
      continue
    fi
    log="$out/mutant_$name.log"
    : >"$log"
    limited 150 "$log" "$build/$name" "$case"
    rc=$?
    if grep -q "No tests ran" "$log"; then
      verdict="its case is not in the build"
    elif [[ $rc == 0 ]]; then
      verdict="passes (its test needs fixing)"
    else
      verdict="FAILS as it must (rc=$rc)"
    fi
    echo "mutant $name: $verdict '${case//\\/}'"
  done
fi

if want gemm; then
  limited 150 "$out/gemm.log" python3 bench/gpu_gemm.py --build "$build"
  echo "gemm: rc=$?"
  grep -E "^\|" "$out/gemm.log"
fi
# A benchmark whose binary gpu_pack.sh does not pack by default (pack it by name): STEP runs
# bench/gpu_STEP.py for at most SECONDS and shows its table's rows.
packed_by_name() {
  local step=$1 seconds=$2
  want "$step" || return 0
  if [[ -x "$build/gpu_$step" ]]; then
    limited "$seconds" "$out/$step.log" python3 "bench/gpu_$step.py" --build "$build"
    echo "$step: rc=$?"
    grep -E "^\| (bf16|f16|tf32|f32|layer_norm|cross_entropy|adamw) " "$out/$step.log"
  else
    echo "$step: skipped, $build/gpu_$step missing"
  fi
}
packed_by_name linear 120
packed_by_name kernels 120
packed_by_name attention 120
if want bias_grad && [[ -x "$build/gpu_kernels" ]]; then
  limited 120 "$out/bias_grad.log" "$build/gpu_kernels" --kernels bias_grad
  echo "bias_grad: rc=$?"
  grep '^{' "$out/bias_grad.log"
fi
if want gpt2; then
  # shellcheck disable=SC2086 # the flags are words
  limited "${PIPIT_GPT2_SECONDS:-420}" "$out/gpt2.log" python3 bench/gpu_gpt2.py --build "$build" ${PIPIT_GPT2_FLAGS:---profile}
  echo "gpt2: rc=$?"
  grep -E "^\| (f32|tf32|bf16) " "$out/gpt2.log"
fi
if want graph && [[ -x "$build/gpu_gpt2" ]]; then
  for graph in "" --cuda-graph; do
    echo "### ${graph:-eager}" >>"$out/graph.log"
    # shellcheck disable=SC2086 # an empty $graph is no word
    limited 150 "$out/graph.log" "$build/gpu_gpt2" --modes bf16 --tied --vocab-multiple 64 \
      --steps 20 $graph
    echo "graph ${graph:-eager}: rc=$? $(grep '^{' "$out/graph.log" | tail -1 | python3 -c \
      'import json, statistics, sys; r = json.load(sys.stdin)
print("median %.2f ms, loss %.4f, peak %.2f GiB" % (statistics.median(r["ms"]), r["loss"], r["peak_bytes"] / 2**30))' 2>&1)"
  done
fi
if want train; then
  # The demo on the GPU, then one GPU shared by 1, 2 and 4 stages of a bigger model.
  limited 60 "$out/train.log" "$build/train_gpt" --device cuda --steps 200
  echo "demo: rc=$? $(grep -E "^step +200 " "$out/train.log")"
  for stages in 1 2 4; do
    echo "### stages $stages" >>"$out/train.log"
    limited 90 "$out/train.log" "$build/train_gpt" --device cuda --layers 12 --width 768 \
      --heads 12 --context 256 --batch 32 --microbatches 8 --stages "$stages" --steps 30 \
      --partition uniform
    echo "train stages=$stages: rc=$? $(grep -E "^step +30 " "$out/train.log" | tail -1)" \
      "$(grep -o "CRC-32C: [0-9a-f]*" "$out/train.log" | tail -1)"
  done
fi
if want parity; then
  # Issue 31's check that the fused kernels (cuDNN attention, cuBLASLt epilogues, the fused
  # layer norm and cross-entropy passes) train as pipit's CPU kernels do: GPT-2 small's blocks
  # (12 x 768, 12 heads; context 256 and the character vocabulary of train_gpt's text), bf16
  # autocast, 20 steps at lr 3e-4, one stage. The bound, 0.005 at every printed step, was set
  # before any GPU ran it (2026-11-28, Intel Xeon, 2 cores): the same CPU run with its GEMMs
  # summed in another order (OpenBLAS for oneDNN) moved the losses by 1e-4, 6e-4 and 8e-4 at
  # steps 1, 10 and 20, and f32 for bf16 by 1e-4, 1e-4 and 1e-3. So it catches a wrong kernel,
  # not a rounding mode: the [cuda] cases check those against the CPU's bits.
  for device in cuda cpu; do
    limited 240 "$out/parity_$device.log" "$build/train_gpt" --device "$device" --layers 12 \
      --width 768 --heads 12 --context 256 --batch 8 --microbatches 1 --stages 1 --steps 20 \
      --dtype bf16 --lr 3e-4
    echo "parity $device: rc=$?"
  done
  paste <(grep -E "^step" "$out/parity_cuda.log" | awk '{print $2, $4}') \
    <(grep -E "^step" "$out/parity_cpu.log" | awk '{print $4}') |
    awk 'NF < 3 { missing++; next }
         { d = $2 - $3; outside += (d > 0.005 || d < -0.005)
           printf "parity step %s: cuda %s cpu %s (difference %.4f)\n", $1, $2, $3, d }
         END { if (NR == 0 || missing) print "parity: a run printed fewer steps than the other"
               else if (outside) print "parity: OUTSIDE the bound of 0.005"
               else print "parity: within 0.005" }'
fi
if want generate; then
  # KV-cache generation of a random GPT-2 small against transformers' generate, both on the GPU.
  limited 240 "$out/generate.log" "$build/generate_speed" --device cuda
  echo "generate: rc=$?"
  grep -E "^\| [0-9]+ \| (f32|bf16) " "$out/generate.log" | sort -u
fi
