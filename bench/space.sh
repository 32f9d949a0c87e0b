#!/usr/bin/env bash
# bench/space.sh: the space a tree takes (issue 19), side by side in one run:
# plain ext4, btrfs compress-force=zstd:3 and compress=zstd:3, squashfs with
# zstd (level 3 and mksquashfs's default 15), rclone's compress remote (gzip)
# where rclone is installed, `tar | zstd -3` (the floor for a
# per-file scheme), `zstd -3` per file (the per-file floor), `gzip -r` and
# `lz4` per file (the issue's references), and each cairn codec stack
# (inline specs through `bin/cairn mount`, over a directory of the ext4).
#
# Usage: sudo bench/space.sh [--sets "go layers logs media"] [--out FILE.md] [STACK...]
#
#   STACK       cairn inline specs without the directory (default: zstd gzip
#               lz4 "zstd(chunk_size=128KiB)" zstd,pack pack); each mounts as
#               STACK:LOWER (a pack layer packs every small file at the unmount)
#   --sets S    the data sets, of: go (Go's source tree, $(go env GOROOT)/src),
#               layers (this repository's layers/), logs (50 MB of generated,
#               deterministic syslog-like lines), media (already compressed:
#               the Go tree as .tar.gz and .tar.xz, and 16 MiB of random bytes
#               in 4 files); default all four
#   --out FILE  also write the result table (markdown) to FILE
#
# Everything but btrfs and squashfs works in one ext4 image without discard
# ($CAIRN_BENCH_IMG, default /var/tmp/cairn-space.img, 4 GiB) on a loop
# device with direct I/O; btrfs gets a fresh 2 GiB image per run
# (/var/tmp/cairn-space-btrfs.img). Reported per data set and configuration:
# "bytes" (du -sb: apparent sizes, directories included), "files" (the sum
# of the regular files' sizes), "charged" (du -sk: the blocks the file system
# charges, in KiB), for btrfs what df sees (used, after sync, minus the empty
# file system's) and `btrfs filesystem df` (data and metadata used, metadata
# being DUP), the time to copy the tree in (cp -a, then sync; for the tools,
# the tool's run) and the time to read it back cold (tar -c of the tree
# through a pipe after drop_caches; GNU tar skips reading files when its
# archive is /dev/null). Times are indicative: the load average is printed.
# CAIRN_SPACE_KEEP=DIR keeps each cairn lower as DIR/SET-STACK (for
# bench/codec-lower.py).
set -euo pipefail

SETS="go layers logs media" OUT=
STACKS=()
while [ $# -gt 0 ]; do
	case "$1" in
	--sets) SETS=$2; shift 2 ;;
	--out) OUT=$2; shift 2 ;;
	-h|--help) sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	-*) echo "space.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
	*) STACKS+=("$1"); shift ;;
	esac
