"""What the Python tests that build a small model with its own tokenizer share: checks that
print and count their failures, a byte-level BPE tokenizer trained on a few sentences, a
JSON POST to the agent's endpoint, a metric of its /metrics, token ids from log
probabilities, transformers' greedy continuations to compare with, and the model-family
tests' sentences and conversation, and gpt-oss's MXFP4 storage."""

import json
import os
import re
import urllib.request

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

failures = []

# The model-family tests' (gemma, phi, moe) tokenizer corpus and prompts, greedy answers'
# length, and a conversation with a system message and earlier turns.
FAMILY_CORPUS = ["The old farmer walked to the river and counted the boats twice before noon.",
                 "Which is greater, nine or eleven? Count them on your fingers, then answer."]
FAMILY_NEW_TOKENS = 16
FAMILY_CONVERSATION = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "Which is greater, nine or eleven?"},
    {"role": "assistant", "content": "Eleven."},
    {"role": "user", "content": "Count the boats twice."},
]


def check(condition, what):
    """Prints `what` as passed or failed; a failure is counted, and the run goes on."""
    print(("ok   " if condition else "FAIL ") + what)
    if not condition:
        failures.append(what)


def finish():
    """Exit status 1 when any check failed, after saying how many; else prints PASS."""
    if failures:
        print(f"FAIL: {len(failures)} check(s) failed")
        raise SystemExit(1)
    print("PASS")


def byte_level_bpe(corpus, special_tokens, pre_tokenizer=None, vocab_size=320):
    """A byte-level BPE tokenizer (GPT-2's byte alphabet) trained on `corpus` (20 times over)
    with `special_tokens` first in its vocabulary; `pre_tokenizer` replaces plain ByteLevel."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizer or pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=special_tokens)
    tokenizer.train_from_iterator(corpus * 20, trainer)
    return tokenizer


def post(url, body):
    """POSTs `body` as JSON; the response's JSON (an HTTP error raises)."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


def token_ids(names):
    """Token ids from log-probability entries named token_id:N (return_tokens_as_token_ids)."""
    return [int(name.split(":", 1)[1]) for name in names]


def reference_greedy(model, ids, stop_ids, new_tokens):
    """transformers' greedy continuation of `ids`: `new_tokens` tokens, or up to (without) the
    first of `stop_ids`."""
    import torch
    model.generation_config.eos_token_id = stop_ids or None
    model.generation_config.pad_token_id = 0
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                                                                             dtype=torch.long),
                             do_sample=False, max_new_tokens=new_tokens)
    tokens = out[0, len(ids):].tolist()
    for i, token in enumerate(tokens):
        if token in stop_ids:
            return tokens[:i]
    return tokens


