#!/usr/bin/env bash
# The main job on the embedded default: install what is missing, build, make (or reuse) the
# toy model, split it into device and cloud bundles, then run the real thing on loopback:
# tophat-cloud plus two tophat-agents, a few concurrent requests through the client SDK, a
# per-request table (TTFT, mean TBT, tokens) with speculative decoding on (the adapter is
# distilled once with the toy model), and a clean shutdown.
#
#   bash deploy/demo.sh [--bin DIR] [--model DIR] [--work DIR] [--free-ports]
#
# --bin DIR: run these built programs (skips installing and building; the `demo` test does).
# --model DIR: the toy model (default $TOPHAT_TOY_MODEL, else ~/.cache/tophat/toy-model).
# --work DIR: bundles, certificates, configs and logs (default build/).
# --free-ports: any free ports instead of 7100 (cloud), 7201/7202 (agents) and 9100/9201/9202
#   (metrics), so that the demo runs beside another copy of itself.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=""
model="${TOPHAT_TOY_MODEL:-$HOME/.cache/tophat/toy-model}"
work=build
free_ports=0
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    --free-ports) free_ports=1; shift ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "demo.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ -z "$bin" ]; then
  bash deploy/install-deps.sh
  cmake --preset release >/dev/null
  cmake --build --preset release -j "$(nproc)" --target tophat tophat-cloud tophat-agent
  bin=build/release/bin
fi
mkdir -p "$work"
work="$(cd "$work" && pwd)"

# Trains the model and distils the drafter adapter the device bundle ships (both cached).
"$bin/tophat" toy-model --out "$model" >/dev/null
# Device: embedding + layers [0, 2) and layer 5 + head. Cloud: layers [2, 5).
"$bin/tophat" split --model "$model" --input-layers 2 --output-layers 1 --out "$work/demo-bundles"

# The demo's own CA and certificates (kept across runs): the cloud's, and one per device.
bash deploy/make-certs.sh "$work/demo-certs" device-1 device-2

# The configs of configs/demo/, with this run's ports and folders.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ports=(7100 7201 7202 9100 9201 9202)
if [ "$free_ports" = 1 ]; then
  for i in "${!ports[@]}"; do ports[$i]=$(free_port); done
fi
cloud_port=${ports[0]}; agent1_port=${ports[1]}; agent2_port=${ports[2]}
cloud_metrics=${ports[3]}; agent1_metrics=${ports[4]}
mkdir -p "$work/demo-configs"
for config in cloud agent-1 agent-2; do
  sed -e "s|\.\./\.\./build/demo-bundles|$work/demo-bundles|; s|\.\./\.\./build/demo-certs|$work/demo-certs|" \
      -e "s|:7100\"|:$cloud_port\"|; s|:7201\"|:$agent1_port\"|; s|:7202\"|:$agent2_port\"|" \
      -e "s|:9100\"|:$cloud_metrics\"|; s|:9201\"|:$agent1_metrics\"|; s|:9202\"|:${ports[5]}\"|" \
      "configs/demo/$config.yaml" >"$work/demo-configs/$config.yaml"
done

logs="$work/demo-logs"
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

"$bin/tophat-cloud" --config "$work/demo-configs/cloud.yaml" >"$logs/cloud.log" 2>&1 &
pids+=($!)
wait_for_port "$cloud_port"
"$bin/tophat-agent" --config "$work/demo-configs/agent-1.yaml" >"$logs/agent-1.log" 2>&1 &
pids+=($!)
"$bin/tophat-agent" --config "$work/demo-configs/agent-2.yaml" >"$logs/agent-2.log" 2>&1 &
pids+=($!)
wait_for_port "$agent1_port"
wait_for_port "$agent2_port"

echo
echo "== tophat-cloud on :$cloud_port (metrics :$cloud_metrics), tophat-agent on :$agent1_port and :$agent2_port (logs: $logs) =="
echo "== 6 concurrent greedy requests over two agents; only hidden states reach the cloud;"
echo "== each agent drafts with its distilled adapter and the cloud verifies the drafts =="
"$bin/tophat" bench --agents "127.0.0.1:$agent1_port,127.0.0.1:$agent2_port" --output-tokens 48 \
  --prompt "the sleepy cat" --prompt "the old farmer" --prompt "a little bird" \
  --prompt "the brave knight walked to the river and" --prompt "the cat" \
  --prompt "the old farmer saw a little bird near the house, and the sleepy cat"
echo
echo "== cloud metrics (Prometheus, http://127.0.0.1:$cloud_metrics/metrics) =="
if command -v curl >/dev/null; then
  curl -s "http://127.0.0.1:$cloud_metrics/metrics" | grep -E \
    '^tophat_(prompt_tokens_total|generation_tokens_total|hidden_state_bytes_total|kv_cache_usage_ratio|num_sessions_running)[ {]'
  echo
  echo "== speculative decoding, agent 1 (http://127.0.0.1:$agent1_metrics/metrics) =="
  curl -s "http://127.0.0.1:$agent1_metrics/metrics" | grep -E \
    '^tophat_spec_decode_(num_drafts|num_draft_tokens|num_accepted_tokens|parallel_drafts|parallel_hits)_total '
fi

# A clean shutdown is part of the demo: every daemon exits 0 on SIGTERM.
trap - EXIT
failed=0
for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
for pid in "${pids[@]}"; do
  code=0
  wait "$pid" || code=$?
  if [ "$code" != 0 ]; then echo "a daemon (pid $pid) exited $code; see $logs/" >&2; failed=1; fi
done
exit $failed
