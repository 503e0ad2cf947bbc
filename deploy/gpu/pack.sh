#!/usr/bin/env bash
# Packs what the GPU check runs, from a build CI tested, into one compressed file to carry to
# a GPU server that has PyTorch but no package manager and no network:
#
#   bash deploy/gpu/pack.sh [--build-dir build/release] [--out FILE] [--max-mib 48]
#
# The bundle (tophat-gpu-bundle/ inside FILE, default build/tophat-gpu-bundle.tar.xz):
#   bin/     tophat, tophat-cloud, tophat-agent, tophat-bench-engine (stripped), the
#            SentencePiece plugin, and openssl (deploy/make-certs.sh needs it)
#   tests/   the GPU test programs (label gpu): kernels, runtime, pipeline, the serving cases
#   lib/     the Debian runtime libraries those need that a GPU server lacks (gRPC, protobuf,
#            Abseil, OpenSSL, ...; not glibc, libstdc++, LibTorch or CUDA's, which the server
#            has), each finding the others through $ORIGIN
#   toy-model/, configs/*.yaml, deploy/make-certs.sh, deploy/gpu/check.sh, bench/*.py, MANIFEST
# LibTorch is not in it: deploy/gpu/check.sh takes the server's own PyTorch (the same
# version, 2.11.0, whose libraries CI built and tested these binaries against).
# Nothing in the bundle names a path of the building machine: binaries lose their RUNPATH
# (they get $ORIGIN/../lib) and are checked for the source and build paths.
set -euo pipefail
cd "$(dirname "$0")/../.."
source_root="$PWD"

build_dir="build/release"
out="build/tophat-gpu-bundle.tar.xz"
max_mib=48
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --max-mib) max_mib="$2"; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "pack.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
build_dir=$(cd "$build_dir" && pwd)
for tool in patchelf strip xz readelf; do
  command -v "$tool" >/dev/null || { echo "pack.sh: $tool is missing (deploy/install-deps.sh installs it)" >&2; exit 1; }
done

programs=(tophat tophat-cloud tophat-agent tophat-bench-engine)
gpu_tests=(kernels/tophat_kernels_gpu_test models/runtime/tophat_runtime_gpu_test
           server/pipeline/tophat_pipeline_gpu_test server/tophat_server_gpu_test
           tests/tophat_serving_cuda_test
           tests/tophat_serving_cuda_staged_test)
for p in "${programs[@]}"; do
  [ -x "$build_dir/bin/$p" ] || { echo "pack.sh: $build_dir/bin/$p is not built" >&2; exit 1; }
done
for t in "${gpu_tests[@]}"; do
  [ -x "$build_dir/$t" ] || { echo "pack.sh: $build_dir/$t is not built (a build with CUDA: nvcc on the PATH)" >&2; exit 1; }