done
[ ${#STACKS[@]} -gt 0 ] || STACKS=(zstd gzip lz4 "zstd(chunk_size=128KiB)" zstd,pack pack)
[ "$(id -u)" = 0 ] || { echo "space.sh: needs root (loop devices, mounts)" >&2; exit 2; }
export PATH=$PATH:/usr/local/go/bin:/usr/sbin:/sbin
for t in mkfs.btrfs mksquashfs zstd lz4 xz gzip; do
	command -v $t >/dev/null || { echo "space.sh: $t missing (apt-get install -y btrfs-progs squashfs-tools zstd lz4 xz-utils)" >&2; exit 2; }
done
REPO=$(cd "$(dirname "$0")/.." && pwd)
CAIRN=$REPO/bin/cairn
(cd "$REPO" && go build -o bin/cairn ./cmd/cairn)

TAG=cairn-space-$$
MNT=/tmp/$TAG-mnt
BIMG=/var/tmp/cairn-space-btrfs.img BLOOP= BMNT=/tmp/$TAG-btrfs
SQMNT=/tmp/$TAG-sq
DIR= IMG= LOOP=
. "$REPO/bench/lib.sh"
cleanup() {
	set +e
	mountpoint -q "$MNT" && { "$CAIRN" umount "$MNT" || umount -l "$MNT"; }
	[ -n "${W:-}" ] && mountpoint -q "$W/rclone/mnt" && { fusermount3 -u "$W/rclone/mnt" || umount -l "$W/rclone/mnt"; }
	mountpoint -q "$SQMNT" && umount "$SQMNT"
	mountpoint -q "$BMNT" && umount "$BMNT"
	[ -n "$BLOOP" ] && losetup -d "$BLOOP"
	rm -f "$BIMG"
	rmdir "$MNT" "$BMNT" "$SQMNT" 2>/dev/null
	[ -n "${W:-}" ] && rm -rf "$W"
	scratch_ext4_remove
}
trap cleanup EXIT
[ -e "$BIMG" ] && { echo "space.sh: $BIMG exists; remove it" >&2; exit 2; }
scratch_ext4 4G /var/tmp/cairn-space.img
W=$DIR/$TAG
mkdir -p "$W/data" "$MNT" "$BMNT" "$SQMNT"

# The data sets, each a directory (read from the page cache while copying).
prepare() {
	local d=$W/data/$1
	mkdir -p "$d"
	case "$1" in
	go) cp -a "$(go env GOROOT)/src/." "$d/" ;;
	layers) cp -a "$REPO/layers/." "$d/" ;;
	logs) # 50 MB of syslog-like lines, the same every run
		awk -v d="$d" 'BEGIN {
			srand(19); split("sshd cron kernel systemd nginx postfix/smtpd dhclient CRON sudo dockerd", p, " ")
			split("Accepted publickey for|Connection closed by|session opened for user|Started Session|GET /index.html HTTP/1.1 200|connect from unknown|DHCPREQUEST on eth0 to|pam_unix(sudo:session): session closed for|container died|Out of memory: Killed process", m, "|")
			t = 1700000000; n = 0
			for (f = 0; f < 5; f++) {
				out = sprintf("%s/syslog.%d", d, f)
				for (s = 0; s < 10000000; ) {
					t += int(rand() * 3); i = int(rand() * 10) + 1
					l = sprintf("%s host%02d %s[%d]: %s %d.%d.%d.%d port %d id=%08x\n", strftime("%b %e %H:%M:%S", t, 1), int(rand() * 20), p[i], 1000 + int(rand() * 30000), m[i], int(rand() * 256), int(rand() * 256), int(rand() * 256), int(rand() * 256), 1024 + int(rand() * 60000), int(rand() * 4294967295))
					printf "%s", l > out; s += length(l)
				}
				close(out)
			}
		}' ;;
	media)
		tar -C "$(go env GOROOT)" --sort=name --mtime=@1700000000 --owner=0 --group=0 -cf - src | gzip -6 >"$d/go-src.tar.gz"
		tar -C "$REPO" --sort=name --mtime=@1700000000 --owner=0 --group=0 -cf - layers | xz -6 >"$d/layers.tar.xz"
		tar -C "$(go env GOROOT)" --sort=name --mtime=@1700000000 --owner=0 --group=0 -cf - src/net | xz -1 >"$d/go-net.tar.xz"
		for i in 1 2 3 4; do head -c 4M /dev/urandom >"$d/random$i.bin"; done ;;
	*) echo "space.sh: unknown data set $1" >&2; exit 2 ;;
	esac
}

now() { date +%s.%N; }
el() { printf '%.2f' "$(echo "$2 - $1" | bc)"; }
cold() { sync; echo 3 >/proc/sys/vm/drop_caches; }
# readback DIR: seconds to read the tree at DIR back cold
readback() {
	cold
	local t0
	t0=$(now)
	tar -C "$1" -cf - . | cat >/dev/null
	el "$t0" "$(now)"
}
fbytes() { find "$1" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}'; }
ROWS=$W/rows
: >"$ROWS"
# row SET CONFIG BYTES FILES CHARGED_KIB DF BTRFS_DF IN OUT
row() {
	printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$@" >>"$ROWS"
	printf '%-7s %-28s %12s %12s %10s %10s %-22s %7s %7s\n' "$@" >&2
}
# space SET CONFIG DIR IN OUT: a row from du of DIR
space() {
	row "$1" "$2" "$(du -sb "$3" | cut -f1)" "$(fbytes "$3")" "$(du -sk "$3" | cut -f1)" - - "$4" "$5"
}

