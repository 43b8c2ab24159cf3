# Sourced by bench/compare-ctrl.sh and bench/compare-all.sh from the repository's root, with
# $tmp set: builds the C ctrl peer and the ctrl test binary into $tmp and defines
#   cpeer uds|tcp   p50 µs of 5000 round trips of bench/peers/ctrl_pingpong.c
#   gpeer uds|tcp   the same of bench/peers/goping (its Go twin: the runtime's floor)
#   hctrl uds|tcp   p50 µs of 5000 round trips of hmc's ctrl (BenchmarkRoundTripProcesses)
# With PIN=one both sides of each run share CPU 0; with PIN=two the server (echo) runs on CPU 0
# and the client on CPU 1; unset, the scheduler places them (and keeps a pair where it first
# put it: on this VM a wake-up across vCPUs costs 35-45 µs, so a run's p50 is ~9 or ~40 µs by
# that placement alone, for either program).
cc -O2 -o "$tmp/ctrl_pp" bench/peers/ctrl_pingpong.c
go build -o "$tmp/goping" ./bench/peers/goping
go test -c -o "$tmp/ctrl.test" ./ctrl
case "${PIN:-}" in
  one) pins=(taskset -c 0); pinc=(taskset -c 0); export HMC_CTRL_BENCH_CPUS=0,0 ;;
  two) pins=(taskset -c 0); pinc=(taskset -c 1); export HMC_CTRL_BENCH_CPUS=0,1 ;;
  *) pins=(); pinc=(); unset HMC_CTRL_BENCH_CPUS ;;
esac
cpeer() { peer "$tmp/ctrl_pp" "$1"; }
gpeer() { peer "$tmp/goping" "$1"; }
peer() {
  local w="$tmp/c.sock"; [ "$2" = tcp ] && w=$((24000 + RANDOM % 1000))
  "${pins[@]}" "$1" server "$2" "$w" >/dev/null & local s=$!
  sleep 0.2
  "${pinc[@]}" "$1" client "$2" "$w" 5000 | awk '{print $2}'
  wait $s || true
}
hctrl() {
  "$tmp/ctrl.test" -test.run '^$' -test.bench "RoundTripProcesses/$1" -test.benchtime 5000x |
    awk '/p50-us/ {for (i=1;i<=NF;i++) if ($(i+1)=="p50-us") print $i}'
}
