#!/usr/bin/env bash
# The GPU check, on a GPU server with PyTorch and nothing else: unpacks a bundle from
# deploy/gpu/pack.sh, takes LibTorch from the server's own PyTorch, and runs, each phase under
# its own time limit (a hang costs its phase, not the window):
#   the libraries   every program finds every library it needs
#   gpu tests       kernels, runtime (submodel), pipeline (NCCL): every case must run, not skip
#   cuda-cloud      the serving cases with the cloud's middle on the GPU, then split into two
#                   pipeline stages on it (cuda-two-stage-cloud; one GPU cannot hold two NCCL
#                   ranks, so these stages talk Gloo through host memory)
#   two GPUs        on a server with two or more: one serving case with the cloud on cuda:1,
#                   and one with two stages on cuda:0 and cuda:1 over NCCL (else: not run)
#   engine bench    tophat-bench-engine on a Llama-3-8B-shaped middle (m = 2, k = 1) in bf16:
#                   decode at batch 1, 8, 32, 64, 128 over 1,024 positions, speculative
#                   verification at batch 1 and 8 (five positions a session a step), a
#                   2,048-position prefill chunk, against bounds measured in the same run;
#                   then each case's
#                   kernel profile (which kernels a step spends its time in, and how much of
#                   the step the device is idle)
#   hf compare      the same layers in Hugging Face transformers (bench/hf_compare.py)
#   engine bench    decode at batch 1 and 8 again with every few-row GEMM on cuBLAS
#     (cuBLAS)      (--small-batch-gemm never): the same-run measure of the small-batch
#                   kernel, which the first engine bench takes where it measured faster at load
#   engine bench    decode at batch 1 and 8 again with tophat's kernels serialized and the
#     (serial)      split attention merged by a kernel of its own (--overlap-launches off
#                   --fused-split-merge off), and the verification cases (batch 1 and 8, five
#                   positions a session) with their chunks attended as prompt chunks
#                   (--verification-as-decode-rows off): the same-run measure of all three
#   device loss     last, in a process of its own: the engine losing its GPU context (a
#                   device-side assert) fails its sessions with UNAVAILABLE, admits nothing more
# then prints a summary, the tables, and the same-run ratios of the last two engine benches
# against the first, case by case. The whole check takes at most --budget seconds.
#
#   bash check.sh --bundle FILE --out DIR [--work DIR] [--budget S] [--rehearse]
#
# --out DIR gets summary.txt, logs.tar.gz (every phase's log), bench-engine.json,
#   hf-compare.json, bench-engine-cublas.json and bench-engine-serial.json: few files, for
#   machines that return few.
# --work DIR: where the bundle is unpacked and the model written (default: a temporary folder).
# --budget S: seconds for everything (default 470, inside an 8-minute command).
# --only NAMES: run only these phases (comma-separated names as the summary prints them, e.g.
#   tophat_kernels_gpu,checkpoint,engine-bench; libraries always runs): a rerun after a fix
#   that spends a short device lease on what the fix touched. The rest are reported as not
#   selected, and the exit status speaks for the selected ones only.
# --rehearse: on a machine without a GPU, the same bundle runs what it can on the CPU: the GPU
#   tests must load and report themselves skipped, one serving case of each serving binary
#   runs with a CPU cloud, the benchmarks at a small size. It shows the bundle is
#   self-contained (deploy/gpu/pack.sh's test runs it in a folder apart from the build).
# Exit status: 0 when every phase passed (in a rehearsal: ran or skipped as expected).
set -uo pipefail

bundle=""
out=""
work=""
budget=470
rehearse=0
only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) bundle="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    --budget) budget="$2"; shift 2 ;;
    --rehearse) rehearse=1; shift ;;
    --only) only=",$2,"; shift 2 ;;
    -h|--help) sed -n '2,46p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "check.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [ -z "$bundle" ] || [ -z "$out" ]; then
  echo "check.sh: --bundle FILE and --out DIR are required (see --help)" >&2; exit 2
fi
[ -f "$bundle" ] || { echo "check.sh: no bundle at $bundle" >&2; exit 2; }
started=$(date +%s)
deadline=$(( started + budget ))
mkdir -p "$out" && out=$(cd "$out" && pwd)
bundle=$(cd "$(dirname "$bundle")" && pwd)/$(basename "$bundle")
if [ -z "$work" ]; then work=$(mktemp -d "${TMPDIR:-/tmp}/tophat-gpu-check.XXXXXX"); fi
mkdir -p "$work" && work=$(cd "$work" && pwd)
logs="$work/logs"
rm -rf "$logs" && mkdir -p "$logs"
summary="$out/summary.txt"
: >"$summary"
python="${PYTHON:-python3}"

