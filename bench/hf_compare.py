#!/usr/bin/env python3
"""Hugging Face transformers on the same middle layers, for tophat-bench-engine to be compared
with (issue 12): eager, and with a static cache under torch.compile.

    python3 bench/hf_compare.py --model DIR [-m 2] [-k 1] [--context 1024] [--batch 1 32]
                                [--repetitions 30] [--modes eager compiled]
                                [--device cuda|cpu] [--dtype bfloat16|float32]
                                [--allow-mode-errors MODE ...] [--shift-cached-positions N]
                                [--json FILE]

Loads layers [m, L-k) of the checkpoint in DIR (the same safetensors tophat loads, e.g. from
random_checkpoint.py) into transformers' own Llama decoder layers (written against
transformers 5.17, the version deploy/requirements.txt pins), fills a KV cache of --context
positions per sequence with random hidden states, and times one decode step (one new
position per sequence through every layer): the median of --repetitions steps after
warm-up, timed with CUDA events on a GPU and time.perf_counter on the CPU. Prints a table
and JSON (with the device, dtype, torch and transformers versions). Downloads nothing.

Modes: "eager" runs the layers as they are with a DynamicCache; "compiled" runs them under
torch.compile with a StaticCache (mode "reduce-overhead", i.e. CUDA graphs, on a GPU;
inductor's default mode on the CPU, where it is slow to compile). Both build the attention
mask as LlamaModel does (create_causal_mask).

Correctness, in the same run: for every case the output of the first decode step (through
the cache) is compared with a full recomputation of the whole sequence without a cache
through the same layers. The largest absolute difference is reported per case and must be
below 1e-3 in float32, or in bfloat16 below 1/8 of the reference's largest magnitude
(16-32 units in the last place there; 29 bf16 layers of hidden 512 on the CPU differed by
0.03-0.09 of a largest 4.5, compiled or not): otherwise the exit status is 1. How much the
check sees depends on the weights: with random_checkpoint.py's "tiny" preset (std
1/sqrt(hidden)) decode positions off by one give float32 differences of ~0.5; with std 0.02
(its llama3-8b preset) attention is nearly uniform and the same mistake moved a hidden-64
model's output by ~1e-4, so there, and in bfloat16, the check catches gross errors only.
--shift-cached-positions makes that mistake on purpose (CI's negative control).

Exit status: 0 when every case ran and passed its check; 1 when a case failed its check
or a mode raised, unless that mode is named in --allow-mode-errors (its error is then
reported in the table and the JSON but does not fail the run). The GPU check
(deploy/gpu/check.sh) passes none: a compiled mode that cannot run on the GPU servers'
pinned torch and transformers is a finding to look at, and check.sh already goes on after a
failed comparison. CI's CPU smoke test runs --modes eager only.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch
from safetensors import safe_open

WARMUP_STEPS = 3


def load_layers(model_dir, first, end, dtype, device):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    # Layer indices in the cache and the config count the middle's layers only.
    config = LlamaConfig.from_pretrained(model_dir, local_files_only=True,
                                         num_hidden_layers=end - first,
                                         attn_implementation="sdpa")
    index_path = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            weight_map = json.load(f)["weight_map"]
    else:
        weight_map = None
    handles = {}

    def tensor(name):
        file = weight_map[name] if weight_map else "model.safetensors"
        if file not in handles:
            handles[file] = safe_open(os.path.join(model_dir, file), framework="pt", device="cpu")
        return handles[file].get_tensor(name)

    layers = torch.nn.ModuleList()
    for i, source in enumerate(range(first, end)):
        layer = LlamaDecoderLayer(config, layer_idx=i)
        prefix = f"model.layers.{source}."
        state = {k: tensor(prefix + k) for k in layer.state_dict().keys()}
        layer.load_state_dict(state)
        layers.append(layer.to(device=device, dtype=dtype))
    rotary = LlamaRotaryEmbedding(config=config).to(device)
    return config, layers, rotary


class Middle(torch.nn.Module):
    """The middle submodel as transformers' LlamaModel computes it: its mask, rotary
    embedding and decoder layers; no embedding, no final norm, no head."""

    def __init__(self, config, layers, rotary):
        super().__init__()
        self.config = config
        self.layers = layers
        self.rotary = rotary

    def forward(self, hidden, position_ids, cache):
        from transformers.masking_utils import create_causal_mask

        # None for sdpa where is_causal does (no cache, or one query per sequence with a
        # DynamicCache); a mask over the StaticCache's max_cache_len slots otherwise.
        mask = create_causal_mask(config=self.config, inputs_embeds=hidden, attention_mask=None,
                                  past_key_values=cache, position_ids=position_ids)
        position_embeddings = self.rotary(hidden, position_ids)
        for layer in self.layers:
            # transformers 5.x: the layer returns the hidden states (a tensor, not a tuple).
            hidden = layer(hidden, attention_mask=mask, position_ids=position_ids,
                           past_key_values=cache, use_cache=cache is not None,
                           position_embeddings=position_embeddings)
        return hidden


def time_steps(step, repetitions, device):
    """Median milliseconds of `repetitions` calls of step() after WARMUP_STEPS more."""
    for _ in range(WARMUP_STEPS):
        step()
    times = []
    if device == "cuda":
        torch.cuda.synchronize()
        for _ in range(repetitions):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(repetitions):
            start = time.perf_counter()
            step()
            times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times)


def run_case(config, middle, batch, context, repetitions, mode, dtype, device, shift=0):
    """One (mode, batch) case: returns the step's milliseconds, max |cached - recomputed| of
    the first step and max |recomputed|. `shift` moves the positions of the steps through the
    cache (a negative control: anything but 0 must fail the check)."""
    from transformers import DynamicCache, StaticCache

    d = config.hidden_size
    steps = 1 + WARMUP_STEPS + repetitions  # the checked first step, warm-up, timed steps
    if mode == "eager":
        cache = DynamicCache(config=config)
        forward = middle
    else:
        torch._dynamo.reset()  # each case compiles for its own batch and cache
        cache = StaticCache(config=config, max_cache_len=context + steps)
        compile_mode = "reduce-overhead" if device == "cuda" else "default"
        forward = torch.compile(middle, mode=compile_mode, fullgraph=False)

    def positions(start, count):
        return torch.arange(start, start + count, device=device).unsqueeze(0).expand(batch, -1)

    with torch.no_grad():
        history = torch.randn(batch, context, d, device=device, dtype=dtype)
        inputs = [torch.randn(batch, 1, d, device=device, dtype=dtype) for _ in range(steps)]
        decode_positions = [positions(context + shift + i, 1) for i in range(steps)]
        reference = middle(torch.cat([history, inputs[0]], dim=1), positions(0, context + 1),
                           None)[:, -1:]
        middle(history, positions(0, context), cache)  # prefill, eager in both modes
        first = forward(inputs[0], decode_positions[0], cache).clone()
        max_abs_diff = (first.float() - reference.float()).abs().max().item()
        max_abs_reference = reference.float().abs().max().item()
        state = {"step": 1}

        def step():
            i = state["step"]
            forward(inputs[i], decode_positions[i], cache)
            state["step"] = i + 1

        ms = time_steps(step, repetitions, device)
    return ms, max_abs_diff, max_abs_reference


def tolerance(dtype, max_abs_reference):
    if dtype == torch.float32:
        return 1e-3
    return max_abs_reference / 8  # bfloat16: 2^-8 to 2^-7 relative per rounding


def device_name(device):
    if device == "cuda":
        return torch.cuda.get_device_name()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("-m", type=int, default=2)
    parser.add_argument("-k", type=int, default=1)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--repetitions", type=int, default=30)
    parser.add_argument("--modes", nargs="+", default=["eager", "compiled"],
                        choices=["eager", "compiled"])
    parser.add_argument("--device", choices=["cuda", "cpu"],
                        help="default: cuda when a CUDA device is visible, else cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--allow-mode-errors", nargs="+", default=[],
                        choices=["eager", "compiled"], metavar="MODE",
                        help="modes whose errors are reported without failing the run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shift-cached-positions", type=int, default=0, metavar="N",
                        help="negative control for the check: the decode steps through the "
                             "cache run at positions shifted by N, which must fail it")
    parser.add_argument("--json")
    args = parser.parse_args()
    import transformers

    device = args.device
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cpu":
            print("hf_compare: no CUDA device; running on the CPU", file=sys.stderr)
    elif device == "cuda" and not torch.cuda.is_available():
        print("hf_compare: --device cuda, but no CUDA device is visible", file=sys.stderr)
        return 1
    if args.context < 1 or args.repetitions < 1 or min(args.batch) < 1:
        print("hf_compare: --context, --repetitions and --batch must be >= 1", file=sys.stderr)
        return 1
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(args.seed)
    with open(os.path.join(args.model, "config.json")) as f:
        layers_total = json.load(f)["num_hidden_layers"]
    end = layers_total - args.k
    if not 0 <= args.m < end:
        print(f"hf_compare: -m {args.m} -k {args.k} leaves no middle of {layers_total} layers",
              file=sys.stderr)
        return 1
    config, layers, rotary = load_layers(args.model, args.m, end, dtype, device)
    middle = Middle(config, layers, rotary).eval()
    rows = []
    failed = False
    for mode in args.modes:
        for batch in args.batch:
            try:
                ms, diff, scale = run_case(config, middle, batch, args.context,
                                           args.repetitions, mode, dtype, device,
                                           args.shift_cached_positions)
                tol = tolerance(dtype, scale)
                rows.append({"mode": mode, "batch": batch, "step_ms": ms,
                             "tokens_per_second": 1e3 * batch / ms, "max_abs_diff": diff,
                             "tolerance": tol, "correct": diff < tol})
                failed |= not diff < tol
            except Exception as error:  # reported; fails the run unless allowed
                rows.append({"mode": mode, "batch": batch, "error": repr(error)})
                failed |= mode not in args.allow_mode_errors
            print(f"hf_compare: {rows[-1]}", file=sys.stderr, flush=True)
    print(f"{'mode':<9} | {'batch':>5} | {'step ms':>9} | {'tokens/s':>9} | {'max |diff|':>10} | ok")
    print("-" * 58)
    for r in rows:
        if "error" in r:
            print(f"{r['mode']:<9} | {r['batch']:>5} | error: {r['error'][:60]}")
        else:
            print(f"{r['mode']:<9} | {r['batch']:>5} | {r['step_ms']:>9.3f} | "
                  f"{r['tokens_per_second']:>9.0f} | {r['max_abs_diff']:>10.2e} | "
                  f"{'yes' if r['correct'] else 'NO'}")
    report = {"benchmark": "hf_middle_decode", "transformers": transformers.__version__,
              "torch": torch.__version__, "device": device, "device_name": device_name(device),
              "dtype": args.dtype, "layers": [args.m, end], "context": args.context,
              "repetitions": args.repetitions,
              "shift_cached_positions": args.shift_cached_positions,
              "check": "first decode step through the cache vs. the whole sequence "
                       "recomputed without one (max_abs_diff < tolerance)",
              "passed": not failed, "cases": rows}
    print(json.dumps(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    if failed:
        print("hf_compare: FAILED (a case errored or exceeded its tolerance)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
