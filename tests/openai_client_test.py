"""The official OpenAI client library (Python `openai`) against tophat-agent's endpoint.

Usage: python3 openai_client_test.py BASE_URL CLOUD_METRICS_URL AGENT_METRICS_URL MODEL_DIR
MODEL_DIR is the checkpoint the agent and cloud were split from: transformers loads it to check
the endpoint's log-probabilities.
Exits non-zero, saying what differed, on the first failure. tests/openai_client_test.sh
starts the cloud and the agent and runs it with the build's Python (TOPHAT_PYTHON).
"""

import datetime
import enum
import http.client
import ipaddress
import json
import re
import select
import socket
import sys
import threading
import time
import typing
import urllib.error
import urllib.parse
import urllib.request
import uuid

try:
    import jsonschema
    import openai
    import pydantic
except ImportError as e:
    print(f"FAIL: a Python package is missing from {sys.executable} ({e}); "
          "run `bash deploy/install-deps.sh`", file=sys.stderr)
    sys.exit(1)


class Mismatch(Exception):
    pass


def check(condition, what):
    # A description passed as the condition is truthy and would pass whatever happened.
    if not isinstance(condition, bool):
        raise TypeError(f"check({condition!r}, {what!r}): the condition comes first")
    if not condition:
        raise Mismatch(what)


def check_eq(what, got, want):
    if got != want:
        raise Mismatch(f"{what}: got {got!r}, want {want!r}")


def streamed_chat_text(client, **request):
    """A streamed chat answer's text, its deltas joined."""
    stream = client.chat.completions.create(stream=True, **request)
    return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)


def metric(url, series):
    """One series' value from a Prometheus endpoint: `series` is the name with its labels as
    the text format writes them, e.g. 'x_total{reason="a"}'."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    for line in text.split("\n"):
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise Mismatch(f"{series} not in {url}")


def wait_for(what, condition, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise Mismatch(f"timed out after {seconds} s waiting for {what}")


def expect_error(what, call, error_type, status, **fields):
    try:
        call()
    except error_type as e:
        check_eq(f"{what}: HTTP status", e.status_code, status)
        for name, want in fields.items():
            check_eq(f"{what}: error.{name}", getattr(e, name), want)
        return
    except openai.APIError as e:
        raise Mismatch(f"{what}: {type(e).__name__} ({e}), want {error_type.__name__}")
    raise Mismatch(f"{what}: accepted, want {error_type.__name__}")


def run(base_url, cloud_metrics_url, agent_metrics_url, model_dir):
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)

    models = client.models.list()
    check_eq("models listed", len(models.data), 1)
    model = models.data[0].id
    check_eq("models.retrieve", client.models.retrieve(model).id, model)
    expect_error("models.retrieve of another model", lambda: client.models.retrieve("gpt-4o"),
                 openai.NotFoundError, 404, code="model_not_found")
    messages = [
        {"role": "system", "content": "tell a story"},
        {"role": "user", "content": "the old farmer saw a little bird"},
    ]

    # Non-streaming, greedy: the same request twice gives the same answer, and usage counts it.
    first = client.chat.completions.create(model=model, messages=messages, max_tokens=24,
                                           temperature=0)
    text = first.choices[0].message.content
    check_eq("chat object", first.object, "chat.completion")
    check_eq("chat role", first.choices[0].message.role, "assistant")
    check(len(text.split(" ")) >= 8, f"a short answer: {text!r}")
    check_eq("chat finish_reason", first.choices[0].finish_reason, "length")
    check_eq("chat completion_tokens", first.usage.completion_tokens, 24)
    check(first.usage.prompt_tokens > 10, f"prompt_tokens {first.usage.prompt_tokens}")
    check_eq("chat total_tokens", first.usage.total_tokens, first.usage.prompt_tokens + 24)
    check_eq("first chat cached_tokens", first.usage.prompt_tokens_details.cached_tokens, 0)
    # Asked again, the agent reuses the first answer's positions on both sides (all of the
    # prompt but its last token, which gives the first new one) and answers the same.
    again = client.chat.completions.create(model=model, messages=messages, max_tokens=24,
                                           temperature=0)
    check_eq("the same greedy chat again", again.choices[0].message.content, text)
    check_eq("repeated chat cached_tokens", again.usage.prompt_tokens_details.cached_tokens,
             first.usage.prompt_tokens - 1)
    print(f"chat: {json.dumps(text)}")
    tokenizer_routes(client, model, base_url, messages, first.usage.prompt_tokens)

    # The conversation's next turn: its history is reused, only the new message is computed.
    turn2 = messages + [{"role": "assistant", "content": text},
                        {"role": "user", "content": "and then?"}]
    second = client.chat.completions.create(model=model, messages=turn2, max_tokens=16,
                                            temperature=0)
    cached = second.usage.prompt_tokens_details.cached_tokens
    check(second.usage.prompt_tokens > first.usage.prompt_tokens,
          f"turn 2 prompt_tokens {second.usage.prompt_tokens} <= {first.usage.prompt_tokens}")
    check(cached >= first.usage.prompt_tokens,
          f"turn 2: cached {cached} of {second.usage.prompt_tokens}, want >= "
          f"{first.usage.prompt_tokens}")
    print(f"turn 2: {cached} of {second.usage.prompt_tokens} prompt tokens reused")

    # Streaming: the deltas add up to the same text; usage comes last when asked for.
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=24,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    streamed = ""
    finish = None
    usage = None
    chunks = 0
    with stream:
        for chunk in stream:
            chunks += 1
            check_eq("chunk object", chunk.object, "chat.completion.chunk")
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                streamed += choice.delta.content or ""
                finish = choice.finish_reason or finish
    check_eq("streamed text", streamed, text)
    check_eq("streamed finish_reason", finish, "length")
    check(chunks > 3, f"{chunks} chunks")
    check(usage is not None, "no usage chunk with include_usage")
    check_eq("streamed completion_tokens", usage.completion_tokens, 24)
    print(f"stream: {chunks} chunks, same text")

    # A stop sequence: the answer ends before it, and the stop sequence is not in it.
    words = text.strip().split(" ")
    stop_word = next((w for i, w in enumerate(words) if i >= 3 and len(w) >= 3), words[-1])
    stop = " " + stop_word
    stopped = client.chat.completions.create(model=model, messages=messages, max_tokens=24,
                                             temperature=0, stop=[stop])
    check_eq(f"stop {stop!r}: finish_reason", stopped.choices[0].finish_reason, "stop")
    check_eq(f"stop {stop!r}: content", stopped.choices[0].message.content,
             text[:text.index(stop)])
    print(f"stop {json.dumps(stop)}: {json.dumps(stopped.choices[0].message.content)}")
    included = client.chat.completions.create(model=model, messages=messages, max_tokens=24,
                                              temperature=0, stop=[stop],
                                              extra_body={"include_stop_str_in_output": True})
    check_eq(f"stop {stop!r} with include_stop_str_in_output: content",
             included.choices[0].message.content, text[:text.index(stop) + len(stop)])

    # Completions, seeded sampling: the same seed gives the same text.
    sampled = []
    for _ in range(2):
        c = client.completions.create(model=model, prompt="the brave knight", max_tokens=16,
                                      temperature=0.8, seed=7)
        check_eq("completion object", c.object, "text_completion")
        sampled.append(c.choices[0].text)
    check_eq("the same seed's completion", sampled[1], sampled[0])
    check(len(sampled[0]) > 0, "an empty seeded completion")
    print(f"completion, seed 7: {json.dumps(sampled[0])}")
    choices(client, model, messages)
    shared_prompt_choices(client, model, cloud_metrics_url, agent_metrics_url)
    json_answers(client, model, base_url, messages)
    json_schema_answers(client, model, messages)
    regex_answers(client, model, messages)
    jump_forward(client, model, messages, agent_metrics_url)
    grammar_answers(client, model, messages)
    structural_tag_answers(client, model, messages)
    tool_calls(client, model, messages)
    responses(client, model, messages, text, agent_metrics_url)
    background_responses(client, model, messages, text, agent_metrics_url)
    conversations(client, model, messages, text, agent_metrics_url)

    # A bad request: OpenAI's error object, the right status, the field named.
    expect_error("n=17", lambda: client.chat.completions.create(model=model, messages=messages,
                                                                n=17),
                 openai.BadRequestError, 400, param="n")
    expect_error("an unknown model",
                 lambda: client.chat.completions.create(model="gpt-4o", messages=messages),
                 openai.NotFoundError, 404, code="model_not_found")
    print("bad requests refused")

    # A client that goes away mid-stream: the request is cancelled and the cloud frees its KV
    # (the conversations kept from the requests above hold theirs: no more than that is left).
    cancelled = 'tophat_request_success_total{finished_reason="cancelled"}'
    kept_kv = metric(cloud_metrics_url, "tophat_kv_cache_usage_ratio")
    cancelled_before = metric(agent_metrics_url, cancelled)
    # Two choices: both are cancelled.
    long = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "a long story about a castle"}],
        max_tokens=800, temperature=0, stream=True, n=2,
        # Its length must not depend on what the toy model says: it must still run at chunk 4.
        extra_body={"ignore_eos": True})
    seen = 0
    with long:
        for _ in long:
            seen += 1
            if seen == 4:
                wait_for("both choices' cloud sessions running mid-stream",
                         lambda: metric(cloud_metrics_url, "tophat_num_sessions_running") == 2,
                         20)
                break
    # Leaving `with` closes the response mid-body, and with it the connection.
    check_eq("chunks read before going away", seen, 4)
    wait_for("the agent to cancel both choices",
             lambda: metric(agent_metrics_url, cancelled) == cancelled_before + 2, 20)
    wait_for("the cloud to free the session's KV",
             lambda: (metric(cloud_metrics_url, "tophat_num_sessions_running") == 0 and
                      metric(cloud_metrics_url, "tophat_kv_cache_usage_ratio") <= kept_kv), 20)
    print("a client gone mid-stream cancels its request; the cloud's KV is free")

    logprobs(client, model, messages, text, stop, model_dir)
    limits(client, model, base_url)


def post_json(url, body):
    """POSTs `body` as JSON: the HTTP status and the JSON answer, an error's included."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def tokenizer_routes(client, model, base_url, messages, chat_prompt_tokens):
    """vLLM's /tokenize and /detokenize (at the root, as vLLM serves them): the counts are the
    ones the completions then report."""
    root = base_url.removesuffix("/v1")
    status, chat = post_json(root + "/tokenize", {"model": model, "messages": messages})
    check_eq("/tokenize messages: status", status, 200)
    check_eq("/tokenize messages: the chat completion's prompt_tokens", chat["count"],
             chat_prompt_tokens)
    check_eq("/tokenize: max_model_len", chat["max_model_len"], 1024)
    status, text = post_json(root + "/tokenize", {"model": model, "prompt": "the brave knight"})
    check_eq("/tokenize prompt: status", status, 200)
    completion = client.completions.create(model=model, prompt="the brave knight", max_tokens=1,
                                           temperature=0)
    check_eq("/tokenize prompt: the completion's prompt_tokens", text["count"],
             completion.usage.prompt_tokens)
    check_eq("/tokenize prompt: count", text["count"], len(text["tokens"]))
    status, bare = post_json(root + "/tokenize", {"prompt": "the brave knight",
                                                  "add_special_tokens": False})
    check_eq("/tokenize without special tokens: all but the BOS", bare["tokens"],
             text["tokens"][1:])
    status, back = post_json(root + "/detokenize", {"model": model, "tokens": bare["tokens"]})
    check_eq("/detokenize: status", status, 200)
    check_eq("/detokenize: the text", back["prompt"], "the brave knight")
    status, error = post_json(root + "/detokenize", {"tokens": [10 ** 6]})
    check_eq("/detokenize outside the vocabulary: status", status, 400)
    check_eq("/detokenize outside the vocabulary: param", error["error"]["param"], "tokens")
    print(f"/tokenize: the chat's {chat['count']} tokens and the prompt's {text['count']}, as "
          "the completions count them; /detokenize gives the text back")


