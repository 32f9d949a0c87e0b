#!/usr/bin/env bash
# bench/replica.sh: the replica layer against null (issue 16), on two ext4
# file systems on loop devices (direct I/O, no discard), configurations
# interleaved run by run:
#
#   null       null over disk 1 (the seed's Wrapfs)
#   replica2   replica of disk 1 and disk 2 (round-robin)
#   replica3   replica of disk 1, disk 2 and a second directory of disk 1
#   replica2first  replica2 with policy = "first" (reads from disk 1 only)
#   replica2all    replica2 with balance_size = 0 (small files balanced too)
#   replica2wb, nullwb  replica2 and null mounted with -writeback (the
#              kernel's writeback cache; no passthrough)
#   (--configs a,b chooses among them, and leaves par4 out)
#
# Workloads (each on fresh, empty lowers; "cold": unmount, sync, drop
# caches, mount again):
#   untar      tar -xf of 8 copies of the GNU grep 3.8 source (~10,000
#              entries) into the mount, then sync: the write cost
#   grep       grep -r of that tree, cold: lookups and reads
#   seqwrite   dd of --size MiB into a new file, conv=fsync
#   compile    (--compile) tar -xJf, ./configure, make -j2 of GNU grep 3.8
#   resync     (--resync) the tree untarred into a replica of disk 1 and
#              disk 2 (disk 2 under a fault layer); disk 2 then fails (EIO,
#              switched by SIGHUP) and 1% of the files are changed (a line
#              appended); unmounted, 'cairn resync', cold, against 'rsync -a'
#              of the whole tree to an empty directory of disk 2 and against
#              'rsync -a' onto the stale copy (which compares every file);
#              --resync-gib N uses a tree of N GiB instead (1 MiB files, 256
#              to a directory; the disks grow to fit it)
#   par4       4 parallel cold readers (dd) of 4 files of --size/4 MiB each:
#              null over disk 1 against replica2 (least-outstanding), which
#              spreads the four files over the two disks; --cap MiBps
#              caps each disk's reads (cgroup v1 blkio throttle on the loop
#              devices, charged to the readers), so that the devices, not
#              the CPU or the host's cache, are the limit; --only-par4
#
# Each figure is the median of --runs runs with its range, and its ratio to
# null's; the 1-minute load average is printed with each measurement (the
# machine is shared) and its median at the end.
#
# Usage: sudo bench/replica.sh [--runs N] [--size MiB] [--compile] [--resync] [--only-resync] [--resync-gib N]
#                             [--configs a,b] [--cap MiBps] [--only-par4] [--out FILE.md]
set -euo pipefail

RUNS=3 SIZE=512 COMPILE=0 OUT= RESYNC=0 MAIN=1 CONFIGS="null replica2 replica3" PAR=1 GIB=0 CAP=0
while [ $# -gt 0 ]; do
	case "$1" in
	--runs) RUNS=$2; shift 2 ;;
	--size) SIZE=$2; shift 2 ;;
	--compile) COMPILE=1; shift ;;
	--resync) RESYNC=1; shift ;;
	--configs) CONFIGS=$(echo "$2" | tr , ' '); PAR=0; shift 2 ;;
	--only-resync) RESYNC=1 MAIN=0 PAR=0; shift ;;
	--resync-gib) GIB=$2; RESYNC=1; shift 2 ;;
	--cap) CAP=$2; shift 2 ;;
	--only-par4) MAIN=0; shift ;;
	--out) OUT=$2; shift 2 ;;
	-h|--help) sed -n '2,41p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "replica.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
done
[ "$(id -u)" = 0 ] || { echo "replica.sh: needs root (loop devices, mounts, drop_caches)" >&2; exit 2; }
REPO=$(cd "$(dirname "$0")/.." && pwd)
TAR=${CAIRN_BENCH_TARBALL:-$REPO/../shared/bench/grep_3.8.orig.tar.xz}
[ -f "$TAR" ] || { echo "replica.sh: $TAR not found (set CAIRN_BENCH_TARBALL)" >&2; exit 2; }
TAG=cairn-replica-$$
MNT=/tmp/$TAG-mnt
CAIRN=$REPO/bin/cairn
(cd "$REPO" && go build -o bin/cairn ./cmd/cairn)
DIR= IMG= LOOP=
. "$REPO/bench/lib.sh"
disk() { # disk N: an ext4 image on a loop device, mounted at D$N
	local img=/var/tmp/$TAG-$1.img d=/tmp/$TAG-disk$1
	truncate -s "$DISKGIB"G "$img"
	mkfs.ext4 -q -F -E nodiscard,lazy_itable_init=0,lazy_journal_init=0 "$img"
	local loop
	loop=$(losetup -f --show --direct-io=on "$img")
	mkdir -p "$d"
	mount -o nodiscard "$loop" "$d"
	echo "$d $loop $img" >>"/tmp/$TAG.disks"
	eval "D$1=$d"
	eval "L$1=$loop"
}
cleanup() {
	set +e
	mountpoint -q "$MNT" && { "$CAIRN" umount "$MNT" || umount -l "$MNT"; }
	rmdir "$MNT" 2>/dev/null
	if [ -f "/tmp/$TAG.disks" ]; then
		while read -r d loop img; do umount "$d"; losetup -d "$loop"; rmdir "$d"; rm -f "$img"; done <"/tmp/$TAG.disks"
		rm -f "/tmp/$TAG.disks"
	fi
	rm -rf "/tmp/$TAG-work"
	[ -d "/sys/fs/cgroup/blkio/$TAG" ] && rmdir "/sys/fs/cgroup/blkio/$TAG"
}
trap cleanup EXIT
# Disk 2 holds the replica and rsync's whole copy of the resync tree.
DISKGIB=$((6 > 3 * GIB + 4 ? 6 : 3 * GIB + 4))
disk 1
disk 2
mkdir -p "$MNT" "/tmp/$TAG-work"
TREE=/tmp/$TAG-work/tree.tar
grep_tree "$TAR" "$TREE"

