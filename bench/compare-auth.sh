#!/usr/bin/env bash
# What authentication costs (#21 item 4), in one run, rounds interleaved, medians (range):
# `hmc bench` between two processes with no authentication, a shared secret (--secret-file) and
# a secret inside mutual TLS (--tls-*) — TCP put 4 MiB (GB/s), TCP ping-pong 8 B (p50 µs, half
# round trip) and shm put 4 MiB (the secret only: shm has no TLS) — and the connect of one lane
# (BenchmarkDial, in-process).
# Usage: bench/compare-auth.sh [repeats] [busy]   (default 3)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/compare-lib.sh
printf 'a shared secret\n' >"$tmp/secret"
# A throw-away CA and one peer certificate for 127.0.0.1 (both processes use it).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=ca \
  -keyout "$tmp/ca.key" -out "$tmp/ca.crt" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=rank \
  -keyout "$tmp/peer.key" -out "$tmp/peer.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' >"$tmp/ext"
openssl x509 -req -in "$tmp/peer.csr" -CA "$tmp/ca.crt" -CAkey "$tmp/ca.key" -CAcreateserial -days 1 \
  -extfile "$tmp/ext" -out "$tmp/peer.crt" 2>/dev/null
declare -A flags=([none]="" [secret]="--secret-file $tmp/secret"
  [tls]="--secret-file $tmp/secret --tls-cert $tmp/peer.crt --tls-key $tmp/peer.key --tls-ca $tmp/ca.crt")
declare -A v
for _ in $(seq "$R"); do
  for a in none secret tls; do
    # shellcheck disable=SC2086
    v[put$a]+="$("$tmp/hmc" bench --transport tcp --sizes 4MiB --duration 3s --json --quiet ${flags[$a]} 2>/dev/null | field put '' gbps) "
    # shellcheck disable=SC2086
    v[pp$a]+="$("$tmp/hmc" bench --transport tcp --op pingpong --duration 2s --json --quiet ${flags[$a]} 2>/dev/null | field pingpong '' p50_us) "
    if [ $a != tls ]; then
      # shellcheck disable=SC2086
      v[shm$a]+="$("$tmp/hmc" bench --transport shm --sizes 4MiB --duration 2s --json --quiet ${flags[$a]} 2>/dev/null | field put '' gbps) "
    fi
  done
done
r2() { awk -F- '{ if (NF == 2) printf "%.2f-%.2f", $1, $2; else printf "%.2f", $1 }'; }
cell() { local s=${v[$1]}; echo "$(tr ' ' '\n' <<<"$s" | grep . | median | r2) ($(tr ' ' '\n' <<<"$s" | grep . | range | r2))"; }
ratio() { python3 -c "print(f'{$(tr ' ' '\n' <<<"${v[$1]}" | grep . | median)/$(tr ' ' '\n' <<<"${v[$2]}" | grep . | median):.2f}')"; }
echo "| row | none | secret | secret + mutual TLS | secret / none | TLS / none |"
echo "|---|---|---|---|---|---|"
echo "| tcp put 4 MiB GB/s | $(cell putnone) | $(cell putsecret) | $(cell puttls) | $(ratio putsecret putnone) | $(ratio puttls putnone) |"
echo "| tcp ping-pong 8 B p50 µs | $(cell ppnone) | $(cell ppsecret) | $(cell pptls) | $(ratio ppsecret ppnone) | $(ratio pptls ppnone) |"
echo "| shm put 4 MiB GB/s | $(cell shmnone) | $(cell shmsecret) | – | $(ratio shmsecret shmnone) | – |"
echo
echo "Connect of one tcp lane and close (BenchmarkDial, 300 each):"
go test -run '^$' -bench BenchmarkDial -benchtime 300x ./transport/tcp/ | grep '^BenchmarkDial' | awk '{printf "- %s: %.0f µs\n", $1, $3/1000}'
