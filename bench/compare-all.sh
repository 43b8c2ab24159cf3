#!/usr/bin/env bash
# Every same-run comparison of issue #20 in one go, idle and then under contention (one busy
# loop per core, the peer measured under the same contention): rounds interleaved, medians.
#   TCP put 4 MiB (--duration 3s)         vs iperf3 -l 1M -t 3                  goal >= 0.9 (>= 0.8 busy)
#   TCP 8 B pingpong p50 (half RTT, polls) vs ucx_perftest ucp_put_lat, tcp      goal <= 0.8
#   shm put 64 KiB / 1 MiB / 4 MiB (3s)    vs ucx_perftest ucp_put_bw posix      goal >= 0.9 (4 MiB)
#   UCX put 64 KiB over tcp (-tags ucx, 3s) vs ucx_perftest and the put+flush C peer  goal >= 0.9
#                                          (each with its defaults, then all with 64 KiB tcp segments)
#   ctrl round trip p50, UDS and TCP       vs the C peer (bench/peers/ctrl_pingpong.c)  goal <= 1.2
#   etcd group barrier / allgather p50     64 ranks < 50 ms, 256 ranks < 200 ms (absolute)
# Writes a markdown table to stdout and to $OUT.md, every number to $OUT.json
# (OUT default docs/results/compare-all).
# Usage: bench/compare-all.sh [repeats] [idle|busy|both]   (default 3 both)
set -euo pipefail
cd "$(dirname "$0")/.."
R=${1:-3}; WHICH=${2:-both}
OUT=${OUT:-docs/results/compare-all}
export UCX_NET_DEVICES=lo
tmp=$(mktemp -d); busy=""
stopbusy() { [ -n "$busy" ] && kill $busy 2>/dev/null; busy=""; }
trap 'stopbusy; rm -rf "$tmp"' EXIT
for t in iperf3 cc; do # the TCP peer, and the C peers' compiler
  command -v $t >/dev/null || { echo "compare-all: $t is needed (apt-get install iperf3 gcc)" >&2; exit 1; }
done
go build -o "$tmp/hmc" ./cmd/hmc
ucx=false
if pkg-config --exists ucx 2>/dev/null && command -v ucx_perftest >/dev/null; then
  go build -tags ucx -o "$tmp/hmcucx" ./cmd/hmc
  cc -O2 -o "$tmp/upf" bench/peers/ucx_put_flush.c $(pkg-config --cflags --libs ucx)
  ucx=true
