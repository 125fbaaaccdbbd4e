#!/usr/bin/env bash
# The GPU machine rehearsed on this one: a minimal Debian 12 root (debootstrap --variant=minbase)
# holding only what the GPU image holds (g++, CMake, ninja, python3; this machine's
# /usr/local/cuda bind-mounted read-only) plus the gpu-kit (GPU_KIT, the folder holding its
# collect-debs.sh and unpack-debs.sh, docs/training.md#the-gpu-procedure: its packages
# collected here with apt, unpacked there by unpack-debs.sh), and in it, from a fresh clone of
# this checkout's HEAD, the GPU procedure's own steps: bench/gpu/build.sh (the CUDA tree,
# sm_90), bench/gpu/preflight.sh (its loader check of every binary) and the CPU test suite
# (ctest -LE gpu) of that build. It proves the kit is complete. Not part of CI (about an hour on
# 2 cores); run it before a GPU run and whenever a dependency changes, and record its result in
# bench/RESULTS.md.
# Needs root, apt, debootstrap and network access to a Debian mirror.
# Usage: GPU_KIT=DIR bench/gpu_rehearsal.sh [--incremental] [OUT_DIR=bench/results]
#        [ROOTFS=/var/tmp/freeride-rehearsal]
#        (TESTS="ctest arguments" picks the tests, default -LE gpu)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
incremental=0
if [[ ${1:-} == --incremental ]]; then
  incremental=1
  shift
fi
out=${1:-$root/bench/results}
rootfs=${2:-/var/tmp/freeride-rehearsal}
kit=${GPU_KIT:-}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
tests=${TESTS:--LE gpu}
mkdir -p "$out"
out=$(cd "$out" && pwd)
log=$out/$(date +%F)-gpu-rehearsal.log
exec > >(tee "$log") 2>&1
started=$SECONDS
say() { echo "== [rehearsal +$((SECONDS - started))s] $*"; }
say "$(date -u +%FT%TZ) commit $(git -C "$root" rev-parse --short HEAD) on $(hostname), $(nproc) cores"
[[ -n $kit && -x $kit/collect-debs.sh && -x $kit/unpack-debs.sh ]] || {
  say "GPU_KIT='$kit' is not the gpu-kit (a folder holding collect-debs.sh and unpack-debs.sh)"
  exit 2
}
[[ -d /usr/local/cuda ]] || { say "no /usr/local/cuda to bind"; exit 1; }

# 1. The root: what the GPU image holds and nothing more (made once, reused).
if [[ ! -f $rootfs/.made ]]; then
  say "debootstrap bookworm (minbase + g++ cmake ninja-build python3) into $rootfs"
  rm -rf "$rootfs"
  debootstrap --variant=minbase --include=g++,cmake,ninja-build,python3 bookworm "$rootfs" \
    "$mirror" >"$out/rehearsal-debootstrap.log" 2>&1 ||
    { say "debootstrap failed: $out/rehearsal-debootstrap.log"; exit 1; }
  touch "$rootfs/.made"
else
  say "reusing the root $rootfs"
fi

# 2. A fresh clone of HEAD and the kit beside it, as a GPU run carries them. --incremental
# moves the previous clone to HEAD instead, so that its build-gpu/ rebuilds only what changed.
work=$rootfs/work/freeride
mkdir -p "$rootfs/usr/local/cuda" "$rootfs/out"
if [[ $incremental == 1 && -d $work/.git ]]; then
  git -C "$work" fetch -q "$root" HEAD && git -C "$work" reset -q --hard FETCH_HEAD
  say "moved the previous clone to $(git -C "$work" rev-parse --short HEAD) (incremental)"
else
  rm -rf "$rootfs/work"
  mkdir -p "$rootfs/work"
  git clone -q --no-local "$root" "$work"
  say "cloned $(git -C "$work" rev-parse --short HEAD) into the root"
fi
rm -rf "$work/.gpu-kit"
# The prepared data a GPU run carries (the tokenizer's ranks; the KJV shards where made).
if [[ -d $root/data ]]; then
  mkdir -p "$work/data"
  cp -r "$root/data/." "$work/data/"
  say "carried data/: $(ls "$root/data" | tr '\n' ' ')"
else
  say "no data/ here (launch/prepare_data.sh): the tests that read the tokenizer will fail"
fi
say "collecting the kit (collect-debs.sh)"
apt-get update -q >/dev/null
# What the project needs beyond the kit's own list (Boost.Math's and CLI11's headers, protobuf).
# shellcheck disable=SC2046  # one package a word
"$kit/collect-debs.sh" "$work/.gpu-kit/debs" $(sed 's/#.*//' "$root/bench/gpu/kit-extras")
cp "$kit/unpack-debs.sh" "$work/.gpu-kit/"

# 3. In the root, in a mount namespace of its own (nothing stays mounted): /usr/local/cuda
# read-only, then the GPU procedure's steps with budgets wide enough for 2 cores.
say "into the root"
inner=$(cat <<'INNER'
set -uo pipefail
export PATH=/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root GPU_STEP_BUDGET_S=14400
# As bench/gpu/common.sh does where there is no ssh (the root has none): OpenMPI's local launcher.
command -v ssh >/dev/null || export OMPI_MCA_plm=isolated
cd /work/freeride
rc=0
bench/gpu/build.sh /out || exit 1
# After the build, so that its loader check covers every binary against the kit alone.
GPU_EXPECTED=0 bench/gpu/preflight.sh /out || rc=1
eval "$(.gpu-kit/unpack-debs.sh .gpu-kit/debs /tmp/freeride-kit)"
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH//openblas-pthread/openblas-openmp}  # as load_kit does
start=$SECONDS
ctest --test-dir build-gpu $TESTS --timeout 900 --output-on-failure >/out/ctest.log 2>&1 || rc=1
tail -25 /out/ctest.log
echo "ctest: $((SECONDS - start))s"
exit $rc
INNER
)
rc=0
unshare -m -- bash -c '
  set -e
  rootfs=$1; inner=$2; tests=$3
  mount --bind /usr/local/cuda "$rootfs/usr/local/cuda"
  mount -o remount,bind,ro "$rootfs/usr/local/cuda"
  mount -t proc proc "$rootfs/proc"
  mount -t sysfs sys "$rootfs/sys"
  mount --rbind /dev "$rootfs/dev"
  mount -t tmpfs tmpfs "$rootfs/tmp"
  mkdir -p "$rootfs/dev/shm" && mount -t tmpfs shm "$rootfs/dev/shm"
  TESTS=$tests chroot "$rootfs" /usr/bin/env -i TESTS="$tests" FREERIDE_COMMIT="$4" \
    bash -c "$inner"
' rehearsal "$rootfs" "$inner" "$tests" "$(git -C "$root" rev-parse --short HEAD)" || rc=$?
# The steps' own logs (preflight, build, ctest) beside this one.
mkdir -p "$out/$(date +%F)-gpu-rehearsal"
cp "$rootfs"/out/* "$out/$(date +%F)-gpu-rehearsal/" 2>/dev/null || true
say "done: exit $rc in $((SECONDS - started))s; log $log"
exit $rc
