#!/usr/bin/env bash
# Bad model directories fail with a non-zero exit and an error naming the file and tensor;
# nothing crashes (a signal would give an exit status above 128).
set -uo pipefail
bin="$1"; model="$2"; work="$3"
rm -rf "$work"; mkdir -p "$work"
failures=0

expect_error() {  # name, expected substring, command...
  local name="$1" want="$2"; shift 2
  "$@" > "$work/out.txt" 2> "$work/err.txt"
  local rc=$?
  if [ "$rc" -eq 0 ] || [ "$rc" -gt 128 ]; then
    echo "FAIL $name: exit status $rc"; cat "$work/err.txt"; failures=$((failures + 1)); return
  fi
  if ! grep -q -F -- "$want" "$work/err.txt"; then
    echo "FAIL $name: error does not mention '$want':"; cat "$work/err.txt"
    failures=$((failures + 1)); return
  fi
  echo "ok   $name: $(head -c 300 "$work/err.txt")"
}

copy_model() { rm -rf "$work/$1"; cp -r "$model" "$work/$1"; }

copy_model missing_weights; rm "$work/missing_weights/model.safetensors"
expect_error missing_weights "model.safetensors" \
  "$bin" generate --model "$work/missing_weights" --prompt hi

copy_model truncated; truncate -s 5000 "$work/truncated/model.safetensors"
expect_error truncated "truncated/model.safetensors" \
  "$bin" generate --model "$work/truncated" --prompt hi

copy_model bad_header; printf '\x10\x00\x00\x00\x00\x00\x00\x00{not json at all' \
  | dd of="$work/bad_header/model.safetensors" conv=notrunc status=none
expect_error corrupt_header "bad_header/model.safetensors" \
  "$bin" generate --model "$work/bad_header" --prompt hi

copy_model arch; sed -i 's/LlamaForCausalLM/GPT2LMHeadModel/' "$work/arch/config.json"
expect_error unsupported_architecture "GPT2LMHeadModel" \
  "$bin" generate --model "$work/arch" --prompt hi

copy_model shape; sed -i 's/"intermediate_size": [0-9]*/"intermediate_size": 7/' "$work/shape/config.json"
expect_error wrong_shape "model.layers.0.mlp.gate_proj.weight" \
  "$bin" generate --model "$work/shape" --prompt hi

expect_error missing_dir "does_not_exist" \
  "$bin" generate --model "$work/does_not_exist" --prompt hi

expect_error bad_split "--input-layers" \
  "$bin" split --model "$model" --input-layers 6 --output-layers 0 --out "$work/split"

# `tophat devices` against a port where no cloud listens (port 1 is privileged: nothing of
# this test's listens there), and with an address that is none.
expect_error devices_unreachable "cannot reach the cloud's metrics port at 127.0.0.1:1" \
  "$bin" devices --cloud-metrics 127.0.0.1:1 --timeout-s 2
expect_error devices_bad_address "expected HOST:PORT" "$bin" devices --cloud-metrics nowhere

[ "$failures" -eq 0 ] || { echo "$failures bad-input case(s) failed"; exit 1; }
echo "every bad input got a clear error"