def formatted_answers(client, model, messages, bias, fmt, holds, what):
    """Six seeds' chat answers under response_format `fmt`: each `holds` (is `what`) and ends
    with "stop", while the same seed's answer without the format does not hold, and the
    answers differ. Returns them."""
    answers = []
    for seed in range(6):
        answer = client.chat.completions.create(
            model=model, messages=messages, max_tokens=400, temperature=1.0, seed=seed,
            logit_bias=bias, response_format=fmt)
        content = answer.choices[0].message.content
        check(holds(content), f"seed {seed}: not {what}: {content!r}")
        check_eq(f"seed {seed}: finish_reason", answer.choices[0].finish_reason, "stop")
        answers.append(content)
        unconstrained = client.chat.completions.create(
            model=model, messages=messages, max_tokens=400, temperature=1.0, seed=seed,
            logit_bias=bias)
        check(not holds(unconstrained.choices[0].message.content),
              f"seed {seed}: {what} without the format: "
              f"{unconstrained.choices[0].message.content!r}")
    check(len(set(answers)) > 3, f"the seeds' answers are alike: {answers}")
    return answers


def responses(client, model, messages, text, agent_metrics_url):
    """The Responses API: the generation chat gives, in OpenAI's newer shape, with the
    conversation kept by the agent. Greedy, instructions and input give chat's answer; a
    second turn through previous_response_id gives chat's second turn with the whole history,
    and reuses the first turn's positions, its input items listed and paged; streamed, the same text in events the client folds
    back; a Pydantic model through responses.parse() and stream(); function calls, the same
    as chat's under the same seed, and their outputs sent back; retrieve, delete, store
    false and the refusals."""
    system, user = messages[0]["content"], messages[1]["content"]
    first = client.responses.create(model=model, instructions=system, input=user,
                                    max_output_tokens=24, temperature=0)
    check_eq("response object", first.object, "response")
    check(first.id.startswith("resp_"), f"response id {first.id!r}")
    check_eq("response text is chat's", first.output_text, text)
    # Cut by max_output_tokens, as the chat answer was (finish_reason "length").
    check_eq("response status", first.status, "incomplete")
    check_eq("incomplete reason", first.incomplete_details.reason, "max_output_tokens")
    check_eq("response output_tokens", first.usage.output_tokens, 24)
    check_eq("response instructions", first.instructions, system)

    turn2 = messages + [{"role": "assistant", "content": text},
                        {"role": "user", "content": "and then?"}]
    second = client.responses.create(model=model, instructions=system, input="and then?",
                                     previous_response_id=first.id, max_output_tokens=16,
                                     temperature=0)
    chat2 = client.chat.completions.create(model=model, messages=turn2, max_tokens=16,
                                           temperature=0)
    check_eq("turn 2 through previous_response_id is chat's with the history",
             second.output_text, chat2.choices[0].message.content)
    check_eq("turn 2 input_tokens", second.usage.input_tokens, chat2.usage.prompt_tokens)
    reused = second.usage.input_tokens_details.cached_tokens
    check(reused >= first.usage.input_tokens,
          f"turn 2 reused {reused} of {second.usage.input_tokens} input tokens, want >= "
          f"{first.usage.input_tokens}")
    check_eq("turn 2 previous_response_id", second.previous_response_id, first.id)
    # Its input items: the conversation before its answer, earlier turns included (no
    # instructions: each turn gives its own), newest first, paged with after.
    listed = client.responses.input_items.list(second.id)
    check_eq("turn 2 input items, newest first",
             [(item.role, item.content[0].type, item.content[0].text) for item in listed.data],
             [("user", "input_text", "and then?"), ("assistant", "output_text", text),
              ("user", "input_text", user)])
    check(not listed.has_more, "turn 2's input items fit one page")
    pages = []
    for item in client.responses.input_items.list(second.id, order="asc", limit=1):
        pages.append(item.id)  # the client pages through with after
    check_eq("input items paged one at a time, oldest first", pages,
             [item.id for item in reversed(listed.data)])
    expect_error("input items with limit 0",
                 lambda: client.responses.input_items.list(second.id, limit=0),
                 openai.BadRequestError, 400, param="limit")
    expect_error("input items after an unknown id",
                 lambda: client.responses.input_items.list(second.id, after="msg_none"),
                 openai.BadRequestError, 400, param="after")
    # Input items: the same conversation sent whole, as messages with text parts.
    items = client.responses.create(
        model=model, max_output_tokens=16, temperature=0,
        input=[{"role": "developer", "content": system},
               {"type": "message", "role": "user",
                "content": [{"type": "input_text", "text": user}]},
               {"role": "assistant", "content": [{"type": "output_text", "text": text}]},
               {"role": "user", "content": "and then?"}])
    check_eq("turn 2 as input items", items.output_text, second.output_text)
    # And with the first answer's output items sent back as the client returned them.
    sent_back = client.responses.create(
        model=model, instructions=system, max_output_tokens=16, temperature=0, store=False,
        input=[{"role": "user", "content": user}, *first.output,
               {"role": "user", "content": "and then?"}])
    check_eq("turn 2 with the answer's items sent back", sent_back.output_text,
             second.output_text)

    # Log-probabilities, asked for as the Responses API asks: chat's for the same request.
    scored = client.responses.create(model=model, instructions=system, input=user,
                                     max_output_tokens=6, temperature=0, top_logprobs=2,
                                     include=["message.output_text.logprobs"])
    chat_scored = client.chat.completions.create(model=model, messages=messages, max_tokens=6,
                                                 temperature=0, logprobs=True, top_logprobs=2)
    got = scored.output[0].content[0].logprobs
    want = chat_scored.choices[0].logprobs.content
    check_eq("response logprobs are chat's: tokens",
             [(e.token, [t.token for t in e.top_logprobs]) for e in got],
             [(e.token, [t.token for t in e.top_logprobs]) for e in want])
    # Not to the bit: the two prompts' positions may be computed in other pieces (one taken
    # from a kept conversation, the other whole), as for the streamed logprobs below; a CI
    # run saw 8e-7 between them.
    drift = max(abs(a - b) for g, w in zip(got, want)
                for a, b in [(g.logprob, w.logprob)] + [(x.logprob, y.logprob)
                                                        for x, y in zip(g.top_logprobs,
                                                                        w.top_logprobs)])
    check(drift < LOGPROB_TOLERANCE, f"response logprobs differ from chat's by {drift}")
    check_eq("response logprobs: one a token", len(got), 6)

    # Streamed: the raw events, in order, add up to the same text and end with the response.
    stream = client.responses.create(model=model, instructions=system, input=user,
                                     max_output_tokens=24, temperature=0, stream=True)
    deltas, types, last = [], [], None
    with stream:
        for event in stream:
            types.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
            last = event
    check_eq("streamed events start", types[:4],
             ["response.created", "response.in_progress", "response.output_item.added",
              "response.content_part.added"])
    check_eq("streamed events end", types[-4:],
             ["response.output_text.done", "response.content_part.done",
              "response.output_item.done", "response.incomplete"])
    check_eq("streamed text", "".join(deltas), text)
    check_eq("streamed response text", last.response.output_text, text)
    check(len(deltas) > 4, f"the text came in {len(deltas)} deltas")
    # Kept: retrieved whole, then deleted.
    kept = client.responses.retrieve(last.response.id)
    check_eq("retrieved text", kept.output_text, text)
    stored = metric(agent_metrics_url, "tophat_openai_stored_responses")
    check(stored >= 4, f"tophat_openai_stored_responses {stored}, want the responses above")
    check(metric(agent_metrics_url, "tophat_openai_stored_response_bytes") > 1000,
          "tophat_openai_stored_response_bytes")
    client.responses.delete(last.response.id)
    check_eq("stored responses after a delete",
             metric(agent_metrics_url, "tophat_openai_stored_responses"), stored - 1)
    expect_error("a deleted response", lambda: client.responses.retrieve(last.response.id),
                 openai.NotFoundError, 404)
    unkept = client.responses.create(model=model, input=user, max_output_tokens=2, store=False)
    expect_error("a response not stored", lambda: client.responses.retrieve(unkept.id),
                 openai.NotFoundError, 404)
    expect_error("previous_response_id of a response not stored",
                 lambda: client.responses.create(model=model, input="and?",
                                                 previous_response_id=unkept.id),
                 openai.BadRequestError, 400, param="previous_response_id",
                 code="previous_response_not_found")

    # A Pydantic model as text.format, strict: parse() and the stream helper read it back.
    quote, close, bracket = 3 + ord('"'), 3 + ord('}'), 3 + ord(']')
    bias = {str(quote): 12, str(close): 12, str(bracket): 8}

    class Pet(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=8)
        legs: int = pydantic.Field(ge=0, le=8)

    for seed in range(2):
        parsed = client.responses.parse(model=model, input=user, text_format=Pet,
                                        max_output_tokens=400, temperature=1.0,
                                        extra_body={"seed": seed, "logit_bias": bias})
        check(isinstance(parsed.output_parsed, Pet),
              f"seed {seed}: responses.parse() gave {parsed.output_parsed!r} for "
              f"{parsed.output_text!r}")
    with client.responses.stream(model=model, input=user, text_format=Pet,
                                 max_output_tokens=400, temperature=1.0,
                                 extra_body={"seed": 1, "logit_bias": bias}) as pets:
        streamed_pet = pets.get_final_response().output_parsed
    check_eq("streamed parse", streamed_pet, parsed.output_parsed)

    # Function tools, flat as the Responses API writes them: under "required" the calls are
    # chat's under the same seed and bias; their outputs go back as items of the next turn.
    weather = {"type": "object",
               "properties": {"city": {"type": "string", "maxLength": 12},
                              "days": {"type": "integer", "minimum": 1, "maximum": 7}},
               "required": ["city", "days"], "additionalProperties": False}
    bias = {str(quote): 12, str(close): 12, "2": 8}
    call_bias = {"seed": 0, "logit_bias": bias}
    chat_call = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": user}], max_tokens=400,
        temperature=1.0, tool_choice="required", **call_bias,
        tools=[{"type": "function", "function": {"name": "get_weather", "parameters": weather,
                                                 "strict": True}}])
    called = client.responses.create(
        model=model, input=user, max_output_tokens=400, temperature=1.0,
        tools=[{"type": "function", "name": "get_weather", "parameters": weather,
                "strict": True}],
        tool_choice="required", extra_body=call_bias)
    calls = [item for item in called.output if item.type == "function_call"]
    check_eq("function calls are chat's",
             [(c.name, c.arguments) for c in calls],
             [(c.function.name, c.function.arguments)
              for c in chat_call.choices[0].message.tool_calls])
    jsonschema.validate(json.loads(calls[0].arguments), weather)
    check_eq("a response of calls is complete", called.status, "completed")
    answered = client.responses.create(
        model=model, previous_response_id=called.id, max_output_tokens=8, temperature=0,
        input=[{"type": "function_call_output", "call_id": c.call_id, "output": "sunny, 21 C"}
               for c in calls],
        tools=[{"type": "function", "name": "get_weather", "parameters": weather}])
    check(answered.usage.input_tokens > called.usage.input_tokens + 5,
          f"the calls' outputs: input_tokens {answered.usage.input_tokens}, before "
          f"{called.usage.input_tokens}")

    expect_error("chat's messages on /v1/responses",
                 lambda: client.responses.create(model=model, input=user,
                                                 extra_body={"messages": messages}),
                 openai.BadRequestError, 400, param="messages")
    expect_error("max_output_tokens 0",
                 lambda: client.responses.create(model=model, input=user, max_output_tokens=0),
                 openai.BadRequestError, 400, param="max_output_tokens")
    print(f"responses: {json.dumps(first.output_text)}; turn 2 reused {reused} of "
          f"{second.usage.input_tokens}; calls {json.dumps([c.arguments for c in calls])}")


