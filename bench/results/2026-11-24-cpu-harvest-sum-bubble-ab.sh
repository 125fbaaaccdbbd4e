#!/usr/bin/env bash
# A/B of the harvest study on 2 bound ranks: old build (e100cbc, before the sum-bubble fix) and
# new build, alternating, same machine, same config.
set -euo pipefail
cd /work/main
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for round in 1 2; do
  for which in old new; do
    build=/work/main/build; [[ $which == old ]] && build=/tmp/ci1/build
    dir=/tmp/exp/study_${which}_$round; rm -rf "$dir"
    echo "== $(date -u +%T) $which ($build, $(git -C "$(dirname "$build")" rev-parse --short HEAD)) round $round"
    BUILD_DIR=$build launch/run.sh -n 2 --study configs/tiny_cpu_pp2_freeride.toml \
      --set run.dir="$dir" --set eval.every=0 --rounds 8 --block_steps 4 > "$dir.log" 2>&1
    sed -n '/^| arm/,/^$/p' "$dir/study.md"
    grep -E "^Noise floor" "$dir/study.md"
  done
done
