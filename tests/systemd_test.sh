#!/usr/bin/env bash
# The daemons under systemd's eyes, without systemd: `systemd-analyze verify` accepts the
# shipped units (deploy/*.service, ExecStart pointed at this build) with no warning, and a
# real tophat-cloud and tophat-agent speak the notification protocol the units rely on
# (Type=notify, WatchdogSec=): READY=1 once serving, WATCHDOG=1 while the engine loop turns,
# STOPPING=1 on SIGTERM, then exit 0. tests/systemd_notify.py plays systemd's side.
#   systemd_test.sh BIN_DIR TOY_MODEL WORK_DIR PYTHON
set -euo pipefail
bin_dir="$1"; model="$2"; work="$3"; python="$4"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
rm -rf "$work"; mkdir -p "$work"

command -v systemd-analyze >/dev/null ||
  { echo "FAIL: systemd-analyze is missing; run deploy/install-deps.sh"; exit 1; }
for unit in tophat-cloud tophat-agent; do
  sed "s|/usr/local/bin/$unit|$bin_dir/$unit|" "$root/deploy/$unit.service" >"$work/$unit.service"
  if ! systemd-analyze verify "$work/$unit.service" >"$work/$unit.verify" 2>&1 ||
     [ -s "$work/$unit.verify" ]; then
    echo "FAIL: systemd-analyze verify deploy/$unit.service:"; cat "$work/$unit.verify"; exit 1
  fi
  grep -q '^Type=notify' "$work/$unit.service" || { echo "FAIL: $unit is not Type=notify"; exit 1; }
done
grep -q '^WatchdogSec=' "$work/tophat-cloud.service" ||
  { echo "FAIL: tophat-cloud.service has no WatchdogSec"; exit 1; }
echo "systemd-analyze verify: both units clean"

"$bin_dir/tophat" split --model "$model" --input-layers 2 --output-layers 1 \
  --out "$work/bundles" >/dev/null
exec "$python" "$here/systemd_notify.py" "$bin_dir" "$work"
