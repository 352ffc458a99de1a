#!/usr/bin/env bash
# Check a report in a real browser, then screenshot it.
#   recipes/screenshot_report.sh REPORT_DIR OUT.png [WIDTH]
# 1. Opens REPORT_DIR/index.html in headless Chromium (offline flags, throwaway profile) and reads back the
#    DOM after the scripts ran: the page records how many plotly figures rendered and how many script errors
#    happened; Chromium's console log is scanned for errors too.
# 2. Saves a full-page screenshot (WIDTH px wide, default 1400) to OUT.png.
# Exit status: 0 all figures rendered without errors; 1 a check failed; 2 usage; 3 no Chromium.
# Chromium: `apt-get install -y chromium` (Debian), or point BROWSER_PATH at a Chrome/Chromium binary.
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 REPORT_DIR OUT.png [WIDTH]" >&2
  exit 2
fi
report_dir=$1 out=$2 width=${3:-1400}
page="$(cd "$report_dir" && pwd)/index.html"
[ -f "$page" ] || { echo "no index.html in $report_dir" >&2; exit 2; }
browser=${BROWSER_PATH:-$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)}
[ -n "$browser" ] || { echo "no Chromium found: apt-get install -y chromium, or set BROWSER_PATH" >&2; exit 3; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags=(--headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking
       --disable-component-update --disable-sync --hide-scrollbars --virtual-time-budget=20000)

# 1. load, let the scripts run, dump the DOM; console messages go to stderr
"$browser" "${flags[@]}" --user-data-dir="$work/profile1" --enable-logging=stderr --v=0 \
  --window-size="$width,1200" --dump-dom "file://$page" >"$work/dom.html" 2>"$work/console.log" || true
attr() { grep -o "data-$1=\"[0-9]*\"" "$work/dom.html" | head -n1 | grep -o '[0-9]\+' || echo ""; }
total=$(attr figures-total) rendered=$(attr figures-rendered) js_errors=$(attr js-errors) height=$(attr page-height)
console_errors=$(grep -E 'CONSOLE' "$work/console.log" | grep -ciE 'error|uncaught|failed' || true)
echo "figures rendered: ${rendered:-?}/${total:-?}, script errors: ${js_errors:-?}, console errors: $console_errors," \
     "page height: ${height:-?} px"
status=0
if [ -z "$total" ] || [ -z "$rendered" ] || [ -z "$js_errors" ]; then
  echo "FAIL: the page's check script did not run (is this a dspark-bench report?)"; status=1
elif [ "$rendered" != "$total" ] || [ "$js_errors" != "0" ] || [ "$console_errors" != "0" ]; then
  echo "FAIL: a figure did not render or a script error happened"; status=1
fi
[ "$console_errors" = "0" ] || grep -E 'CONSOLE' "$work/console.log" | head -n 20

# 2. full-page screenshot (Chromium caps very tall windows; 16000 px is plenty for a report)
height=${height:-4000}
[ "$height" -le 16000 ] || height=16000
"$browser" "${flags[@]}" --user-data-dir="$work/profile2" --window-size="$width,$height" \
  --screenshot="$(realpath -m "$out")" "file://$page" >/dev/null 2>"$work/shot.log" || true
if [ ! -s "$out" ]; then
  echo "FAIL: no screenshot written"; tail -n 5 "$work/shot.log"; status=1
else
  echo "screenshot: $out (${width}x${height})"
fi
exit $status
