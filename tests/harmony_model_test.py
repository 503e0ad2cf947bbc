#!/usr/bin/env python3
"""gpt-oss's chat (OpenAI's harmony format) through tophat, end to end.

    python3 tests/harmony_model_test.py BIN_DIR WORK_DIR

Builds a small random GptOssForCausalLM with transformers, a byte-level BPE tokenizer with
harmony's control tokens as special tokens (as o200k_harmony has them), and a
tokenizer_config.json holding gpt-oss's chat template (tests/gpt_oss_chat_template.jinja,
openai/gpt-oss-20b's), splits it with `tophat split`, and runs tophat-cloud and tophat-agent
on loopback with the agent's OpenAI endpoint. Then, through the official OpenAI client:

- the prompt tophat renders (vLLM's /tokenize) is the token ids transformers'
  apply_chat_template gives, for a plain question; a system message (the developer's
  instructions) and an earlier answer with its reasoning (dropped); tools (a TypeScript
  namespace), a call and the tool's answer, then a final answer; a call with no answer yet
  (its reasoning kept), at reasoning_effort high (chat_template_kwargs);
- a chat answer's message.reasoning, message.content, finish_reason and usage's
  reasoning_tokens are the raw completion of the same prompt (/v1/completions, the same
  seed and bias) read by harmony's channels (the rule written out below: analysis is
  reasoning, final and commentary without a recipient content, a call's body content unless
  it is a valid call; <|return|> and <|call|> end the answer), whole and streamed, with
  tools offered and without, and at reasoning_effort low (the request's parameter, rendered
  into the system message as transformers renders it);
- under tool_choice "required" (a question the model answers without a call) and a named
  function (a question it calls another tool for), the answer reasons as the unconstrained
  one does and then is one call of an offered tool with arguments its parameters take, never
  content; whole, streamed, sampled, and through the Responses API;
- thinking_token_budget beside a required call ends the reasoning after its first tokens,
  and the call follows;
- what tophat does not do with harmony (an effort gpt-oss lacks, an outline) is a 400
  naming the parameter.

The model is random, so the control tokens and the channel names are made likely with
logit_bias, and the bytes that are not ASCII unlikely (each answer is then whole characters
token by token, and the rule's text is each token's); every check compares tophat with
itself or with transformers, never with a text written down here. Exits 0 when every check
passes.
"""
import datetime
import json
import os
import re
import shutil
import sys
import urllib.error

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import openai  # noqa: E402
import torch  # noqa: E402
from tokenizers import AddedToken  # noqa: E402
from transformers import AutoTokenizer, GptOssConfig, GptOssForCausalLM  # noqa: E402

from loopback_daemons import serving  # noqa: E402
from model_checks import byte_level_bpe, check, finish, post, token_ids  # noqa: E402

SPECIALS = ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|start|>", "<|end|>",
            "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>"]
CHANNELS = ["analysis", "commentary", "final"]
CORPUS = ["The analysis comes first, then the final answer: the weather in Paris is mild.",
          "Which is greater, nine or eleven? Count them on your fingers, then answer final.",
          "commentary to=functions.get_weather json analysis final analysis final"]
TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt_oss_chat_template.jinja")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "Its name"},
        "unit": {"type": "string", "enum": ["c", "f"], "default": "c"},
        "days": {"type": "integer", "default": 1},
        "hours": {"type": "array", "items": {"type": "integer"}},
        "where": {"type": "object", "properties": {"lat": {"type": "number"},
                                                   "lon": {"type": "number"}},
                  "required": ["lat"]}},
        "required": ["city"]}}}
NOW = {"type": "function", "function": {"name": "now", "description": "The time"}}
QUESTION = [{"role": "user", "content": "Which is greater, nine or eleven?"}]
WEATHER_QUESTION = [{"role": "user", "content": "The weather in Paris?"}]


