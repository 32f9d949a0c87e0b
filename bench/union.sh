#!/usr/bin/env bash
# bench/union.sh: cairn's union layer against the union file systems people
# use (mergerfs, fuse-overlayfs, unionfs-fuse) and the kernel's overlayfs,
# in one run, configurations interleaved run by run (issue 15). Two forms:
#
#   rorw     a union of a read-only lower branch, prefilled with a data set
#            (8 copies of the GNU grep 3.8 source, ~10,000 entries, and a
#            file of --size MiB), and an empty writable upper, both on one
#            ext4 file system (as overlayfs is used). Configurations:
#            native (the lower itself, or a plain directory for writes),
#            overlayfs (mount -t overlay: the physical limit), cairn
#            ('union:UPPER:LOWER'), fuse-overlayfs, unionfs-fuse (-o cow,
#            UPPER=RW:LOWER=RO), mergerfs (UPPER=RW:LOWER=RO; it has no
#            copy-up or whiteouts: it cannot remove lower data, and it opens
#            a lower file for writing in place, so its copy-up is not run).
#   twodisk  a mergerfs-style union of two writable disks (two loop ext4
#            images), the data set spread over both (each directory on both,
#            its files alternately on one and the other). Configurations:
#            native (the whole data set on one disk), cairn
#            ('union(modes=RW+RW,create=epmfs):D1:D2'), mergerfs (D1:D2, its
#            default policy epmfs), unionfs-fuse (D1=RW:D2=RW). overlayfs and
#            fuse-overlayfs have one upper only.
#
# Workloads (each run on a fresh upper; "cold" = unmount, sync, drop caches,
# mount again):
#   grep       grep -r of the data set through the union (cold): lookups
#              that go past the upper, reads of lower files
#   ls_cold, ls_warm   ls -lR of the merged tree
#   untar      tar -xf of the same tree into the union, then sync (creates
#              on the upper)
#   rm_rf      rm -rf of the data set, then sync (rorw: whiteouts over the
#              lower; native: rm -rf of the untarred copy)
#   seqwrite   dd of --size MiB into a new file, conv=fsync
#   seqread    dd of that file, cold
#   lowerread  (rorw) dd of the lower's --size MiB file through the union, cold
#   copyup     (rorw) open the lower's --size MiB file for appending (a
#              copy-up), then sync, cold; native: cp LOWER/big UPPER/big; sync
#   dc_create, dc_ls, dc_rm   pefs's directory cache: 3000 empty files made in
#              one directory, ls -Al of it, their removal
#   compile    tar -xJf, ./configure, make -j2 of GNU grep 3.8 in the
#              union (the large compile; minutes a run: only with --compile
#              or --workloads compile)
#
# Each figure is the median of --runs runs with its range; throughput for
# the dd figures, seconds otherwise; ratios of cairn's medians to native's,
# to overlayfs's and to the best FUSE peer's; the median 1-minute load
# average over each configuration's measurements.
#
# Usage: sudo bench/union.sh [--runs N] [--forms rorw,twodisk] [--configs a,b]
#                            [--workloads a,b] [--size MiB] [--compile]
#                            [--dir D --dir2 D2] [--out FILE.md]
#
#   --workloads    a subset of: grep ls untar rm stream copyup dircache
#                  compile (default: all but compile; --compile adds it)
#   --dir, --dir2  ext4 directories to work in (two file systems for
#                  twodisk); by default the script makes ext4 images at
#                  $CAIRN_BENCH_IMG (default /var/tmp/cairn-union-bench.img,
#                  16 GiB) and IMG.2 (8 GiB), each on a loop device with
#                  direct I/O and no discard, and removes them at the end.
#   --configs      a subset of the configurations above (native is always
#                  run); cairn-noxattr (cairn --no-xattr, the feature set of
#                  unionfs-fuse, which has no xattrs) runs only when named
#   --out FILE     also write the result tables (markdown) and the raw
#                  figures to FILE
#
# Needs root, fuse3, Go, tar, xz, perl, and the peers (installed from Debian
# when missing: mergerfs fuse-overlayfs unionfs-fuse). Run from the repo root.
set -euo pipefail

