"""What the Python tests that build a small model with its own tokenizer share: checks that
print and count their failures, a byte-level BPE tokenizer trained on a few sentences, and a
JSON POST to the agent's endpoint."""

import json
import urllib.request

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

failures = []


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