say() { echo "$*" | tee -a "$summary"; }
elapsed() { echo $(( $(date +%s) - started )); }
failed=0
# phase NAME LIMIT_S EXPECT COMMAND...: runs COMMAND with its output in logs/NAME.log, killed
# after LIMIT_S or when the whole budget is spent, whichever is first. EXPECT: pass, or skip
# (exit 77 is the expected outcome: a GPU program on a machine without one).
phase() {
  local name="$1" limit="$2" expect="$3"; shift 3
  if [ -n "$only" ] && [ "$name" != libraries ] && [[ "$only" != *",$name,"* ]]; then
    say "$(printf '%-28s %-10s' "$name" "not selected (--only)")"
    return 0
  fi
  local left=$(( deadline - $(date +%s) ))
  if [ "$left" -lt 10 ]; then
    say "$(printf '%-28s %-10s %5s s  (no time left in the %s s budget)' "$name" "NOT RUN" 0 "$budget")"
    failed=1; return 1
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0 rc verdict
  t0=$(date +%s)
  if [ "$(type -t "$1")" = function ]; then
    "$@" >"$logs/$name.log" 2>&1  # this script's own checks: quick, no time limit needed
  else
    timeout -k 10 "$limit" "$@" >"$logs/$name.log" 2>&1
  fi
  rc=$?
  case "$rc:$expect" in
    0:pass) verdict="passed" ;;
    77:skip) verdict="skipped" ;;
    124:*|137:*) verdict="TIMED OUT"; failed=1 ;;
    *) verdict="FAILED"; failed=1 ;;
  esac
  say "$(printf '%-28s %-10s %5s s  (exit %s; logs/%s.log)' "$name" "$verdict" $(( $(date +%s) - t0 )) "$rc" "$name")"
  if [ "$verdict" = "FAILED" ] || [ "$verdict" = "TIMED OUT" ]; then
    tail -15 "$logs/$name.log" | sed 's/^/    | /' | tee -a "$summary"
  fi
  # The logs so far, in case the command around this one is cut off.
  tar -C "$work" -czf "$out/logs.tar.gz" logs 2>/dev/null
  [ "$verdict" = "passed" ] || [ "$verdict" = "skipped" ]
}

say "tophat GPU check: $(basename "$bundle"), $(date -u +%Y-%m-%dT%H:%M:%SZ), budget ${budget} s$([ $rehearse = 1 ] && echo ', CPU rehearsal')"

# --- Unpack.
rm -rf "$work/tophat-gpu-bundle"
if command -v xz >/dev/null; then
  tar -C "$work" -xJf "$bundle"
else
  "$python" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$bundle" "$work"
fi || { say "check.sh: cannot unpack $bundle"; exit 1; }
root="$work/tophat-gpu-bundle"
sed -n '1,3p' "$root/MANIFEST" | sed 's/^/bundle: /' | tee -a "$summary"

