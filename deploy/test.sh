#!/usr/bin/env bash
# Installs what is missing, builds the release preset and runs every test (unit and
# integration) through CTest; a test that did not run fails it unless it needs a GPU.
# Usage: bash deploy/test.sh [extra ctest args]
set -euo pipefail
cd "$(dirname "$0")/.."

bash deploy/install-deps.sh
jobs="$(nproc)"
cmake --preset release >/dev/null
cmake --build --preset release -j "$jobs"
report=build/release/ctest-junit.xml
rm -f "$report"
status=0
ctest --preset release -j "$jobs" --output-junit "$PWD/$report" "$@" || status=$?
# A test CTest reports "not run" (skipped with exit 77, or not startable) fails the run
# unless it needs a GPU: the only legitimate skip on CI's machine.
ctest --preset release -N -L gpu >build/release/gpu-tests.txt
python3 deploy/check_skips.py "$report" build/release/gpu-tests.txt || status=1
exit $status