def background_responses(client, model, messages, text, agent_metrics_url):
    """background: true answers at once with the response in progress; polled, it ends as the
    same request in the foreground does; cancelled while it runs, it stops, keeps what it had
    and gives its place back; deleted while it runs, it is cancelled and gone; the refusals.
    The long responses ask for 900 tokens past the end of sequence, which take the toy
    pipeline far longer than the few milliseconds between their start and their cancel."""
    system, user = messages[0]["content"], messages[1]["content"]
    started = client.responses.create(model=model, instructions=system, input=user,
                                      max_output_tokens=24, temperature=0, background=True)
    check(started.status in ("queued", "in_progress"),
          f"a background response starts queued or in progress, not {started.status!r}")
    check_eq("background echoed", started.background, True)
    check_eq("a background response's output at first", started.output, [])
    polled = {}

    def finished():
        polled["last"] = client.responses.retrieve(started.id)
        return polled["last"].status not in ("queued", "in_progress")

    wait_for("the background response to end", finished, 60)
    ended = polled["last"]
    # Cut by max_output_tokens, as the same request in the foreground is.
    check_eq("background status", ended.status, "incomplete")
    check_eq("background text is chat's", ended.output_text, text)
    check_eq("background output_tokens", ended.usage.output_tokens, 24)
    check_eq("cancel of an ended response returns it as it ended",
             client.responses.cancel(started.id).status, "incomplete")

    long = client.responses.create(model=model, input=user, max_output_tokens=900,
                                   temperature=0, background=True,
                                   extra_body={"ignore_eos": True})
    expect_error("previous_response_id of a response in progress",
                 lambda: client.responses.create(model=model, input="and?",
                                                 previous_response_id=long.id),
                 openai.BadRequestError, 400, param="previous_response_id")
    check_eq("tophat_openai_background_responses while one runs",
             metric(agent_metrics_url, "tophat_openai_background_responses"), 1)
    cancelled = client.responses.cancel(long.id)
    check_eq("cancelled status", cancelled.status, "cancelled")
    check(cancelled.usage.output_tokens < 900,
          f"the cancelled response stopped early ({cancelled.usage.output_tokens} tokens)")
    check_eq("retrieved after the cancel", client.responses.retrieve(long.id).status,
             "cancelled")
    check_eq("cancelled twice", client.responses.cancel(long.id).status, "cancelled")
    check_eq("tophat_openai_background_responses once it is cancelled",
             metric(agent_metrics_url, "tophat_openai_background_responses"), 0)
    # Its place is given back: both places (max_concurrent_requests 2) take a completion.
    check(accepted(client, model), "a completion after the cancel")

    gone = client.responses.create(model=model, input=user, max_output_tokens=900,
                                   temperature=0, background=True,
                                   extra_body={"ignore_eos": True})
    client.responses.delete(gone.id)
    expect_error("a background response deleted while it ran",
                 lambda: client.responses.retrieve(gone.id), openai.NotFoundError, 404)

    foreground = client.responses.create(model=model, input=user, max_output_tokens=2)
    expect_error("cancel of a response not made in the background",
                 lambda: client.responses.cancel(foreground.id), openai.BadRequestError, 400)
    expect_error("cancel of an unknown response", lambda: client.responses.cancel("resp_0"),
                 openai.NotFoundError, 404)
    expect_error("background without store",
                 lambda: client.responses.create(model=model, input=user, background=True,
                                                 store=False),
                 openai.BadRequestError, 400, param="background")
    expect_error("a stream of a response not made with stream",
                 lambda: client.responses.retrieve(started.id, stream=True),
                 openai.BadRequestError, 400, param="stream")
    resumed_at = background_stream(client, model, system, user, text)
    print(f"background responses: polled to the end; cancelled after "
          f"{cancelled.usage.output_tokens} of 900 tokens; a stream broken after event "
          f"{resumed_at} resumed")


def deltas(events):
    return "".join(event.delta for event in events if event.type == "response.output_text.delta")


def background_stream(client, model, system, user, text):
    """background with stream: the events are followed as they come; a stream broken off
    is resumed after the last event read (starting_after), and the two parts are the whole
    answer, chat's; a stream read again from the start after the end is the same events; a
    stream followed while its response is cancelled ends. Returns where it was resumed."""
    stream = client.responses.create(model=model, instructions=system, input=user,
                                     max_output_tokens=24, temperature=0, background=True,
                                     stream=True)
    first = []
    for event in stream:  # to the first text (one delta may carry several tokens)
        first.append(event)
        if event.type == "response.output_text.delta":
            break
    stream.close()
    check_eq("a background stream's first event", first[0].type, "response.created")
    check_eq("a background stream's response echoes background", first[0].response.background,
             True)
    response_id = first[0].response.id
    last = first[-1].sequence_number
    rest = list(client.responses.retrieve(response_id, stream=True, starting_after=last))
    check_eq("the resumed stream starts after the last event read", rest[0].sequence_number,
             last + 1)
    check_eq("the resumed stream's sequence numbers",
             [event.sequence_number for event in rest],
             list(range(last + 1, last + 1 + len(rest))))
    check_eq("the resumed stream's last event", rest[-1].type, "response.incomplete")
    check_eq("a broken and resumed stream's text is chat's", deltas(first) + deltas(rest), text)
    ended = client.responses.retrieve(response_id)
    check_eq("the background stream's response", (ended.status, ended.output_text),
             ("incomplete", text))
    whole = list(client.responses.retrieve(response_id, stream=True))
    check_eq("a stream read again from the start",
             [event.sequence_number for event in whole], list(range(len(whole))))
    check_eq("a stream read again is the same answer", deltas(whole), text)
    check_eq("a stream resumed after its end", list(client.responses.retrieve(
        response_id, stream=True, starting_after=whole[-1].sequence_number)), [])
    expect_error("starting_after that is no sequence number",
                 lambda: client.responses.retrieve(response_id, stream=True,
                                                   starting_after=-2),
                 openai.BadRequestError, 400, param="starting_after")

    # Cancelled while a client follows it: the stream ends, without a completion.
    long = client.responses.create(model=model, input=user, max_output_tokens=900,
                                   temperature=0, background=True, stream=True,
                                   extra_body={"ignore_eos": True})
    followed = []
    for event in long:
        followed.append(event)
        if event.type == "response.output_text.delta":
            break
    cancelled = client.responses.cancel(followed[0].response.id)
    check_eq("a background stream cancelled", cancelled.status, "cancelled")
    followed.extend(long)  # ends: the log is closed
    check(all(event.type not in ("response.completed", "response.incomplete")
              for event in followed),
          "a cancelled stream has no completion event")
    check(cancelled.usage.output_tokens < 900,
          f"the cancelled stream stopped early ({cancelled.usage.output_tokens} tokens)")
    check(deltas(followed).startswith(cancelled.output_text) or
          cancelled.output_text.startswith(deltas(followed)),
          "the cancelled stream's text is the cancelled response's")
    return last


def conversations(client, model, messages, text, agent_metrics_url):
    """OpenAI's Conversations API: a response made with `conversation` reads its items before
    its input and adds its input and answer to it, so that a conversation's turns answer as
    a previous_response_id chain's; items added, read and deleted by hand take part; the
    refusals."""
    system, user = messages[0]["content"], messages[1]["content"]
    conversation = client.conversations.create(metadata={"topic": "farm"})
    check_eq("a conversation's object", conversation.object, "conversation")
    check_eq("a conversation's metadata", conversation.metadata, {"topic": "farm"})
    check_eq("tophat_openai_conversations", metric(agent_metrics_url,
                                                   "tophat_openai_conversations"), 1)
    first = client.responses.create(model=model, instructions=system, input=user,
                                    max_output_tokens=24, temperature=0,
                                    conversation=conversation.id)
    check_eq("a conversation's first answer is chat's", first.output_text, text)
    check_eq("the response names its conversation", first.conversation.id, conversation.id)
    items = client.conversations.items.list(conversation.id, order="asc").data
    check_eq("the first turn's items", [(item.type, item.role) for item in items],
             [("message", "user"), ("message", "assistant")])
    check_eq("the first turn's answer as an item", items[1].content[0].text, text)
    check_eq("the answer item is the response's output item", items[1].id, first.output[0].id)

    # The second turn reads the first from the conversation, as previous_response_id does.
    second = client.responses.create(model=model, instructions=system, input="and then?",
                                     max_output_tokens=16, temperature=0,
                                     conversation={"id": conversation.id})
    chained = client.responses.create(model=model, instructions=system, input="and then?",
                                      max_output_tokens=16, temperature=0,
                                      previous_response_id=first.id)
    check_eq("a conversation's second turn answers as previous_response_id's",
             second.output_text, chained.output_text)
    newest = client.conversations.items.list(conversation.id, limit=1)
    check_eq("the newest item (order desc by default)", newest.data[0].id, second.output[0].id)
    check_eq("has_more with limit 1", newest.has_more, True)

    # Items by hand: added, read, deleted; a turn reads them.
    added = client.conversations.items.create(
        conversation.id, items=[{"type": "message", "role": "user", "content": "the barn"}])
    check_eq("items added", len(added.data), 1)
    item_id = added.data[0].id
    check_eq("an item read back", client.conversations.items.retrieve(
        item_id, conversation_id=conversation.id).content[0].text, "the barn")
    with_item = client.responses.create(model=model, instructions=system, input="and then?",
                                        max_output_tokens=8, temperature=0,
                                        conversation=conversation.id)
    check_eq("a turn after an added item reads it",
             with_item.usage.input_tokens > second.usage.input_tokens, True)
    after_delete = client.conversations.items.delete(item_id, conversation_id=conversation.id)
    check_eq("deleting an item returns the conversation", after_delete.id, conversation.id)
    expect_error("an item deleted", lambda: client.conversations.items.retrieve(
        item_id, conversation_id=conversation.id), openai.NotFoundError, 404)
    updated = client.conversations.update(conversation.id, metadata={"topic": "barn"})
    check_eq("metadata updated", client.conversations.retrieve(conversation.id).metadata,
             {"topic": "barn"})
    check_eq("update returns the conversation", updated.metadata, {"topic": "barn"})

    expect_error("conversation with previous_response_id",
                 lambda: client.responses.create(model=model, input="x",
                                                 conversation=conversation.id,
                                                 previous_response_id=first.id),
                 openai.BadRequestError, 400, param="conversation")
    expect_error("an unknown conversation",
                 lambda: client.responses.create(model=model, input="x",
                                                 conversation="conv_0"),
                 openai.NotFoundError, 404, param="conversation")
    expect_error("an item that is not one",
                 lambda: client.conversations.items.create(
                     conversation.id, items=[{"type": "message", "role": "robot",
                                              "content": "x"}]),
                 openai.BadRequestError, 400, param="items[0].role")
    deleted = client.conversations.delete(conversation.id)
    check_eq("a conversation deleted", (deleted.deleted, deleted.object),
             (True, "conversation.deleted"))
    expect_error("a deleted conversation", lambda: client.conversations.retrieve(
        conversation.id), openai.NotFoundError, 404)
    expect_error("a deleted conversation's items",
                 lambda: client.conversations.items.list(conversation.id),
                 openai.NotFoundError, 404)
    check_eq("tophat_openai_conversations after the delete",
             metric(agent_metrics_url, "tophat_openai_conversations"), 0)
    print(f"conversations: 3 turns and an item by hand; the second turn as "
          f"previous_response_id's ({json.dumps(second.output_text)})")


