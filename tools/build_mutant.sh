#!/usr/bin/env bash
# Builds a mutant of one of BUILD_DIR's executables: SOURCE (a file of the library) edited by
# a sed expression, compiled with the flags BUILD_DIR compiled it with, and linked ahead of
# libpipit.a, so that the edited definitions win. For checking that a test fails when the
# feature it tests is broken, where the test runs only elsewhere (the [cuda] cases run on a
# lent GPU: pack the mutant with ../shared/tools/gpu_pack.sh beside the real executable).
#
# usage: bash tools/build_mutant.sh BUILD_DIR TARGET SOURCE SED_EXPRESSION NAME
#   e.g. bash tools/build_mutant.sh build pipit_tests tensor/cuda/cuda_backend.cpp \
#          's/float32_matmul_precision() == "high"/true/' pipit_tests_f32_as_tf32
# Writes BUILD_DIR/NAME; fails when the expression changes nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# == 5 ]] || {
  sed -n '2,11p' "$0"
  exit 2
}
build=$(realpath "$1")
target=$2 expression=$4 name=$5
source=$(realpath "$3")
work="$build/mutants/$name"
mkdir -p "$work"
mutant_source="$work/$(basename "$source")"
sed "$expression" "$source" >"$mutant_source"
if cmp -s "$source" "$mutant_source"; then
  echo "build_mutant: '$expression' changes nothing in $3" >&2
  exit 1
fi
# The compile command of the file, or of the unity batch that includes it, and what it compiles.
find_command='
import json, sys
entries, wanted = json.load(open(sys.argv[1])), sys.argv[2]
for entry in entries:
    path = entry["file"]
    if path == wanted or (path.endswith(".cxx") and f"#include \"{wanted}\"" in open(path).read()):
        print(path, entry["command"])
        break
else:
    sys.exit(f"build_mutant: {wanted} is not compiled in {sys.argv[1]}")
'
read -r compiled command < <(python3 -c "$find_command" "$build/compile_commands.json" "$source")
if [[ $compiled != "$source" ]]; then
  # A unity batch: compile a copy of it that includes the edited file instead.
  batch="$work/$(basename "$compiled")"
  sed "s#\"$source\"#\"$mutant_source\"#" "$compiled" >"$batch"
  command=${command//$compiled/$batch}
else
  command=${command//$source/$mutant_source}
fi
object="$work/mutant.o"
command=$(sed -E "s# -o [^ ]+# -o $object#" <<<"$command")
# Includes relative to the edited file's folder still resolve from the source tree.
(cd "$build" && eval "$command -I$(dirname "$source")")
link=$(cat "$build/CMakeFiles/$target.dir/link.txt")
link=${link/ libpipit.a/ $object libpipit.a}
link=$(sed -E "s# -o $target # -o $name #" <<<"$link")
(cd "$build" && eval "$link")
echo "build_mutant: $build/$name ($3: $expression)"
