#!/usr/bin/env bash
# Big Memory against its peers in one run, interleaved: `hmc bench --transport tcp|shm` put at
# 4 MiB beside `hmc bm bench` H2G to a remote rank (ops tcp) and to a co-located rank (ops shm),
# and the KV block (61 x 128 KiB + 61 x 16 KiB) as one CopyBatch beside one contiguous copy, 2000
# timed copies each over tcp, 20000 over shm (the default, about 256 MiB, is 29 KV blocks: 5 ms,
# first-touch noise).
# Usage: bench/compare-bm.sh [repeats] [busy]   (default 3; medians; "busy" adds a busy loop
# per core beside every run, as when users share the cores)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/compare-lib.sh "$@"
declare -A v
# Timed copies per type: about a second each or more (shared memory moves 4 MiB in ~40 µs: 2000
# copies would time 80 ms, short of steady); the put peer runs 3 s.
declare -A iters=([tcp]=2000 [shm]=20000)
for i in $(seq "$R"); do
  for t in tcp shm; do
    v[put_$t]+="$("$tmp/hmc" bench --transport $t --sizes 4MiB --duration 3s --json | field put '' gbps) "
    out=$("$tmp/hmc" bm bench --world 2 --ops $t --sizes 4MiB --types h2rh,batch --iters "${iters[$t]}" --json)
    v[h2g_$t]+="$(echo "$out" | field h2rh '' gbps) "
    v[batch_$t]+="$(echo "$out" | field batch '' gbps) "
    v[contig_$t]+="$(echo "$out" | field contig '' gbps) "
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