def build_model(directory):
    """The tokenizer, tokenizer_config.json and a random gpt-oss checkpoint in `directory`."""
    os.makedirs(directory, exist_ok=True)
    tokenizer = byte_level_bpe(CORPUS, SPECIALS)
    # The channels' names are one token each, as in o200k_harmony.
    tokenizer.add_tokens([AddedToken(word, special=False, normalized=False)
                          for word in CHANNELS])
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    with open(TEMPLATE, encoding="utf-8") as f:
        template = f.read()
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template,
                   "eos_token": "<|return|>", "pad_token": "<|endoftext|>",
                   "bos_token": "<|startoftext|>", "add_bos_token": False}, f)
    torch.manual_seed(5)
    config = GptOssConfig(vocab_size=tokenizer.get_vocab_size(), hidden_size=64,
                          intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=16, num_local_experts=4,
                          num_experts_per_tok=2, sliding_window=8, max_position_embeddings=4096,
                          initializer_range=0.1, tie_word_embeddings=False,
                          eos_token_id=tokenizer.token_to_id("<|return|>"),
                          pad_token_id=tokenizer.token_to_id("<|endoftext|>"))
    model = GptOssForCausalLM(config)
    teach_harmony(model, AutoTokenizer.from_pretrained(directory), template)
    model.eval().save_pretrained(directory, safe_serialization=True)
    return tokenizer


# What the model is taught to answer (TAUGHT): the prompt's messages, its tools and effort,
# and the answer in harmony's channels: reasoning then an answer, or a call.
TAUGHT = [
    (QUESTION, None, None,
     "<|channel|>analysis<|message|>Eleven has two digits.<|end|><|start|>assistant"
     "<|channel|>final<|message|>Eleven is greater.<|return|>"),
    (QUESTION, None, "low",
     "<|channel|>analysis<|message|>Count.<|end|><|start|>assistant<|channel|>final<|message|>"
     "Eleven.<|return|>"),
    (WEATHER_QUESTION, [WEATHER, NOW], None,
     "<|channel|>analysis<|message|>Ask the tool.<|end|><|start|>assistant<|channel|>"
     "commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}"
     "<|call|>"),
]


def teach_harmony(model, hf, template, steps=120):
    """Trains the random model on TAUGHT's answers (the prompts as the template renders them
    today and tomorrow, the date being in them) until it writes them: a model that speaks
    harmony, as gpt-oss does, so that its answers have channels and calls to read."""
    today = datetime.date.today()
    examples = []
    for day in (today, today + datetime.timedelta(days=1)):
        dated = template.replace('strftime_now("%Y-%m-%d")', f'"{day.isoformat()}"')
        for messages, tools, effort, answer in TAUGHT:
            kwargs = {"reasoning_effort": effort} if effort else {}
            prompt = hf_ids(hf, messages, tools=tools, chat_template=dated, **kwargs)
            target = hf(answer, add_special_tokens=False)["input_ids"]
            examples.append((torch.tensor([prompt + target]),
                             torch.tensor([[-100] * len(prompt) + target])))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        loss = sum(model(input_ids=ids, labels=labels).loss for ids, labels in examples)
        loss.backward()
        optimizer.step()
    print(f"taught harmony: loss {loss.item() / len(examples):.4f} a token after {steps} steps")


def hf_ids(hf, messages, **kwargs):
    ids = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kwargs)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def check_prompt(base, model, hf, label, ours, theirs, tools=None, template_kwargs=None):
    """/tokenize of `ours` (OpenAI's message shapes) is apply_chat_template of `theirs` (the
    template's: reasoning as "thinking", arguments as objects). The template writes today's
    date: transformers renders before and after, and tophat's must be one of the two."""
    kwargs = dict(template_kwargs or {})
    if tools:
        kwargs["tools"] = tools
    before = hf_ids(hf, theirs, **kwargs)
    body = {"model": model, "messages": ours}
    if tools:
        body["tools"] = tools
    if template_kwargs:
        body["chat_template_kwargs"] = template_kwargs
    got = post(f"{base}/tokenize", body)["tokens"]
    after = hf_ids(hf, theirs, **kwargs)
    check(got in (before, after), f"prompt ({label}): tophat's {len(got)} ids are "
                                  f"transformers' ({len(before)})")