# --- LibTorch from this server's PyTorch, and the CUDA libraries its wheel brought.
torch_info=$("$python" -c '
import os, torch
print(os.path.dirname(torch.__file__)); print(torch.__version__.split("+")[0]); print(torch.__version__)
' 2>"$logs/torch.log") || { say "check.sh: $python cannot import torch: $(tail -1 "$logs/torch.log")"; exit 1; }
torch_dir=$(echo "$torch_info" | sed -n 1p)
torch_version=$(echo "$torch_info" | sed -n 2p)
say "server PyTorch: $(echo "$torch_info" | sed -n 3p) at $torch_dir"
bundle_torch=$(sed -n 's/^libtorch //p' "$root/MANIFEST")
if [ "$torch_version" != "$bundle_torch" ]; then
  say "WARNING: the bundle was built against LibTorch $bundle_torch, this server has $torch_version"
fi
runtime_dirs="$torch_dir/lib"
for d in "$(dirname "$torch_dir")"/nvidia/*/lib; do
  [ -d "$d" ] && runtime_dirs="$runtime_dirs:$d"
done
# Only the bundle's programs get these (the server's own python keeps its own libraries).
tophat_env=(env "LD_LIBRARY_PATH=$runtime_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
            "PATH=$root/bin:$PATH" "OPENSSL_CONF=$root/bin/openssl.cnf")

if [ "$rehearse" = 1 ]; then
  gpu_expect=skip
  device=cpu
else
  gpu_expect=pass
  device=cuda
  if ! nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$logs/gpu.log" 2>&1; then
    say "check.sh: nvidia-smi found no GPU (--rehearse runs the CPU rehearsal)"; exit 1
  fi
  say "GPU: $(cat "$logs/gpu.log")"
fi

# --- Every program finds every library.
# What a server has of its own, or PyTorch brings (deploy/gpu/pack.sh left these out).
server_libraries=$(cat "$root/deploy/gpu/server-libraries.regex")
# And every library the bundle carries is the one loaded (not a copy this machine happens to
# have: a rehearsal on the build machine would otherwise hide a library left out).
check_libraries() {
  local missing=0 name path
  for f in "$root"/bin/* "$root"/tests/* "$root"/lib/*; do
    [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = "177ELF" ] || continue
    if "${tophat_env[@]}" ldd "$f" | grep 'not found'; then
      echo "  ^ needed by $f"; missing=1
    fi
    while read -r name path; do
      if [ -e "$root/lib/$name" ] && [ "$(readlink -f "$path")" != "$(readlink -f "$root/lib/$name")" ]; then
        echo "$f loads $name from $path, not from the bundle"; missing=1
      elif [ ! -e "$root/lib/$name" ] && ! [[ "$name" =~ $server_libraries ]]; then
        echo "$f loads $name from $path: the bundle lacks it (deploy/gpu/pack.sh)"; missing=1
      fi
    done < <("${tophat_env[@]}" ldd "$f" | awk '/=>/ {print $1, $3}')
  done
  [ $missing = 0 ] && echo "every program and library finds its libraries, the bundle's own first"
  return $missing
}
phase libraries 60 pass check_libraries || { say "check.sh: programs cannot start; nothing else runs"; exit 1; }

# --- The GPU tests: every case must run (TOPHAT_REQUIRE_GPU turns a skip into a failure).
gpu_tests_env=("${tophat_env[@]}")
[ "$rehearse" = 1 ] || gpu_tests_env+=(TOPHAT_REQUIRE_GPU=1)
for t in tophat_kernels_gpu_test tophat_runtime_gpu_test tophat_pipeline_gpu_test; do
  phase "${t%_test}" 120 "$gpu_expect" "${gpu_tests_env[@]}" "$root/tests/$t"
done


# --- The serving cases with the cloud on the GPU (in a rehearsal: on the CPU).
serving_env=("${gpu_tests_env[@]}")
[ "$rehearse" = 1 ] && serving_env+=(TOPHAT_GPU_TEST_REHEARSAL=1 TOPHAT_TEST_CLOUD_DEVICE=cpu)
# A rehearsal runs one case of each binary: the suite that rehearses runs every one of them
# with a CPU cloud already, and here only the bundle's own binaries starting is new.
serving_spec="[cuda-cloud]"
staged_spec="[staged][cuda-cloud]"
if [ "$rehearse" = 1 ]; then
  serving_spec="Killing an agent mid-generation frees its KV on the cloud"
  staged_spec="$serving_spec"
fi
phase cuda-cloud 180 pass "${serving_env[@]}" "$root/tests/tophat_serving_cuda_test" "$serving_spec"
phase cuda-two-stage-cloud 150 pass "${serving_env[@]}" \
  "$root/tests/tophat_serving_cuda_staged_test" "$staged_spec"

# --- With two GPUs or more: the cloud's middle on the second (the daemon's threads start on
# cuda:0, so every one that computes must take the middle's device), then two pipeline stages
# on two GPUs over NCCL. The servers lent so far have one GPU: there both are reported not
# run, which is not a failure, and the summary says so.
gpus=0
[ "$rehearse" = 1 ] || gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
two_gpu_spec="Three agents with chunk sizes 1, 16 and 128 reproduce the monolithic greedy tokens"
for name in cuda-cloud-second-gpu nccl-two-gpu-cloud; do
  if [ "$gpus" -lt 2 ]; then
    if [ -z "$only" ] || [[ "$only" == *",$name,"* ]]; then
      say "$(printf '%-28s %-10s' "$name" "not run ($gpus GPU here, it needs two)")"
    fi
  elif [ $name = cuda-cloud-second-gpu ]; then
    phase $name 120 pass "${serving_env[@]}" TOPHAT_TEST_CLOUD_DEVICE=cuda:1 \
      "$root/tests/tophat_serving_cuda_test" "$two_gpu_spec"
  else
    phase $name 120 pass "${serving_env[@]}" TOPHAT_TEST_CLOUD_DEVICE=cuda:0 \
      TOPHAT_TEST_CLOUD_STAGE_DEVICES=cuda:0,cuda:1 \
      "$root/tests/tophat_serving_cuda_staged_test" "$two_gpu_spec"
  fi
done

# --- The engine benchmark.
bench_args=()
if [ "$rehearse" = 1 ]; then
  model="$root/toy-model"
  bench_args=(--device cpu --dtype float32 --context 64 --batch 1 4 --prefill-tokens 512
              --repetitions 3 --prefill-repetitions 2 --warmup 1 --profile-steps 2
              --verify-batch 2)
  hf_model="$work/tiny-model"
  phase checkpoint 60 pass "$python" "$root/bench/random_checkpoint.py" --out "$hf_model" \
    --preset tiny --dtype f32
  hf_args=(--device cpu --dtype float32 --modes eager --context 32 --batch 1 2 --repetitions 3)
  cublas_args=(--device cpu --dtype float32 --context 64 --batch 1 --prefill-tokens 0
               --repetitions 3 --warmup 1)
  verify_args=(--verify-batch 2)
else
  # Llama-3-8B's shape with random bf16 weights; the middle is 29 layers (~13 GB).
  model="$work/llama3-8b"
  phase checkpoint 150 pass "$python" "$root/bench/random_checkpoint.py" --out "$model" \
    --preset llama3-8b --dtype bf16
  bench_args=(--device cuda --dtype bfloat16 --context 1024 --batch 1 8 32 64 128
              --prefill-tokens 2048 --repetitions 30 --profile-steps 3 --profile-top 12
              --verify-batch 1 8 --verify-tokens 5)
  hf_model="$model"
  hf_args=(--device cuda --dtype bfloat16 --context 1024 --batch 1 32 --repetitions 30)
  cublas_args=(--device cuda --dtype bfloat16 --context 1024 --batch 1 8 --prefill-tokens 0
               --repetitions 30)
  verify_args=(--verify-batch 1 8 --verify-tokens 5)
fi
phase engine-bench 150 pass "${tophat_env[@]}" "$root/bin/tophat-bench-engine" --model "$model" \
  -m 2 -k 1 "${bench_args[@]}" --json "$out/bench-engine.json"
phase hf-compare 180 pass "$python" "$root/bench/hf_compare.py" --model "$hf_model" -m 2 -k 1 \
  "${hf_args[@]}" --json "$out/hf-compare.json"
phase engine-bench-cublas 90 pass "${tophat_env[@]}" "$root/bin/tophat-bench-engine" \
  --model "$model" -m 2 -k 1 "${cublas_args[@]}" --small-batch-gemm never \
  --json "$out/bench-engine-cublas.json"
phase engine-bench-serial 90 pass "${tophat_env[@]}" "$root/bin/tophat-bench-engine" \
  --model "$model" -m 2 -k 1 "${cublas_args[@]}" "${verify_args[@]}" --overlap-launches off \
  --fused-split-merge off --verification-as-decode-rows off \
  --json "$out/bench-engine-serial.json"

# --- The engine losing its GPU context (a device-side assert), which no later call recovers
# from: alone in its process, and last, so that a hang in it costs no benchmark its time.
phase tophat_server_gpu 45 "$gpu_expect" "${gpu_tests_env[@]}" "$root/tests/tophat_server_gpu_test"

# --- The tables.
for name in engine-bench hf-compare engine-bench-cublas engine-bench-serial; do
  if [ -f "$logs/$name.log" ]; then
    echo "== $name ==" | tee -a "$summary"
    # The table: the lines with column bars, and what the benchmark said of the machine.
    grep -E '\|| bounds:|^-{20,}|^kernel profile|busy of|^small-batch GEMM|^kernel launches|^split decode attention|^verification chunks' "$logs/$name.log" |
      tee -a "$summary"
  fi
done
# The same-run ratios the two later engine benches exist for, case by case.
if [ -f "$out/bench-engine.json" ]; then
  "$python" - "$out/bench-engine.json" "$out/bench-engine-cublas.json" \
    "$out/bench-engine-serial.json" <<'PY' 2>&1 | tee -a "$summary"
import json, os, sys
def cases(path):
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return {c["case"]: c for c in json.load(f).get("cases", [])}
main, cublas, serial = (cases(p) for p in sys.argv[1:4])
print("== same run: engine ms of the main bench against cuBLAS-only, and against serialized "
      "launches with the split attention merged by a second kernel and verification chunks "
      "attended as prompt chunks (x: their time over the main bench's) ==")
print(f"{'case':<14}{'main ms':>9}{'of bound':>10}{'cuBLAS ms':>11}{'x':>7}{'serial ms':>11}{'x':>7}")
for name, c in main.items():
    if name not in cublas and name not in serial:
        continue
    row = f"{name:<14}{c['engine_ms']:>9.3f}{100 * c['bound_fraction']:>9.1f}%"
    for other in (cublas, serial):
        o = other.get(name)
        row += f"{o['engine_ms']:>11.3f}{o['engine_ms'] / c['engine_ms']:>7.3f}" if o else f"{'-':>11}{'-':>7}"
    print(row)
PY
fi
say "check.sh: $( [ $failed = 0 ] && echo 'every phase passed' || echo 'SOME PHASES FAILED') in $(elapsed) s; logs in $out/logs.tar.gz"
tar -C "$work" -czf "$out/logs.tar.gz" logs 2>/dev/null
exit $failed
