#!/usr/bin/env bash
# bench/reqcost.sh: what one FUSE request costs, and how many requests each
# metadata workload makes (issue 20).
#
# Cost: T threads each fstat one open file N times on a mount whose
# attribute timeout is 0, so that every fstat is one GETATTR round trip.
# Configurations: native ext4 (the system call alone), go-fuse's own
# loopback (upstream go-fuse v2.12.1, bench/reqcost/loopback), libfuse's C
# passthrough_ll (-o timeout=0), and cairn's null stack (-attr-timeout 0).
# Each figure is the median of --runs runs (interleaved), in microseconds per
# fstat: "latency" is one thread's time per call, "per request" is the wall
# time over all calls of all threads (what the server sustains).
#
# Counts (--counts): the null stack served with -stats; each workload on the
# grep tree (untar, ls -lR warm, stat of 1000 names 1.5 s after the last
# lookup, 2000 creates of 2 KiB files in one directory, rm -rf) is bracketed
# by SIGUSR1, and the difference of the daemon's own request counts is
# printed by kind, per entry of the workload.
#
# Usage: sudo bench/reqcost.sh [--runs N] [--n N] [--threads "1 4"] [--dir DIR]
#                              [--bin NAME=CAIRN[:ARGS]]... [--counts] [--out FILE.md]
#
#   --bin NAME=CAIRN[:ARGS]  a cairn configuration: binary CAIRN, extra mount
#               arguments ARGS (space separated); repeat to compare builds or
#               options (e.g. cairn-uring=bin/cairn:-transport uring);
#               default cairn=bin/cairn, built from this tree
#   --dir DIR   an (ext4) directory to work in; by default a fresh 4 GiB ext4
#               image (loop device, direct I/O, no discard) is made and removed
#   --counts    also count the requests of each workload (cairn configurations)
#
# Needs root, fuse3, Go, gcc and libfuse3-dev (for passthrough_ll). Run from
# the repo root.
set -euo pipefail

RUNS=5 N=20000 THREADS="1 4" DIR= OUT= COUNTS=0
BINS=()
while [ $# -gt 0 ]; do
	case "$1" in
	--runs) RUNS=$2; shift 2 ;;
	--n) N=$2; shift 2 ;;
	--threads) THREADS=$2; shift 2 ;;
	--dir) DIR=$2; shift 2 ;;
	--out) OUT=$2; shift 2 ;;
	--bin) BINS+=("$2"); shift 2 ;;
	--counts) COUNTS=1; shift ;;
	-h|--help) sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "reqcost.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
done
[ "$(id -u)" = 0 ] || { echo "reqcost.sh: needs root (mounts)" >&2; exit 2; }
[ "$RUNS" -ge 3 ] || { echo "reqcost.sh: --runs must be at least 3" >&2; exit 2; }
REPO=$(cd "$(dirname "$0")/.." && pwd)
export PATH=$PATH:/usr/local/go/bin
TAG=cairn-reqcost-$$
MNT=/tmp/$TAG-mnt
LOOP= IMG= PID=
. "$REPO/bench/lib.sh"
cleanup() {
	set +e
	[ -n "${URING_WAS:-}" ] && echo "$URING_WAS" > "$URING_PARAM"
	[ -n "$PID" ] && { kill "$PID" 2>/dev/null; wait "$PID" 2>/dev/null; }
	mountpoint -q "$MNT" && { fusermount3 -u "$MNT" || umount -l "$MNT"; }
	rmdir "$MNT" 2>/dev/null
	scratch_ext4_remove
}
trap cleanup EXIT
scratch_ext4 4G /var/tmp/cairn-reqcost.img
W=$DIR/$TAG
mkdir -p "$W/lower" "$MNT" "$REPO/bin/bench"
echo x > "$W/lower/f"

echo "building..." >&2
(cd "$REPO" && go build -o bin/cairn ./cmd/cairn && go build -o bin/bench/reqcost ./bench/reqcost)
(cd "$REPO/bench/reqcost/loopback" && go build -o "$REPO/bin/bench/gofuse-loopback" .)
if [ ! -f /usr/share/doc/libfuse3-dev/examples/passthrough_ll.c ] || ! command -v pkg-config gcc >/dev/null; then
	echo "installing libfuse3-dev, pkg-config and gcc (for passthrough_ll)..." >&2
	apt-get install -y -q libfuse3-dev pkg-config gcc >/dev/null
fi
if [ ! -x "$REPO/bin/bench/passthrough_ll" ]; then
	gcc -O2 -o "$REPO/bin/bench/passthrough_ll" /usr/share/doc/libfuse3-dev/examples/passthrough_ll.c \
		$(pkg-config --cflags --libs fuse3)
