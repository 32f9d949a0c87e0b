#!/usr/bin/env bash
# bench/twoclient.sh: two clients of one stack over one distributed volume
# (issue 22, "report the two-client throughput"). Two FUSE mounts of the same
# GlusterFS volume or CephFS file system (as two machines would have, with
# the close-to-open client options of docs/distributed.md), and on each one
# the same configuration over the same directory: native (the two mounts
# themselves), cairn's null, crypt and zstd stacks (cairn mount -shared) and
# gocryptfs (-sharedstorage). Each run, for each configuration:
#
#   write    each client writes a 256 MiB file of its own at once (dd bs=1M,
#            conv=fsync, random bytes: zstd gains nothing); then, caches
#            dropped, each reads the other's file
#   untar    each client unpacks GNU grep's tarball into a directory of its
#            own at once (sync included); then, caches dropped, each reads
#            every file the other unpacked (tar -c | md5sum) and the digests
#            are checked against the tarball's
#   alone    the same 256 MiB write by one client alone, for the ratio
#
# Figures: aggregate MiB/s (both files' bytes over the wall time of the
# slower client) and files/s; medians of --runs (3).
#
#   sudo bench/twoclient.sh [--lower gluster|ceph] [--runs N] [--configs a,b] [--out FILE]
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
[ "$(id -u)" = 0 ] || { echo "twoclient.sh: needs root" >&2; exit 2; }
export PATH=$PATH:/usr/local/go/bin
LOWER=gluster RUNS=3 CONFIGS=native,null,crypt,zstd,gocryptfs OUT=/tmp/cairn-twoclient.md
while [ $# -gt 0 ]; do
	case "$1" in
	--lower) LOWER=$2; shift 2 ;;
	--runs) RUNS=$2; shift 2 ;;
	--configs) CONFIGS=$2; shift 2 ;;
	--out) OUT=$2; shift 2 ;;
	-h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "twoclient.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
done
TARBALL=${CAIRN_TARBALL:-$REPO/../shared/bench/grep_3.8.orig.tar.xz}
W=/var/tmp/cairn-twoclient
M1=$W/client1 M2=$W/client2 VOL=cairntwo CEPH=$W/ceph
mkdir -p "$W/work" "$M1" "$M2"
go build -o bin/cairn ./cmd/cairn
command -v gocryptfs > /dev/null || apt-get install -y -qq gocryptfs > /dev/null
xz -dc "$TARBALL" > "$W/src.tar"
[ -s "$W/rand" ] || head -c 256M /dev/urandom > "$W/rand"
# The tarball's digest as the readers compute it (files in name order).
mkdir -p "$W/ref" && tar xf "$W/src.tar" -C "$W/ref"
digest() { (cd "$1" && find . -type f | LC_ALL=C sort | xargs cat | md5sum | cut -d' ' -f1); }
REF=$(digest "$W/ref")
NFILES=$(find "$W/ref" -type f | wc -l)
rm -rf "$W/ref"

cleanup() {
	for m in "$W"/mnt1 "$W"/mnt2; do mountpoint -q "$m" && { fusermount3 -u "$m" || umount -l "$m"; }; done
	case $LOWER in
	gluster)
		for m in "$M1" "$M2"; do mountpoint -q "$m" && umount "$m"; done
		bench/gluster.sh down "$VOL" "$W/g0" || true
		;;
	ceph) test/ceph.sh down "$CEPH" || true ;;
	esac
}
trap cleanup EXIT
case $LOWER in
gluster)
	bench/gluster.sh up "$VOL" "$W/g0" 16G
	for m in "$M1" "$M2"; do
		glusterfs --volfile-server="$(hostname)" --volfile-id="$VOL" --entry-timeout=0 --attribute-timeout=0 \
			--negative-timeout=0 --fopen-keep-cache=off "$m"
	done
	;;
ceph)
	test/ceph.sh install
	CAIRN_CEPH_CLIENT_OPTS=--fuse_disable_pagecache=true test/ceph.sh up "$CEPH" "$M1"
	CAIRN_CEPH_CLIENT_OPTS=--fuse_disable_pagecache=true test/ceph.sh mount "$CEPH" "$M2"
	;;
*) echo "twoclient.sh: --lower gluster or ceph, not $LOWER" >&2; exit 2 ;;
esac
sleep 2

