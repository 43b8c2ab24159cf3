# Sourced by bench/compare-{bm,trans,shmem,ctrl}.sh from the repository's root, with the script's
# arguments: R (repeats, $1, default 3), $tmp/hmc built from this checkout, one busy loop per
# core when $2 is "busy" (killed on exit), the header line, and helpers: median and range of
# numbers on stdin, and field OP SIZE KEY, which prints KEY of every `--json` result line on
# stdin whose op is OP and size SIZE (either empty: any).
R=${1:-3}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"; [ -n "${busy:-}" ] && kill $busy 2>/dev/null || true' EXIT
go build -o "$tmp/hmc" ./cmd/hmc
busy=""
if [ "${2:-}" = busy ]; then
  for _ in $(seq "$(nproc)"); do (while :; do :; done) & busy="$busy $!"; done
fi
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
range() { sort -g | awk 'NR==1{lo=$1} {hi=$1} END {print lo "-" hi}'; }
field() { python3 -c "
import json,sys
for l in sys.stdin:
    r=json.loads(l)
    if '$1' in ('', r['op']) and '$2' in ('', str(r['size'])): print(r['$3'])"; }
echo "# $(date -u +%FT%TZ) $(nproc) cores, $(git rev-parse --short HEAD 2>/dev/null || echo nogit) ${2:-} ${PIN:+PIN=$PIN}"
