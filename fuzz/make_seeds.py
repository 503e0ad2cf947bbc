#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora (fuzz/corpus/<target>/). Run once when a format
changes; the seeds are committed. Standard library only: the protobuf seeds are encoded by
hand (varints and length-delimited fields).

    python3 fuzz/make_seeds.py [OUT_DIR]
"""
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# A schema with every kind of node the agent compiles (models/grammar/json_schema.h).
PERSON_SCHEMA = {
    "$defs": {"Person": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
            "kind": {"enum": ["adult", "child", 7, None]},
            "spouse": {"anyOf": [{"$ref": "#/$defs/Person"}, {"type": "null"}]},
        },
        "required": ["name", "age"],
        "additionalProperties": True,
    }},
    "$ref": "#/$defs/Person",
}


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_varint(number, value):
    return varint(number << 3) + varint(value)


def field_bytes(number, data):
    return varint(number << 3 | 2) + varint(len(data)) + data


def field_float(number, value):
    return varint(number << 3 | 5) + struct.pack("<f", value)


def byte_symbols():
    """GPT-2's byte-to-unicode table."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def tokenizer_json(llama3):
    sym = byte_symbols()
    vocab = {sym[b]: b for b in range(256)}
    space_t = sym[ord(" ")] + "t"
    extra = [space_t, "he", space_t + "he", "ll", "12", "123", "45", "34"]
    for i, piece in enumerate(extra):
        vocab[piece] = 256 + i
    merges = [("3", "4"), (sym[ord(" ")], "t"), ("h", "e"), (space_t, "he"), ("l", "l"),
              ("1", "2"), ("12", "3"), ("4", "5")]
    added = [{"id": 264 + i, "content": c, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": s}
             for i, (c, s) in enumerate([("<|end_of_text|>", True), ("<|begin_of_text|>", True),
                                         ("<|eot_id|>", True), ("<tag>", False)])]
    pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
    if llama3:
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    else:
        pre = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None, "pre_tokenizer": pre, "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None if llama3 else "",
                  "end_of_word_suffix": None if llama3 else "", "fuse_unk": False,
                  "byte_fallback": False, "ignore_merges": llama3, "vocab": vocab,
                  "merges": [[a, b] for a, b in merges] if llama3 else [f"{a} {b}" for a, b in merges]},
    }


def safetensors(tensors, metadata=None):
    header, data = {}, bytearray()
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + bytes(data)


