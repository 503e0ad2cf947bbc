#!/usr/bin/env bash
# Installs the Debian packages tophat needs to build, test and run. Idempotent:
# when every package is already present it returns without touching apt.
set -euo pipefail

packages=(
  cmake ninja-build pkg-config g++ git
  libtorch-dev
  # Headers of the Gloo that LibTorch's c10d ships: the cloud's pipeline stages over CPUs.
  libgloo-dev
  # Without OpenBLAS LibTorch falls back to the reference BLAS, ~20x slower.
  libopenblas0-pthread
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev
  prometheus-cpp-dev libyaml-cpp-dev libsentencepiece-dev nlohmann-json3-dev
  libcpp-httplib-dev libcli11-dev libspdlog-dev libpcre2-dev
  catch2
  # The SLA plots of `tophat bench --ablation` (bench/cdf_plot.cc): cairo, text in DejaVu Sans.
  libcairo2-dev fonts-dejavu-core
  # deploy/make-certs.sh: the CA and certificates of the mutual-TLS links (demo and tests);
  # libcrypto's SHA-256 for the model fingerprint of `tophat split`.
  openssl libssl-dev
  # tests/openai_client_test.sh probes the agent's HTTP endpoint (the OpenAI client itself
  # comes from npm, with the machine's Node.js; without them that test is skipped).
  curl python3
  # deploy/fuzz.sh: libFuzzer, AddressSanitizer and UBSan come with Debian's clang.
  clang libclang-rt-14-dev
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
