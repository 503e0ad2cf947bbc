#!/usr/bin/env python3
"""tophat's model runtime against Hugging Face transformers, the field's reference.

    python3 tests/hf_reference_test.py --runtime-logits BIN --work-dir DIR

For each variant below, transformers' own *ForCausalLM class builds a small random model and
writes it with save_pretrained (safetensors; bfloat16 or sharded where the variant says).
tophat-runtime-logits (tests/runtime_logits_main.cc) loads that directory and computes, in
float32 on the CPU, the logits of every position of a token sequence through the full model,
through the split input -> middle -> output pipeline, and through that pipeline step by step
with its KV caches, plus greedy continuations. transformers loads the same directory
(AutoModelForCausalLM.from_pretrained(dir, dtype=torch.float32)) and must agree: every logit
within 1e-4, and generate(do_sample=False) the same tokens (for LongRoPE past its original
length, the model's forward with a cache: see incremental_from below).

A negative control per feature: transformers run with the variant's feature taken away
(biases zeroed, no sliding window, plain rope) must differ from tophat by over 100x the
tolerance, so a variant whose feature changed nothing at these shapes cannot pass unseen.

Exits 0 when every variant agrees, 1 otherwise, and 1 when transformers is missing.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time

TOLERANCE = 1e-4
CONTROL_FACTOR = 100  # a control must differ by more than CONTROL_FACTOR * TOLERANCE
PROMPT_TOKENS = 24
GREEDY_TOKENS = 12

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

try:
    import torch
    import transformers
    from transformers import (AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM,
                              MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                              Qwen3Config, Qwen3ForCausalLM, Gemma3Config,
                              Gemma3ForCausalLM, Gemma3ForConditionalGeneration,
                              Gemma3TextConfig, Gemma2Config, Gemma2ForCausalLM, Phi3Config,
                              Phi3ForCausalLM, MixtralConfig, MixtralForCausalLM,
                              Qwen3MoeConfig, Qwen3MoeForCausalLM, Qwen2MoeConfig,
                              Qwen2MoeForCausalLM, GptOssConfig, GptOssForCausalLM)
    from model_checks import round_experts_to_mxfp4, widen_gpt_oss, write_gpt_oss_mxfp4
except ImportError as error:
    print(f"hf_reference: cannot import the reference ({error}). It needs torch and "
          f"transformers from deploy/requirements.txt in {sys.executable}'s environment: run "
          "`bash deploy/install-deps.sh` (or deploy/python-env.sh), or configure with "
          "-DTOPHAT_PYTHON=<a python that has them>.", file=sys.stderr)
    sys.exit(1)

transformers.utils.logging.disable_progress_bar()

# Shared by every variant: 4 layers, hidden 64, GQA 4:2, vocab 256. initializer_range 0.1
# (not 0.02) so that attention is far from uniform and greedy choices are not near-ties.
BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-5, initializer_range=0.1, bos_token_id=1, eos_token_id=2)


def zero_biases(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.zero_()


def without(**changes):
    """A control: the reference's config with `changes`, loaded from the same weights."""
    def control(directory):
        config = AutoConfig.from_pretrained(directory)
        for key, value in changes.items():
            setattr(config, key, value)
        return load_reference(directory, config=config)
    return control


def with_biases_zeroed(directory):
    model = load_reference(directory)
    zero_biases(model)
    return model


def with_head_norms_removed(directory):
    """Qwen3 without its per-head q_norm and k_norm (the rest of its weights kept)."""
    model = load_reference(directory)
    for layer in model.model.layers:
        layer.self_attn.q_norm = torch.nn.Identity()
        layer.self_attn.k_norm = torch.nn.Identity()
    return model


# Gemma 3's text model: three layers sliding over 6 positions with their own rotary base and
# one full layer (Gemma 3 1B's pattern is five and one), q 128 wide from hidden 64, and a score
# scale that is not head_dim's. transformers 5 spells the two bases per layer type.
GEMMA3 = dict(BASE, head_dim=32, tie_word_embeddings=True, sliding_window=6,
              layer_types=["sliding_attention"] * 3 + ["full_attention"],
              query_pre_attn_scalar=24,
              rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                               "sliding_attention": {"rope_type": "default",
                                                     "rope_theta": 1e4}})

