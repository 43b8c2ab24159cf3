#!/usr/bin/env bash
# Same-host comparison in one run: a 1-thread C memcpy, ucx_perftest ucp_put_bw / ucp_put_lat over
# UCX_TLS=posix,cma,self (buffers reused, as ucx_perftest does), and `hmc bench --transport shm`.
# Usage: bench/compare-shm.sh [repeats]   (default 3; medians are compared)
set -euo pipefail
cd "$(dirname "$0")/.."
R=${1:-3}
export UCX_NET_DEVICES=lo
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/hmc" ./cmd/hmc
cat > "$tmp/memcpy.c" <<'C'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
int main(int argc, char **argv) {
  size_t n = strtoull(argv[1], 0, 10); int iters = atoi(argv[2]);
  char *a = aligned_alloc(4096, n), *b = aligned_alloc(4096, n);
  memset(a, 1, n); memset(b, 2, n);
  struct timespec t0, t1; clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < iters; i++) { memcpy(b, a, n); a[i % n]++; }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
  printf("%f\n", (double)n * iters / s / 1e9); return b[0] == 0;
}
C
cc -O2 -o "$tmp/memcpy" "$tmp/memcpy.c"
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
jq1() { python3 -c "import json,sys; print(json.loads(sys.stdin.readline())['$1'])"; }
ucx() { # test size iters warmup column
  local port=$((14000 + RANDOM % 1000))
  UCX_TLS=posix,cma,self timeout 60 ucx_perftest -p $port >/dev/null 2>&1 & local s=$!; sleep 0.5
  UCX_TLS=posix,cma,self timeout 60 ucx_perftest 127.0.0.1 -p $port -t "$1" -s "$2" -n "$3" -w "$4" -f 2>/dev/null |
    awk -v c="$5" '/^ *[0-9]/ {l=$0} END {split(l,a," "); print a[c]}'
  wait $s || true
}
echo "# $(date -u +%FT%TZ) $(nproc) cores, $(git rev-parse --short HEAD 2>/dev/null || echo nogit)"
declare -A v
for i in $(seq "$R"); do
  v[mc4]+="$("$tmp/memcpy" 4194304 2000) "
  v[mc256]+="$("$tmp/memcpy" 268435456 20) "
  if command -v ucx_perftest >/dev/null; then
    v[u4]+="$(ucx ucp_put_bw 4194304 2000 100 6 | awk '{print $1*1.048576/1000}') "
    v[u256]+="$(ucx ucp_put_bw 268435456 40 4 6 | awk '{print $1*1.048576/1000}') "
    v[ul]+="$(ucx ucp_put_lat 8 100000 1000 2) "
  fi
  v[h4]+="$("$tmp/hmc" bench --quiet --json --transport shm --sizes 4MiB --iters 2000 | jq1 gbps) "
  v[h256]+="$("$tmp/hmc" bench --quiet --json --transport shm --sizes 256MiB --iters 40 | jq1 gbps) "
  v[hl]+="$("$tmp/hmc" bench --quiet --json --transport shm --op lat --iters 100000 | jq1 p50_us) "
  v[hp]+="$("$tmp/hmc" bench --quiet --json --transport shm --op pingpong --iters 100000 | jq1 p50_us) "
done
m() { printf '%s\n' ${v[$1]} | median; }
row() { printf '%-60s %s  median %s\n' "$1" "${v[$2]}" "$(m "$2")"; }
row "memcpy 1 thread 4 MiB (GB/s)" mc4
row "memcpy 1 thread 256 MiB (GB/s)" mc256
row "hmc shm put 4 MiB (GB/s)" h4
row "hmc shm put 256 MiB (GB/s)" h256
row "hmc shm blocking 8 B put p50 (us)" hl
row "hmc shm pingpong 8 B p50 (us, half RTT)" hp
r() { python3 -c "print(round($1/$2, 2))"; }
echo "ratio hmc/memcpy 256 MiB: $(r "$(m h256)" "$(m mc256)")  (target >= 0.85)"
echo "ratio hmc/memcpy 4 MiB: $(r "$(m h4)" "$(m mc4)")"
if [ -n "${v[u4]:-}" ]; then
  row "ucx_perftest ucp_put_bw posix,cma,self 4 MiB (GB/s)" u4
  row "ucx_perftest ucp_put_bw posix,cma,self 256 MiB (GB/s)" u256
  row "ucx_perftest ucp_put_lat posix,cma,self 8 B (us, half RTT)" ul
  echo "ratio hmc/ucx put 4 MiB: $(r "$(m h4)" "$(m u4)")  (target >= 0.9)"
  echo "ratio hmc/ucx put 256 MiB: $(r "$(m h256)" "$(m u256)")"
fi
echo "8 B put p50 $(m hl) us  (target <= 1 us)"