def read_harmony(tokenizer, ids, tools):
    """harmony's reading of an answer, written out: the answer starts in an assistant
    header; a header runs to <|message|> (its channel the word after <|channel|>, its
    recipient "to=..."); a body to <|end|>, <|start|> or <|channel|> (which begin the next
    header) or <|return|> / <|call|> (which end the answer). analysis bodies are reasoning
    (messages parted by a blank line); final, commentary without a recipient and unknown
    channels content; a body with a recipient a call. A header longer than 256 bytes, or
    one the answer ends in, is content. Calls are the answer's when every one is to
    functions.NAME of an offered tool (`tools`, by name) with a JSON object holding its
    required keys (the taught call's schema asks no more); else their bodies follow the
    content. Returns (reasoning, content, reasoning tokens, whether the answer ended, calls
    as (name, arguments))."""
    special = {tokenizer.token_to_id(name): name for name in SPECIALS}
    state, header, header_text, header_tokens = "header", "", "", 0
    channel_at, kind, parts_started = None, "content", False
    reasoning, content, calls, call_body, reasoning_tokens = "", "", [], "", 0
    ended = False

    def open_body():
        nonlocal kind, call_body, parts_started, reasoning_tokens
        recipient = ""
        if "to=" in header:
            recipient = re.match(r"[^ \t\n]*", header[header.index("to=") + 3:]).group(0)
        channel = ""
        if channel_at is not None:
            channel = re.match(r"[ \t\n]*([^ \t\n]*)", header[channel_at:]).group(1)
        if recipient and recipient not in ("user", "all"):
            kind, call_body = "call", ""
            calls.append([recipient, ""])
        else:
            kind = "reasoning" if channel == "analysis" else "content"
        if kind == "reasoning":
            reasoning_tokens += header_tokens
        parts_started = False

    for token in ids:
        if ended:
            break
        name = special.get(token)
        text = "" if name else tokenizer.decode([token])
        counted = state == "body" and kind == "reasoning"
        if counted:
            reasoning_tokens += 1
        if name in ("<|return|>", "<|call|>"):
            if state == "header":
                content += header_text
            ended = True
            break
        if name in ("<|end|>", "<|start|>"):
            if state == "header" and name == "<|start|>" and header_text:
                content += header_text
                state = "body"
            if state == "body":
                state, header, header_text, header_tokens, channel_at = "header", "", "", 0, None
            if name == "<|start|>":
                header_tokens += 1
            continue
        if state == "body" and name == "<|channel|>":
            state, header, header_text, header_tokens, channel_at = "header", "", "", 0, None
        if state == "header":
            if not counted:  # a <|channel|> that ended reasoning was counted there
                header_tokens += 1
            if name == "<|message|>":
                open_body()
                state, header, header_text, header_tokens, channel_at = "body", "", "", 0, None
            elif name in ("<|channel|>", "<|constrain|>"):
                header += " "
                if name == "<|channel|>":
                    channel_at = len(header)
            else:
                header += text
                header_text += text
                if len(header_text.encode()) > 256:
                    content += header_text
                    state, kind, parts_started = "body", "content", False
                    header, header_text, header_tokens, channel_at = "", "", 0, None
            continue
        if name in ("<|message|>", "<|constrain|>"):
            continue
        if kind == "reasoning" and text:
            if not parts_started and reasoning:
                reasoning += "\n\n"
            reasoning += text
            parts_started = True
        elif kind == "call":
            calls[-1][1] += text
        else:
            content += text
    if not ended and state == "header":
        content += header_text

    def valid(recipient, body):
        try:
            arguments = json.loads(body)
        except ValueError:
            return False
        name = recipient[len("functions."):]
        return (recipient.startswith("functions.") and name in tools and
                isinstance(arguments, dict) and
                all(key in arguments for key in
                    tools[name]["function"].get("parameters", {}).get("required", [])))
    if calls and all(valid(*call) for call in calls):
        return reasoning, content, reasoning_tokens, ended, [
            (recipient[len("functions."):], json.loads(body)) for recipient, body in calls]
    content += "".join(body for _, body in calls)
    return reasoning, content, reasoning_tokens, ended, []


