#!/usr/bin/env bash
# bench/crypt.sh: the crypt layer against gocryptfs (default options) and the
# null stack, in one run, on an ext4 loop image without discard (issue 6).
#
#   sudo bench/crypt.sh [--runs N] [--size MiB] [--only LIST] [--configs LIST] [--dir D] [--out F]
#
# Workloads (cold = unmount, sync, drop caches, mount): 1 GiB sequential
# write (dd bs=1M conv=fsync) and cold read; untar of about 10,000 files (8
# copies of GNU grep 3.8); ls -lR cold; rm -rf; the pefs directory test
# (create N files, ls -Al, remove them, N = 1000, 2000, 3000, files created by
# the shell without a fork per file); the large compile (unpack grep 3.8,
# ./configure, make -j2, all inside the mount). Prints a table of medians
# (seconds) and keeps the raw times in --out (default /tmp/crypt-bench.csv).
set -euo pipefail

RUNS=3 DIR= SIZE=1024 OUT=/tmp/crypt-bench.csv ONLY="seq tree pefs compile" CONFIGS="null crypt gocryptfs"
while [ $# -gt 0 ]; do
	case "$1" in
	--runs) RUNS=$2; shift 2 ;;
	--dir) DIR=$2; shift 2 ;;
	--size) SIZE=$2; shift 2 ;;
	--out) OUT=$2; shift 2 ;;
	--only) ONLY=${2//,/ }; shift 2 ;;
	--configs) CONFIGS=${2//,/ }; shift 2 ;;
	-h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "crypt.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
done
[ "$(id -u)" = 0 ] || { echo "crypt.sh: needs root (drop_caches, mounts)" >&2; exit 2; }
command -v gocryptfs >/dev/null || { apt-get update -qq && apt-get install -y -qq gocryptfs >/dev/null; }
REPO=$(cd "$(dirname "$0")/.." && pwd)
GREP_TAR=${CAIRN_BENCH_TARBALL:-$REPO/../shared/bench/grep_3.8.orig.tar.xz}
[ -f "$GREP_TAR" ] || { echo "crypt.sh: $GREP_TAR not found (set CAIRN_BENCH_TARBALL)" >&2; exit 2; }

TAG=cairn-crypt-bench-$$
MNT=/tmp/$TAG-mnt
LOOP= IMG=
. "$REPO/bench/lib.sh"
cleanup() {
	set +e
	mountpoint -q "$MNT" && { fusermount3 -u "$MNT" || umount -l "$MNT"; }
	rmdir "$MNT" 2>/dev/null
	scratch_ext4_remove
}
trap cleanup EXIT
scratch_ext4 16G /var/tmp/cairn-crypt-bench.img
W=$DIR/$TAG
mkdir -p "$W" "$MNT"

echo "building cairn..." >&2
(cd "$REPO" && go build -o bin/cairn ./cmd/cairn)
CAIRN=$REPO/bin/cairn

TREE=$W/tree.tar
grep_tree "$GREP_TAR" "$TREE"
echo bench-password > "$W/pass"

# fresh CONFIG: a new, empty lower for CONFIG (initialised).
fresh() {
	local cfg=$1
	rm -rf "$W/lower"
	mkdir -p "$W/lower"
	case $cfg in
	null|crypt)
		cat > "$W/$cfg.toml" <<TOML
mount = "top"
[layer.base]
type = "local"
path = "$W/lower"
[layer.top]
type = "$cfg"
over = "base"
TOML
		if [ "$cfg" = crypt ]; then
			echo "passfile = \"$W/pass\"" >> "$W/crypt.toml"
			"$CAIRN" init "$W/crypt.toml" > /dev/null
		fi ;;
	gocryptfs) gocryptfs -init -q -passfile "$W/pass" "$W/lower" ;;
	esac
}
up() {
	case $1 in
	null|crypt) "$CAIRN" mount "$W/$1.toml" "$MNT" ;;
	gocryptfs) gocryptfs -q -passfile "$W/pass" "$W/lower" "$MNT" 2> /dev/null ;;
	esac
}
down() {
	for _ in $(seq 50); do fusermount3 -u "$MNT" 2>/dev/null && break; sleep 0.2; done
	while pgrep -f -- " $MNT\$" > /dev/null; do sleep 0.05; done
}
cold() { down; sync; echo 3 > /proc/sys/vm/drop_caches; up "$1"; }

