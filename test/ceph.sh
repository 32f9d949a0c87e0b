#!/usr/bin/env bash
# test/ceph.sh: a throwaway single-node Ceph cluster with a CephFS file
# system, for tests (internal/cephtest runs it; docs/distributed.md).
# Everything it makes is under one state directory DIR: a private ceph.conf,
# the keyrings, the monitor's store, the OSD (bluestore on a sparse file,
# DIR/osd/block), the daemons' pid files, admin sockets and logs.
#
# The daemons (one each of ceph-mon, ceph-mgr, ceph-osd, ceph-mds) and the
# ceph-fuse clients run in a network namespace of their own (DIR/netns) that
# has only a loopback interface: nothing listens on the host's network, and
# the monitor takes its fixed ports (3300, 6789) without meeting another test
# run's. The FUSE mounts are ordinary mounts of the host's mount namespace.
# cephx is on: every daemon and client has its own key.
#
#   test/ceph.sh install             apt-get install the Ceph packages if missing (not setup.sh's)
#   test/ceph.sh up DIR [MNT]        start the cluster and make the file system "cephfs"; with
#                                    MNT, mount it there
#   test/ceph.sh mount DIR MNT       mount the file system at MNT with ceph-fuse (again on another
#                                    MNT: a second client, as another machine would be)
#   test/ceph.sh umount DIR MNT
#   test/ceph.sh status DIR          the cluster's health, its daemons and the mounts
#   test/ceph.sh down DIR            unmount every client, stop every daemon, remove DIR
#
# Needs root and Debian 12's ceph-mon, ceph-mgr, ceph-osd, ceph-mds and
# ceph-fuse (16.2). Client options for mount: $CAIRN_CEPH_CLIENT_OPTS.
set -euo pipefail
PKGS="ceph-mon ceph-mgr ceph-osd ceph-mds ceph-fuse"
die() { echo "test/ceph.sh: $*" >&2; exit 1; }

# ns runs a command in the cluster's network namespace.
ns() { nsenter --net="$D/netns" "$@"; }
cph() { ns ceph -c "$D/ceph.conf" --connect-timeout 20 "$@"; }

install() {
	local c missing=
	for c in ceph-mon ceph-mgr ceph-osd ceph-mds ceph-fuse ceph ceph-authtool monmaptool; do
		command -v "$c" > /dev/null || missing=1
	done
	[ -n "$missing" ] || return 0
	# shellcheck disable=SC2086
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $PKGS > /dev/null ||
		die "apt-get install $PKGS failed"
}

need() {
	local c
	for c in ceph-mon ceph-mgr ceph-osd ceph-mds ceph-fuse ceph ceph-authtool monmaptool; do
		command -v "$c" > /dev/null || die "Ceph is not installed (no $c): test/ceph.sh install (apt-get install $PKGS)"
	done
}

# waitfor runs a command until it succeeds, at most $1 tenths of a second.
waitfor() {
	local n=$1
	shift
	for _ in $(seq "$n"); do
		"$@" > /dev/null 2>&1 && return 0
		sleep 0.1
	done
	return 1
}