def jump_forward(client, model, messages, agent_metrics_url):
    """A regex's literals (a record's keys) go to the cloud as drafts without the drafter,
    counted in the agent's jump-forward metrics: some kept, never more kept than sent."""
    pattern = r'\{"verdict":"(approved|rejected)","note":"[a-z ]{1,12}"\}'
    sent = "tophat_jump_forward_draft_tokens_total"
    kept = "tophat_jump_forward_kept_tokens_total"
    sent_before = metric(agent_metrics_url, sent)
    kept_before = metric(agent_metrics_url, kept)
    for seed in range(3):
        answer = client.chat.completions.create(
            model=model, messages=messages, max_tokens=60, temperature=1.0, seed=seed,
            extra_body={"structured_outputs": {"regex": pattern}})
        text = answer.choices[0].message.content
        check(bool(re.fullmatch(pattern, text)), f"seed {seed}: {text!r} does not match {pattern}")
    sent_now = metric(agent_metrics_url, sent) - sent_before
    kept_now = metric(agent_metrics_url, kept) - kept_before
    print(f"jump-forward over 3 records: {kept_now:.0f} of {sent_now:.0f} forced drafts kept")
    check(kept_now >= 1, f"no jump-forward draft kept ({kept_now} of {sent_now})")
    check(kept_now <= sent_now, f"{kept_now} jump-forward drafts kept of {sent_now} sent")


def regex_answers(client, model, messages):
    """vLLM's structured outputs: the whole answer matches a regex, or is one of a choice's
    strings, where the same seeds' answers without them do not; streamed, completions and the
    Responses API alike."""
    pattern = r"[A-Z]{2}-\d{2,4}( [a-z]{1,3})?"
    matched = []
    for seed in range(3):
        answer = client.chat.completions.create(
            model=model, messages=messages, max_tokens=40, temperature=1.0, seed=seed,
            extra_body={"structured_outputs": {"regex": pattern}})
        text = answer.choices[0].message.content
        check(bool(re.fullmatch(pattern, text)),
              f"seed {seed}: {text!r} does not match {pattern}")
        matched.append(text)
        check_eq(f"seed {seed}: regex finish_reason", answer.choices[0].finish_reason, "stop")
        free = client.chat.completions.create(model=model, messages=messages, max_tokens=40,
                                              temperature=1.0, seed=seed)
        check(not re.fullmatch(pattern, free.choices[0].message.content),
              f"seed {seed}: the toy model matched {pattern} unconstrained")
    streamed = streamed_chat_text(client, model=model, messages=messages, max_tokens=40,
                                  temperature=1.0, seed=0, extra_body={"guided_regex": pattern})
    check_eq("streamed under guided_regex: seed 0's answer", streamed, matched[0])
    choices = ["yes", "no", "maybe so"]
    # A classifier's labels: 5,000 (125 KB, more than a regex may hold).
    labels = [f"the {word} number {i}" for i, word in
              zip(range(5000), ["knight", "farmer", "bird", "robot"] * 1250)]
    picked = []
    for what, strings, seeds, max_tokens in [("choices", choices, 4, 10),
                                             ("the 5,000 labels", labels, 2, 24)]:
        # Each answer one of the strings, whole: the answer ends with it.
        for seed in range(seeds):
            completion = client.completions.create(
                model=model, prompt="the brave knight", max_tokens=max_tokens, temperature=1.0,
                seed=seed, extra_body={"guided_choice": strings})
            text = completion.choices[0].text
            check(text in strings, f"seed {seed}: {text!r} is not one of {what}")
            check_eq(f"seed {seed}: one of {what}: finish_reason",
                     completion.choices[0].finish_reason, "stop")
            picked.append(text)
    response = client.responses.create(model=model, input="the brave knight",
                                       max_output_tokens=10, temperature=1.0,
                                       extra_body={"seed": 0,
                                                   "structured_outputs": {"choice": choices}})
    chat_choice = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "the brave knight"}], max_tokens=10,
        temperature=1.0, seed=0, extra_body={"structured_outputs": {"choice": choices}})
    check(response.output_text in choices, f"Responses: {response.output_text!r}")
    check_eq("a choice through the Responses API is chat's", response.output_text,
             chat_choice.choices[0].message.content)
    expect_error("a regex the agent cannot hold",
                 lambda: client.chat.completions.create(
                     model=model, messages=messages,
                     extra_body={"structured_outputs": {"regex": "(a)\\1"}}),
                 openai.BadRequestError, 400, param="structured_outputs.regex")
    print(f"regex answers: {json.dumps(matched)}; choices {json.dumps(picked)}")


# A GBNF grammar (vLLM's structured_outputs.grammar): lists of up to four words, an item
# being a word or a bracketed list (recursive, so no regex is the same).
GRAMMAR = r"""
root ::= list
list ::= item (", " item){0,3}   # at most four items a list
item ::= [a-z]{1,8} | "[" list "]"
"""


def grammar_matches(text):
    """Whether GRAMMAR's root matches the whole of `text`: the innermost bracketed lists folded
    into an item ('#') until none is left, then one list."""
    item = r"(?:[a-z]{1,8}|#)"
    items = rf"{item}(?:, {item}){{0,3}}"
    text = text.replace("#", "?")  # only a folded list is an item '#'
    while True:
        folded = re.sub(rf"\[{items}\]", "#", text)
        if folded == text:
            return re.fullmatch(items, text) is not None
        text = folded


def grammar_answers(client, model, messages):
    """vLLM's structured outputs: the whole answer is what a GBNF grammar's root matches, where
    the same seeds' answers without it are not; guided_grammar streamed the same,
    completions, the Responses API, and a grammar that names an undefined rule refused."""
    matched = []
    for seed in range(3):
        answer = client.chat.completions.create(
            model=model, messages=messages, max_tokens=40, temperature=1.0, seed=seed,
            extra_body={"structured_outputs": {"grammar": GRAMMAR}})
        text = answer.choices[0].message.content
        check(grammar_matches(text), f"seed {seed}: {text!r} is not the grammar's")
        check_eq(f"seed {seed}: grammar finish_reason", answer.choices[0].finish_reason, "stop")
        matched.append(text)
        free = client.chat.completions.create(model=model, messages=messages, max_tokens=40,
                                              temperature=1.0, seed=seed)
        check(not grammar_matches(free.choices[0].message.content),
              f"seed {seed}: the toy model wrote the grammar's lists unconstrained")
    streamed = streamed_chat_text(client, model=model, messages=messages, max_tokens=40,
                                  temperature=1.0, seed=0, extra_body={"guided_grammar": GRAMMAR})
    check_eq("streamed under guided_grammar: seed 0's answer", streamed, matched[0])
    completion = client.completions.create(
        model=model, prompt="the brave knight", max_tokens=40, temperature=1.0, seed=1,
        extra_body={"guided_grammar": GRAMMAR})
    check(grammar_matches(completion.choices[0].text),
          f"completions: {completion.choices[0].text!r} is not the grammar's")
    response = client.responses.create(model=model, input=messages, max_output_tokens=40,
                                       temperature=1.0,
                                       extra_body={"seed": 2,
                                                   "structured_outputs": {"grammar": GRAMMAR}})
    check_eq("a grammar through the Responses API is chat's", response.output_text, matched[2])
    try:
        client.chat.completions.create(
            model=model, messages=messages,
            extra_body={"structured_outputs": {"grammar": "root ::= item (\", \" itme)*\n"
                                                          "item ::= [a-z]+"}})
        raise Mismatch("a grammar naming an undefined rule: accepted, want a 400")
    except openai.BadRequestError as e:
        check_eq("an undefined rule: HTTP status", e.status_code, 400)
        check_eq("an undefined rule: error.param", e.param, "structured_outputs.grammar")
        check("'structured_outputs.grammar': grammar: rule 'itme'" in e.message,
              f"an undefined rule: {e.message!r} does not name the field and the rule")
    print(f"grammar answers: {json.dumps(matched)}; completion "
          f"{json.dumps(completion.choices[0].text)}")


# A structural tag (vLLM's and SGLang's response_format structural_tag): free text, in which
# every " the" the model writes (the trigger) must go on as " the [" + "x" or "y" as a JSON
# string + "]" (the one structure), then text again.
STRUCTURAL_TAG = {
    "type": "structural_tag",
    "structures": [{"begin": " the [", "schema": {"enum": ["x", "y"]}, "end": "]"}],
    "triggers": [" the"],
}


def structural_tag_count(text, finish_reason="stop"):
    """The structures in `text` if each " the" in it starts one written whole (JSON's
    whitespace allowed before the value, as the agent's JSON takes it), the last possibly cut
    where max_tokens cut the answer, else None."""
    count, at = 0, 0
    while (start := text.find(" the", at)) >= 0:
        match = re.match(r' the \[[ \t\n\r]*"[xy]"\]', text[start:])
        if match is None:
            cut = re.fullmatch(r' the( (\[([ \t\n\r]*("([xy]("(\])?)?)?)?)?)?)?', text[start:])
            return count if cut is not None and finish_reason == "length" else None
        count, at = count + 1, start + match.end()
    return count


def structural_tag_answers(client, model, messages):
    """Structural tags: each answer's every " the" starts a whole, valid structure, where the
    same seeds' answers without the tag write " the" freely; the tag through
    structured_outputs streamed the same, completions, the Responses API's text.format, and
    a tag whose begin starts with no trigger refused naming the field."""
    answers, structures, free_triggers = [], 0, 0
    for seed in range(3):
        answer = client.chat.completions.create(
            model=model, messages=messages, max_tokens=40, temperature=1.0, seed=seed,
            response_format=STRUCTURAL_TAG)
        text = answer.choices[0].message.content
        count = structural_tag_count(text, answer.choices[0].finish_reason)
        check(count is not None, f"seed {seed}: {text!r} has a ' the' that starts no structure")
        structures += count or 0
        answers.append(text)
        free = client.chat.completions.create(model=model, messages=messages, max_tokens=40,
                                              temperature=1.0, seed=seed)
        free_triggers += free.choices[0].message.content.count(" the")
        check(structural_tag_count(free.choices[0].message.content) is None or
              " the" not in free.choices[0].message.content,
              f"seed {seed}: the toy model wrote the structure unconstrained")
    check(structures >= 1, f"no structure in three answers: {answers!r}")
    check(free_triggers >= 1, "the toy model wrote no ' the' unconstrained: the test shows nothing")
    tag_text = json.dumps({k: v for k, v in STRUCTURAL_TAG.items() if k != "type"})
    streamed = streamed_chat_text(client, model=model, messages=messages, max_tokens=40,
                                  temperature=1.0, seed=0,
                                  extra_body={"structured_outputs": {"structural_tag": tag_text}})
    check_eq("streamed under structured_outputs.structural_tag: seed 0's answer", streamed,
             answers[0])
    completion = client.completions.create(
        model=model, prompt="the brave knight", max_tokens=40, temperature=1.0, seed=1,
        extra_body={"response_format": STRUCTURAL_TAG})
    check(structural_tag_count(completion.choices[0].text,
                               completion.choices[0].finish_reason) is not None,
          f"completions: {completion.choices[0].text!r} has a ' the' that starts no structure")
    response = client.responses.create(model=model, input=messages, max_output_tokens=40,
                                       temperature=1.0, text={"format": STRUCTURAL_TAG},
                                       extra_body={"seed": 2})
    check_eq("a structural tag through the Responses API is chat's", response.output_text,
             answers[2])
    bad = dict(STRUCTURAL_TAG, triggers=[" a"])
    expect_error("a begin that starts with no trigger",
                 lambda: client.chat.completions.create(model=model, messages=messages,
                                                        response_format=bad),
                 openai.BadRequestError, 400, param="response_format")
    print(f"structural tag answers ({structures} structures): {json.dumps(answers)}; "
          f"completion {json.dumps(completion.choices[0].text)}")


