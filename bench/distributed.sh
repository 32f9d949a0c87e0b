#!/usr/bin/env bash
# bench/distributed.sh: the suite's workloads with a GlusterFS volume or a
# CephFS file system as the lower (issue 22): native (the distributed mount
# itself), cairn's null, crypt and zstd stacks and gocryptfs over a directory
# of it, in one run, configurations interleaved run by run (bench/run does
# that).
#
#   sudo bench/distributed.sh [--lower gluster|ceph] [--runs N] [--out DIR] [--workloads a,b] [--configs a,b]
#
# Workloads (bench/run --quick sizes): compile (unpack of GNU grep's tarball,
# then ls -lRF cold and warm, then rm -rf and sync), streaming (fio, 128 MiB:
# sequential write and cold read, random 4 KiB read and write), largedir
# (1000 lookups, creates and unlinks in directories of 2^0..2^10 entries).
# The volume is bench/gluster.sh's (one brick on an ext4 loop image of its
# own, the glusterfs FUSE client, this host); with --lower ceph, test/ceph.sh's
# single-node cluster (one BlueStore OSD on a sparse file, ceph-fuse; installed
# if missing). Either is made for the run and removed at the end (--keep keeps
# it). cairn stacks over a network or FUSE
# lower are mounted shared (no kernel caching: docs/distributed.md), as a
# user's would be. The report goes to OUT/benchmarks.md (default
# /tmp/cairn-distributed).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
[ "$(id -u)" = 0 ] || { echo "distributed.sh: needs root" >&2; exit 2; }
RUNS=3 OUT=/tmp/cairn-distributed WORKLOADS=compile,streaming,largedir KEEP= LOWER=gluster
CONFIGS=native,cairn-null,cairn-crypt,cairn-zstd,gocryptfs
while [ $# -gt 0 ]; do
	case "$1" in
	--runs) RUNS=$2; shift 2 ;;
	--out) OUT=$2; shift 2 ;;
	--workloads) WORKLOADS=$2; shift 2 ;;
	--configs) CONFIGS=$2; shift 2 ;;
	--keep) KEEP=1; shift ;;
	--lower) LOWER=$2; shift 2 ;;
	-h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "distributed.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
done
VOL=cairndist MNT=/mnt/cairn-distributed CEPH=/var/tmp/cairn-ceph-bench
mkdir -p "$MNT"
case $LOWER in
gluster)
	bench/gluster.sh up "$VOL" "$MNT" 16G
	[ -n "$KEEP" ] || trap 'bench/gluster.sh down "$VOL" "$MNT" || true' EXIT
	;;
ceph)
	test/ceph.sh install
	mountpoint -q "$MNT" || test/ceph.sh up "$CEPH" "$MNT"
	[ -n "$KEEP" ] || trap 'test/ceph.sh down "$CEPH" || true' EXIT
	;;
*) echo "distributed.sh: --lower gluster or ceph, not $LOWER" >&2; exit 2 ;;
esac
rm -rf "${MNT:?}/work"
mkdir -p "$MNT/work" "$OUT"
bench/run --quick --runs "$RUNS" --dir "$MNT/work" --configs "$CONFIGS" --workloads "$WORKLOADS" \
	--out "$OUT" --report "$OUT/benchmarks.md"
echo "distributed.sh: report in $OUT/benchmarks.md"