# mountcfg CFG: the configuration's two client directories in $C1 and $C2,
# over the same directory of the volume.
mountcfg() {
	local cfg=$1 d=bench-$1
	rm -rf "${M1:?}/$d"
	mkdir -p "$M1/$d" "$W/mnt1" "$W/mnt2"
	echo bench-password > "$W/work/pass"
	case $cfg in
	native) C1=$M1/$d C2=$M2/$d; return ;;
	gocryptfs)
		gocryptfs -init -q -passfile "$W/work/pass" "$M1/$d" > /dev/null
		gocryptfs -q -sharedstorage -passfile "$W/work/pass" "$M1/$d" "$W/mnt1"
		gocryptfs -q -sharedstorage -passfile "$W/work/pass" "$M2/$d" "$W/mnt2"
		;;
	crypt)
		for i in 1 2; do
			m=$M1
			[ $i = 2 ] && m=$M2
			printf 'mount = "top"\n[layer.base]\ntype = "local"\npath = "%s"\n[layer.top]\ntype = "crypt"\nover = "base"\npassfile = "%s"\n' \
				"$m/$d" "$W/work/pass" > "$W/work/crypt$i.toml"
		done
		bin/cairn init "$W/work/crypt1.toml" > /dev/null
		bin/cairn mount -shared "$W/work/crypt1.toml" "$W/mnt1"
		bin/cairn mount -shared "$W/work/crypt2.toml" "$W/mnt2"
		;;
	null | zstd)
		bin/cairn mount -shared "$cfg:$M1/$d" "$W/mnt1"
		bin/cairn mount -shared "$cfg:$M2/$d" "$W/mnt2"
		;;
	esac
	C1=$W/mnt1 C2=$W/mnt2
}
umountcfg() { for m in "$W/mnt1" "$W/mnt2"; do mountpoint -q "$m" && fusermount3 -u "$m"; done; rm -rf "${M1:?}/bench-$1"; }

now() { date +%s.%N; }
# both CMD1 CMD2: run both at once; the wall time of the slower.
both() {
	local s e
	s=$(now)
	bash -c "$1" & local p1=$!
	bash -c "$2" & local p2=$!
	wait $p1 && wait $p2
	e=$(now)
	echo "$e - $s" | bc
}
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }

RES=$W/results.txt
: > "$RES"
for run in $(seq "$RUNS"); do
	for cfg in ${CONFIGS//,/ }; do
		mountcfg "$cfg"
		t=$(both "dd if=$W/rand of=$C1/f1 bs=1M conv=fsync status=none" \
			"dd if=$W/rand of=$C2/f2 bs=1M conv=fsync status=none")
		echo "$cfg write-2 $(echo "512 / $t" | bc -l)" >> "$RES"
		drop
		t=$(both "cat $C1/f2 > /dev/null" "cat $C2/f1 > /dev/null")
		echo "$cfg read-2 $(echo "512 / $t" | bc -l)" >> "$RES"
		rm -f "$C1/f1" "$C1/f2"
		s=$(now)
		dd if="$W/rand" of="$C1/f1" bs=1M conv=fsync status=none
		t=$(echo "$(now) - $s" | bc)
		echo "$cfg write-1 $(echo "256 / $t" | bc -l)" >> "$RES"
		rm -f "$C1/f1"
		mkdir -p "$C1/u1" "$C2/u2"
		t=$(both "tar xf $W/src.tar -C $C1/u1 && sync" "tar xf $W/src.tar -C $C2/u2 && sync")
		echo "$cfg untar-2 $(echo "2 * $NFILES / $t" | bc -l)" >> "$RES"
		drop
		s=$(now)
		bash -c "cd $C1/u2 && find . -type f | LC_ALL=C sort | xargs cat | md5sum | cut -d' ' -f1 > $W/d1" &
		p1=$!
		bash -c "cd $C2/u1 && find . -type f | LC_ALL=C sort | xargs cat | md5sum | cut -d' ' -f1 > $W/d2" &
		p2=$!
		wait $p1 && wait $p2
		t=$(echo "$(now) - $s" | bc)
		echo "$cfg readfiles-2 $(echo "2 * $NFILES / $t" | bc -l)" >> "$RES"
		for d in "$W/d1" "$W/d2"; do
			[ "$(cat "$d")" = "$REF" ] || { echo "twoclient.sh: $cfg: a client read other bytes than the other wrote ($d)" >&2; exit 1; }
		done
		umountcfg "$cfg"
		echo "twoclient.sh: run $run $cfg done" >&2
	done
done

{
	echo "# Two clients of one volume ($LOWER), $(date -u +%Y-%m-%d), medians of $RUNS"
	echo
	echo "| configuration | write alone MiB/s | write both MiB/s (sum) | read other's MiB/s (sum) | untar both files/s (sum) | read other's files/s (sum) |"
	echo "| --- | ---: | ---: | ---: | ---: | ---: |"
	for cfg in ${CONFIGS//,/ }; do
		row="| $cfg"
		for m in write-1 write-2 read-2 untar-2 readfiles-2; do
			v=$(awk -v c="$cfg" -v m="$m" '$1 == c && $2 == m {print $3}' "$RES" | sort -g |
				awk '{a[NR] = $1} END {if (NR) printf "%.0f", (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2)}')
			row="$row | $v"
		done
		echo "$row |"
	done
	echo
	echo "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) CPUs; kernel $(uname -r)."
} > "$OUT"
cat "$OUT"
