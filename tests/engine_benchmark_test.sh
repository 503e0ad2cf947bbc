#!/usr/bin/env bash
# tophat-bench-engine at a small size, as the GPU check runs it at a large one: a few decode
# batches and a prompt chunk whose result leaves the engine in several pieces (64 KiB each:
# 512 positions of the toy model's 192 floats are ~384 KiB). Fails on the program's exit
# code, and on a report that a broken run would give: the engine's results must equal the
# raw forward's, and the prefill result must have come back whole, in more than one piece.
# Each case is also profiled (--profile-steps): its report names the ops a step spent its
# time in, with the prefill's matrix products among them (unless tophat's float32 prompt
# kernel computes them, outside ATen).
#   engine_benchmark_test.sh BIN_DIR MODEL_DIR WORK_DIR PYTHON
set -euo pipefail
bin_dir="$1"; model="$2"; work="$3"; python="$4"
rm -rf "$work"; mkdir -p "$work"
"$bin_dir/tophat-bench-engine" --model "$model" -m 2 -k 1 --context 64 --batch 1 4 \
  --prefill-tokens 512 --repetitions 3 --prefill-repetitions 2 --warmup 1 \
  --profile-steps 2 --json "$work/engine.json"
"$python" - "$work/engine.json" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
cases = {c["case"]: c for c in report["cases"]}
problems = []
for name in ("decode B=1", "decode B=4", "prefill 512"):
    if name not in cases:
        problems.append(f"no case '{name}' in the report")
for case in report["cases"]:
    if not case["engine_ms"] > 0 or not case["raw_ms"] > 0:
        problems.append(f"{case['case']}: no time measured")
    if not case["max_abs_diff"] < 1e-4:
        problems.append(f"{case['case']}: engine and raw forward differ by {case['max_abs_diff']}")
for case in report["cases"]:
    profile = case.get("kernel_profile")
    if not profile or not profile["top"]:
        problems.append(f"{case['case']}: no kernel profile in the report")
    elif not 0 < profile["busy_ms_per_step"] <= profile["wall_ms_per_step"]:
        problems.append(f"{case['case']}: profiled {profile['busy_ms_per_step']} ms busy of "
                        f"{profile['wall_ms_per_step']} ms per step")
prefill = cases.get("prefill 512", {})
top = [k["name"] for k in prefill.get("kernel_profile", {}).get("top", [])]
# Where float32 prompts take tophat's own kernel (kernels/gemm_f32.h: AVX-512 on an AMD CPU)
# its matrix products are not ATen ops, and are in the step's time outside them.
if "f32_prompt_kernel" not in report:
    problems.append("no f32_prompt_kernel in the report")
elif report["f32_prompt_kernel"]:
    if "aten::mm" in top:
        problems.append(f"prefill 512: aten::mm among the profile's ops {top} although float32 "
                        "prompts take the prompt kernel")
elif prefill and "aten::mm" not in top[:3]:
    problems.append(f"prefill 512: aten::mm is not among the profile's three longest: {top[:3]}")
if prefill and not prefill.get("result_pieces", 0) > 1:
    problems.append(f"prefill 512 came back in {prefill.get('result_pieces')} piece(s); "
                    "expected several (max_result_piece_bytes)")
if problems:
    print("engine benchmark report:", *problems, sep="\n  ")
    sys.exit(1)
print(f"engine benchmark report checked: {len(cases)} cases, prefill in "
      f"{prefill['result_pieces']} pieces")
PY
