#!/usr/bin/env bash
# Share Memory against its peers in one run, interleaved: `hmc shmem bench` put at 4 MiB beside
# `hmc bench` put on the same transport; fetch-add latency beside a blocking 8-byte put (tcp,
# alternating in one loop; ratio_tcp is amo/p per run);
# barrier latency on 2 and 8 co-located ranks.
# Usage: bench/compare-shmem.sh [repeats] [busy]   (default 3; medians; "busy": a busy loop per core)
set -euo pipefail
cd "$(dirname "$0")/.."
R=${1:-3}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"; [ -n "${busy:-}" ] && kill $busy 2>/dev/null || true' EXIT
go build -o "$tmp/hmc" ./cmd/hmc
if [ "${2:-}" = busy ]; then
  busy=""
  for _ in $(seq "$(nproc)"); do (while :; do :; done) & busy="$busy $!"; done
fi
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
range() { sort -g | awk 'NR==1{lo=$1} {hi=$1} END {print lo "-" hi}'; }
field() { python3 -c "
import json,sys
for l in sys.stdin:
    r=json.loads(l)
    if r['op']=='$1' and ('$2'=='' or str(r['size'])=='$2'): print(r['$3'])"; }
echo "# $(date -u +%FT%TZ) $(nproc) cores, $(git rev-parse --short HEAD 2>/dev/null || echo nogit) ${2:-}"
declare -A v
for i in $(seq "$R"); do
  v[put_tcp]+="$("$tmp/hmc" bench --transport tcp --sizes 4MiB --json | field put '' gbps) "
  out=$("$tmp/hmc" shmem bench --world 2 --ops tcp --sizes 4MiB --json)
  v[shput_tcp]+="$(echo "$out" | field put '' gbps) "
  v[p_tcp]+="$(echo "$out" | field p '' p50_us) "
  v[amo_tcp]+="$(echo "$out" | field amo '' p50_us) "
  v[ratio_tcp]+="$(python3 -c "print($(echo "$out" | field amo '' p50_us) / $(echo "$out" | field p '' p50_us))") "
  v[put_shm]+="$("$tmp/hmc" bench --transport shm --sizes 4MiB --json | field put '' gbps) "
  out=$("$tmp/hmc" shmem bench --world 8 --ops shm,tcp --sizes 4MiB --json)
  v[shput_shm]+="$(echo "$out" | field put '' gbps) "
  v[amo_shm]+="$(echo "$out" | field amo '' p50_us) "
  v[bar2]+="$(echo "$out" | field barrier 2 p50_us) "
  v[bar8]+="$(echo "$out" | field barrier 8 p50_us) "
done
for k in put_tcp shput_tcp p_tcp amo_tcp ratio_tcp put_shm shput_shm amo_shm bar2 bar8; do
  echo "$k median $(echo ${v[$k]} | tr ' ' '\n' | median) range $(echo ${v[$k]} | tr ' ' '\n' | range)"
done
