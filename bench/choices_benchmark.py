#!/usr/bin/env python3
"""Several choices of one prompt (the OpenAI API's `n`): the prompt computed once and forked
for every choice, against the same choices as separate requests started together (what `n`
cost before the agent kept the prompt for its choices). Same daemons, same run.

    python3 bench/choices_benchmark.py --bin-dir build/release/bin --model DIR --work DIR
        [--n 4] [--prompt-tokens 768] [--max-tokens 16] [--trials 3] [--json FILE]

tophat-cloud and tophat-agent on loopback (tests/loopback_daemons.py: m = 1, k = 1, the
agent's OpenAI endpoint), then per trial, in alternating order, both ways on a fresh prompt
of random token ids (no earlier turn to reuse): `n` choices in one streamed completion, and
`n` streamed completions of n = 1 with the same seeds. Each choice samples (temperature
0.8, seed + j) to exactly --max-tokens tokens (ignore_eos). Measured from the client: the
time until every choice is done, each choice's time to its first token; from the cloud's
metrics: the prompt positions it computed. Prints a table and JSON with the medians over the
trials and the ratios separate / shared.
"""
import argparse
import json
import os
import platform
import random
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from loopback_daemons import free_port, serving  # noqa: E402
from model_checks import metric  # noqa: E402

import openai  # noqa: E402


def stream_choices(client, model, prompt, n, seed, max_tokens, start, firsts, offset):
    """One streamed completion of `n` choices; each choice's first-token time (seconds since
    `start`) into firsts[offset + index]; returns the choices' texts."""
    texts = [""] * n
    stream = client.completions.create(model=model, prompt=prompt, n=n, seed=seed,
                                       temperature=0.8, max_tokens=max_tokens, stream=True,
                                       extra_body={"ignore_eos": True})
    with stream:
        for chunk in stream:
            for choice in chunk.choices:
                if firsts[offset + choice.index] is None and choice.text:
                    firsts[offset + choice.index] = time.monotonic() - start
                texts[choice.index] += choice.text or ""
    return texts


def trial(client, model, prompt, n, seed, max_tokens, shared):
    """Both ways share this shape: the answers, the time until all are done, first tokens."""
    firsts = [None] * n
    start = time.monotonic()
    if shared:
        texts = stream_choices(client, model, prompt, n, seed, max_tokens, start, firsts, 0)
    else:
        texts = [None] * n
        errors = []

        def one(j):
            try:
                texts[j] = stream_choices(client, model, prompt, 1, seed + j, max_tokens, start,
                                          firsts, j)[0]
            except Exception as e:  # reported below, not lost in the thread
                errors.append(e)
        threads = [threading.Thread(target=one, args=(j,)) for j in range(n)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
    done = time.monotonic() - start
    if any(first is None for first in firsts):
        raise SystemExit(f"FAIL: a choice streamed no text: {texts!r}")
    return texts, done, firsts


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin-dir", required=True)
    parser.add_argument("--model", required=True, help="checkpoint directory (with a tokenizer)")
    parser.add_argument("--work", required=True, help="a directory to create for the run")
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=768)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--json", help="also write the JSON here")
    args = parser.parse_args()
    if args.n < 2 or args.trials < 1 or args.prompt_tokens + args.max_tokens > 1024:
        parser.error("--n at least 2, --trials at least 1, and the prompt and answer within "
                     "the daemons' context of 1,024")

    with open(os.path.join(args.model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    cloud_metrics = free_port()
    rows = {"shared": [], "separate": []}
    with serving(args.bin_dir, args.work, args.model, cloud_metrics=cloud_metrics,
                 kv_memory="512MiB",
                 agent_settings=f"max_concurrent_requests: {max(16, args.n)}\n") as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0,
                               timeout=600)
        model = client.models.list().data[0].id
        rng = random.Random(7)
        # One unmeasured round of each way first: the processes' first requests pay for
        # allocations and thread pools.
        for t in range(-1, args.trials):
            for shared in ((True, False) if t % 2 == 0 else (False, True)):
                # Ids past the toy tokenizers' special ones (0-2); fresh every time, so
                # neither way finds a kept conversation to reuse.
                prompt = [rng.randrange(3, vocab) for _ in range(args.prompt_tokens)]
                computed = metric(cloud_metrics, "tophat_prompt_tokens_total")
                _, done, firsts = trial(client, model, prompt, args.n, 100 + t,
                                            args.max_tokens, shared)
                computed = metric(cloud_metrics, "tophat_prompt_tokens_total") - computed
                if t < 0:
                    continue
                rows["shared" if shared else "separate"].append(
                    {"done_s": done, "ttft_mean_s": statistics.mean(firsts),
                     "ttft_max_s": max(firsts), "prompt_positions": computed})
    def median(way, key):
        return statistics.median(row[key] for row in rows[way])

    result = {
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
        "model": os.path.abspath(args.model),
        "n": args.n, "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens,
        "trials": args.trials,
    }
    print(f"{args.n} choices of a {args.prompt_tokens}-token prompt, {args.max_tokens} tokens "
          f"each, median of {args.trials} trials ({os.cpu_count()} CPUs, cloud and agent on "
          f"this machine)")
    print(f"{'':>10} {'all done s':>11} {'mean TTFT s':>12} {'max TTFT s':>11} "
          f"{'cloud prompt positions':>23}")
    for way in ("separate", "shared"):
        result[way] = {key: median(way, key)
                       for key in ("done_s", "ttft_mean_s", "ttft_max_s", "prompt_positions")}
        r = result[way]
        print(f"{way:>10} {r['done_s']:>11.3f} {r['ttft_mean_s']:>12.3f} {r['ttft_max_s']:>11.3f} "
              f"{r['prompt_positions']:>23.0f}")
    result["ratios_separate_over_shared"] = {
        key: result["separate"][key] / result["shared"][key]
        for key in ("done_s", "ttft_mean_s", "ttft_max_s", "prompt_positions")}
    ratios = result["ratios_separate_over_shared"]
    print(f"{'ratio':>10} {ratios['done_s']:>10.2f}x {ratios['ttft_mean_s']:>11.2f}x "
          f"{ratios['ttft_max_s']:>10.2f}x {ratios['prompt_positions']:>22.2f}x")
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    # What the sharing promises, checked so the benchmark cannot pass unnoticed without it:
    # the cloud computed the prompt once and one position a choice.
    want = args.prompt_tokens + args.n
    if result["shared"]["prompt_positions"] != want:
        print(f"FAIL: the shared way's cloud computed {result['shared']['prompt_positions']:.0f} "
              f"prompt positions, want {want}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