def streamed(client, **request):
    """A streamed answer's reasoning, content and calls, its deltas added up."""
    reasoning, content, calls = "", "", []
    for chunk in client.chat.completions.create(stream=True, **request):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        reasoning += (delta.model_extra or {}).get("reasoning") or ""
        content += delta.content or ""
        for call in delta.tool_calls or []:
            calls.append((call.function.name, json.loads(call.function.arguments)))
    return reasoning, content, calls


def check_answers(client, base, model, tokenizer, hf, label, question, tools=None, effort=None,
                  seeds=range(4)):
    """Answers to `question` (greedy, then sampled with `seeds`) against the raw completion of
    transformers' prompt read by harmony's rule. Returns the greedy answer's parts."""
    kwargs = {"reasoning_effort": effort} if effort else {}
    if tools:
        kwargs["tools"] = tools
    prompt = hf_ids(hf, question, **kwargs)
    ids = {name: tokenizer.token_to_id(name) for name in SPECIALS}
    # Bytes that are not ASCII, unlikely: every token is then whole characters.
    bias = {}
    for token in range(tokenizer.get_vocab_size()):
        if token not in ids.values() and any(ord(c) > 126 or ord(c) < 32
                                             for c in tokenizer.decode([token])):
            bias[str(token)] = -100
    greedy = None
    for seed in [None, *seeds]:
        sampled = dict(temperature=0.0 if seed is None else 1.0, max_tokens=96, logit_bias=bias)
        if seed is not None:
            sampled["seed"] = seed
        name = f"{label} {'greedy' if seed is None else f'seed {seed}'}"
        completion = post(f"{base}/v1/completions",
                          {"model": model, "prompt": prompt, "logprobs": 0,
                           "return_tokens_as_token_ids": True,
                           "stop_token_ids": [ids["<|return|>"], ids["<|call|>"]],
                           **sampled})["choices"][0]
        raw = token_ids(completion["logprobs"]["tokens"])
        want = read_harmony(tokenizer, raw,
                            {tool["function"]["name"]: tool for tool in tools or []})
        want_reasoning, want_content, want_tokens, ended, want_calls = want
        request = dict(model=model, messages=question, **sampled)
        if tools:
            request["tools"] = tools
        if effort:
            request["reasoning_effort"] = effort
        answer = client.chat.completions.create(**request)
        message = answer.choices[0].message
        reasoning = (message.model_extra or {}).get("reasoning") or ""
        calls = [(call.function.name, json.loads(call.function.arguments))
                 for call in message.tool_calls or []]
        check(reasoning == want_reasoning and (message.content or "") == want_content and
              calls == want_calls,
              f"{name}: message.reasoning {reasoning!r}, content {message.content!r} and "
              f"calls {calls} are the raw answer read by channel ({want_reasoning!r}, "
              f"{want_content!r}, {want_calls})")
        want_finish = "length" if not ended else "tool_calls" if want_calls else "stop"
        check(answer.choices[0].finish_reason == want_finish,
              f"{name}: finish_reason {answer.choices[0].finish_reason} (want {want_finish})")
        got_tokens = answer.usage.completion_tokens_details.reasoning_tokens
        check(got_tokens == want_tokens,
              f"{name}: usage counts {want_tokens} reasoning tokens (got {got_tokens})")
        got_streamed = streamed(client, **request)
        check(got_streamed == (want_reasoning, want_content, want_calls),
              f"{name}: the streamed deltas add up to the same parts ({got_streamed!r})")
        if seed is None:
            greedy = (reasoning, message.content or "", calls, answer.choices[0].finish_reason)
    return greedy


