#!/usr/bin/env bash
# The Grafana dashboard and the alerting rules against a real Prometheus (Debian's
# `prometheus`) scraping a real tophat-cloud and tophat-agent: promtool accepts the rules and
# the shipped scrape config, and after some requests every query of every panel returns at
# least one series, and every alert expression evaluates. tests/dashboard_test.py does it.
#   dashboard_test.sh BIN_DIR TOY_MODEL WORK_DIR PYTHON
set -euo pipefail
bin_dir="$1"; model="$2"; work="$3"; python="$4"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
rm -rf "$work"; mkdir -p "$work"
for tool in prometheus promtool; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool is missing; run deploy/install-deps.sh"; exit 1; }
done
promtool check rules "$root/deploy/prometheus-alerts.yml"
promtool test rules "$here/prometheus_alerts_test.yml"
promtool check config "$root/deploy/prometheus.yml"
"$bin_dir/tophat" split --model "$model" --input-layers 2 --output-layers 1 \
  --out "$work/bundles" >/dev/null
exec "$python" "$here/dashboard_test.py" "$bin_dir" "$work" "$root"