# Gemma 3 4B and up are multimodal checkpoints: the language model (with linear rope scaling
# on its full layers, as 4B's factor 8) beside a vision tower tophat does not read.
GEMMA3_MULTIMODAL = Gemma3Config(
    text_config=dict(GEMMA3, rope_parameters={
        "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
    vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=2, image_size=28, patch_size=14),
    mm_tokens_per_image=4, image_token_index=255, boi_token_index=253, eoi_token_index=254)


def without_linear_scaling(directory):
    config = AutoConfig.from_pretrained(directory)
    config.text_config.rope_parameters["full_attention"] = {"rope_type": "default",
                                                             "rope_theta": 1e6}
    return load_reference(directory, config=config)


# Phi-4-mini's attention: rotary over 3/4 of each head (12 of 16 dimensions), LongRoPE with
# its short factors below position 16 and its long ones from there, and the attention factor
# max_position_embeddings / original gives; q/k/v and gate/up stored fused, tied embeddings.
PHI3_LONGROPE = dict(BASE, pad_token_id=0, tie_word_embeddings=True, partial_rotary_factor=0.75,
                     original_max_position_embeddings=16,
                     rope_scaling={"type": "longrope",
                                   "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5],
                                   "long_factor": [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]})


def with_short_factors_throughout(directory):
    config = AutoConfig.from_pretrained(directory)
    config.rope_parameters["long_factor"] = list(config.rope_parameters["short_factor"])
    return load_reference(directory, config=config)


def with_whole_head_rotary(directory):
    config = AutoConfig.from_pretrained(directory)
    config.partial_rotary_factor = 1.0
    config.rope_parameters["partial_rotary_factor"] = 1.0
    return load_reference(directory, config=config)


# Gemma 2: every other layer sliding over 6 positions from the first, one rotary base, a score
# scale that is not head_dim's, and both soft-caps, set low enough to bite at these weights'
# scale (Gemma 2's own are 50 and 30, for trained scores and logits).
GEMMA2 = dict(BASE, head_dim=32, tie_word_embeddings=True, sliding_window=6,
              query_pre_attn_scalar=24, attn_logit_softcapping=2.0, final_logit_softcapping=3.0)


def with_shared_expert_gate_zeroed(directory):
    """Qwen2-MoE with each shared expert's gate at zero: sigmoid 1/2 on every token."""
    model = load_reference(directory)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("shared_expert_gate.weight"):
                p.zero_()
    return model


def with_sdpa_attention(directory):
    """transformers' SDPA attention, which drops Gemma 2's attention soft-cap."""
    return load_reference(directory, attn_implementation="sdpa")


# gpt-oss: attention sinks, every other layer sliding over 6 positions, YaRN (its own form:
# the ramp unrounded, a factor of 32 over an original length these prompts cross), 4 experts
# of 32 with 2 a token; its experts' biases and sinks widened (model_checks.widen_gpt_oss).
GPT_OSS = dict(BASE, intermediate_size=32, head_dim=16, num_local_experts=4,
               num_experts_per_tok=2, sliding_window=6,
               rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                                "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                "original_max_position_embeddings": 16})


def without_clamps(directory):
    """gpt-oss's experts without their clamps at +-7."""
    model = load_reference(directory)
    for layer in model.model.layers:
        layer.mlp.experts.limit = float("inf")
    return model


def without_sinks(directory):
    """gpt-oss with every sink at -inf: each row's softmax over the positions alone."""
    model = load_reference(directory)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.fill_(-float("inf"))
    return model


def load_dequantized_by_transformers(directory):
    """The reference for an MXFP4 checkpoint: the model before rounding, its experts rounded
    and dequantized by transformers' own code (model_checks.round_experts_to_mxfp4)."""
    model = load_reference(directory + ".unquantized")
    round_experts_to_mxfp4(model)
    return model


def with_unquantized_experts(directory):
    """The same model before its experts were rounded to MXFP4 (the checkpoint beside it)."""
    return load_reference(directory + ".unquantized")


# name, class, config, save (dtype, max_shard_size), split (m, k), control (what it removes);
# incremental_from: the reference's logits and greedy tokens from the model's forward with a
# cache, the first N tokens in one pass and each later one alone (LongRoPE switches a whole
# pass to its long factors once the pass reaches past the original length; a position here
# turns by its own range's factors, which this order of passes computes).
VARIANTS = [
    dict(name="llama_gqa", cls=LlamaForCausalLM, config=LlamaConfig(**BASE)),
    dict(name="llama_attention_bias", cls=LlamaForCausalLM,
         config=LlamaConfig(**BASE, attention_bias=True),
         control=("biases zeroed", with_biases_zeroed)),
    dict(name="qwen2_bias_tied", cls=Qwen2ForCausalLM,
         config=Qwen2Config(**BASE, tie_word_embeddings=True), split=(1, 0),
         control=("biases zeroed", with_biases_zeroed)),
    dict(name="qwen2_sliding_window", cls=Qwen2ForCausalLM,
         config=Qwen2Config(**BASE, use_sliding_window=True, sliding_window=8,
                            max_window_layers=0),
         control=("no window", without(sliding_window=None,
                                      layer_types=["full_attention"] * 4))),
    dict(name="llama3_rope_scaling", cls=LlamaForCausalLM,
         config=LlamaConfig(**BASE, head_dim=24,  # not hidden / heads = 16
                            rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                                             "factor": 8.0, "low_freq_factor": 1.0,
                                             "high_freq_factor": 4.0,
                                             "original_max_position_embeddings": 64}),
         control=("plain rope", without(rope_parameters={"rope_type": "default",
                                                         "rope_theta": 500000.0}))),
    # YaRN: Qwen3's card's factor over an original length these prompts cross, the ramp's
    # ends rounded; then gpt-oss's form (not rounded) with other betas and the attention
    # factor given, on Llama's layer.
    dict(name="qwen3_yarn", cls=Qwen3ForCausalLM,
         config=Qwen3Config(**BASE, head_dim=32,
                            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0,
                                             "factor": 4.0,
                                             "original_max_position_embeddings": 32}),
         split=(1, 1),
         control=("plain rope", without(rope_parameters={"rope_type": "default",
                                                         "rope_theta": 10000.0}))),
    dict(name="llama_yarn_untruncated", cls=LlamaForCausalLM,
         config=LlamaConfig(**BASE, rope_parameters={
             "rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 16.0,
             "beta_slow": 2.0, "truncate": False, "attention_factor": 1.2,
             "original_max_position_embeddings": 64}), split=(2, 1),
         control=("rounded ramp, derived attention factor", without(rope_parameters={
             "rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 16.0,
             "beta_slow": 2.0, "original_max_position_embeddings": 64}))),
    dict(name="mistral_sliding_window", cls=MistralForCausalLM,
         config=MistralConfig(**BASE, sliding_window=8), split=(2, 1),
         control=("no window", without(sliding_window=None))),
    dict(name="qwen3_head_norms", cls=Qwen3ForCausalLM,
         config=Qwen3Config(**BASE, head_dim=32,  # q 128 wide from hidden 64, as Qwen3's
                            tie_word_embeddings=True), split=(1, 1),
         control=("no head norms", with_head_norms_removed)),
    dict(name="qwen3_bf16_attention_bias", cls=Qwen3ForCausalLM,
         config=Qwen3Config(**BASE, attention_bias=True), dtype=torch.bfloat16, split=(2, 1),
         control=("biases zeroed", with_biases_zeroed)),
    dict(name="llama_tied", cls=LlamaForCausalLM,
         config=LlamaConfig(**BASE, tie_word_embeddings=True), split=(2, 1)),
    dict(name="llama_bf16", cls=LlamaForCausalLM, config=LlamaConfig(**BASE),
         dtype=torch.bfloat16),
    dict(name="mistral_sharded", cls=MistralForCausalLM,
         config=MistralConfig(**BASE, sliding_window=8), max_shard_size="200KB"),
    dict(name="gemma3_layer_types", cls=Gemma3ForCausalLM, config=Gemma3TextConfig(**GEMMA3),
         split=(1, 1),
         control=("every layer full", without(layer_types=["full_attention"] * 4))),
    dict(name="gemma3_bf16_scale", cls=Gemma3ForCausalLM, config=Gemma3TextConfig(**GEMMA3),
         dtype=torch.bfloat16, split=(2, 1),
         control=("head_dim's scale", without(query_pre_attn_scalar=32))),
    dict(name="gemma3_multimodal_text", cls=Gemma3ForConditionalGeneration,
         config=GEMMA3_MULTIMODAL, split=(1, 2), tokens_below=253,
         control=("no linear scaling", without_linear_scaling)),
    dict(name="phi3_partial_longrope", cls=Phi3ForCausalLM, config=Phi3Config(**PHI3_LONGROPE),
         split=(1, 1), incremental_from=16,
         control=("short factors throughout", with_short_factors_throughout)),
    dict(name="phi3_partial_window_bf16", cls=Phi3ForCausalLM,
         config=Phi3Config(**BASE, pad_token_id=0, partial_rotary_factor=0.5, sliding_window=8),
         dtype=torch.bfloat16, split=(2, 1),
         control=("whole-head rotary", with_whole_head_rotary)),
    dict(name="gemma2_softcap", cls=Gemma2ForCausalLM, config=Gemma2Config(**GEMMA2),
         split=(1, 1), control=("no attention cap (SDPA)", with_sdpa_attention)),
    dict(name="gemma2_bf16_logit_cap", cls=Gemma2ForCausalLM, config=Gemma2Config(**GEMMA2),
         dtype=torch.bfloat16, split=(2, 1),
         control=("no logit cap", without(final_logit_softcapping=None))),
    # Mixtures of experts: the router's top K of the experts, their outputs weighted.
    dict(name="mixtral_experts", cls=MixtralForCausalLM,
         config=MixtralConfig(**BASE, num_local_experts=4, num_experts_per_tok=2), split=(1, 1),
         control=("one expert a token", without(num_experts_per_tok=1))),
    dict(name="qwen3_moe_mixed", cls=Qwen3MoeForCausalLM,
         config=Qwen3MoeConfig(**BASE, head_dim=32, num_experts=8, num_experts_per_tok=3,
                               moe_intermediate_size=48, norm_topk_prob=False,
                               mlp_only_layers=[2]), split=(1, 1),
         control=("weights renormalised", without(norm_topk_prob=True))),
    dict(name="qwen3_moe_bf16_sparse_step", cls=Qwen3MoeForCausalLM,
         config=Qwen3MoeConfig(**BASE, num_experts=8, num_experts_per_tok=2,
                               moe_intermediate_size=48, norm_topk_prob=True,
                               decoder_sparse_step=2), dtype=torch.bfloat16, split=(2, 1),
         control=("one expert a token", without(num_experts_per_tok=1))),
    dict(name="qwen2_moe_shared_expert", cls=Qwen2MoeForCausalLM,
         config=Qwen2MoeConfig(**BASE, num_experts=6, num_experts_per_tok=2,
                               moe_intermediate_size=40, shared_expert_intermediate_size=96,
                               norm_topk_prob=False), split=(1, 1),
         control=("shared expert's gate zeroed", with_shared_expert_gate_zeroed)),
    dict(name="gpt_oss", cls=GptOssForCausalLM, config=GptOssConfig(**GPT_OSS), split=(1, 1),
         prepare=widen_gpt_oss, control=("no clamps", without_clamps)),
    dict(name="gpt_oss_bf16_sinks", cls=GptOssForCausalLM, config=GptOssConfig(**GPT_OSS),
         prepare=widen_gpt_oss, dtype=torch.bfloat16, split=(2, 1),
         control=("no sinks", without_sinks)),
    dict(name="gpt_oss_mxfp4", cls=GptOssForCausalLM, config=GptOssConfig(**GPT_OSS),
         prepare=widen_gpt_oss, write=write_gpt_oss_mxfp4, split=(1, 2),
         reference=load_dequantized_by_transformers,
         control=("experts not rounded to MXFP4", with_unquantized_experts)),
]


