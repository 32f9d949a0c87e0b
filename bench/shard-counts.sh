#!/usr/bin/env bash
# bench/shard-counts.sh: counts, not times. For directories of 2^k empty
# files (k in SIZES, default "6 10 14 17"), flat, sharded with 256 fixed
# buckets and with the growing layout (the bucket count its entries need
# at max_bucket MAX_BUCKET, default 4096), the cairn daemon's lower system
# calls for 1000 random lstat()s on a fresh mount (strace -f attached to
# the daemon): the distinct lower directories it opens, their 4 KiB blocks
# (what a cold cache reads at most), and its statx and getdents64 calls.
# The sharded directories are converted with `cairn reshard`, then their
# buckets moved to a fresh directory (ext4 never shrinks a directory: one
# sharded from the start has no flat past). Runs in DIR (default
# /tmp/shard-counts, on the file system to count on). Needs root, strace.
#
#   bench/shard-counts.sh [DIR]
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
export PATH=$PATH:/usr/local/go/bin
B=${1:-/tmp/shard-counts}
mkdir -p "$B"
C=$B/cairn
(cd "$REPO" && go build -o "$C" ./cmd/cairn)
for k in ${SIZES:-6 10 14 17}; do
	L=$B/l$k
	rm -rf "$L"
	mkdir -p "$L/flat" "$L/fixed" "$L/grow"
	for kind in fixed grow; do
		layout="buckets = 256"
		[ $kind = grow ] && layout="max_bucket = ${MAX_BUCKET:-4096}"
		cat > "$B/$kind.toml" <<T
mount = "top"
[layer.base]
type = "local"
path = "$L"
[layer.top]
type = "shard"
over = "base"
$layout
[[rule]]
layer = "top"
match = "$kind"
T
	done
	python3 - "$L" "$k" <<'PY'
import os, sys
L, k = sys.argv[1], int(sys.argv[2])
for d in ("flat", "fixed", "grow"):
    for i in range(1, 2**k + 1):
        open(f"{L}/{d}/{i}", "w").close()
PY
	"$C" reshard -q "$B/fixed.toml" fixed > /dev/null
	"$C" reshard -q "$B/grow.toml" grow > /dev/null
	python3 - "$L" <<'PY'
import os, sys
L = sys.argv[1]
for d in ("fixed", "grow"):
    x, x2 = f"{L}/{d}", f"{L}/{d}.new"
    os.mkdir(x2)
    os.setxattr(x2, "trusted.cairn.shard.layout", os.getxattr(x, "trusted.cairn.shard.layout"))
    for e in os.listdir(x):
        os.rename(f"{x}/{e}", f"{x2}/{e}")
    os.rmdir(x)
    os.rename(x2, x)
PY
	for kind in flat fixed grow; do
		spec=$B/grow.toml
		[ $kind = fixed ] && spec=$B/fixed.toml
		M=$B/mnt
		mkdir -p "$M"
		"$C" mount -f "$spec" "$M" > "$B/log" 2>&1 &
		pid=$!
		for i in $(seq 100); do mountpoint -q "$M" && break; sleep 0.1; done
		sleep 0.3
		strace -f -qq -o "$B/trace" -p $pid 2>/dev/null &
		sp=$!
		sleep 1
		python3 - "$M/$kind" "$k" <<'PY'
import os, sys, random
d, k = sys.argv[1], int(sys.argv[2])
r = random.Random(42)
for _ in range(1000):
    os.lstat(f"{d}/{r.randint(1, 2**k)}")
PY
		sleep 0.5
		kill -INT $sp
		wait $sp || true
		umount "$M"
		wait $pid || true
		python3 - "$B/trace" "$L" "$kind" "$k" <<'PY'
import os, re, sys, collections
tr, L, kind, k = sys.argv[1:]
calls, dirs = collections.Counter(), set()
for line in open(tr):
    m = re.match(r'\d+\s+(\w+)\((.*)', line)
    if not m:
        continue
    calls[m.group(1)] += 1
    if m.group(1) in ("openat", "openat2"):
        q = re.search(r'"([^"]*)"', m.group(2))
        if q and not q.group(1).startswith("/") and os.path.isdir(os.path.join(L, q.group(1))):
            dirs.add(q.group(1))
blocks = sum(os.stat(os.path.join(L, d)).st_blocks // 8 for d in dirs)
layout = os.getxattr(f"{L}/{kind}", "trusted.cairn.shard.layout").decode() if kind != "flat" else "flat"
print(f"2^{k} {kind:5} dirs {len(dirs):4} blocks {blocks:5} statx {calls['statx']:5} getdents64 {calls['getdents64']:3}  {layout}")
PY
	done
	rm -rf "$L"
done
