#!/usr/bin/env bash
# Control-plane round trip (a u64 tag there and back between two processes), in one run: the
# same exchange in C (bench/peers/ctrl_pingpong.c: blocking socket, one thread per side, the
# floor of what upstream HMC's C++ ctrl plane can do), in Go with bare system calls
# (bench/peers/goping: the floor of a Go control plane) and hmc's ctrl
# (BenchmarkRoundTripProcesses: both sides fresh processes), over UDS and TCP, rounds
# interleaved; p50 medians.
# Usage: [PIN=one|two] bench/compare-ctrl.sh [repeats] [busy]   (default 3; PIN: bench/ctrl-lib.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/compare-lib.sh
source bench/ctrl-lib.sh
declare -A v
for _ in $(seq "$R"); do
  for k in uds tcp; do
    v[c$k]+="$(cpeer $k) "
    v[g$k]+="$(gpeer $k) "
    v[h$k]+="$(hctrl $k) "
  done
done
echo "| transport | C peer p50 µs (range) | Go floor p50 µs (range) | hmc p50 µs (range) | Go floor / C | hmc / C (goal <= 1.2) |"
echo "|---|---|---|---|---|---|"
for k in uds tcp; do
  c=$(tr ' ' '\n' <<<"${v[c$k]}" | grep . | median); g=$(tr ' ' '\n' <<<"${v[g$k]}" | grep . | median)
  h=$(tr ' ' '\n' <<<"${v[h$k]}" | grep . | median)
  echo "| $k | $c ($(tr ' ' '\n' <<<"${v[c$k]}" | grep . | range)) | $g ($(tr ' ' '\n' <<<"${v[g$k]}" | grep . | range)) | $h ($(tr ' ' '\n' <<<"${v[h$k]}" | grep . | range)) | $(python3 -c "print(f'{$g/$c:.2f}')") | $(python3 -c "print(f'{$h/$c:.2f}')") |"
done
