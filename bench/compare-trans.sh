#!/usr/bin/env bash
# The transfer engine against its peer in one run, interleaved: `hmc trans bench` batch writes
# (128 x 64 KiB, as transfer_engine_bench's defaults; --threads 2 on this 2-core class of
# machine) over tcp and shm beside `hmc bench --transport tcp|shm` put at 4 MiB (3 s), and beside
# the same bytes per batch as one transfer (the row's own contiguous peer). Two threads of 8 MiB
# batches work on 32 MiB, all of a 32 MiB L3; the 4 MiB put on 8 MiB.
# Usage: bench/compare-trans.sh [repeats] [busy]   (default 3; medians; "busy" adds a busy loop
# per core beside every run)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/compare-lib.sh "$@"
declare -A v
for i in $(seq "$R"); do
  for t in tcp shm; do
    v[put_$t]+="$("$tmp/hmc" bench --transport $t --sizes 4MiB --duration 3s --json | field put '' gbps) "
    out=$("$tmp/hmc" trans bench --protocol $t --threads 2 --duration 2s --json)
    v[batch_$t]+="$(echo "$out" | field write '' gbps) "
    v[contig_$t]+="$(echo "$out" | field write '' contiguous_gbps) "
  done
done
for t in tcp shm; do
  for k in put batch contig; do
    m=$(echo ${v[${k}_$t]} | tr ' ' '\n' | median)
    echo "$t $k GB/s median $m range $(echo ${v[${k}_$t]} | tr ' ' '\n' | range)"
    eval "m_$k=$m"
  done
  python3 -c "print('$t batch/put %.2f  batch/contig %.2f' % ($m_batch/$m_put, $m_batch/$m_contig))"
done
