#!/usr/bin/env bash
# Builds pipit and runs the main demo: GPT training on text it generates itself.
# Extra arguments go to train_gpt (e.g. --data ../shared/data/tinyshakespeare.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target train_gpt
./build/train_gpt "$@"
