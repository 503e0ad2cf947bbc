#!/usr/bin/env bash
# Emulated edge links for benchmarks: each device gets its own network namespace joined to
# the host (where tophat-cloud runs) by a veth pair, with tc shaping each direction.
#
#   edge-links.sh check                 can namespaces and tc be used here? (exit 0: yes)
#   edge-links.sh up N                  namespaces tophat-dev0..N-1, veth th-c<i> <-> th-d<i>,
#                                       host side 10.77.<i>.1/30, device side 10.77.<i>.2/30
#   edge-links.sh shape I UP DOWN [DELAY_MS]
#                                       device I: UP and DOWN bytes/s (tbf), one-way delay
#                                       (netem, where the kernel has it); prints
#                                       "delay: kernel" or "delay: none"
#   edge-links.sh stats I               device I's qdisc counters both ways (sent, dropped,
#                                       overlimits, backlog), its TCP retransmission and
#                                       timeout counters, and its link's state
#   edge-links.sh down                  removes every namespace and link this script made
#
# Uplink (device -> cloud) is shaped on the device end's egress, downlink on the host end's.
# Needs root (CAP_NET_ADMIN). The script only ever touches names it creates (tophat-dev<i>,
# th-c<i>, th-d<i>) and addresses in 10.77.<i>.0/30 for i < 64, and refuses anything else.
set -euo pipefail

readonly max_devices=64

die() {
  echo "edge-links: $*" >&2
  exit 1
}

check_index() {
  [[ "$1" =~ ^[0-9]+$ ]] && (($1 < max_devices)) ||
    die "device index '$1' is not an integer in [0, $max_devices)"
}

check_rate() {
  [[ "$1" =~ ^[0-9]+$ ]] && (($1 >= 1000)) ||
    die "$2 '$1' is not a whole number of bytes/s >= 1000"
}

namespace() { echo "tophat-dev$1"; }

# The kernel's tbf needs a bucket of at least one MTU and about rate/HZ bytes. A bigger
# bucket lets a message that follows a quiet spell cross at the veth's speed, which the
# agents would measure as a faster link than it is.
tbf_args() {
  local rate=$1
  local burst=$((rate / 100))
  ((burst < 3200)) && burst=3200
  echo "rate ${rate}bps burst ${burst} latency 2s"
}

cmd_check() {
  command -v ip >/dev/null || die "iproute2 (ip) is not installed"
  command -v tc >/dev/null || die "tc is not installed"
  local probe="tophat-probe$$"
  ip netns add "$probe" 2>/dev/null || die "cannot create network namespaces (need root)"
  local ok=1
  if ip link add th-probe$$ type veth peer name th-probeb$$ 2>/dev/null; then
    tc qdisc add dev th-probe$$ root tbf $(tbf_args 100000) 2>/dev/null || ok=0
    ip link del th-probe$$ 2>/dev/null || true
  else
    ok=0
  fi
  ip netns del "$probe"
  ((ok)) || die "cannot create veth pairs with a tbf qdisc"
  if tc qdisc add dev lo root netem delay 1ms 2>/dev/null; then
    tc qdisc del dev lo root
    echo "namespaces: yes; bandwidth: tbf; delay: kernel (netem)"
  else
    echo "namespaces: yes; bandwidth: tbf; delay: none (no netem in this kernel)"
  fi
}

cmd_up() {
  local n=$1
  [[ "$n" =~ ^[0-9]+$ ]] && ((n >= 1 && n <= max_devices)) ||
    die "device count '$n' is not an integer in [1, $max_devices]"
  for ((i = 0; i < n; i++)); do
    local ns
    ns=$(namespace "$i")
    ip netns list | grep -qw "$ns" && die "$ns already exists; run 'edge-links.sh down' first"
    ip netns add "$ns"
    ip link add "th-c$i" type veth peer name "th-d$i"
    ip link set "th-d$i" netns "$ns"
    ip addr add "10.77.$i.1/30" dev "th-c$i"
    ip link set "th-c$i" up
    ip -n "$ns" addr add "10.77.$i.2/30" dev "th-d$i"
    ip -n "$ns" link set "th-d$i" up
    ip -n "$ns" link set lo up
    # One TCP segment per packet. tbf sends nothing larger than its bucket, and a packet
    # queued while the bucket was large stays at the head for good once a `shape` shrinks
    # the bucket below it: with GSO packets of up to 64 KB, a rate change wedged a link
    # (TCP timeouts with no drop counted; ARP stuck behind it too) until a later change grew
    # the bucket again. Segments always fit the smallest bucket (3,200 bytes).
    ip link set dev "th-c$i" gso_max_segs 1
    ip -n "$ns" link set dev "th-d$i" gso_max_segs 1
  done
  echo "up: $n device namespace(s)"
}