def json_answers(client, model, base_url, messages):
    """response_format json_object: every answer is a JSON object and ends with it."""
    # The toy model never saw JSON: biased towards '"' and '}' (their byte-fallback pieces,
    # 3 + the byte: <unk>, <s> and </s> come first), its strings and objects end within the
    # budget (at +8 one seed wrote 160 tokens into a key; at +12 the longest answer here is
    # a few dozen tokens, and the budget is 400, since a toy model trained on another CPU
    # differs). The same bias without the format gives no JSON at all (below), so what makes
    # the answers objects is the constraint.
    quote, close = 3 + ord('"'), 3 + ord('}')
    for token_id, byte in ((quote, '"'), (close, '}')):
        status, answer = post_json(base_url.removesuffix("/v1") + "/detokenize",
                                   {"model": model, "tokens": [token_id]})
        check_eq(f"token {token_id} spells {byte!r}", (status, answer.get("prompt")), (200, byte))
    bias = {str(quote): 12, str(close): 12}
    fmt = {"type": "json_object"}

    def is_object(text):
        try:
            return isinstance(json.loads(text), dict)
        except ValueError:
            return False

    answers = formatted_answers(client, model, messages, bias, fmt, is_object, "a JSON object")
    check(any(len(json.loads(a)) > 0 for a in answers), f"only empty objects: {answers}")

    # Streamed, the same object; completions too.
    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=400, temperature=1.0, seed=0,
        logit_bias=bias, response_format=fmt, stream=True)
    with stream:
        streamed = "".join(choice.delta.content or "" for chunk in stream
                           for choice in chunk.choices)
    check_eq("the streamed JSON answer", streamed, answers[0])
    completion = client.completions.create(
        model=model, prompt="the old farmer", max_tokens=400, temperature=0.7, seed=3,
        logit_bias=bias, extra_body={"response_format": fmt})
    check(is_object(completion.choices[0].text),
          f"a completion that is not a JSON object: {completion.choices[0].text!r}")
    # Cut short by max_tokens, the object is not complete, and the answer says so. The cut is
    # the greedy answer's last piece of text: the usage counts the end-of-sequence token too,
    # which writes none. (How much white space the toy model writes before its '{' depends on
    # the CPU it was trained on: one wrote 16 lines of it.)
    whole = client.chat.completions.create(model=model, messages=messages, max_tokens=400,
                                           temperature=0, logit_bias=bias, response_format=fmt)
    whole_text, whole_tokens = whole.choices[0].message.content, whole.usage.completion_tokens
    check(is_object(whole_text) and whole_tokens >= 3,
          f"the greedy JSON answer: {whole_text!r} in {whole_tokens} tokens")
    short = client.chat.completions.create(model=model, messages=messages,
                                           max_tokens=whole_tokens - 2, temperature=0,
                                           logit_bias=bias, response_format=fmt)
    cut = short.choices[0].message.content
    check_eq("a JSON answer cut short: finish_reason", short.choices[0].finish_reason, "length")
    check(whole_text.startswith(cut) and len(cut) < len(whole_text) and not is_object(cut),
          f"a cut JSON answer: {cut!r}, of {whole_text!r}")
    print(f"response_format json_object: {json.dumps(answers[:3])}")


def json_schema_answers(client, model, messages):
    """response_format json_schema: every answer is a value of the schema, as the
    `jsonschema` package judges it, and a Pydantic model's schema through the client's own
    parse()."""
    # Biased towards '"', '}' and ']' as above, so that the toy model's strings and
    # containers end within the budget; the keys, the enum values and the types are the
    # constraint's doing.
    quote, close, bracket = 3 + ord('"'), 3 + ord('}'), 3 + ord(']')
    bias = {str(quote): 12, str(close): 12, str(bracket): 8}
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "annotations constrain nothing",
                     "minLength": 2, "maxLength": 6},
            "age": {"type": "integer", "minimum": 18, "exclusiveMaximum": 120},
            "score": {"type": "number", "minimum": 0.5, "maximum": 9.75},
            "tags": {"type": "array", "items": {"enum": ["red", "green"]}, "maxItems": 2},
            "pet": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/Pet"}]},
        },
        "required": ["name", "age", "score", "tags", "pet"],
        "additionalProperties": False,
        "$defs": {"Pet": {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}},
                          "required": ["kind"], "additionalProperties": False}},
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": schema,
                                                  "strict": True}}

    def conforms(text):
        try:
            jsonschema.validate(json.loads(text), schema)
            return True
        except (ValueError, jsonschema.ValidationError):
            return False

    answers = formatted_answers(client, model, messages, bias, fmt, conforms,
                                "a value of the schema")
    # Streamed, the same value; and the completions endpoint takes the format too.
    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=400, temperature=1.0, seed=0,
        logit_bias=bias, response_format=fmt, stream=True)
    with stream:
        streamed = "".join(choice.delta.content or "" for chunk in stream
                           for choice in chunk.choices)
    check_eq("the streamed schema answer", streamed, answers[0])
    completion = client.completions.create(
        model=model, prompt="the old farmer", max_tokens=400, temperature=0.7, seed=3,
        logit_bias=bias, extra_body={"response_format": fmt})
    check(conforms(completion.choices[0].text),
          f"a completion that is not a value of the schema: {completion.choices[0].text!r}")

    # A Pydantic model, as an application writes it: the client makes its strict schema
    # ($defs, a nullable reference to the model itself, an enum) and parses the answer.
    class Kind(str, enum.Enum):
        cat = "cat"
        dog = "dog"

    class Pet(pydantic.BaseModel):
        kind: Kind
        legs: int = pydantic.Field(ge=0, le=8)

    class Person(pydantic.BaseModel):
        name: str = pydantic.Field(min_length=1, max_length=10)
        age: int
        confidence: float = pydantic.Field(ge=0, le=1)
        pets: list[Pet]
        friend: typing.Optional["Person"]

    Person.model_rebuild()  # the reference to itself, resolved now that it is defined
    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse

    def parsed_answers(response_model):
        """Three seeds' answers through parse(), each an instance of the model."""
        answers = []
        for seed in range(3):
            parsed = parse(model=model, messages=messages, max_tokens=400, temperature=1.0,
                           seed=seed, logit_bias=bias, response_format=response_model)
            value = parsed.choices[0].message.parsed
            check(isinstance(value, response_model),
                  f"seed {seed}: parse() gave {value!r} for {parsed.choices[0].message.content!r}")
            answers.append(value)
        return answers

    parsed_answers(Person)

    # Unions of models: Pydantic's discriminated Union (a oneOf, its tag written first), a
    # nullable plain Union (an anyOf of both models and null) and Union[int, float].
    class Cat(pydantic.BaseModel):
        pet_type: typing.Literal["cat"]
        meows: int

    class Dog(pydantic.BaseModel):
        pet_type: typing.Literal["dog"]
        barks: float

    class Owner(pydantic.BaseModel):
        pet: typing.Union[Cat, Dog] = pydantic.Field(discriminator="pet_type")
        other: typing.Optional[typing.Union[Cat, Dog]]
        count: typing.Union[int, float]

    kinds = sorted({type(owner.pet).__name__ for owner in parsed_answers(Owner)})
    print(f"response_format Union[Cat, Dog]: pets {kinds}")

    # Patterns: Pydantic checks each answer's strings against them itself. Bounded, so that
    # the toy model, which never chooses to stop a \w+, ends them within the budget.
    class Ticket(pydantic.BaseModel):
        code: str = pydantic.Field(pattern=r"^[A-Z]{2}-\d{2,4}$")
        contact: str = pydantic.Field(pattern=r"^\w{1,8}@(?:[a-z]{1,6}\.){1,2}(com|org)$")

    codes = [ticket.code for ticket in parsed_answers(Ticket)]
    print(f"response_format patterns: codes {codes}")

    # Formats, as Pydantic writes them for its types (it parses each answer's strings as
    # them), a pattern beside lengths, as constr(pattern=..., min_length=..., max_length=...),
    # and a tuple (prefixItems). Each bounded, as above.
    class Visit(pydantic.BaseModel):
        id: uuid.UUID
        day: datetime.date
        host: ipaddress.IPv4Address
        word: str = pydantic.Field(pattern=r"^[a-z]+$", min_length=2, max_length=5)
        slot: tuple[datetime.date, bool]
        minutes: int = pydantic.Field(multiple_of=15, ge=0, le=120)

    visits = parsed_answers(Visit)
    check(all(2 <= len(visit.word) <= 5 for visit in visits),
          f"a word outside its lengths: {[visit.word for visit in visits]}")
    check(all(visit.minutes % 15 == 0 and 0 <= visit.minutes <= 120 for visit in visits),
          f"minutes not a multiple of 15 within 0-120: {[visit.minutes for visit in visits]}")
    print(f"response_format formats: {[(str(v.id), v.day.isoformat(), str(v.host), v.word, v.slot, v.minutes) for v in visits]}")

    # What the agent cannot hold an answer to is refused before any answer, naming the place.
    expect_error("response_format json_schema with a oneOf whose objects may overlap",
                 lambda: client.chat.completions.create(
                     model=model, messages=messages,
                     response_format={"type": "json_schema", "json_schema": {
                         "name": "x", "schema": {"oneOf": [
                             {"type": "object", "properties": {"a": {"type": "integer"}}},
                             {"type": "object", "properties": {"b": {"type": "integer"}}}]}}}),
                 openai.BadRequestError, 400, param="response_format")
    expect_error("response_format json_schema with a lookahead in a pattern",
                 lambda: client.chat.completions.create(
                     model=model, messages=messages,
                     response_format={"type": "json_schema", "json_schema": {
                         "name": "x", "schema": {"type": "object", "properties": {
                             "code": {"type": "string", "pattern": "^(?=A)[A-Z]{3}$"}}}}}),
                 openai.BadRequestError, 400, param="response_format")
    print(f"response_format json_schema: {json.dumps(answers[:3])}")