def greedy_raw(base, model, tokenizer, prompt):
    """The token ids of the greedy raw completion of `prompt`, to its end."""
    completion = post(f"{base}/v1/completions",
                      {"model": model, "prompt": prompt, "temperature": 0, "max_tokens": 96,
                       "logprobs": 0, "return_tokens_as_token_ids": True,
                       "stop_token_ids": [tokenizer.token_to_id("<|return|>"),
                                          tokenizer.token_to_id("<|call|>")]})
    return token_ids(completion["choices"][0]["logprobs"]["tokens"])


def check_final_format(client, base, model, tokenizer, hf):
    """A format holds in the final channel only: the reasoning is the unformatted answer's,
    and the content one of the choices, a match of the regex, or a value of the schema;
    whole and streamed."""
    want_reasoning = read_harmony(tokenizer, greedy_raw(base, model, tokenizer,
                                                        hf_ids(hf, QUESTION)), {})[0]
    for label, extra, holds in (
            ("choice", {"structured_outputs": {"choice": ["nine", "eleven"]}},
             lambda text: text in ("nine", "eleven")),
            ("regex", {"structured_outputs": {"regex": "The answer is (nine|eleven)[.]"}},
             lambda text: text in ("The answer is nine.", "The answer is eleven.")),
            # The taught model writes JSON's whitespace freely: an object with no room for it.
            ("json_schema", {"response_format": {"type": "json_schema", "json_schema": {
                "name": "pick", "schema": {"type": "boolean"}}}},
             lambda text: json.loads(text) in (True, False))):
        request = dict(model=model, messages=QUESTION, temperature=0, max_tokens=96)
        body = {key: value for key, value in extra.items() if key == "response_format"}
        answer = client.chat.completions.create(
            **request, **body, extra_body={k: v for k, v in extra.items() if k not in body})
        message = answer.choices[0].message
        reasoning = (message.model_extra or {}).get("reasoning") or ""
        try:
            held = holds(message.content or "")
        except (ValueError, KeyError, TypeError):
            held = False
        check(reasoning == want_reasoning and held and answer.choices[0].finish_reason == "stop",
              f"{label}: the reasoning is free ({reasoning!r}, unformatted {want_reasoning!r}) "
              f"and the final channel holds to the format ({message.content!r}, "
              f"{answer.choices[0].finish_reason})")
        got = streamed(client, **request, **body,
                       extra_body={k: v for k, v in extra.items() if k not in body})
        check(got == (reasoning, message.content or "", []),
              f"{label}: streamed the same ({got!r})")


def check_budget(client, base, model, tokenizer, hf, budget=5):
    """thinking_token_budget counts the answer's tokens before its final channel: spent, it
    ends the message of reasoning and opens the final one, and the answer follows."""
    raw = greedy_raw(base, model, tokenizer, hf_ids(hf, QUESTION))
    end = tokenizer.token_to_id("<|end|>")
    want_reasoning = read_harmony(tokenizer, raw[:budget] + [end], {})[0]
    answer = client.chat.completions.create(model=model, messages=QUESTION, temperature=0,
                                            max_tokens=96,
                                            extra_body={"thinking_token_budget": budget})
    message = answer.choices[0].message
    reasoning = (message.model_extra or {}).get("reasoning") or ""
    full_reasoning = read_harmony(tokenizer, raw, {})[0]
    check(reasoning == want_reasoning and reasoning != full_reasoning and message.content,
          f"thinking_token_budget {budget}: the reasoning stops at its first {budget} tokens "
          f"({reasoning!r}; unbudgeted {full_reasoning!r}), then the answer "
          f"({message.content!r})")
    # The analysis message's tokens: the budget, and the <|end|> forced after it.
    got = answer.usage.completion_tokens_details.reasoning_tokens
    check(got == budget + 1, f"thinking_token_budget {budget}: {got} reasoning tokens counted "
                             f"(want {budget + 1})")


