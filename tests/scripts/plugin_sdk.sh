#!/usr/bin/env bash
# The plugin SDK as a plugin's author meets it (docs/side_tasks.md): `cmake --install` into a
# prefix inside the build tree, then the example plugin built out of the tree against that
# prefix alone, both ways the docs give (its CMake project with find_package(freeride), and the
# one g++ line), and each run by the installed `freeride` (a 2-rank pipeline under mpirun, the
# plugin in the installed worker on both stages: whichever stage waits more, a 1F1B stage 1
# waits for its first activation every step). Passes when both plugins did work in the bubbles
# and reported their result.
#   tests/scripts/plugin_sdk.sh --build DIR [--steps N]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$root/tests/scripts/common.sh"
build_and_steps "$root" 4 "$@"
work=$build/plugin_sdk_test
rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix
fail() { echo "FAIL: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" > "$work/install.log" ||
  { cat "$work/install.log" >&2; fail "cmake --install"; }
for f in bin/freeride bin/freeride_side_worker include/freeride-sdk/freeride/side_task.h \
         lib/cmake/freeride/freerideConfig.cmake share/freeride/examples/CMakeLists.txt; do
  [[ -e $prefix/$f ]] || fail "the install has no $f"
done
freeride=$prefix/bin/freeride
"$freeride" --version > /dev/null || fail "the installed freeride does not run"

# 1. The CMake way: the installed example project, nothing of the source tree on its paths.
examples=$prefix/share/freeride/examples
cmake -S "$examples" -B "$work/cmake_plugin" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release > "$work/cmake_plugin.log" 2>&1 &&
  cmake --build "$work/cmake_plugin" >> "$work/cmake_plugin.log" 2>&1 ||
  { cat "$work/cmake_plugin.log" >&2; fail "the example's CMake project did not build"; }
# 2. The one-line way.
g++ -std=c++20 -O2 -fPIC -shared -I"$prefix/include/freeride-sdk" "$examples/collatz_plugin.cc" \
  -o "$work/libcollatz_gxx.so" || fail "the one-line g++ build failed"

prepare_corpus "$build/freeride" "$root" "$work/data" 512
for plugin in "$work/cmake_plugin/libcollatz_plugin.so" "$work/libcollatz_gxx.so"; do
  [[ -f $plugin ]] || fail "no $plugin"
  run=$work/run_$(basename "$plugin" .so)
  cat > "$work/run.toml" <<TOML
[run]
dir = "$run"
log_every = 1000
$(model_toml 64 64)
[data]
train = "$work/data/train_*.bin"
[train]
batch_size = 4
seq_len = 32
microbatches = 2
steps = $steps
[parallel]
pp = 2
[freeride]
enabled = true
[[side_tasks]]
type = "collatz"
plugin = "$plugin"
memory_limit = "64MiB"
[side_tasks.args]
chunk = 2000
TOML
  (cd "$work" && OMP_NUM_THREADS=1 mpirun -n 2 --oversubscribe --bind-to none "$freeride" train \
    --config "$work/run.toml") > "$run.log" 2>&1 ||
    { tail -30 "$run.log" >&2; fail "the installed freeride failed with $plugin"; }
  python3 - "$run"/side_tasks_rank00[01].jsonl <<'PY' || { tail -30 "$run.log" >&2; fail "$plugin"; }
import json, sys
tasks = [json.loads(line) for path in sys.argv[1:] for line in open(path)]
assert len(tasks) == 2, tasks
for task in tasks:
    assert task["type"] == "collatz" and task["isolation"] == "process", task
    assert "longest chain starts at" in task["summary"], task
    assert "data segment capped at" in task["memory_peak_note"], task
units = sum(task["units"] for task in tasks)
assert units > 0, f"no work in the bubbles: {tasks}"
print(f"{units:.0f} numbers in bubbles: {[task['summary'] for task in tasks]}")
PY
done
echo "plugin_sdk: the example plugin built against $prefix (CMake and g++) and ran in both"
