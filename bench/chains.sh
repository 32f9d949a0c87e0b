#!/usr/bin/env bash
# bench/chains.sh: MonA's Figures 6-8 (seed 004, issue 18) for the chains
# layer: the cost of open+close of an unguarded file and of files guarded by
# 1, 5 and 25 `copy` links (the identity: the framework, not a codec), and
# of open+read+close and open+write+close of 1 KiB to 1 MiB, against native
# ext4, the null stack and a single `copy` layer. Warm (the files were just
# written and read). Each figure is the median of --runs runs (min..max);
# the 1-minute load average is shown, since the machine may be shared.
#
# Usage: sudo bench/chains.sh [--runs N] [--dir DIR] [--out FILE.md]
#
#   --dir DIR   an (ext4) directory to work in; by default a 4 GiB ext4
#               image at $CAIRN_BENCH_IMG (default /var/tmp/cairn-chains.img)
#               on a loop device with direct I/O, removed at the end.
#   --runs N    runs per configuration (default 3)
#   --out FILE  also write the tables (markdown) to FILE
#
# Needs root (loop device), fuse3 and Go. Run from the repo root.
set -euo pipefail

RUNS=3 DIR= OUT=
while [ $# -gt 0 ]; do
	case "$1" in
	--runs) RUNS=$2; shift 2 ;;
	--dir) DIR=$2; shift 2 ;;
	--out) OUT=$2; shift 2 ;;
	-h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "chains.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
done
[ "$(id -u)" = 0 ] || { echo "chains.sh: needs root (loop device, mounts)" >&2; exit 2; }
REPO=$(cd "$(dirname "$0")/.." && pwd)
TAG=cairn-chains-bench-$$
MNT=/tmp/$TAG-mnt
LOOP= IMG=
. "$REPO/bench/lib.sh"
cleanup() {
	set +e
	mountpoint -q "$MNT" && { fusermount3 -u "$MNT" || umount -l "$MNT"; }
	rmdir "$MNT" 2>/dev/null
	rm -rf "${W:?}"
	scratch_ext4_remove
}
trap cleanup EXIT
scratch_ext4 4G /var/tmp/cairn-chains.img
W=$DIR/$TAG
mkdir -p "$W" "$MNT"
echo "building cairn and chainsbench..." >&2
(cd "$REPO" && go build -o bin/cairn ./cmd/cairn && go build -o bin/chainsbench ./bench/chainsbench)
CAIRN=$REPO/bin/cairn BENCH=$REPO/bin/chainsbench

# spec NAME: the spec of a configuration over $W/lower.
spec() {
	local top=top
	printf 'mount = "top"\n[layer.base]\ntype = "local"\npath = "%s"\n' "$W/lower"
	case "$1" in
	null) printf '[layer.top]\ntype = "null"\nover = "base"\n' ;;
	copy-layer) printf '[layer.top]\ntype = "copy"\nover = "base"\n' ;;
	chains-unguarded) printf '[layer.top]\ntype = "chains"\nover = "base"\n' ;;
	chains-copy*)
		local n=${1#chains-copy} links
		links=$(for _ in $(seq "$n"); do printf '"copy",'; done)
		printf '[layer.top]\ntype = "chains"\nover = "base"\n[[rule]]\nlayer = "top"\nmatch = "**"\nchain = [%s]\n' "${links%,}" ;;
	esac
}

RAW=$W/raw.csv
: > "$RAW"
CFGS=(native null chains-unguarded chains-copy1 chains-copy5 chains-copy25 copy-layer)
for r in $(seq 1 "$RUNS"); do
	for cfg in "${CFGS[@]}"; do
		echo "run $r/$RUNS: $cfg (load $(cut -d' ' -f1 /proc/loadavg))" >&2
		rm -rf "$W/lower" "$W/native"; mkdir -p "$W/lower" "$W/native"
		rw=true
		case "$cfg" in chains-copy5|chains-copy25) rw=false ;; esac
		if [ "$cfg" = native ]; then
			"$BENCH" -dir "$W/native" -config "$cfg" -rw=$rw >> "$RAW"
		else
			spec "$cfg" > "$W/spec.toml"
			"$CAIRN" mount "$W/spec.toml" "$MNT"
			"$BENCH" -dir "$MNT" -config "$cfg" -rw=$rw >> "$RAW"
			"$CAIRN" umount "$MNT"
		fi
	done
done

table=$(awk -F, -v cfgs="${CFGS[*]}" '
function median(a, n,   i, j, t) {
	for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j+1] = a[j]; a[j+1] = t }
	return (n % 2) ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
}
function cell(k,   m, i, lo, hi) {
	m = n[k]; if (m == 0) return "-"
	delete a; lo = 1e18; hi = -1e18
	for (i = 1; i <= m; i++) { a[i] = v[k, i] * 1e6; if (a[i] < lo) lo = a[i]; if (a[i] > hi) hi = a[i] }
	med = median(a, m)
	return sprintf("%.1f (%.1f..%.1f)", med, lo, hi)
}
{ k = $1 SUBSEP $2 SUBSEP $3; n[k]++; v[k, n[k]] = $4; ops[$2 SUBSEP $3] = 1; nl[$1]++; l[$1, nl[$1]] = $5 }
END {
	nc = split(cfgs, cf, " ")
	print "Figure 6: open+close of an existing file, µs (median, min..max)\n"
	print "| configuration | open+close µs | added to native µs |"
	print "| --- | --- | --- |"
	base = 0
	for (c = 1; c <= nc; c++) {
		s = cell(cf[c] SUBSEP "open" SUBSEP "0")
		if (c == 1) base = med
		printf "| %s | %s | %+.1f |\n", cf[c], s, med - base
	}
	for (o = 1; o <= 2; o++) {
		op = (o == 1) ? "read" : "write"
		printf "\nFigure %d: open+%s+close, µs per operation (median, min..max)\n\n", 6 + o, op
		hdr = "| size |"; sep = "| --- |"
		for (c = 1; c <= nc; c++) if (cf[c] != "chains-copy5" && cf[c] != "chains-copy25") { hdr = hdr " " cf[c] " |"; sep = sep " --- |" }
		print hdr " unguarded/null | copy1/copy-layer |"; print sep " --- | --- |"
		for (size = 1024; size <= 1048576; size *= 4) {
			row = "| " size " |"
			for (c = 1; c <= nc; c++) {
				if (cf[c] == "chains-copy5" || cf[c] == "chains-copy25") continue
				row = row " " cell(cf[c] SUBSEP op SUBSEP size) " |"; m_[cf[c]] = med
			}
			row = row sprintf(" %.2f | %.2f |", m_["chains-unguarded"] / m_["null"], m_["chains-copy1"] / m_["copy-layer"])
			print row
		}
	}
	printf "\nload average (1-min) while measuring:"
	for (c = 1; c <= nc; c++) { m = nl[cf[c]]; delete a; for (i = 1; i <= m; i++) a[i] = l[cf[c], i]; printf " %s %.2f;", cf[c], median(a, m) }
	print ""
}' "$RAW")
echo
echo "$table"
echo
echo "runs: $RUNS; cores: $(nproc); kernel: $(uname -r)"
if [ -n "$OUT" ]; then
	{ echo "$table"; echo; echo "runs: $RUNS; cores: $(nproc); kernel: $(uname -r)"; echo; echo '```'; cat "$RAW"; echo '```'; } > "$OUT"
fi
