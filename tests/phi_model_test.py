#!/usr/bin/env python3
"""Phi-4-mini's architecture (Phi3ForCausalLM), or Phi-4's (14B), through tophat, end to end.

    python3 tests/phi_model_test.py BIN_DIR WORK_DIR [phi4_mini|phi4]

Builds a small random Phi3ForCausalLM with transformers, with Phi-4-mini's attention: rotary
over 3/4 of each head, LongRoPE (its short factors below the original length, its long ones
from there, and the attention factor), q/k/v and gate/up stored fused, tied embeddings, GQA.
A byte-level BPE tokenizer with Phi's control tokens and a tokenizer_config.json holding
Phi-4-mini's chat template go beside it. `tophat split` (m = 1, k = 1) cuts it, `tophat
distill` trains the drafter's adapter for it (a few steps), and tophat-cloud and tophat-agent
serve it on loopback, decoding speculatively with drafts whenever the drafter has any (eta
0.01) and PipeInfer's runs ahead. Through the agent's OpenAI endpoint and the official client:

- the prompt tophat renders for a conversation (a system message, earlier turns, the
  assistant's turn opened) is the token ids transformers' apply_chat_template gives;
- greedy completions are the tokens transformers' model computes greedily (ignore_eos), and
  so is a greedy chat answer, which <|end|> would end. The original length (30) falls inside
  one prompt and the chat prompt and after the other prompt, so positions turn by both sets
  of factors. The reference is the model's forward with a cache, the original length's
  tokens in one pass and each later one alone, which turns each position by its own range's
  factors as tophat does; generate() would not (transformers' Phi-3 recomputes the whole
  cache with the long factors once a sequence passes the original length:
  docs/architecture.md, "Numerics");
- the drafter drafted, and the verification kept some of its drafts (the agent's metrics).

With `phi4`, the model has Phi-4's (14B) attention instead (rotary over whole heads, one rope
theta, untied embeddings) and Phi-4's chat template (ChatML with <|im_sep|> between each role
and its content, nothing between turns), whose <|im_end|> ends an answer; the references are
generate()'s.

tophat and transformers compute in float32 on the CPU; the weights are drawn wide
(initializer_range 0.1) so that greedy choices are not near-ties. Exits 0 when every check
passes.
"""
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import openai  # noqa: E402
import torch  # noqa: E402
from transformers import AutoTokenizer, Phi3Config, Phi3ForCausalLM  # noqa: E402

from loopback_daemons import family_test_main  # noqa: E402
from model_checks import FAMILY_CORPUS as CORPUS  # noqa: E402
from model_checks import FAMILY_NEW_TOKENS as NEW_TOKENS  # noqa: E402
from model_checks import FAMILY_CONVERSATION as CONVERSATION  # noqa: E402
from model_checks import (byte_level_bpe, check, check_chat_prompt,  # noqa: E402
                          check_speculative, finish, greedy_chat_answer, greedy_completion,
                          incremental_greedy, reference_greedy)

# Phi-4-mini-instruct's chat template, as its tokenizer_config.json publishes it: each message
# between <|role|> and <|end|>, no newlines, then <|assistant|>.
PHI4_MINI_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and "
    "message['tools'] is not none %}{{ '<|' + message['role'] + '|>' + message['content'] + "
    "'<|tool|>' + message['tools'] + '<|/tool|>' + '<|end|>' }}{% else %}{{ '<|' + "
    "message['role'] + '|>' + message['content'] + '<|end|>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}")

# Phi-4's (14B) chat template, as its tokenizer_config.json publishes it.
PHI4_TEMPLATE = (
    "{% for message in messages %}{% if (message['role'] == 'system') %}{{'<|im_start|>system"
    "<|im_sep|>' + message['content'] + '<|im_end|>'}}{% elif (message['role'] == 'user') %}"
    "{{'<|im_start|>user<|im_sep|>' + message['content'] + '<|im_end|>'}}{% elif "
    "(message['role'] == 'assistant') %}{{'<|im_start|>assistant<|im_sep|>' + "
    "message['content'] + '<|im_end|>'}}{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant<|im_sep|>' }}{% endif %}")


ORIGINAL = 30  # LongRoPE's original length
SPECIALS = ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
PHI4_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_sep|>", "<|im_end|>"]