RUNS=3 DIR= DIR2= SIZE=1024 OUT= FORMS=rorw,twodisk CONFIGS= COMPILE=0
WORKLOADS=grep,ls,untar,rm,stream,copyup,dircache
while [ $# -gt 0 ]; do
	case "$1" in
	--runs) RUNS=$2; shift 2 ;;
	--dir) DIR=$2; shift 2 ;;
	--dir2) DIR2=$2; shift 2 ;;
	--size) SIZE=$2; shift 2 ;;
	--out) OUT=$2; shift 2 ;;
	--forms) FORMS=$2; shift 2 ;;
	--configs) CONFIGS=$2; shift 2 ;;
	--compile) COMPILE=1; shift ;;
	--workloads) WORKLOADS=$2; shift 2 ;;
	-h|--help) sed -n '2,67p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "union.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
done
[ "$(id -u)" = 0 ] || { echo "union.sh: needs root (drop_caches, mounts)" >&2; exit 2; }
[ "$COMPILE" = 0 ] || WORKLOADS=$WORKLOADS,compile
w() { case ",$WORKLOADS," in *,"$1",*) true ;; *) false ;; esac; }
[ "$RUNS" -ge 1 ] || { echo "union.sh: --runs must be at least 1" >&2; exit 2; }
REPO=$(cd "$(dirname "$0")/.." && pwd)
GREP_TAR=${CAIRN_BENCH_TARBALL:-$REPO/../shared/bench/grep_3.8.orig.tar.xz}
[ -f "$GREP_TAR" ] || { echo "union.sh: $GREP_TAR not found (set CAIRN_BENCH_TARBALL)" >&2; exit 2; }
export PATH=$PATH:/usr/local/go/bin

missing=
for p in fuse3 mergerfs fuse-overlayfs unionfs-fuse perl xz-utils; do
	dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing="$missing $p"
done
if [ -n "$missing" ]; then
	echo "union.sh: installing$missing" >&2
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
fi

TAG=cairn-union-bench-$$
MNT=/tmp/$TAG-mnt
LOOP= IMG= LOOP2= IMG2= MADE2=
. "$REPO/bench/lib.sh"
CAIRN=$REPO/bin/cairn
cleanup() {
	set +e
	if mountpoint -q "$MNT"; then umount "$MNT" 2>/dev/null || fusermount3 -u "$MNT" || umount -l "$MNT"; fi
	rmdir "$MNT" 2>/dev/null
	[ -n "${W:-}" ] && rm -rf "$W"
	[ -n "${W2:-}" ] && rm -rf "$W2"
	if [ -n "$MADE2" ]; then umount "$DIR2" && losetup -d "$LOOP2"; rmdir "$DIR2"; rm -f "$IMG2"; fi
	scratch_ext4_remove
}
trap cleanup EXIT
echo "building cairn..." >&2
(cd "$REPO" && go build -o bin/cairn ./cmd/cairn)
scratch_ext4 16G /var/tmp/cairn-union-bench.img
W=$DIR/$TAG
mkdir -p "$W" "$MNT"
case ",$FORMS," in
*,twodisk,*)
	if [ -z "$DIR2" ]; then
		IMG2=${IMG:-/var/tmp/cairn-union-bench.img}.2
		[ -e "$IMG2" ] && { echo "union.sh: $IMG2 exists" >&2; exit 2; }
		truncate -s 8G "$IMG2"
		mkfs.ext4 -q -F -E nodiscard,lazy_itable_init=0,lazy_journal_init=0 "$IMG2"
		LOOP2=$(losetup -f --show --direct-io=on "$IMG2")
		DIR2=/tmp/$TAG-ext4-2
		mkdir -p "$DIR2"
		mount -o nodiscard "$LOOP2" "$DIR2"
		MADE2=1
	fi
	W2=$DIR2/$TAG
	mkdir -p "$W2"
	;;
esac

