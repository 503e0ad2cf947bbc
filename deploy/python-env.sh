#!/usr/bin/env bash
# Makes (or brings up to date) the virtual environment that holds PyTorch's LibTorch and
# the Python test tools: deploy/requirements.txt, pinned, into $TOPHAT_VENV (default
# ~/.cache/tophat/venv). CMake finds LibTorch through it (cmake/find_torch.cmake).
# Nothing happens when the environment already matches requirements.txt.
#
#   bash deploy/python-env.sh [--print]     --print: only print the environment's path
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${TOPHAT_VENV:-$HOME/.cache/tophat/venv}"
case "${1:-}" in
  --print) echo "$venv"; exit 0 ;;
  -h|--help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "python-env.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
esac
requirements=deploy/requirements.txt
stamp="$venv/.tophat-requirements"
if [ -x "$venv/bin/python" ] && cmp -s "$requirements" "$stamp"; then
  exit 0
fi
python="${TOPHAT_PYTHON:-python3}"
if ! "$python" -c 'import sys; assert sys.version_info >= (3, 10)' 2>/dev/null; then
  echo "python-env: $python is missing or older than 3.10 (PyTorch 2.11 needs 3.10+)" >&2
  exit 1
fi
start=$(date +%s)
if [ ! -x "$venv/bin/python" ]; then
  echo "python-env: creating $venv" >&2
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv"
fi
echo "python-env: installing $requirements into $venv (PyTorch with CUDA's libraries: ~2.7 GB to download the first time)" >&2
# Two tries: a registry that drops a multi-GB download once should not fail a fresh machine.
for try in 1 2; do
  if "$venv/bin/python" -m pip install --disable-pip-version-check --progress-bar off -q \
       -r "$requirements"; then
    cp "$requirements" "$stamp"
    echo "python-env: ready in $(( $(date +%s) - start )) s ($(du -sh "$venv" | cut -f1))" >&2
    exit 0
  fi
  echo "python-env: pip install failed (try $try of 2)" >&2
done
exit 1
