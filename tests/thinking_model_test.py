#!/usr/bin/env python3
"""A thinking model (Qwen3's architecture and chat template) through tophat, end to end.

    python3 tests/thinking_model_test.py BIN_DIR WORK_DIR

Builds a small random Qwen3ForCausalLM with transformers, a byte-level BPE tokenizer with
the `tokenizers` library (ChatML's control tokens and Qwen3's <think> and </think> added
tokens) and a tokenizer_config.json holding Qwen3's chat template, splits it with `tophat
split`, and runs tophat-cloud and tophat-agent on loopback with the agent's OpenAI endpoint.
Then, through the official OpenAI client:

- the prompt tophat renders (vLLM's /tokenize) is the token ids transformers'
  apply_chat_template gives, with thinking on, switched off (enable_thinking false, which
  closes an empty block in the prompt), for a conversation whose earlier answer came back
  with its reasoning in its content (dropped from the prompt, as the template does), and
  for an answer after the last user message with reasoning_content (kept, in its block);
- a chat answer's message.reasoning and message.content are the raw completion of the same
  prompt (/v1/completions, the same seed and bias) cut at its first </think>, and streamed
  the deltas add up to the same two parts;
- thinking_token_budget ends the reasoning after that many tokens (where the model had not
  written </think> sooner) once its text ends between characters (or 3 tokens later), alone
  and with a format after it; on the R1 agent, whose openai.thinking_budget_message is set,
  with that message before </think>; reasoning efforts as the budgets the agent's config
  gives them (none: 0, high: no bound, low refused unless configured, and configured on R1),
  through chat and the Responses API;
- with structured_outputs choice, the reasoning is free and the content after </think> is
  one of the choices: the format holds after the reasoning, not from the first token;
- the Responses API answers with a reasoning item before its message, streamed as
  reasoning_text deltas before the message's text deltas.

Then the same for DeepSeek-R1's template on a small random Qwen2ForCausalLM (R1's distill of
Qwen2.5), with R1's control tokens: its prompts (BOS and the last system message, earlier
reasoning dropped) are transformers' token ids, and its answers, which begin inside the block
the prompt opened, are split at </think> as the raw completion is.

The model is random, so </think> is made likely with logit_bias and answers are sampled
with fixed seeds: every check compares tophat with itself or with transformers, never with
a text written down here. Exits 0 when every check passes.
"""
import json
import os
import shutil
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import openai  # noqa: E402
import torch  # noqa: E402
from tokenizers import AddedToken, Regex, pre_tokenizers  # noqa: E402
from transformers import (AutoTokenizer, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,  # noqa: E402
                          Qwen3ForCausalLM)

from loopback_daemons import serving  # noqa: E402
from model_checks import byte_level_bpe, check, finish, post  # noqa: E402

# Qwen3's chat template (Qwen/Qwen3-0.6B's tokenizer_config.json), tools and all.
QWEN3_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""

# DeepSeek-R1's chat template (deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B's
# tokenizer_config.json): tools as it writes them are not rendered by tophat, and refused.
R1_TEMPLATE = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}"
    "{% endif %}{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, "
    "system_prompt='') %}{%- for message in messages %}{%- if message['role'] == 'system' %}"
    "{% set ns.system_prompt = message['content'] %}{%- endif %}{%- endfor %}{{bos_token}}"
    "{{ns.system_prompt}}{%- for message in messages %}{%- if message['role'] == 'user' %}"
    "{%- set ns.is_tool = false -%}{{'<｜User｜>' + message['content']}}{%- endif %}"
    "{%- if message['role'] == 'assistant' and message['content'] is none %}"
    "{%- set ns.is_tool = false -%}{%- for tool in message['tool_calls']%}"
    "{%- if not ns.is_first %}{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + "
    "tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\\n' + '```json' + '\\n' + "
    "tool['function']['arguments'] + '\\n' + '```' + '<｜tool▁call▁end｜>'}}"
    "{%- set ns.is_first = true -%}{%- else %}{{'\\n' + '<｜tool▁call▁begin｜>' + tool['type'] + "
    "'<｜tool▁sep｜>' + tool['function']['name'] + '\\n' + '```json' + '\\n' + "
    "tool['function']['arguments'] + '\\n' + '```' + '<｜tool▁call▁end｜>'}}"
    "{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}{%- endif %}{%- endfor %}{%- endif %}"
    "{%- if message['role'] == 'assistant' and message['content'] is not none %}"
    "{%- if ns.is_tool %}{{'<｜tool▁outputs▁end｜>' + message['content'] + "
    "'<｜end▁of▁sentence｜>'}}{%- set ns.is_tool = false -%}{%- else %}"
    "{% set content = message['content'] %}{% if '</think>' in content %}"
    "{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endif %}"
    "{%- if message['role'] == 'tool' %}{%- set ns.is_tool = true -%}"
    "{%- if ns.is_output_first %}{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + "
    "message['content'] + '<｜tool▁output▁end｜>'}}{%- set ns.is_output_first = false %}"
    "{%- else %}{{'\\n<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}"
    "{%- endif %}{%- endif %}{%- endfor -%}{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}"
    "{% endif %}{% if add_generation_prompt and not ns.is_tool %}"
    "{{'<｜Assistant｜><think>\\n'}}{% endif %}")