# The data set: the grep tree (lib.sh), and for twodisk its two halves.
TREE=$W/tree.tar
grep_tree "$GREP_TAR" "$TREE"
NFILES=$(tar -tf "$TREE" | wc -l)
mkdir -p "$W/lower/tree"
tar -xf "$TREE" -C "$W/lower/tree"
dd if=/dev/urandom of="$W/lower/big" bs=1M count="$SIZE" status=none
touch "$W/lower.stamp"
if [ -n "${W2:-}" ]; then
	# Every directory on both halves; regular files alternately on each.
	for h in 1 2; do
		mkdir -p "$W/half$h"
		tar -xf "$TREE" -C "$W/half$h"
		(cd "$W/half$h" && find . -type f | sort | awk -v h="$h" 'NR % 2 == h - 1' | xargs -d '\n' rm -f)
		tar -cf "$W/half$h.tar" -C "$W/half$h" .
		rm -rf "$W/half$h"
	done
fi

RAW=$W/raw.csv
: >"$RAW"
dropcaches() { sync; echo 3 >/proc/sys/vm/drop_caches; }
now() { echo "$EPOCHREALTIME"; }
load1() { cut -d' ' -f1 /proc/loadavg; }
# timed FORM CONFIG RUN OP COMMAND...: records the command's elapsed
# seconds, or "fail" if it fails (a peer that cannot do it).
timed() {
	local form=$1 cfg=$2 run=$3 op=$4 t0 t1 v; shift 4
	t0=$(now)
	if "$@" >>"$W/cmd.log" 2>&1; then
		t1=$(now)
		v=$(echo "$t1 - $t0" | bc -l)
	else
		v=fail
		echo "$form $cfg run $run: $op failed" >&2
	fi
	echo "$form,$cfg,$op,$run,$v,$(load1)" >>"$RAW"
}

# mounted CONFIG FORM UPPER LOWER WORK: mount the configuration at MNT.
up() {
	local cfg=$1 form=$2 a=$3 b=$4 wk=$5
	case "$cfg/$form" in
	overlayfs/rorw) mount -t overlay overlay -o "lowerdir=$b,upperdir=$a,workdir=$wk" "$MNT" ;;
	fuse-overlayfs/rorw) fuse-overlayfs -o "lowerdir=$b,upperdir=$a,workdir=$wk" "$MNT" ;;
	cairn/rorw) "$CAIRN" mount --log-file "$W/cairn.log" "union:$a:$b" "$MNT" ;;
	cairn/twodisk) "$CAIRN" mount --log-file "$W/cairn.log" "union(modes=RW+RW,create=epmfs):$a:$b" "$MNT" ;;
	cairn-noxattr/rorw) "$CAIRN" mount --no-xattr --log-file "$W/cairn.log" "union:$a:$b" "$MNT" ;;
	cairn-noxattr/twodisk) "$CAIRN" mount --no-xattr --log-file "$W/cairn.log" "union(modes=RW+RW,create=epmfs):$a:$b" "$MNT" ;;
	unionfs-fuse/rorw) unionfs -o cow "$a=RW:$b=RO" "$MNT" ;;
	unionfs-fuse/twodisk) unionfs -o cow "$a=RW:$b=RW" "$MNT" ;;
	mergerfs/rorw) mergerfs "$a=RW:$b=RO" "$MNT" ;;
	mergerfs/twodisk) mergerfs "$a:$b" "$MNT" ;;
	*) echo "union.sh: no configuration $cfg for $form" >&2; return 1 ;;
	esac
	local i
	for i in $(seq 50); do mountpoint -q "$MNT" && return 0; sleep 0.1; done
	echo "union.sh: $cfg did not mount" >&2
	return 1
}
down() {
	local i
	for i in $(seq 50); do
		case "$1" in
		overlayfs) umount "$MNT" 2>/dev/null ;;
		cairn*) "$CAIRN" umount "$MNT" 2>/dev/null ;;
		*) fusermount3 -u "$MNT" 2>/dev/null ;;
		esac && break
		sleep 0.2
	done
	! mountpoint -q "$MNT"
}

