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
source samples/local_workers.sh
trap cleanup_workers EXIT

head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$run_dir/token"
start_workers 4 --token-file "$run_dir/token" --threads 1
echo "run_distributed: 4 workers at $workers"
./build/train_gpt --workers "$workers" --token-file "$run_dir/token" --threads 1 "$@"