def check_responses(client, base, model, tokenizer, hf):
    """The Responses API answers gpt-oss as chat does: a reasoning item, then the message, or
    then a function call; the call and its output sent back render as transformers renders
    the conversation."""
    want = read_harmony(tokenizer, greedy_raw(base, model, tokenizer, hf_ids(hf, QUESTION)), {})
    response = client.responses.create(model=model, input=QUESTION[0]["content"], temperature=0,
                                       max_output_tokens=96)
    kinds = [item.type for item in response.output]
    check(kinds == ["reasoning", "message"] and
          response.output[0].content[0].text == want[0] and response.output_text == want[1] and
          response.usage.output_tokens_details.reasoning_tokens == want[2],
          f"Responses: a reasoning item, then the message ({kinds}, {response.output_text!r}, "
          f"{response.usage.output_tokens_details.reasoning_tokens} reasoning tokens)")
    tools = [{"type": "function", **tool["function"]} for tool in (WEATHER, NOW)]
    response = client.responses.create(model=model, input=WEATHER_QUESTION[0]["content"],
                                       tools=tools, temperature=0, max_output_tokens=96)
    kinds = [item.type for item in response.output]
    call = response.output[-1]
    check(kinds == ["reasoning", "function_call"] and call.name == "get_weather" and
          json.loads(call.arguments) == {"city": "Paris"},
          f"Responses with tools: a reasoning item, then the call ({response.output})")
    if kinds != ["reasoning", "function_call"]:
        return
    items = [item.model_dump(exclude_none=True) for item in response.output]
    follow_up = [{"role": "user", "content": WEATHER_QUESTION[0]["content"]}] + items + [
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]
    nxt = client.responses.create(model=model, input=follow_up, tools=tools, temperature=0,
                                  max_output_tokens=1)
    theirs = WEATHER_QUESTION + [
        {"role": "assistant", "content": "", "thinking": response.output[0].content[0].text,
         "tool_calls": [{"type": "function", "function": {
             "name": "get_weather", "arguments": json.loads(call.arguments)}}]},
        {"role": "tool", "content": "sunny"}]
    want_ids = [len(hf_ids(hf, theirs, tools=[WEATHER, NOW]))]
    check(nxt.usage.input_tokens in want_ids,
          f"a call and its output sent back read as transformers renders them "
          f"({nxt.usage.input_tokens} tokens against {want_ids[0]})")


def valid_call(name, arguments):
    """Whether a call names an offered tool with arguments its parameters take (WEATHER's
    and NOW's schemas, checked by hand; NOW gives none, which takes any object, as vLLM
    reads a tool without parameters)."""
    if name == "now":
        return isinstance(arguments, dict)
    if name != "get_weather" or not isinstance(arguments, dict):
        return False
    properties = WEATHER["function"]["parameters"]["properties"]
    return isinstance(arguments.get("city"), str) and set(arguments) <= set(properties)


