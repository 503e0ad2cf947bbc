#!/usr/bin/env bash
# Downloads the Debian packages tophat needs to build on a GPU server that has CUDA and
# PyTorch (whose LibTorch we use) but no apt and no network. Run it on a networked Debian 12
# machine; hand the folder to deploy/gpu/build.sh (or check.sh) with --debs DIR.
#
#   bash deploy/gpu/fetch-debs.sh [DIR]      (default DIR: .gpu-debs in the repository)
#
# It takes the dependency closure of the -dev packages deploy/install-deps.sh installs,
# less LibTorch (PyTorch brings its own, with CUDA) and less the C/C++ runtime every Linux
# has (glibc, libgcc, libstdc++): newer versions of those on the GPU server run these fine.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-.gpu-debs}"

wanted=(
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  prometheus-cpp-dev libyaml-cpp-dev libsentencepiece-dev nlohmann-json3-dev
  libcpp-httplib-dev libcli11-dev libspdlog-dev libpcre2-dev catch2 libgloo-dev
  pkgconf  # the GPU server may have no pkg-config
)
# The runtime the server's own (newer) system provides; a second copy would clash.
skip='^(libc6|libc6-dev|libc-dev-bin|gcc-[0-9]+-base|libgcc-s1|libstdc\+\+6|linux-libc-dev|libcrypt1|libcrypt-dev|libnsl-dev|libnsl2|libtirpc-common|libtirpc-dev|libtirpc3|rpcsvc-proto)$'

if ! command -v apt-get >/dev/null; then
  echo "fetch-debs: needs a Debian machine with apt-get" >&2
  exit 1
fi
mkdir -p "$out"
closure=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
            --no-breaks --no-replaces --no-enhances "${wanted[@]}" |
          grep -v '^ ' | grep -v '^<' | sort -u | grep -Ev "$skip")
if [ -z "$closure" ]; then
  echo "fetch-debs: apt-cache found no packages; run 'apt-get update' first" >&2
  exit 1
fi
count=$(echo "$closure" | wc -l)
echo "fetch-debs: downloading $count packages into $out" >&2
(cd "$out" && apt-get download $closure >/dev/null)
echo "fetch-debs: $(ls "$out"/*.deb | wc -l) packages, $(du -sh "$out" | cut -f1) in $out" >&2
