# Sourced by bench/compare-ctrl.sh and bench/compare-all.sh from the repository's root, with
# $tmp set: builds the C ctrl peer and the ctrl test binary into $tmp and defines
#   cpeer uds|tcp   p50 µs of 5000 round trips of bench/peers/ctrl_pingpong.c
#   hctrl uds|tcp   p50 µs of 5000 round trips of hmc's ctrl (BenchmarkRoundTripProcesses)
cc -O2 -o "$tmp/ctrl_pp" bench/peers/ctrl_pingpong.c
go test -c -o "$tmp/ctrl.test" ./ctrl
cpeer() {
  local w="$tmp/c.sock"; [ "$1" = tcp ] && w=$((24000 + RANDOM % 1000))
  "$tmp/ctrl_pp" server "$1" "$w" >/dev/null & local s=$!
  sleep 0.2
  "$tmp/ctrl_pp" client "$1" "$w" 5000 | awk '{print $2}'
  wait $s || true
}
hctrl() {
  "$tmp/ctrl.test" -test.run '^$' -test.bench "RoundTripProcesses/$1" -test.benchtime 5000x |
    awk '/p50-us/ {for (i=1;i<=NF;i++) if ($(i+1)=="p50-us") print $i}'
}
