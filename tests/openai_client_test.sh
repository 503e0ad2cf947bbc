#!/usr/bin/env bash
# The official OpenAI client (the Python `openai` package, from deploy/requirements.txt in the
# build's virtual environment) against a real tophat-cloud and tophat-agent on loopback, the
# agent's OpenAI endpoint on: chat (streaming and not), a stop sequence, seeded completions,
# bad requests, a client that disconnects mid-stream (its request cancelled, the cloud's
# KV freed), and the endpoint's limits: a body too large (413, before it is read), a
# completion past max_concurrent_requests (429 at once), an idle connection (closed), clients that
# send their requests a byte at a time (cut off at openai.request_deadline_s), app tokens
# added and removed by a reload (SIGHUP). The cases are
# tests/openai_client_test.py; after them `tophat chat --json`, `--regex`, `--grammar` and
# `--structural-tag` ask the same agent over gRPC.
#   openai_client_test.sh BIN_DIR TOY_MODEL WORK_DIR PYTHON
# A Python without `openai` is a failure, not a skip: deploy/install-deps.sh installs it.
set -euo pipefail
bin_dir="$1"; model="$2"; work="$3"; python="$4"
here="$(cd "$(dirname "$0")" && pwd)"
rm -rf "$work/run"; mkdir -p "$work/run"

if ! "$python" -c 'import openai' 2>"$work/run/import.log"; then
  tail -3 "$work/run/import.log"
  echo "FAIL: $python cannot import the OpenAI client (\`openai\`); run \`bash deploy/install-deps.sh\`"
  exit 1
fi

"$bin_dir/tophat" split --model "$model" --input-layers 2 --output-layers 1 \
  --out "$work/run/bundles" >/dev/null
