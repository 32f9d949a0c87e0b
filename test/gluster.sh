#!/usr/bin/env bash
# test/gluster.sh: a throwaway GlusterFS cluster for tests (internal/glustertest
# runs it; docs/distributed.md). Everything it makes is under one state
# directory DIR: glusterd's working and run directories, its volfile, the
# bricks (plain directories of the file system DIR is on) and the logs.
#
# glusterd, the bricks and the FUSE clients run in a network namespace of
# their own (DIR/netns) that has only a loopback interface, holding this
# host's name's addresses: nothing listens on the host's network, and
# glusterd takes its fixed port (24007, which the bricks ask for the volume
# files; glusterd tells them no other) without meeting the host's glusterd
# (bench/gluster.sh's) or another test run's. The FUSE mounts are ordinary
# mounts of the host's mount namespace. Bricks are named by this host's name
# (the CLI refuses 127.0.0.1 and localhost).
#
#   test/gluster.sh start DIR            start glusterd; volumes "one" (one brick) and "two" (two
#                                        bricks, distribute) are made and started
#   test/gluster.sh mount DIR VOL MNT    mount VOL at MNT with the glusterfs FUSE client (again on
#                                        another MNT: a second client, as another machine would be)
#   test/gluster.sh umount DIR MNT
#   test/gluster.sh kill-bricks DIR VOL  SIGKILL VOL's brick processes (a brick server dies)
#   test/gluster.sh start-bricks DIR VOL start VOL's dead bricks again
#   test/gluster.sh stop DIR             unmount every client, stop everything, remove DIR
#
# Needs root and Debian's glusterfs-server and glusterfs-client (setup.sh
# installs them). Client options for mount: $CAIRN_GLUSTER_CLIENT_OPTS (e.g.
# "--attribute-timeout=0").
set -euo pipefail
CACHE_OFF=${CAIRN_GLUSTER_CACHE_OFF-performance.write-behind performance.read-ahead performance.io-cache performance.quick-read performance.open-behind performance.stat-prefetch}
die() { echo "test/gluster.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (glusterd, network namespace, mount)"

# ns runs a command in the cluster's network namespace.
ns() { nsenter --net="$D/netns" "$@"; }
gl() { ns gluster --mode=script --glusterd-sock="$D/glusterd.socket" "$@"; }

host() {
	local h
	h=$(hostname)
	getent ahostsv4 "$h" > /dev/null || die "hostname $h does not resolve: add it to /etc/hosts"
	echo "$h"
}

start() {
	command -v glusterd > /dev/null && command -v glusterfs > /dev/null ||
		die "GlusterFS is not installed: apt-get install glusterfs-server glusterfs-client (setup.sh does)"
	mkdir -p "$D"
	[ ! -e "$D/glusterd.pid" ] || die "$D holds a cluster already"
	D=$(cd "$D" && pwd)
	mkdir -p "$D/lib" "$D/run" "$D/log" "$D/bricks"
	local h a
	h=$(host)
	touch "$D/netns"
	unshare --net="$D/netns" true || die "cannot make a network namespace (unshare --net)"
	ns ip link set lo up
	# The host's name's addresses that are not loopback ones (a CI machine's
	# /etc/hosts may name its own address) go on the namespace's loopback.
	for a in $(getent ahostsv4 "$h" | awk '{print $1}' | sort -u); do
		case $a in 127.*) ;; *) ns ip addr add "$a/32" dev lo ;; esac
	done
	cat > "$D/glusterd.vol" <<- EOF
		volume management
		    type mgmt/glusterd
		    option working-directory $D/lib
		    option run-directory $D/run
		    option glusterd-sockfile $D/glusterd.socket
		    option transport-type socket
		    option transport.socket.listen-port 24007
		    option ping-timeout 0
		    option event-threads 1
		end-volume
	EOF
	ns glusterd -f "$D/glusterd.vol" -p "$D/glusterd.pid" -l "$D/log/glusterd.log" --log-level=WARNING ||
		die "glusterd did not start (see $D/log/glusterd.log)"
	local ok=
	for _ in $(seq 100); do
		if gl volume list > /dev/null 2>&1; then ok=1 && break; fi
		sleep 0.1
	done
	[ -n "$ok" ] || die "glusterd does not answer (see $D/log/glusterd.log)"
	mkdir -p "$D/bricks/one" "$D/bricks/two-a" "$D/bricks/two-b"
	# force: the bricks are on the file system DIR is on, perhaps the root
	# one (which glusterd refuses without it).
	out=$(gl volume create one "$h:$D/bricks/one" force 2>&1) || die "volume create one: $out"
	out=$(gl volume create two "$h:$D/bricks/two-a" "$h:$D/bricks/two-b" force 2>&1) || die "volume create two: $out"
	for v in one two; do
		# The default 42 s before a client gives up on a dead brick is
		# the wait of every call meanwhile; a test's brick kill wants an
		# answer sooner (docs/distributed.md).
		gl volume set "$v" network.ping-timeout 5 > /dev/null
		# The client's caching translators answer reads from data the
		# client's other caches moved past (wrong bytes in fsx on the bare
		# volume, docs/distributed.md): off, as for a POSIX workload.
		for o in $CACHE_OFF; do gl volume set "$v" "$o" off > /dev/null; done
		out=$(gl volume start "$v" 2>&1) || die "volume start $v: $out (see /var/log/glusterfs/bricks/)"
	done
	echo "test/gluster.sh: glusterd and volumes one, two in $D" >&2
}

