#!/usr/bin/env bash
# bench/gluster.sh: a local loopback GlusterFS volume for benchmarks (the
# GlusterFS lower of bench/shard.sh; a replica over two volumes; the
# distributed lower). One brick, on an ext4 file system of its own in a loop
# image, served by this host's glusterd and mounted with the glusterfs FUSE
# client. Needs root and Debian's glusterfs-server and glusterfs-client
# (installed if missing).
#
#   bench/gluster.sh up NAME MNT [SIZE]   make (or keep) volume NAME and mount it at MNT (SIZE: 8G)
#   bench/gluster.sh down NAME [MNT]      unmount, stop and delete the volume, remove its brick and image
#   bench/gluster.sh cold NAME MNT        unmount everything and mount it again: no cache of the client,
#                                         the brick process or the brick's ext4 is left
#   bench/gluster.sh status [NAME]
#
# Both are idempotent: up on a volume that is there and mounted does
# nothing, down of a volume that is not there does nothing. The brick's
# image and mount are under $CAIRN_GLUSTER_DIR (default /var/tmp/cairn-gluster/NAME).
# glusterd is started if none runs (not stopped by down: other volumes may
# use it); `bench/gluster.sh stop` stops the one it started, when no volume
# is left.
set -euo pipefail
die() { echo "gluster.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (loop devices, glusterd, mount)"
gl() { gluster --mode=script "$@"; }
PIDFILE=/var/run/cairn-glusterd.pid # of a glusterd started here

need() {
	command -v glusterd > /dev/null && command -v mount.glusterfs > /dev/null && return
	echo "gluster.sh: installing glusterfs-server glusterfs-client" >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q glusterfs-server glusterfs-client > /dev/null ||
		die "apt-get install glusterfs-server glusterfs-client failed"
}

# glusterd runs, started here if need be (no systemd in containers).
daemon() {
	if ! gl volume list > /dev/null 2>&1; then
		pgrep -x glusterd > /dev/null || glusterd --log-level=WARNING --pid-file="$PIDFILE" ||
			die "glusterd did not start (see /var/log/glusterfs/glusterd.log)"
		for _ in $(seq 50); do gl volume list > /dev/null 2>&1 && return; sleep 0.2; done
		die "glusterd does not answer (see /var/log/glusterfs/glusterd.log)"
	fi
}

# The brick's host: this host's name, if it resolves to an address of
# this host (glusterd refuses a brick it cannot tell is local).
host() {
	local h
	h=$(hostname)
	getent hosts "$h" > /dev/null || die "hostname $h does not resolve: add it to /etc/hosts"
	echo "$h"
}

up() {
	local name=$1 mnt=$2 size=${3:-8G}
	local w=${CAIRN_GLUSTER_DIR:-/var/tmp/cairn-gluster/$name}
	[[ $name =~ ^[A-Za-z0-9_-]+$ ]] || die "volume name $name: letters, digits, - and _ only"
	need
	daemon
	mkdir -p "$w/fs" "$mnt"
	if ! mountpoint -q "$w/fs"; then
		if [ ! -e "$w/brick.img" ]; then
			truncate -s "$size" "$w/brick.img"
			# An inode per 8 KiB: a large-directory benchmark fills it
			# with 2 KiB files.
			# $CAIRN_GLUSTER_MKFS: more options ("-O ^dir_index").
			# shellcheck disable=SC2086
			mkfs.ext4 -q -F -i 8192 -E nodiscard,lazy_itable_init=0,lazy_journal_init=0 ${CAIRN_GLUSTER_MKFS:-} "$w/brick.img"
		fi
		mount -o loop,nodiscard "$w/brick.img" "$w/fs" || die "cannot mount the brick image $w/brick.img at $w/fs"
	fi
	mkdir -p "$w/fs/brick"
	if ! gl volume info "$name" > /dev/null 2>&1; then
		# force: the brick is on a file system of its own but below /var
		# (glusterd refuses bricks on the root file system without it).
		out=$(gl volume create "$name" "$(host):$w/fs/brick" force 2>&1) || die "volume create $name: $out"
	fi
	if ! gl volume info "$name" | grep -q '^Status: Started'; then
		out=$(gl volume start "$name" 2>&1) || die "volume start $name: $out"
	fi
	if mountpoint -q "$mnt"; then
		[ "$(findmnt -n -o SOURCE "$mnt")" = "$(host):/$name" ] || die "$mnt is mounted, not by volume $name"
		return
	fi
	for _ in 1 2 3 4 5; do # the brick process may take a moment to listen
		mount -t glusterfs "$(host):/$name" "$mnt" 2> /dev/null && mountpoint -q "$mnt" && break
		sleep 1
	done
	mountpoint -q "$mnt" || die "mount -t glusterfs $(host):/$name $mnt failed (see /var/log/glusterfs/)"
	echo "gluster.sh: volume $name mounted at $mnt (brick $w/fs/brick)" >&2
}

down() {
	local name=$1 mnt=${2:-}
	local w=${CAIRN_GLUSTER_DIR:-/var/tmp/cairn-gluster/$name}
	if [ -z "$mnt" ]; then
		mnt=$(findmnt -n -t fuse.glusterfs -o TARGET,SOURCE | awk -v s=":/$name" 'substr($2, length($2) - length(s) + 1) == s {print $1; exit}')
	fi
	if [ -n "$mnt" ] && mountpoint -q "$mnt"; then
		umount "$mnt" || umount -l "$mnt" || die "cannot unmount $mnt"
	fi
	if command -v gluster > /dev/null && gl volume list > /dev/null 2>&1 && gl volume info "$name" > /dev/null 2>&1; then
		gl volume stop "$name" force > /dev/null 2>&1 || true
		out=$(gl volume delete "$name" 2>&1) || die "volume delete $name: $out"
	fi
	if mountpoint -q "$w/fs" 2> /dev/null; then
		umount "$w/fs" || die "cannot unmount the brick file system $w/fs (busy?)"
	fi
	rm -rf "$w"
}

cold() {
	local name=$1 mnt=$2
	local w=${CAIRN_GLUSTER_DIR:-/var/tmp/cairn-gluster/$name}
	[ -e "$w/brick.img" ] || die "no volume $name here (no $w/brick.img): run up first"
	if mountpoint -q "$mnt"; then umount "$mnt" || die "cannot unmount $mnt (busy?)"; fi
	daemon
	if gl volume info "$name" 2> /dev/null | grep -q '^Status: Started'; then
		out=$(gl volume stop "$name" 2>&1) || die "volume stop $name: $out"
	fi
	if mountpoint -q "$w/fs"; then umount "$w/fs" || die "cannot unmount the brick file system $w/fs (busy?)"; fi
	up "$name" "$mnt"
}

status() {
	daemon
	if [ -n "${1:-}" ]; then gl volume status "$1"; else gl volume info; fi
	findmnt -t fuse.glusterfs || true
}

# stop ends the glusterd that up started (by its pid file), if no volume
# is left.
stop() {
	[ -s "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2> /dev/null || return 0
	[ "$(gl volume list 2>&1)" = "No volumes present in cluster" ] || die "volumes are left: $(gl volume list | tr '\n' ' ')"
	kill "$(cat "$PIDFILE")" && rm -f "$PIDFILE"
}

case "${1:-}" in
up) [ $# -ge 3 ] || die "usage: up NAME MNT [SIZE]"; up "$2" "$3" "${4:-}" ;;
down) [ $# -ge 2 ] || die "usage: down NAME [MNT]"; down "$2" "${3:-}" ;;
cold) [ $# -ge 3 ] || die "usage: cold NAME MNT"; cold "$2" "$3" ;;
status) status "${2:-}" ;;
stop) stop ;;
*) die "usage: bench/gluster.sh up NAME MNT [SIZE] | down NAME [MNT] | cold NAME MNT | status [NAME] | stop" ;;
esac
