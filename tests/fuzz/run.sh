#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/CMakeLists.txt: clang, AddressSanitizer and UBSan)
# into build-fuzz/ and runs each for SECONDS, as many at once as there are cores, from its seed
# corpus (tests/fuzz/corpus/TARGET/; what it finds new goes to build-fuzz/corpus/TARGET/, the
# tree's seeds are never changed).
# Prints one line per target (time, runs, coverage) and exits 1 when any target found a crash,
# a leak or undefined behaviour; the input that did is in build-fuzz/artifacts/.
#   tests/fuzz/run.sh SECONDS [TARGET...]      (FUZZ_BUILD_DIR overrides build-fuzz/)
# Line tables only (-g1; CMakeLists.txt says why) unless FREERIDE_DEBUG_INFO=full.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
if [[ $# -lt 1 || ! $1 =~ ^[0-9]+$ || $1 -lt 1 ]]; then
  echo "usage: tests/fuzz/run.sh SECONDS [TARGET...] (SECONDS: a whole number >= 1)" >&2
  exit 2
fi
seconds=$1
shift
build=${FUZZ_BUILD_DIR:-$root/build-fuzz}
cxx=${FUZZ_CXX:-$(command -v clang++ || command -v clang++-14 || true)}
[[ -n $cxx ]] || { echo "tests/fuzz/run.sh: clang++ not found (launch/install_deps.sh)" >&2; exit 2; }
generator=()
if command -v ninja >/dev/null && [[ ! -f $build/CMakeCache.txt ]]; then generator=(-G Ninja); fi
start=$(date +%s)
cmake -S "$root/tests/fuzz" -B "$build" "${generator[@]}" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFREERIDE_DEBUG_INFO="${FREERIDE_DEBUG_INFO:-lines}" > /dev/null
cmake --build "$build" -j "$(nproc)" > "$build/build.log" 2>&1 ||
  { tail -40 "$build/build.log" >&2; exit 1; }
echo "fuzz: built in $(($(date +%s) - start)) s"
targets=("$@")
if ((${#targets[@]} == 0)); then
  for dir in "$root"/tests/fuzz/corpus/*/; do targets+=("$(basename "$dir")"); done
fi
mkdir -p "$build/artifacts"
for t in "${targets[@]}"; do
  [[ -x $build/$t ]] || { echo "fuzz: no target $t" >&2; exit 2; }
done
# One target: runs it and writes its verdict line (and the finding) to $build/$t.verdict.
fuzz_one() {
  local t=$1 log=$build/$1.log rc=0 runs cov
  mkdir -p "$build/corpus/$t"
  # Leaks are findings too; each input gets 10 s and 2 GiB.
  (cd "$build" && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "./$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$build/artifacts/$t-" "$build/corpus/$t" "$root/tests/fuzz/corpus/$t" \
    > "$log" 2>&1) || rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  if ((rc != 0)); then
    {
      echo "fuzz: $t: FOUND a failure after ${runs:-?} runs (exit $rc):"
      grep -E 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error|SUMMARY' "$log" |
        head -5 | sed 's/^/  /'
      # The input itself too (small ones), so a finding on a machine that is gone can be rerun.
      for a in "$build/artifacts/$t-"*; do
        [[ -f $a ]] || continue
        echo "  input: $a"
        if (($(stat -c %s "$a") <= 4096)); then echo "  base64: $(base64 -w0 "$a")"; fi
      done
    } > "$build/$t.verdict"
    return 1
  fi
  echo "fuzz: $t: ${seconds} s, ${runs:-?} runs, coverage ${cov:-?} edges, nothing found" \
    > "$build/$t.verdict"
}
# As many targets at once as there are cores: each is one process, and CI's budget is wall time.
for t in "${targets[@]}"; do
  rm -f "$build/$t.verdict"
  while (($(jobs -rp | wc -l) >= $(nproc))); do wait -n || true; done
  fuzz_one "$t" &
done
wait
status=0
for t in "${targets[@]}"; do
  # A target that wrote no verdict ended without saying (killed): a failure too.
  cat "$build/$t.verdict" 2> /dev/null || echo "fuzz: $t: ended without a verdict"
  grep -q 'nothing found$' "$build/$t.verdict" 2> /dev/null || status=1
done
echo "fuzz: ${#targets[@]} targets in $(($(date +%s) - start)) s"
exit $status
