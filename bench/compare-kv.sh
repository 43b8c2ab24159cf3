#!/usr/bin/env bash
# KV-shaped transfers against their peers in one run, interleaved (issue 34): one-thread batches
# of 512 non-adjacent blocks (`hmc trans bench --pattern scattered`) of 4, 16 and 64 KiB over tcp
# beside `hmc bench --transport tcp` put at 4 MiB, and the same batches over shm beside one
# contiguous transfer of the same bytes (the row's own --contiguous-peer), plus the KV layout
# (61 layers x K and V blocks of 16 and 128 KiB) on both. Medians of R rounds. Each tcp row also
# gives its ratio to a put of the batch's own total (2, 8 and 32 MiB): the 4 MiB put's source and
# destination stay in a 32 MiB L3, a 32 MiB batch's do not. Where UCX is installed, the same
# scattered batches over UCX's tcp transport (-tags ucx) against their own contiguous transfer,
# as PUTV / GETV active messages (the default there) and as one put or get per piece
# (HMC_UCX_PIECEWISE=1), writes and reads.
# Usage: bench/compare-kv.sh [repeats] [busy]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/compare-lib.sh "$@"
ucx=false
if pkg-config --exists ucx 2>/dev/null; then go build -tags ucx -o "$tmp/hmcucx" ./cmd/hmc && ucx=true; fi
declare -A v
for i in $(seq "$R"); do
  v[put]+="$("$tmp/hmc" bench --transport tcp --op put --sizes 4MiB --warmup 50 --duration 3s --json | field put '' gbps) "
  out=$("$tmp/hmc" bench --transport tcp --op put --sizes 2MiB,8MiB,32MiB --warmup 50 --duration 2s --json)
  for s in 4096 16384 65536; do
    v[same_$s]+="$(echo "$out" | field put $((512 * s)) gbps) "
  done
  for t in tcp shm; do
    out=$("$tmp/hmc" trans bench --protocol $t --threads 1 --batch-size 512 --block-size 4KiB,16KiB,64KiB --duration 2s --json)
    for s in 4096 16384 65536; do
      v[sc_${t}_$s]+="$(echo "$out" | field write $s gbps) "
      v[scr_${t}_$s]+="$(echo "$out" | field write $s ratio) "
    done
    out=$("$tmp/hmc" trans bench --protocol $t --pattern kv --block-size 16KiB,128KiB --duration 2s --json)
    for s in 16384 131072; do
      v[kv_${t}_$s]+="$(echo "$out" | field write $s gbps) "
      v[kvr_${t}_$s]+="$(echo "$out" | field write $s ratio) "
    done
  done
  if $ucx; then
    for op in write read; do
      for pw in 0 1; do
        out=$(HMC_UCX_PIECEWISE=$pw UCX_TLS=tcp UCX_NET_DEVICES=lo "$tmp/hmcucx" trans bench --protocol ucx --operation $op --threads 1 --batch-size 512 --block-size 4KiB,16KiB,64KiB --duration 2s --json)
        for s in 4096 16384 65536; do
          v[ucx${op}${pw}_$s]+="$(echo "$out" | field $op $s gbps) "
          v[ucxr${op}${pw}_$s]+="$(echo "$out" | field $op $s ratio) "
        done
      done
    done
  fi
done
med() { echo ${v[$1]} | tr ' ' '\n' | median | xargs printf '%.2f'; }
put=$(med put)
echo "tcp put 4MiB GB/s median $put"
for t in tcp shm; do
  for s in 4096 16384 65536; do
    g=$(med sc_${t}_$s)
    same=""
    [ $t = tcp ] && same="; /tcp put of the batch's $((512 * s >> 20)) MiB $(python3 -c "print('%.2f' % ($g/$(med same_$s)))")"
    echo "$t scattered 512 x $((s / 1024)) KiB: GB/s $g; /contiguous same bytes $(med scr_${t}_$s); /tcp put 4MiB $(python3 -c "print('%.2f' % ($g/$put))")$same"
  done
  for s in 16384 131072; do
    echo "$t kv 61 x 2 x $((s / 1024)) KiB: GB/s $(med kv_${t}_$s); /contiguous same bytes $(med kvr_${t}_$s)"
  done
done
if $ucx; then
  for op in write read; do
    for s in 4096 16384 65536; do
      echo "ucx (tcp) $op scattered 512 x $((s / 1024)) KiB: as active messages GB/s $(med ucx${op}0_$s), /contiguous same bytes $(med ucxr${op}0_$s); one per piece GB/s $(med ucx${op}1_$s), /contiguous $(med ucxr${op}1_$s)"
    done
  done
fi