def incremental_greedy(model, ids, stop_ids, new_tokens, first):
    """reference_greedy computed by the model's forward with a cache, as tophat computes a
    sequence: ids[:first] in one pass, each later token (prompt or generated) alone. For
    LongRoPE this turns each position by its own range's factors, which generate() does not
    (transformers' Phi-3 recomputes the whole cache with the long factors once a sequence
    passes the original length)."""
    import torch
    with torch.no_grad():
        out = model(torch.tensor([ids[:first]]), use_cache=True)
        cache = out.past_key_values
        for token in ids[first:]:
            out = model(torch.tensor([[token]]), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
        tokens = []
        while len(tokens) < new_tokens:
            token = int(out.logits[0, -1].argmax())
            if token in stop_ids:
                break
            tokens.append(token)
            out = model(torch.tensor([[token]]), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
    return tokens


def check_chat_prompt(base, name, hf_tokenizer, messages):
    """Checks that the prompt tophat renders for `messages` (the agent's /tokenize) is
    transformers' apply_chat_template ids with the assistant's turn opened; returns those ids."""
    expected = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                tokenize=True, return_dict=False)
    rendered = post(f"{base}/tokenize", {"model": name, "messages": messages})["tokens"]
    check(rendered == expected, f"the chat prompt is transformers' apply_chat_template ids "
                                f"({len(expected)} tokens; tophat {rendered}, transformers "
                                f"{expected})")
    return expected


def greedy_completion(base, name, ids, new_tokens):
    """The token ids of tophat's greedy completion of prompt `ids` (ignore_eos)."""
    return greedy_completion_logprobs(base, name, ids, new_tokens)[0]


def greedy_completion_logprobs(base, name, ids, new_tokens):
    """tophat's greedy completion of prompt `ids` (ignore_eos): its token ids and the
    log-probability of each under the model's distribution."""
    completion = post(f"{base}/v1/completions",
                      {"model": name, "prompt": ids, "max_tokens": new_tokens,
                       "temperature": 0, "ignore_eos": True, "logprobs": 0,
                       "return_tokens_as_token_ids": True})
    logprobs = completion["choices"][0]["logprobs"]
    return token_ids(logprobs["tokens"]), logprobs["token_logprobs"]


def reference_logprobs(model, ids, tokens):
    """transformers' log-probability of each of `tokens` continuing `ids`, in one pass."""
    import torch
    with torch.no_grad():
        logits = model(torch.tensor([ids + tokens])).logits[0].float()
    log_probs = torch.log_softmax(logits, -1)
    return [log_probs[len(ids) - 1 + i, token].item() for i, token in enumerate(tokens)]


def greedy_chat_answer(client, name, messages, new_tokens):
    """tophat's greedy answer to `messages` through the official client: its token ids and
    finish_reason."""
    answer = client.chat.completions.create(
        model=name, messages=messages, max_tokens=new_tokens, temperature=0, logprobs=True,
        extra_body={"return_tokens_as_token_ids": True})
    return (token_ids([entry.token for entry in answer.choices[0].logprobs.content]),
            answer.choices[0].finish_reason)


def check_speculative(metrics_port):
    """Checks that the agent on `metrics_port` drafted and that its verifications kept some of
    the drafts: the answers so far came through speculative decoding."""
    drafted = metric(metrics_port, "tophat_spec_decode_num_draft_tokens_total")
    kept = metric(metrics_port, "tophat_spec_decode_num_accepted_tokens_total")
    check(drafted > 0 and kept > 0, f"the answers above were decoded speculatively: "
                                    f"{kept:.0f} of {drafted:.0f} drafts kept")


def metric(port, name):
    """A counter or gauge without labels from the /metrics page on `port` (0 when absent)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    match = re.search(rf"^{name} ([0-9.e+]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def widen_gpt_oss(model):
    """GptOssForCausalLM starts its experts' biases and its sinks at zero: gate_up's biases at
    sd 8, so that the clamps at +-7 bite; down's at sd 0.5; the sinks at sd 2, so that they
    take a share of each row."""
    import torch
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("gate_up_proj_bias"):
                p.copy_(8.0 * torch.randn_like(p))
            elif name.endswith("down_proj_bias"):
                p.copy_(0.5 * torch.randn_like(p))
            elif name.endswith("sinks"):
                p.copy_(2.0 * torch.randn_like(p))


# e2m1, the 4-bit float of MXFP4: a code's value (the sign in its high bit).
FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0,
              -6.0]


def to_mxfp4(w):
    """w [..., n] (n a multiple of 32) as MXFP4: blocks [..., n/32, 16] and scales [..., n/32],
    each block scaled by the power of two that brings its largest value within 6, each value
    the nearest e2m1 code, two codes a byte, the first in the low nibble."""
    import torch
    *lead, n = w.shape
    groups = w.float().reshape(*lead, n // 32, 32)
    exponent = torch.ceil(torch.log2(groups.abs().amax(-1, keepdim=True).clamp_min(1e-30) / 6))
    codes = (groups / torch.exp2(exponent)).unsqueeze(-1).sub(torch.tensor(FP4_VALUES))
    codes = codes.abs().argmin(-1)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed.to(torch.uint8), (exponent.squeeze(-1) + 127).to(torch.uint8)


def write_gpt_oss_mxfp4(model, directory):
    """A GptOssForCausalLM as OpenAI released gpt-oss: the experts' matrices in MXFP4
    (gate_up_proj_blocks [E, 2I, D/32, 16] with gate_up_proj_scales, rows as a linear layer's;
    down_proj likewise), the rest as is, and quantization_config naming mxfp4."""
    from safetensors.torch import save_file
    tensors = {}
    for name, p in model.state_dict().items():
        if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
            blocks, scales = to_mxfp4(p.transpose(1, 2))
            tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
        else:
            tensors[name] = p.contiguous()
    os.makedirs(directory, exist_ok=True)
    save_file(tensors, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    model.config.save_pretrained(directory)
    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    config["architectures"] = [type(model).__name__]  # what save_pretrained would add
    config["quantization_config"] = {"quant_method": "mxfp4"}
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


def round_experts_to_mxfp4(model):
    """Replaces a GptOssForCausalLM's expert matrices by their MXFP4 rounding, dequantized by
    transformers' own convert_moe_packed_tensors (what its loader runs on a CPU; the loader
    itself needs the accelerate package, which tophat does not install)."""
    import torch
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
                blocks, scales = to_mxfp4(p.transpose(1, 2))
                p.copy_(convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))

