#!/usr/bin/env bash
# The tree as docs/ARCHITECTURE.md and the folder READMEs describe it: every folder of sources
# has a README and is named in ARCHITECTURE.md's layout table, no source file passes 600 lines,
# and inside trainer/ an include only ever points down its floors (config/ and data/ at the
# bottom, the fill-job queue (jobs/) above them, the training run above that, study/ and report/
# above the run, cli/ on top), and no tracked file points outside the project.
# Usage: tests/scripts/layout_check.sh [REPO_ROOT]
set -uo pipefail
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root" || exit 2
arch=docs/ARCHITECTURE.md
failures=0
fail() {
  echo "layout_check: $*" >&2
  failures=$((failures + 1))
}

# Sources as git knows them where there is a checkout. A copy without git (a tarball, the GPU
# machine's copy, the rehearsal's root) falls back to find, leaving out what is not the project's
# sources: every build directory (whatever its name: build-gpu/ holds generated protobuf code),
# the carried GPU kit and data (npm packages hold headers).
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  sources=$(git ls-files '*.cc' '*.h' '*.cu' '*.cuh' '*.cc.in')
else
  pruned=(-path ./.git -o -path ./.gpu-kit -o -path ./data -o -name node_modules)
  while IFS= read -r dir; do
    pruned+=(-o -path "$dir")
  done < <(find . -name CMakeCache.txt -printf '%h\n')
  sources=$(find . \( "${pruned[@]}" \) -prune -o -type f \( -name '*.cc' -o -name '*.h' \
    -o -name '*.cu' -o -name '*.cuh' -o -name '*.cc.in' \) -print | sed 's#^\./##')
fi
[[ -n $sources ]] || { echo "layout_check: no sources under $root" >&2; exit 2; }

# 1. The layout table names each folder of sources (tests/ aside: its layout follows the rooms
# it tests): a top-level folder as its own row, one inside it as `sub/` in its parent's row.
# Top-level folders and trainer/'s rooms have a README saying what lives there and what it may
# depend on.
for dir in $(printf '%s\n' $sources | xargs -n1 dirname | sort -u); do
  [[ $dir == tests* || $dir == . ]] && continue
  [[ $dir != */* || $dir == trainer/* ]] && [[ ! -f $dir/README.md ]] && fail "$dir/ has no README.md saying what lives there"
  top=${dir%%/*}
  row=$(grep -E "^\| \`?$top/\`? \|" "$arch")
  if [[ -z $row ]]; then
    fail "$arch: the layout table has no row for $top/"
  elif [[ $dir != "$top" ]]; then
    sub=${dir#"$top"/}
    grep -qF "\`$sub/" <<<"$row" || grep -qF "$dir/" <<<"$row" ||
      fail "$arch: the $top/ row does not name its room \`$sub/\`"
  fi
done

# 2. No source file over 600 lines.
for f in $sources; do
  n=$(wc -l <"$f")
  ((n > 600)) && fail "$f has $n lines (at most 600: split it along a seam)"
done

# 3. trainer/'s floors: what each room may include from trainer/.
floor() {
  case $1 in
    trainer/config/* | trainer/data/*) echo 0 ;;
    trainer/jobs/*) echo 1 ;;
    trainer/study/* | trainer/report/*) echo 3 ;;
    trainer/cli/*) echo 4 ;;
    trainer/*) echo 2 ;;
  esac
}
for f in $(printf '%s\n' $sources | grep '^trainer/'); do
  from=$(floor "$f")
  while IFS= read -r inc; do
    to=$(floor "$inc")
    [[ -z $to ]] && continue
    if ((to > from)) || { ((to == from)) && [[ ${inc%/*} != "${f%/*}" ]] && ((from != 2)); }; then
      fail "$f includes $inc: an include in trainer/ points only down its floors ($arch)"
    fi
  done < <(sed -n 's/^#include "\(trainer\/[^"]*\)".*/\1/p' "$f")
done

# 4. The project stands on its own: no tracked file (docs, READMEs, scripts, code comments) sends
# its reader to a file outside it, such as the shared folder beside the checkout or the design
# notes kept there; what a reader needs from them is written in docs/.
outside='\.\./shared|DESIGN( §|\.md)'
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  hits=$(git grep -InE "$outside" -- . ':!tests/scripts/layout_check.sh')
else
  hits=$(grep -rInE "$outside" --exclude=layout_check.sh --exclude-dir=.git --exclude-dir=.gpu-kit \
    --exclude-dir=data --exclude-dir=node_modules --exclude-dir='build*' . | sed 's#^\./##')
fi
while IFS= read -r hit; do
  [[ -n $hit ]] && fail "${hit%%:*:*}:$(cut -d: -f2 <<<"$hit"): points outside the project" \
    "(write what it needs in docs/ instead): $(cut -d: -f3- <<<"$hit" | sed 's/^ *//' | cut -c1-80)"
done <<<"$hits"

if ((failures > 0)); then
  echo "layout_check: $failures problem(s)" >&2
  exit 1
fi
echo "layout_check: $(printf '%s\n' $sources | wc -l) sources, every room described, floors kept"