def load_reference(directory, config=None, attn_implementation=None):
    kwargs = {"config": config} if config is not None else {}
    # Gemma 2's attention soft-cap is computed by eager attention only (transformers' SDPA
    # path drops it); Gemma 2 was trained with it.
    model_type = (config or AutoConfig.from_pretrained(directory)).model_type
    if attn_implementation is None and model_type == "gemma2":
        attn_implementation = "eager"
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, **kwargs)
    return model.eval()


def write_checkpoint(variant, directory, seed):
    torch.manual_seed(seed)
    model = variant["cls"](variant["config"]).eval()
    # transformers starts norms at one and biases at zero: make them count.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn_like(p))
        if "prepare" in variant:
            variant["prepare"](model)
    if "dtype" in variant:
        model = model.to(variant["dtype"])
    if "write" in variant:
        # A storage save_pretrained does not write (and the model as it was, for a control).
        variant["write"](model, directory)
        model.save_pretrained(directory + ".unquantized")
        return [f for f in os.listdir(directory) if f.endswith(".safetensors")]
    save = {"safe_serialization": True}
    if "max_shard_size" in variant:
        save["max_shard_size"] = variant["max_shard_size"]
    model.save_pretrained(directory, **save)
    shards = [f for f in os.listdir(directory) if f.endswith(".safetensors")]
    if "max_shard_size" in variant and len(shards) < 2:
        raise RuntimeError(f"{directory}: expected several shards, got {shards}")
    return shards