# dircache DIR: pefs's directory cache workload (3000 files).
dircache() {
	local form=$1 cfg=$2 run=$3 d=$4/dc
	mkdir "$d"
	timed "$form" "$cfg" "$run" dc_create perl -MFcntl -e 'for (0..2999) { sysopen(my $f, sprintf("%s/file%05d", $ARGV[0], $_), O_CREAT|O_EXCL|O_WRONLY, 0644) or die "create: $!"; close $f }' "$d"
	timed "$form" "$cfg" "$run" dc_ls sh -c "ls -Al '$d' >/dev/null"
	timed "$form" "$cfg" "$run" dc_rm perl -e 'for (0..2999) { unlink(sprintf("%s/file%05d", $ARGV[0], $_)) or die "unlink: $!" }' "$d"
	rmdir "$d"
}

compile() {
	local form=$1 cfg=$2 run=$3 d=$4
	cat "$GREP_TAR" >/dev/null
	timed "$form" "$cfg" "$run" compile sh -c "cd '$d' && tar -xJf '$GREP_TAR' && cd grep-3.8 && ./configure --quiet >/dev/null && make -j2 >/dev/null 2>&1"
}

# rorw_run CONFIG RUN
rorw_run() {
	local cfg=$1 run=$2 f=rorw
	local upd=$W/up-$cfg wk=$W/wk-$cfg d=$MNT lower=$W/lower
	rm -rf "$upd" "$wk"
	mkdir -p "$upd" "$wk"
	cold() { if [ "$cfg" = native ]; then dropcaches; else down "$cfg" && dropcaches && up "$cfg" $f "$upd" "$lower" "$wk"; fi; }
	if [ "$cfg" = native ]; then d=$upd; else up "$cfg" $f "$upd" "$lower" "$wk"; fi
	local src=$d # where the data set is seen
	[ "$cfg" = native ] && src=$lower
	if w grep; then
		cold
		timed $f "$cfg" "$run" grep sh -c "grep -r -c zqxjkv '$src/tree' >/dev/null; [ \$? -le 1 ]"
	fi
	if w ls; then
		cold
		timed $f "$cfg" "$run" ls_cold sh -c "ls -lR '$src' >/dev/null"
		timed $f "$cfg" "$run" ls_warm sh -c "ls -lR '$src' >/dev/null"
	fi
	if w untar || { w rm && [ "$cfg" = native ]; }; then
		cat "$TREE" >/dev/null
		timed $f "$cfg" "$run" untar sh -c "mkdir '$d/new' && tar -xf '$TREE' -C '$d/new' && sync"
	fi
	if w rm; then
		if [ "$cfg" = native ]; then
			timed $f "$cfg" "$run" rm_rf sh -c "rm -rf '$d/new' && sync"
		else
			timed $f "$cfg" "$run" rm_rf sh -c "rm -rf '$d/tree' && sync"
		fi
	fi
	if w stream; then
		cold
		timed $f "$cfg" "$run" seqwrite dd if=/dev/zero of="$d/stream" bs=1M count="$SIZE" conv=fsync status=none
		cold
		timed $f "$cfg" "$run" seqread dd if="$d/stream" of=/dev/null bs=1M status=none
		cold
		timed $f "$cfg" "$run" lowerread dd if="$src/big" of=/dev/null bs=1M status=none
	fi
	if w copyup; then
		cold
		case $cfg in
		native) timed $f "$cfg" "$run" copyup sh -c "cp '$lower/big' '$d/big' && sync" ;;
		mergerfs) ;; # no copy-up: it would open the read-only branch's file for writing in place
		*) timed $f "$cfg" "$run" copyup sh -c ": >>'$d/big' && sync" ;;
		esac
	fi
	if w dircache; then dircache $f "$cfg" "$run" "$d"; fi
	if w compile; then compile $f "$cfg" "$run" "$d"; fi
	[ "$cfg" = native ] || down "$cfg"
	rm -rf "$upd" "$wk"
}