def check_required(client, base, model, tokenizer, hf):
    """tool_choice "required" or a named function: the model reasons as it would, then calls
    (the final channel is closed to it) with arguments its parameters take; whole, streamed,
    sampled, and through the Responses API."""
    tools = [WEATHER, NOW]
    raw = greedy_raw(base, model, tokenizer, hf_ids(hf, QUESTION, tools=tools))
    want_reasoning, want_content, _, _, want_calls = read_harmony(
        tokenizer, raw, {tool["function"]["name"]: tool for tool in tools})
    check(want_content and not want_calls,
          f"unconstrained, the question with tools is answered, not called "
          f"({want_content!r}, {want_calls})")
    for label, choice, question, names in (
            ("required", "required", QUESTION, ("get_weather", "now")),
            ("named now", {"type": "function", "function": {"name": "now"}}, WEATHER_QUESTION,
             ("now",))):
        request = dict(model=model, messages=question, tools=tools, tool_choice=choice,
                       temperature=0, max_tokens=96)
        answer = client.chat.completions.create(**request)
        message = answer.choices[0].message
        reasoning = (message.model_extra or {}).get("reasoning") or ""
        calls = [(call.function.name, json.loads(call.function.arguments))
                 for call in message.tool_calls or []]
        check(len(calls) == 1 and calls[0][0] in names and valid_call(*calls[0]) and
              not message.content and answer.choices[0].finish_reason == "tool_calls",
              f"tool_choice {label}: one call of {names} with valid arguments and no content "
              f"({calls}, {message.content!r}, {answer.choices[0].finish_reason})")
        if question is QUESTION:
            check(reasoning == want_reasoning,
                  f"tool_choice {label}: the reasoning is the unconstrained answer's "
                  f"({reasoning!r}, unconstrained {want_reasoning!r})")
        got = streamed(client, **request)
        check(got == (reasoning, message.content or "", calls),
              f"tool_choice {label}: streamed the same ({got!r})")
        for seed in range(3):
            sampled = client.chat.completions.create(**{**request, "temperature": 1.0,
                                                        "seed": seed})
            choice_ = sampled.choices[0]
            content = choice_.message.content or ""
            calls = [(call.function.name, json.loads(call.function.arguments))
                     for call in choice_.message.tool_calls or []]
            # Cut off, the answer has no call: while reasoning, no content either; inside
            # the call's arguments, their bytes so far are its content (as any unfinished
            # call's body is).
            ok = (choice_.finish_reason == "tool_calls" and len(calls) == 1 and
                  calls[0][0] in names and valid_call(*calls[0]) and not content) or \
                (choice_.finish_reason == "length" and not calls and
                 (not content or content.startswith("{")))
            check(ok, f"tool_choice {label}, seed {seed}: a valid call, or cut off while "
                      f"reasoning or in the arguments; never an answer "
                      f"({calls}, {content!r}, {choice_.finish_reason})")
    response = client.responses.create(
        model=model, input=QUESTION[0]["content"], temperature=0, max_output_tokens=96,
        tools=[{"type": "function", **tool["function"]} for tool in tools],
        tool_choice="required")
    kinds = [item.type for item in response.output]
    check(kinds == ["reasoning", "function_call"] and
          valid_call(response.output[-1].name, json.loads(response.output[-1].arguments)),
          f"Responses with tool_choice required: a reasoning item, then a call ({kinds})")


def check_required_budget(client, base, model, tokenizer, hf, budget=5):
    """thinking_token_budget beside a required call: spent, it ends the message of reasoning,
    and the call follows."""
    tools = [WEATHER, NOW]
    raw = greedy_raw(base, model, tokenizer, hf_ids(hf, QUESTION, tools=tools))
    end = tokenizer.token_to_id("<|end|>")
    want_reasoning = read_harmony(tokenizer, raw[:budget] + [end], {})[0]
    full_reasoning = read_harmony(tokenizer, raw, {})[0]
    answer = client.chat.completions.create(
        model=model, messages=QUESTION, tools=tools, tool_choice="required", temperature=0,
        max_tokens=96, extra_body={"thinking_token_budget": budget})
    message = answer.choices[0].message
    reasoning = (message.model_extra or {}).get("reasoning") or ""
    calls = [(call.function.name, json.loads(call.function.arguments))
             for call in message.tool_calls or []]
    check(reasoning == want_reasoning and reasoning != full_reasoning and len(calls) == 1 and
          valid_call(*calls[0]) and answer.choices[0].finish_reason == "tool_calls",
          f"tool_choice required, thinking_token_budget {budget}: the reasoning stops at its "
          f"first {budget} tokens ({reasoning!r}; unbudgeted {full_reasoning!r}), then the call "
          f"({calls}, {answer.choices[0].finish_reason})")
    got = answer.usage.completion_tokens_details.reasoning_tokens
    check(got == budget + 1, f"tool_choice required, thinking_token_budget {budget}: {got} "
                             f"reasoning tokens counted (want {budget + 1})")


def check_refused(base, model, question, extra, param):
    body = {"model": model, "messages": question, **extra}
    try:
        post(f"{base}/v1/chat/completions", body)
        check(False, f"{json.dumps(extra)} is refused")
    except urllib.error.HTTPError as error:
        answer = json.load(error)
        check(error.code == 400 and answer["error"]["param"] == param,
              f"{json.dumps(extra)} is a 400 naming {param} ({error.code}: "
              f"{answer['error']['message']})")


