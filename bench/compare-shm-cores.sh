#!/usr/bin/env bash
# Issue #20 item 3: shared-memory puts copying on one core or sharing the copy with helpers,
# idle and with one busy loop per core, in one run, rounds interleaved, medians (range), GB/s:
#   solo   this tree with --shm-workers 1 (the caller's single memcpy: the floor to stay above)
#   always OLD_REV, whose copies always share from 1 MiB
#   adapt  this tree: shares unless shared copies have been stalling (transport/shm helpers)
# Usage: [SIZES="1MiB 4MiB"] bench/compare-shm-cores.sh OLD_REV [repeats]   (default 3; sizes 64KiB 1MiB 4MiB)
set -euo pipefail
old=${1:?usage: bench/compare-shm-cores.sh OLD_REV [repeats]}
R=${2:-3}
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
busy=""
cleanup() { [ -n "$busy" ] && kill $busy 2>/dev/null; git worktree remove --force "$tmp/old" >/dev/null 2>&1; rm -rf "$tmp"; }
trap cleanup EXIT
git worktree add -q "$tmp/old" "$old"
(cd "$tmp/old" && go build -o "$tmp/hmc-old" ./cmd/hmc)
go build -o "$tmp/hmc" ./cmd/hmc
gbps() { python3 -c 'import json,sys; print(json.loads(sys.stdin.readlines()[-1])["gbps"])'; }
median() { sort -g | awk '{a[NR]=$1} END {printf "%.2f", a[int((NR+1)/2)]}'; }
range() { sort -g | awk 'NR==1{lo=$1} {hi=$1} END {printf "%.2f-%.2f", lo, hi}'; }
declare -A v
sizes=${SIZES:-64KiB 1MiB 4MiB}
for load in idle busy; do
  if [ $load = busy ]; then
    for _ in $(seq "$(nproc)"); do (while :; do :; done) & busy="$busy $!"; done
  fi
  for _ in $(seq "$R"); do
    for s in $sizes; do
      v[$load$s-solo]+="$("$tmp/hmc" bench --transport shm --sizes $s --duration 2s --json --quiet --shm-workers 1 2>/dev/null | gbps) "
      v[$load$s-always]+="$("$tmp/hmc-old" bench --transport shm --sizes $s --duration 2s --json --quiet 2>/dev/null | gbps) "
      v[$load$s-adapt]+="$("$tmp/hmc" bench --transport shm --sizes $s --duration 2s --json --quiet 2>/dev/null | gbps) "
    done
  done
  if [ $load = busy ]; then kill $busy 2>/dev/null; busy=""; fi
done
echo "# $(date -u +%FT%TZ) $(nproc) cores, old $old, new $(git rev-parse --short HEAD)+tree"
echo "| machine | size | solo (one memcpy) | always share (old) | adaptive (new) | old / solo | new / solo |"
echo "|---|---|---|---|---|---|---|"
for load in idle busy; do
  for s in $sizes; do
    c() { tr ' ' '\n' <<<"${v[$load$s-$1]}" | grep .; }
    so=$(c solo | median); al=$(c always | median); ad=$(c adapt | median)
    echo "| $load | $s | $so ($(c solo | range)) | $al ($(c always | range)) | $ad ($(c adapt | range)) | $(python3 -c "print(f'{$al/$so:.2f}')") | $(python3 -c "print(f'{$ad/$so:.2f}')") |"
  done
done
