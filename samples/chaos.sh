#!/usr/bin/env bash
# A long chaos session for distributed training, then a long soak (tools/pipit-chaos.cpp):
#   bash samples/chaos.sh [--seed S] [--faults N] [--soak-steps K] [pipit-chaos flags...]
# The chaos part trains a tiny GPT with train_gpt over 3 pipit-worker processes on 127.0.0.1,
# injects N seeded faults (kills, stops, cut and corrupted connections, a full checkpoint
# disk), restarts what died, resumes from the last checkpoint and checks the final weights
# against an uninterrupted run bit for bit. The soak (K steps, default 5000; 0: none) checks
# that memory and descriptors stay flat. Both print figures for docs/RELIABILITY.md; every
# process they start is killed when they end. Run as root to include the full-disk fault
# (it mounts a small tmpfs). PIPIT_BUILD_DIR picks the build directory (default: build).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${PIPIT_BUILD_DIR:-build}
seed=1 faults=30 soak=5000 extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seed) seed=$2; shift 2 ;;
    --faults) faults=$2; shift 2 ;;
    --soak-steps) soak=$2; shift 2 ;;
    *) extra+=("$1"); shift ;;
  esac
done
if [[ ! -x "$build/pipit-chaos" ]]; then
  bash tools/install_deps.sh >/dev/null
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$build" -j"$(nproc)" --target pipit-chaos pipit-worker train_gpt >/dev/null

status=0
echo "=== chaos: seed $seed, $faults faults ==="
"$build/pipit-chaos" --seed "$seed" --faults "$faults" --steps $((faults * 6 + 20)) \
  ${extra[@]+"${extra[@]}"} || status=1
if [[ "$soak" -gt 0 ]]; then
  echo "=== soak: $soak steps ==="
  "$build/pipit-chaos" --soak-steps "$soak" --workers 3 || status=1
fi
exit $status
