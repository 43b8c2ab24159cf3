#!/usr/bin/env bash
# Big Memory against its peers in one run, interleaved: `hmc bench --transport tcp|shm` put at
# 4 MiB beside `hmc bm bench` H2G to a remote rank (ops tcp) and to a co-located rank (ops shm),
# and the KV block (61 x 128 KiB + 61 x 16 KiB) as one CopyBatch beside one contiguous copy.
# Usage: bench/compare-bm.sh [repeats] [busy]   (default 3; medians; "busy" adds a busy loop
# per core beside every run, as when users share the cores)
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
gbps() { python3 -c "
import json,sys
for l in sys.stdin:
    r=json.loads(l)
    if r['op']=='$1': print(r['gbps'])"; }
echo "# $(date -u +%FT%TZ) $(nproc) cores, $(git rev-parse --short HEAD 2>/dev/null || echo nogit) ${2:-}"
declare -A v
for i in $(seq "$R"); do
  for t in tcp shm; do
    v[put_$t]+="$("$tmp/hmc" bench --transport $t --sizes 4MiB --json | gbps put) "
    out=$("$tmp/hmc" bm bench --world 2 --ops $t --sizes 4MiB --types h2rh,batch --json)
    v[h2g_$t]+="$(echo "$out" | gbps h2rh) "
    v[batch_$t]+="$(echo "$out" | gbps batch) "
    v[contig_$t]+="$(echo "$out" | gbps contig) "
  done
done
for t in tcp shm; do
  for k in put h2g batch contig; do
    m=$(echo ${v[${k}_$t]} | tr ' ' '\n' | median)
    echo "$t $k 4MiB GB/s median $m range $(echo ${v[${k}_$t]} | tr ' ' '\n' | range)"
    eval "m_$k=$m"
  done
  python3 -c "print('$t H2G/put %.2f  batch/contig %.2f' % ($m_h2g/$m_put, $m_batch/$m_contig))"
done
