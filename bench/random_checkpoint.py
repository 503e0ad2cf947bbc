#!/usr/bin/env python3
"""Writes a random Hugging Face checkpoint in a real model's shape, for GPU benchmarks.

    python3 bench/random_checkpoint.py --out DIR
        [--preset llama3-8b|toy-vocab-100m|tiny|qwen3-30b-a3b-2layers|gpt-oss-20b-2layers]
        [--dtype bf16|f16|f32]

Weights are normal(0, initializer_range, else 0.02) (norms 1), drawn on the GPU when there
is one, else on the CPU, and saved as safetensors shards (one per layer) with
model.safetensors.index.json, so tophat and transformers load the very same bytes. Nothing
is downloaded. Reuses DIR when its config.json already matches. "tiny" is a 4-layer model
for CPU smoke tests of the benchmark scripts (the hf_compare_runs test); its larger
initializer_range gives attention scores of order 1, so a wrong position or mask changes
the layers' output measurably. "gpt-oss-20b-2layers" stores its experts in MXFP4 as OpenAI
released gpt-oss (random codes, block scales near 2^-8: values of the other weights' scale).
"""
import argparse
import json
import os
import sys

import torch
from safetensors.torch import save_file

PRESETS = {
    # Llama-3-8B's shape (meta-llama/Meta-Llama-3-8B config.json), random weights.
    "llama3-8b": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "hidden_act": "silu",
        "bos_token_id": 128000,
        "eos_token_id": 128001,
    },
    # About 100M parameters over the toy model's 512-token vocabulary, so that the toy's
    # tokenizer (copied beside it) serves it: the agent's OpenAI endpoint at a size where
    # computing a prompt costs what it costs (bench/choices_benchmark.py).
    "toy-vocab-100m": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 768,
        "intermediate_size": 2048,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "vocab_size": 512,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "hidden_act": "silu",
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    # Under 1 MB in float32: hidden 64, 4 query heads of 16 over 2 KV heads (GQA), 4 layers.
    # Weights normal(0, 0.125) = 1 / sqrt(hidden): query and key entries of order 1.
    "tiny": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 256,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "hidden_act": "silu",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "initializer_range": 0.125,
    },
    # Qwen3-30B-A3B's layer (Qwen/Qwen3-30B-A3B config.json: 128 experts of 768, 8 a token,
    # head norms, 32 query heads of 128 over 4 KV heads) in 2 of its 48 layers: a CPU decode
    # benchmark of a sparse layer, whose token reads 8 of the 128 experts.
    "qwen3-30b-a3b-2layers": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "num_hidden_layers": 2,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "hidden_act": "silu",
        "bos_token_id": 151643,
        "eos_token_id": 151645,
    },
    # gpt-oss-20b's layer (openai/gpt-oss-20b config.json: 32 experts of 2880, 4 a token,
    # biases, sinks, 64 query heads of 64 over 8 KV heads, a window of 128 on every other
    # layer, YaRN) in 2 of its 24 layers, the experts in MXFP4 as released.
    "gpt-oss-20b-2layers": {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "hidden_size": 2880,
        "intermediate_size": 2880,
        "num_local_experts": 32,
        "num_experts_per_tok": 4,
        "num_hidden_layers": 2,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "vocab_size": 201088,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 150000.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False,
                         "original_max_position_embeddings": 4096},
        "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"],
        "swiglu_limit": 7.0,
        "tie_word_embeddings": False,
        "attention_bias": True,
        "hidden_act": "silu",
        "quantization_config": {"quant_method": "mxfp4"},
        "eos_token_id": 200002,
    },
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="checkpoint directory to write")
    parser.add_argument("--preset", default="llama3-8b", choices=sorted(PRESETS))
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    config = dict(PRESETS[args.preset])
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[args.dtype]
    config["torch_dtype"] = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}[args.dtype]
    os.makedirs(args.out, exist_ok=True)
    config_path = os.path.join(args.out, "config.json")
    index_path = os.path.join(args.out, "model.safetensors.index.json")
    if os.path.exists(config_path) and os.path.exists(index_path):
        with open(config_path) as f:
            if json.load(f) == config:
                print(f"random_checkpoint: reusing {args.out}", file=sys.stderr)
                return 0

    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator(device=device).manual_seed(args.seed)
    d, inter = config["hidden_size"], config["intermediate_size"]
    hd = config["head_dim"]
    std = config.get("initializer_range", 0.02)  # transformers' default
    q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd

    def normal(*shape):
        t = torch.empty(*shape, device=device, dtype=torch.float32)
        t.normal_(0.0, std, generator=generator)
        return t.to(dtype).cpu().contiguous()

    def ones(n):
        return torch.ones(n, dtype=dtype)

    weight_map = {}
    total = 0

    def save(name, tensors):
        nonlocal total
        save_file(tensors, os.path.join(args.out, name), metadata={"format": "pt"})
        for key, t in tensors.items():
            weight_map[key] = name
            total += t.numel() * t.element_size()

    layers = config["num_hidden_layers"]
    save("embed.safetensors", {"model.embed_tokens.weight": normal(config["vocab_size"], d)})
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors = {
            p + "input_layernorm.weight": ones(d),
            p + "self_attn.q_proj.weight": normal(q, d),
            p + "self_attn.k_proj.weight": normal(kv, d),
            p + "self_attn.v_proj.weight": normal(kv, d),
            p + "self_attn.o_proj.weight": normal(d, q),
            p + "post_attention_layernorm.weight": ones(d),
        }
        if config["model_type"] == "gpt_oss":
            # Biases, sinks, a router with a bias; the experts fused, in MXFP4: random codes,
            # scales 2^-8 (values up to 6/256, of the normal weights' scale).
            experts, width = config["num_local_experts"], config["intermediate_size"]
            for name, n in (("q_proj", q), ("k_proj", kv), ("v_proj", kv), ("o_proj", d)):
                tensors[f"{p}self_attn.{name}.bias"] = normal(n)
            tensors[p + "self_attn.sinks"] = normal(config["num_attention_heads"])
            tensors[p + "mlp.router.weight"] = normal(experts, d)
            tensors[p + "mlp.router.bias"] = normal(experts)
            for part, out, inner in (("gate_up_proj", 2 * width, d), ("down_proj", d, width)):
                tensors[f"{p}mlp.experts.{part}_blocks"] = torch.randint(
                    0, 256, (experts, out, inner // 32, 16), dtype=torch.uint8)
                tensors[f"{p}mlp.experts.{part}_scales"] = torch.full(
                    (experts, out, inner // 32), 127 - 8, dtype=torch.uint8)
                tensors[f"{p}mlp.experts.{part}_bias"] = normal(experts, out)
        elif config["model_type"] == "qwen3_moe":
            # Qwen3's head norms, and every layer sparse (the presets' decoder_sparse_step 1).
            tensors[p + "self_attn.q_norm.weight"] = ones(hd)
            tensors[p + "self_attn.k_norm.weight"] = ones(hd)
            width = config["moe_intermediate_size"]
            tensors[p + "mlp.gate.weight"] = normal(config["num_experts"], d)
            for e in range(config["num_experts"]):
                tensors[f"{p}mlp.experts.{e}.gate_proj.weight"] = normal(width, d)
                tensors[f"{p}mlp.experts.{e}.up_proj.weight"] = normal(width, d)
                tensors[f"{p}mlp.experts.{e}.down_proj.weight"] = normal(d, width)
        else:
            tensors[p + "mlp.gate_proj.weight"] = normal(inter, d)
            tensors[p + "mlp.up_proj.weight"] = normal(inter, d)
            tensors[p + "mlp.down_proj.weight"] = normal(d, inter)
        save(f"layer-{i:03d}.safetensors", tensors)
        print(f"random_checkpoint: layer {i + 1}/{layers}", file=sys.stderr, flush=True)
    save("head.safetensors", {"model.norm.weight": ones(d),
                              "lm_head.weight": normal(config["vocab_size"], d)})
    with open(index_path, "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    with open(config_path, "w") as f:
        json.dump(config, f, indent=1)
    print(f"random_checkpoint: wrote {total / 1e6:,.1f} MB to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
