#!/usr/bin/env bash
# bench/shard.sh: the seed's Figures 5 and 6 (Usenetfs): 1000 random
# lookups, and 1000 adds plus 1000 deletes of the oldest, in directories of
# 2^0 .. 2^MAX numbered 2 KiB files, flat against sharded, over ext4 and
# ext4 without dir_index (linear directories, as the seed had), each on a
# loop device of its own, and a loopback GlusterFS volume of one brick
# (bench/gluster.sh; KINDS=gluster, or gluster-linear: its brick's ext4
# without dir_index). Three configurations per size: native (the
# directory on the lower, no FUSE), cairn-flat (the same directory through
# a shard mount, not sharded: what stacking alone costs) and cairn-shard
# (sharded, hash, BUCKETS buckets; BUCKETS=grow: the growing layout,
# max_bucket MAX_BUCKET (default 4096), with the bucket count its entries
# need, as the daemon's growth reaches it). Each phase starts with the lower
# unmounted and mounted again, so no directory is in the dentry or page
# cache. Two times, in milliseconds: wall (elapsed) and cpu (the CPU time
# of the process and of the cairn daemon (on GlusterFS also of the client
# and brick processes), summed over their threads from
# /proc/PID/task/*/schedstat: what the work costs, whatever else the
# machine runs; the seed's "time spent by the process and the operating
# system on its behalf"). Also `ls -f | wc -l` and `find` of the largest
# directory. Needs root (loop devices, FUSE). KINDS="htree linear" (or
# gluster, or any of the three) and SIZES="0 1 ... MAX" choose what to run;
# OPS=lookup leaves out the adds and deletes; LINEAR_FILL=htree fills the
# linear lower with dir_index and removes it before measuring (tune2fs -O
# ^dir_index, e2fsck -fD), for directories too large to fill linearly.
#
#   bench/shard.sh [MAX [BUCKETS]]     (default 17, 256)
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
export PATH=$PATH:/usr/local/go/bin
MAX=${1:-17}
BUCKETS=${2:-256}
LAYOUT="buckets = $BUCKETS"
if [ "$BUCKETS" = grow ]; then
	LAYOUT="max_bucket = ${MAX_BUCKET:-4096}"
fi
W=$(mktemp -d /tmp/shard-bench-XXXXXX)
# The GlusterFS volume's brick image lives in $W too.
export CAIRN_GLUSTER_DIR=$W/gluster
GLVOL=cairnshard$$
cleanup() {
	for m in "$W"/mnt-* "$W"/lower-*; do umount "$m" 2>/dev/null || true; done
	[ ! -d "$CAIRN_GLUSTER_DIR" ] || bench/gluster.sh down "$GLVOL" || return
	rm -rf "$W"
}
trap cleanup EXIT
go build -o "$W/cairn" ./cmd/cairn

cat > "$W/m.py" <<'EOF'
import glob, os, random, sys, time
op, d = sys.argv[1], sys.argv[2]
daemons = sys.argv[3].split(",") if len(sys.argv) > 3 and sys.argv[3] else []
def dcpu():  # the daemons' CPU time in ns, over their threads
    t = 0
    for daemon in daemons:
        for f in glob.glob("/proc/%s/task/*/schedstat" % daemon):
            try:
                t += int(open(f).read().split()[0])
            except OSError:
                pass
    return t
st = d.rstrip("/") + ".range"  # lo hi of the numbered names present
lo, hi = map(int, open(st).read().split())
data = b"x" * 2048
c0, d0, t0 = time.process_time(), dcpu(), time.perf_counter()
if op == "make":
    os.makedirs(d, exist_ok=True)
    for i in range(lo, hi):
        with open(os.path.join(d, str(i)), "wb") as f:
            f.write(data)
elif op == "lookup":
    r = random.Random(1)
    for _ in range(1000):
        os.lstat(os.path.join(d, str(r.randrange(lo, hi))))
elif op == "churn":
    for i in range(hi, hi + 1000):
        with open(os.path.join(d, str(i)), "wb") as f:
            f.write(data)
    for i in range(lo, lo + 1000):
        os.unlink(os.path.join(d, str(i)))
    open(st, "w").write("%d %d" % (lo + 1000, hi + 1000))
print("%.1f %.1f" % ((time.perf_counter() - t0) * 1000, (time.process_time() - c0) * 1000 + (dcpu() - d0) / 1e6))
EOF

