#!/usr/bin/env bash
# `tophat simulate` at the issue's scale: 10,000 devices for 10 simulated minutes over eight
# clouds (the built-in H200 profile), in under a minute of one core (its CPU time: CI runs
# other tests beside it, and the wall time of a shared core measured those), every request
# finished;
# then the replay of a recorded run (a small report in the shape `tophat bench --ablation`
# writes) prints the measured and simulated percentiles side by side; a refused
# configuration names its flag; --calibrate finds the device times a run was made with.
#   simulate_test.sh TOPHAT_BIN WORK_DIR PYTHON
set -euo pipefail
bin="$1"; work="$2"; python="$3"
rm -rf "$work"; mkdir -p "$work"
# Each cloud configured as deploy/kubernetes/tophat-cloud.yaml configures an H200 (the
# engine's default of 64 running sessions would refuse most of these requests).
"$bin" simulate --devices 10000 --clouds 8 --duration-s 600 --max-running-sessions 1024 \
  --max-waiting-sessions 1024 --json "$work/sim.json" >"$work/sim.log"
"$python" - "$work/sim.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
problems = []
if r["cpu_seconds"] >= 60:
    problems.append(f"{r['cpu_seconds']:.1f} s of CPU time for 10,000 devices (goal: < 60)")
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
print(f"simulated 10,000 devices in {r['cpu_seconds']:.1f} s of CPU "
      f"({r['wall_seconds']:.1f} s of wall time); TTFT p50 "
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
# Calibration recovers the device's compute times that made a run: two runs (a short and a
# long prompt) are simulated with known times (1.0554 ms a prompt position, on the fine grid
# only, between the coarse grid's 1 and 1.334; 3.162 ms a decode token, on the coarse grid),
# their simulated TTFT and TBT are written as if measured, and --calibrate must find those
# times again, with the replay then exact.
"$python" - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def report(requests):
    return {"output_tokens": 8,
            "links": {"one_way_delay_s": 0.01, "bytes_per_token": 768,
                      "devices": [{"uplink_bytes_per_second": 5e5,
                                   "downlink_bytes_per_second": 1e6}]},
            "runs": [{"config": "+chunk", "dataset": "specbench", "rate": rate,
                      "chunk_size_by_device": [16.0],
                      "per_request": [{"ok": True, "arrival_s": 0.5, "device": 0,
                                       "prompt_tokens": prompt, "generated_tokens": 8,
                                       "ttft_s": ttft, "mean_tbt_s": tbt}]}
                     for rate, prompt, ttft, tbt in requests]}
json.dump(report([(1.0, 40, 0.2, 0.03), (2.0, 400, 0.2, 0.03)]), open(f"{work}/known.json", "w"))
PY
"$bin" simulate --replay "$work/known.json" --step-time 1:1 --step-time 512:20 \
  --input-ms-per-token 0.5277248 --output-ms-per-token 0.5277248 --input-decode-ms 1.5811 \
  --output-decode-ms 1.5811 --json "$work/known-replay.json" >/dev/null
"$python" - "$work" <<'PY'
import json, sys
work = sys.argv[1]
known = json.load(open(f"{work}/known.json"))
replayed = json.load(open(f"{work}/known-replay.json"))
for run, cell in zip(known["runs"], replayed["cells"]):
    run["per_request"][0]["ttft_s"] = cell["simulated"]["ttft_s"]["p50"]
    run["per_request"][0]["mean_tbt_s"] = cell["simulated"]["request_tbt_s"]["p50"]
json.dump(known, open(f"{work}/measured.json", "w"))
PY
"$bin" simulate --replay "$work/measured.json" --step-time 1:1 --step-time 512:20 --calibrate \
  --hold-out-rate 0 --json "$work/calibrated.json" >"$work/calibrated.log"
"$python" - "$work/calibrated.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
fit = r["calibration"]
problems = []
if abs(fit["device_ms_per_prompt_position"] - 1.0554496) > 1e-4:
    problems.append(f"fitted {fit['device_ms_per_prompt_position']} ms a prompt position, made with 1.0554")
if abs(fit["device_ms_per_decode_token"] - 3.162) > 1e-2:
    problems.append(f"fitted {fit['device_ms_per_decode_token']} ms a decode token, made with 3.162")
# Not 0: the run was made with 1.5811 ms, the grid's point is 1.58114 ms.
if fit["mean_abs_log_error"] > 1e-4:
    problems.append(f"error {fit['mean_abs_log_error']} at the fit")
if r["within_10_percent"]["fitted"] != r["within_10_percent"]["fitted_of"]:
    problems.append(f"within 10%: {r['within_10_percent']}")
if problems:
    print("tophat simulate --calibrate:", *problems, sep="\n  ")
    sys.exit(1)
print(f"calibrated: {fit['device_ms_per_prompt_position']:.3f} ms a prompt position, "
      f"{fit['device_ms_per_decode_token']:.3f} ms a decode token (made with 1.055 and 3.162)")
PY
# A sweep over fleet sizes: a row each and the plot.
"$bin" simulate --sweep-devices 10,40 --duration-s 30 --plot "$work/sweep.png" \
  --json "$work/sweep.json" >"$work/sweep.log"
"$python" - "$work/sweep.json" "$work/sweep.png" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
rows = r["sweep"]
assert [row["devices"] for row in rows] == [10, 40], rows
for row in rows:
    assert row["requests"]["finished"] == row["requests"]["arrived"] > 0, row
    assert 0 < row["ttft_s"]["p50"] <= row["ttft_s"]["p90"], row
png = open(sys.argv[2], "rb").read(8)
assert png == b"\x89PNG\r\n\x1a\n", png
print(f"swept 10 and 40 devices: TTFT p50 {rows[0]['ttft_s']['p50']:.2f} and {rows[1]['ttft_s']['p50']:.2f} s")
PY