fi
[ ${#BINS[@]} -gt 0 ] || BINS=("cairn=$REPO/bin/cairn")
CFGS=(native gofuse-loopback passthrough_ll)
declare -A BIN ARGS
for b in "${BINS[@]}"; do
	name=${b%%=*} rest=${b#*=}
	BIN[$name]=${rest%%:*}
	ARGS[$name]=$([ "$rest" != "${rest#*:}" ] && echo "${rest#*:}" || true)
	[ -x "${BIN[$name]}" ] || { echo "reqcost.sh: --bin $b: no such executable" >&2; exit 2; }
	CFGS+=("$name")
done

# A configuration over FUSE's io_uring transport needs the kernel's switch
# (read at each mount): on for the run, put back at the end.
URING_PARAM=/sys/module/fuse/parameters/enable_uring URING_WAS=
if [[ "${BINS[*]}" == *uring* ]] && [ -w "$URING_PARAM" ]; then
	URING_WAS=$(cat "$URING_PARAM")
	echo Y > "$URING_PARAM"
fi

waitmount() { for _ in $(seq 100); do mountpoint -q "$MNT" && return 0; sleep 0.05; done; echo "reqcost.sh: $1 did not mount" >&2; exit 1; }
up() { # up CONFIG [extra cairn args]: mount it (PID: the server)
	local cfg=$1; shift
	case "$cfg" in
	native) return 0 ;;
	gofuse-loopback) "$REPO/bin/bench/gofuse-loopback" "$W/lower" "$MNT" & PID=$! ;;
	passthrough_ll) "$REPO/bin/bench/passthrough_ll" -f -o source="$W/lower",timeout=0 "$MNT" & PID=$! ;;
	*)
		# shellcheck disable=SC2086
		"${BIN[$cfg]}" mount -f -attr-timeout 0 ${ARGS[$cfg]} "$@" "null:$W/lower" "$MNT" 2>"$W/$cfg.log" & PID=$! ;;
	esac
	waitmount "$cfg"
}
down() {
	[ -n "$PID" ] || return 0
	fusermount3 -u "$MNT" 2>/dev/null || umount -l "$MNT"
	wait "$PID" 2>/dev/null || true
	PID=
}
path() { [ "$1" = native ] && echo "$W/lower/f" || echo "$MNT/f"; }

RAW=$W/raw.csv
: > "$RAW"
for r in $(seq 1 "$RUNS"); do
	for cfg in "${CFGS[@]}"; do
		echo "run $r/$RUNS: $cfg" >&2
		up "$cfg"
		"$REPO/bin/bench/reqcost" -n 2000 "$(path "$cfg")" >/dev/null # warm up
		for t in $THREADS; do
			read -r per lat < <("$REPO/bin/bench/reqcost" -n "$N" -threads "$t" "$(path "$cfg")")
			echo "$cfg,$t,$per,$lat,$(cut -d' ' -f1 /proc/loadavg)" >> "$RAW"
		done
		down
	done
done

table=$(awk -F, -v cfgs="${CFGS[*]}" -v threads="$THREADS" '
function median(a, n,   i, j, t) {
	for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j+1] = a[j]; a[j+1] = t }
	return (n % 2) ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
}
{ k = $1 SUBSEP $2; n[k]++; per[k, n[k]] = $3; lat[k, n[k]] = $4; nl++; load[nl] = $5 }
END {
	nc = split(cfgs, cf, " "); nt = split(threads, th, " ")
	hdr = "| configuration |"; sep = "| --- |"
	for (t = 1; t <= nt; t++) { hdr = hdr " " th[t] " thread(s): latency | per request | vs passthrough_ll |"; sep = sep " --- | --- | --- |" }
	print hdr; print sep
	for (t = 1; t <= nt; t++) { k = "passthrough_ll" SUBSEP th[t]; delete a; for (i = 1; i <= n[k]; i++) a[i] = per[k, i]; ref[t] = median(a, n[k]) }
	for (c = 1; c <= nc; c++) {
		row = "| " cf[c] " |"
		for (t = 1; t <= nt; t++) {
			k = cf[c] SUBSEP th[t]; m = n[k]
			delete a; delete b; lo = 1e18; hi = 0
			for (i = 1; i <= m; i++) { a[i] = lat[k, i]; b[i] = per[k, i]; if (b[i] < lo) lo = b[i]; if (b[i] > hi) hi = b[i] }
			ml = median(a, m); mp = median(b, m)
			row = row sprintf(" %.1f µs | %.1f µs (%.1f..%.1f) | %.2fx |", ml / 1000, mp / 1000, lo / 1000, hi / 1000, ref[t] ? mp / ref[t] : 0)
		}
		print row
	}
	delete a; for (i = 1; i <= nl; i++) a[i] = load[i]
	printf "\nload average (1-min) during the runs: median %.2f\n", median(a, nl)
}' "$RAW")
echo
echo "$table"
echo
echo "runs: $RUNS; $N fstats per thread; raw: config,threads,ns per request,ns latency,load"

