#!/usr/bin/env bash
# The main job on the embedded default: install what is missing, build, make (or reuse) the
# toy model, split it into device and cloud bundles, then run the real thing on loopback:
# tophat-cloud plus two tophat-agents, a few concurrent requests through the client SDK, a
# per-request table (TTFT, mean TBT, tokens) with speculative decoding on (the adapter is
# distilled once with the toy model), and a clean shutdown.
set -euo pipefail
cd "$(dirname "$0")/.."

bash deploy/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target tophat tophat-cloud tophat-agent
bin=build/release/bin

model="${TOPHAT_TOY_MODEL:-$HOME/.cache/tophat/toy-model}"
# Trains the model and distils the drafter adapter the device bundle ships (both cached).
"$bin/tophat" toy-model --out "$model" >/dev/null
# Device: embedding + layers [0, 2) and layer 5 + head. Cloud: layers [2, 5).
"$bin/tophat" split --model "$model" --input-layers 2 --output-layers 1 --out build/demo-bundles

# The demo's own CA and certificates (kept across runs): the cloud's, and one per device.
bash deploy/make-certs.sh build/demo-certs device-1 device-2

logs=build/demo-logs
mkdir -p "$logs"
pids=()
cleanup() {
  # SIGTERM: the cloud drains, the agents stop; both exit 0.
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

wait_for_port() {
  for _ in $(seq 1 300); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "nothing is listening on port $1; see $logs/" >&2
  return 1
}

"$bin/tophat-cloud" --config configs/demo/cloud.yaml >"$logs/cloud.log" 2>&1 &
pids+=($!)
wait_for_port 7100
"$bin/tophat-agent" --config configs/demo/agent-1.yaml >"$logs/agent-1.log" 2>&1 &
pids+=($!)
"$bin/tophat-agent" --config configs/demo/agent-2.yaml >"$logs/agent-2.log" 2>&1 &
pids+=($!)
wait_for_port 7201
wait_for_port 7202

echo
echo "== tophat-cloud on :7100 (metrics :9100), tophat-agent on :7201 and :7202 (logs: $logs) =="
echo "== 6 concurrent greedy requests over two agents; only hidden states reach the cloud;"
echo "== each agent drafts with its distilled adapter and the cloud verifies the drafts =="
"$bin/tophat" bench --agents 127.0.0.1:7201,127.0.0.1:7202 --output-tokens 48 \
  --prompt "the sleepy cat" --prompt "the old farmer" --prompt "a little bird" \
  --prompt "the brave knight walked to the river and" --prompt "the cat" \
  --prompt "the old farmer saw a little bird near the house, and the sleepy cat"
echo
echo "== cloud metrics (Prometheus, http://127.0.0.1:9100/metrics) =="
if command -v curl >/dev/null; then
  curl -s http://127.0.0.1:9100/metrics | grep -E \
    '^tophat_(prompt_tokens_total|generation_tokens_total|hidden_state_bytes_total|kv_cache_usage_ratio|num_sessions_running)[ {]'
  echo
  echo "== speculative decoding, agent 1 (http://127.0.0.1:9201/metrics) =="
  curl -s http://127.0.0.1:9201/metrics | grep -E \
    '^tophat_spec_decode_(num_drafts|num_draft_tokens|num_accepted_tokens|parallel_drafts|parallel_hits)_total '
fi