R1_BOS, R1_EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
# The R1 agent's openai.thinking_budget_message.
R1_BUDGET_MESSAGE = "\n\nThe time is up, so the answer follows.\n"
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"""
               r"""[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")

CORPUS = ["Which is greater, 9.11 or 9.8? Compare the tenths first, then the hundredths.",
          "The answer is yes or no. Think it over: the old farmer walked to the river."]


def build_model(directory):
    """The tokenizer, tokenizer_config.json and a random Qwen3 checkpoint in `directory`."""
    os.makedirs(directory, exist_ok=True)
    tokenizer = byte_level_bpe(CORPUS, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    # Qwen3's: added tokens, not special ones (an answer's text shows them).
    tokenizer.add_tokens([AddedToken("<think>", special=False, normalized=False),
                          AddedToken("</think>", special=False, normalized=False)])
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": QWEN3_TEMPLATE,
                   "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                   "bos_token": None, "add_bos_token": False}, f)
    vocab = tokenizer.get_vocab_size()
    torch.manual_seed(7)
    config = Qwen3Config(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=32, max_position_embeddings=2048, rms_norm_eps=1e-6,
                         tie_word_embeddings=True, bos_token_id=None,
                         eos_token_id=tokenizer.token_to_id("<|im_end|>"))
    Qwen3ForCausalLM(config).eval().save_pretrained(directory, safe_serialization=True)
    return tokenizer


def build_r1_model(directory):
    """A random Qwen2ForCausalLM with R1's control tokens and chat template in `directory`:
    DeepSeek-R1-Distill-Qwen's layout (BOS and EOS special; <｜User｜>, <｜Assistant｜>,
    <think> and </think> added tokens that are not)."""
    os.makedirs(directory, exist_ok=True)
    # Qwen2's pre-tokenizer (digits one by one), as the distill's tokenizer.json has it and
    # as transformers' Qwen2Tokenizer puts it back for a qwen2 checkpoint anyway.
    tokenizer = byte_level_bpe(CORPUS, [R1_EOS, R1_BOS], pre_tokenizer=pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]))
    tokenizer.add_tokens([AddedToken(text, special=False, normalized=False)
                          for text in ("<｜User｜>", "<｜Assistant｜>", "<think>", "</think>")])
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": R1_TEMPLATE,
                   "bos_token": R1_BOS, "eos_token": R1_EOS, "pad_token": R1_EOS,
                   "add_bos_token": False}, f, ensure_ascii=False)
    torch.manual_seed(11)
    config = Qwen2Config(vocab_size=tokenizer.get_vocab_size(), hidden_size=64,
                         intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=2048,
                         rms_norm_eps=1e-6, tie_word_embeddings=True,
                         bos_token_id=tokenizer.token_to_id(R1_BOS),
                         eos_token_id=tokenizer.token_to_id(R1_EOS))
    Qwen2ForCausalLM(config).eval().save_pretrained(directory, safe_serialization=True)
    return tokenizer


def byte_level_decoder():
    """GPT-2's byte-level alphabet read back: each of its 256 characters to its byte (the
    printable bytes stand for themselves, the others for 256, 257, ... in order)."""
    shown = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
             + list(range(ord("®"), ord("ÿ") + 1)))
    decoder = {chr(byte): byte for byte in shown}
    others = [byte for byte in range(256) if byte not in shown]
    decoder.update({chr(256 + i): byte for i, byte in enumerate(others)})
    return decoder


