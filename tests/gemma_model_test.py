#!/usr/bin/env python3
"""Gemma 3's text model (Gemma3ForCausalLM), or Gemma 2 (Gemma2ForCausalLM), through tophat,
end to end.

    python3 tests/gemma_model_test.py BIN_DIR WORK_DIR [gemma3|gemma2]

Builds a small random Gemma3ForCausalLM with transformers (three layers sliding over 6
positions with their own rotary base and one full layer, norms around each sublayer, GELU,
a score scale that is not head_dim's), a byte-level BPE tokenizer with Gemma's control
tokens and a tokenizer_config.json holding Gemma 3's chat template, splits it with `tophat
split` (m = 1, k = 1: the device holds a sliding layer and the full one, the cloud two
sliding ones), distills the drafter's adapter for it (`tophat distill`, a few steps), and
runs tophat-cloud and tophat-agent on loopback, decoding speculatively with drafts whenever
the drafter has any (eta 0.01) and PipeInfer's runs ahead. Through the agent's OpenAI
endpoint and the official client:

- the prompt tophat renders for a conversation (a system message, earlier turns, the model's
  turn opened) is the token ids transformers' apply_chat_template gives;
- greedy completions of prompts longer than the window are the tokens transformers'
  generate(do_sample=False) gives (ignore_eos), and so is a greedy chat answer, which
  <end_of_turn> would end;
- the drafter drafted, and the verification kept some of its drafts (the agent's metrics),
  so those tokens came through speculative decoding, which must not change them;
- a conversation that does not alternate from user is refused, naming the template.

With `gemma2`, the model is a Gemma2ForCausalLM instead: every other layer sliding over 6
positions from the first (the device holds a sliding layer and a full one, and so does the
cloud), one rotary base, attention scores and logits soft-capped (caps low enough to bite at
these weights' scale), and Gemma 2's chat template, which has no system role: the
conversation has none, and one with a system message is refused as the template refuses it.
transformers computes the reference with eager attention, which applies the attention cap
(its SDPA path drops it).

tophat and transformers compute in float32 on the CPU, so greedy choices agree unless two
logits tie within float32's rounding: the weights are drawn wide (initializer_range 0.1),
as tests/hf_reference_test.py draws them, so that they do not. Exits 0 when every check
passes.
"""
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import openai  # noqa: E402
import torch  # noqa: E402
from transformers import (AutoTokenizer, Gemma2Config, Gemma2ForCausalLM,  # noqa: E402
                          Gemma3ForCausalLM, Gemma3TextConfig)

from loopback_daemons import family_test_main  # noqa: E402
from model_checks import FAMILY_CORPUS as CORPUS  # noqa: E402
from model_checks import FAMILY_NEW_TOKENS as NEW_TOKENS  # noqa: E402
from model_checks import (byte_level_bpe, check, check_chat_prompt,  # noqa: E402
                          check_speculative, finish, greedy_chat_answer, greedy_completion,
                          greedy_completion_logprobs, reference_greedy, reference_logprobs)

# Gemma 3's chat template, as its instruction-tuned checkpoints publish it in
# tokenizer_config.json: BOS, a system message's text at the start of the first user turn,
# turns that alternate from user, the assistant's named "model", each content trimmed.
GEMMA3_TEMPLATE = (
    "{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n"
    "    {%- endif -%}\n    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate "
    "user/assistant/user/assistant/...\") }}\n    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n        {%- set role = message['role'] -%}\n    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n        {%- endfor -%}\n    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n    {%- endif -%}\n"
    "    {{ '<end_of_turn>\\n' }}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\\n'}}\n{%- endif -%}\n")

# Gemma 2's chat template, as its instruction-tuned checkpoints publish it: no system role.
GEMMA2_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role "
    "not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') "
    "!= (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}"
    "{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}")


