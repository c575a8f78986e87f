#!/usr/bin/env bash
# Opens a pipit-report page in headless Chromium and saves what it drew as a PNG: the check that
# the page renders in a real browser, offline (the README's picture of a run comes from here).
# Usage: tools/screenshot_report.sh REPORT.html OUT.png [WIDTH [HEIGHT]]
# Needs Debian's chromium: tools/install_deps.sh --with-chromium.
set -euo pipefail
if (($# < 2)); then
  echo "usage: tools/screenshot_report.sh REPORT.html OUT.png [WIDTH [HEIGHT]]" >&2
  exit 2
fi
page=$1
out=$2
width=${3:-900}
height=${4:-1250}
[[ -f $page ]] || { echo "screenshot_report: no page '$page'" >&2; exit 1; }
browser=$(command -v chromium || command -v chromium-browser || true)
if [[ -z $browser ]]; then
  echo "screenshot_report: chromium not found; run tools/install_deps.sh --with-chromium" >&2
  exit 1
fi
# --no-sandbox: Chromium refuses to run as root with its sandbox; the page is our own file.
"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run \
  --window-size="$width,$height" --screenshot="$(realpath -m "$out")" \
  "file://$(realpath "$page")" 2>/dev/null
[[ -s $out ]] || { echo "screenshot_report: chromium wrote no '$out'" >&2; exit 1; }
echo "screenshot_report: $out (${width}x${height})"
