#!/usr/bin/env bash
# The official OpenAI client (npm `openai`, run by this machine's Node.js) against a real
# tophat-cloud and tophat-agent on loopback, the agent's OpenAI endpoint on: chat (streaming
# and not), a stop sequence, seeded completions, bad requests, and a client that disconnects
# mid-stream (its request cancelled, the cloud's KV freed). tests/openai_client_test.mjs.
# Exit 77 (CTest: skipped) when Node.js is missing or npm cannot fetch the client.
set -euo pipefail
bin_dir="$1"; model="$2"; work="$3"
here="$(cd "$(dirname "$0")" && pwd)"
rm -rf "$work/run"; mkdir -p "$work/run"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "SKIPPED: node and npm are needed for the OpenAI client test"; exit 77
fi
# The client is installed once per build tree, pinned to a major version.
if [ ! -f "$work/node/node_modules/openai/package.json" ]; then
  mkdir -p "$work/node"
  # Bounded: a registry that does not answer is a skip, not a hung test.
  if ! timeout 240 npm install --prefix "$work/node" --no-audit --no-fund --silent \
      --fetch-retries 1 openai@4 >"$work/npm.log" 2>&1; then
    tail -5 "$work/npm.log"
    rm -rf "$work/node"  # a half-finished install is not reused
    echo "SKIPPED: npm could not install the openai client (no registry?)"; exit 77
  fi
fi

"$bin_dir/tophat" split --model "$model" --input-layers 2 --output-layers 1 \
  --out "$work/run/bundles" >/dev/null
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cloud_port=$(free_port); cloud_metrics=$(free_port)
agent_port=$(free_port); agent_metrics=$(free_port); openai_port=$(free_port)
cat >"$work/run/cloud.yaml" <<EOF
listen_address: "127.0.0.1:$cloud_port"
bundle: $work/run/bundles/cloud
tls:
  insecure: true
max_context: 1024
kv_cache:
  memory_bytes: 64MiB
metrics_address: "127.0.0.1:$cloud_metrics"
EOF
cat >"$work/run/agent.yaml" <<EOF
listen_address: "127.0.0.1:$agent_port"
cloud_address: "127.0.0.1:$cloud_port"
bundle: $work/run/bundles/device
cloud_tls:
  insecure: true
max_context: 1024
metrics_address: "127.0.0.1:$agent_metrics"
openai:
  address: "127.0.0.1:$openai_port"
EOF

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
"$bin_dir/tophat-cloud" --config "$work/run/cloud.yaml" >"$work/run/cloud.log" 2>&1 &
pids+=($!)
"$bin_dir/tophat-agent" --config "$work/run/agent.yaml" >"$work/run/agent.log" 2>&1 &
pids+=($!)
# Ready when the endpoint says the cloud is connected (a condition, not a sleep).
for _ in $(seq 1 600); do
  if curl -sf "http://127.0.0.1:$openai_port/health" >/dev/null 2>&1; then break; fi
  sleep 0.1
done
curl -sf "http://127.0.0.1:$openai_port/health" >/dev/null || {
  echo "the agent's OpenAI endpoint never became healthy"; tail -20 "$work/run/agent.log"; exit 1; }

status=0
# ES modules resolve imports from the script's own directory (NODE_PATH does not apply).
cp "$here/openai_client_test.mjs" "$work/node/"
node "$work/node/openai_client_test.mjs" \
  "http://127.0.0.1:$openai_port/v1" "http://127.0.0.1:$cloud_metrics/metrics" \
  "http://127.0.0.1:$agent_metrics/metrics" || status=$?
if [ "$status" -ne 0 ]; then
  echo "--- agent log"; tail -20 "$work/run/agent.log"
  echo "--- cloud log"; tail -20 "$work/run/cloud.log"
fi
exit "$status"
