#!/usr/bin/env bash
# Share Memory against its peers in one run, interleaved: `hmc shmem bench` put at 4 MiB beside
# `hmc bench` put on the same transport; fetch-add latency beside a blocking 8-byte put (tcp,
# alternating in one loop; ratio_tcp is amo/p per run);
# barrier latency on 2 and 8 co-located ranks.
# Usage: bench/compare-shmem.sh [repeats] [busy]   (default 3; medians; "busy": a busy loop per core)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/compare-lib.sh "$@"
declare -A v
for i in $(seq "$R"); do
  v[put_tcp]+="$("$tmp/hmc" bench --transport tcp --sizes 4MiB --duration 3s --json | field put '' gbps) "
  out=$("$tmp/hmc" shmem bench --world 2 --ops tcp --sizes 4MiB --json)
  v[shput_tcp]+="$(echo "$out" | field put '' gbps) "
  v[p_tcp]+="$(echo "$out" | field p '' p50_us) "
  v[amo_tcp]+="$(echo "$out" | field amo '' p50_us) "
  v[ratio_tcp]+="$(python3 -c "print($(echo "$out" | field amo '' p50_us) / $(echo "$out" | field p '' p50_us))") "
  v[put_shm]+="$("$tmp/hmc" bench --transport shm --sizes 4MiB --duration 3s --json | field put '' gbps) "
  out=$("$tmp/hmc" shmem bench --world 8 --ops shm,tcp --sizes 4MiB --json)
  v[shput_shm]+="$(echo "$out" | field put '' gbps) "
  v[amo_shm]+="$(echo "$out" | field amo '' p50_us) "
  v[bar2]+="$(echo "$out" | field barrier 2 p50_us) "
  v[bar8]+="$(echo "$out" | field barrier 8 p50_us) "
done
for k in put_tcp shput_tcp p_tcp amo_tcp ratio_tcp put_shm shput_shm amo_shm bar2 bar8; do
  echo "$k median $(echo ${v[$k]} | tr ' ' '\n' | median) range $(echo ${v[$k]} | tr ' ' '\n' | range)"
done