BYTE_LEVEL = byte_level_decoder()


def token_bytes(tokenizer, token_id):
    """The bytes token_id adds to the text, as tophat's vocabulary has them: an added token's
    own text, None for a special token."""
    added = tokenizer.get_added_tokens_decoder().get(token_id)
    if added is not None:
        return None if added.special else added.content.encode()
    return bytes(BYTE_LEVEL[c] for c in tokenizer.id_to_token(token_id))


def incomplete_suffix(data):
    """How many bytes at the end of `data` begin a character that more bytes could complete
    (tophat's utf8::IncompleteSuffixLength, written out from UTF-8's definition)."""
    for back in range(1, min(3, len(data)) + 1):
        lead = data[-back]
        if lead < 0xC0:
            continue
        if 0xC2 <= lead <= 0xDF:
            need, low, high = 1, 0x80, 0xBF
        elif 0xE0 <= lead <= 0xEF:
            need = 2
            low, high = (0xA0 if lead == 0xE0 else 0x80), (0x9F if lead == 0xED else 0xBF)
        elif 0xF0 <= lead <= 0xF4:
            need = 3
            low, high = (0x90 if lead == 0xF0 else 0x80), (0x8F if lead == 0xF4 else 0xBF)
        else:
            return 0
        for i, byte in enumerate(data[len(data) - back + 1:]):
            if not low <= byte <= high:
                return 0
            low, high = 0x80, 0xBF
        return back if back - 1 < need else 0
    return 0


def budget_reasoning_tokens(tokenizer, ids, think_end, budget, message_tokens):
    """The reasoning tokens (</think> counted) of an answer whose unbudgeted run, same seed,
    generated `ids`: the model's own </think> where it comes before the budget ends the
    reasoning; else the budget's end, `message_tokens` and </think> after it. The budget ends
    the reasoning once `budget` tokens are generated and its text ends between characters,
    or 3 tokens later (AfterTokenConstraint::kCharacterWait). Also returns how many tokens
    past the budget the forcing waited (None where the model ended first)."""
    natural = ids.index(think_end) if think_end in ids else None
    partial = b""
    for count, token in enumerate(ids):
        if natural is not None and count >= natural:
            break
        if count >= budget and (not partial or count >= budget + 3):
            return count + message_tokens + 1, count - budget
        data = token_bytes(tokenizer, token)
        if data is None:
            partial = b""
        else:
            partial = (partial + data)[-3:]
            pending = incomplete_suffix(partial)
            partial = partial[len(partial) - pending:] if pending else b""
    return (natural + 1 if natural is not None else len(ids)), None


def check_budget(client, base, model, tokenizer, prompt, question, think_end, end_id, label,
                 budget=3, message=""):
    """thinking_token_budget on twelve seeded answers (four with </think> made likelier, four
    with the two bytes of "é" made likelier, so that the budget's end often falls inside a
    character): each has the reasoning tokens budget_reasoning_tokens finds in the same
    seed's raw completion, `message` ends the reasoning where the budget did, and the answer
    goes on after it. Returns how many waited for a character's end."""
    message_tokens = len(tokenizer.encode(message).ids) if message else 0
    lead, continuation = (tokenizer.token_to_id(character) for character in "é".encode()
                          .decode("latin-1"))
    forced = natural_sooner = waited = 0
    for seed in range(12):
        bias = (({str(think_end): 5} if seed % 2 else {}) if seed < 8 else
                {str(lead): 8} if seed < 10 else {str(lead): 6, str(continuation): 6})
        completion = post(f"{base}/v1/completions",
                          {"model": model, "prompt": prompt, "seed": seed, "temperature": 1.0,
                           "max_tokens": budget + 4, "stop_token_ids": [end_id], "logprobs": 0,
                           "return_tokens_as_token_ids": True,
                           "logit_bias": bias})["choices"][0]
        ids = [int(token.split(":")[1]) for token in completion["logprobs"]["tokens"]]
        want, wait = budget_reasoning_tokens(tokenizer, ids, think_end, budget, message_tokens)
        answer = client.chat.completions.create(
            model=model, messages=question, seed=seed, temperature=1.0,
            max_tokens=budget + 3 + message_tokens + 6, logit_bias=bias,
            extra_body={"thinking_token_budget": budget})
        got = answer.usage.completion_tokens_details.reasoning_tokens
        check(got == want, f"{label}seed {seed}: thinking_token_budget {budget}: {got} "
                           f"reasoning tokens, </think> among them, where {want} were due "
                           f"(the budget's end waited {wait} tokens for a character's end)")
        reasoning = (answer.choices[0].message.model_extra or {}).get("reasoning") or ""
        if wait is not None:
            forced += answer.choices[0].message.content is not None
            waited += wait > 0
            if message:
                check(reasoning.rstrip("\n").endswith(message.strip("\n")),
                      f"{label}seed {seed}: the reasoning ends with the budget's message "
                      f"({reasoning!r})")
        else:
            natural_sooner += 1
    check(forced >= 3 and natural_sooner >= 1,
          f"{label}of 12 answers {forced} had their reasoning ended by the budget and content "
          f"after it, {natural_sooner} ended their reasoning within the budget")
    return waited