# spec CONFIG: the inline spec of a configuration over fresh lowers.
spec() {
	rm -rf "$D1/r" "$D2/r" "$D1/r3"
	mkdir -p "$D1/r" "$D2/r" "$D1/r3"
	case $1 in
	null) echo "null:$D1/r" ;;
	replica2) echo "replica:$D1/r:$D2/r" ;;
	replica2lo) echo "replica(policy=least-outstanding):$D1/r:$D2/r" ;;
	replica2first) echo "replica(policy=first):$D1/r:$D2/r" ;;
	replica2all) echo "replica(balance_size=0):$D1/r:$D2/r" ;;
	replica2wb) echo "replica:$D1/r:$D2/r" ;;
	nullwb) echo "null:$D1/r" ;;
	replica3) echo "replica:$D1/r:$D2/r:$D1/r3" ;;
	esac
}
# FLAGS: the mount flags of the configuration being measured.
FLAGS=
mnt() { "$CAIRN" mount $FLAGS "$1" "$MNT"; }
umnt() { "$CAIRN" umount "$MNT"; }
cold() { umnt; sync; echo 3 >/proc/sys/vm/drop_caches; mnt "$1"; }
now() { date +%s.%N; }
load() { cut -d' ' -f1 /proc/loadavg; }
RES=/tmp/$TAG-work/results
: >"$RES"
rec() { echo "$1 $2 $3 $4" >>"$RES"; printf '%-9s %-11s run %s: %8.2f   (load %s)\n' "$1" "$2" "$3" "$4" "$(load)" >&2; echo "$(load)" >>"$RES.load"; }

# big_tree DIR GIB: GIB GiB in 1 MiB files of random bytes, 256 to a
# directory, each file distinct (its number written at its start).
big_tree() {
	local seed=/tmp/$TAG-work/seed n=$(($2 * 1024)) i
	head -c 1M /dev/urandom >"$seed"
	for i in $(seq 0 $((n - 1))); do
		[ $((i % 256)) = 0 ] && mkdir -p "$1/d$((i / 256))"
		{ printf '%08d' "$i"; tail -c +9 "$seed"; } >"$1/d$((i / 256))/f$i"
		[ $((i % 1024)) = 1023 ] && echo "big_tree: $(((i + 1) / 1024)) of $2 GiB written" >&2
	done
	sync
}
if [ "$RESYNC" = 1 ]; then
	SP=/tmp/$TAG-work/resync.toml
	rspec() { # rspec RULES
		cat >"$SP" <<EOS
mount = "r"
[layer.r]
type = "replica"
over = ["a", "fb"]
timeout = "5s"
[layer.a]
type = "local"
path = "$D1/r"
[layer.fb]
type = "fault"
over = "b"
reload = true
[layer.b]
type = "local"
path = "$D2/r"
$1
EOS
	}
	for run in $(seq 1 "$RUNS"); do
		spec null >/dev/null
		rm -rf "$D2/full"
		rspec ""
		"$CAIRN" mount -f "$SP" "$MNT" 2>/dev/null &
		PID=$!
		for _ in $(seq 100); do mountpoint -q "$MNT" && break; sleep 0.1; done
		if [ "$GIB" -gt 0 ]; then
			big_tree "$MNT" "$GIB"
		else
			tar -xf "$TREE" -C "$MNT"
		fi
		rspec $'[[rule]]\nlayer = "fb"\nmatch = "**"\nerrno = "EIO"'
		kill -HUP $PID; sleep 1
		n=0 changed=0
		while read -r f; do
			n=$((n + 1))
			if [ $((n % 100)) = 0 ]; then echo "changed" >>"$MNT/$f"; changed=$((changed + 1)); fi
		done < <(cd "$MNT" && find . -type f | sort)
		"$CAIRN" umount "$MNT"; wait $PID || true
		rspec ""
		sync; echo 3 >/proc/sys/vm/drop_caches
		t0=$(now); "$CAIRN" resync "$SP" >&2; t1=$(now)
		rec resync cairn-resync "$run" "$(echo "$t1 - $t0" | bc)"
		echo "($changed of $n files changed)" >&2
		sync; echo 3 >/proc/sys/vm/drop_caches
		t0=$(now); rsync -a --delete "$D1/r/" "$D2/r/"; sync; t1=$(now)
		rec resync rsync-onto-copy "$run" "$(echo "$t1 - $t0" | bc)"
		sync; echo 3 >/proc/sys/vm/drop_caches
		t0=$(now); rsync -a "$D1/r/" "$D2/full/"; sync; t1=$(now)
		rec resync rsync-whole "$run" "$(echo "$t1 - $t0" | bc)"
	done
