#!/usr/bin/env bash
# Two builds of hmc, interleaved, 3 rounds (ROUNDS), medians (GB/s; lat: p50 us): a change's before and
# after in one run. Usage: bench/before-after.sh OLD_REV   (builds OLD_REV and the working tree)
# CASES="tcp 1MiB put;tcp 4MiB get" picks the cases (transport size op; ";"-separated);
# BUSY=1 runs one busy-loop process per core beside both builds; ROUNDS=n (default 3).
set -u
IFS=';' read -r -a cases <<< "${CASES:-tcp 4MiB put;shm 4MiB put;shm 64KiB put;tcp 8 lat}"
old=${1:?usage: bench/before-after.sh OLD_REV}
cd "$(dirname "$0")/.."
tmp=$(mktemp -d); trap 'git worktree remove --force "$tmp/old" >/dev/null 2>&1; rm -rf "$tmp"' EXIT
git worktree add -q "$tmp/old" "$old" && (cd "$tmp/old" && go build -o "$tmp/hmc-old" ./cmd/hmc) || exit 1
go build -o "$tmp/hmc-new" ./cmd/hmc || exit 1
busy=()
if [ "${BUSY:-0}" = 1 ]; then
  for _ in $(seq "$(nproc)"); do sh -c 'while :; do :; done' & busy+=($!); done
  trap 'kill "${busy[@]}" 2>/dev/null; git worktree remove --force "$tmp/old" >/dev/null 2>&1; rm -rf "$tmp"' EXIT
fi
declare -A v
for r in $(seq "${ROUNDS:-3}"); do
  for b in old new; do
    for c in "${cases[@]}"; do
      set -- $c
      out=$("$tmp/hmc-$b" bench --transport $1 --sizes $2 --op $3 --duration 3s --json --quiet 2>/dev/null | tail -1)
      if [ "$3" = lat ]; then val=$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["p50_us"])'); else val=$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["gbps"])'); fi
      v["$b|$c"]+="$val "
    done
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
printf "%-16s %-22s %-22s %s\n" case old new new/old
for c in "${cases[@]}"; do
  o=$(echo ${v["old|$c"]} | median); n=$(echo ${v["new|$c"]} | median)
  printf "%-16s %-22s %-22s %.2f\n" "$c" "$o (${v["old|$c"]% })" "$n (${v["new|$c"]% })" "$(python3 -c "print($n/$o)")"
done
