#!/usr/bin/env bash
# Measures, in one run on loopback: iperf3 (-l 1M), ucx_perftest ucp_put_bw and ucp_put_lat over
# UCX_TLS=tcp (when installed), and `hmc bench --transport tcp`, then prints hmc/peer ratios.
# Usage: bench/compare.sh [repeats]   (default 3; medians are compared)
set -euo pipefail
cd "$(dirname "$0")/.."
R=${1:-3}
export UCX_NET_DEVICES=lo
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/hmc" ./cmd/hmc
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

echo "# $(date -u +%FT%TZ) $(nproc) cores, $(git rev-parse --short HEAD 2>/dev/null || echo nogit), GOMAXPROCS=${GOMAXPROCS:-default}"
ip=(); up=(); ul=(); hb=(); hl=(); hp=()
for i in $(seq "$R"); do
  if command -v iperf3 >/dev/null; then
    port=$((15201 + i))
    timeout 30 iperf3 -s -1 -p $port >/dev/null 2>&1 & s=$!; sleep 0.3
    ip+=("$(timeout 30 iperf3 -c 127.0.0.1 -p $port -t 3 -l 1M -J | python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e9)')")
    wait $s || true
  fi
  if command -v ucx_perftest >/dev/null; then
    for t in put_bw put_lat; do
      port=$((13337 + i))
      UCX_TLS=tcp timeout 60 ucx_perftest -p $port >/dev/null 2>&1 & s=$!; sleep 0.5
      if [ $t = put_bw ]; then
        # Final line: ... bandwidth MB/s (MiB/s) in the 6th-from-last numeric columns; -f prints only the totals.
        v=$(UCX_TLS=tcp timeout 60 ucx_perftest 127.0.0.1 -p $port -t ucp_put_bw -s 4194304 -n 200 -w 10 -f 2>/dev/null | awk '/^ *[0-9]/ {l=$0} END {split(l,a," "); print a[6]*1.048576/1000}')
        up+=("$v")
      else
        v=$(UCX_TLS=tcp timeout 60 ucx_perftest 127.0.0.1 -p $port -t ucp_put_lat -s 8 -n 20000 -w 1000 -f 2>/dev/null | awk '/^ *[0-9]/ {l=$0} END {split(l,a," "); print a[2]}')
        ul+=("$v")
      fi
      wait $s || true
    done
  fi
  hb+=("$("$tmp/hmc" bench --quiet --json --transport tcp --sizes 4MiB --iters 300 | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["gbps"])')")
  hl+=("$("$tmp/hmc" bench --quiet --json --transport tcp --op lat --iters 20000 | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["p50_us"])')")
  hp+=("$("$tmp/hmc" bench --quiet --json --transport tcp --op pingpong --iters 20000 | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["p50_us"])')")
done
show() { printf '%-72s %s   median %s\n' "$1" "$2" "$3"; }
m_hb=$(printf '%s\n' "${hb[@]}" | median); m_hl=$(printf '%s\n' "${hl[@]}" | median); m_hp=$(printf '%s\n' "${hp[@]}" | median)
show "hmc tcp put 4 MiB (GB/s)" "${hb[*]}" "$m_hb"
show "hmc tcp lat: blocking 8 B put p50 (us, put+ack round trip, busy-poll)" "${hl[*]}" "$m_hl"
show "hmc tcp pingpong 8 B p50 (us, half RTT as ucp_put_lat, busy-poll)" "${hp[*]}" "$m_hp"
if [ ${#ip[@]} -gt 0 ]; then
  m_ip=$(printf '%s\n' "${ip[@]}" | median)
  show "iperf3 -l 1M (GB/s)" "${ip[*]}" "$m_ip"
  echo "ratio hmc/iperf3 at 4 MiB: $(python3 -c "print(round($m_hb/$m_ip,2))")  (target >= 0.9)"
fi
if [ ${#up[@]} -gt 0 ]; then
  m_up=$(printf '%s\n' "${up[@]}" | median); m_ul=$(printf '%s\n' "${ul[@]}" | median)
  show "ucx_perftest ucp_put_bw 4 MiB tcp (GB/s)" "${up[*]}" "$m_up"
  show "ucx_perftest ucp_put_lat 8 B tcp (us, half RTT)" "${ul[*]}" "$m_ul"
  echo "ratio hmc/ucx put_bw at 4 MiB: $(python3 -c "print(round($m_hb/$m_up,2))")"
  echo "ratio hmc pingpong / ucx put_lat (both half RTT): $(python3 -c "print(round($m_hp/$m_ul,2))")  (target <= 0.8)"
  echo "ratio hmc blocking put round trip / ucx put_lat half RTT: $(python3 -c "print(round($m_hl/$m_ul,2))")"
fi
