#!/usr/bin/env bash
# Layer remapping, the reference scenario: a 24-layer GPT (embedding, 21 blocks, final norm,
# head) on 2 stages, 12 layers each; after step 20 stage 1 hands its first 3 layers to stage
# 0 (15 and 9 layers from then on) and training goes on. Trained three times: without the
# remap, with it in threads, and with it across two pipit-worker processes (the layers travel
# from worker to worker). All three must end with the same weights, bit for bit.
# Extra arguments go to every train_gpt run (e.g. --steps 100).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh >/dev/null
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target pipit-worker train_gpt >/dev/null

run_dir=$(mktemp -d)
source samples/local_workers.sh
trap cleanup_workers EXIT

model=(--layers 21 --width 64 --heads 4 --context 32 --batch 8 --steps 40 --partition uniform
       --print-every 10 --sample 0 --threads 1)
checksum() { grep -o 'weights CRC-32C: [0-9a-f]*' "$1" | awk '{print $3}'; }

echo "=== without a remap ==="
./build/train_gpt "${model[@]}" "$@" | tee "$run_dir/plain.out"
echo "=== stage 1 hands 3 layers to stage 0 after step 20, in threads ==="
./build/train_gpt "${model[@]}" --remap 20:1:0:3 "$@" | tee "$run_dir/threads.out"

start_workers 2 --runs 1
echo "=== the same across two worker processes ($workers) ==="
./build/train_gpt "${model[@]}" --remap 20:1:0:3 --workers "$workers" "$@" |
  tee "$run_dir/workers.out"

plain=$(checksum "$run_dir/plain.out")
threads=$(checksum "$run_dir/threads.out")
workers_sum=$(checksum "$run_dir/workers.out")
echo "weights CRC-32C: no remap $plain, remap in threads $threads, remap across workers $workers_sum"
if [[ "$plain" == "$threads" && "$plain" == "$workers_sum" ]]; then
  echo "remap: the three runs trained the same weights, bit for bit"
else
  echo "remap: the runs differ"
  exit 1
fi