fi
source bench/ctrl-lib.sh
j() { python3 -c "import json,sys; print(json.loads(sys.stdin.readline())['$1'])"; }
port() { echo $((20000 + RANDOM % 20000)); }
iperf() {
  local p; p=$(port)
  timeout 30 iperf3 -s -1 -p "$p" >/dev/null 2>&1 & local s=$!; sleep 0.3
  timeout 30 iperf3 -c 127.0.0.1 -p "$p" -t 3 -l 1M -J |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e9)'
  wait $s || true
}
perftest() { # tls test size iters warmup window column
  local p; p=$(port)
  UCX_TLS=$1 timeout 120 ucx_perftest -p "$p" >/dev/null 2>&1 & local s=$!; sleep 0.5
  UCX_TLS=$1 timeout 120 ucx_perftest 127.0.0.1 -p "$p" -t "$2" -s "$3" -n "$4" -w "$5" -O "$6" -f 2>/dev/null |
    awk -v c="$7" '/^ *[0-9]/ {l=$0} END {split(l,a," "); print a[c]}'
  wait $s || true
}
declare -A v
add() { v[$1]+="$2 "; }
ucxrow() { # condition key-suffix iters: ucx_perftest, the put+flush C peer and hmc at 64 KiB over tcp
  local c=$1 k=$2 n=$3
  add "$c.uput$k" "$(perftest tcp ucp_put_bw 65536 "$n" 50 32 6 | awk '{print $1*1.048576/1000}')"
  local p; p=$(port)
  UCX_TLS=tcp timeout 120 "$tmp/upf" -p "$p" -s 65536 -a & local s=$!; sleep 0.3
  add "$c.upf$k" "$(UCX_TLS=tcp timeout 120 "$tmp/upf" 127.0.0.1 -p "$p" -s 65536 -n "$n" -w 32 -a)"
  wait $s || true
  add "$c.hucx$k" "$(UCX_TLS=tcp "$tmp/hmcucx" bench --quiet --json --transport ucx --window 32 --warmup 50 --sizes 65536 --duration 3s | j gbps)"
}
round() { # condition
  local c=$1
  add "$c.iperf" "$(iperf)"
  add "$c.tcp4m" "$("$tmp/hmc" bench --quiet --json --transport tcp --sizes 4MiB --duration 3s | j gbps)"
  add "$c.ucxlat" "$(perftest tcp ucp_put_lat 8 20000 1000 1 2)"
  add "$c.tcplat" "$("$tmp/hmc" bench --quiet --json --transport tcp --op pingpong --iters 20000 | j p50_us)"
  for s in 65536 1048576 4194304; do
    add "$c.ushm$s" "$(perftest posix,cma,self ucp_put_bw $s $((2000 * 4194304 / s)) 100 32 6 | awk '{print $1*1.048576/1000}')"
    add "$c.hshm$s" "$("$tmp/hmc" bench --quiet --json --transport shm --sizes $s --duration 3s | j gbps)"
  done
  if $ucx; then
    # Steady runs of about 3 s each (hmc needs a few thousand puts to settle; short runs
    # measured the ramp). First each program with its own defaults (hmc: 64 KiB tcp segments,
    # UCX's: 8 KiB), then all three with 64 KiB segments.
    ucxrow "$c" 64k 100000
    UCX_TCP_TX_SEG_SIZE=64K ucxrow "$c" 64kseg 200000
  fi
  for k in uds tcp; do
    add "$c.cctrl$k" "$(cpeer $k)"
    add "$c.hctrl$k" "$(hctrl $k)"
  done
}
conds=(); [ "$WHICH" != busy ] && conds+=(idle); [ "$WHICH" != idle ] && conds+=(busy)
for c in "${conds[@]}"; do
  if [ "$c" = busy ]; then for _ in $(seq "$(nproc)"); do (while :; do :; done) & busy="$busy $!"; done; fi
  for i in $(seq "$R"); do echo "compare-all: $c round $i of $R" >&2; round "$c"; done
  if command -v etcd >/dev/null; then
    "$tmp/hmc" store bench --start-etcd --no-embedded --clients 1 --duration 100ms --ranks 64,256 --rounds 10 --json 2>/dev/null |
      python3 -c '
import json,sys
for l in sys.stdin:
    r=json.loads(l)
    if r.get("op") in ("barrier","allgather"): print(r["op"], r["ranks"], r["p50_us"]/1000)' |
      while read -r op n ms; do echo "$c.etcd$op$n $ms"; done > "$tmp/etcd.$c"
    while read -r k ms; do v[$k]="$ms "; done < "$tmp/etcd.$c"
  fi
  stopbusy
done
for k in "${!v[@]}"; do echo "$k ${v[$k]}"; done > "$tmp/raw"
python3 - "$tmp/raw" "$OUT" "$(git rev-parse --short HEAD 2>/dev/null || echo nogit)" "$(nproc)" "$R" <<'PY'
import json, statistics, sys, datetime, platform
raw, out, commit, cores, R = sys.argv[1:]
v = {}
for line in open(raw):
    k, *xs = line.split()
    v[k] = [float(x) for x in xs if x]
