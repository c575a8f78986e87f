#!/usr/bin/env bash
# Builds pipit and trains the Tree-LSTM sample with automatic batching (samples/tree_lstm.cpp)
# on trees it generates itself. Extra arguments go to tree_lstm (e.g. --strategy depth).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh >/dev/null
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target tree_lstm
./build/tree_lstm "$@"