def tool_calls(client, model, messages):
    """tools: under tool_choice "required" or a named function every answer is calls whose
    arguments satisfy their tool's parameters (as `jsonschema` judges them), while the same
    seed's answer under "auto" is the toy model's text: it never saw a tool, so the calls are
    the constraint's doing. Streamed, the same calls; sent back with their answers, the next
    turn reads them; a Pydantic model's tool through the client's own parse()."""
    # Biased as for JSON answers, and towards the end of sequence (</s>, id 2), which the
    # constraint allows only after a whole call: one call, then the end.
    quote, close = 3 + ord('"'), 3 + ord('}')
    bias = {str(quote): 12, str(close): 12, "2": 8}
    weather = {"type": "object",
               "properties": {"city": {"type": "string", "maxLength": 12},
                              "days": {"type": "integer", "minimum": 1, "maximum": 7}},
               "required": ["city", "days"], "additionalProperties": False}
    clock = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
             "required": ["zone"], "additionalProperties": False}
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                               "parameters": weather, "strict": True}},
             {"type": "function", "function": {"name": "get_time", "parameters": clock}}]
    schemas = {"get_weather": weather, "get_time": clock}

    def check_calls(what, message):
        check(bool(message.tool_calls), f"{what}: no tool calls: {message!r}")
        for call in message.tool_calls:
            check_eq(f"{what}: call type", call.type, "function")
            check(call.id.startswith("call_") and len(call.id) == 29, f"{what}: id {call.id!r}")
            check(call.function.name in schemas, f"{what}: called {call.function.name!r}")
            try:
                jsonschema.validate(json.loads(call.function.arguments),
                                    schemas[call.function.name])
            except (ValueError, jsonschema.ValidationError) as e:
                raise Mismatch(f"{what}: arguments {call.function.arguments!r}: {e}")
        return [(c.function.name, c.function.arguments) for c in message.tool_calls]

    required = []
    for seed in range(4):
        answer = client.chat.completions.create(
            model=model, messages=messages, max_tokens=400, temperature=1.0, seed=seed,
            logit_bias=bias, tools=tools, tool_choice="required")
        choice = answer.choices[0]
        check_eq(f"seed {seed}: finish_reason", choice.finish_reason, "tool_calls")
        required.append(check_calls(f"seed {seed}", choice.message))
        # Unconstrained, without the end's bias (which would end the answer at once).
        free = client.chat.completions.create(
            model=model, messages=messages, max_tokens=100, temperature=1.0, seed=seed,
            logit_bias={str(quote): 12, str(close): 12}, tools=tools)
        check(not free.choices[0].message.tool_calls and bool(free.choices[0].message.content),
              f"seed {seed}: the toy model called a tool unconstrained: {free.choices[0]!r}")

    # A named function: one call, of it (a string of at most 12 characters and an integer
    # in [1, 7]); parallel_tool_calls false: one call.
    named_calls = []
    for seed in range(3):
        named = client.chat.completions.create(
            model=model, messages=messages, max_tokens=400, temperature=1.0, seed=seed,
            logit_bias=bias, tools=tools,
            tool_choice={"type": "function", "function": {"name": "get_weather"}})
        calls = check_calls("named function", named.choices[0].message)
        check_eq("named function: calls", [name for name, _ in calls], ["get_weather"])
        named_calls += calls
    # The seeds' own answers: a city is a sampled string (get_time's two zones could repeat).
    check(len(set(named_calls)) > 1, f"the seeds' calls are alike: {named_calls}")
    single = client.chat.completions.create(
        model=model, messages=messages, max_tokens=400, temperature=1.0, seed=2,
        logit_bias={str(quote): 12, str(close): 12}, tools=tools, tool_choice="required",
        parallel_tool_calls=False)
    check_eq("parallel_tool_calls false: calls",
             len(check_calls("parallel_tool_calls false", single.choices[0].message)), 1)

    # Streamed: the same calls, in a delta of their own.
    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=400, temperature=1.0, seed=0,
        logit_bias=bias, tools=tools, tool_choice="required", stream=True)
    streamed, finish = {}, None
    with stream:
        for chunk in stream:
            for choice in chunk.choices:
                for delta in choice.delta.tool_calls or []:
                    name, arguments = streamed.get(delta.index, ("", ""))
                    streamed[delta.index] = (name + (delta.function.name or ""),
                                             arguments + (delta.function.arguments or ""))
                finish = choice.finish_reason or finish
    check_eq("streamed calls", [streamed[k] for k in sorted(streamed)], required[0])
    check_eq("streamed finish_reason", finish, "tool_calls")

    # The next turn: the answer's message as the client returned it, and each call's answer.
    first = client.chat.completions.create(
        model=model, messages=messages, max_tokens=400, temperature=1.0, seed=0,
        logit_bias=bias, tools=tools, tool_choice="required")
    turn2 = messages + [first.choices[0].message] + [
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}
        for call in first.choices[0].message.tool_calls]
    second = client.chat.completions.create(model=model, messages=turn2, max_tokens=8,
                                            temperature=0, tools=tools)
    check(second.usage.prompt_tokens > first.usage.prompt_tokens + 5,
          f"turn 2 prompt_tokens {second.usage.prompt_tokens}, turn 1 "
          f"{first.usage.prompt_tokens}")

    # A Pydantic model as the tool, strict, through parse(): its arguments come back parsed.
    class GetForecast(pydantic.BaseModel):
        city: str = pydantic.Field(max_length=12)
        days: int = pydantic.Field(ge=1, le=7)

    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    parsed = parse(model=model, messages=messages, max_tokens=400, temperature=1.0, seed=5,
                   logit_bias=bias, tools=[openai.pydantic_function_tool(GetForecast)],
                   tool_choice="required")
    arguments = parsed.choices[0].message.tool_calls[0].function.parsed_arguments
    check(isinstance(arguments, GetForecast), f"parse() gave {arguments!r}")

    expect_error("tool_choice naming no tool",
                 lambda: client.chat.completions.create(
                     model=model, messages=messages, tools=tools,
                     tool_choice={"type": "function", "function": {"name": "launch"}}),
                 openai.BadRequestError, 400, param="tool_choice")
    print(f"tool calls: {json.dumps(required[:2])}, named: {json.dumps(calls)}")


def shared_prompt_choices(client, model, cloud_metrics_url, agent_metrics_url):
    """n > 1 with a prompt longer than conversation_cache.min_reuse_tokens (16): the prompt is
    computed once and each choice forks it, computing only the prompt's last position, and
    each choice is still the answer its seed gives the prompt alone. The cloud's counters say
    what it computed."""
    def cloud(series):
        return metric(cloud_metrics_url, series)

    # A fresh prompt: computed once (L positions), then one position a choice.
    fresh = "the brave knight rode to the castle and the old dragon slept in the cave " * 4
    prompt0, forked0 = cloud("tophat_prompt_tokens_total"), cloud("tophat_parked_sessions_forked_total")
    def let_go():  # parked sessions the cloud let go, each forgotten by the agent when told
        return (cloud("tophat_parked_sessions_evicted_total") +
                cloud("tophat_parked_sessions_expired_total"))
    kept0, gone0 = metric(agent_metrics_url, "tophat_conversations_kept"), let_go()
    many = client.completions.create(model=model, prompt=fresh, max_tokens=12, temperature=0.8,
                                     seed=5, n=2)
    length = fresh_length = many.usage.prompt_tokens
    check(length > 16, f"the prompt is {length} tokens, want more than min_reuse_tokens 16")
    check_eq("a fresh prompt's choices: positions the cloud computed",
             cloud("tophat_prompt_tokens_total") - prompt0, length + 2)
    check_eq("a fresh prompt's choices: sessions forked",
             cloud("tophat_parked_sessions_forked_total") - forked0, 2)
    check_eq("a fresh prompt's choices: cached tokens", many.usage.prompt_tokens_details.cached_tokens, 0)
    # Each choice keeps its own conversation and the kept prompt is let go: 2 more kept, less
    # those whose parked sessions the cloud let go meanwhile (to make room: 32 a device).
    # Being told is a message on the stream: waited for.
    wait_for("the agent to keep 2 more conversations, less those the cloud let go",
             lambda: metric(agent_metrics_url, "tophat_conversations_kept") - kept0 ==
             2 - (let_go() - gone0), 10)
    for j, choice in enumerate(many.choices):
        one = client.completions.create(model=model, prompt=fresh, max_tokens=12,
                                        temperature=0.8, seed=5 + j)
        check_eq(f"fresh prompt, choice {j}: seed {5 + j}'s answer", choice.text,
                 one.choices[0].text)
    check(many.choices[0].text != many.choices[1].text,
          f"a fresh prompt's two choices both say {many.choices[0].text!r}")

    # A prompt each seed answered alone first (the first from scratch, the next two reusing
    # its conversation): the kept prompt reuses a conversation too (cached tokens), so the
    # cloud computes one position for it and one a choice, streamed or not.
    story = "a long story about the cat who found a little bird in the old farmer's garden " * 3
    alone = [client.completions.create(model=model, prompt=story, max_tokens=10,
                                       temperature=0.9, seed=31 + j).choices[0].text
             for j in range(3)]
    prompt0, forked0 = cloud("tophat_prompt_tokens_total"), cloud("tophat_parked_sessions_forked_total")
    many = client.completions.create(model=model, prompt=story, max_tokens=10, temperature=0.9,
                                     seed=31, n=3)
    length = many.usage.prompt_tokens
    check_eq("a prompt kept from an earlier request: cached tokens",
             many.usage.prompt_tokens_details.cached_tokens, length - 1)
    check_eq("a prompt kept from an earlier request: positions the cloud computed",
             cloud("tophat_prompt_tokens_total") - prompt0, 1 + 3)
    check_eq("a prompt kept from an earlier request: sessions forked",
             cloud("tophat_parked_sessions_forked_total") - forked0, 3)
    check_eq("the choices are the seeds' answers alone", [c.text for c in many.choices], alone)
    stream = client.completions.create(model=model, prompt=story, max_tokens=10,
                                       temperature=0.9, seed=31, n=3, stream=True)
    parts = ["", "", ""]
    with stream:
        for chunk in stream:
            for choice in chunk.choices:
                parts[choice.index] += choice.text or ""
    check_eq("streamed, the choices are the seeds' answers alone", parts, alone)
    print(f"n > 1: a fresh {fresh_length}-token prompt computed once for its choices, each its "
          f"seed's answer; a {length}-token prompt kept from an earlier request too, streamed "
          f"or not")


def choices(client, model, messages):
    """n: every choice is its own request, choice i sampled with seed + i; several prompts;
    without a seed, every request samples with a fresh one. The agent runs at most 2
    completions at once (openai_client_test.sh): more choices run 2 at a time."""
    many = client.completions.create(model=model, prompt="the brave knight", max_tokens=16,
                                     temperature=0.8, seed=7, n=2)
    check_eq("n=2: the choices' indices", [c.index for c in many.choices], [0, 1])
    generated = 0
    for i, choice in enumerate(many.choices):
        one = client.completions.create(model=model, prompt="the brave knight", max_tokens=16,
                                        temperature=0.8, seed=7 + i)
        check_eq(f"n=2: choice {i} is seed {7 + i}'s answer", choice.text, one.choices[0].text)
        check_eq(f"n=2: choice {i}'s finish_reason", choice.finish_reason,
                 one.choices[0].finish_reason)
        generated += one.usage.completion_tokens
    check(many.choices[0].text != many.choices[1].text,
          f"n=2: both choices say {many.choices[0].text!r}")
    check_eq("n=2: usage counts the prompt once", many.usage.prompt_tokens, one.usage.prompt_tokens)
    check_eq("n=2: usage counts both choices' tokens", many.usage.completion_tokens, generated)

    # Streamed: the chunks carry their choice's index; put together, each is the whole answer's.
    whole = client.chat.completions.create(model=model, messages=messages, max_tokens=16,
                                           temperature=0.9, seed=3, n=2)
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=16,
                                            temperature=0.9, seed=3, n=2, stream=True,
                                            stream_options={"include_usage": True})
    parts, finished, usage = ["", ""], [None, None], None
    with stream:
        for chunk in stream:
            for choice in chunk.choices:
                parts[choice.index] += choice.delta.content or ""
                finished[choice.index] = choice.finish_reason or finished[choice.index]
            usage = chunk.usage or usage
    for i in range(2):
        check_eq(f"streamed n=2: choice {i}", parts[i], whole.choices[i].message.content)
        check_eq(f"streamed n=2: choice {i}'s finish_reason", finished[i],
                 whole.choices[i].finish_reason)
    check(usage is not None and usage.completion_tokens == whole.usage.completion_tokens,
          f"streamed n=2: usage {usage}, the whole answer's {whole.usage}")

    # Several prompts, 3 choices each (9 choices, run 2 at a time): prompt p's choice j is
    # choices[3p + j], OpenAI's order, and is the answer that prompt alone gets with seed + j.
    texts = ["the brave knight", "a long story", "the cat"]
    batch = client.completions.create(model=model, prompt=texts, max_tokens=8,
                                      temperature=0.8, seed=11, n=3)
    check_eq("3 prompts x n=3: the choices' indices", [c.index for c in batch.choices],
             list(range(9)))
    prompt_tokens = 0
    for p, text in enumerate(texts):
        for j in range(3):
            one = client.completions.create(model=model, prompt=text, max_tokens=8,
                                            temperature=0.8, seed=11 + j)
            check_eq(f"prompt {p}, choice {j}: the prompt's own answer with seed {11 + j}",
                     batch.choices[3 * p + j].text, one.choices[0].text)
        prompt_tokens += one.usage.prompt_tokens
    check_eq("3 prompts: usage counts each prompt once", batch.usage.prompt_tokens, prompt_tokens)

    # Unseeded sampling differs from request to request. At temperature 2 after a prompt of
    # arbitrary ids, 16 tokens (the chance of two equal answers is printed).
    prompt = [1, 100, 37, 250, 12, 77, 300, 45]
    answers = [client.completions.create(model=model, prompt=prompt, max_tokens=16,
                                         temperature=2, logprobs=0,
                                         extra_body={"ignore_eos": True,
                                                     "return_tokens_as_token_ids": True})
               for _ in range(2)]
    tokens = [a.choices[0].logprobs.tokens for a in answers]
    check(tokens[0] != tokens[1], f"two unseeded answers are the same: {tokens[0]}")
    print(f"n=2: each choice its seed's answer, streamed too; 3 prompts x 3 choices each "
          f"their prompt's; unseeded answers differ (the "
          f"first's log-probability at temperature 1: "
          f"{sum(answers[0].choices[0].logprobs.token_logprobs):.1f})")


