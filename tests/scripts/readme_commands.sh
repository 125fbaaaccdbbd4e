#!/usr/bin/env bash
# The README's `build/freeride` commands, run as written on this CPU build, in a scratch copy of
# the checkout's configs: each must exit 0. Commands that need what an earlier step makes (a
# prepared corpus, a trained run, a GPU, a file of yours: RUN_DIR, JOB.toml, FILE, PREFIX...) are
# left to the quickstart and their own tests and listed as skipped; a README command that this
# script no longer recognises fails it, so the list stays true.
#   tests/scripts/readme_commands.sh [--build DIR]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$root/tests/scripts/common.sh"
build_and_steps "$root" 0 "$@"
build=$(cd "$build" && pwd)
work=$(mktemp -d /tmp/freeride_readme.XXXXXX)
trap 'rm -rf "$work"' EXIT
cp -r "$root/configs" "$work/configs"
mkdir -p "$work/build" "$work/docs"
ln -s "$build/freeride" "$work/build/freeride"
ln -s "$build/freeride_side_worker" "$work/build/freeride_side_worker" 2>/dev/null || true

# The README's code lines that start with build/freeride, continuation lines joined, comments cut.
mapfile -t commands < <(python3 - "$root/README.md" <<'PY'
import re, sys
lines, joined, inside = open(sys.argv[1]).read().split("\n"), [], False
for line in lines:
    if line.startswith("```"):
        inside = not inside
        continue
    if not inside:
        continue
    code = re.sub(r"\s+#.*$", "", line).rstrip()
    if joined and joined[-1].endswith("\\"):
        joined[-1] = joined[-1][:-1].rstrip() + " " + code.strip()
    elif code.startswith("build/freeride"):
        joined.append(code)
for c in joined:
    print(c)
PY
)
((${#commands[@]} > 10)) || { echo "readme_commands: found only ${#commands[@]} commands" >&2; exit 1; }
ran=0 skipped=0
for c in "${commands[@]}"; do
  case $c in
    # Need a prepared corpus, a trained run or a GPU (the quickstart, report and GPU tests run them).
    "build/freeride train"*|"build/freeride study"*|"build/freeride report"*|\
    "build/freeride sample"*|"build/freeride eval"*|"build/freeride checkpoint"*|\
    "build/freeride prepare"*|"build/freeride submit"*|"build/freeride jobs"*|\
    "build/freeride cancel"*|"build/freeride export"*|"build/freeride import"*|\
    "build/freeride COMMAND"*|"build/freeride config check"*)
      echo "skipped: $c"; skipped=$((skipped + 1)); continue ;;
  esac
  # Optional parts shown in brackets are left out, as a user copying the line would.
  run=$(sed -E 's/ \[[^]]*\]\.\.\.//g; s/ \[[^]]*\]//g' <<<"$c")
  echo "running: $run"
  if ! (cd "$work" && eval "timeout 600 $run" > "$work/out.txt" 2>&1); then
    echo "readme_commands: failed on a CPU-only build: $run" >&2
    tail -20 "$work/out.txt" >&2
    exit 1
  fi
  ran=$((ran + 1))
done
echo "readme_commands: $ran README commands ran, $skipped need a run, data or a GPU"