# twodisk_run CONFIG RUN
twodisk_run() {
	local cfg=$1 run=$2 f=twodisk
	local d1=$W/b1 d2=$W2/b2 d=$MNT
	rm -rf "$d1" "$d2"
	mkdir -p "$d1" "$d2"
	if [ "$cfg" = native ]; then
		tar -xf "$TREE" -C "$d1"
		d=$d1
	else
		tar -xf "$W/half1.tar" -C "$d1"
		tar -xf "$W/half2.tar" -C "$d2"
		up "$cfg" $f "$d1" "$d2" ""
	fi
	cold() { if [ "$cfg" = native ]; then dropcaches; else down "$cfg" && dropcaches && up "$cfg" $f "$d1" "$d2" ""; fi; }
	if w grep; then
		cold
		timed $f "$cfg" "$run" grep sh -c "grep -r -c zqxjkv '$d' >/dev/null; [ \$? -le 1 ]"
	fi
	if w ls; then
		cold
		timed $f "$cfg" "$run" ls_cold sh -c "ls -lR '$d' >/dev/null"
		timed $f "$cfg" "$run" ls_warm sh -c "ls -lR '$d' >/dev/null"
	fi
	if w untar; then
		cat "$TREE" >/dev/null
		timed $f "$cfg" "$run" untar sh -c "mkdir '$d/new' && tar -xf '$TREE' -C '$d/new' && sync"
	fi
	if w rm; then timed $f "$cfg" "$run" rm_rf sh -c "rm -rf '$d'/copy* && sync"; fi
	if w stream; then
		cold
		timed $f "$cfg" "$run" seqwrite dd if=/dev/zero of="$d/stream" bs=1M count="$SIZE" conv=fsync status=none
		cold
		timed $f "$cfg" "$run" seqread dd if="$d/stream" of=/dev/null bs=1M status=none
	fi
	if w dircache; then dircache $f "$cfg" "$run" "$d"; fi
	if w compile; then compile $f "$cfg" "$run" "$d"; fi
	[ "$cfg" = native ] || down "$cfg"
	rm -rf "$d1" "$d2"
}

want() { [ -z "$CONFIGS" ] || [ "$1" = native ] || case ",$CONFIGS," in *,"$1",*) true ;; *) false ;; esac; }
RORW=() TWO=()
# cairn-noxattr (cairn --no-xattr: no extended attributes, the feature set
# of unionfs-fuse as Debian builds it) only when --configs names it.
named() { case ",$CONFIGS," in *,"$1",*) true ;; *) false ;; esac; }
for c in native overlayfs cairn cairn-noxattr fuse-overlayfs unionfs-fuse mergerfs; do
	want "$c" && { [ "$c" != cairn-noxattr ] || named "$c"; } && RORW+=("$c")
done
for c in native cairn cairn-noxattr mergerfs unionfs-fuse; do
	want "$c" && { [ "$c" != cairn-noxattr ] || named "$c"; } && TWO+=("$c")
done

echo "load average at start: $(cat /proc/loadavg)" >&2
for r in $(seq 1 "$RUNS"); do
	case ",$FORMS," in *,rorw,*)
		for c in "${RORW[@]}"; do echo "run $r/$RUNS: rorw $c" >&2; rorw_run "$c" "$r"; done ;;
	esac
	case ",$FORMS," in *,twodisk,*)
		for c in "${TWO[@]}"; do echo "run $r/$RUNS: twodisk $c" >&2; twodisk_run "$c" "$r"; done ;;
	esac
done
# The union never wrote to its read-only lower.
changed=$(find "$W/lower" -newer "$W/lower.stamp" | wc -l)
[ "$changed" = 0 ] || echo "union.sh: WARNING: $changed entries of the read-only lower changed" >&2

