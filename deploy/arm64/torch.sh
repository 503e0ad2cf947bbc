#!/usr/bin/env bash
# LibTorch for the aarch64 cross build: the same PyTorch as every x86-64 build (2.11.0,
# deploy/requirements.txt), from its manylinux aarch64 wheel on the Python package index.
# That wheel is CUDA 13's (for Grace-Hopper servers), and its libtorch_cpu needs CUDA's
# runtime and CUPTI even on a CPU, so those two come from their aarch64 wheels too. Only
# what the agent links is unpacked (LibTorch's CPU library, c10, their BLAS/LAPACK, OpenMP
# and Arm Compute Library, headers and CMake version file; not libtorch_cuda's 400 MB) into
# ROOT/opt/torch-aarch64, which deploy/arm64/toolchain.cmake and cmake/find_torch.cmake read.
#
# Usage: bash deploy/arm64/torch.sh [--root DIR]   (default build/arm64-root)
# Downloads are kept in build/arm64-wheels (~430 MB); a second run unpacks nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."

root="build/arm64-root"
while [ $# -gt 0 ]; do
  case "$1" in
    --root) root="$2"; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "arm64/torch.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

torch_version=$(sed -n 's/^torch==\([0-9.]*\).*/\1/p' deploy/requirements.txt)
# The CUDA runtime and CUPTI that torch $torch_version's wheel pins (cuda-toolkit 13.0.2).
wheels=("torch==$torch_version" "nvidia-cuda-runtime==13.0.96" "nvidia-cuda-cupti==13.0.85")
dest="$root/opt/torch-aarch64"
stamp="$dest/.tophat-wheels"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "${wheels[*]}" ]; then
  echo "arm64/torch.sh: $dest is up to date (${wheels[*]})" >&2
  exit 0
fi

downloads="build/arm64-wheels"
mkdir -p "$downloads"
python="${TOPHAT_PYTHON:-$(bash deploy/python-env.sh --print)/bin/python3}"
for w in "${wheels[@]}"; do
  name="${w%%==*}"; version="${w##*==}"
  if ! ls "$downloads/${name//-/_}-${version}-"*aarch64*.whl >/dev/null 2>&1; then
    echo "arm64/torch.sh: downloading $w for aarch64" >&2
    # Two tries: a dropped download of 420 MB should not fail a fresh machine.
    for try in 1 2; do
      if "$python" -m pip download --disable-pip-version-check --progress-bar off -q --no-deps \
           --only-binary=:all: --python-version 3.11 --platform manylinux_2_28_aarch64 \
           --platform manylinux_2_27_aarch64 --platform manylinux_2_25_aarch64 --platform manylinux_2_17_aarch64 \
           --platform manylinux2014_aarch64 -d "$downloads" "$w"; then
        break
      fi
      [ "$try" = 2 ] && { echo "arm64/torch.sh: could not download $w" >&2; exit 1; }
    done
  fi
done

echo "arm64/torch.sh: unpacking LibTorch $torch_version (aarch64) into $dest" >&2
rm -rf "$dest"
mkdir -p "$dest"
unzip -q -o "$downloads"/torch-"$torch_version"-*aarch64*.whl -d "$dest" \
  'torch/include/*' 'torch/share/cmake/Torch/TorchConfigVersion.cmake' \
  'torch/lib/libtorch_cpu.so' 'torch/lib/libc10.so' 'torch/lib/libgomp.so.1' \
  'torch/lib/libgfortran.so.5' 'torch/lib/libarm_compute*.so' 'torch/lib/libnvpl_*'
for name in nvidia_cuda_runtime nvidia_cuda_cupti; do
  unzip -q -o "$downloads/$name"-*aarch64*.whl -d "$dest" 'nvidia/cu13/lib/*.so*'
done
echo "${wheels[*]}" >"$stamp"
echo "arm64/torch.sh: done: $(du -sh "$dest" | cut -f1) in $dest" >&2