cmd_shape() {
  local i=$1 up=$2 down=$3 delay_ms=${4:-0}
  check_index "$i"
  check_rate "$up" "uplink"
  check_rate "$down" "downlink"
  [[ "$delay_ms" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "delay '$delay_ms' is not a number of ms"
  local ns
  ns=$(namespace "$i")
  ip netns list | grep -qw "$ns" || die "$ns does not exist; run 'edge-links.sh up' first"
  local delay="none"
  # netem carries both delay and rate where it exists; tbf alone shapes the rate.
  if [[ "$delay_ms" != "0" ]] &&
    tc qdisc replace dev "th-c$i" root netem delay "${delay_ms}ms" rate "${down}bps" \
      2>/dev/null; then
    ip netns exec "$ns" tc qdisc replace dev "th-d$i" root netem delay "${delay_ms}ms" \
      rate "${up}bps"
    delay="kernel"
  else
    # `change` keeps the packets queued in a tbf that is already there: `replace` would drop
    # them, and TCP's retransmission timeouts would stall the link for seconds.
    local verb=replace
    tc qdisc show dev "th-c$i" | grep -q "^qdisc tbf" && verb=change
    # shellcheck disable=SC2046
    tc qdisc "$verb" dev "th-c$i" root tbf $(tbf_args "$down")
    # shellcheck disable=SC2046
    ip netns exec "$ns" tc qdisc "$verb" dev "th-d$i" root tbf $(tbf_args "$up")
  fi
  echo "delay: $delay"
}

cmd_stats() {
  local i=$1
  check_index "$i"
  local ns
  ns=$(namespace "$i")
  ip netns list | grep -qw "$ns" || die "$ns does not exist"
  echo "# th-c$i (host end: the downlink)"
  tc -s qdisc show dev "th-c$i"
  echo "# th-d$i (device end: the uplink)"
  ip netns exec "$ns" tc -s qdisc show dev "th-d$i"
  echo "# $ns TCP (since the namespace was made)"
  ip netns exec "$ns" nstat -asz TcpRetransSegs TcpExtTCPTimeouts TcpExtTCPLossProbes \
    TcpExtTCPSpuriousRTOs 2>/dev/null || echo "nstat: not available"
  echo "# th-d$i link"
  ip -n "$ns" -s link show "th-d$i"
}

cmd_down() {
  local removed=0
  for ns in $(ip netns list | awk '{print $1}' | grep -E '^tophat-dev[0-9]+$' || true); do
    ip netns del "$ns"
    removed=$((removed + 1))
  done
  # The host ends disappear with their peers; remove any left by a half-made setup.
  for link in $(ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 |
    grep -E '^th-c[0-9]+$' || true); do
    ip link del "$link" 2>/dev/null || true
  done
  echo "down: removed $removed namespace(s)"
}

case "${1:-}" in
  check) cmd_check ;;
  up) (($# == 2)) || die "usage: edge-links.sh up N"; cmd_up "$2" ;;
  shape) (($# == 4 || $# == 5)) || die "usage: edge-links.sh shape I UP DOWN [DELAY_MS]"
    cmd_shape "$2" "$3" "$4" "${5:-0}" ;;
  stats) (($# == 2)) || die "usage: edge-links.sh stats I"; cmd_stats "$2" ;;
  down) cmd_down ;;
  -h | --help | help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' ;;
  *) die "unknown command '${1:-}'; see edge-links.sh --help" ;;
esac