def split_reasoning(text):
    """The reasoning parser's rule, written out: before the first </think> (the opening tag
    and the newlines around it dropped) is reasoning, after it (leading newlines dropped)
    content; no </think>: all reasoning."""
    before, tag, after = text.partition("</think>")
    before = before.lstrip("\n")
    if before.startswith("<think>"):
        before = before[len("<think>"):]
    return before.strip("\n"), after.lstrip("\n") if tag else ""


def streamed(client, **request):
    reasoning, content = "", ""
    for chunk in client.chat.completions.create(stream=True, **request):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        extra = delta.model_extra or {}
        reasoning += extra.get("reasoning") or ""
        content += delta.content or ""
    return reasoning, content


def check_prompt_ids(base, model, hf, name, messages, template_kwargs=None):
    """tophat's prompt for `messages` (vLLM's /tokenize) is transformers' rendering of the
    template, token for token."""
    kwargs = template_kwargs or {}
    want = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kwargs)
    if hasattr(want, "keys"):  # transformers 5 answers with a BatchEncoding
        want = want["input_ids"]
    body = {"model": model, "messages": messages}
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    got = post(f"{base}/tokenize", body)["tokens"]
    check(got == list(want), f"prompt ({name}): tophat's ids are transformers' "
                             f"({len(got)} against {len(want)})")


def check_reasoning_split(client, base, model, question, think_end, end_id, label):
    """Six seeded answers to `question`: message.reasoning and content are the same request's
    raw completion cut at </think>, whole and streamed, with its reasoning tokens counted.
    Returns the prompt's ids and the sampling used."""
    prompt = post(f"{base}/tokenize", {"model": model, "messages": question})["tokens"]
    sampled = dict(temperature=1.0, max_tokens=40, logit_bias={str(think_end): 4})
    splits_seen = 0
    for seed in range(6):
        completion = post(f"{base}/v1/completions",
                          {"model": model, "prompt": prompt, "seed": seed,
                           "stop_token_ids": [end_id], "logprobs": 0, **sampled})["choices"][0]
        raw = completion["text"]
        tokens = completion["logprobs"]["tokens"]
        want_reasoning_tokens = (tokens.index("</think>") + 1 if "</think>" in tokens
                                 else len(tokens))
        want_reasoning, want_content = split_reasoning(raw)
        answer = client.chat.completions.create(model=model, messages=question, seed=seed,
                                                **sampled)
        message = answer.choices[0].message
        reasoning = (message.model_extra or {}).get("reasoning") or ""
        check(reasoning == want_reasoning and (message.content or "") == want_content,
              f"{label}seed {seed}: message.reasoning {reasoning!r} and content "
              f"{message.content!r} are the raw answer {raw!r} cut at </think>")
        check(answer.usage.completion_tokens_details.reasoning_tokens == want_reasoning_tokens,
              f"{label}seed {seed}: usage counts {want_reasoning_tokens} reasoning tokens "
              f"(got {answer.usage.completion_tokens_details.reasoning_tokens})")
        got_streamed = streamed(client, model=model, messages=question, seed=seed, **sampled)
        check(got_streamed == (want_reasoning, want_content),
              f"{label}seed {seed}: the streamed deltas add up to the same parts "
              f"({got_streamed!r})")
        splits_seen += "</think>" in raw and bool(want_reasoning) and bool(want_content)
    check(splits_seen >= 2,
          f"{label}{splits_seen} of 6 answers had reasoning, </think> and content")
    return prompt, sampled


