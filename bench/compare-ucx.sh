#!/usr/bin/env bash
# Measures, in one run on loopback, ucx_perftest ucp_put_bw and `hmc bench --transport ucx` (a
# -tags ucx build) at 64 KiB, 1 MiB and 4 MiB, with the same UCX_TLS for both, and prints
# hmc/ucx_perftest ratios (issue #5's target: >= 0.9). Beside them, bench/peers/ucx_put_flush.c: UCX
# itself with HMC's guarantee (a put is done when a flush says it is visible at the target), which
# perftest does not give.
# ALLOC=ucx (default): hmc's and the C peer's buffers are allocated by UCX, as perftest's are (hmc
# bench --ucx-alloc); ALLOC=registered: HMC's memfd buffers and the C peer's malloc'd ones,
# registered with ucp_mem_map (UCX's shared-memory transports cannot map those into the peer).
# All three warm up with 50 transfers (perftest -w 50, the C peer's own, hmc --warmup 50) and keep
# WINDOW transfers in flight (perftest -O, the C peer's -w, hmc --window). The default, 32, is
# ucx_perftest's own for ucp_put_bw (its tests[] table); perftest counts a put as out of the window
# when it completes locally, the other two when a flush says it is visible at the target.
# Usage: bench/compare-ucx.sh [repeats] [tls ...]   (default 3 repeats; tls "tcp" and "posix,cma,self")
set -euo pipefail
cd "$(dirname "$0")/.."
R=${1:-3}; shift || true
TLSS=("$@"); [ ${#TLSS[@]} -gt 0 ] || TLSS=(tcp posix,cma,self)
WINDOW=${WINDOW:-32}
ALLOC=${ALLOC:-ucx}
case $ALLOC in
  ucx) UCXALLOC=true; UPFALLOC=-a ;;
  registered) UCXALLOC=false; UPFALLOC= ;;
  *) echo "ALLOC=$ALLOC: want ucx or registered" >&2; exit 2 ;;
esac
export UCX_NET_DEVICES=lo
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# HMC_BIN: a prebuilt -tags ucx hmc binary (on a machine without Go), else built here.
if [ -n "${HMC_BIN:-}" ]; then cp "$HMC_BIN" "$tmp/hmc"; else go build -tags ucx -o "$tmp/hmc" ./cmd/hmc; fi
# UPF_BIN: a prebuilt ucx_put_flush, else compiled here.
if [ -n "${UPF_BIN:-}" ]; then cp "$UPF_BIN" "$tmp/upf"; else
  cc -O2 -o "$tmp/upf" bench/peers/ucx_put_flush.c $(pkg-config --cflags --libs ucx); fi
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
echo "hmc bench --transport ucx --window $WINDOW --ucx-alloc=$UCXALLOC vs ucx_perftest -t ucp_put_bw -O $WINDOW and ucx_put_flush -w $WINDOW $UPFALLOC (GB/s, medians of $R)"
printf "%-16s %8s %12s %12s %12s %12s %12s\n" UCX_TLS size perftest put+flush hmc hmc/perftest hmc/put+flush
for tls in "${TLSS[@]}"; do
  for s in 65536 1048576 4194304; do
    n=$((4000 * 65536 / s + 200))
    up=(); hb=(); uf=()
    for i in $(seq "$R"); do
      port=$((13500 + i))
      UCX_TLS=$tls timeout 120 ucx_perftest -p $port >/dev/null 2>&1 & sp=$!; sleep 0.5
      up+=("$(UCX_TLS=$tls timeout 120 ucx_perftest 127.0.0.1 -p $port -t ucp_put_bw -s $s -n $n -w 50 -O "$WINDOW" -f 2>/dev/null |
        awk '/^ *[0-9]/ {l=$0} END {split(l,a," "); print a[6]*1.048576/1000}')")
      wait $sp || true
      UCX_TLS=$tls timeout 120 "$tmp/upf" -p $((port + 50)) -s $s $UPFALLOC & sp=$!; sleep 0.3
      uf+=("$(UCX_TLS=$tls timeout 120 "$tmp/upf" 127.0.0.1 -p $((port + 50)) -s $s -n $n -w "$WINDOW" $UPFALLOC)")
      wait $sp || true
      hb+=("$(UCX_TLS=$tls "$tmp/hmc" bench --quiet --json --transport ucx --ucx-alloc=$UCXALLOC --window "$WINDOW" --warmup 50 --sizes "$s" --iters "$n" |
        python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["gbps"])')")
    done
    mu=$(printf '%s\n' "${up[@]}" | median); mh=$(printf '%s\n' "${hb[@]}" | median)
    mf=$(printf '%s\n' "${uf[@]}" | median)
    printf "%-16s %8s %12.3f %12.3f %12.3f %12.2f %12.2f\n" "$tls" "$s" "$mu" "$mf" "$mh" \
      "$(python3 -c "print($mh/$mu)")" "$(python3 -c "print($mh/$mf)")"
  done
done
