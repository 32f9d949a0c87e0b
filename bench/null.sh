#!/usr/bin/env bash
# bench/null.sh: native ext4 against the cairn `null` stack (local + null), in
# one run: 1 GiB sequential write and read, untar of ~10,000 small files,
# ls -lR of the tree (cold and warm), rm -rf of it, and the daemon's resident
# memory after the untar. Each figure is the median of --runs runs, with its
# spread (min..max); ratios are to native.
#
# Usage: sudo bench/null.sh [--runs N] [--dir DIR] [--size MiB] [--out FILE.md]
#                           [--bin NAME=CAIRN]...
#
#   --dir DIR   an (ext4) directory to work in; by default the script makes a
#               16 GiB ext4 image at $CAIRN_BENCH_IMG (default
#               /var/tmp/cairn-bench.img), loop-mounts it with direct I/O and
#               no discard, and removes it at the end.
#   --runs N    runs per configuration (default 5, at least 3)
#   --size MiB  size of the sequential file (default 1024)
#   --out FILE  also write the result table (markdown) to FILE
#   --bin NAME=CAIRN  a configuration NAME: the null stack served by the
#               binary CAIRN (repeat to compare builds, e.g. before and after
#               a change, interleaved run by run); default: null=bin/cairn,
#               built from this tree
#
# Needs root (to drop caches), fuse3, Go, tar and xz. Run from the repo root.
set -euo pipefail

RUNS=5 DIR= SIZE=1024 OUT=
BINS=()
while [ $# -gt 0 ]; do
	case "$1" in
	--runs) RUNS=$2; shift 2 ;;
	--dir) DIR=$2; shift 2 ;;
	--size) SIZE=$2; shift 2 ;;
	--out) OUT=$2; shift 2 ;;
	--bin) BINS+=("$2"); shift 2 ;;
	-h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
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
	mountpoint -q "$MNT" && { fusermount3 -u "$MNT" || umount -l "$MNT"; }
	rmdir "$MNT" 2>/dev/null
	scratch_ext4_remove
}
trap cleanup EXIT
scratch_ext4 16G /var/tmp/cairn-bench.img
W=$DIR/$TAG
mkdir -p "$W/native" "$W/lower" "$MNT"

if [ ${#BINS[@]} = 0 ]; then
	echo "building cairn..." >&2
	(cd "$REPO" && go build -o bin/cairn ./cmd/cairn)
	BINS=("null=$REPO/bin/cairn")
fi
declare -A BIN
CFGS=(native)
for b in "${BINS[@]}"; do
	[ -x "${b#*=}" ] || { echo "null.sh: --bin $b: no such executable" >&2; exit 2; }
	BIN[${b%%=*}]=${b#*=}
	CFGS+=("${b%%=*}")
done

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
	echo "$cfg,$name,$(echo "$t1 - $t0" | bc -l),$(cut -d' ' -f1 /proc/loadavg)" >> "$RAW"
}
daemon_pid() { pgrep -f -- " mount $W/null.toml $MNT\$" | head -1; }
up() { "${BIN[$cfg]}" mount "$W/null.toml" "$MNT"; }
down() { "${BIN[$cfg]}" umount "$MNT"; }

onerun() { # onerun CONFIG
	local cfg=$1 d
	if [ "$cfg" = native ]; then d=$W/native; else up; d=$MNT; fi
	dropcaches
	timed seqwrite "$cfg" dd if=/dev/zero of="$d/big" bs=1M count="$SIZE" conv=fsync status=none
	if [ "$cfg" != native ]; then down; dropcaches; up; else dropcaches; fi
	timed seqread_cold "$cfg" dd if="$d/big" of=/dev/null bs=1M status=none
	timed seqread_warm "$cfg" dd if="$d/big" of=/dev/null bs=1M status=none
	rm -f "$d/big"
	dropcaches
	cat "$TREE" > /dev/null # the tarball itself comes from the page cache
	timed untar "$cfg" tar -xf "$TREE" -C "$d"
	if [ "$cfg" != native ]; then
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
	[ "$cfg" != native ] && down
	return 0
}

for r in $(seq 1 "$RUNS"); do
	for cfg in "${CFGS[@]}"; do
		echo "run $r/$RUNS: $cfg" >&2
		onerun "$cfg"
	done
done

# Summary: medians with min..max; throughput for seq I/O, time otherwise.
table=$(awk -F, -v size="$SIZE" -v cfgs="${CFGS[*]}" '
function median(a, n,   i, j, t) {
	for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j+1] = a[j]; a[j+1] = t }
	return (n % 2) ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
}
{ k = $1 SUBSEP $2; n[k]++; v[k, n[k]] = $3; if (NF > 3) { nl[$1]++; l[$1, nl[$1]] = $4 } }
END {
	nc = split(cfgs, cf, " ")
	split("seqwrite seqread_cold seqread_warm untar ls_lR_cold ls_lR_warm rm_rf rss_mib", ops, " ")
	hdr = "| operation |"; sep = "| --- |"
	for (c = 1; c <= nc; c++) { hdr = hdr " " cf[c] " |"; sep = sep " --- |" }
	for (c = 2; c <= nc; c++) { hdr = hdr " " cf[c] "/native |"; sep = sep " --- |" }
	print hdr " goal |"; print sep " --- |"
	for (o = 1; o <= 8; o++) {
		op = ops[o]; row = "| " op " |"
		for (c = 1; c <= nc; c++) {
			k = cf[c] SUBSEP op; m = n[k]
			if (m == 0) { row = row " - |"; med[c] = 0; continue }
			delete a; lo = 1e18; hi = -1e18
			for (i = 1; i <= m; i++) {
				x = v[k, i]
				if (op ~ /^seq/) x = size / x
				a[i] = x; if (x < lo) lo = x; if (x > hi) hi = x
			}
			med[c] = median(a, m)
			if (op ~ /^seq/) row = row sprintf(" %.0f MiB/s (%.0f..%.0f) |", med[c], lo, hi)
			else if (op == "rss_mib") row = row sprintf(" %.1f MiB (%.1f..%.1f) |", med[c], lo, hi)
			else row = row sprintf(" %.3f s (%.3f..%.3f) |", med[c], lo, hi)
		}
		goal = "-"
		if (op ~ /^seq/) goal = ">= 0.90"
		else if (op == "rss_mib") goal = "< 50 MiB"
		else goal = "<= 2x"
		for (c = 2; c <= nc; c++) {
			if (op == "rss_mib" || med[1] == 0) row = row " - |"
			else if (op ~ /^seq/) row = row sprintf(" %.2f (throughput) |", med[c] / med[1])
			else row = row sprintf(" %.2fx (time) |", med[c] / med[1])
		}
		print row " " goal " |"
	}
	row = "| load average (median 1-min) |"
	for (c = 1; c <= nc; c++) {
		m = nl[cf[c]]; delete a
		for (i = 1; i <= m; i++) a[i] = l[cf[c], i]
		row = row (m ? sprintf(" %.2f |", median(a, m)) : " - |")
	}
	for (c = 2; c <= nc; c++) row = row " |"
	print row " |"
}' "$RAW")
echo
echo "$table"
echo
echo "runs: $RUNS per configuration; tree: $NFILES entries; seq file: $SIZE MiB; raw: $RAW"
if [ -n "$OUT" ]; then
	{ echo "$table"; echo; echo "Raw results (config,operation,seconds or MiB,load average):"; echo; echo '```'; cat "$RAW"; echo '```'; } > "$OUT"
fi
rm -rf "$W/native" "$W/lower" "$TREE"
