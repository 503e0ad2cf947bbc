#!/usr/bin/env bash
# Installs what is missing, builds the release preset and runs every test (unit and
# integration) through CTest. Usage: bash deploy/test.sh [extra ctest args]
set -euo pipefail
cd "$(dirname "$0")/.."

bash deploy/install-deps.sh
jobs="$(nproc)"
cmake --preset release >/dev/null
cmake --build --preset release -j "$jobs"
ctest --preset release -j "$jobs" "$@"