def reference_outputs(model, tokens):
    ids = torch.tensor([tokens])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
        model.generation_config.eos_token_id = None  # exactly GREEDY_TOKENS, as tophat
        model.generation_config.pad_token_id = 0
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=GREEDY_TOKENS)
    return logits, out[0, len(tokens):].tolist()


def incremental_outputs(model, tokens, first):
    """reference_outputs computed as generation does: tokens[:first] in one pass, then every
    later token (and each greedy one) alone against the cache."""
    ids = torch.tensor([tokens])
    with torch.no_grad():
        out = model(ids[:, :first], use_cache=True)
        cache = out.past_key_values
        logits = [out.logits[0]]
        for t in range(first, len(tokens)):
            out = model(ids[:, t:t + 1], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            logits.append(out.logits[0])
        greedy = []
        for _ in range(GREEDY_TOKENS):
            greedy.append(int(out.logits[0, -1].argmax()))
            out = model(torch.tensor([[greedy[-1]]]), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
    return torch.cat(logits).float(), greedy


def run_tophat(runtime_logits, directory, tokens, split, out_path):
    m, k = split
    command = [runtime_logits, "--model", directory, "--tokens", ",".join(map(str, tokens)),
               "-m", str(m), "-k", str(k), "--greedy", str(GREEDY_TOKENS), "--out", out_path]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {result.returncode}:\n"
                           f"{result.stdout}{result.stderr}")
    with open(out_path) as f:
        return json.load(f)


def max_diff(ours, reference):
    return (torch.tensor(ours, dtype=torch.float32) - reference).abs().max().item()


def first_mismatch(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def check_variant(variant, index, runtime_logits, work_dir):
    name = variant["name"]
    directory = os.path.join(work_dir, name)
    shards = write_checkpoint(variant, directory, seed=1000 + index)
    rng = random.Random(index)
    # A multimodal config's vocabulary is its text model's; its image tokens stay out of the
    # prompt (transformers would look for an image to put there).
    vocab = variant.get("tokens_below", getattr(variant["config"], "text_config",
                                                variant["config"]).vocab_size)
    tokens = [rng.randrange(vocab) for _ in range(PROMPT_TOKENS)]
    reference = variant.get("reference", load_reference)(directory)
    outputs = reference_outputs
    if "incremental_from" in variant:
        def outputs(model, tokens):
            return incremental_outputs(model, tokens, variant["incremental_from"])
    ref_logits, ref_greedy = outputs(reference, tokens)
    ours = run_tophat(runtime_logits, directory, tokens, variant.get("split", (1, 1)),
                      os.path.join(work_dir, f"{name}.tophat.json"))

    row = {"variant": name, "files": len(shards), "m_k": f"m={ours['m']} k={ours['k']}",
           "diff": {}, "failures": []}
    for path in ("full", "split", "incremental"):
        diff = max_diff(ours[path], ref_logits)
        row["diff"][path] = diff
        if not diff < TOLERANCE:
            row["failures"].append(f"{path} logits differ by {diff:.3g} (tolerance {TOLERANCE:g})")
    for path in ("greedy_full", "greedy_split"):
        at = first_mismatch(ours[path], ref_greedy)
        if at is not None:
            row["failures"].append(f"{path} {ours[path]} != transformers {ref_greedy} "
                                   f"(from token {at})")
    row["greedy"] = "same" if not any("greedy" in f for f in row["failures"]) else "DIFFER"
    row["scale"] = ref_logits.abs().max().item()

    row["control"] = ""
    if "control" in variant:
        what, make = variant["control"]
        control_logits, _ = outputs(make(directory), tokens)
        diff = max_diff(ours["full"], control_logits)
        row["control"] = f"{what}: {diff:.2g}"
        if not diff > CONTROL_FACTOR * TOLERANCE:
            row["failures"].append(
                f"negative control ({what}) differs by only {diff:.3g}: the variant does not "
                f"exercise its feature")
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runtime-logits", required=True,
                        help="the tophat-runtime-logits program (tests/runtime_logits_main.cc)")
    parser.add_argument("--work-dir", required=True, help="where the checkpoints are written")
    parser.add_argument("--only", help="comma-separated variant names")
    args = parser.parse_args()

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    shutil.rmtree(args.work_dir, ignore_errors=True)
    os.makedirs(args.work_dir)
    print(f"hf_reference: transformers {transformers.__version__}, torch {torch.__version__}; "
          f"{PROMPT_TOKENS} tokens, {GREEDY_TOKENS} greedy; tolerance {TOLERANCE:g} (float32)")
    only = set(args.only.split(",")) if args.only else None
    start = time.monotonic()
    rows = []
    for index, variant in enumerate(VARIANTS):
        if only and variant["name"] not in only:
            continue
        try:
            rows.append(check_variant(variant, index, args.runtime_logits, args.work_dir))
        except Exception as error:  # one broken variant must not hide the others' results
            rows.append({"variant": variant["name"], "failures": [f"{type(error).__name__}: "
                                                                   f"{error}"]})

    header = (f"{'variant':24} {'files':>5} {'split at':>9} {'full':>9} {'split':>9} "
              f"{'incr.':>9} {'greedy':>6} {'max|logit|':>10}  negative control: max diff")
    print(header)
    print("-" * len(header))
    for r in rows:
        if not r.get("diff"):
            print(f"{r['variant']:24} error")
            continue
        d = r["diff"]
        print(f"{r['variant']:24} {r['files']:>5} {r['m_k']:>9} {d['full']:9.2e} "
              f"{d['split']:9.2e} {d['incremental']:9.2e} {r['greedy']:>6} {r['scale']:10.2f}  "
              f"{r['control']}")
    failures = [(r["variant"], f) for r in rows for f in r["failures"]]
    for variant, failure in failures:
        print(f"FAIL {variant}: {failure}")
    print(f"hf_reference: {len(rows) - len({v for v, _ in failures})} of {len(rows)} variants "
          f"agree with transformers ({time.monotonic() - start:.1f} s)")
    return 1 if failures or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
