#!/usr/bin/env bash
# The main job on the embedded default: install what is missing, build, make (or reuse) the
# toy model, split it into device and cloud bundles, and generate text through the split.
set -euo pipefail
cd "$(dirname "$0")/.."

bash deploy/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target tophat
bin=build/release/bin/tophat

model="${TOPHAT_TOY_MODEL:-$HOME/.cache/tophat/toy-model}"
"$bin" toy-model --out "$model" >/dev/null
"$bin" split --model "$model" --input-layers 2 --output-layers 1 --out build/release/demo-bundles

echo
echo "== greedy, monolithic model =="
"$bin" generate --model "$model" --prompt "the sleepy cat" --max-new-tokens 48
echo
echo "== greedy, split: device (embedding + 2 layers | 1 layer + head) <-> cloud (3 layers) =="
"$bin" generate --model build/release/demo-bundles/device \
  --cloud-bundle build/release/demo-bundles/cloud --prompt "the sleepy cat" --max-new-tokens 48
echo
echo "== sampled (temperature 0.8, top-p 0.9, seed 7) =="
"$bin" generate --model "$model" --prompt "the old farmer" --max-new-tokens 48 \
  --temperature 0.8 --top-p 0.9 --seed 7