def limits(client, model, base_url):
    """The endpoint refuses what it cannot serve at once instead of queueing or reading it:
    the agent runs with max_concurrent_requests 2 and max_prompt_bytes 64 KiB
    (openai_client_test.sh)."""
    url = urllib.parse.urlsplit(base_url)

    # A body past 2 x 64 KiB + 64 KiB: 413 in OpenAI's error shape, answered from the
    # Content-Length before the body is read (none of it is sent here).
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=20)
    connection.putrequest("POST", url.path + "/completions")
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(50 << 20))
    connection.endheaders()
    started = time.monotonic()
    response = connection.getresponse()
    refused_s = time.monotonic() - started
    body = json.loads(response.read() or b"{}")
    check_eq("a 50 MB body: HTTP status", response.status, 413)
    # At once: httplib's own check would first read the body to discard it, and answer only
    # when the client sent it all or a read timed out (5 s).
    check(refused_s < 2.5, f"a 50 MB body: refused at once (after {refused_s:.1f} s)")
    check("larger than this endpoint reads" in body.get("error", {}).get("message", ""),
          "a 50 MB body: the error says why")
    connection.close()
    print("a body past the limit is refused with 413 before it is read")

    # Two completions streaming (the limit), a third refused at once with 429.
    streams = [client.completions.create(model=model, prompt="a long story about a castle",
                                         max_tokens=800, temperature=0, stream=True,
        # Its length must not depend on what the toy model says: it must still run at chunk 4.
        extra_body={"ignore_eos": True})
               for _ in range(2)]
    for stream in streams:
        next(iter(stream))  # each is running
    started = time.monotonic()
    expect_error("a 3rd completion at once",
                 lambda: client.completions.create(model=model, prompt="hello", max_tokens=2),
                 openai.RateLimitError, 429, code="rate_limit_exceeded")
    check(time.monotonic() - started < 10, "the 429 came at once, not after the streams")
    streams.pop().close()
    # Each choice takes a place: with one stream running, two choices do not fit.
    expect_error("2 choices beside a stream",
                 lambda: client.completions.create(model=model, prompt="hello", max_tokens=2,
                                                   n=2),
                 openai.RateLimitError, 429, code="rate_limit_exceeded")
    for stream in streams:
        stream.close()
    # Once they are gone a completion runs again (their places are given back).
    wait_for("a completion to be accepted again", lambda: accepted(client, model), 30)
    print("a completion past max_concurrent_requests is refused with 429 at once")

    # A connection that sends nothing is closed by the endpoint (5 s per read), not kept.
    idle = socket.create_connection((url.hostname, url.port), timeout=30)
    started = time.monotonic()
    check_eq("an idle connection: what the endpoint sent before closing it", idle.recv(1024), b"")
    waited = time.monotonic() - started
    check(waited < 20, f"an idle connection closed within 20 s (after {waited:.1f} s)")
    idle.close()
    print(f"an idle connection is closed after {waited:.1f} s")

    slow_clients(client, model, url)


def slow_clients(client, model, url):
    """More clients than the endpoint has workers (max_concurrent_requests 2 + 8 spare) send
    their requests a byte every half second, which no per-read timeout trips: each is cut
    off at openai.request_deadline_s (3 s here, openai_client_test.sh), and a completion
    asked meanwhile is answered once they are. Without the deadline they hold every worker
    for as long as they dribble (30 s here) and the completion waits that long."""
    deadline_s = 3
    slow = []
    started = time.monotonic()  # no connection can be accepted, and its deadline start, before
    for _ in range(12):
        connection = socket.create_connection((url.hostname, url.port), timeout=30)
        connection.sendall(b"POST " + url.path.encode() + b"/completions HTTP/1.1\r\n"
                           b"Host: x\r\nX-Slow: ")
        slow.append(connection)
    connected_s = time.monotonic() - started
    closed_after = [None] * len(slow)
    stop = threading.Event()  # set only when the test fails early

    def dribble():
        while not stop.is_set() and time.monotonic() - started < 30:
            for i, connection in enumerate(slow):
                if closed_after[i] is not None:
                    continue
                try:
                    connection.sendall(b"a")
                    readable, _, _ = select.select([connection], [], [], 0)
                    if readable and connection.recv(1024) == b"":
                        closed_after[i] = time.monotonic() - started
                except OSError:
                    closed_after[i] = time.monotonic() - started
            if all(after is not None for after in closed_after):
                return
            time.sleep(0.5)

    dribbler = threading.Thread(target=dribble)
    dribbler.start()
    try:
        time.sleep(0.5)  # the slow connections are in, holding the workers
        asked = time.monotonic()
        answer = client.with_options(timeout=60).completions.create(
            model=model, prompt="hello", max_tokens=2, temperature=0)
        answered_s = time.monotonic() - asked
        dribbler.join()  # until every slow client is cut off, or 30 s
    finally:
        stop.set()
        dribbler.join()
        for connection in slow:
            connection.close()
    check(len(answer.choices) == 1, "a completion asked behind slow clients is answered")
    # The deadline, a check period (0.25 s) and a generous margin for a loaded machine, far
    # below the 30 s the slow clients would hold the workers without it.
    check(answered_s < 15, f"answered {answered_s:.1f} s after it was asked, within 15 s")
    for i, after in enumerate(closed_after):
        check(after is not None and after < 15, f"slow client {i} was cut off (after {after} s)")
        check(after >= deadline_s - 0.5,
              f"slow client {i} was not cut off before the deadline (after {after:.1f} s)")
    print(f"{len(slow)} clients sending a byte at a time are cut off after "
          f"{', '.join(f'{after:.1f}' for after in sorted(closed_after))} s; a completion asked "
          f"behind them took {answered_s:.1f} s (connecting them took {connected_s:.1f} s)")


# Log-probabilities: the endpoint's against transformers' full model on the same checkpoint,
# in float32 both; the split pipeline's logits agree with it to 1e-4 (hf_reference_test.py).
LOGPROB_TOLERANCE = 1e-4


