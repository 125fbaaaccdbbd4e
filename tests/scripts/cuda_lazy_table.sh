#!/usr/bin/env bash
# Every cuBLAS, cuBLASLt, NCCL and cuDNN function the sources call has its entry in
# core/cuda_lazy_libs.cc, the table through which a CUDA build opens those libraries at their
# first call: a function called but missing there is an undefined symbol when the nvcc build
# links `freeride`, which no other build sees (ncclReduce and ncclBroadcast, called by ZeRO-1
# over NCCL, broke that link once). The CUDA driver API (cu*) is called nowhere: the runtime is
# linked statically and opens the driver itself, so a driver call would be a symbol no build
# links either. Runs on any machine (it reads the sources; no CUDA needed). Before it trusts a
# clean result it checks itself: the table with one called function's entry deleted must be
# reported as missing that function.
# Usage: tests/scripts/cuda_lazy_table.sh [REPO_ROOT]
set -uo pipefail
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root" || exit 2
table=core/cuda_lazy_libs.cc
[[ -f $table ]] || { echo "cuda_lazy_table: no $table under $root" >&2; exit 2; }

# The project's C++ and CUDA sources but the table itself and the emulation layer (its own
# cuBLAS(Lt) and NCCL, with their own definitions, and its suites, built only against it),
# comments stripped: a comment naming a function calls nothing.
source_files() {
  find core models pipeline freeride trainer bench tests -type f \
    \( -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) \
    ! -path "$table" ! -path 'models/cuda/emulation/*' ! -path 'tests/emulation/*' -print0
}
sources() { source_files | xargs -0 sed -e 's#//.*$##'; }
# Names followed by "(", one a line, sorted and unique, from the text on stdin.
called() { grep -oE "\\b$1[A-Z][A-Za-z0-9_]*[[:space:]]*\\(" | tr -d '( \t' | sort -u; }
# The functions a table defines: the name each FR_LAZY / FR_LAZY_AS body looks up.
defined() {
  grep -oE 'FR_LAZY(_AS)?\([a-z_]+, *[A-Za-z0-9_]+' "$1" | sed -E 's/.*, *//' | sort -u
}
# The functions called but not in TABLE, one a line.
missing() { comm -23 <(sources | called '(cublas|nccl|cudnn)') <(defined "$1"); }

calls=$(sources | called '(cublas|nccl|cudnn)')
if ! grep -q '^nccl' <<<"$calls" || ! grep -q '^cublasLt' <<<"$calls"; then
  echo "cuda_lazy_table: found no NCCL or cuBLASLt call in the sources; the search is broken:" \
    "$calls" >&2
  exit 1
fi
# The self-check: the first NCCL function called, its entry deleted from a copy of the table.
probe=$(grep -m1 '^nccl' <<<"$calls")
copy=$(mktemp)
trap 'rm -f "$copy"' EXIT
grep -vE "FR_LAZY(_AS)?\\([a-z_]+, *$probe\\b" "$table" > "$copy"
added=$(comm -13 <(missing "$table") <(missing "$copy"))
if [[ $added != "$probe" ]]; then
  echo "cuda_lazy_table: with $probe's entry deleted, the check newly reported" \
    "'$(tr '\n' ' ' <<<"$added")' instead of $probe alone" >&2
  exit 1
fi

failures=0
while read -r name; do
  [[ -n $name ]] || continue
  where=$(source_files | xargs -0 grep -nE "\\b${name}[[:space:]]*\\(" |
    grep -vE '^[^:]+:[0-9]+:\s*//' | head -1 | cut -d: -f1-2)
  echo "cuda_lazy_table: $name is called ($where) but has no entry in $table (FR_LAZY)" >&2
  failures=$((failures + 1))
done <<<"$(missing "$table")"
driver=$(sources | called 'cu' | grep -E '^cu[A-Z][a-z]' || true)
if [[ -n $driver ]]; then
  echo "cuda_lazy_table: the CUDA driver API is called ($(tr '\n' ' ' <<<"$driver")), which" \
    "no build links (the static runtime opens the driver itself)" >&2
  failures=$((failures + 1))
fi
if ((failures > 0)); then
  echo "cuda_lazy_table: $failures failure(s)" >&2
  exit 1
fi
echo "cuda_lazy_table: the $(wc -l <<<"$calls") cuBLAS(Lt), NCCL and cuDNN functions called" \
  "all have their entry in $table"