: > "$OUT"
now() { echo "$EPOCHREALTIME"; }
# cpu: user+system time (clock ticks) of the file system's daemon, if any.
cpu() {
	local pid
	pid=$(pgrep -f -- " $MNT\$" | head -1)
	[ -n "$pid" ] && awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0
}
timed() {
	local name=$1 cfg=$2; shift 2
	local t0 t1 c0 c1
	c0=$(cpu)
	t0=$(now)
	"$@"
	t1=$(now)
	c1=$(cpu)
	echo "$cfg,$name,$(echo "$t1 - $t0" | bc -l)" >> "$OUT"
	echo "$cfg,${name}.daemon_cpu,$(echo "($c1 - $c0) / $(getconf CLK_TCK)" | bc -l)" >> "$OUT"
}

pefs() { # pefs N: the seed's create, ls -Al, rm in one directory
	local n=$1 i
	mkdir "$MNT/pefs$n"
	cd "$MNT/pefs$n"
	for ((i = 1; i <= n; i++)); do : > "test-$i"; done
	ls -Al > /dev/null
	find . -name 'test-*' -exec rm '{}' +
	cd /
	rmdir "$MNT/pefs$n"
}


onerun() {
	local cfg=$1
	if [[ " $ONLY " == *" seq "* ]]; then
		fresh "$cfg"; up "$cfg"; sync; echo 3 > /proc/sys/vm/drop_caches
		timed seqwrite "$cfg" dd if=/dev/zero of="$MNT/big" bs=1M count="$SIZE" conv=fsync status=none
		cold "$cfg"
		timed seqread_cold "$cfg" dd if="$MNT/big" of=/dev/null bs=1M status=none
		down
	fi
	if [[ " $ONLY " == *" tree "* ]]; then
		fresh "$cfg"; up "$cfg"; sync; echo 3 > /proc/sys/vm/drop_caches
		cat "$TREE" > /dev/null
		timed untar "$cfg" tar -xf "$TREE" -C "$MNT"
		timed untar_sync "$cfg" sync
		cold "$cfg"
		timed ls_lR_cold "$cfg" sh -c "ls -lR '$MNT' > /dev/null"
		timed ls_lR_warm "$cfg" sh -c "ls -lR '$MNT' > /dev/null"
		timed rm_rf "$cfg" sh -c "rm -rf '$MNT'/copy*"
		down
	fi
	if [[ " $ONLY " == *" pefs "* ]]; then
		fresh "$cfg"; up "$cfg"
		for n in 1000 2000 3000; do timed "pefs_$n" "$cfg" pefs "$n"; done
		down
	fi
	if [[ " $ONLY " == *" compile "* ]]; then
		fresh "$cfg"; up "$cfg"; sync; echo 3 > /proc/sys/vm/drop_caches
		local t0; t0=$(now)
		timed compile_untar "$cfg" tar -xJf "$GREP_TAR" -C "$MNT"
		cd "$MNT"/grep-3.8
		timed configure "$cfg" sh -c './configure -q > /dev/null 2>&1'
		timed make "$cfg" sh -c 'make -j2 > /dev/null 2>&1'
		cd /
		echo "$cfg,compile_total,$(echo "$(now) - $t0" | bc -l)" >> "$OUT"
		down
	fi
}

for r in $(seq 1 "$RUNS"); do
	for cfg in $CONFIGS; do
		echo "run $r/$RUNS: $cfg" >&2
		onerun "$cfg"
	done
done

echo
echo "$RUNS runs; $(uname -r), $(nproc) cores, load average at the end: $(cut -d' ' -f1-3 /proc/loadavg); $(gocryptfs --version | head -1)"
python3 - "$OUT" $CONFIGS <<'PY'
import csv, statistics, sys
rows = list(csv.reader(open(sys.argv[1])))
cfgs = sys.argv[2:]
names = []
for c, n, v in rows:
    if n not in names:
        names.append(n)
for title, f in (("Medians", statistics.median), ("Best runs (noise only adds time)", min)):
    med = {}
    for n in names:
        for c in cfgs:
            v = [float(x[2]) for x in rows if x[0] == c and x[1] == n]
            if v:
                med[(n, c)] = f(v)
    print("\n" + title + " (seconds):\n")
    print("| workload | " + " | ".join(cfgs) + " | crypt/gocryptfs | crypt/null |")
    print("|---" * (len(cfgs) + 3) + "|")
    for n in names:
        cells = ["%.3f" % med[(n, c)] if (n, c) in med else "-" for c in cfgs]
        r1 = "%.2f" % (med[(n, "crypt")] / med[(n, "gocryptfs")]) if (n, "crypt") in med and (n, "gocryptfs") in med and med[(n, "gocryptfs")] else "-"
        r2 = "%.2f" % (med[(n, "crypt")] / med[(n, "null")]) if (n, "crypt") in med and (n, "null") in med and med[(n, "null")] else "-"
        print("| %s | %s | %s | %s |" % (n, " | ".join(cells), r1, r2))
PY
