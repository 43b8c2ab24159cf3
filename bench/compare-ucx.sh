#!/usr/bin/env bash
# Measures, in one run on loopback, ucx_perftest ucp_put_bw and `hmc bench --transport ucx` (a
# -tags ucx build) at 64 KiB, 1 MiB and 4 MiB, with the same UCX_TLS for both, and prints
# hmc/ucx_perftest ratios (issue #5's target: >= 0.9).
# Usage: bench/compare-ucx.sh [repeats] [tls ...]   (default 3 repeats; tls "tcp" and "posix,cma,self")
set -euo pipefail
cd "$(dirname "$0")/.."
R=${1:-3}; shift || true
TLSS=("$@"); [ ${#TLSS[@]} -gt 0 ] || TLSS=(tcp posix,cma,self)
WINDOW=${WINDOW:-16}
export UCX_NET_DEVICES=lo
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# HMC_BIN: a prebuilt -tags ucx hmc binary (on a machine without Go), else built here.
if [ -n "${HMC_BIN:-}" ]; then cp "$HMC_BIN" "$tmp/hmc"; else go build -tags ucx -o "$tmp/hmc" ./cmd/hmc; fi
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
echo "hmc bench --transport ucx --window $WINDOW vs ucx_perftest -t ucp_put_bw (GB/s, medians of $R)"
printf "%-16s %8s %12s %12s %8s\n" UCX_TLS size perftest hmc ratio
for tls in "${TLSS[@]}"; do
  for s in 65536 1048576 4194304; do
    n=$((4000 * 65536 / s + 200))
    up=(); hb=()
    for i in $(seq "$R"); do
      port=$((13500 + i))
      UCX_TLS=$tls timeout 120 ucx_perftest -p $port >/dev/null 2>&1 & sp=$!; sleep 0.5
      up+=("$(UCX_TLS=$tls timeout 120 ucx_perftest 127.0.0.1 -p $port -t ucp_put_bw -s $s -n $n -w 50 -f 2>/dev/null |
        awk '/^ *[0-9]/ {l=$0} END {split(l,a," "); print a[6]*1.048576/1000}')")
      wait $sp || true
      hb+=("$(UCX_TLS=$tls "$tmp/hmc" bench --quiet --json --transport ucx --window "$WINDOW" --sizes "$s" --iters "$n" |
        python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["gbps"])')")
    done
    mu=$(printf '%s\n' "${up[@]}" | median); mh=$(printf '%s\n' "${hb[@]}" | median)
    printf "%-16s %8s %12.3f %12.3f %8.2f\n" "$tls" "$s" "$mu" "$mh" "$(python3 -c "print($mh/$mu)")"
  done
done
