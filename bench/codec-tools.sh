#!/usr/bin/env bash
# bench/codec-tools.sh: the gzip layer against `gzip -9` and the zstd layer
# against `zstd` (level 3), in time and space, on the same files (the
# seed's Figure 10). Each file is copied into a fresh mount (cp, then
# unmount, so that everything is written); the tools compress it from the
# page cache to a file beside it. Needs FUSE (root).
#
#   bench/codec-tools.sh [SIZE_MIB]     (default 32)
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
export PATH=$PATH:/usr/local/go/bin
SIZE=${1:-32}
W=$(mktemp -d /tmp/codec-tools-XXXXXX)
trap 'for m in "$W"/mnt*; do umount "$m" 2>/dev/null || true; done; rm -rf "$W"' EXIT
go build -o "$W/cairn" ./cmd/cairn
command -v zstd >/dev/null || { apt-get install -y -qq zstd >/dev/null; }

# Four kinds of data, SIZE MiB each (the generators end on SIGPIPE).
mk() { head -c $((SIZE << 20)) > "$W/$1"; }
set +o pipefail
yes a | tr -d '\n' | mk zeros
find /usr/local/go/src /usr/share/doc -type f \( -name '*.go' -o -name '*.txt' -o -name copyright \) -print0 2>/dev/null | xargs -0 cat 2>/dev/null | mk text
find /usr/bin /usr/lib -type f -size +100k -print0 2>/dev/null | xargs -0 cat 2>/dev/null | mk binary
find /usr/local/go/src /usr/share/doc -type f -print0 2>/dev/null | xargs -0 cat 2>/dev/null | xz -1 -T2 | mk compressed
set -o pipefail

spec() { # codec level
	cat > "$W/$1.toml" <<EOF
mount = "top"
[layer.base]
type = "local"
path = "$W/lower-$1"
[layer.top]
type = "$1"
over = "base"
level = $2
EOF
}
spec gzip 9
spec zstd 3

now() { date +%s.%N; }
printf '%-11s %-9s %10s %12s %8s\n' data config seconds bytes ratio
for kind in zeros text binary compressed; do
	f="$W/$kind"
	cat "$f" > /dev/null
	for c in gzip zstd; do
		rm -rf "$W/lower-$c" "$W/mnt-$c"
		mkdir -p "$W/lower-$c" "$W/mnt-$c"
		"$W/cairn" mount "$W/$c.toml" "$W/mnt-$c"
		t0=$(now)
		cp "$f" "$W/mnt-$c/$kind"
		umount "$W/mnt-$c"
		t1=$(now)
		b=$(stat -c %s "$W/lower-$c/$kind")
		printf '%-11s %-9s %10.3f %12d %8.3f\n' "$kind" "$c-layer" "$(echo "$t1 - $t0" | bc)" "$b" "$(echo "$b / ($SIZE * 1048576)" | bc -l)"
	done
	for t in "gzip -9" "zstd -q"; do
		t0=$(now)
		$t -c "$f" > "$W/out"
		t1=$(now)
		b=$(stat -c %s "$W/out")
		printf '%-11s %-9s %10.3f %12d %8.3f\n' "$kind" "${t% -q}" "$(echo "$t1 - $t0" | bc)" "$b" "$(echo "$b / ($SIZE * 1048576)" | bc -l)"
	done
done