def run_checks(base, tokenizer, model_dir):
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="none")
    model = client.models.list().data[0].id
    hf = AutoTokenizer.from_pretrained(model_dir)
    think_end = tokenizer.token_to_id("</think>")
    im_end = tokenizer.token_to_id("<|im_end|>")
    question = [{"role": "user", "content": "Which is greater, 9.11 or 9.8?"}]
    earlier = question + [
        {"role": "assistant", "content": "<think>\nCompare the tenths first.\n</think>\n\n9.8"},
        {"role": "user", "content": "yes or no?"}]

    # 1. The prompt, against transformers' own rendering of the template.
    in_progress = question + [{"role": "assistant", "content": "9.8",
                               "reasoning_content": "Compare the tenths first."}]
    for name, messages, kwargs in [("thinking", question, {}),
                                   ("a turn in progress keeps its reasoning", in_progress, {}),
                                   ("enable_thinking false", question,
                                    {"enable_thinking": False}),
                                   ("an earlier answer's reasoning dropped", earlier, {})]:
        check_prompt_ids(base, model, hf, name, messages, kwargs)

    # Tools, in Qwen3's layout: the system turn, a turn in progress with its reasoning and
    # calls, and the tool's answers.
    tools = [{"type": "function", "function": {
        "name": "get_time", "description": "The time in a zone",
        "parameters": {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}},
                       "required": ["zone"], "additionalProperties": False}}}]
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_time", "arguments": '{"zone": "utc"}'}}
    with_tools = [
        ("tools", question),
        ("tools after a system message", [{"role": "system", "content": "Be brief."}] + question),
        ("a call in progress, its reasoning and the tool's answer",
         question + [{"role": "assistant", "content": "", "reasoning_content": "Ask the clock.",
                      "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}]),
    ]
    for name, messages in with_tools:
        hf_messages = [dict(m, tool_calls=[dict(c, function=dict(
            c["function"], arguments=json.loads(c["function"]["arguments"])))
            for c in m["tool_calls"]]) if "tool_calls" in m else m for m in messages]
        want = hf.apply_chat_template(hf_messages, tools=tools, add_generation_prompt=True,
                                      tokenize=True)
        if hasattr(want, "keys"):
            want = want["input_ids"]
        got = post(f"{base}/tokenize", {"model": model, "messages": messages,
                                        "tools": tools})["tokens"]
        check(got == list(want), f"prompt ({name}): tophat's ids are transformers' "
                                 f"({len(got)} against {len(want)})")
    # tool_choice required: free reasoning, then the call its schema allows (an answer of
    # calls needs the content a </think> starts: without it all is reasoning, and no call).
    calls_made = 0
    reasoned = 0
    for seed in range(6):
        try:
            answer = client.chat.completions.create(
                model=model, messages=question, tools=tools, tool_choice="required", seed=seed,
                temperature=1.0, max_tokens=400, logit_bias={str(think_end): 2})
        except openai.APIStatusError as error:
            check(False, f"seed {seed}: tool_choice required: {error}")
            continue
        message = answer.choices[0].message
        if answer.choices[0].finish_reason != "tool_calls":
            continue
        arguments = json.loads(message.tool_calls[0].function.arguments)
        check(message.tool_calls[0].function.name == "get_time" and
              arguments.get("zone") in ("utc", "cet"),
              f"seed {seed}: the call after the reasoning is get_time({arguments})")
        calls_made += 1
        reasoned += bool((message.model_extra or {}).get("reasoning"))
    check(calls_made >= 2 and reasoned >= 1,
          f"{calls_made} of 6 answers made the required call, {reasoned} after free reasoning")

    # 2. Reasoning and content are the raw answer cut at </think>.
    prompt, sampled = check_reasoning_split(client, base, model, question, think_end, im_end,
                                            label="")

    # A thinking budget: </think> forced once that many reasoning tokens are generated, where
    # the model had not written it sooner (the same seed's raw completion tells which), and
    # the answer goes on after it; with a format, the format after the forced </think>.
    waited = check_budget(client, base, model, tokenizer, prompt, question, think_end, im_end,
                          label="")
    # Reasoning efforts with the default budgets: "none" is a budget of 0, "high" no bound,
    # "low" has none configured here, so it is refused naming the key that would set it.
    for seed in range(3):
        sampled_here = dict(model=model, messages=question, seed=seed, temperature=1.0,
                            max_tokens=12)
        none = client.chat.completions.create(reasoning_effort="none", **sampled_here)
        zero = client.chat.completions.create(extra_body={"thinking_token_budget": 0},
                                              **sampled_here)
        high = client.chat.completions.create(reasoning_effort="high", **sampled_here)
        free = client.chat.completions.create(**sampled_here)
        check(none.usage.completion_tokens_details.reasoning_tokens == 1 and
              none.choices[0].message.content == zero.choices[0].message.content and
              high.choices[0].message == free.choices[0].message,
              f"seed {seed}: reasoning_effort none is a budget of 0 "
              f"({none.usage.completion_tokens_details.reasoning_tokens} reasoning tokens), "
              f"high none at all")
    for request, want in [(dict(reasoning_effort="low"), "openai.reasoning_effort_budgets.low"),
                          (dict(reasoning_effort="none",
                                extra_body={"thinking_token_budget": 2}), "give one")]:
        try:
            client.chat.completions.create(model=model, messages=question, max_tokens=4,
                                           **request)
            check(False, f"{request} is refused")
        except openai.BadRequestError as error:
            check(want in str(error.body) and "reasoning_effort" in str(error.body),
                  f"{request} is refused: {error.body}")
    for seed in range(3):
        answer = client.chat.completions.create(
            model=model, messages=question, seed=seed, temperature=1.0, max_tokens=12,
            extra_body={"thinking_token_budget": 2,
                        "structured_outputs": {"choice": ["yes", "no"]}})
        # 2 tokens, at most 3 more for a character's end, and </think>.
        check(answer.usage.completion_tokens_details.reasoning_tokens <= 6 and
              answer.choices[0].message.content in ("yes", "no"),
              f"seed {seed}: a budget of 2 and a choice: "
              f"{answer.usage.completion_tokens_details.reasoning_tokens} reasoning tokens, "
              f"then {answer.choices[0].message.content!r}")

    # 3. A format holds after the reasoning: free reasoning, then one of the choices.
    choices_held = 0
    for seed in range(6):
        answer = client.chat.completions.create(
            model=model, messages=question, seed=seed, temperature=1.0, max_tokens=60,
            logit_bias={str(think_end): 4}, extra_body={"structured_outputs": {
                "choice": ["yes", "no"]}})
        message = answer.choices[0].message
        reasoning = (message.model_extra or {}).get("reasoning") or ""
        finish = answer.choices[0].finish_reason
        if finish == "stop":
            check(message.content in ("yes", "no"),
                  f"seed {seed}: the content after the reasoning is a choice ({message.content!r})")
            choices_held += bool(reasoning)
    check(choices_held >= 2,
          f"{choices_held} of 6 constrained answers reasoned freely, then chose")
    # Thinking switched off: the prompt closed the block, and the answer is all content.
    off = client.chat.completions.create(
        model=model, messages=question, seed=1, temperature=1.0, max_tokens=20,
        extra_body={"chat_template_kwargs": {"enable_thinking": False},
                    "structured_outputs": {"choice": ["yes", "no"]}})
    check(off.choices[0].message.content in ("yes", "no") and
          not (off.choices[0].message.model_extra or {}).get("reasoning"),
          f"enable_thinking false: the answer is the choice at once "
          f"({off.choices[0].message.content!r})")

    # An outline is read from the model's first answer: refused while it thinks.
    try:
        client.chat.completions.create(model=model, messages=question, max_tokens=8,
                                       extra_body={"tophat_outline": True})
        check(False, "tophat_outline while thinking is refused")
    except openai.BadRequestError as error:
        check(error.body.get("param") == "tophat_outline",
              f"tophat_outline while thinking is refused, naming it ({error.body})")

    # 4. The Responses API: a reasoning item, then the message.
    for seed in range(6):
        raw = post(f"{base}/v1/completions",
                   {"model": model, "prompt": prompt, "seed": seed, "stop_token_ids": [im_end],
                    **sampled})["choices"][0]["text"]
        want_reasoning, want_content = split_reasoning(raw)
        if not want_reasoning or not want_content:
            continue
        response = client.responses.create(
            model=model, input=question[0]["content"], temperature=1.0, max_output_tokens=40,
            extra_body={"seed": seed, "logit_bias": {str(think_end): 4}})
        kinds = [item.type for item in response.output]
        check(kinds == ["reasoning", "message"], f"seed {seed}: response items {kinds}")
        check(response.usage.output_tokens_details.reasoning_tokens > 0,
              f"seed {seed}: the response counts "
              f"{response.usage.output_tokens_details.reasoning_tokens} reasoning tokens")
        if kinds == ["reasoning", "message"]:
            check(response.output[0].content[0].text == want_reasoning and
                  response.output_text == want_content,
                  f"seed {seed}: the reasoning item and output_text are the answer's parts")
            # Its output sent back whole as the next turn's input (stateless), reasoning item
            # and all: the template drops the reasoning of a turn before the last question.
            items = [item.model_dump(exclude_none=True) for item in response.output]
            follow_up = question + items + [{"role": "user", "content": "yes or no?"}]
            nxt = client.responses.create(model=model, input=follow_up, temperature=0,
                                          max_output_tokens=4)
            messages = question + [{"role": "assistant", "content": want_content,
                                    "reasoning_content": want_reasoning},
                                   {"role": "user", "content": "yes or no?"}]
            want = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            if hasattr(want, "keys"):
                want = want["input_ids"]
            check(nxt.usage.input_tokens == len(want),
                  f"a response's output sent back as input reads as transformers renders it "
                  f"({nxt.usage.input_tokens} tokens against {len(want)})")
            # Streamed: the reasoning item's deltas, all before the message's, and the
            # response the stream ends with (completed, or incomplete where
            # max_output_tokens cut it) holds the same two items.
            events = list(client.responses.create(
                model=model, input=question[0]["content"], temperature=1.0,
                max_output_tokens=40, stream=True,
                extra_body={"seed": seed, "logit_bias": {str(think_end): 4}}))
            final = events[-1].response
            check(events[-1].type == f"response.{response.status}",
                  f"seed {seed}: the stream ends as the response did ({events[-1].type})")
            deltas = [event for event in events if event.type in (
                "response.reasoning_text.delta", "response.output_text.delta")]
            streamed_reasoning = "".join(event.delta for event in deltas
                                         if event.type == "response.reasoning_text.delta")
            streamed_text = "".join(event.delta for event in deltas
                                    if event.type == "response.output_text.delta")
            kinds_in_order = [event.type for event in deltas]
            check((streamed_reasoning, streamed_text) == (want_reasoning, want_content) and
                  kinds_in_order == sorted(kinds_in_order, reverse=True),
                  f"seed {seed}: streamed reasoning deltas {streamed_reasoning!r} then text "
                  f"deltas {streamed_text!r}, in that order")
            check([item.type for item in final.output] == ["reasoning", "message"] and
                  final.output[0].content[0].text == want_reasoning and
                  final.output_text == want_content,
                  f"seed {seed}: the stream folds into the reasoning item and the message "
                  f"({final.output})")
        break
    else:
        check(False, "no seed gave an answer with both parts for the Responses API")
    return waited


def run_r1_checks(base, tokenizer, model_dir):
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="none")
    model = client.models.list().data[0].id
    hf = AutoTokenizer.from_pretrained(model_dir)
    think_end = tokenizer.token_to_id("</think>")
    question = [{"role": "user", "content": "Which is greater, 9.11 or 9.8?"}]
    # The prompt, against transformers' rendering of R1's template: BOS, the last system
    # message bare, an earlier answer's text after its </think> (the newlines after it kept),
    # reasoning given apart dropped.
    history = [{"role": "system", "content": "Be brief."}] + question + [
        {"role": "assistant", "content": "<think>\nCompare the tenths first.\n</think>\n\n9.8"},
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "yes or no?"}]
    given_apart = question + [
        {"role": "assistant", "content": "9.8", "reasoning_content": "Compare the tenths."},
        {"role": "user", "content": "yes or no?"}]
    for name, messages in [("R1: a question", question),
                           ("R1: system messages and an earlier answer's reasoning", history),
                           ("R1: reasoning given apart", given_apart)]:
        check_prompt_ids(base, model, hf, name, messages)
    # Its answers begin inside the block the prompt opened: reasoning until </think>.
    prompt, _ = check_reasoning_split(client, base, model, question, think_end,
                                      tokenizer.token_to_id(R1_EOS), label="R1 ")
    # This agent has a thinking_budget_message: a spent budget ends the reasoning with it.
    waited = check_budget(client, base, model, tokenizer, prompt, question, think_end,
                          tokenizer.token_to_id(R1_EOS), label="R1 ",
                          message=R1_BUDGET_MESSAGE)
    # This agent sets reasoning_effort_budgets.low to 3: the effort is that budget, through
    # chat and the Responses API, whose response says which effort it was asked for.
    for seed in range(4):
        sampled_here = dict(model=model, seed=seed, temperature=1.0, max_tokens=50)
        low = client.chat.completions.create(messages=question, reasoning_effort="low",
                                             **sampled_here)
        three = client.chat.completions.create(
            messages=question, extra_body={"thinking_token_budget": 3}, **sampled_here)
        response = client.responses.create(
            model=model, input=question[0]["content"], reasoning={"effort": "low"},
            max_output_tokens=50, temperature=1.0, store=False, extra_body={"seed": seed})
        check(low.choices[0].message == three.choices[0].message and
              low.usage.completion_tokens_details.reasoning_tokens ==
              three.usage.completion_tokens_details.reasoning_tokens ==
              response.usage.output_tokens_details.reasoning_tokens and
              response.reasoning.effort == "low",
              f"R1 seed {seed}: reasoning_effort low is thinking_token_budget 3 "
              f"({low.usage.completion_tokens_details.reasoning_tokens} and "
              f"{response.usage.output_tokens_details.reasoning_tokens} reasoning tokens, "
              f"effort {response.reasoning.effort!r})")
    # Tools: R1's template writes no definitions, so tophat refuses them.
    try:
        client.chat.completions.create(model=model, messages=question, max_tokens=4, tools=[
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])
        check(False, "R1: tools are refused")
    except openai.BadRequestError as error:
        check("deepseek_r1" in str(error.body), f"R1: tools are refused, naming the family "
                                                 f"({error.body})")
    return waited


def main():
    bin_dir, work = sys.argv[1:3]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    model_dir = os.path.join(work, "qwen3")
    tokenizer = build_model(model_dir)
    with serving(bin_dir, os.path.join(work, "qwen3-serving"), model_dir) as base:
        waited = run_checks(base, tokenizer, model_dir)
    # A budget message holding </think> would end the reasoning before the budget's own:
    # the agent refuses to start, naming the key.
    with open(os.path.join(work, "qwen3-serving", "agent.yaml")) as f:
        config = f.read() + '  thinking_budget_message: "Enough.</think>"\n'
    bad_config = os.path.join(work, "qwen3-serving", "bad-message.yaml")
    with open(bad_config, "w") as f:
        f.write(config)
    refused = subprocess.run([f"{bin_dir}/tophat-agent", "--config", bad_config],
                             capture_output=True, text=True, timeout=60)
    output = refused.stdout + refused.stderr
    check(refused.returncode != 0 and "openai.thinking_budget_message" in output and
          "would end the reasoning itself" in output,
          f"a budget message holding </think> is refused at the start "
          f"(exit {refused.returncode}: "
          f"{[line for line in output.splitlines() if 'thinking_budget' in line]})")
    r1_dir = os.path.join(work, "r1")
    r1_tokenizer = build_r1_model(r1_dir)
    with serving(bin_dir, os.path.join(work, "r1-serving"), r1_dir,
                 openai_settings=f"  thinking_budget_message: {json.dumps(R1_BUDGET_MESSAGE)}\n"
                                 f"  reasoning_effort_budgets:\n    low: 3\n") as base:
        waited += run_r1_checks(base, r1_tokenizer, r1_dir)
    # The byte-level vocabularies' random models write parts of characters often enough that
    # some budgets end inside one, and the forcing waits.
    check(waited >= 2, f"{waited} of 24 budgeted answers waited for a character's end")
    finish()


if __name__ == "__main__":
    main()
