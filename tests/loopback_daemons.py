"""What the Python process tests share to run tophat-cloud and tophat-agent on loopback:
a free port, the two daemons' configs over the bundles `tophat split` wrote to WORK/bundles
(plaintext links; metrics off unless a port is given), both daemons serving a checkpoint
with the agent's OpenAI endpoint (serving), a drafter distilled between the split and the
start (distill_after_split), and the main() of a model family's end-to-end test
(family_test_main)."""

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

# Held for the life of this process: see free_port.
_claims = []


def free_port():
    """A port on 127.0.0.1 that is free and that no other tophat process hands out while this
    one lives: the same scheme as bench::FreePort (bench/process_control.cc), whose claims
    these share. Below the kernel's ephemeral range (where bind(0) and outgoing connections
    take theirs), each port claimed with an abstract Unix socket named after it."""
    first, last = 20000, 32767
    start = random.randint(first, last)
    for i in range(last - first + 1):
        port = first + (start - first + i) % (last - first + 1)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            claim.bind(f"\0tophat-port-{port}")
        except OSError:
            claim.close()
            continue
        _claims.append(claim)
        return port
    raise RuntimeError(f"no free port in {first}-{last}")


def write_configs(work, cloud_port, agent_port, max_context, kv_memory,
                  cloud_metrics=None, agent_metrics=None):
    """Writes WORK/cloud.yaml and WORK/agent.yaml; returns their paths."""
    def metrics(port):
        return '""' if port is None else f'"127.0.0.1:{port}"'
    cloud, agent = f"{work}/cloud.yaml", f"{work}/agent.yaml"
    with open(cloud, "w") as f:
        f.write(f'listen_address: "127.0.0.1:{cloud_port}"\nbundle: {work}/bundles/cloud\n'
                f'tls:\n  insecure: true\nmax_context: {max_context}\n'
                f'kv_cache:\n  memory_bytes: {kv_memory}\n'
                f'metrics_address: {metrics(cloud_metrics)}\n')
    with open(agent, "w") as f:
        f.write(f'listen_address: "127.0.0.1:{agent_port}"\n'
                f'cloud_address: "127.0.0.1:{cloud_port}"\nbundle: {work}/bundles/device\n'
                f'cloud_tls:\n  insecure: true\nmax_context: {max_context}\n'
                f'metrics_address: {metrics(agent_metrics)}\n')
    return cloud, agent


def stop_processes(processes, seconds=30):
    """SIGTERM to each of `processes` (subprocess.Popen), the last started first, then waits
    for each, killing one that has not stopped after `seconds`."""
    for process in reversed(processes):
        process.send_signal(signal.SIGTERM)
    for process in reversed(processes):
        try:
            process.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            process.kill()


@contextlib.contextmanager
def serving(bin_dir, work, model_dir, openai_settings="", after_split=None, agent_settings="",
            agent_metrics=None, cloud_metrics=None, kv_memory="32MiB"):
    """tophat split of `model_dir`, then tophat-cloud and tophat-agent on loopback, logs and
    bundles under `work`; yields the agent's OpenAI endpoint once it answers. The agent's
    openai section ends with `openai_settings` (YAML lines indented by two), and its config
    with `agent_settings` (top-level YAML); `after_split(bundles_dir)` runs before the daemons
    start (a distilled adapter into bundles_dir/device, say); `agent_metrics` and
    `cloud_metrics`: ports for the daemons' metrics; `kv_memory`: the cloud's KV pool."""
    os.makedirs(work)
    subprocess.run([f"{bin_dir}/tophat", "split", "--model", model_dir, "--input-layers", "1",
                    "--output-layers", "1", "--out", f"{work}/bundles"], check=True,
                   stdout=subprocess.DEVNULL)
    if after_split is not None:
        after_split(f"{work}/bundles")
    cloud_port, agent_port, openai_port = free_port(), free_port(), free_port()
    cloud_config, agent_config = write_configs(work, cloud_port, agent_port, max_context=1024,
                                               kv_memory=kv_memory, cloud_metrics=cloud_metrics,
                                               agent_metrics=agent_metrics)
    with open(agent_config, "a") as f:
        f.write(agent_settings)
        f.write(f'openai:\n  address: "127.0.0.1:{openai_port}"\n{openai_settings}')
    processes = []
    try:
        for name, config in (("cloud", cloud_config), ("agent", agent_config)):
            processes.append(subprocess.Popen(
                [f"{bin_dir}/tophat-{name}", "--config", config],
                stdout=open(f"{work}/{name}.log", "w"), stderr=subprocess.STDOUT))
        base = f"http://127.0.0.1:{openai_port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"FAIL: the agent's endpoint did not answer; see {work}")
            time.sleep(0.2)
        yield base
    finally:
        stop_processes(processes)


@contextlib.contextmanager
def speculative_serving(bin_dir, work, model_dir, corpus, metrics_port):
    """serving under `work`/serving with a drafter distilled on `corpus`'s words
    (distill_after_split), decoding speculatively (eta 0.01, two runs ahead), the agent's
    metrics on `metrics_port`. Yields the agent's base URL."""
    serving_dir = os.path.join(work, "serving")
    with serving(bin_dir, serving_dir, model_dir,
                 after_split=distill_after_split(bin_dir, model_dir, serving_dir, corpus),
                 agent_settings="speculative:\n  eta: 0.01\n  max_runs_in_flight: 2\n",
                 agent_metrics=metrics_port) as base:
        yield base


def distill_after_split(bin_dir, model_dir, work, corpus):
    """For serving's after_split: an adapter for the m = 1 split, distilled (30 steps) on
    text of `corpus`'s words into the device bundle under `work`/bundles (its manifest then
    names it)."""
    words = " ".join(corpus).replace(",", "").replace(".", "").replace("?", "").split()
    rng = random.Random(3)
    data = os.path.join(os.path.dirname(work), "distill.txt")
    with open(data, "w") as f:
        for _ in range(200):
            f.write(" ".join(rng.choice(words) for _ in range(40)) + "\n")

    def run(bundles):
        subprocess.run([f"{bin_dir}/tophat", "distill", "--model", model_dir, "--data", data,
                        "--out", f"{bundles}/device", "-m", "1", "--steps", "30",
                        "--batch-size", "8", "--sequence-length", "32"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return run


def family_test_main(test, families, build_model, run_checks, corpus):
    """main() of `test`, an end-to-end test of one of `families` (argv: BIN_DIR WORK_DIR
    [FAMILY], the first family by default): a fresh WORK_DIR, build_model(model_dir, family)
    -> (reference model, transformers tokenizer), speculative_serving over it with a drafter
    distilled on `corpus`, then run_checks(base, model, tokenizer, metrics_port, family)."""
    bin_dir, work = sys.argv[1:3]
    family = sys.argv[3] if len(sys.argv) > 3 else families[0]
    if family not in families:
        sys.exit(f"{test}: unknown family {family!r} ({' or '.join(families)})")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    model_dir = os.path.join(work, family)
    model, hf_tokenizer = build_model(model_dir, family)
    metrics_port = free_port()
    with speculative_serving(bin_dir, work, model_dir, corpus, metrics_port) as base:
        run_checks(base, model, hf_tokenizer, metrics_port, family)
