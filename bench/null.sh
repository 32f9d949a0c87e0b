#!/usr/bin/env bash
# bench/null.sh: native ext4 against the cairn `null` stack (local + null), in
# one run: 1 GiB sequential write and read, untar of ~10,000 small files,
# ls -lR of the tree (cold and warm), rm -rf of it, and the daemon's resident
# memory after the untar. Each figure is the median of --runs runs, with its
# spread (min..max); ratios are to native.
#
# Usage: sudo bench/null.sh [--runs N] [--dir DIR] [--size MiB] [--out FILE.md]
#
#   --dir DIR   an (ext4) directory to work in; by default the script makes a
#               16 GiB ext4 image at $CAIRN_BENCH_IMG (default
#               /var/tmp/cairn-bench.img), loop-mounts it with direct I/O and
#               no discard, and removes it at the end.
#   --runs N    runs per configuration (default 5, at least 3)
#   --size MiB  size of the sequential file (default 1024)
#   --out FILE  also write the result table (markdown) to FILE
#
# Needs root (to drop caches), fuse3, Go, tar and xz. Run from the repo root.
set -euo pipefail

RUNS=5 DIR= SIZE=1024 OUT=
while [ $# -gt 0 ]; do
	case "$1" in
	--runs) RUNS=$2; shift 2 ;;
	--dir) DIR=$2; shift 2 ;;
	--size) SIZE=$2; shift 2 ;;
	--out) OUT=$2; shift 2 ;;
	-h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "null.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
done
[ "$(id -u)" = 0 ] || { echo "null.sh: needs root (drop_caches, mounts)" >&2; exit 2; }
[ "$RUNS" -ge 3 ] || { echo "null.sh: --runs must be at least 3" >&2; exit 2; }
REPO=$(cd "$(dirname "$0")/.." && pwd)
GREP_TAR=${CAIRN_BENCH_TARBALL:-$REPO/../shared/bench/grep_3.8.orig.tar.xz}
[ -f "$GREP_TAR" ] || { echo "null.sh: $GREP_TAR not found (set CAIRN_BENCH_TARBALL)" >&2; exit 2; }

TAG=cairn-null-bench-$$
MNT=/tmp/$TAG-mnt
LOOP= IMG=
. "$REPO/bench/lib.sh"
cleanup() {
	set +e
	mountpoint -q "$MNT" && { "$REPO/bin/cairn" umount "$MNT" || umount -l "$MNT"; }
	rmdir "$MNT" 2>/dev/null
	scratch_ext4_remove
}
trap cleanup EXIT
scratch_ext4 16G /var/tmp/cairn-bench.img
W=$DIR/$TAG
mkdir -p "$W/native" "$W/lower" "$MNT"

echo "building cairn..." >&2
(cd "$REPO" && go build -o bin/cairn ./cmd/cairn)
CAIRN=$REPO/bin/cairn

# The tree: 8 copies of the grep 3.8 source (~10,000 files and directories),
# as one uncompressed, deterministic tar so that decompression is not timed.
TREE=$W/tree.tar
grep_tree "$GREP_TAR" "$TREE"
NFILES=$(tar -tf "$TREE" | wc -l)

cat > "$W/null.toml" <<TOML
mount = "top"

[layer.base]
type = "local"
path = "$W/lower"

[layer.top]
type = "null"
over = "base"
TOML

RAW=$W/raw.csv
: > "$RAW"
dropcaches() { sync; echo 3 > /proc/sys/vm/drop_caches; }
now() { echo "$EPOCHREALTIME"; }
# timed NAME CONFIG COMMAND...: runs the command, records its elapsed seconds.
timed() {
	local name=$1 cfg=$2; shift 2
	local t0 t1
	t0=$(now)
	"$@"
	t1=$(now)
	echo "$cfg,$name,$(echo "$t1 - $t0" | bc -l)" >> "$RAW"
}
daemon_pid() { pgrep -f -- "cairn mount .*$MNT\$" | head -1; }
up() { "$CAIRN" mount "$W/null.toml" "$MNT"; }
down() { "$CAIRN" umount "$MNT"; }

