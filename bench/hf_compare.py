#!/usr/bin/env python3
"""Hugging Face transformers on the same middle layers, for tophat-bench-engine to be compared
with (issue 12): eager, and with a static cache under torch.compile.

    python3 bench/hf_compare.py --model DIR [-m 2] [-k 1] [--context 1024] [--batch 1 32]
                                [--repetitions 30] [--json FILE]

Loads layers [m, L-k) of the checkpoint in DIR (the same safetensors tophat loads, e.g. from
random_checkpoint.py) into transformers' own Llama decoder layers, fills a KV cache of
--context positions per sequence with random hidden states, and times one decode step (one
new position per sequence through every layer) with CUDA events: the median of
--repetitions steps after warm-up. Prints a table and JSON. Needs a GPU, torch,
transformers and safetensors; downloads nothing.
"""
import argparse
import json
import os
import statistics
import sys

import torch
from safetensors import safe_open


def load_layers(model_dir, first, end, dtype, device):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    with open(os.path.join(model_dir, "config.json")) as f:
        raw = json.load(f)
    config = LlamaConfig(**{k: v for k, v in raw.items() if k not in ("architectures",)})
    config.num_hidden_layers = end - first
    config._attn_implementation = "sdpa"
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
    """The middle submodel as transformers computes it: decoder layers, no norm, no head."""

    def __init__(self, layers, rotary):
        super().__init__()
        self.layers = layers
        self.rotary = rotary

    def forward(self, hidden, position_ids, cache, cache_position):
        position_embeddings = self.rotary(hidden, position_ids)
        for layer in self.layers:
            out = layer(hidden, attention_mask=None, position_ids=position_ids,
                        past_key_values=cache, use_cache=True, cache_position=cache_position,
                        position_embeddings=position_embeddings)
            hidden = out[0] if isinstance(out, tuple) else out
        return hidden


def time_steps(step, repetitions, warmup=3):
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(repetitions):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def run_case(config, middle, batch, context, repetitions, mode, dtype):
    from transformers import DynamicCache, StaticCache

    device = "cuda"
    d = config.hidden_size
    total = context + 3 + repetitions + 1
    if mode == "eager":
        cache = DynamicCache()
        forward = middle
    else:
        cache = StaticCache(config=config, max_batch_size=batch, max_cache_len=total,
                            device=device, dtype=dtype)
        forward = torch.compile(middle, mode="reduce-overhead", fullgraph=False)
    with torch.no_grad():
        history = torch.randn(batch, context, d, device=device, dtype=dtype)
        positions = torch.arange(context, device=device)
        middle(history, positions.unsqueeze(0).expand(batch, -1), cache, positions)
        state = {"position": context}

        def step():
            p = state["position"]
            x = torch.randn(batch, 1, d, device=device, dtype=dtype)
            cache_position = torch.tensor([p], device=device)
            forward(x, cache_position.unsqueeze(0).expand(batch, -1), cache, cache_position)
            state["position"] = p + 1

        return time_steps(step, repetitions)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("-m", type=int, default=2)
    parser.add_argument("-k", type=int, default=1)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--repetitions", type=int, default=30)
    parser.add_argument("--modes", nargs="+", default=["eager", "compiled"],
                        choices=["eager", "compiled"])
    parser.add_argument("--json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("hf_compare: no CUDA device", file=sys.stderr)
        return 1
    import transformers

    dtype = torch.bfloat16
    with open(os.path.join(args.model, "config.json")) as f:
        layers_total = json.load(f)["num_hidden_layers"]
    config, layers, rotary = load_layers(args.model, args.m, layers_total - args.k, dtype, "cuda")
    middle = Middle(layers, rotary).eval()
    rows = []
    for mode in args.modes:
        for batch in args.batch:
            try:
                ms = run_case(config, middle, batch, args.context, args.repetitions, mode, dtype)
                rows.append({"mode": mode, "batch": batch, "step_ms": ms,
                             "tokens_per_second": 1e3 * batch / ms})
            except Exception as error:  # a mode transformers cannot run here is reported
                rows.append({"mode": mode, "batch": batch, "error": repr(error)})
            print(f"hf_compare: {rows[-1]}", file=sys.stderr, flush=True)
    print(f"{'mode':<9} | {'batch':>5} | {'step ms':>9} | {'tokens/s':>9}")
    print("-" * 42)
    for r in rows:
        if "error" in r:
            print(f"{r['mode']:<9} | {r['batch']:>5} | error: {r['error'][:60]}")
        else:
            print(f"{r['mode']:<9} | {r['batch']:>5} | {r['step_ms']:>9.3f} | "
                  f"{r['tokens_per_second']:>9.0f}")
    report = {"benchmark": "hf_middle_decode", "transformers": transformers.__version__,
              "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
              "layers": [args.m, layers_total - args.k], "context": args.context, "cases": rows}
    print(json.dumps(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