for set in $SETS; do
	prepare "$set"
	src=$W/data/$set
	cat <(find "$src" -type f -print0 | xargs -0 cat) >/dev/null

	# plain ext4
	d=$W/plain
	mkdir -p "$d"
	t0=$(now); cp -a "$src/." "$d/"; sync; tin=$(el "$t0" "$(now)")
	space "$set" "ext4 (plain)" "$d" "$tin" "$(readback "$d")"
	rm -rf "$d"

	# btrfs, each a fresh file system
	for opt in compress-force=zstd:3 compress=zstd:3; do
		truncate -s 2G "$BIMG"
		mkfs.btrfs -q -f "$BIMG" >/dev/null
		BLOOP=$(losetup -f --show --direct-io=on "$BIMG")
		mount -o "$opt,nodiscard" "$BLOOP" "$BMNT"
		sync
		u0=$(df -B1 --output=used "$BMNT" | tail -1)
		mkdir "$BMNT/t"
		t0=$(now); cp -a "$src/." "$BMNT/t/"; sync; tin=$(el "$t0" "$(now)")
		btrfs filesystem sync "$BMNT" >/dev/null
		u1=$(df -B1 --output=used "$BMNT" | tail -1)
		bdf=$(btrfs filesystem df -b "$BMNT" | awk -F'[=, ]+' '/^Data/ {d = $NF} /^Metadata/ {m = $NF} END {printf "data %d, meta %d", d, m}')
		tout=$(readback "$BMNT/t")
		row "$set" "btrfs $opt" "$(du -sb "$BMNT/t" | cut -f1)" "$(fbytes "$BMNT/t")" "$(du -sk "$BMNT/t" | cut -f1)" "$((u1 - u0))" "$bdf" "$tin" "$tout"
		umount "$BMNT"
		losetup -d "$BLOOP"
		BLOOP=
		rm -f "$BIMG"
	done

	# squashfs (an image, read through a loop mount)
	for lvl in 3 15; do
		sq=$W/t.sqfs
		t0=$(now); mksquashfs "$src" "$sq" -comp zstd -Xcompression-level $lvl -noappend -quiet -no-progress >/dev/null; sync; tin=$(el "$t0" "$(now)")
		mount -o loop,ro "$sq" "$SQMNT"
		tout=$(readback "$SQMNT")
		umount "$SQMNT"
		row "$set" "squashfs zstd:$lvl" "$(stat -c %s "$sq")" - "$(du -k "$sq" | cut -f1)" - - "$tin" "$tout"
		rm -f "$sq"
	done

	# tar | zstd -3: the floor for a per-file scheme
	t0=$(now); tar -C "$src" -cf - . | zstd -q -3 >"$W/t.tar.zst"; sync; tin=$(el "$t0" "$(now)")
	row "$set" "tar \| zstd -3" "$(stat -c %s "$W/t.tar.zst")" - "$(du -k "$W/t.tar.zst" | cut -f1)" - - "$tin" -
	rm -f "$W/t.tar.zst"

	# rclone's compress remote (gzip, per file), where rclone is installed: a
	# mount over a directory (bench/peers/rclone-compress.toml), written
	# back at once, unmounted once every file is in the lower.
	if command -v rclone >/dev/null; then
		d=$W/rclone
		mkdir -p "$d/lower" "$d/mnt" "$d/cache"
		printf '[z]\ntype = compress\nremote = %s\n' "$d/lower" >"$d/rclone.conf"
		rclone mount --config "$d/rclone.conf" --daemon --vfs-cache-mode writes --vfs-write-back 0s \
			--cache-dir "$d/cache" z: "$d/mnt"
		want=$(find "$src" -type f | wc -l)
		t0=$(now)
		cp -r "$src/." "$d/mnt/" # (rclone keeps no modes or owners: cp -a fails)
		for _ in $(seq 600); do
			[ "$(find "$d/lower" -type f | wc -l)" -ge "$want" ] && break
			sleep 1
		done
		sync
		tin=$(el "$t0" "$(now)")
		fusermount3 -u "$d/mnt" || umount -l "$d/mnt"
		if [ "$(find "$d/lower" -type f | wc -l)" -ge "$want" ]; then
			space "$set" "rclone compress (gzip)" "$d/lower" "$tin" -
		else
			echo "space.sh: rclone compress: not every file reached the lower in 10 minutes; left out" >&2
		fi
		rm -rf "$d"
	fi

	# per-file tools, each on a copy: zstd -3, gzip -r (level 6), lz4 (level 1)
	for tool in "zstd -3" "gzip -r" "lz4"; do
		d=$W/tool
		mkdir -p "$d"
		cp -a "$src/." "$d/"; sync
		t0=$(now)
		case "$tool" in
		zstd*) find "$d" -type f -print0 | xargs -0 -r zstd -q -3 --rm ;;
		gzip*) gzip -r "$d" ;;
		lz4) find "$d" -type f -print0 | xargs -0 -r lz4 -q -m --rm ;;
		esac
		sync
		space "$set" "$tool per file" "$d" "$(el "$t0" "$(now)")" -
		rm -rf "$d"
	done

	# cairn stacks: copy in, unmount (all written), measure the lower, mount again to read cold
	for st in "${STACKS[@]}"; do
		lower=$W/lower
		mkdir -p "$lower"
		"$CAIRN" mount "$st:$lower" "$MNT"
		t0=$(now); cp -a "$src/." "$MNT/"; sync; "$CAIRN" umount "$MNT"; tin=$(el "$t0" "$(now)")
		"$CAIRN" mount "$st:$lower" "$MNT"
		tout=$(readback "$MNT")
		"$CAIRN" umount "$MNT"
		space "$set" "cairn $st:" "$lower" "$tin" "$tout"
		[ -z "${CAIRN_SPACE_KEEP:-}" ] || { rm -rf "$CAIRN_SPACE_KEEP/$set-$st"; mkdir -p "$CAIRN_SPACE_KEEP"; cp -a "$lower" "$CAIRN_SPACE_KEEP/$set-$st"; }
		rm -rf "$lower"
	done
	rm -rf "$src"
done

{
	echo "Load average (1, 5, 15 min) at the end: $(cut -d' ' -f1-3 /proc/loadavg), on $(nproc) cores; $(uname -r)."
	echo
	echo "| set | configuration | bytes (du -sb) | file bytes | charged KiB (du -sk) | btrfs df used delta | btrfs filesystem df | copy in s | read cold s |"
	echo "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |"
	cat "$ROWS"
} | tee "${OUT:-/dev/null}"
