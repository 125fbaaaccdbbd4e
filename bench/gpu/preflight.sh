#!/usr/bin/env bash
# GPU procedure, step 1: what the machine is. nvidia-smi and the driver, g++, CMake, ninja,
# python3 and glibc versions (the kit needs glibc 2.36 or newer), where the CUDA, cuDNN and
# NCCL libraries are (toolkit, loader cache, pip wheels), PyTorch, and the loader's check
# (`ldd`) of every binary of the build when there is one.
# Estimate: 1 minute (no build, no GPU work). Usage: bench/gpu/preflight.sh OUT_DIR [--dry-run]
# (GPU_EXPECTED=0: a machine known to have no GPU, as bench/gpu_rehearsal.sh's root.)
step=preflight
estimate_s=60
source "$(dirname "$0")/common.sh"
rc=0
load_kit

say "machine"
uname -a
echo "cores $(nproc)"
free -g | head -2
if [[ $dry_run == 1 ]]; then
  say "dry run: nvidia-smi skipped"
elif [[ ${GPU_EXPECTED:-1} == 0 ]]; then
  say "GPU_EXPECTED=0 (the rehearsal's root): nvidia-smi skipped"
else
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv || rc=1
  nvidia-smi || true
fi

say "tools"
for tool in g++ cmake ninja python3 pkg-config mpirun nvcc compute-sanitizer; do
  path=$(command -v "$tool" || PATH=$PATH:/usr/local/cuda/bin command -v "$tool" || true)
  printf '%-18s %s\n' "$tool" "${path:-NOT FOUND}"
done
g++ --version | head -1
cmake --version | head -1
glibc=$(ldd --version | head -1 | grep -o '[0-9]\+\.[0-9]\+$')
echo "glibc $glibc"
if [[ $(printf '%s\n2.36\n' "$glibc" | sort -V | head -1) != 2.36 ]]; then
  say "glibc $glibc is older than 2.36: the kit's Debian 12 libraries will not load"
  rc=1
fi
PATH=$PATH:/usr/local/cuda/bin nvcc --version | tail -2 || true

say "CUDA-side libraries"
ldconfig -p | grep -E 'libcudart|libcublasLt|libcudnn\.|libnccl' || echo "(none in the loader cache)"
for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu; do
  ls "$dir" 2>/dev/null | grep -E '^lib(cudart|cublasLt|cudnn|nccl)\.so' | sed "s|^|$dir/|"
done
python3 - <<'PY' || true
import glob, site, sys
sites = site.getsitepackages() + [site.getusersitepackages()]
found = [p for s in sites for p in glob.glob(s + "/nvidia/*/lib/lib*.so*")
         if any(k in p for k in ("cudnn", "nccl", "cublas", "cudart"))]
print("\n".join(sorted(found)) or "(no NVIDIA pip wheels)")
PY
env -u LD_LIBRARY_PATH python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "devices", torch.cuda.device_count())' ||
  echo "PyTorch: not importable (bench.sh needs it for the reference)"

say "loader check of every binary in $build"
if [[ -d $build ]]; then
  missing=0
  checked=0
  while IFS= read -r binary; do
    checked=$((checked + 1))
    if ldd "$binary" | grep -q 'not found'; then
      echo "$binary:"
      ldd "$binary" | grep 'not found'
      missing=1
    fi
  done < <(find "$build" -maxdepth 3 -type f -perm -u+x ! -path '*/CMakeFiles/*' |
           while IFS= read -r f; do [[ $(head -c 4 "$f" | tail -c 3) == ELF ]] && echo "$f"; done)
  if [[ $missing == 0 ]]; then
    echo "$checked binaries: the libraries of every one resolve"
  else
    rc=1
  fi
  # cuBLAS(Lt), NCCL and cuDNN are opened at their first call (core/cuda_lazy_libs.cc), which
  # ldd cannot see: `version` opens each one (a missing one is named, and the command fails).
  if [[ -x $build/freeride ]]; then "$build/freeride" version || rc=1; fi
else
  echo "no build yet (bench/gpu/build.sh makes it)"
fi
finish $rc