def save_model(model, directory):
    """Writes `model` to `directory` with its norms drawn around one (transformers starts them
    at one exactly, which would hide a norm's weight); returns it."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    model.save_pretrained(directory, safe_serialization=True)
    return model


def build_model(directory, family):
    """The tokenizer, tokenizer_config.json and a random Phi-3 checkpoint in `directory`."""
    os.makedirs(directory, exist_ok=True)
    tokenizer = byte_level_bpe(CORPUS, PHI4_SPECIALS if family == "phi4" else SPECIALS)
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast",
                   "chat_template": PHI4_TEMPLATE if family == "phi4" else PHI4_MINI_TEMPLATE,
                   "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                   "add_bos_token": False}, f)
    hf_tokenizer = AutoTokenizer.from_pretrained(directory)
    if family == "phi4":
        return build_phi4(directory, tokenizer, hf_tokenizer), hf_tokenizer
    prompts = [hf_tokenizer(text)["input_ids"] for text in CORPUS]
    prompts.append(hf_tokenizer.apply_chat_template(CONVERSATION, add_generation_prompt=True,
                                                    tokenize=True, return_dict=False))
    # The prompts above are 27, 31 and 49 tokens long: one ends before the original length,
    # two pass it.
    lengths = sorted(len(p) for p in prompts)
    if not lengths[0] < ORIGINAL < lengths[1]:
        raise RuntimeError(f"prompts of {lengths} tokens do not straddle {ORIGINAL}")
    torch.manual_seed(5)
    end, endoftext = (tokenizer.token_to_id(t) for t in ("<|end|>", "<|endoftext|>"))
    config = Phi3Config(
        vocab_size=tokenizer.get_vocab_size(), hidden_size=64, intermediate_size=128,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=2048, original_max_position_embeddings=ORIGINAL,
        partial_rotary_factor=0.75, rms_norm_eps=1e-5, initializer_range=0.1,
        tie_word_embeddings=True, sliding_window=None,
        rope_scaling={"type": "longrope", "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5],
                      "long_factor": [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]},
        pad_token_id=endoftext, bos_token_id=endoftext, eos_token_id=[endoftext, end])
    model = save_model(Phi3ForCausalLM(config).eval(), directory)
    return model, hf_tokenizer


def build_phi4(directory, tokenizer, hf_tokenizer):
    """A random checkpoint of Phi-4's attention: whole-head rotary, one theta, untied."""
    torch.manual_seed(6)
    im_end, endoftext = (tokenizer.token_to_id(t) for t in ("<|im_end|>", "<|endoftext|>"))
    config = Phi3Config(
        vocab_size=tokenizer.get_vocab_size(), hidden_size=64, intermediate_size=128,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=2048, original_max_position_embeddings=2048, rope_theta=250000.0,
        rope_scaling=None, rms_norm_eps=1e-5, initializer_range=0.1, tie_word_embeddings=False,
        sliding_window=None, pad_token_id=endoftext, bos_token_id=endoftext, eos_token_id=im_end)
    model = save_model(Phi3ForCausalLM(config).eval(), directory)
    return model


def run_checks(base, model, hf_tokenizer, metrics_port, family):
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused")
    name = client.models.list().data[0].id
    end = "<|im_end|>" if family == "phi4" else "<|end|>"
    stop_ids = [hf_tokenizer.convert_tokens_to_ids(t) for t in (end, "<|endoftext|>")]

    def reference(ids, stops):
        # Phi-4-mini's LongRoPE: the original length's tokens in one pass, then one a pass.
        if family == "phi4":
            return reference_greedy(model, ids, stops, NEW_TOKENS)
        return incremental_greedy(model, ids, stops, NEW_TOKENS, min(len(ids), ORIGINAL))

    expected = check_chat_prompt(base, name, hf_tokenizer, CONVERSATION)
    for text in CORPUS:
        ids = hf_tokenizer(text)["input_ids"]
        ours = greedy_completion(base, name, ids, NEW_TOKENS)
        theirs = reference(ids, [])
        past = "" if family == "phi4" else f", past the original length {ORIGINAL},"
        check(ours == theirs, f"a greedy completion of {len(ids)} prompt tokens{past} is "
                              f"transformers' (tophat {ours}, transformers {theirs})")

    ours, finish_reason = greedy_chat_answer(client, name, CONVERSATION, NEW_TOKENS)
    theirs = reference(expected, stop_ids)
    check(ours == theirs, f"a greedy chat answer is transformers' continuation of the "
                          f"rendered prompt, which {end} would end (tophat {ours}, "
                          f"transformers {theirs}, finish_reason {finish_reason})")
    check_speculative(metrics_port)


def main():
    family_test_main("phi_model_test", ["phi4_mini", "phi4"], build_model, run_checks, CORPUS)
    finish()


if __name__ == "__main__":
    main()
