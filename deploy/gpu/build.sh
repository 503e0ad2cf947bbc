#!/usr/bin/env bash
# Builds tophat on a GPU server against PyTorch's CUDA LibTorch.
#
#   bash deploy/gpu/build.sh [--debs DIR] [--build-dir DIR] [--arch SM] [--target T]...
#
# --debs DIR: Debian packages from deploy/gpu/fetch-debs.sh, unpacked into a local prefix
#   (build/gpu-prefix; no root, nothing installed system-wide). Without it, the packages must
#   be installed already (deploy/install-deps.sh on a server with apt).
# --arch: CUDA architectures (default: the visible GPU's, else 90).
set -euo pipefail
cd "$(dirname "$0")/../.."

debs=""
build_dir="build/gpu"
arch=""
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --debs) debs="$2"; shift 2 ;;
    --build-dir) build_dir="$2"; shift 2 ;;
    --arch) arch="$2"; shift 2 ;;
    --target) targets+=(--target "$2"); shift 2 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

if [ -n "$debs" ]; then
  prefix="${TOPHAT_GPU_PREFIX:-$PWD/build/gpu-prefix}"
  stamp="$prefix/.unpacked"
  if [ ! -f "$stamp" ] || [ -n "$(find "$debs" -name '*.deb' -newer "$stamp" | head -1)" ]; then
    echo "build.sh: unpacking $(ls "$debs"/*.deb | wc -l) packages into $prefix" >&2
    rm -rf "$prefix" && mkdir -p "$prefix"
    for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$prefix" 2>/dev/null || {
      # No dpkg: a .deb is an ar archive holding data.tar.*.
      tmp=$(mktemp -d); (cd "$tmp" && ar x "$OLDPWD/$deb" && tar -xf data.tar.* -C "$prefix"); rm -rf "$tmp"; }
    done
    # Debian's absolute symlinks (libfoo.so -> /lib/...) must point into the prefix.
    find "$prefix" -type l -lname '/*' | while read -r link; do
      ln -sfn "$prefix$(readlink "$link")" "$link"
    done
    touch "$stamp"
  fi
  export TOPHAT_GPU_PREFIX="$prefix"
elif command -v apt-get >/dev/null; then
  bash deploy/install-deps.sh
fi
# shellcheck source=env.sh
source deploy/gpu/env.sh

if [ -z "$arch" ]; then
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.' || true)
  arch="${arch:-90}"
fi
prefix_path="$TORCH_CMAKE"
[ -n "${TOPHAT_GPU_PREFIX:-}" ] && [ -d "$TOPHAT_GPU_PREFIX/usr" ] && prefix_path="$prefix_path;$TOPHAT_GPU_PREFIX/usr"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S . -B "$build_dir" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_PREFIX_PATH="$prefix_path" \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DTOPHAT_CUDA=ON
cmake --build "$build_dir" -j "$(nproc)" "${targets[@]}"