def logprobs(client, model, messages, text, stop, model_dir):
    # Chat, greedy: each token's entry names the token its text adds; greedy took the likeliest.
    asked = client.chat.completions.create(model=model, messages=messages, max_tokens=24,
                                           temperature=0, logprobs=True, top_logprobs=3)
    content = asked.choices[0].logprobs.content
    check_eq("chat with logprobs: the same answer", asked.choices[0].message.content, text)
    check_eq("chat logprobs: one per token", len(content), 24)
    check_eq("chat logprobs: the tokens spell the answer", "".join(e.token for e in content), text)
    for i, entry in enumerate(content):
        check(entry.logprob <= 0, f"token {i}: logprob {entry.logprob} > 0")
        check_eq(f"token {i}: bytes", bytes(entry.bytes), entry.token.encode())
        top = entry.top_logprobs
        check_eq(f"token {i}: alternatives", len(top), 3)
        check(all(top[j].logprob >= top[j + 1].logprob for j in range(2)),
              f"token {i}: alternatives not likeliest first: {top}")
        check_eq(f"token {i}: greedy took the likeliest", top[0].token, entry.token)
        check(abs(top[0].logprob - entry.logprob) < 1e-6,
              f"token {i}: {entry.logprob} but its alternative says {top[0].logprob}")

    # Streamed: the same entries, spread over the chunks.
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=24,
                                            temperature=0, logprobs=True, top_logprobs=3,
                                            stream=True)
    streamed = []
    with stream:
        for chunk in stream:
            for choice in chunk.choices:
                if choice.logprobs is not None:
                    streamed.extend(choice.logprobs.content or [])
    check_eq("streamed logprobs: tokens", [e.token for e in streamed], [e.token for e in content])
    # Not to the bit: how the positions were computed differs (the first answer's prompt
    # whole, this one's taken from the conversation it left; rounds of other lengths).
    drift = max(abs(a.logprob - b.logprob) for a, b in zip(streamed, content))
    check(drift < LOGPROB_TOLERANCE, f"streamed logprobs differ from the whole answer's by {drift}")

    # A stop sequence: the entries end with the token that completed it.
    stopped = client.chat.completions.create(model=model, messages=messages, max_tokens=24,
                                             temperature=0, stop=[stop], logprobs=True)
    kept = stopped.choices[0].logprobs.content
    spelled = "".join(e.token for e in kept)
    check(spelled.startswith(stopped.choices[0].message.content + stop) and
          not "".join(e.token for e in kept[:-1]).startswith(
              stopped.choices[0].message.content + stop),
          f"stop {stop!r}: the logprobs spell {spelled!r}, want them to end with the token "
          "that completed it")
    check_eq("stop: the entries are the answer's first", [e.token for e in kept],
             [e.token for e in content[:len(kept)]])
    print(f"chat logprobs: {len(content)} tokens, 3 alternatives each; "
          f"{len(kept)} up to stop {json.dumps(stop)}")

    # Completions from token ids, greedy and sampled, against transformers.
    try:
        import torch
        import transformers
    except ImportError as e:
        raise Mismatch(f"transformers is missing from {sys.executable} ({e}); run "
                       "`bash deploy/install-deps.sh`")
    transformers.utils.logging.set_verbosity_error()
    reference = transformers.AutoModelForCausalLM.from_pretrained(model_dir,
                                                                  dtype=torch.float32)
    reference.eval()
    prompt = [1, 100, 37, 250, 12, 77, 300, 45, 9, 181]
    worst = 0.0
    for temperature, seed in ((0, None), (0.9, 11)):
        what = "greedy" if temperature == 0 else f"sampled at temperature {temperature}"
        c = client.completions.create(model=model, prompt=prompt, max_tokens=20,
                                      temperature=temperature, seed=seed, logprobs=5,
                                      extra_body={"ignore_eos": True,
                                                  "return_tokens_as_token_ids": True})
        got = c.choices[0].logprobs
        check_eq(f"{what}: tokens", len(got.tokens), 20)
        ids = [int(t.removeprefix("token_id:")) for t in got.tokens]
        with torch.no_grad():
            logits = reference(torch.tensor([prompt + ids])).logits[0]
        rows = torch.log_softmax(logits[len(prompt) - 1:-1].double(), dim=-1)
        offset = 0
        for i, (token, logprob, top) in enumerate(zip(ids, got.token_logprobs, got.top_logprobs)):
            row = rows[i]
            want = row[token].item()
            worst = max(worst, abs(logprob - want))
            check(abs(logprob - want) < LOGPROB_TOLERANCE,
                  f"{what}, token {i} ({token}): logprob {logprob}, transformers {want}")
            if temperature == 0:
                check_eq(f"{what}, token {i}: transformers' likeliest", token, row.argmax().item())
            check_eq(f"{what}, token {i}: alternatives", len(top), 5)
            values = list(top.values())
            check(values == sorted(values, reverse=True), f"{what}, token {i}: {top} unsorted")
            for name, value in top.items():
                alternative = int(name.removeprefix("token_id:"))
                check(abs(value - row[alternative].item()) < LOGPROB_TOLERANCE,
                      f"{what}, token {i}: alternative {alternative} at {value}, transformers "
                      f"{row[alternative].item()}")
            sixth = row.topk(6).values[5].item()
            check(values[-1] >= sixth - LOGPROB_TOLERANCE,
                  f"{what}, token {i}: the 5th alternative {values[-1]} is below transformers' "
                  f"6th likeliest {sixth}")
            check_eq(f"{what}, token {i}: text_offset", got.text_offset[i], offset)
            offset += len(got.tokens[i])
    print(f"completion logprobs from token ids, greedy and sampled: within "
          f"{worst:.1e} of transformers")

    # logit_bias: the same greedy answer as transformers with the same biases (its
    # sequence_bias), drafts and verification both biased. The bias bans the unbiased
    # answer's first two distinct tokens and favours a third token. transformers'
    # min_new_tokens bans the end-of-sequence token, and min_tokens does so here, ignore_eos
    # or not, as in vLLM: ignore_eos alone goes on past an end-of-sequence token the model
    # chooses (one toy model chose it third under this bias).
    plain_ids = [int(t.removeprefix("token_id:")) for t in client.completions.create(
        model=model, prompt=prompt, max_tokens=12, temperature=0, logprobs=0,
        extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True}
    ).choices[0].logprobs.tokens]
    banned = list(dict.fromkeys(plain_ids))[:2]
    favoured = next(i for i in range(3, 500) if i not in plain_ids)
    bias = {**{str(t): -100 for t in banned}, str(favoured): 4}
    biased = client.completions.create(
        model=model, prompt=prompt, max_tokens=12, temperature=0, logprobs=0, logit_bias=bias,
        extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True, "min_tokens": 12})
    biased_ids = [int(t.removeprefix("token_id:")) for t in biased.choices[0].logprobs.tokens]
    with torch.no_grad():
        want = reference.generate(
            torch.tensor([prompt]), max_new_tokens=12, do_sample=False, min_new_tokens=12,
            sequence_bias={(int(t),): float(b) for t, b in bias.items()},
            pad_token_id=0)[0][len(prompt):].tolist()
    check_eq("logit_bias: the greedy answer, as transformers' with sequence_bias", biased_ids,
             want)
    check(not set(banned) & set(biased_ids), f"banned tokens {banned} in {biased_ids}")
    check(biased_ids != plain_ids, "logit_bias changed nothing")
    print(f"logit_bias: {len(bias)} tokens biased, the answer as transformers'")

    # stop_token_ids ends the answer at a token of the greedy answer; with min_tokens that
    # token cannot be chosen before 6 tokens (drafts and verification alike), and the answer
    # is transformers' with min_new_tokens 6 and that token as its end of sequence.
    stop_at = next(i for i in range(2, len(plain_ids)) if plain_ids[i] not in plain_ids[:i])
    stop_id = plain_ids[stop_at]

    def stopped_ids(**extra):
        answer = client.completions.create(
            model=model, prompt=prompt, max_tokens=12, temperature=0, logprobs=0,
            extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True,
                        "stop_token_ids": [stop_id], **extra})
        return ([int(t.removeprefix("token_id:")) for t in answer.choices[0].logprobs.tokens],
                answer.choices[0].finish_reason)

    check_eq("stop_token_ids: the answer up to it", stopped_ids(),
             (plain_ids[:stop_at + 1], "stop"))
    with torch.no_grad():
        want = reference.generate(
            torch.tensor([prompt]), max_new_tokens=12, do_sample=False, min_new_tokens=6,
            eos_token_id=[stop_id], pad_token_id=0)[0][len(prompt):].tolist()
    while want and want[-1] == 0 and stop_id != 0:
        want.pop()  # transformers pads after its end of sequence
    got_ids, finish = stopped_ids(min_tokens=6)
    check_eq("min_tokens 6: as transformers' min_new_tokens", got_ids, want)
    # More than the agent's default max_tokens: the agent's planner refuses it, a 400.
    expect_error("min_tokens above the default max_tokens",
                 lambda: client.completions.create(model=model, prompt=prompt,
                                                   extra_body={"min_tokens": 100000}),
                 openai.BadRequestError, 400)
    check(len(got_ids) > 6 and stop_id not in got_ids[:6],
          f"min_tokens 6: {got_ids} (stop token {stop_id})")

    # min_p 1 keeps the likeliest token alone: sampled at any temperature (unseeded), the
    # greedy answer.
    only_likeliest = client.completions.create(
        model=model, prompt=prompt, max_tokens=12, temperature=1.5, logprobs=0,
        extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True, "min_p": 1.0})
    check_eq("min_p 1 at temperature 1.5: the greedy answer",
             [int(t.removeprefix("token_id:")) for t in only_likeliest.choices[0].logprobs.tokens],
             plain_ids)

    # Penalties on repetition: OpenAI's presence and frequency penalties (written out here,
    # as OpenAI and vLLM define them: over the generated tokens) after transformers' own
    # repetition_penalty (over the prompt and the generated tokens), as vLLM orders them.
    # The prompt ends with the model's own greedy answer, so that what it would say next is
    # in the prompt and the repetition penalty has prompt tokens to act on.
    presence, frequency, repetition = 1.0, 0.8, 1.5
    echoing = prompt + plain_ids

    class GeneratedTokenPenalties(transformers.LogitsProcessor):
        def __call__(self, input_ids, scores):
            for row in range(scores.shape[0]):
                counts = torch.bincount(input_ids[row, len(echoing):],
                                        minlength=scores.shape[1]).to(scores.dtype)
                scores[row] -= frequency * counts + presence * (counts > 0).to(scores.dtype)
            return scores

    penalized = client.completions.create(
        model=model, prompt=echoing, max_tokens=24, temperature=0, logprobs=0,
        presence_penalty=presence, frequency_penalty=frequency,
        # transformers' min_new_tokens bans the end-of-sequence token; so does this.
        logit_bias={str(reference.config.eos_token_id): -100},
        extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True,
                    "repetition_penalty": repetition})
    penalized_ids = [int(t.removeprefix("token_id:"))
                     for t in penalized.choices[0].logprobs.tokens]
    with torch.no_grad():
        want = reference.generate(
            torch.tensor([echoing]), max_new_tokens=24, do_sample=False, min_new_tokens=24,
            repetition_penalty=repetition,
            logits_processor=transformers.LogitsProcessorList([GeneratedTokenPenalties()]),
            pad_token_id=0)[0][len(echoing):].tolist()
        unpenalized = reference.generate(
            torch.tensor([echoing]), max_new_tokens=24, do_sample=False, min_new_tokens=24,
            pad_token_id=0)[0][len(echoing):].tolist()
    check_eq("penalties: the greedy answer, as transformers' with them", penalized_ids, want)
    check(want != unpenalized, "the penalties changed nothing in transformers' answer")
    print(f"penalties (presence {presence}, frequency {frequency}, repetition {repetition}): "
          f"the answer as transformers', {len(set(unpenalized))} distinct tokens of 24 "
          f"without them, {len(set(want))} with")

    # Scoring, as lm-evaluation-harness asks: echo, max_tokens 0, the prompt as token ids.
    text_prompt = [1] + [(7 * i + 3) % 500 + 3 for i in range(40)]
    scored = client.completions.create(model=model, prompt=text_prompt, max_tokens=0, echo=True,
                                       logprobs=2,
                                       extra_body={"return_tokens_as_token_ids": True})
    got = scored.choices[0].logprobs
    check_eq("scored: the prompt's tokens", [int(t.removeprefix("token_id:")) for t in got.tokens],
             text_prompt)
    check_eq("scored: the first token's logprob", got.token_logprobs[0], None)
    check_eq("scored: the first token's alternatives", got.top_logprobs[0], None)
    check_eq("scored: finish_reason", scored.choices[0].finish_reason, "length")
    check_eq("scored: completion_tokens", scored.usage.completion_tokens, 0)
    with torch.no_grad():
        logits = reference(torch.tensor([text_prompt])).logits[0]
    rows = torch.log_softmax(logits[:-1].double(), dim=-1)
    scored_worst = 0.0
    for i in range(1, len(text_prompt)):
        want = rows[i - 1][text_prompt[i]].item()
        scored_worst = max(scored_worst, abs(got.token_logprobs[i] - want))
        check(abs(got.token_logprobs[i] - want) < LOGPROB_TOLERANCE,
              f"scored, prompt token {i}: {got.token_logprobs[i]}, transformers {want}")
        best = int(next(iter(got.top_logprobs[i])).removeprefix("token_id:"))
        check_eq(f"scored, prompt token {i}: the likeliest", best, rows[i - 1].argmax().item())
    # With tokens generated after it, the same prompt's scores, then the generated ones'.
    echoed = client.completions.create(model=model, prompt=text_prompt, max_tokens=3, echo=True,
                                       temperature=0, logprobs=0, extra_body={
                                           "ignore_eos": True,
                                           "return_tokens_as_token_ids": True})
    both = echoed.choices[0].logprobs
    check_eq("echoed: tokens", len(both.tokens), len(text_prompt) + 3)
    check(all(abs(a - b) < LOGPROB_TOLERANCE for a, b in
              zip(both.token_logprobs[1:len(text_prompt)], got.token_logprobs[1:])),
          "echoed: the prompt's scores differ from scoring alone")
    # A batch, as lm-eval sends with batch_size 2: each prompt scored as it is alone.
    shorter = text_prompt[:20]
    batch = client.completions.create(model=model, prompt=[text_prompt, shorter], max_tokens=0,
                                      echo=True, logprobs=1,
                                      extra_body={"return_tokens_as_token_ids": True})
    check_eq("a batch scored: choices", len(batch.choices), 2)
    for i, (ids, alone) in enumerate(((text_prompt, got.token_logprobs),
                                      (shorter, got.token_logprobs[:20]))):
        entries = batch.choices[i].logprobs
        check_eq(f"a batch scored, prompt {i}: tokens",
                 [int(t.removeprefix("token_id:")) for t in entries.tokens], ids)
        check(all(abs(a - b) < LOGPROB_TOLERANCE
                  for a, b in zip(entries.token_logprobs[1:], alone[1:])),
              f"a batch scored, prompt {i}: scores differ from scoring it alone")
    check_eq("a batch scored: usage", batch.usage.prompt_tokens,
             len(text_prompt) + len(shorter))
    # Text: the answer starts with the prompt.
    plain = client.completions.create(model=model, prompt="the brave knight", max_tokens=4,
                                      temperature=0, echo=True)
    check(plain.choices[0].text.startswith("the brave knight"),
          f"echo: {plain.choices[0].text!r} does not start with the prompt")
    print(f"scoring (echo, max_tokens 0): {len(text_prompt) - 1} prompt tokens within "
          f"{scored_worst:.1e} of transformers")


def accepted(client, model):
    try:
        client.completions.create(model=model, prompt="hello", max_tokens=2)
        return True
    except openai.RateLimitError:
        return False


def report(checks):
    """Runs `checks` and prints PASS or what failed; the exit status (also
    tests/openai_restart_test.py's)."""
    try:
        checks()
    except Mismatch as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1
    except openai.APIError as e:
        print(f"FAIL: the endpoint answered {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print("PASS")
    return 0


def main():
    if len(sys.argv) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    return report(lambda: run(*sys.argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