COUNTTABLE=
if [ "$COUNTS" = 1 ]; then
	GREP_TAR=${CAIRN_BENCH_TARBALL:-$REPO/../shared/bench/grep_3.8.orig.tar.xz}
	TREE=$W/tree.tar
	grep_tree "$GREP_TAR" "$TREE"
	NFILES=$(tar -tf "$TREE" | wc -l)
	snap() { # snap FILE: SIGUSR1 and wait for the counts with the next seq
		local before; before=$(sed -n 's/.*"seq":\([0-9]*\).*/\1/p' "$W/stats.json" 2>/dev/null || true)
		kill -USR1 "$PID"
		for _ in $(seq 200); do
			local s; s=$(sed -n 's/.*"seq":\([0-9]*\).*/\1/p' "$W/stats.json" 2>/dev/null || true)
			[ -n "$s" ] && [ "$s" != "${before:-}" ] && { cp "$W/stats.json" "$1"; return 0; }
			sleep 0.02
		done
		echo "reqcost.sh: no counts from the daemon" >&2; exit 1
	}
	diffcounts() { # diffcounts BEFORE AFTER ENTRIES: "kind per entry" pairs, largest first
		python3 - "$1" "$2" "$3" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))["requests"]; b = json.load(open(sys.argv[2]))["requests"]; n = int(sys.argv[3])
d = {k: b.get(k, 0) - a.get(k, 0) for k in b}
d = {k: v for k, v in d.items() if v > 0}
tot = sum(d.values())
print("%.2f | %s" % (tot / n, ", ".join("%s %.2f" % (k, v / n) for k, v in sorted(d.items(), key=lambda x: -x[1]))))
PY
	}
	COUNTTABLE="| configuration | workload | entries | requests per entry | by kind, per entry |"$'\n'"| --- | --- | --- | --- | --- |"
	for cfg in "${CFGS[@]}"; do
		case "$cfg" in native|gofuse-loopback|passthrough_ll) continue ;; esac
		rm -f "$W/stats.json"
		# the default timeouts here, not -attr-timeout 0: the counts of the mount as users run it
		# shellcheck disable=SC2086
		"${BIN[$cfg]}" mount -f -stats "$W/stats.json" ${ARGS[$cfg]} "null:$W/lower" "$MNT" 2>"$W/$cfg.log" & PID=$!
		waitmount "$cfg"
		d=$MNT/t
		mkdir "$d"
		step() { # step NAME ENTRIES COMMAND...
			local name=$1 n=$2; shift 2
			snap "$W/c0.json"; "$@"; snap "$W/c1.json"
			COUNTTABLE+=$'\n'"| $cfg | $name | $n | $(diffcounts "$W/c0.json" "$W/c1.json" "$n") |"
		}
		step untar "$NFILES" tar -xf "$TREE" -C "$d"
		ls -lR "$d" > /dev/null
		step "ls -lR (warm)" "$NFILES" sh -c "ls -lR '$d' > /dev/null"
		mapfile -t names < <(cd "$d" && find . -type f | head -1000)
		sleep 1.5
		step "stat of 1000 names after 1.5 s" 1000 sh -c "cd '$d' && stat ${names[*]} > /dev/null"
		mkdir "$d/many"
		head -c 2048 /dev/urandom > "$W/blob"
		step "2000 creates of 2 KiB in one directory" 2000 sh -c "for i in \$(seq 2000); do cat '$W/blob' > '$d/many/f'\$i; done"
		step "rm -rf" "$((NFILES + 2001))" rm -rf "$d"
		down
	done
	echo
	echo "$COUNTTABLE"
fi
if [ -n "$OUT" ]; then
	{ echo "$table"; echo; [ -n "$COUNTTABLE" ] && { echo "$COUNTTABLE"; echo; }; echo "Raw results (config,threads,ns per request,ns latency,load):"; echo; echo '```'; cat "$RAW"; echo '```'; } > "$OUT"
fi
rm -rf "$W"