up() {
	need
	mkdir -p "$D"
	[ ! -e "$D/ceph.conf" ] || die "$D holds a cluster already"
	D=$(cd "$D" && pwd)
	mkdir -p "$D/run" "$D/log" "$D/mon/a" "$D/mgr/x" "$D/osd/0" "$D/mds/a"
	touch "$D/netns"
	unshare --net="$D/netns" true || die "cannot make a network namespace (unshare --net)"
	ns ip link set lo up
	local fsid
	fsid=$(cat /proc/sys/kernel/random/uuid)
	# Sizes: one OSD, so pools of one replica; the caches small, so that the
	# whole cluster stays near 1 GiB of memory (docs/distributed.md).
	cat > "$D/ceph.conf" <<- EOF
		[global]
		fsid = $fsid
		mon host = [v2:127.0.0.1:3300,v1:127.0.0.1:6789]
		public addr = 127.0.0.1
		ms bind ipv6 = false
		auth cluster required = cephx
		auth service required = cephx
		auth client required = cephx
		keyring = $D/\$name.keyring
		run dir = $D/run
		admin socket = $D/run/\$name.asok
		pid file = $D/run/\$name.pid
		log file = $D/log/\$name.log
		crash dir = $D/crash
		exec dir = $D/run
		osd pool default size = 1
		osd pool default min size = 1
		osd pool default pg autoscale mode = off
		osd crush chooseleaf type = 0
		mon allow pool size one = true
		mon allow pool delete = true
		mon warn on pool no redundancy = false
		mon data avail warn = 5
		auth allow insecure global id reclaim = false
		mon data = $D/mon/\$id
		mgr data = $D/mgr/\$id
		osd data = $D/osd/\$id
		mds data = $D/mds/\$id
		osd objectstore = bluestore
		bluestore block create = true
		bluestore block size = 8589934592
		bluestore block db create = false
		bluestore block wal create = false
		osd memory target = 939524096
		bluestore cache autotune = false
		bluestore cache size = 134217728
		mds cache memory limit = 134217728
		[mon]
		mon initial members = a
		[mgr]
		mgr initial modules = status
		[client]
		client mount timeout = 30
	EOF
	ceph-authtool "$D/mon.a.keyring" --create-keyring --gen-key -n mon. --cap mon 'allow *' > /dev/null
	ceph-authtool "$D/client.admin.keyring" --create-keyring --gen-key -n client.admin \
		--cap mon 'allow *' --cap osd 'allow *' --cap mds 'allow *' --cap mgr 'allow *' > /dev/null
	ceph-authtool "$D/mon.a.keyring" --import-keyring "$D/client.admin.keyring" > /dev/null
	monmaptool --create --addv a '[v2:127.0.0.1:3300,v1:127.0.0.1:6789]' --fsid "$fsid" "$D/monmap" > /dev/null
	ceph-mon -c "$D/ceph.conf" --mkfs -i a --monmap "$D/monmap" --keyring "$D/mon.a.keyring" ||
		die "ceph-mon --mkfs failed"
	ns ceph-mon -c "$D/ceph.conf" -i a || die "ceph-mon did not start (see $D/log/mon.a.log)"
	waitfor 300 cph -s || die "the monitor does not answer (see $D/log/mon.a.log)"

	cph auth get-or-create mgr.x mon 'allow profile mgr' osd 'allow *' mds 'allow *' -o "$D/mgr.x.keyring"
	ns ceph-mgr -c "$D/ceph.conf" -i x || die "ceph-mgr did not start (see $D/log/mgr.x.log)"

	local uuid
	uuid=$(cat /proc/sys/kernel/random/uuid)
	ceph-authtool "$D/osd.0.keyring" --create-keyring --gen-key -n osd.0 > /dev/null
	echo "{\"cephx_secret\": \"$(ceph-authtool "$D/osd.0.keyring" -p -n osd.0)\"}" > "$D/osd.0.json"
	[ "$(cph osd new "$uuid" -i "$D/osd.0.json")" = 0 ] || die "ceph osd new did not give osd.0"
	ns ceph-osd -c "$D/ceph.conf" -i 0 --mkfs --osd-uuid "$uuid" > "$D/log/osd.0.mkfs.log" 2>&1 ||
		die "ceph-osd --mkfs failed (see $D/log/osd.0.mkfs.log)"
	ns ceph-osd -c "$D/ceph.conf" -i 0 2>> "$D/log/osd.0.out" || die "ceph-osd did not start (see $D/log/osd.0.log)"

	cph auth get-or-create mds.a mon 'allow profile mds' osd 'allow rwx' mds 'allow *' mgr 'allow profile mds' \
		-o "$D/mds.a.keyring"
	ns ceph-mds -c "$D/ceph.conf" -i a > /dev/null || die "ceph-mds did not start (see $D/log/mds.a.log)"

	local out
	out=$(cph osd pool create cephfs_metadata 8 2>&1) || die "pool create cephfs_metadata: $out"
	out=$(cph osd pool create cephfs_data 16 2>&1) || die "pool create cephfs_data: $out"
	out=$(cph fs new cephfs cephfs_metadata cephfs_data 2>&1) || die "fs new: $out"
	# The file system is usable once its MDS is active, which needs the OSD
	# up and the pools' placement groups active.
	waitfor 600 fsactive || die "the MDS did not become active: $(cph -s 2>&1)"
	echo "test/ceph.sh: Ceph cluster and file system cephfs in $D" >&2
}

fsactive() { cph mds stat 2> /dev/null | grep -q 'up:active'; }