def build_model(directory, family):
    """The tokenizer, tokenizer_config.json and a random Gemma 3 (or 2) checkpoint in
    `directory`."""
    os.makedirs(directory, exist_ok=True)
    tokenizer = byte_level_bpe(
        CORPUS, ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"])
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast",
                   "chat_template": GEMMA2_TEMPLATE if family == "gemma2" else GEMMA3_TEMPLATE,
                   "bos_token": "<bos>", "eos_token": "<eos>",
                   "pad_token": "<pad>", "add_bos_token": True}, f)
    torch.manual_seed(5)
    shared = dict(
        vocab_size=tokenizer.get_vocab_size(), hidden_size=64, intermediate_size=128,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=2048, rms_norm_eps=1e-6, initializer_range=0.1,
        tie_word_embeddings=True, sliding_window=6, query_pre_attn_scalar=24,
        pad_token_id=tokenizer.token_to_id("<pad>"), bos_token_id=tokenizer.token_to_id("<bos>"),
        eos_token_id=[tokenizer.token_to_id("<eos>"), tokenizer.token_to_id("<end_of_turn>")])
    if family == "gemma2":
        # Gemma2Config's layer_types: sliding, full, sliding, full.
        config = Gemma2Config(**shared, attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
                              attn_implementation="eager")
        model = Gemma2ForCausalLM(config).eval()
    else:
        config = Gemma3TextConfig(
            **shared, layer_types=["sliding_attention"] * 3 + ["full_attention"],
            rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
        model = Gemma3ForCausalLM(config).eval()
    # transformers starts Gemma's norms at zero (a scale of one): make them count.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(0.2 * torch.randn_like(p))
    model.save_pretrained(directory, safe_serialization=True)
    return model


def check_capped_logprobs(base, name, model, ids):
    """The log-probabilities tophat reports for a greedy completion are transformers' with
    both of Gemma 2's caps, and transformers' without either cap differ from them by far more
    than the tolerance: greedy choices alone cannot show a cap here (the logit cap keeps the
    order of the logits, and these random weights' choices do not turn on the attention
    cap)."""
    tokens, ours = greedy_completion_logprobs(base, name, ids, NEW_TOKENS)
    tolerance = 1e-4
    reference = reference_logprobs(model, ids, tokens)
    diff = max(abs(a - b) for a, b in zip(ours, reference))
    check(diff < tolerance, f"the log-probabilities of a greedy completion are transformers' "
                            f"with both caps (max difference {diff:.2g}, tolerance {tolerance})")

    def set_caps(attention, logits):
        # Each attention layer keeps its own copy of the score cap.
        model.config.attn_logit_softcapping, model.config.final_logit_softcapping = attention, logits
        for layer in model.model.layers:
            layer.self_attn.attn_logit_softcapping = attention

    saved = (model.config.attn_logit_softcapping, model.config.final_logit_softcapping)
    for what, caps in (("no attention cap", (None, saved[1])), ("no logit cap", (saved[0], None))):
        set_caps(*caps)
        control = reference_logprobs(model, ids, tokens)
        diff = max(abs(a - b) for a, b in zip(ours, control))
        check(diff > 100 * tolerance, f"transformers with {what} differs from them by {diff:.2g}")
    set_caps(*saved)


def run_checks(base, model, hf_tokenizer, metrics_port, family):
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused")
    name = client.models.list().data[0].id
    end_of_turn = hf_tokenizer.convert_tokens_to_ids("<end_of_turn>")
    eos = hf_tokenizer.convert_tokens_to_ids("<eos>")

    conversation = [
        {"role": "system", "content": "Answer briefly. "},
        {"role": "user", "content": "  Which is greater, nine or eleven?\n"},
        {"role": "assistant", "content": "Eleven.\n\n"},
        {"role": "user", "content": "Count the boats twice."},
    ]
    if family == "gemma2":
        try:
            client.chat.completions.create(model=name, max_tokens=4, messages=conversation)
            check(False, "a system message is refused: Gemma 2's template has no system role")
        except openai.BadRequestError as error:
            check("(Gemma 2's) has no system role" in str(error.body),
                  f"a system message is refused, as Gemma 2's template refuses it "
                  f"({error.body})")
        conversation = conversation[1:]
    expected = check_chat_prompt(base, name, hf_tokenizer, conversation)

    # Longer than the window (6) and than both layer kinds' reach in one step.
    for text in CORPUS:
        ids = hf_tokenizer(text, add_special_tokens=True)["input_ids"]
        ours = greedy_completion(base, name, ids, NEW_TOKENS)
        reference = reference_greedy(model, ids, [], NEW_TOKENS)
        check(ours == reference, f"a greedy completion of {len(ids)} prompt tokens is "
                                 f"transformers' (tophat {ours}, transformers {reference})")

    if family == "gemma2":
        check_capped_logprobs(base, name, model, hf_tokenizer(CORPUS[0])["input_ids"])

    ours, finish_reason = greedy_chat_answer(client, name, conversation, NEW_TOKENS)
    reference = reference_greedy(model, expected, [end_of_turn, eos], NEW_TOKENS)
    check(ours == reference, f"a greedy chat answer is transformers' continuation of the "
                             f"rendered prompt (tophat {ours}, transformers {reference}, "
                             f"finish_reason {finish_reason})")

    check_speculative(metrics_port)

    try:
        client.chat.completions.create(model=name, max_tokens=4, messages=[
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Hi."}])
        check(False, "a conversation that starts with the model is refused")
    except openai.BadRequestError as error:
        check("Gemma's template needs user and assistant turns to alternate" in str(error.body),
              f"a conversation that starts with the model is refused, naming the template "
              f"({error.body})")


def main():
    def build(model_dir, family):
        model = build_model(model_dir, family)
        return model, AutoTokenizer.from_pretrained(model_dir)
    family_test_main("gemma_model_test", ["gemma3", "gemma2"], build, run_checks, CORPUS)
    finish()


if __name__ == "__main__":
    main()
