#!/bin/bash
# bench/replica-verify.sh: the cost of the check for changes made outside
# cairn (docs/replica.md): a replica of two ext4 file systems on loop
# devices holding a tree of N entries (N/100 directories of 99 files, made
# through the mount), remounted three times warm and three times with the
# loop file systems remounted first (their inodes read again); prints the
# walk time of each replica, from the log's "no change made outside cairn"
# lines. Needs root. CAIRN=path/to/cairn N=10000 bench/replica-verify.sh
set -e
N=${N:-10000}
CAIRN=${CAIRN:-cairn}
W=$(mktemp -d);  rm -rf $W; mkdir -p $W/m1 $W/m2 $W/mnt
for i in 1 2; do truncate -s 1G $W/img$i; mkfs.ext4 -q -F $W/img$i; mount -o loop $W/img$i $W/m$i; mkdir $W/m$i/data; done
cat > $W/spec.toml <<S
mount = "r"
[layer.r]
type = "replica"
over = ["a", "b"]
[layer.a]
type = "local"
path = "$W/m1/data"
[layer.b]
type = "local"
path = "$W/m2/data"
S
$CAIRN mount --log-file $W/log $W/spec.toml $W/mnt
python3 - "$W/mnt" "$N" <<'P'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for d in range(n // 100):
    p = os.path.join(root, "d%d" % d); os.mkdir(p)
    for f in range(99):
        with open(os.path.join(p, "f%d" % f), "w") as fh: fh.write("x" * 100)
P
cairn_umount() { $CAIRN umount $W/mnt; }
cairn_umount
for run in warm1 warm2 warm3; do
  $CAIRN mount --log-file $W/log $W/spec.toml $W/mnt
  sleep 3; cairn_umount
done
for run in cold1 cold2 cold3; do
  for i in 1 2; do umount $W/m$i; mount -o loop $W/img$i $W/m$i; done
  $CAIRN mount --log-file $W/log $W/spec.toml $W/mnt
  sleep 8; cairn_umount
done
grep -o '"msg":"replica: no change[^"]*".*' $W/log | sed 's/.*"replica":\([0-9]\).*"objects":\([0-9]*\).*"took":"\([^"]*\)".*/replica \1 objects \2 took \3/'
for i in 1 2; do umount $W/m$i; done; rm -rf $W