def run_checks(base, tokenizer, model_dir):
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="none")
    model = client.models.list().data[0].id
    hf = AutoTokenizer.from_pretrained(model_dir)

    question = QUESTION
    check_prompt(base, model, hf, "a question", question, question)
    earlier = [{"role": "system", "content": "Answer briefly."},
               {"role": "user", "content": "Which is greater, nine or eleven?"}]
    check_prompt(base, model, hf, "instructions and an earlier answer",
                 earlier + [{"role": "assistant", "content": "Eleven.",
                             "reasoning_content": "Count them."},
                            {"role": "user", "content": "And the final answer?"}],
                 earlier + [{"role": "assistant", "content": "Eleven.", "thinking": "Count them."},
                            {"role": "user", "content": "And the final answer?"}])
    weather = WEATHER_QUESTION
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}}
    their_call = {"type": "function",
                  "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}
    answer = '{"temperature": 21, "sky": "clear"}\nas of noon'
    check_prompt(base, model, hf, "tools, a call, its answer, the final answer",
                 weather + [{"role": "assistant", "content": None, "tool_calls": [call],
                             "reasoning_content": "Ask the tool."},
                            {"role": "tool", "tool_call_id": "call_1", "content": answer},
                            {"role": "assistant", "content": "It is clear, 21 degrees."},
                            {"role": "user", "content": "Thanks."}],
                 weather + [{"role": "assistant", "content": "", "tool_calls": [their_call],
                             "thinking": "Ask the tool."},
                            {"role": "tool", "content": answer},
                            {"role": "assistant", "content": "It is clear, 21 degrees."},
                            {"role": "user", "content": "Thanks."}],
                 tools=[WEATHER, NOW])
    check_prompt(base, model, hf, "a call not answered yet, at high effort",
                 weather + [{"role": "assistant", "content": None, "tool_calls": [call],
                             "reasoning_content": "Ask the tool."},
                            {"role": "tool", "tool_call_id": "call_1", "content": answer}],
                 weather + [{"role": "assistant", "content": "", "tool_calls": [their_call],
                             "thinking": "Ask the tool."},
                            {"role": "tool", "content": answer}],
                 tools=[WEATHER], template_kwargs={"reasoning_effort": "high"})

    reasoning, content, calls, finish_reason = check_answers(
        client, base, model, tokenizer, hf, "answer", QUESTION)
    check(reasoning and content and finish_reason == "stop",
          f"the taught model's greedy answer reasons, then answers ({reasoning!r}, "
          f"{content!r}, {finish_reason})")
    reasoning, content, calls, finish_reason = check_answers(
        client, base, model, tokenizer, hf, "with tools", WEATHER_QUESTION, tools=[WEATHER, NOW])
    check(reasoning and len(calls) == 1 and calls[0][0] == "get_weather" and
          finish_reason == "tool_calls",
          f"the taught model's greedy answer with tools reasons, then calls get_weather "
          f"({reasoning!r}, {calls}, {finish_reason})")
    reasoning, content, calls, finish_reason = check_answers(
        client, base, model, tokenizer, hf, "low effort", QUESTION, effort="low", seeds=range(2))
    check(reasoning and content and finish_reason == "stop",
          f"the taught model's greedy answer at low effort reasons, then answers "
          f"({reasoning!r}, {content!r}, {finish_reason})")

    check_final_format(client, base, model, tokenizer, hf)
    check_responses(client, base, model, tokenizer, hf)
    check_budget(client, base, model, tokenizer, hf)
    check_required(client, base, model, tokenizer, hf)
    check_required_budget(client, base, model, tokenizer, hf)
    check_refused(base, model, question, {"reasoning_effort": "minimal"}, "reasoning_effort")
    check_refused(base, model, question, {"tophat_outline": True}, "tophat_outline")


def main():
    bin_dir, work = sys.argv[1:3]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    model_dir = os.path.join(work, "gpt-oss")
    tokenizer = build_model(model_dir)
    with serving(bin_dir, os.path.join(work, "serving"), model_dir) as base:
        run_checks(base, tokenizer, model_dir)
    finish()


if __name__ == "__main__":
    main()