free_port() { "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
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
# Small, so the limits cases can reach them: a 3rd completion at once gets 429, a body
# past 2 x 64 KiB + 64 KiB gets 413.
max_concurrent_requests: 2
max_prompt_bytes: 64KiB
openai:
  address: "127.0.0.1:$openai_port"
  request_deadline_s: 3
  store_dir: store
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
"$python" "$here/openai_client_test.py" \
  "http://127.0.0.1:$openai_port/v1" "http://127.0.0.1:$cloud_metrics/metrics" \
  "http://127.0.0.1:$agent_metrics/metrics" "$model" || status=$?
# `tophat chat --json` against the same agent over gRPC: greedy, the answer begins an object,
# where the same request without the flag begins with the toy model's words.
if [ "$status" -eq 0 ]; then
  chat=("$bin_dir/tophat" chat --agent "127.0.0.1:$agent_port" --prompt "the old farmer"
        --max-new-tokens 12)
  plain=$("${chat[@]}" 2>"$work/run/chat.log") || status=$?
  json=$("${chat[@]}" --json 2>>"$work/run/chat.log") || status=$?
  if [ "$status" -ne 0 ]; then
    echo "FAIL: tophat chat failed"; tail -5 "$work/run/chat.log"
  elif [[ "$(printf '%s' "$json" | tr -d ' \t\r\n')" != "{"* ]] ||
       [[ "$(printf '%s' "$plain" | tr -d ' \t\r\n')" == "{"* ]]; then
    echo "FAIL: tophat chat --json: $json (without --json: $plain)"; status=1
  else
    echo "tophat chat --json: $json"
  fi
fi
# `tophat chat --regex`: the whole answer matches (a grep of the same regex, whole line).
if [ "$status" -eq 0 ]; then
  regex='[A-Z]{2}-[0-9]{2,4}'
  matched=$("${chat[@]}" --regex "$regex" 2>>"$work/run/chat.log") || status=$?
  if [ "$status" -ne 0 ]; then
    echo "FAIL: tophat chat --regex failed"; tail -5 "$work/run/chat.log"
  elif ! printf '%s\n' "$matched" | grep -Exq "$regex"; then
    echo "FAIL: tophat chat --regex '$regex': $matched"; status=1
  else
    echo "tophat chat --regex: $matched"
  fi
fi
# `tophat chat --grammar FILE`: the whole answer is what the GBNF grammar's root matches (a
# grep of the same language as a regex, whole line); the budget fits three codes. A file that
# cannot be read is named, and a grammar the agent cannot compile is its INVALID_ARGUMENT.
if [ "$status" -eq 0 ]; then
  cat >"$work/run/codes.gbnf" <<'EOF'
# Up to three codes, each two capitals, a dash and two to four digits.
root   ::= code ("," code){0,2}
code   ::= letter letter "-" digit{2,4}
letter ::= [A-Z]
digit  ::= [0-9]
EOF
  regex='[A-Z]{2}-[0-9]{2,4}(,[A-Z]{2}-[0-9]{2,4}){0,2}'
  printf 'root ::= code\ncode ::= [A-Z] cdoe\n' >"$work/run/undefined.gbnf"
  grammar_chat=("$bin_dir/tophat" chat --agent "127.0.0.1:$agent_port" --prompt "the old farmer"
                --max-new-tokens 40)
  matched=$("${grammar_chat[@]}" --grammar "$work/run/codes.gbnf" 2>>"$work/run/chat.log") ||
    status=$?
  if [ "$status" -ne 0 ]; then
    echo "FAIL: tophat chat --grammar failed"; tail -5 "$work/run/chat.log"
  elif ! printf '%s\n' "$matched" | grep -Exq "$regex"; then
    echo "FAIL: tophat chat --grammar codes.gbnf: $matched is not $regex"; status=1
  elif "${grammar_chat[@]}" --grammar "$work/run/missing.gbnf" >/dev/null 2>"$work/run/missing.log" ||
       ! grep -q -- "--grammar: cannot read $work/run/missing.gbnf" "$work/run/missing.log"; then
    echo "FAIL: tophat chat --grammar of a missing file: $(cat "$work/run/missing.log")"; status=1
  elif "${grammar_chat[@]}" --grammar "$work/run/undefined.gbnf" >/dev/null 2>"$work/run/undefined.log" ||
       ! grep -q "grammar: rule 'cdoe'" "$work/run/undefined.log"; then
    echo "FAIL: tophat chat --grammar of an undefined rule: $(cat "$work/run/undefined.log")"
    status=1
  else
    echo "tophat chat --grammar: $matched"
  fi
fi
# `tophat chat --structural-tag FILE`: every " the" the answer writes starts the structure
# (checked as tests/openai_client_test.py checks the endpoint's), and a tag whose begin
# starts with no trigger is the agent's INVALID_ARGUMENT naming the place.
if [ "$status" -eq 0 ]; then
  cat >"$work/run/tag.json" <<'EOF'
{"structures": [{"begin": " the [", "schema": {"enum": ["x", "y"]}, "end": "]"}],
 "triggers": [" the"]}
EOF
  printf '{"structures": [{"begin": "<a>", "schema": {}, "end": ""}], "triggers": ["<b"]}' \
    >"$work/run/bad_tag.json"
  tag_chat=("$bin_dir/tophat" chat --agent "127.0.0.1:$agent_port" --prompt "the old farmer"
            --max-new-tokens 40 --temperature 1 --seed 3)
  tagged=$("${tag_chat[@]}" --structural-tag "$work/run/tag.json" 2>>"$work/run/chat.log") ||
    status=$?
  if [ "$status" -ne 0 ]; then
    echo "FAIL: tophat chat --structural-tag failed"; tail -5 "$work/run/chat.log"
  elif ! "$python" -c '
import sys
sys.path.insert(0, sys.argv[1])
from openai_client_test import structural_tag_count
sys.exit(structural_tag_count(sys.argv[2], "length") is None)' "$here" "$tagged"; then
    echo "FAIL: tophat chat --structural-tag: $tagged has a ' the' that starts no structure"
    status=1
  elif "${tag_chat[@]}" --structural-tag "$work/run/bad_tag.json" >/dev/null \
         2>"$work/run/bad_tag.log" ||
       ! grep -q 'structural_tag: structures\[0\].begin: "<a>" starts with none of the triggers' \
         "$work/run/bad_tag.log"; then
    echo "FAIL: tophat chat --structural-tag of a begin without a trigger: $(cat "$work/run/bad_tag.log")"
    status=1
  else
    echo "tophat chat --structural-tag: $tagged"
  fi
fi
# App tokens reloaded on SIGHUP reach the OpenAI endpoint: with a token added, the official
# client without it gets 401 and with it a chat answer; with the token removed again, no key
# is needed. The reload is done when the agent's reload counter moves (a condition).
if [ "$status" -eq 0 ]; then
  reloads() {
    curl -sf "http://127.0.0.1:$agent_metrics/metrics" |
      awk '/^tophat_config_reloads_total\{result="applied"\}/ {print $2}'
  }
  reload_agent() {
    local before; before=$(reloads)
    kill -HUP "${pids[1]}"
    for _ in $(seq 1 200); do
      [ "$(reloads)" != "$before" ] && return 0
      sleep 0.1
    done
    return 1
  }
  cp "$work/run/agent.yaml" "$work/run/agent-open.yaml"
  { cat "$work/run/agent-open.yaml"
    echo "app_tokens: [\"openai-app:$(printf %s app-secret | sha256sum | cut -d' ' -f1)\"]"
  } >"$work/run/agent.yaml.new"
  mv "$work/run/agent.yaml.new" "$work/run/agent.yaml"
  ask() {  # ask KEY: "ok", or the client's error class
    "$python" - "http://127.0.0.1:$openai_port/v1" "$1" <<'PY'
import sys, openai
client = openai.OpenAI(base_url=sys.argv[1], api_key=sys.argv[2], max_retries=0, timeout=60)
try:
    model = client.models.list().data[0].id
    client.chat.completions.create(model=model, max_tokens=4,
                                   messages=[{"role": "user", "content": "the old farmer"}])
    print("ok")
except openai.APIStatusError as error:
    print(f"{type(error).__name__} {error.status_code}")
PY
  }
  if ! reload_agent; then
    echo "FAIL: the agent did not reload its config on SIGHUP"; tail -5 "$work/run/agent.log"
    status=1
  else
    without=$(ask unused); with=$(ask app-secret)
    cp "$work/run/agent-open.yaml" "$work/run/agent.yaml.new"
    mv "$work/run/agent.yaml.new" "$work/run/agent.yaml"
    if ! reload_agent; then
      echo "FAIL: the agent did not reload its config back"; status=1
    fi
    open_again=$(ask unused)
    if [ "$status" -ne 0 ] || [ "$without" != "AuthenticationError 401" ] ||
       [ "$with" != "ok" ] || [ "$open_again" != "ok" ]; then
      echo "FAIL: app tokens reloaded: without the token '$without', with it '$with'," \
           "tokens removed again '$open_again'"
      status=1
    else
      echo "app tokens reloaded on SIGHUP: the official client without the token got" \
           "'$without', with it '$with'; tokens removed again: '$open_again'"
    fi
  fi
fi
# Kept responses and conversations outlive the agent (openai.store_dir, relative to the
# config): turns kept now are read back after the stop below (tests/openai_restart_test.py).
if [ "$status" -eq 0 ]; then
  "$python" "$here/openai_restart_test.py" keep "http://127.0.0.1:$openai_port/v1" \
    "$work/run/kept.json" || status=$?
fi
# An agent stopped while a background response runs cancels it and stops cleanly (its thread
# joined before the server it uses is gone): exit status 0, and the log says so. 900 tokens
# take the toy pipeline far longer than the signal takes to arrive (the first response's
# may have ended by then: the second's has just begun).
if [ "$status" -eq 0 ]; then
  model_id=$(curl -sf "http://127.0.0.1:$openai_port/v1/models" |
             "$python" -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])')
  started=$(curl -sf "http://127.0.0.1:$openai_port/v1/responses" \
                 -H 'Content-Type: application/json' \
                 -d "{\"model\": \"$model_id\", \"input\": \"the old farmer\", \"background\": true,
                      \"max_output_tokens\": 900, \"ignore_eos\": true}") || status=$?
  # And one streamed in the background with a client following it: the stream ends as the
  # agent stops, rather than holding the stop until its generation ends.
  curl -sN "http://127.0.0.1:$openai_port/v1/responses" -H 'Content-Type: application/json' \
       -d "{\"model\": \"$model_id\", \"input\": \"the old farmer\", \"background\": true,
            \"stream\": true, \"max_output_tokens\": 900, \"ignore_eos\": true}" \
       >"$work/followed.txt" 2>/dev/null &
  follower_pid=$!
  for _ in $(seq 1 300); do
    grep -q "response.output_text.delta" "$work/followed.txt" 2>/dev/null && break
    sleep 0.1
  done
  agent_pid=${pids[1]}
  kill -TERM "$agent_pid"
  for _ in $(seq 1 300); do
    kill -0 "$agent_pid" 2>/dev/null || break
    sleep 0.1
  done
  agent_status=0
  for _ in $(seq 1 100); do
    kill -0 "$follower_pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$follower_pid" 2>/dev/null; then
    echo "FAIL: the followed background stream did not end with the agent"
    kill "$follower_pid" 2>/dev/null || true
    status=1
  fi
  wait "$follower_pid" 2>/dev/null || true
  if kill -0 "$agent_pid" 2>/dev/null; then
    echo "FAIL: the agent did not stop within 30 s of SIGTERM with a background response running"
    status=1
  else
    wait "$agent_pid" || agent_status=$?
  fi
  if [ "$status" -ne 0 ] || [[ "$started" != *'"status":"in_progress"'* ]]; then
    echo "FAIL: a background response to stop the agent with: $started"; status=1
  elif ! grep -q "response.output_text.delta" "$work/followed.txt" ||
       grep -q "response.incomplete" "$work/followed.txt"; then
    echo "FAIL: a followed background stream to stop the agent with:"
    head -c 600 "$work/followed.txt"; status=1
  elif [ "$agent_status" -ne 0 ] ||
       ! grep -Eq "cancelling [12] background response" "$work/run/agent.log" ||
       ! grep -q "tophat-agent stopped" "$work/run/agent.log"; then
    echo "FAIL: the agent stopped with a background response running: exit $agent_status"
    status=1
  else
    echo "the agent stopped cleanly with background responses running, one followed" \
         "(cancelled; its stream ended after $(grep -c output_text.delta \
         "$work/followed.txt") deltas)"
  fi
