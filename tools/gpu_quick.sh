#!/usr/bin/env bash
# Issue 50's GPU run in one device call of under ten minutes, on the GPU machine: the checks
# that share the GPU without timing it run side by side first (the [cuda] cases in one process,
# the mutants three at a time, train_gpt's CRC with 1, 2 and 4 stages, the GPU half of the
# parity run), then, with the GPU to itself, pipit's op timer for one step and the sweep of
# every peer at every batch (bench/gpu_gpt2_sweep.py), until DEADLINE seconds have passed.
# torch.compile's compiles run in the first phase (the sweep's --prewarm), where nothing is
# timed, so the sweep finds inductor's caches full.
#
# usage (on the GPU machine, from the repository's root):
#   bash tools/gpu_quick.sh PACK LLMC LOG_DIR [DEADLINE]
#   PACK: tools/gpu_prepare.sh's archive; LLMC: llm.c's train_gpt2cu (../shared/tools/
#   build_llmc.sh), or - for none; LOG_DIR: one log per check; DEADLINE: default 540.
# Prints a summary; the logs carry the detail.
set -uo pipefail
cd "$(dirname "$0")/.."
pack=$(realpath "$1") llmc=$2 logs=$(realpath -m "$3") deadline=${4:-540}
mkdir -p "$logs"
unpacked=$(mktemp -d)
tar -xJf "$pack" -C "$unpacked"
bin=$unpacked/x/bin
# CUDA's libraries are the machine's own (gpu_pack.sh leaves them out): PyTorch's wheels.
cuda_libraries=$(find /opt /usr -xdev \( -name 'libcublas.so.1*' -o -name 'libcudnn.so.9*' -o \
  -name 'libcudart.so.1*' -o -name 'libnvrtc.so.1*' \) -printf '%h\n' 2>/dev/null | sort -u |
  paste -sd:)
export LD_LIBRARY_PATH=$unpacked/x/lib:$cuda_libraries${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PIPIT_TEST_DATA=$(pwd)/tests/data
left() { echo $((deadline - SECONDS)); }
prewarm_pids=()

{
  nvidia-smi
  lscpu | grep -E "Model name|^CPU\(s\)"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  ldd "$bin/pipit_tests" | grep -E "not found|cublas|cudnn|cudart|nvrtc"
} >"$logs/info.log" 2>&1
echo "info: $(grep -m1 -oE 'NVIDIA H[0-9]+[^|]*' "$logs/info.log")"

# Side by side: correctness only, nothing here is timed; and torch.compile's compiles for the
# sweep (CPU work, one step on the GPU each), so that the timed phase spends its time on steps.
for mode in bf16 tf32; do
  compile_modes=default
  [[ $mode == bf16 ]] && compile_modes=default,reduce-overhead
  PYTHONUNBUFFERED=1 timeout -k 5 240 python3 bench/gpu_gpt2_sweep.py --build "$bin" --prewarm \
    --modes "$mode" --batches 8,32,16 --compile-modes "$compile_modes" \
    >"$logs/prewarm_$mode.log" 2>&1 &
  prewarm_pids+=($!)
done
timeout -k 5 200 "$bin/pipit_tests" "[cuda]" -d yes >"$logs/cuda.log" 2>&1 &
cuda_pid=$!
(
  # shellcheck source=tools/gpu_mutants.sh
  source tools/gpu_mutants.sh
  for ((i = 0; i < ${#gpu_mutants[@]}; i += 4)); do
    name=${gpu_mutants[i]} case=${gpu_mutants[i + 3]}
    [[ -x $bin/$name ]] || continue
    (
      timeout -k 5 150 "$bin/$name" "$case" >"$logs/mutant_$name.log" 2>&1
      rc=$?
      if grep -q "No tests ran" "$logs/mutant_$name.log"; then verdict="its case is not in the build"
      elif [[ $rc == 0 ]]; then verdict="passes (its test needs fixing)"
      else verdict="FAILS as it must (rc=$rc)"; fi
      echo "mutant $name: $verdict" >"$logs/mutant_$name.verdict"
    ) &
    (((i / 4) % 3 == 2)) && wait
  done
  wait
) &
mutants_pid=$!
(
  for stages in 1 2 4; do
    timeout -k 5 120 "$bin/train_gpt" --device cuda --layers 12 --width 768 --heads 12 \
      --context 256 --batch 32 --microbatches 8 --stages "$stages" --steps 30 \
      --partition uniform >"$logs/train_$stages.log" 2>&1
    echo "train stages=$stages: rc=$? $(grep -E "^step +30 " "$logs/train_$stages.log" | tail -1)" \
      "$(grep -o "CRC-32C: [0-9a-f]*" "$logs/train_$stages.log" | tail -1)" >>"$logs/train.summary"
  done
) &
train_pid=$!
timeout -k 5 200 "$bin/train_gpt" --device cuda --layers 12 --width 768 --heads 12 \
  --context 256 --batch 8 --microbatches 1 --stages 1 --steps 20 --dtype bf16 --lr 3e-4 \
  >"$logs/parity_cuda.log" 2>&1 &
parity_pid=$!

wait "$cuda_pid"
echo "cuda (one process): rc=$? $(grep -E '^test cases|^All tests passed' "$logs/cuda.log" | tail -1)"
grep -E "FAILED|skipped: " "$logs/cuda.log" | sort | uniq -c | head -20
wait "$mutants_pid"
cat "$logs"/mutant_*.verdict
wait "$train_pid"
cat "$logs/train.summary"
wait "$parity_pid"
echo "parity cuda: rc=$?"
grep -E "^step" "$logs/parity_cuda.log"
echo "side-by-side checks done at ${SECONDS}s"
wait "${prewarm_pids[@]}"
echo "prewarm done at ${SECONDS}s: $(cat "$logs"/prewarm_*.log | grep -c ': done')" \
  "compiles, $(cat "$logs"/prewarm_*.log | grep -c ': failed') failed"

# The GPU to itself from here.
for batch in 8 32; do
  timeout -k 5 60 "$bin/gpu_gpt2" --modes bf16 --tied --vocab-multiple 64 --batch "$batch" \
    --profile >"$logs/profile_$batch.log" 2>&1
  echo "op timer at batch $batch: rc=$?"
done
llmc_flag=()
[[ $llmc != - ]] && llmc_flag=(--llmc "$(realpath "$llmc")")
for sweep in "bf16 8,32,16 default,reduce-overhead" "tf32 8,32,16 default"; do
  read -r mode batches compile_modes <<<"$sweep"
  ((SECONDS + 30 < deadline)) || { echo "sweep $mode: no time left"; continue; }
  PYTHONUNBUFFERED=1 timeout -k 5 "$(left)" python3 bench/gpu_gpt2_sweep.py --build "$bin" \
    --modes "$mode" --batches "$batches" --compile-modes "$compile_modes" "${llmc_flag[@]}" \
    >"$logs/sweep_$mode.log" 2>&1
  echo "sweep $mode: rc=$? at ${SECONDS}s"
  grep -E "^\| (bf16|tf32) " "$logs/sweep_$mode.log" | awk '!seen[$0]++'
done