mnt() {
	local vol=$1 m=$2
	mkdir -p "$m"
	m=$(cd "$m" && pwd)
	mountpoint -q "$m" && die "$m is mounted already"
	local log
	log="$D/log/client$(echo "$m" | tr / -).log"
	# shellcheck disable=SC2086
	ns glusterfs --volfile-server="$(host)" --volfile-id="$vol" -l "$log" ${CAIRN_GLUSTER_CLIENT_OPTS:-} "$m" ||
		die "glusterfs client of $vol did not start (see $log)"
	for _ in $(seq 100); do
		if mountpoint -q "$m" && stat "$m" > /dev/null 2>&1; then
			echo "$m" >> "$D/mounts"
			return
		fi
		sleep 0.1
	done
	die "mount of $vol at $m failed (see $log)"
}

umnt() {
	local m=$1
	# The mount table, not mountpoint(1): a client whose server is gone
	# answers stat with ENOTCONN, and is still to be unmounted.
	findmnt -n --mountpoint "$m" > /dev/null || return 0
	for _ in $(seq 50); do
		umount "$m" 2> /dev/null && return
		sleep 0.1
	done
	umount -l "$m"
}

# brickpids prints the pids of VOL's brick processes.
brickpids() {
	local f
	for f in "$D/run/vols/$1"/*.pid; do
		[ -s "$f" ] && cat "$f"
	done
	return 0
}

stop() {
	[ -d "$D" ] || return 0
	D=$(cd "$D" && pwd)
	local m p v
	if [ -f "$D/mounts" ]; then
		while read -r m; do umnt "$m" || true; done < "$D/mounts"
	fi
	if [ -s "$D/glusterd.pid" ] && kill -0 "$(cat "$D/glusterd.pid")" 2> /dev/null; then
		for v in one two; do gl volume stop "$v" force > /dev/null 2>&1 || true; done
		kill "$(cat "$D/glusterd.pid")" 2> /dev/null || true
	fi
	# Bricks a stop missed (glusterd gone first).
	for v in one two; do
		for p in $(brickpids "$v"); do kill -9 "$p" 2> /dev/null || true; done
	done
	if [ -s "$D/glusterd.pid" ]; then
		p=$(cat "$D/glusterd.pid")
		for _ in $(seq 50); do kill -0 "$p" 2> /dev/null || break; sleep 0.1; done
		kill -9 "$p" 2> /dev/null || true
	fi
	umount "$D/netns" 2> /dev/null || true
	# The bricks' logs go where glusterd puts them, named by brick path.
	rm -f /var/log/glusterfs/bricks/"$(echo "${D#/}" | tr / -)"-bricks-*.log
	rm -rf "$D"
}

cmd=${1:-}
[ $# -ge 2 ] || die "usage: test/gluster.sh start|mount|umount|kill-bricks|start-bricks|stop DIR ..."
D=$2
case $cmd in
start) start ;;
mount) [ $# -ge 4 ] || die "usage: mount DIR VOL MNT"; mnt "$3" "$4" ;;
umount) [ $# -ge 3 ] || die "usage: umount DIR MNT"; umnt "$3" ;;
kill-bricks)
	[ $# -ge 3 ] || die "usage: kill-bricks DIR VOL"
	for p in $(brickpids "$3"); do kill -9 "$p"; done
	;;
start-bricks)
	[ $# -ge 3 ] || die "usage: start-bricks DIR VOL"
	# glusterd may not have noticed the bricks' death yet, and then a
	# start does nothing: again until every brick is online.
	for _ in $(seq 60); do
		out=$(gl volume start "$3" force 2>&1) || die "volume start $3 force: $out"
		gl volume status "$3" detail | awk '/^Online/ {n++; if ($NF != "Y") bad=1} END {exit bad || !n}' && exit 0
		sleep 0.5
	done
	die "the bricks of $3 did not come back (see /var/log/glusterfs/bricks/): $(gl volume status "$3" 2>&1; tail -5 "$D/log/glusterd.log")"
	;;
stop) stop ;;
*) die "unknown command $cmd" ;;
esac