med = lambda k: statistics.median(v[k]) if v.get(k) else None
rng = lambda k: f"{min(v[k]):.3g}–{max(v[k]):.3g}" if v.get(k) else "-"
rows = []  # (row, hmc key, peer key or fixed, unit, higher-better, goal)
def row(name, h, p, unit, higher, goal, busygoal=None):
    for c in ("idle", "busy"):
        hk = f"{c}.{h}"
        if hk not in v: continue
        hm = med(hk)
        if isinstance(p, (int, float)): pm, pr, pname = p, "(fixed)", ""
        else: pm, pr = med(f"{c}.{p}"), rng(f"{c}.{p}")
        ratio = hm / pm if pm else None
        g = busygoal if (c == "busy" and busygoal is not None) else goal
        ok = None
        if ratio is not None and g is not None:
            ok = ratio >= g if higher else ratio <= g
        rows.append(dict(row=name, condition=c, unit=unit, hmc=hm, hmc_range=rng(hk), peer=pm, peer_range=pr,
                         ratio=ratio, goal=(">= " if higher else "<= ") + str(g) if g is not None else "", met=ok))
row("TCP put 4 MiB, 3 s / iperf3 -l 1M", "tcp4m", "iperf", "GB/s", True, 0.9, 0.8)
row("TCP 8 B pingpong p50 / ucp_put_lat tcp", "tcplat", "ucxlat", "µs", False, 0.8)
for s, n in ((65536, "64 KiB"), (1048576, "1 MiB"), (4194304, "4 MiB")):
    row(f"shm put {n}, 3 s / UCX posix put_bw", f"hshm{s}", f"ushm{s}", "GB/s", True, 0.9 if s == 4194304 else None, 0.8 if s == 4194304 else None)
row("UCX put 64 KiB tcp, 3 s / ucx_perftest (each its defaults)", "hucx64k", "uput64k", "GB/s", True, 0.9, 0.8)
row("UCX put 64 KiB tcp, 3 s / put+flush C peer (each its defaults)", "hucx64k", "upf64k", "GB/s", True, 0.9, 0.8)
row("UCX put 64 KiB tcp, 3 s / ucx_perftest (all 64 KiB segments)", "hucx64kseg", "uput64kseg", "GB/s", True, 0.9, 0.8)
row("UCX put 64 KiB tcp, 3 s / put+flush C peer (all 64 KiB segments)", "hucx64kseg", "upf64kseg", "GB/s", True, 0.9, 0.8)
row("ctrl round trip UDS / C peer", "hctrluds", "cctrluds", "µs", False, 1.2)
row("ctrl round trip TCP / C peer", "hctrltcp", "cctrltcp", "µs", False, 1.2)
row("etcd barrier 64 ranks p50 / 50 ms", "etcdbarrier64", 50.0, "ms", False, 1.0)
row("etcd allgather 64 ranks p50 / 50 ms", "etcdallgather64", 50.0, "ms", False, 1.0)
row("etcd barrier 256 ranks p50 / 200 ms", "etcdbarrier256", 200.0, "ms", False, 1.0)
row("etcd allgather 256 ranks p50 / 200 ms", "etcdallgather256", 200.0, "ms", False, 1.0)
meta = dict(date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"), commit=commit, cores=int(cores),
            repeats=int(R), machine=platform.processor() or platform.machine(), kernel=platform.release())
f = lambda x: "-" if x is None else (f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}")
md = [f"`bench/compare-all.sh {R}` — {meta['date']}, commit {commit}, {cores} cores, kernel {meta['kernel']}; medians of {R} interleaved rounds (range)", "",
      "| comparison | condition | hmc | peer | ratio | goal | met |", "|---|---|---|---|---|---|---|"]
for r in rows:
    met = "" if r["met"] is None else ("yes" if r["met"] else "**no**")
    md.append(f"| {r['row']} | {r['condition']} | {f(r['hmc'])} {r['unit']} ({r['hmc_range']}) | {f(r['peer'])} {r['unit']} {r['peer_range']} | {f(r['ratio'])} | {r['goal']} | {met} |")
text = "\n".join(md) + "\n"
print(text)
open(out + ".md", "w").write(text)
json.dump(dict(meta=meta, rows=rows, raw=v), open(out + ".json", "w"), indent=1)
PY
