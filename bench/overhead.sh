#!/usr/bin/env bash
# bench/overhead.sh: the overhead of a layer over the null stack on the large
# compile (GNU grep 3.8: unpack, ./configure, make -j2 inside the mount;
# compiler and headers outside), configurations interleaved run by run so
# that a busy machine slows them alike. Each configuration is a stack of
# bench/stacks (default: null snoop acl); each run mounts it afresh on an
# empty lower directory with `cairn mount`. Reported per configuration: the
# median elapsed time of the whole compile and its range, the ratio of the
# medians to null's, the daemon's CPU time (user+system), and for snoop the
# records in its log and how many were dropped.
#
# Usage: sudo bench/overhead.sh [--runs N] [--dir DIR] [--out FILE.md] [STACK...]
#
#   --dir DIR   an ext4 directory to work in; by default the script makes an
#               8 GiB ext4 image ($CAIRN_BENCH_IMG, default
#               /var/tmp/cairn-overhead.img), loop-mounts it with direct I/O
#               and no discard, and removes it at the end.
#   --runs N    measured runs per configuration (default 5), after one
#               warm-up round that is not counted
#   --out FILE  also write the result table (markdown) to FILE
set -euo pipefail

RUNS=5 DIR= OUT=
STACKS=()
while [ $# -gt 0 ]; do
	case "$1" in
	--runs) RUNS=$2; shift 2 ;;
	--dir) DIR=$2; shift 2 ;;
	--out) OUT=$2; shift 2 ;;
	-h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	-*) echo "overhead.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
	*) STACKS+=("$1"); shift ;;
	esac
done
[ ${#STACKS[@]} -gt 0 ] || STACKS=(null snoop acl)
[ "$(id -u)" = 0 ] || { echo "overhead.sh: needs root (loop device, mounts)" >&2; exit 2; }
REPO=$(cd "$(dirname "$0")/.." && pwd)
TAR=${CAIRN_BENCH_TARBALL:-$REPO/../shared/bench/grep_3.8.orig.tar.xz}
[ -f "$TAR" ] || { echo "overhead.sh: $TAR not found (set CAIRN_BENCH_TARBALL)" >&2; exit 2; }
for s in "${STACKS[@]}"; do
	[ -f "$REPO/bench/stacks/$s.toml" ] || { echo "overhead.sh: no bench/stacks/$s.toml" >&2; exit 2; }
done

TAG=cairn-overhead-$$
MNT=/tmp/$TAG-mnt
LOOP= IMG=
. "$REPO/bench/lib.sh"
cleanup() {
	set +e
	mountpoint -q "$MNT" && { "$CAIRN" umount "$MNT" || umount -l "$MNT"; }
	rmdir "$MNT" 2>/dev/null
	[ -n "${W:-}" ] && rm -rf "$W"
	scratch_ext4_remove
}
trap cleanup EXIT
CAIRN=$REPO/bin/cairn
(cd "$REPO" && go build -o bin/cairn ./cmd/cairn)
scratch_ext4 8G /var/tmp/cairn-overhead.img
W=$DIR/$TAG
mkdir -p "$W" "$MNT"
cat "$TAR" >/dev/null # from the page cache from now on
RAW=$W/raw.csv
: >"$RAW"

# one CONFIG RUN: mount a fresh stack, compile, record.
one() {
	local cfg=$1 run=$2 lower=$W/lower-$1 work=$W/work-$1
	rm -rf "$lower" "$work"
	mkdir -p "$lower" "$work"
	sed -e "s#{lower}#$lower#g" -e "s#{work}#$work#g" "$REPO/bench/stacks/$cfg.toml" >"$work/spec.toml"
	"$CAIRN" mount "$work/spec.toml" "$MNT"
	local pid
	pid=$(pgrep -n -f "cairn mount $work/spec.toml") || true
	local t0 t1
	t0=$(date +%s.%N)
	(cd "$MNT" && tar -xJf "$TAR" && cd grep-3.8 && ./configure --quiet >/dev/null && make -j2 >/dev/null 2>&1)
	t1=$(date +%s.%N)
	local cpu=0
	if [ -n "$pid" ] && [ -r "/proc/$pid/stat" ]; then
		# utime + stime, in clock ticks
		cpu=$(awk -v hz="$(getconf CLK_TCK)" '{printf "%.2f", ($14+$15)/hz}' "/proc/$pid/stat")
	fi
	"$CAIRN" umount "$MNT"
	sleep 0.5
	local recs=- drops=-
	if [ -f "$work/snoop.log" ]; then
		recs=$(wc -l <"$work/snoop.log")
		drops=$({ grep '"op":"dropped"' "$work/snoop.log" || true; } | sed 's/.*"count":\([0-9]*\).*/\1/' | awk '{s+=$1} END {print s+0}')
	fi
	local el
	el=$(echo "$t1 - $t0" | bc)
	echo "$cfg,$run,$el,$cpu,$recs,$drops" >>"$RAW"
	echo "run $run $cfg: ${el}s, daemon cpu ${cpu}s, records $recs, dropped $drops" >&2
	rm -rf "$lower" "$work"
}

for run in $(seq 0 "$RUNS"); do
	for cfg in "${STACKS[@]}"; do
		one "$cfg" "$run"
	done
done

table=$(awk -F, -v base="${STACKS[0]}" '
	$2 > 0 { n[$1]++; el[$1, n[$1]] = $3; cpu[$1, n[$1]] = $4; rec[$1] = $5; drop[$1] += ($6 == "-" ? 0 : $6) }
	function med(a, c, k,   i, j, t, v) {
		for (i = 1; i <= k; i++) v[i] = a[c, i]
		for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
		lo = v[1]; hi = v[k]
		return (k % 2) ? v[(k + 1) / 2] : (v[k / 2] + v[k / 2 + 1]) / 2
	}
	END {
		print "| stack | compile (median, s) | range (s) | vs " base " | daemon CPU (median, s) | snoop records (last run) | dropped (all runs) |"
		print "| --- | --- | --- | --- | --- | --- | --- |"
		b = med(el, base, n[base])
		order = "'"${STACKS[*]}"'"
		split(order, cs, " ")
		for (i = 1; i in cs; i++) {
			c = cs[i]
			m = med(el, c, n[c]); l = lo; h = hi
			cm = med(cpu, c, n[c])
			printf "| %s | %.1f | %.1f..%.1f | %+.1f%% | %.1f | %s | %s |\n", c, m, l, h, (m / b - 1) * 100, cm, rec[c], (rec[c] == "-" ? "-" : drop[c])
		}
	}' "$RAW")
echo "$table"
echo
echo "raw (config, run, elapsed s, daemon CPU s, snoop records, dropped; run 0 is the warm-up):"
cat "$RAW"
if [ -n "$OUT" ]; then
	{ echo "$table"; echo; echo '```'; cat "$RAW"; echo '```'; } >"$OUT"
fi
