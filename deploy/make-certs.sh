#!/usr/bin/env bash
# Makes a private CA and the certificates of a tophat deployment with openssl:
#
#   bash deploy/make-certs.sh OUT_DIR [DEVICE_NAME]...
#   bash deploy/make-certs.sh --revoke OUT_DIR DEVICE_NAME...
#   bash deploy/make-certs.sh --crl OUT_DIR
#
# OUT_DIR/ca.crt (+ ca.key, keep it offline in production), OUT_DIR/cloud.crt/.key (names
# localhost and 127.0.0.1, plus $TOPHAT_CLOUD_NAMES, e.g. "DNS:cloud.example,IP:10.0.0.1"),
# and OUT_DIR/<device>.crt/.key per device name (its identity: the certificate's DNS name).
# Keeps what exists, so a rerun adds devices without re-issuing the others. Keys are P-256,
# certificates valid for 825 days. For rotation, write the new files elsewhere and move them
# into place: the daemons re-read them within 10 s.
# --revoke adds the devices' certificates to the CA's revocation list, moves them to
# OUT_DIR/revoked/ (their keys are deleted; a rerun may issue the name again), and writes
# OUT_DIR/crl.pem; --crl writes it anew with what is revoked so far (a CRL is due for renewal
# after $TOPHAT_CRL_DAYS, default 30, days). Point the cloud's tls.crl_file at crl.pem and
# `systemctl reload tophat-cloud`.
set -euo pipefail
if [ $# -lt 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
  sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
  exit $([ $# -lt 1 ] && echo 2 || echo 0)
fi
mode=issue
case "$1" in
  --revoke) mode=revoke; shift ;;
  --crl) mode=crl; shift ;;
  -*) echo "make-certs.sh: unknown option '$1' (--help)" >&2; exit 2 ;;
esac
[ $# -ge 1 ] || { echo "make-certs.sh: OUT_DIR is missing (--help)" >&2; exit 2; }
out="$1"; shift
command -v openssl >/dev/null || { echo "make-certs.sh: openssl is not installed" >&2; exit 1; }

# The CA's revocation list: `openssl ca` keeps what it revoked in OUT_DIR/ca-db.
if [ "$mode" != issue ]; then
  [ -f "$out/ca.crt" ] && [ -f "$out/ca.key" ] || {
    echo "make-certs.sh: $out has no ca.crt and ca.key to sign a CRL with" >&2; exit 1; }
  [ "$mode" = crl ] || [ $# -ge 1 ] || {
    echo "make-certs.sh: --revoke needs the names of the devices to revoke" >&2; exit 2; }
  days="${TOPHAT_CRL_DAYS:-30}"
  case "$days" in *[!0-9]*|""|0) echo "make-certs.sh: TOPHAT_CRL_DAYS='$days' is not a positive number of days" >&2; exit 2 ;; esac
  umask 077
  mkdir -p "$out/ca-db"
  [ -f "$out/ca-db/index.txt" ] || : > "$out/ca-db/index.txt"
  [ -f "$out/ca-db/crlnumber" ] || echo 01 > "$out/ca-db/crlnumber"
  config="$out/ca-db/openssl.cnf"
  printf '[ca]\ndefault_ca = tophat\n[tophat]\ndatabase = %s\ncrlnumber = %s\ncertificate = %s\nprivate_key = %s\ndefault_md = sha256\ndefault_crl_days = %s\n' \
    "$out/ca-db/index.txt" "$out/ca-db/crlnumber" "$out/ca.crt" "$out/ca.key" "$days" > "$config"
  for device in "$@"; do
    [ -f "$out/$device.crt" ] || { echo "make-certs.sh: $out/$device.crt does not exist: nothing to revoke" >&2; exit 1; }
    serial=$(openssl x509 -in "$out/$device.crt" -noout -serial | cut -d= -f2)
    openssl ca -config "$config" -revoke "$out/$device.crt" 2>/dev/null || {
      echo "make-certs.sh: openssl could not revoke $out/$device.crt" >&2; exit 1; }
    mkdir -p "$out/revoked"
    mv "$out/$device.crt" "$out/revoked/$device-$serial.crt"
    rm -f "$out/$device.key"
    echo "revoked $device (serial $serial)"
  done
  openssl ca -config "$config" -gencrl -out "$out/crl.pem.new" 2>/dev/null || {
    echo "make-certs.sh: openssl could not write the CRL" >&2; exit 1; }
  chmod 644 "$out/crl.pem.new"
  mv "$out/crl.pem.new" "$out/crl.pem"  # whole or not at all: a reload may read it any time
  echo "wrote $out/crl.pem ($(grep -c '^R' "$out/ca-db/index.txt" || true) revoked in all, due for renewal in $days days)"
  exit 0
fi

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
