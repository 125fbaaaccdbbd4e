#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite. GPU-labelled tests are
# reported as skipped, with the reason, where no GPU is visible. Exit status is the suite's.
# Extra arguments go to ctest, e.g. `launch/test.sh -L gpu` or `launch/test.sh -R Config`.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$root/launch/install_deps.sh"
"$root/launch/build.sh"
"$root/launch/fetch_tokenizer.sh"
status=0
# Every entry has its own TIMEOUT (tests/CMakeLists.txt); 300 s is the bound of any without.
(cd "$build" && ctest --output-on-failure -j "$(nproc)" --timeout 300 "$@") || status=$?
# ctest does not print why a test skipped; the skipping suites say it on their first line.
log=$build/Testing/Temporary/LastTest.log
if [[ -f $log ]] && grep -q '^SKIPPED:' "$log"; then
  echo "Skipped tests said:"
  grep '^SKIPPED:' "$log" | sort | uniq -c | sed 's/^/  /'
fi
exit $status