done
[ -f "$build_dir/toy-model/config.json" ] || {
  echo "pack.sh: no toy model in $build_dir/toy-model (tophat toy-model --out $build_dir/toy-model)" >&2; exit 1; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root="$stage/tophat-gpu-bundle"
mkdir -p "$root/bin" "$root/tests" "$root/lib" "$root/deploy/gpu" "$root/bench"

for p in "${programs[@]}"; do cp "$build_dir/bin/$p" "$root/bin/"; done
cp "$build_dir/bin/libtophat_spm_plugin.so" "$root/bin/"
for t in "${gpu_tests[@]}"; do cp "$build_dir/$t" "$root/tests/"; done
cp "$(command -v openssl)" "$root/bin/openssl"
cp -r "$build_dir/toy-model" "$root/toy-model"
# The adapter's record of the checkpoint it was distilled from, relative to the bundle.
sed -i "s|$build_dir/||g" "$root"/toy-model/*.json
cp deploy/make-certs.sh "$root/deploy/"
mkdir -p "$root/configs" && cp configs/*.yaml "$root/configs/"  # the templates
cp deploy/gpu/check.sh "$root/deploy/gpu/"
cp bench/hf_compare.py bench/random_checkpoint.py "$root/bench/"
# openssl's own configuration may be missing on the server; make-certs.sh needs none of it.
printf '# tophat-gpu-bundle: openssl needs no configuration for deploy/make-certs.sh\n' \
  >"$root/bin/openssl.cnf"

# The libraries the binaries need, less what every server has (glibc, the GCC runtime) and
# what PyTorch's wheel brings (LibTorch, its OpenMP, CUDA's libraries).
torch_lib=$(readelf -d "$build_dir/bin/tophat-cloud" | sed -n 's/.*R\(UN\)\{0,1\}PATH.*\[\(.*\)\]/\2/p' |
            tr ':' '\n' | grep '/torch/lib$' | head -1 || true)
provided_by_server='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libresolv\.|libutil\.|libstdc\+\+\.|libgcc_s\.|libgomp\.|libtorch|libc10|libcuda|libcudart|libcublas|libcudnn|libcufft|libcufile|libcurand|libcusolver|libcusparse|libnccl|libnvrtc|libnvJitLink|libnvToolsExt|libnvshmem|libcupti|libcaffe2|libshm)'
# check.sh reads the same list from the bundle, to see that nothing else came from the machine.
echo "$provided_by_server" >"$root/deploy/gpu/server-libraries.regex"
is_elf() { [ "$(head -c 4 "$1" | od -An -c | tr -d ' ')" = "177ELF" ]; }
declare -A wanted=()
for f in "$root"/bin/* "$root"/tests/*; do
  is_elf "$f" || continue
  while read -r name _ path _; do
    [ -n "$name" ] || continue
    if [[ "$name" =~ $provided_by_server ]]; then continue; fi
    if [ "$path" = "not" ] || [ -z "$path" ]; then
      echo "pack.sh: $f needs $name, which this machine cannot find" >&2; exit 1
    fi
    wanted["$name"]="$path"
  done < <(ldd "$f" | awk '/=>/ {print $1, $2, $3}')
done
for name in "${!wanted[@]}"; do
  cp -L "${wanted[$name]}" "$root/lib/$name"
done

# Stripped, their build-machine RUNPATH replaced: the programs find lib/ beside them, and
# the libraries one another; LibTorch comes from LD_LIBRARY_PATH (check.sh).
for f in "$root"/bin/* "$root"/tests/* "$root"/lib/*; do
  is_elf "$f" || continue
  strip --strip-debug "$f" 2>/dev/null || strip "$f"
  case "$f" in
    "$root"/lib/*) patchelf --set-rpath '$ORIGIN' "$f" ;;
    *) patchelf --set-rpath '$ORIGIN/../lib' "$f" ;;
  esac
done

commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
dirty=$(git status --porcelain --untracked-files=no 2>/dev/null | head -1)
torch_version=$(sed -n 's/.*PACKAGE_VERSION "\(.*\)".*/\1/p' \
  "$(dirname "$torch_lib")/share/cmake/Torch/TorchConfigVersion.cmake" 2>/dev/null || true)
{
  echo "commit ${commit}${dirty:+ (with uncommitted changes)}"
  echo "libtorch ${torch_version:-unknown}"
  echo "cuda_architectures $(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:STRING=//p' "$build_dir/CMakeCache.txt")"
  echo "files"
  (cd "$root" && find . -type f | sort | sed 's/^\.\//  /')
} >"$root/MANIFEST"

# No path of this machine inside: the sources, the build tree, the Python environment.
site=""
[ -n "$torch_lib" ] && site=$(dirname "$(dirname "$torch_lib")")
leaks=$(grep -rlaF -e "$source_root" -e "$build_dir" ${site:+-e "$site"} "$root" || true)
if [ -n "$leaks" ]; then
  echo "pack.sh: these files name a path of this machine:" >&2
  echo "$leaks" | sed "s|$stage/||" >&2
  for f in $leaks; do
    grep -aoE "($source_root|$build_dir${site:+|$site})[^[:space:][:cntrl:]\"]*" "$f" | sort | uniq -c | head -3 >&2
  done
  exit 1
fi

mkdir -p "$(dirname "$out")"
# xz -6 in blocks of 24 MiB, a thread per core: -9 made one block of the whole bundle, which
# one thread compressed (pack.sh took 100 s on a 2-core CI-sized VM, for 23 MiB); with -6 it
# takes 41 s, for 28 MiB.
tar -C "$stage" -cf - tophat-gpu-bundle | xz -6 -T0 >"$out.tmp"
mv "$out.tmp" "$out"
size=$(stat -c %s "$out")
echo "pack.sh: $out: $(( size / 1024 / 1024 )) MiB ($(du -sh "$root" | cut -f1) unpacked), commit ${commit}${dirty:+ (dirty)}, ${#wanted[@]} libraries"
if [ "$size" -gt $(( max_mib * 1024 * 1024 )) ]; then
  echo "pack.sh: the bundle is over the ${max_mib} MiB limit" >&2
  exit 1
fi
