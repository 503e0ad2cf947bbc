#!/usr/bin/env python3
"""Decode or prefill speed of tophat's CPU runtime against llama.cpp's: same model, machine.

llama.cpp is the peer users compare a device runtime with. This script takes a Llama-shaped
Hugging Face checkpoint (safetensors, float32: `tophat init-model --preset bench-110m`),
writes it as a GGUF file with llama.cpp's own `gguf` package (from the llama.cpp source tree
given), quantizes that with llama.cpp's `llama-quantize` to F16, BF16 and Q8_0, and then runs,
interleaved run by run on the same threads:

  llama-bench -m MODEL.gguf -p 0 -n N -d D -t T -r 1      (F32, F16, BF16, Q8_0)
  tophat bench-model --weights float32|bfloat16|bf16a16|int8|w8a8 ...  (decode N tokens after D)

and prints a table and JSON of the decode rates and their same-run ratios, with the
machine's CPU model and the read bandwidth tophat's probe measured in each run. With
--prefill P it times a P-token prompt instead, each runtime's one batch of P positions:

  llama-bench -m MODEL.gguf -p P -n 0 -t T -r 1
  tophat bench-model --weights W --prompt-tokens P --decode-tokens 1 --repetitions 1

llama.cpp is built from its source beside the project, never committed:
  cmake -S LLAMA -B LLAMA/build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF
  cmake --build LLAMA/build --target llama-bench llama-quantize

Usage:
  llama_cpp_peer.py --model CKPT --llama-cpp LLAMA --tophat build/release/bin/tophat \
      --work DIR [--runs 3] [--threads 2] [--decode-tokens 128] [--depth 16] [--prefill P]
      [--json OUT]

The GGUF is the same network: q/k rows are permuted from Hugging Face's rotate-half layout to
the interleaved one llama.cpp's "llama" architecture expects (as convert_hf_to_gguf.py does),
and the vocabulary is a placeholder of the checkpoint's size (llama-bench feeds token ids,
never text). Speeds only: the two runtimes' logits are not compared here.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path


def cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def write_gguf(checkpoint: Path, out: Path, llama_cpp: Path):
    sys.path.insert(0, str(llama_cpp / "gguf-py"))
    import numpy as np
    import gguf
    from safetensors.numpy import load_file

    config = json.loads((checkpoint / "config.json").read_text())
    tensors = {}
    for file in sorted(checkpoint.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    dim = config["hidden_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim", dim // heads)
    layers = config["num_hidden_layers"]
    vocab = config["vocab_size"]

    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name(checkpoint.name)
    writer.add_context_length(config.get("max_position_embeddings", 2048))
    writer.add_embedding_length(dim)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(config.get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-5)))
    writer.add_vocab_size(vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    # A placeholder SentencePiece vocabulary of the model's size: <unk>, <s>, </s>, the 256
    # byte tokens llama.cpp looks up, then plain pieces.
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    pieces += [f"tok{i}" for i in range(vocab - len(pieces))]
    types = ([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] +
             [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * (vocab - 259))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(pieces)
    writer.add_token_scores([0.0] * vocab)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)

    def permute(w, n_head):
        # Hugging Face's rotate-half rows to the interleaved pairs llama.cpp rotates.
        return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
                .swapaxes(1, 2).reshape(w.shape))

    def f32(name):
        return np.ascontiguousarray(tensors[name].astype(np.float32))

    writer.add_tensor("token_embd.weight", f32("model.embed_tokens.weight"))
    writer.add_tensor("output_norm.weight", f32("model.norm.weight"))
    if "lm_head.weight" in tensors and not config.get("tie_word_embeddings", False):
        writer.add_tensor("output.weight", f32("lm_head.weight"))
    for i in range(layers):
        p = f"model.layers.{i}."
        writer.add_tensor(f"blk.{i}.attn_norm.weight", f32(p + "input_layernorm.weight"))
        writer.add_tensor(f"blk.{i}.attn_q.weight",
                          np.ascontiguousarray(permute(f32(p + "self_attn.q_proj.weight"), heads)))
        writer.add_tensor(f"blk.{i}.attn_k.weight",
                          np.ascontiguousarray(permute(f32(p + "self_attn.k_proj.weight"),
                                                       kv_heads)))
        writer.add_tensor(f"blk.{i}.attn_v.weight", f32(p + "self_attn.v_proj.weight"))
        writer.add_tensor(f"blk.{i}.attn_output.weight", f32(p + "self_attn.o_proj.weight"))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", f32(p + "post_attention_layernorm.weight"))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", f32(p + "mlp.gate_proj.weight"))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", f32(p + "mlp.up_proj.weight"))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", f32(p + "mlp.down_proj.weight"))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def run(cmd, timeout):
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        sys.stderr.write(result.stdout[-2000:] + result.stderr[-2000:])
        raise SystemExit(f"FAIL: {' '.join(map(str, cmd))} exited {result.returncode}")
    return result.stdout


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="float32 HF checkpoint")
    parser.add_argument("--llama-cpp", type=Path, required=True,
                        help="llama.cpp source tree with build/bin/llama-bench, llama-quantize")
    parser.add_argument("--tophat", type=Path, required=True, help="the tophat binary")
    parser.add_argument("--work", type=Path, required=True, help="where the GGUF files go")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--depth", type=int, default=16,
                        help="context before the first timed token (tophat bench-model's 16)")
    parser.add_argument("--prefill", type=int, default=0,
                        help="time a prompt of this many tokens instead of decode (0: decode)")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()
    prefill = args.prefill > 0
    what = f"prefill {args.prefill}" if prefill else "decode"

    bench = args.llama_cpp / "build" / "bin" / "llama-bench"
    quantize = args.llama_cpp / "build" / "bin" / "llama-quantize"
    for tool in (bench, quantize):
        if not tool.exists():
            raise SystemExit(f"FAIL: {tool} is missing: build llama.cpp first (see --help)")
    args.work.mkdir(parents=True, exist_ok=True)
    f32 = args.work / "model-f32.gguf"
    if not f32.exists():
        print(f"writing {f32}", flush=True)
        write_gguf(args.model, f32, args.llama_cpp)
    ggufs = {"F32": f32}
    for kind in ("F16", "BF16", "Q8_0"):
        path = args.work / f"model-{kind.lower()}.gguf"
        if not path.exists():
            print(f"quantizing to {kind}", flush=True)
            run([quantize, f32, path, kind, str(args.threads)], 1200)
        ggufs[kind] = path

    rows = []  # one per run and runtime/dtype
    for r in range(args.runs):
        for kind, path in ggufs.items():
            shape = (["-p", str(args.prefill), "-n", "0"] if prefill else
                     ["-p", "0", "-n", str(args.decode_tokens), "-d", str(args.depth)])
            out = run([bench, "-m", path, *shape, "-t", str(args.threads), "-r", "1", "-o",
                       "json"], 1200)
            result = json.loads(out)[0]
            rows.append({"run": r + 1, "runtime": "llama.cpp", "weights": kind,
                         "tokens_per_s": result["avg_ts"],
                         "model_bytes": result.get("model_size")})
            print(f"run {r + 1} llama.cpp {kind} {what}: {result['avg_ts']:.1f} tok/s", flush=True)
        for weights in ("float32", "bfloat16", "bf16a16", "int8", "w8a8"):
            report_path = args.work / f"tophat-{weights}-{r + 1}.json"
            shape = (["--prompt-tokens", str(args.prefill), "--decode-tokens", "1"] if prefill else
                     ["--prompt-tokens", str(max(args.depth, 16)), "--decode-tokens",
                      str(args.decode_tokens)])
            run([args.tophat, "bench-model", "--model", args.model, "--weights", weights, *shape,
                 "--repetitions", "1", "--json", report_path], 1200)
            report = json.loads(report_path.read_text())
            speed = report["prefill_tokens_per_s" if prefill else "decode_tokens_per_s"]
            rows.append({"run": r + 1, "runtime": "tophat", "weights": weights,
                         "tokens_per_s": speed,
                         "model_bytes": report["weight_bytes_per_token"],
                         "read_bandwidth_bytes_per_s": report["read_bandwidth_bytes_per_s"],
                         "gemm_flops_per_s": report["gemm_flops_per_s"]})
            print(f"run {r + 1} tophat {weights} {what}: {speed:.1f} tok/s "
                  f"(read BW {report['read_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s, float32 GEMM "
                  f"{report['gemm_flops_per_s'] / 1e9:.0f} GFLOP/s)", flush=True)

    def rate(r, runtime, weights):
        return next(x["tokens_per_s"] for x in rows
                    if x["run"] == r and x["runtime"] == runtime and x["weights"] == weights)

    # tophat has no float16 weights: its bfloat16 (the same bytes per weight) against both.
    # BF16 rounds a prompt's activations to bfloat16 as tophat's bf16a16 does (its decode
    # keeps float32 activations, as bfloat16's); tophat's bfloat16 (float32 activations)
    # beside it. Q8_0 rounds the activations to int8 per block of 32 as tophat's w8a8 does;
    # tophat's int8 (weight-only, float32 activations) beside it.
    pairs = [("float32", "F32"), ("bfloat16", "BF16"), ("bf16a16", "BF16"), ("bfloat16", "F16"),
             ("int8", "Q8_0"), ("w8a8", "Q8_0")]
    ratios = []
    print(f"\nCPU: {cpu_model()}, {args.threads} threads; " +
          (f"a {args.prefill}-token prompt (tokens/s)" if prefill else
           f"decode {args.decode_tokens} tokens after {args.depth}"))
    bound = "float32 GEMM" if prefill else "read BW"
    print(f"| run | {bound} | " + " | ".join(f"tophat {t} / llama.cpp {l}" for t, l in pairs) +
          " |")
    print("|---|---|" + "---|" * len(pairs))
    for r in range(1, args.runs + 1):
        tophat_row = next(x for x in rows if x["run"] == r and x["runtime"] == "tophat")
        measured = (f"{tophat_row['gemm_flops_per_s'] / 1e9:.0f} GFLOP/s" if prefill else
                    f"{tophat_row['read_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s")
        cells = []
        for t, l in pairs:
            ratio = rate(r, "tophat", t) / rate(r, "llama.cpp", l)
            ratios.append({"run": r, "tophat": t, "llama_cpp": l, "ratio": ratio})
            cells.append(f"{rate(r, 'tophat', t):.1f} / {rate(r, 'llama.cpp', l):.1f} = "
                         f"**{ratio:.2f}x**")
        print(f"| {r} | {measured} | " + " | ".join(cells) + " |")
    report = {"cpu": cpu_model(), "threads": args.threads, "decode_tokens": args.decode_tokens,
              "depth": args.depth, "prefill_tokens": args.prefill, "rows": rows,
              "ratios": ratios, "time": time.time()}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