ms() { python3 "$W/m.py" "$@"; }
# daemons [PID]: the processes whose CPU time counts with the benchmark's:
# the cairn daemon PID, and on GlusterFS its client and brick processes.
daemons() {
	local p=${1:-}
	if [[ $kind == gluster* ]]; then
		p+=,$(pgrep -f "glusterfs .*$L\$" | tr '\n' ,)$(pgrep -f "glusterfsd .*--volfile-id $GLVOL\." | tr '\n' ,)
	fi
	echo "${p#,}"
}
echo "# shard bench: MAX=2^$MAX, $BUCKETS buckets, $(nproc) cores; load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
SIZES=${SIZES:-$(seq 0 "$MAX")}
OPS=${OPS:-lookup churn} # OPS=lookup: no adds and deletes
for kind in ${KINDS:-htree linear}; do
	img="$W/$kind.img" L="$W/lower-$kind" M="$W/mnt-$kind"
	mkdir -p "$L" "$M"
	case $kind in
	htree | linear)
		# Inodes and room for three copies of every size (at least
		# 1.2 million and 8 GiB).
		total=0
		for e in $SIZES; do total=$((total + (1 << e))); done
		inodes=$((3 * total + 100000))
		[ "$inodes" -ge 1200000 ] || inodes=1200000
		truncate -s $((inodes * 7 / 1024 + 1))M "$img"
		opt=()
		[ "$kind" = linear ] && [ "${LINEAR_FILL:-}" != htree ] && opt=(-O ^dir_index)
		mkfs.ext4 -q -F -N "$inodes" "${opt[@]}" "$img"
		mount -o loop "$img" "$L"
		remount() { umount "$L"; mount -o loop "$img" "$L"; }
		;;
	gluster | gluster-linear)
		# A one-brick loopback volume (bench/gluster.sh); cold: client,
		# brick process and the brick's ext4 all unmounted and mounted
		# again. gluster-linear: the brick's ext4 without dir_index.
		opt=""
		[ "$kind" = gluster ] || opt="-O ^dir_index"
		CAIRN_GLUSTER_MKFS=$opt bench/gluster.sh up "$GLVOL" "$L" 16G
		remount() { bench/gluster.sh cold "$GLVOL" "$L" 2> /dev/null; }
		;;
	*) echo "shard.sh: unknown lower $kind (htree, linear, gluster, gluster-linear)" >&2; exit 2 ;;
	esac
	cat > "$W/$kind.toml" <<EOF
mount = "top"
[layer.base]
type = "local"
path = "$L"
[layer.top]
type = "shard"
over = "base"
$LAYOUT
[[rule]]
layer = "top"
match = "shard-*"
EOF
	for e in $SIZES; do
		n=$((1 << e))
		for c in native flat shard; do
			echo "1 $((n + 1))" > "$L/$c-$e.range"
			ms make "$L/$c-$e" > /dev/null
		done
		"$W/cairn" reshard -q "$W/$kind.toml" "shard-$e" > /dev/null
	done
	if [ "$kind" = linear ] && [ "${LINEAR_FILL:-}" = htree ]; then
		# Filled with htree (a linear directory of 2^18 takes O(N^2) to
		# fill), then made linear: without the feature the kernel reads
		# every directory block by block, and e2fsck -D rewrites the
		# directories compacted, as ext4 without dir_index keeps them.
		umount "$L"
		tune2fs -O ^dir_index "$img" > /dev/null
		e2fsck -fyD "$img" > /dev/null 2>&1 || [ $? -le 1 ]
		mount -o loop "$img" "$L"
	fi
	for phase in native flat shard; do
		remount
		pid=""
		if [ "$phase" = native ]; then D="$L"; else
			"$W/cairn" mount -f "$W/$kind.toml" "$M" 2>>"$W/daemon.log" & pid=$!
			for _ in $(seq 100); do mountpoint -q "$M" && break; sleep 0.1; done
			D="$M"
		fi
		for e in $SIZES; do
			look=$(ms lookup "$D/$phase-$e" "$(daemons $pid)")
			churn="- -"
			[ "$OPS" = lookup ] || churn=$(ms churn "$D/$phase-$e" "$(daemons $pid)")
			printf '%-7s %-6s 2^%-3d %7d lookup wall/cpu ms %7s %7s churn %8s %8s load %s\n' "$kind" "$phase" "$e" $((1 << e)) $look $churn "$(cut -d' ' -f1 /proc/loadavg)"
		done
		t0=$(date +%s.%N)
		last=$(echo $SIZES | awk '{print $NF}')
		cnt=$(ls -f "$D/$phase-$last" | wc -l)
		t1=$(date +%s.%N)
		find "$D/$phase-$last" > /dev/null
		t2=$(date +%s.%N)
		printf '%-7s %-6s 2^%-3d ls -f: %d names %.0f ms; find: %.0f ms\n' "$kind" "$phase" "$last" "$cnt" "$(echo "($t1 - $t0) * 1000" | bc)" "$(echo "($t2 - $t1) * 1000" | bc)"
		if [ -n "$pid" ]; then umount "$M"; wait "$pid"; fi
	done
	if [[ $kind == gluster* ]]; then bench/gluster.sh down "$GLVOL" "$L"; else
		umount "$L"
		rm -f "$img"
	fi
done
