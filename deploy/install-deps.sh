#!/usr/bin/env bash
# Installs what tophat needs to build, test and run: Debian's packages (apt), then PyTorch's
# LibTorch and the Python test tools (deploy/requirements.txt) into a virtual environment,
# $TOPHAT_VENV (default ~/.cache/tophat/venv). Idempotent: when every package is present and
# the environment matches requirements.txt it returns without touching apt or pip.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  cmake ninja-build pkg-config g++ git
  # LibTorch is PyTorch's, from the Python package index (below): a virtual environment.
  python3 python3-venv
  # Headers of the Gloo that LibTorch's c10d ships: the cloud's pipeline stages over CPUs.
  libgloo-dev
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
  # tests/openai_client_test.sh waits for the agent's HTTP endpoint with it (the OpenAI
  # client itself is the Python `openai`, in the virtual environment: requirements.txt).
  curl
  # deploy/gpu/pack.sh: the bundle's binaries lose the build machine's library paths.
  patchelf
  # tests/systemd_test.sh: `systemd-analyze verify` on the shipped units.
  systemd
  # tests/dashboard_test.sh: the Grafana dashboard's queries and the alerting rules against
  # a real Prometheus (and promtool).
  prometheus
  # deploy/fuzz.sh: libFuzzer, AddressSanitizer and UBSan come with Debian's clang.
  clang libclang-rt-14-dev
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

bash deploy/python-env.sh