# Summary per form: medians (min..max); MiB/s for the dd figures.
summary() {
	awk -F, -v form="$1" -v size="$SIZE" -v cfgs="$2" '
function median(a, n,   i, j, t) {
	for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j+1] = a[j]; a[j+1] = t }
	return (n % 2) ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
}
function tput(op) { return op ~ /^(seqwrite|seqread|lowerread|copyup)$/ }
$1 == form {
	k = $2 SUBSEP $3; n[k]++; v[k, n[k]] = $5
	nl[$2]++; l[$2, nl[$2]] = $6
}
END {
	nc = split(cfgs, cf, " ")
	split("grep ls_cold ls_warm untar rm_rf seqwrite seqread lowerread copyup dc_create dc_ls dc_rm compile", ops, " ")
	hdr = "| operation |"; sep = "| --- |"
	for (c = 1; c <= nc; c++) { hdr = hdr " " cf[c] " |"; sep = sep " --- |" }
	hdr = hdr " cairn/native | cairn/overlayfs | cairn/best FUSE peer |"; sep = sep " --- | --- | --- |"
	print hdr; print sep
	for (o = 1; o in ops; o++) {
		op = ops[o]; row = "| " op (tput(op) ? " (MiB/s)" : " (s)") " |"; any = 0
		delete med
		for (c = 1; c <= nc; c++) {
			k = cf[c] SUBSEP op; m = n[k]; fails = 0; cnt = 0
			delete a; lo = 1e18; hi = -1e18
			for (i = 1; i <= m; i++) {
				x = v[k, i]
				if (x == "fail") { fails++; continue }
				if (tput(op)) x = size / x
				a[++cnt] = x; if (x < lo) lo = x; if (x > hi) hi = x
			}
			if (m == 0) { row = row " - |"; continue }
			any = 1
			if (cnt == 0) { row = row " fails |"; continue }
			med[cf[c]] = median(a, cnt)
			fmt = tput(op) ? "%.0f (%.0f..%.0f)" : "%.2f (%.2f..%.2f)"
			row = row " " sprintf(fmt, med[cf[c]], lo, hi) (fails ? sprintf(" [%d failed]", fails) : "") " |"
		}
		if (!any) continue
		# Ratios as "times slower" (>1: cairn is slower).
		r1 = r2 = r3 = "-"
		if ("cairn" in med) {
			cm = med["cairn"]
			if ("native" in med) r1 = sprintf("%.2fx", tput(op) ? med["native"] / cm : cm / med["native"])
			if ("overlayfs" in med) r2 = sprintf("%.2fx", tput(op) ? med["overlayfs"] / cm : cm / med["overlayfs"])
			best = ""; bv = 0
			for (c = 1; c <= nc; c++) {
				p = cf[c]
				if (p == "native" || p == "overlayfs" || p ~ /^cairn/ || !(p in med)) continue
				if (best == "" || (tput(op) ? med[p] > bv : med[p] < bv)) { best = p; bv = med[p] }
			}
			if (best != "") r3 = sprintf("%.2fx (%s)", tput(op) ? bv / cm : cm / bv, best)
		}
		print row " " r1 " | " r2 " | " r3 " |"
	}
	row = "| load average (median of 1-min) |"
	for (c = 1; c <= nc; c++) {
		m = nl[cf[c]]; delete a
		for (i = 1; i <= m; i++) a[i] = l[cf[c], i]
		row = row (m ? sprintf(" %.2f |", median(a, m)) : " - |")
	}
	print row " | | |"
}' "$RAW"
}

report=
case ",$FORMS," in *,rorw,*)
	report+="### One read-only lower (the data set) and one empty writable upper, on one ext4"$'\n\n'
	report+="$(summary rorw "${RORW[*]}")"$'\n\n' ;;
esac
case ",$FORMS," in *,twodisk,*)
	report+="### Two writable disks (two loop ext4 images), the data set spread over both"$'\n\n'
	report+="$(summary twodisk "${TWO[*]}")"$'\n\n' ;;
esac
report+="Ratios are cairn's time over the other's (for MiB/s figures: the other's throughput over cairn's): above 1, cairn is slower."$'\n'
report+="runs: $RUNS per configuration, interleaved; tree: $NFILES entries; big files: $SIZE MiB; cairn passthrough: $(grep -o '"passthrough":[a-z]*' "$W/cairn.log" 2>/dev/null | sort -u | tr '\n' ' ')"
echo
echo "$report"
echo "raw: $RAW"
if [ -n "$OUT" ]; then
	{
		echo "$report"
		echo
		echo "Versions: $("$CAIRN" version 2>/dev/null | head -1); $(mergerfs --version 2>&1 | head -1); $(fuse-overlayfs --version 2>&1 | grep -m1 '^fuse-overlayfs'); unionfs-fuse $(dpkg-query -W -f '${Version}' unionfs-fuse); kernel $(uname -r)"
		echo
		echo "Raw results (form,config,operation,run,seconds,load1):"
		echo
		echo '```'
		cat "$RAW"
		echo '```'
	} >"$OUT"
fi