def write(out, target, name, data):
    os.makedirs(os.path.join(out, target), exist_ok=True)
    mode = "w" if isinstance(data, str) else "wb"
    with open(os.path.join(out, target, name), mode) as f:
        f.write(data)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "corpus")
    write(out, "tokenizer_json", "llama3.json", json.dumps(tokenizer_json(True), indent=1))
    write(out, "tokenizer_json", "gpt2.json", json.dumps(tokenizer_json(False), indent=1))

    hidden = 64
    for dtype, size in ((1, 4), (2, 2), (3, 2)):
        for positions in (1, 3):
            payload = bytes(positions * hidden * size)
            msg = (field_varint(1, dtype) + field_varint(2, positions) + field_varint(3, hidden)
                   + field_bytes(4, payload))
            write(out, "hidden_states", f"dtype{dtype}-{positions}.bin", bytes([dtype]) + msg)
    # int8 with one float32 scale per position (field 5).
    for positions in (1, 3):
        scales = struct.pack(f"<{positions}f", *[0.5] * positions)
        msg = (field_varint(1, 4) + field_varint(2, positions) + field_varint(3, hidden)
               + field_bytes(4, bytes(range(hidden)) * positions) + field_bytes(5, scales))
        write(out, "hidden_states", f"dtype4-{positions}.bin", bytes([4]) + msg)
    write(out, "hidden_states", "short.bin",
          bytes([1]) + field_varint(1, 1) + field_varint(2, 2) + field_varint(3, hidden)
          + field_bytes(4, b"\0" * 7))

    f32 = struct.pack("<6f", *[0.5, -1, 2, 0, 3.25, 1e-3])
    write(out, "safetensors", "f32.safetensors",
          safetensors({"model.norm.weight": ("F32", [2, 3], f32)}, {"format": "pt"}))
    write(out, "safetensors", "mixed.safetensors",
          safetensors({"a": ("BF16", [4], bytes(8)), "b": ("F16", [2, 2], bytes(8)),
                       "c": ("I64", [1], bytes(8)), "empty": ("F32", [0, 3], b"")}))

    llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
             "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 256,
             "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
             "bos_token_id": 1, "eos_token_id": [2, 3], "torch_dtype": "bfloat16"}
    write(out, "model_config", "llama.json", json.dumps(llama, indent=1))
    qwen = dict(llama, architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                sliding_window=128, use_sliding_window=False, eos_token_id=2)
    write(out, "model_config", "qwen2.json", json.dumps(qwen, indent=1))
    mistral = dict(llama, architectures=["MistralForCausalLM"], model_type="mistral",
                   sliding_window=64, head_dim=16)
    write(out, "model_config", "mistral.json", json.dumps(mistral, indent=1))
    gemma3 = dict(llama, architectures=["Gemma3ForCausalLM"], model_type="gemma3_text",
                  head_dim=32, hidden_activation="gelu_pytorch_tanh", sliding_window=6,
                  layer_types=["sliding_attention"] * 3 + ["full_attention"],
                  query_pre_attn_scalar=24, final_logit_softcapping=None,
                  rope_parameters={"full_attention": {"rope_type": "default",
                                                      "rope_theta": 1e6},
                                   "sliding_attention": {"rope_type": "default",
                                                         "rope_theta": 1e4}})
    write(out, "model_config", "gemma3.json", json.dumps(gemma3, indent=1))
    # Gemma 3 4B's layout: the text model in text_config, most keys left to the defaults.
    gemma3_mm = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
                 "eos_token_id": [1, 106], "torch_dtype": "bfloat16",
                 "text_config": {"hidden_size": 64, "intermediate_size": 128,
                                 "num_hidden_layers": 6, "vocab_size": 512, "head_dim": 16,
                                 "sliding_window": 8, "sliding_window_pattern": 3,
                                 "rope_scaling": {"rope_type": "linear", "factor": 8.0}},
                 "vision_config": {"hidden_size": 32}}
    write(out, "model_config", "gemma3_multimodal.json", json.dumps(gemma3_mm, indent=1))
    # Phi-4-mini's rotary (3/4 of each head, LongRoPE) as transformers 5 writes it, and
    # Phi-3 mini's window with 4.x's keys.
    phi4 = dict(llama, architectures=["Phi3ForCausalLM"], model_type="phi3",
                partial_rotary_factor=0.75, original_max_position_embeddings=16,
                tie_word_embeddings=True,
                rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                 "partial_rotary_factor": 0.75,
                                 "original_max_position_embeddings": 16,
                                 "short_factor": [1.0, 1.1, 1.2, 1.3, 1.4, 1.5],
                                 "long_factor": [2.0, 3.0, 4.0, 5.0, 6.0, 7.0]})
    write(out, "model_config", "phi4_mini_longrope.json", json.dumps(phi4, indent=1))
    phi3 = dict(llama, architectures=["Phi3ForCausalLM"], model_type="phi3", sliding_window=2047,
                rope_scaling=None, original_max_position_embeddings=4096)
    write(out, "model_config", "phi3_mini_window.json", json.dumps(phi3, indent=1))

    # Gemma 2: both soft-caps, the window on every other layer left to Gemma2Config.
    gemma2 = dict(llama, architectures=["Gemma2ForCausalLM"], model_type="gemma2",
                  head_dim=32, hidden_activation="gelu_pytorch_tanh", sliding_window=6,
                  query_pre_attn_scalar=24, attn_logit_softcapping=50.0,
                  final_logit_softcapping=30.0)
    write(out, "model_config", "gemma2.json", json.dumps(gemma2, indent=1))
    # Mixtures of experts: Mixtral's keys, and Qwen3-MoE's checkpoint spelling with a dense
    # layer among sparse ones.
    mixtral = dict(llama, architectures=["MixtralForCausalLM"], model_type="mixtral",
                   num_local_experts=4, num_experts_per_tok=2, sliding_window=None)
    write(out, "model_config", "mixtral.json", json.dumps(mixtral, indent=1))
    qwen3_moe = dict(llama, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
                     head_dim=32, num_experts=8, num_experts_per_tok=3,
                     moe_intermediate_size=48, norm_topk_prob=True, decoder_sparse_step=1,
                     mlp_only_layers=[2])
    write(out, "model_config", "qwen3_moe.json", json.dumps(qwen3_moe, indent=1))
    qwen2_moe = dict(llama, architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe",
                     num_experts=6, num_experts_per_tok=2, moe_intermediate_size=40,
                     shared_expert_intermediate_size=96, qkv_bias=True)
    write(out, "model_config", "qwen2_moe.json", json.dumps(qwen2_moe, indent=1))
    qwen3_yarn = dict(llama, architectures=["Qwen3ForCausalLM"], model_type="qwen3",
                      head_dim=32, max_position_embeddings=131072, rope_theta=1000000.0,
                      rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                    "original_max_position_embeddings": 32768},
                      use_sliding_window=False)
    write(out, "model_config", "qwen3_yarn.json", json.dumps(qwen3_yarn, indent=1))
    gpt_oss = dict(llama, architectures=["GptOssForCausalLM"], model_type="gpt_oss",
                   head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=6,
                   layer_types=["sliding_attention", "full_attention"] * 2, swiglu_limit=7.0,
                   quantization_config={"quant_method": "mxfp4"},
                   rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                 "beta_slow": 1.0, "truncate": False,
                                 "original_max_position_embeddings": 16})
    write(out, "model_config", "gpt_oss.json", json.dumps(gpt_oss, indent=1))

    root = os.path.dirname(HERE)
    for name in ("cloud.yaml", "agent.yaml"):
        with open(os.path.join(root, "configs", name)) as f:
            write(out, "yaml_config", name, f.read())
    write(out, "yaml_config", "anchors.yaml",
          "base: &b {block_size: 16}\nkv_cache: *b\nlimits:\n  max_message_bytes: 1MiB\n"
          "pipeline:\n  layer_boundaries: [2, 4, 5]\n")

    sampling = (field_float(1, 0.7) + field_varint(2, 40) + field_float(3, 0.9) + field_varint(4, 7)
                + field_float(6, 0.5) + field_float(7, -0.25) + field_float(8, 1.2)
                + field_float(9, 0.05))
    write(out, "app_request", "text.bin",
          field_bytes(2, "Hello, world! 123 <|eot_id|> the hell".encode()) + field_varint(4, 8)
          + field_bytes(5, sampling) + field_varint(6, 2))
    write(out, "app_request", "ids.bin",
          field_bytes(3, field_bytes(1, b"".join(varint(i) for i in (1, 258, 263, 40))))
          + field_varint(4, 4) + field_varint(9, 1))
    write(out, "app_request", "utf8.bin", field_bytes(2, "été — ü 45 \U0001F600".encode()) + field_varint(8, 1))
    write(out, "app_request", "logprobs.bin",
          field_bytes(2, b"the cat") + field_varint(12, 1) + field_varint(13, 5))
    write(out, "app_request", "json_schema.bin",
          field_bytes(2, b"x") + field_varint(17, 2) + field_bytes(18, json.dumps(PERSON_SCHEMA).encode()))
    weather = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
               "required": ["city"], "additionalProperties": False}
    tool_format = (field_bytes(1, b'<tool_call>\n{"name": "') + field_bytes(2, b'", "arguments": ')
                   + field_bytes(3, b"}\n</tool_call>") + field_bytes(4, b"\n")
                   + field_bytes(5, field_bytes(1, b"get_weather")
                                 + field_bytes(2, json.dumps(weather).encode()))
                   + field_bytes(5, field_bytes(1, b"get_time")
                                 + field_bytes(2, b'{"type": "object"}'))
                   + field_varint(6, 4))
    write(out, "app_request", "tool_calls.bin",
          field_bytes(2, b"x") + field_varint(17, 3) + field_bytes(19, tool_format))
    # gpt-oss's harmony layout: control token ids 100-105, one call of get_weather.
    harmony_format = (field_bytes(5, field_bytes(1, b"get_weather")
                                  + field_bytes(2, json.dumps(weather).encode()))
                      + field_varint(6, 1)
                      + field_bytes(9, b"".join(field_varint(f, 99 + f) for f in range(1, 7))))
    write(out, "app_request", "harmony_call.bin",
          field_bytes(2, b"x") + field_varint(17, 3) + field_bytes(19, harmony_format))
    write(out, "app_request", "scoring.bin",
          field_bytes(3, field_bytes(1, b"".join(varint(i) for i in (1, 258, 263, 40))))
          + field_varint(12, 1) + field_varint(14, 1) + field_varint(15, 1))
    write(out, "app_request", "grammar.bin",
          field_bytes(2, b"x") + field_varint(17, 5)
          + field_bytes(21, b'root ::= word (" " word)*\nword ::= [a-z]{1,8} | "(" root ")"\n'))
    write(out, "app_request", "json.bin",
          field_bytes(2, b"the cat") + field_varint(6, 7) + field_varint(17, 1))
    # A thinking model's: the JSON object only after token 5 (its </think>).
    write(out, "app_request", "after_reasoning.bin",
          field_bytes(2, b"the cat") + field_varint(17, 1) + field_varint(24, 5))
    # And a budget of 3 reasoning tokens, with no format.
    write(out, "app_request", "reasoning_budget.bin",
          field_bytes(2, b"the cat") + field_varint(24, 5) + field_varint(25, 3))
    # And a message of two tokens forced before it once the budget is spent.
    write(out, "app_request", "reasoning_budget_end.bin",
          field_bytes(2, b"the cat") + field_varint(24, 5) + field_varint(25, 3)
          + field_varint(26, 9) + field_varint(26, 11))

    # The OpenAI endpoint's bodies: the first byte chooses the endpoint (even: chat).
    chat = {"model": "toy", "messages": [{"role": "system", "content": "be brief"},
                                         {"role": "user", "content": [
                                             {"type": "text", "text": "the cat sat"}]}],
            "max_completion_tokens": 8, "temperature": 0.5, "top_p": 0.9, "seed": 3,
            "stop": ["at", "\n\n"], "stream": True, "stream_options": {"include_usage": True},
            "logprobs": True, "top_logprobs": 3, "presence_penalty": 0.5,
            "frequency_penalty": -0.25, "repetition_penalty": 1.2, "top_k": 40, "min_p": 0.05}
    write(out, "openai_request", "chat.bin", b"\x00" + json.dumps(chat).encode())
    completion = {"model": "toy", "prompt": "été the cat", "max_tokens": 4, "logprobs": 2,
                  "include_stop_str_in_output": True,
                  "stop": "t", "ignore_eos": True, "tophat_outline": False,
                  "return_tokens_as_token_ids": True}
    write(out, "openai_request", "completion.bin", b"\x01" + json.dumps(completion).encode())
    write(out, "openai_request", "ids.bin", b"\x01" + json.dumps(
        {"model": "toy", "prompt": [[1, 20, 7]], "n": 3, "echo": False, "min_tokens": 2,
         "stop_token_ids": [7, 9], "max_tokens": 4}).encode())
    write(out, "openai_request", "scoring.bin", b"\x01" + json.dumps(
        {"model": "toy", "prompt": [1, 20, 7], "echo": True, "max_tokens": 0,
         "logprobs": 1}).encode())
    write(out, "openai_request", "batch.bin", b"\x01" + json.dumps(
        {"model": "toy", "prompt": ["the cat", [1, 20, 7], "x"], "n": 2,
         "echo": True, "logprobs": 1}).encode())
    write(out, "openai_request", "tokenize.bin", b"\x02" + json.dumps(
        {"model": "toy", "messages": [{"role": "user", "content": "the cat"}],
         "add_generation_prompt": True}).encode())
    write(out, "openai_request", "detokenize.bin", b"\x03" + json.dumps(
        {"model": "toy", "tokens": [1, 20, 7]}).encode())
    write(out, "openai_request", "json.bin", b"\x00" + json.dumps(
        {"model": "toy", "messages": [{"role": "user", "content": "x"}],
         "response_format": {"type": "json_object"}}).encode())
    write(out, "openai_request", "json_schema.bin", b"\x00" + json.dumps(
        {"model": "toy", "messages": [{"role": "user", "content": "x"}],
         "response_format": {"type": "json_schema", "json_schema": {
             "name": "person", "strict": True, "schema": PERSON_SCHEMA}}}).encode())
    write(out, "openai_request", "structural_tag.bin", b"\x00" + json.dumps(
        {"model": "toy", "messages": [{"role": "user", "content": "x"}],
         "response_format": {"type": "structural_tag", "structures": [
             {"begin": "<function=get>", "schema": PERSON_SCHEMA, "end": "</function>"}],
             "triggers": ["<function="]}}).encode())
    # A thinking model's turns: earlier reasoning sent back, thinking switched off.
    write(out, "openai_request", "thinking.bin", b"\x00" + json.dumps(
        {"model": "toy", "chat_template_kwargs": {"enable_thinking": False},
         "reasoning_effort": "low",
         "messages": [{"role": "user", "content": "x"},
                      {"role": "assistant", "content": "<think>\nr\n</think>\n\ny",
                       "reasoning_content": "r", "reasoning": "r"},
                      {"role": "user", "content": "z"}]}).encode())
    tools = [{"type": "function", "function": {
                  "name": "get_weather", "description": "Weather", "strict": True,
                  "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                 "required": ["city"], "additionalProperties": False}}},
             {"type": "function", "function": {"name": "get_time"}}]
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    write(out, "openai_request", "tools.bin", b"\x00" + json.dumps(
        {"model": "toy", "tools": tools, "tool_choice": "auto", "parallel_tool_calls": True,
         "messages": [
             {"role": "system", "content": "x"},
             {"role": "user", "content": 'Weather? <tool_call>\n{"name": "get_weather", '
                                         '"arguments": {"city": "Oslo"}}\n</tool_call>'},
             {"role": "assistant", "content": None, "refusal": None, "tool_calls": [call]},
             {"role": "tool", "tool_call_id": "call_1", "content": "cold"}]}).encode())
    write(out, "openai_request", "tool_choice.bin", b"\x00" + json.dumps(
        {"model": "toy", "tools": tools, "stream": True,
         "tool_choice": {"type": "function", "function": {"name": "get_time"}},
         "messages": [{"role": "user", "content": '{"name": "get_time", "parameters": {}}'}]}
    ).encode())
    # vLLM's structured outputs: a regex (compiled while parsing) and a choice.
    write(out, "openai_request", "regex.bin", b"\x00" + json.dumps(
        {"model": "toy", "messages": [{"role": "user", "content": "x"}],
         "structured_outputs": {"regex": "^[A-Z]{2}-\\d{2,4}( (?:ab|c)*)?$"}}).encode())
    write(out, "openai_request", "choice.bin", b"\x01" + json.dumps(
        {"model": "toy", "prompt": "x", "guided_choice": ["yes", "no", "a.b (c)"]}).encode())
    # A GBNF grammar (compiled while parsing; the request's text is matched against it):
    # recursion, classes, counts, escapes and a comment, and a text it takes.
    grammar = ('root ::= item (", " item){0,3}  # a list\n'
               'item ::= [a-z\\u00e9]+ | "(" root ")" | num\n'
               'num  ::= "-"? [0-9]{1,3} ("." [0-9]+)? | "\\x41"\n')
    write(out, "openai_request", "grammar.bin", b"\x00" + json.dumps(
        {"model": "toy", "messages": [{"role": "user", "content": "ab, (été, -12.5), A"}],
         "structured_outputs": {"grammar": grammar}}).encode())
    write(out, "openai_request", "guided_grammar.bin", b"\x01" + json.dumps(
        {"model": "toy", "prompt": "yes", "guided_grammar": 'root ::= "yes" | "no" | root2\n'
                                                              'root2 ::= [^\\n]{2,} "?"'}).encode())
    # /v1/responses (bit 3 of the first byte): input items with calls and their outputs,
    # flat tools, text.format and the fields a response repeats.
    write(out, "openai_request", "responses.bin", b"\x08" + json.dumps(
        {"model": "toy", "instructions": "be brief", "max_output_tokens": 8,
         "previous_response_id": "resp_1", "store": False, "metadata": {"k": "v"},
         "include": ["message.output_text.logprobs"], "top_logprobs": 2,
         "tools": [{"type": "function", "name": "get_weather", "strict": True,
                    "parameters": tools[0]["function"]["parameters"]}],
         "tool_choice": {"type": "function", "name": "get_weather"},
         "input": [{"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
                   {"type": "message", "role": "assistant",
                    "content": [{"type": "output_text", "text": "", "annotations": []}]},
                   {"type": "function_call", "call_id": "call_1", "name": "get_weather",
                    "arguments": '{"city": "Oslo"}'},
                   {"type": "function_call_output", "call_id": "call_1", "output": "cold"}]}
    ).encode())
    write(out, "openai_request", "responses_reasoning.bin", b"\x08" + json.dumps(
        {"model": "toy", "reasoning": {"effort": "high", "summary": None}, "input": [
            {"role": "user", "content": "x"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "status": "completed",
             "content": [{"type": "reasoning_text", "text": "r"}]},
            {"type": "message", "role": "assistant", "content": "y"},
            {"role": "user", "content": "z"}]}).encode())
    write(out, "openai_request", "responses_json.bin", b"\x08" + json.dumps(
        {"model": "toy", "input": "x", "stream": True, "temperature": 0,
         "text": {"format": {"type": "json_schema", "name": "person", "strict": True,
                             "schema": PERSON_SCHEMA}}}).encode())
    write(out, "openai_request", "responses_background.bin", b"\x08" + json.dumps(
        {"model": "toy", "input": "x", "background": True, "store": True,
         "max_output_tokens": 900, "ignore_eos": True}).encode())
    write(out, "openai_request", "responses_background_stream.bin", b"\x08" + json.dumps(
        {"model": "toy", "input": "x", "background": True, "stream": True,
         "conversation": {"id": "conv_1"}}).encode())
    # The conversations routes (0x09: bit 3 on completions' route; bits 4-5: create, update,
    # items).
    conversation_items = [
        {"type": "message", "role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "hello"}]},
        {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "42"}]
    write(out, "openai_request", "conversation_create.bin", b"\x09" + json.dumps(
        {"items": conversation_items, "metadata": {"topic": "x"}}).encode())
    write(out, "openai_request", "conversation_update.bin", b"\x19" + json.dumps(
        {"metadata": {"topic": "y"}}).encode())
    write(out, "openai_request", "conversation_items.bin", b"\x29" + json.dumps(
        {"items": conversation_items[:1]}).encode())
    write(out, "openai_request", "outline.bin", b"\x00" + json.dumps(
        {"model": "toy", "messages": [{"role": "user", "content": "x"}],
         "tophat_outline": {"max_points": 3}}).encode())

    # Tool calls: Qwen2.5's layout (several calls, text first) and Llama 3.1's (one call).
    weather = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                                "days": {"type": "integer", "minimum": 1}},
               "required": ["city"], "additionalProperties": False}
    tools = [{"name": "get_weather", "parameters": weather},
             {"name": "get", "parameters": {"type": "object"}}]
    hermes = {"open": '<tool_call>\n{"name": "', "between": '", "arguments": ',
              "close": "}\n</tool_call>", "separator": "\n", "start_tag": "<tool_call>",
              "max_calls": 3, "tools": tools}
    # gpt-oss's required call: choices that walk a reasoning message, then a call; with a
    # budget of 6 and an end message of two tokens (ids 65, 66: "A", "B").
    for name, extra in (("harmony.bin", {}),
                        ("harmony_budget.bin", {"budget": 6, "budget_end": [65, 66]})):
        write(out, "harmony_calls", name, json.dumps(dict({"tools": tools}, **extra)).encode()
              + b"\0" + bytes(range(1, 200, 3)))
    write(out, "tool_calls", "hermes.bin", json.dumps(hermes).encode() + b"\0"
          + b'<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}'
          + b'\n</tool_call>\n<tool_call>\n{"name": "get", "arguments": {}}\n</tool_call>')
    write(out, "tool_calls", "text_first.bin",
          json.dumps(dict(hermes, text_first=True)).encode() + b"\0"
          + b'Let me see. <tool<tool_call>\n{"name": "get", "arguments": {"a": [1]}}\n</tool_call>')
    llama = {"open": '{"name": "', "between": '", "parameters": ', "close": "}",
             "text_first": True, "tools": tools}
    write(out, "tool_calls", "llama.bin", json.dumps(llama).encode() + b"\0"
          + b'  {"name": "get_weather", "parameters": {"city": "Rome"}}')

    # Structural tags, NUL, an answer: Llama 3.1's function tags (text around and between
    # structures, a trigger's bytes split), a begin that is its trigger with an empty end
    # (JSON after reasoning), a number before an end, and a near miss.
    functions = {"structures": [
        {"begin": "<function=get_weather>", "schema": weather, "end": "</function>"},
        {"begin": "<function=get>", "schema": {"type": "object"}, "end": "</function>"}],
        "triggers": ["<function="]}
    write(out, "structural_tag", "functions.bin", json.dumps(functions).encode() + b"\0"
          + b'Let me see. <functio n <function=get_weather>{"city": "Oslo", "days": 2}'
          + b'</function> and <function=get>{"a": [1]}</function>\nDone.')
    think = {"type": "structural_tag",
             "structures": [{"begin": "</think>", "schema": weather, "end": ""}],
             "triggers": ["</think>"]}
    write(out, "structural_tag", "think.bin", json.dumps(think).encode() + b"\0"
          + b'<think>Oslo, surely.</think>\n{"city": "Oslo"} and more')
    numbers = {"structures": [
        {"begin": "<n>", "schema": {"type": "integer", "maximum": 99}, "end": "</n>"},
        {"begin": "<m>", "schema": {"type": "number"}, "end": ""}], "triggers": ["<n>", "<m>"]}
    write(out, "structural_tag", "numbers.bin", json.dumps(numbers).encode() + b"\0"
          + b"aa<n>12</n> then <m>-1.5e3<m>7 <n>100")

    # Answers in JSON: objects that take every branch of the automaton, and near misses.
    write(out, "json_grammar", "object.json",
          '{"a": [1, -2.5e+3, 0, true, false, null], "b": {"c": "\\u00e9\\uD83C\\uDFA9\\n"}}')
    write(out, "json_grammar", "pretty.json", '{\n  "k": [\n    {}\n  ]\n}')
    write(out, "json_grammar", "utf8.json", '{"\u00e9t\u00e9": "\U0001F3A9"}'.encode())
    write(out, "json_grammar", "broken.json", '{"a": [1,], "b": 01}')

    # A GBNF grammar, NUL, an answer: recursion, repetition counts, classes, escapes,
    # characters past ASCII, and near misses.
    arithmetic = (b'root ::= expr\nexpr ::= term (("+" | "-") term)*\n'
                  b'term ::= factor ("*" factor)*\nfactor ::= [0-9]+ | "(" expr ")"  # nested\n')
    write(out, "ebnf_grammar", "arithmetic.bin", arithmetic + b"\0(12+3)*((4-5))")
    write(out, "ebnf_grammar", "arithmetic_broken.bin", arithmetic + b"\0(12+*3")
    write(out, "ebnf_grammar", "json.bin",
          b'root ::= object\n'
          b'value ::= object | array | string | number | ("true" | "false" | "null") ws\n'
          b'object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws\n'
          b'array ::= "[" ws ( value ("," ws value)* )? "]" ws\n'
          b'string ::= "\\"" ( [^"\\\\\\x7F\\x00-\\x1F] | "\\\\" (["\\\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\\"" ws\n'
          b'number ::= "-"? [0-9]+ ("." [0-9]+)? ws\n'
          b'ws ::= | " " | "\\n" [ \\t]{0,20}\n'
          b'\0{"a": [1, -2.5, true, null], "b": {"c": "\xc3\xa9\\u00e9"}}')
    write(out, "ebnf_grammar", "counts.bin",
          'root ::= "a"{2} "b"{1,3} "c"{2,} "d"{,1} [^a-c\\n]? . [\u00e0-\u00ff\u20ac]+ '
          '"\\U0001F3A9"\n'.encode() + b"\0aabbccd" + "x\u00e9\u20ac\U0001F3A9".encode())
    write(out, "ebnf_grammar", "refused.bin", b'root ::= a\na ::= a "x" | "y"\0yx')

    # A schema, NUL, an answer: values of every kind of node, and near misses.
    schema = json.dumps(PERSON_SCHEMA).encode()
    write(out, "json_schema", "person.bin", schema + b"\0" + json.dumps(
        {"name": "Ann", "age": 31, "tags": ["a"], "kind": "child",
         "spouse": {"name": "Bo", "age": 2, "spouse": None}, "extra": [1, {"x": True}]}).encode())
    write(out, "json_schema", "missing.bin", schema + b'\0{"name": "Ann", "kind": "teen"}')
    write(out, "json_schema", "scalars.bin", json.dumps(
        {"type": "array", "items": {"anyOf": [{"type": "integer"}, {"enum": ["x", 1.5, None]},
                                              {"type": "boolean"}]},
         "minItems": 1, "maxItems": 4}).encode() + b"\0[1, \"x\", true, null]")
    write(out, "json_schema", "bounds.bin", json.dumps(
        {"type": "object", "properties": {
            "code": {"type": "string", "minLength": 2, "maxLength": 3},
            "rating": {"type": "integer", "minimum": 1, "exclusiveMaximum": 6},
            "depth": {"type": ["integer", "null"], "maximum": -40},
            "score": {"type": "number", "exclusiveMinimum": -2.5, "maximum": 700.25}},
         "required": ["code", "rating"]}).encode() +
          b'\0{"code": "\\u00e9b", "rating": 5, "depth": -41, "score": -2.49}')
    # Unions of one type: Pydantic's discriminated Union[Cat, Dog] (a oneOf), a plain
    # nullable one (an anyOf) and Union[int, float]; a recursive union of objects and strings.
    pet = {"Cat": ("meows", "integer"), "Dog": ("barks", "number")}
    defs = {name: {"type": "object", "properties": {
        "pet_type": {"const": name.lower(), "type": "string"}, field: {"type": kind}},
        "required": ["pet_type", field]} for name, (field, kind) in pet.items()}
    write(out, "json_schema", "unions.bin", json.dumps(
        {"$defs": defs, "type": "object", "properties": {
            "pet": {"oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
                    "discriminator": {"propertyName": "pet_type"}},
            "other": {"anyOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"},
                                {"type": "null"}]},
            "n": {"anyOf": [{"type": "integer"}, {"type": "number"}]}},
         "required": ["pet", "other", "n"]}).encode() +
          b'\0{"pet": {"pet_type": "dog", "barks": 1.5}, "other": {"pet_type": "cat", '
          b'"meows": 2, "x": [1]}, "n": 3}')
    write(out, "json_schema", "pattern.bin", json.dumps(
        {"type": "object", "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{2,3}$"},
            "mail": {"type": "string", "pattern": "^\\w+@(?:\\w+\\.)+(com|org)$"},
            "text": {"type": "string", "pattern": "(a|\u00e9)[^\\s]*\\n?"}},
         "required": ["code"]}).encode() +
          b'\0{"code": "AB-12", "mail": "a_b@x.y.org", "text": "\\u00e9\\tz\\n"}')
    write(out, "json_schema", "formats.bin", json.dumps(
        {"type": "object", "properties": {
            "when": {"type": "string", "format": "date-time"},
            "ip": {"type": "string", "format": "ipv6", "maxLength": 12},
            "id": {"type": "string", "format": "uuid", "pattern": "^[0-9a-f-]+$"},
            "word": {"type": "string", "pattern": "^(ab)+\u00e9?$", "minLength": 3, "maxLength": 7},
            "tag": {"type": "string", "pattern": "x", "minLength": 4}},
         "required": ["when"]}).encode() +
          b'\0{"when": "2024-02-29T23:59:60.5+05:30", "ip": "fe80::1", "word": "abab\u00e9", '
          b'"tag": "axbc"}')
    write(out, "json_schema", "tuples.bin", json.dumps(
        {"type": "object", "properties": {
            "point": {"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}],
                      "minItems": 2, "maxItems": 2},
            "head": {"prefixItems": [{"const": "h"}, {"type": "array", "items": False}],
                     "items": {"type": "string"}},
            "draft": {"items": [{"type": "integer"}], "additionalItems": {"type": "null"}}},
         "required": ["point"]}).encode() +
          b'\0{"point": [1.5, -2], "head": ["h", [], "x"], "draft": [3, null]}')
    write(out, "json_schema", "multiples.bin", json.dumps(
        {"type": "object", "properties": {
            "step": {"type": "integer", "multipleOf": 5, "minimum": -12, "maximum": 40},
            "below": {"type": "integer", "multipleOf": 9, "exclusiveMaximum": -20},
            "dozens": {"type": "number", "multipleOf": 12}},
         "required": ["step"]}).encode() +
          b'\0{"step": -10, "below": -108, "dozens": 120}')
    write(out, "json_schema", "tree.bin", json.dumps(
        {"$defs": {"T": {"anyOf": [
            {"type": "object", "properties": {"value": {"type": "string", "maxLength": 2}},
             "required": ["value"]},
            {"type": "object", "properties": {
                "children": {"type": "array", "items": {"$ref": "#/$defs/T"}}},
             "required": ["children"], "additionalProperties": False},
            {"type": "string"}, {"enum": ["x", "yy"]}]}}, "$ref": "#/$defs/T"}).encode() +
          b'\0{"children": [{"value": "ab"}, "yy", {"children": []}]}')

    # The engine's structured input: op bytes then fields (see agent_message_fuzzer.cc).
    write(out, "agent_message", "open-chunk-step.bin",
          bytes([0x04, 1, 0, 0, 32, 0, 0, 0, 9, 0x04, 1, 1, 1, 0, 0, 1, 1, 4, 1, 1, 1, 1, 0x02, 0x02]))
    write(out, "agent_message", "raw-open.bin",
          bytes([0x00, 8]) + field_bytes(1, field_varint(1, 3) + field_varint(2, 16)) + bytes([0x02]))
    write(out, "agent_message", "two-devices.bin", bytes(range(0, 256, 3)))


if __name__ == "__main__":
    main()