fi
# The agent started again on the same config takes back what it kept: its log says how
# many, the folder is the agent's alone. A background response running when the agent is
# killed (no stop to cancel it) comes back failed after the next start.
start_agent() {
  "$bin_dir/tophat-agent" --config "$work/run/agent.yaml" >>"$work/run/agent.log" 2>&1 &
  pids[1]=$!
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$openai_port/health" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "FAIL: the agent restarted on the same config never became healthy"
  return 1
}
response_id() { "$python" -c 'import json, sys; print(json.load(sys.stdin)["id"])'; }
if [ "$status" -eq 0 ]; then
  start_agent || status=1
fi
if [ "$status" -eq 0 ]; then
  mode=$(stat -c %a "$work/run/store")
  if [ "$mode" != 700 ] ||
     ! grep -Eq "took back [1-9][0-9]* kept responses and [1-9][0-9]* conversations" "$work/run/agent.log"; then
    echo "FAIL: the restarted agent's store: folder mode $mode, log:"
    grep "openai" "$work/run/agent.log" | tail -5; status=1
  fi
fi
# A second agent given the same store folder (its own ports) is refused at start, naming the
# folder and the agent that holds it, rather than writing over its files.
if [ "$status" -eq 0 ]; then
  sed -e "s/127.0.0.1:$agent_port/127.0.0.1:$(free_port)/" \
      -e "s/127.0.0.1:$agent_metrics/127.0.0.1:$(free_port)/" \
      -e "s/127.0.0.1:$openai_port/127.0.0.1:$(free_port)/" \
      "$work/run/agent.yaml" >"$work/run/agent-twin.yaml"
  twin_status=0
  timeout 120 "$bin_dir/tophat-agent" --config "$work/run/agent-twin.yaml" \
    >"$work/run/agent-twin.log" 2>&1 || twin_status=$?
  if [ "$twin_status" != 1 ] ||
     ! grep -q "openai.store_dir: $work/run/store: in use by another process (pid ${pids[1]})" \
       "$work/run/agent-twin.log"; then
    echo "FAIL: a second agent on the same store folder: exit $twin_status, log:"
    tail -5 "$work/run/agent-twin.log"; status=1
  else
    echo "a second agent on the same store folder is refused: $(grep -o 'in use by.*' \
      "$work/run/agent-twin.log" | head -1)"
  fi
fi
if [ "$status" -eq 0 ]; then
  killed_id=$(curl -sf "http://127.0.0.1:$openai_port/v1/responses" \
                   -H 'Content-Type: application/json' \
                   -d "{\"model\": \"$model_id\", \"input\": \"the old farmer\",
                        \"background\": true, \"max_output_tokens\": 900,
                        \"ignore_eos\": true}" | response_id) || status=$?
  kill -KILL "${pids[1]}"; wait "${pids[1]}" 2>/dev/null || true
  if [ "$status" -eq 0 ]; then start_agent || status=1; fi
  if [ "$status" -eq 0 ]; then
    "$python" "$here/openai_restart_test.py" check "http://127.0.0.1:$openai_port/v1" \
      "$work/run/kept.json" "http://127.0.0.1:$agent_metrics/metrics" \
      "$(printf '%s' "$started" | response_id)" "$killed_id" || status=$?
  fi
fi
if [ "$status" -ne 0 ]; then
  echo "--- agent log"; tail -20 "$work/run/agent.log"
  echo "--- cloud log"; tail -20 "$work/run/cloud.log"
fi
exit "$status"
