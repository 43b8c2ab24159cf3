#!/usr/bin/env bash
# The KV-cache pool across two network namespaces ("two hosts" as far as the network goes, over
# a veth pair; issue 35): `hmc kv bench --external-lender` runs the master and a client here, a
# lending client runs in a fresh namespace, and every object moves over TCP. Each row is beside
# the transfer engine's write and read of the same replicas in the same run. Needs root and
# iproute2. Medians of R rounds.
# Usage: bench/compare-kv-netns.sh [repeats] [busy]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/compare-lib.sh "$@"
ns=hmckv$$ a=hkva$$ b=hkvb$$ net=10.$((200 + RANDOM % 50)).$((RANDOM % 250)).
cleanup() {
  ip netns pids "$ns" 2>/dev/null | xargs -r kill 2>/dev/null || true
  ip netns del "$ns" 2>/dev/null || true
  ip link del "$a" 2>/dev/null || true
  rm -rf "$tmp"
  [ -n "${busy:-}" ] && kill $busy 2>/dev/null || true
}
trap cleanup EXIT
ip netns add "$ns"
ip link add "$a" type veth peer name "$b"
ip link set "$b" netns "$ns"
ip addr add "${net}1/24" dev "$a" && ip link set "$a" up
ip netns exec "$ns" ip addr add "${net}2/24" dev "$b"
ip netns exec "$ns" ip link set "$b" up
ip netns exec "$ns" ip link set lo up
declare -A v
for i in $(seq "$R"); do
  out="$tmp/bench.$i"
  "$tmp/hmc" kv bench --external-lender --local-hostname "${net}1" --sizes 64KiB,4MiB --batch 64 --duration 2s >"$out" 2>&1 &
  bpid=$!
  for _ in $(seq 100); do grep -q '^MASTER' "$out" && break; sleep 0.1; done
  master=$(awk '/^MASTER/ {print $2}' "$out")
  ip netns exec "$ns" "$tmp/hmc" kv lend --master "$master" --local-hostname "${net}2" --segment-size 1GiB >/dev/null 2>&1 &
  lpid=$!
  wait $bpid
  kill $lpid 2>/dev/null || true
  wait $lpid 2>/dev/null || true
  # rows: "size put write put/write get read get/read" and "batch size put write ..."
  while read -r f1 f2 rest; do
    case "$f1" in
      64KiB|4MiB) set -- $f2 $rest; v[put_$f1]+="$1 "; v[pw_$f1]+="$3 "; v[get_$f1]+="$4 "; v[gr_$f1]+="$6 " ;;
      64) set -- $rest; v[bput_$f2]+="$1 "; v[bpw_$f2]+="$3 "; v[bget_$f2]+="$4 "; v[bgr_$f2]+="$6 " ;;
    esac
  done <"$out"
done
med() { echo ${v[$1]} | tr ' ' '\n' | grep . | median; }
echo "| across namespaces (tcp) | put GB/s | put / engine write | get GB/s | get / engine read |"
echo "|---|---|---|---|---|"
for s in 64KiB 4MiB; do
  echo "| one $s object | $(med put_$s) | **$(med pw_$s)** | $(med get_$s) | **$(med gr_$s)** |"
done
for s in 64KiB 4MiB; do
  echo "| 64 × $s per call | $(med bput_$s) | $(med bpw_$s) | $(med bget_$s) | $(med bgr_$s) |"
done
