# bench/lib.sh: what the benchmark scripts share. Source it; the functions
# use the caller's TAG (a unique name) and set or read DIR, IMG and LOOP.

# scratch_ext4 SIZE IMAGE: unless DIR is already set, make an ext4 file
# system of SIZE in the file IMAGE (or $CAIRN_BENCH_IMG), without discard,
# on a loop device with direct I/O, and mount it at DIR. The page cache and
# the root file system's discard then do not blur the figures.
scratch_ext4() {
	[ -z "$DIR" ] || return 0
	IMG=${CAIRN_BENCH_IMG:-$2}
	if [ -e "$IMG" ]; then
		echo "$(basename "$0"): $IMG exists; remove it or set CAIRN_BENCH_IMG" >&2
		IMG=
		exit 2
	fi
	truncate -s "$1" "$IMG"
	mkfs.ext4 -q -F -E nodiscard,lazy_itable_init=0,lazy_journal_init=0 "$IMG"
	LOOP=$(losetup -f --show --direct-io=on "$IMG")
	DIR=/tmp/$TAG-ext4
	mkdir -p "$DIR"
	mount -o nodiscard "$LOOP" "$DIR"
}

# scratch_ext4_remove: unmount and remove what scratch_ext4 made (for the
# caller's EXIT trap).
scratch_ext4_remove() {
	[ -n "${IMG:-}" ] || return 0
	umount "$DIR" && losetup -d "$LOOP"
	rmdir "$DIR"
	rm -f "$IMG"
}

# grep_tree TARBALL OUT: 8 copies of the source in TARBALL (~10,000 files
# and directories for GNU grep 3.8) as one uncompressed, deterministic tar
# at OUT, so that decompression is not timed. Prints its size.
grep_tree() {
	local stage
	stage=$(dirname "$2")/stage
	mkdir -p "$stage"
	for i in 1 2 3 4 5 6 7 8; do
		mkdir -p "$stage/copy$i"
		tar -xJf "$1" -C "$stage/copy$i"
	done
	tar --sort=name --mtime=@1700000000 --owner=0 --group=0 --numeric-owner -cf "$2" -C "$stage" .
	rm -rf "$stage"
	echo "tree: $(tar -tf "$2" | wc -l) entries, $(du -m "$2" | cut -f1) MiB" >&2
}
