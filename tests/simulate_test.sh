#!/usr/bin/env bash
# `tophat simulate` at the issue's scale: 10,000 devices for 10 simulated minutes over eight
# clouds (the built-in H200 profile), in under a minute of one core, every request finished;
# then the replay of a recorded run (a small report in the shape `tophat bench --ablation`
# writes) prints the measured and simulated percentiles side by side; a refused
# configuration names its flag.
#   simulate_test.sh TOPHAT_BIN WORK_DIR PYTHON
set -euo pipefail
bin="$1"; work="$2"; python="$3"
rm -rf "$work"; mkdir -p "$work"
"$bin" simulate --devices 10000 --clouds 8 --duration-s 600 --json "$work/sim.json" \
  >"$work/sim.log"
"$python" - "$work/sim.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
problems = []
if r["wall_seconds"] >= 60:
    problems.append(f"{r['wall_seconds']:.1f} s of wall time for 10,000 devices (goal: < 60)")
req = r["requests"]
# Poisson arrivals at 1 a minute for 10 minutes: about 100,000.
if not 97000 < req["arrived"] < 103000:
    problems.append(f"{req['arrived']} requests arrived; expected about 100,000")
if req["finished"] != req["arrived"]:
    problems.append(f"{req['arrived'] - req['finished']} requests unfinished")
if not 0 < r["ttft_s"]["p50"] <= r["ttft_s"]["p90"]:
    problems.append(f"TTFT percentiles {r['ttft_s']}")
sessions = [c["sessions"] for c in r["per_cloud"]]
if max(sessions) > 1.5 * sum(sessions) / len(sessions):
    problems.append(f"sessions per cloud {sessions}: one above 1.5x the mean")
if problems:
    print("tophat simulate:", *problems, sep="\n  ")
    sys.exit(1)
print(f"simulated 10,000 devices in {r['wall_seconds']:.1f} s; TTFT p50 "
      f"{r['ttft_s']['p50']:.2f} s, TBT p50 {1e3 * r['tbt_s']['p50']:.1f} ms")
PY
if "$bin" simulate --step-time 64 >/dev/null 2>"$work/err"; then
  echo "a malformed --step-time was accepted"; exit 1
fi
grep -q -- "--step-time '64': expected TOKENS:MS" "$work/err" ||
  { echo "the refusal did not name --step-time:"; cat "$work/err"; exit 1; }
# Replay: one recorded request of 40 positions on a 500 KB/s uplink.
cat >"$work/ablation.json" <<'JSON'
{"output_tokens": 8,
 "links": {"one_way_delay_s": 0.01, "bytes_per_token": 768,
           "devices": [{"uplink_bytes_per_second": 5e5, "downlink_bytes_per_second": 1e6}]},
 "runs": [{"config": "+chunk", "dataset": "specbench", "rate": 1.0,
           "chunk_size_by_device": [16.0],
           "per_request": [{"ok": true, "arrival_s": 0.5, "device": 0, "prompt_tokens": 40,
                            "generated_tokens": 8, "ttft_s": 0.2, "mean_tbt_s": 0.03}]}]}
JSON
"$bin" simulate --replay "$work/ablation.json" --step-time 1:1 --json "$work/replay.json" \
  >"$work/replay.log"
grep -q "^+chunk  *specbench" "$work/replay.log" ||
  { echo "no +chunk row in the replay:"; cat "$work/replay.log"; exit 1; }
"$python" - "$work/replay.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
cell = r["cells"][0]
assert cell["requests"] == 1, cell
assert cell["measured"]["ttft_s"]["p50"] == 0.2, cell
# Simulated: chunks of 16 up a 500 KB/s link (24.6 ms each), 10 ms each way, 1 ms steps:
# more than the 40 ms the links alone need, less than a second.
assert 0.04 < cell["simulated"]["ttft_s"]["p50"] < 1, cell
print(f"replayed: TTFT measured 200 ms, simulated {1e3 * cell['simulated']['ttft_s']['p50']:.0f} ms")
PY
