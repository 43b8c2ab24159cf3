#!/usr/bin/env bash
# Python's batch call against the Go engine's, same target, same run, interleaved (issue 34,
# item 3: <= 10 % over Go for 1,024-entry batches): `batch_transfer_sync_write` of 1,024
# non-adjacent 4 KiB blocks from Python (lists, NumPy arrays, and hmc_trans_transfer of the
# arrays through ctypes), from C (bench/peers/trans_batch.c against libhmc.so) and `hmc trans bench
# --batch-size 1024 --block-size 4KiB --pattern scattered` from Go, both to one `hmc trans bench
# --mode target` over shared memory; median batch time of each run, medians of the runs.
# Usage: bench/compare-pybatch.sh [repeats] [busy]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/compare-lib.sh "$@"
go build -buildmode=c-shared -o python/hmc/libhmc.so ./capi
cc -O2 -o "$tmp/trans_batch" bench/peers/trans_batch.c -I capi/include -L python/hmc -lhmc -Wl,-rpath,"$PWD/python/hmc"
"$tmp/hmc" trans bench --mode target --buffer-size 64MiB --protocol shm,tcp >"$tmp/target" 2>&1 &
tpid=$!
trap 'kill $tpid 2>/dev/null; rm -rf "$tmp"; [ -n "${busy:-}" ] && kill $busy 2>/dev/null || true' EXIT
for _ in $(seq 100); do grep -q READY "$tmp/target" && break; sleep 0.1; done
id=$(awk '/READY/ {print $2}' "$tmp/target")
declare -A v
for i in $(seq "$R"); do
  v[go]+="$("$tmp/hmc" trans bench --mode initiator --segment-id "$id" --protocol shm --batch-size 1024 --block-size 4KiB \
    --duration 2s --contiguous-peer=false --buffer-size 64MiB --json | field write '' p50_us) "
  for k in list numpy ctypes; do
    v[py_$k]+="$(PYTHONPATH=python /usr/bin/python3 bench/pybatch.py "$id" 1024 4096 2 $k) "
  done
  v[py_c]+="$("$tmp/trans_batch" "$id" 1024 4096 2) "
done
g=$(echo ${v[go]} | tr ' ' '\n' | median)
echo "go batch µs median $g range $(echo ${v[go]} | tr ' ' '\n' | range)"
for k in list numpy ctypes c; do
  m=$(echo ${v[py_$k]} | tr ' ' '\n' | median)
  echo "$([ $k = c ] && echo C || echo "python ($k)") batch µs median $m range $(echo ${v[py_$k]} | tr ' ' '\n' | range); /go $(python3 -c "print('%.2f' % ($m/$g))")"
done
