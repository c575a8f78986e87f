#!/usr/bin/env bash
# Trains the demo GPT across 4 pipit-worker processes on this machine (127.0.0.1), one stage
# each, and prints the same progress lines as the in-process demo. Extra arguments go to
# train_gpt (e.g. --steps 100 --schedule interleaved --vpp 2 --microbatches 8).
# The workers listen on ephemeral ports, share a freshly made token, and are stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh >/dev/null
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target pipit-worker train_gpt

run_dir=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$run_dir"
}
trap cleanup EXIT

head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$run_dir/token"
endpoints=()
for i in 0 1 2 3; do
  ./build/pipit-worker --listen 127.0.0.1:0 --port-file "$run_dir/port$i" \
    --token-file "$run_dir/token" --threads 1 2>"$run_dir/worker$i.log" &
  pids+=($!)
done
for i in 0 1 2 3; do
  for _ in $(seq 100); do [[ -s "$run_dir/port$i" ]] && break; sleep 0.1; done
  [[ -s "$run_dir/port$i" ]] || { echo "worker $i did not start:"; cat "$run_dir/worker$i.log"; exit 1; }
  endpoints+=("127.0.0.1:$(cat "$run_dir/port$i")")
done
workers=$(IFS=,; echo "${endpoints[*]}")
echo "run_distributed: 4 workers at $workers"
./build/train_gpt --workers "$workers" --token-file "$run_dir/token" --threads 1 "$@"
