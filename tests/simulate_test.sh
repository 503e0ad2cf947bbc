#!/usr/bin/env bash
# `tophat simulate` at the issue's scale: 10,000 devices for 10 simulated minutes over eight
# clouds (the built-in H200 profile), in under a minute of one core, every request finished;
# then a refused configuration names its flag.
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