mnt() {
	local m=$1
	mkdir -p "$m"
	m=$(cd "$m" && pwd)
	mountpoint -q "$m" && die "$m is mounted already"
	local name
	name="client$(echo "$m" | tr / -)"
	# ceph-fuse returns once the file system is mounted (it daemonizes after).
	# shellcheck disable=SC2086
	ns ceph-fuse -c "$D/ceph.conf" --id admin --client-fs cephfs \
		--log-file "$D/log/$name.log" --admin-socket "$D/run/$name.asok" --pid-file "$D/run/$name.pid" \
		${CAIRN_CEPH_CLIENT_OPTS:-} "$m" > "$D/log/$name.out" 2>&1 ||
		die "ceph-fuse did not mount the file system at $m: $(cat "$D/log/$name.out") (see $D/log/$name.log)"
	waitfor 100 stat "$m" || die "the mount at $m does not answer (see $D/log/$name.log)"
	echo "$m" >> "$D/mounts"
}

umnt() {
	local m=$1 p dev
	# The mount table, not mountpoint(1): a client whose cluster is gone
	# answers stat with ENOTCONN, and is still to be unmounted.
	findmnt -n --mountpoint "$m" > /dev/null || return 0
	for _ in $(seq 50); do
		# A client whose cluster is gone never answers the unmount's sync:
		# after 10 s its FUSE connection is aborted.
		umount "$m" 2> /dev/null &
		p=$!
		for _ in $(seq 100); do
			kill -0 "$p" 2> /dev/null || break
			sleep 0.1
		done
		if kill -0 "$p" 2> /dev/null; then
			dev=$(findmnt -n -o MAJ:MIN --mountpoint "$m" | cut -d: -f2)
			echo 1 > "/sys/fs/fuse/connections/$dev/abort" 2> /dev/null || true
		fi
		wait "$p" && return
		findmnt -n --mountpoint "$m" > /dev/null || return 0
		sleep 0.1
	done
	umount -l "$m"
}

status() {
	[ -f "$D/ceph.conf" ] || die "no cluster in $D"
	cph -s
	cph fs status cephfs
	if [ -f "$D/mounts" ]; then
		local m
		while read -r m; do findmnt -n --mountpoint "$m" || true; done < "$D/mounts"
	fi
}

# stopdaemons stops daemons by their pid files: SIGTERM to all of them at
# once (an MDS takes seconds to stop), then SIGKILL after 10 s.
stopdaemons() {
	local n f p ps=
	for n in "$@"; do
		f=$D/run/$n.pid
		[ -s "$f" ] || continue
		kill "$(cat "$f")" 2> /dev/null && ps="$ps $(cat "$f")"
	done
	for _ in $(seq 100); do
		[ -n "$ps" ] || return 0
		local live=
		for p in $ps; do kill -0 "$p" 2> /dev/null && live="$live $p"; done
		ps=$live
		sleep 0.1
	done
	for p in $ps; do kill -9 "$p" 2> /dev/null || true; done
}

down() {
	[ -d "$D" ] || return 0
	D=$(cd "$D" && pwd)
	local m f
	if [ -f "$D/mounts" ]; then
		while read -r m; do umnt "$m" || true; done < "$D/mounts"
	fi
	# The clients first (a lazily unmounted one may still run), then the
	# daemons that serve them.
	local clients=
	for f in "$D"/run/client*.pid; do
		[ -e "$f" ] || continue
		f=${f##*/}
		clients="$clients ${f%.pid}"
	done
	# shellcheck disable=SC2086
	stopdaemons $clients
	stopdaemons mds.a osd.0 mgr.x mon.a
	umount "$D/netns" 2> /dev/null || true
	rm -rf "$D"
}

cmd=${1:-}
[ "$cmd" = install ] && { install; exit 0; }
[ $# -ge 2 ] || die "usage: test/ceph.sh install|up|mount|umount|status|down DIR ..."
[ "$(id -u)" = 0 ] || die "needs root (network namespace, mount)"
D=$2
case $cmd in
up)
	up
	[ $# -lt 3 ] || mnt "$3"
	;;
mount) [ $# -ge 3 ] || die "usage: mount DIR MNT"; mnt "$3" ;;
umount) [ $# -ge 3 ] || die "usage: umount DIR MNT"; umnt "$3" ;;
status) status ;;
down) down ;;
*) die "unknown command $cmd" ;;
esac
