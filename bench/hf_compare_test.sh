#!/usr/bin/env bash
# hf_compare_runs: bench/hf_compare.py on the CPU at a tiny shape, so that the GPU check's
# transformers comparison cannot rot between GPU runs.
#
#   bench/hf_compare_test.sh PYTHON WORK_DIR
#
# Writes random_checkpoint.py's "tiny" preset (float32) into WORK_DIR and runs the eager mode
# at batches 1 and 2. Passes when hf_compare.py exits 0 (every case ran and its first decode
# step through the cache matched a recomputation without one to < 1e-3) and its JSON says
# so; and when the negative control, the same run with decode positions off by one, exits 1
# with every case over the tolerance: the check can fail.
set -euo pipefail
python=$1
work=$2
bench=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$work"
model="$work/tiny-f32"
"$python" "$bench/random_checkpoint.py" --out "$model" --preset tiny --dtype f32

args=(--model "$model" -m 1 -k 1 --device cpu --dtype float32 --modes eager --context 32
      --batch 1 2 --repetitions 3)
"$python" "$bench/hf_compare.py" "${args[@]}" --json "$work/hf-compare.json"

# The report: both cases timed, each within the tolerance, the versions recorded.
"$python" - "$work/hf-compare.json" <<'EOF'
import json
import sys

report = json.load(open(sys.argv[1]))
cases = report["cases"]
assert report["passed"] is True, report
assert report["device"] == "cpu" and report["dtype"] == "float32", report
assert report["torch"] and report["transformers"], report
assert [(c["mode"], c["batch"]) for c in cases] == [("eager", 1), ("eager", 2)], cases
for c in cases:
    assert c["step_ms"] > 0 and c["max_abs_diff"] < 1e-3, c
print("hf_compare_test: max |diff| " + ", ".join(f"{c['max_abs_diff']:.1e}" for c in cases))
EOF

# Negative control: positions off by one through the cache must fail the check.
set +e
"$python" "$bench/hf_compare.py" "${args[@]}" --shift-cached-positions 1 \
  --json "$work/hf-compare-shifted.json" > "$work/hf-compare-shifted.log" 2>&1
rc=$?
set -e
if [ "$rc" -ne 1 ]; then
  cat "$work/hf-compare-shifted.log"
  echo "hf_compare_test: with positions off by one hf_compare.py exited $rc, not 1" >&2
  exit 1
fi
"$python" - "$work/hf-compare-shifted.json" <<'EOF'
import json
import sys

report = json.load(open(sys.argv[1]))
assert report["passed"] is False, report
for c in report["cases"]:
    assert c["max_abs_diff"] > 1e-2 and not c["correct"], c
print("hf_compare_test: positions off by one: max |diff| "
      + ", ".join(f"{c['max_abs_diff']:.2f}" for c in report["cases"]) + " (fails, as it must)")
EOF
