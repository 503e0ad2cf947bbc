#!/usr/bin/env bash
# Makes a private CA and the certificates of a tophat deployment with openssl:
#
#   bash deploy/make-certs.sh OUT_DIR [DEVICE_NAME]...
#
# OUT_DIR/ca.crt (+ ca.key, keep it offline in production), OUT_DIR/cloud.crt/.key (names
# localhost and 127.0.0.1, plus $TOPHAT_CLOUD_NAMES, e.g. "DNS:cloud.example,IP:10.0.0.1"),
# and OUT_DIR/<device>.crt/.key per device name (its identity: the certificate's DNS name).
# Keeps what exists, so a rerun adds devices without re-issuing the others. Keys are P-256,
# certificates valid for 825 days. For rotation, write the new files elsewhere and move them
# into place: the daemons re-read them within 10 s.
set -euo pipefail
if [ $# -lt 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
  sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
  exit $([ $# -lt 1 ] && echo 2 || echo 0)
fi
out="$1"; shift
command -v openssl >/dev/null || { echo "make-certs.sh: openssl is not installed" >&2; exit 1; }
mkdir -p "$out"
umask 077

if [ ! -f "$out/ca.crt" ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 825 \
    -subj "/CN=tophat CA" -keyout "$out/ca.key" -out "$out/ca.crt" 2>/dev/null
fi

# issue NAME SUBJECT_ALT_NAMES
issue() {
  local name="$1" sans="$2"
  [ -f "$out/$name.crt" ] && return 0
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$name" \
    -keyout "$out/$name.key" -out "$out/$name.csr" 2>/dev/null
  openssl x509 -req -in "$out/$name.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" \
    -CAcreateserial -days 825 -out "$out/$name.crt" \
    -extfile <(printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\n' "$sans") 2>/dev/null
  rm -f "$out/$name.csr"
}

issue cloud "DNS:localhost,IP:127.0.0.1${TOPHAT_CLOUD_NAMES:+,$TOPHAT_CLOUD_NAMES}"
for device in "$@"; do
  case "$device" in
    *[!A-Za-z0-9.-]*|"") echo "make-certs.sh: '$device' is not a DNS-style name" >&2; exit 2 ;;
  esac
  issue "$device" "DNS:$device"
done
chmod 644 "$out"/*.crt