fi
PRUNS=$RUNS
[ "$MAIN" = 1 ] || RUNS=0
WL="untar grep seqwrite"
[ "$COMPILE" = 1 ] && WL="$WL compile"
for run in $(seq 1 "$RUNS"); do
	for c in $CONFIGS; do
		s=$(spec $c)
		case $c in *wb) FLAGS=-writeback ;; *) FLAGS= ;; esac
		mnt "$s"
		t0=$(now); tar -xf "$TREE" -C "$MNT"; sync; t1=$(now)
		rec untar $c "$run" "$(echo "$t1 - $t0" | bc)"
		cold "$s"
		t0=$(now); grep -r zzzqqq "$MNT" >/dev/null || true; t1=$(now)
		rec grep $c "$run" "$(echo "$t1 - $t0" | bc)"
		t0=$(now); dd if=/dev/zero of="$MNT/big" bs=1M count="$SIZE" conv=fsync status=none; t1=$(now)
		rec seqwrite $c "$run" "$(echo "$SIZE / ($t1 - $t0)" | bc -l)"
		if [ "$COMPILE" = 1 ]; then
			mkdir "$MNT/c"
			t0=$(now)
			(cd "$MNT/c" && tar -xJf "$TAR" && cd grep-3.8 && ./configure -q >/dev/null && make -s -j2 >/dev/null 2>&1)
			t1=$(now)
			rec compile $c "$run" "$(echo "$t1 - $t0" | bc)"
		fi
		umnt
	done
done

# par4: four readers, one file each.
PER=$((SIZE / 4))
# capped: move this (sub)shell into the throttled cgroup, if --cap.
CG=/sys/fs/cgroup/blkio/$TAG
capped() { if [ "$CAP" -gt 0 ]; then echo "$BASHPID" >"$CG/cgroup.procs"; fi; }
if [ "$CAP" -gt 0 ] && [ "$PAR" = 1 ]; then
	[ -d /sys/fs/cgroup/blkio ] || { echo "replica.sh: --cap needs the cgroup v1 blkio controller" >&2; exit 2; }
	mkdir -p "$CG"
	for l in "$L1" "$L2"; do echo "$(cat /sys/block/$(basename "$l")/dev) $((CAP * 1048576))" >"$CG/blkio.throttle.read_bps_device"; done
fi
[ "$PAR" = 1 ] || PRUNS=0
for run in $(seq 1 "$PRUNS"); do
	FLAGS=
	for c in null replica2lo; do
		s=$(spec $c)
		mnt "$s"
		for i in 1 2 3 4; do dd if=/dev/urandom of="$MNT/f$i" bs=1M count="$PER" status=none; done
		cold "$s"
		t0=$(now)
		for i in 1 2 3 4; do (capped; dd if="$MNT/f$i" of=/dev/null bs=1M status=none) & done
		wait
		t1=$(now)
		rec par4 $c "$run" "$(echo "$SIZE / ($t1 - $t0)" | bc -l)"
		umnt
	done
done

# The table: median (min..max) and the ratio to null's median.
python3 - "$RES" "$OUT" <<'PY'
import sys, statistics as st
rows = {}
for line in open(sys.argv[1]):
    w, c, r, v = line.split()
    rows.setdefault(w, {}).setdefault(c, []).append(float(v))
loads = [float(x) for x in open(sys.argv[1] + ".load")]
unit = {"resync": "s", "untar": "s", "grep": "s", "compile": "s", "seqwrite": "MiB/s", "par4": "MiB/s"}
out = ["| workload | config | median | range | vs null (resync: vs rsync of the whole tree) |", "| --- | --- | --- | --- | --- |"]
for w, cs in rows.items():
    base = st.median(cs.get("null") or cs.get("rsync-whole") or next(iter(cs.values())))
    for c, vs in cs.items():
        m = st.median(vs)
        out.append(f"| {w} ({unit[w]}) | {c} | {m:.2f} | {min(vs):.2f}..{max(vs):.2f} | {m / base:.2f}x |")
out.append("")
out.append(f"load average (1 min) during the measurements: median {st.median(loads):.1f}, range {min(loads):.1f}..{max(loads):.1f} (2 cores)")
text = "\n".join(out)
print(text)
if sys.argv[2]:
    open(sys.argv[2], "w").write(text + "\n")
PY
