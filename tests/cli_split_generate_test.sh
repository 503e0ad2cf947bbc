#!/usr/bin/env bash
# `tophat split` then `tophat generate` through the device + cloud bundles produces exactly
# the monolithic model's greedy text, and the cloud bundle holds no embedding or head.
set -euo pipefail
bin="$1"; model="$2"; work="$3"
rm -rf "$work"; mkdir -p "$work"

for split in "1 0" "2 1"; do
  read -r m k <<<"$split"
  "$bin" split --model "$model" --input-layers "$m" --output-layers "$k" --out "$work/b$m$k"
  test -f "$work/b$m$k/device/tophat_bundle.json"
  test -f "$work/b$m$k/cloud/tophat_bundle.json"
  test -f "$work/b$m$k/device/tokenizer.model"
  if [ -e "$work/b$m$k/cloud/tokenizer.model" ]; then echo "tokenizer leaked to the cloud"; exit 1; fi
  if grep -a -q -e "embed_tokens" -e "lm_head" "$work/b$m$k/cloud/model.safetensors"; then
    echo "cloud bundle holds the embedding or the head"; exit 1
  fi
  for prompt in "the sleepy cat" "the wizard counted one"; do
    "$bin" generate --model "$model" --prompt "$prompt" --max-new-tokens 24 > "$work/full.txt"
    "$bin" generate --model "$work/b$m$k/device" --cloud-bundle "$work/b$m$k/cloud" \
      --prompt "$prompt" --max-new-tokens 24 --prefill-chunk 2 > "$work/split.txt"
    diff "$work/full.txt" "$work/split.txt"
    test "$(wc -c < "$work/full.txt")" -gt "$(( ${#prompt} + 10 ))"
  done
done
echo "split generation matches the monolithic model"

# `tophat plan` profiles the toy model's middle [2, 5) on two stage devices and prints a plan
# that covers it, with the config lines for the cloud; a device with too little memory for
# any placement is refused by name.
"$bin" plan --model "$model" --device cpu:1 --device cpu:1 --repetitions 1 > "$work/plan.txt"
grep -q "^  layer_boundaries: \[2, [34], 5\]$" "$work/plan.txt" || { cat "$work/plan.txt"; exit 1; }
grep -q "^  devices: \[cpu, cpu\]$" "$work/plan.txt"
if "$bin" plan --model "$model" --device cpu --memory-gib 0.000001 > "$work/plan.txt" 2>&1; then
  echo "plan accepted a device too small for the layers"; exit 1
fi
grep -q "fits the devices' memory" "$work/plan.txt"
echo "tophat plan prints a plan for the cloud's config"