onerun() { # onerun CONFIG
	local cfg=$1 d
	if [ "$cfg" = native ]; then d=$W/native; else up; d=$MNT; fi
	dropcaches
	timed seqwrite "$cfg" dd if=/dev/zero of="$d/big" bs=1M count="$SIZE" conv=fsync status=none
	if [ "$cfg" = null ]; then down; dropcaches; up; else dropcaches; fi
	timed seqread_cold "$cfg" dd if="$d/big" of=/dev/null bs=1M status=none
	timed seqread_warm "$cfg" dd if="$d/big" of=/dev/null bs=1M status=none
	rm -f "$d/big"
	dropcaches
	cat "$TREE" > /dev/null # the tarball itself comes from the page cache
	timed untar "$cfg" tar -xf "$TREE" -C "$d"
	if [ "$cfg" = null ]; then
		local pid; pid=$(daemon_pid)
		echo "$cfg,rss_mib,$(awk '/^VmRSS/ {print $2/1024}' "/proc/$pid/status")" >> "$RAW"
		down; dropcaches; up
	else
		dropcaches
	fi
	timed ls_lR_cold "$cfg" sh -c "ls -lR '$d' > /dev/null"
	timed ls_lR_warm "$cfg" sh -c "ls -lR '$d' > /dev/null"
	timed rm_rf "$cfg" sh -c "rm -rf '$d'/copy*"
	timed sync "$cfg" sync
	[ "$cfg" = null ] && down
	return 0
}

for r in $(seq 1 "$RUNS"); do
	for cfg in native null; do
		echo "run $r/$RUNS: $cfg" >&2
		onerun "$cfg"
	done
done

# Summary: medians with min..max; throughput for seq I/O, time otherwise.
table=$(awk -F, -v size="$SIZE" '
function median(a, n,   i, j, t) {
	for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j+1] = a[j]; a[j+1] = t }
	return (n % 2) ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
}
{ k = $1 SUBSEP $2; n[k]++; v[k, n[k]] = $3 }
END {
	split("seqwrite seqread_cold seqread_warm untar ls_lR_cold ls_lR_warm rm_rf rss_mib", ops, " ")
	print "| operation | native | null | null/native | goal |"
	print "| --- | --- | --- | --- | --- |"
	for (o = 1; o <= 8; o++) {
		op = ops[o]
		for (c = 1; c <= 2; c++) {
			cfg = (c == 1) ? "native" : "null"
			k = cfg SUBSEP op; m = n[k]
			if (m == 0) { cell[c] = "-"; med[c] = 0; continue }
			delete a; lo = 1e18; hi = -1e18
			for (i = 1; i <= m; i++) {
				x = v[k, i]
				if (op ~ /^seq/) x = size / x
				a[i] = x; if (x < lo) lo = x; if (x > hi) hi = x
			}
			med[c] = median(a, m)
			if (op ~ /^seq/) cell[c] = sprintf("%.0f MiB/s (%.0f..%.0f)", med[c], lo, hi)
			else if (op == "rss_mib") cell[c] = sprintf("%.1f MiB (%.1f..%.1f)", med[c], lo, hi)
			else cell[c] = sprintf("%.3f s (%.3f..%.3f)", med[c], lo, hi)
		}
		goal = "-"; ratio = "-"
		if (op ~ /^seq/) { ratio = sprintf("%.2f (throughput)", med[2] / med[1]); goal = ">= 0.90" }
		else if (op == "rss_mib") { goal = "< 50 MiB" }
		else { ratio = sprintf("%.2fx (time)", med[2] / med[1]); goal = (op == "ls_lR_warm") ? "<= 2x" : "<= 2x" }
		printf "| %s | %s | %s | %s | %s |\n", op, cell[1], cell[2], ratio, goal
	}
}' "$RAW")
echo
echo "$table"
echo
echo "runs: $RUNS per configuration; tree: $NFILES entries; seq file: $SIZE MiB; raw: $RAW"
if [ -n "$OUT" ]; then
	{ echo "$table"; echo; echo "Raw results (config,operation,seconds or MiB):"; echo; echo '```'; cat "$RAW"; echo '```'; } > "$OUT"
fi
rm -rf "$W/native" "$W/lower" "$TREE"
