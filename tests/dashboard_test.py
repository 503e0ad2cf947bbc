"""Every panel of deploy/grafana/tophat-dashboard.json returns series from a real Prometheus.

Usage: python3 dashboard_test.py BIN_DIR WORK_DIR REPO_ROOT (WORK_DIR/bundles from split).
Starts tophat-cloud, tophat-agent (with its drafter: speculative decoding on) and Prometheus
(scraping both every second, with deploy/prometheus-alerts.yml), runs requests with
`tophat bench` once Prometheus has scraped, then queries every panel's expressions and every
alert's. A panel query with no series fails, naming the panel and the query.
"""

import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request

from loopback_daemons import free_port, stop_processes, write_configs


def wait_for(what, condition, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"FAIL: timed out after {seconds} s waiting for {what}")


def query(prometheus, expr):
    url = f"http://127.0.0.1:{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.load(response)
    if body.get("status") != "success":
        raise SystemExit(f"FAIL: Prometheus refused {expr!r}: {body}")
    return body["data"]["result"]


def main():
    bin_dir, work, root = sys.argv[1:4]
    cloud_port, cloud_metrics = free_port(), free_port()
    agent_port, agent_metrics, prometheus_port = free_port(), free_port(), free_port()
    cloud_config, agent_config = write_configs(work, cloud_port, agent_port, max_context=1024,
                                               kv_memory="64MiB", cloud_metrics=cloud_metrics,
                                               agent_metrics=agent_metrics)
    with open(f"{work}/prometheus.yml", "w") as f:
        f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                f"rule_files:\n  - {root}/deploy/prometheus-alerts.yml\n"
                "scrape_configs:\n"
                f"  - job_name: tophat-cloud\n    static_configs:\n"
                f"      - targets: ['127.0.0.1:{cloud_metrics}']\n"
                f"  - job_name: tophat-agent\n    static_configs:\n"
                f"      - targets: ['127.0.0.1:{agent_metrics}']\n")
    processes = []

    def start(args, log):
        processes.append(subprocess.Popen(args, stdout=open(f"{work}/{log}", "w"),
                                          stderr=subprocess.STDOUT))

    try:
        start([f"{bin_dir}/tophat-cloud", "--config", cloud_config], "cloud.log")
        start([f"{bin_dir}/tophat-agent", "--config", agent_config], "agent.log")
        start(["prometheus", f"--config.file={work}/prometheus.yml",
               f"--storage.tsdb.path={work}/tsdb",
               f"--web.listen-address=127.0.0.1:{prometheus_port}"], "prometheus.log")
        wait_for("both targets up",
                 lambda: len([r for r in query(prometheus_port, "up == 1")]) == 2, 120)
        # Requests after the first scrapes, so that rates and quantiles see them change.
        time.sleep(2)
        bench = subprocess.run(
            [f"{bin_dir}/tophat", "bench", "--agents", f"127.0.0.1:{agent_port}",
             "--output-tokens", "32", "--prompt", "the sleepy cat", "--prompt", "the old farmer",
             "--prompt", "a little bird", "--prompt", "the brave knight walked to the river"],
            capture_output=True, text=True, timeout=120)
        if bench.returncode != 0:
            raise SystemExit(f"FAIL: tophat bench exited {bench.returncode}:\n{bench.stdout}\n"
                             f"{bench.stderr}")
        # Two more scrapes of each target after the requests.
        time.sleep(3)

        with open(f"{root}/deploy/grafana/tophat-dashboard.json") as f:
            dashboard = json.load(f)
        missing = []
        checked = 0
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                checked += 1
                if not query(prometheus_port, target["expr"]):
                    missing.append(f"{panel['title']}: {target['expr']}")
        if missing:
            raise SystemExit("FAIL: panel queries with no series:\n  " + "\n  ".join(missing))
        print(f"all {checked} queries of {len(dashboard['panels'])} panels and rows return series")
        # Every alert's expression evaluates (firing or not: a healthy system fires none).
        with open(f"{root}/deploy/prometheus-alerts.yml") as f:
            text = f.read()
        alerts = [line.split("expr:", 1)[1].strip() for line in text.splitlines()
                  if line.strip().startswith("expr:")]
        for expr in alerts:
            query(prometheus_port, expr)
        firing = query(prometheus_port, 'ALERTS{alertstate="firing"}')
        if firing:
            raise SystemExit(f"FAIL: alerts firing on a healthy system: {firing}")
        print(f"all {len(alerts)} alert expressions evaluate; none fires")
    finally:
        stop_processes(processes)
    print("PASS")


if __name__ == "__main__":
    main()
