#!/bin/sh
# test/cross.sh: the platforms cairn builds for (docs/portability.md), checked
# from this Linux/amd64 machine, so that a change that breaks one fails CI.
# For each target: go build ./... and go vet ./... (vet type-checks the test
# files too); with --link, also every package's test binary, built and
# linked (and run by true(1), not run). With --qemu, the in-process tests of
# the packages that need no lower directory (spec, pathmatch, registry,
# layer/fanout) run as linux/arm64 binaries under qemu-user (qemu-aarch64,
# Debian's qemu-user; setup.sh installs it).
#
#   test/cross.sh [--link] [--qemu]
#
# test.sh runs it with --qemu (CAIRN_CROSS=link adds --link, CAIRN_CROSS=0
# skips it outside CI).
set -eu
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
TARGETS="linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 freebsd/amd64"
link=false
qemu=false
for a in "$@"; do
	case "$a" in
	--link) link=true ;;
	--qemu) qemu=true ;;
	*) echo "test/cross.sh: unknown argument $a" >&2; exit 2 ;;
	esac
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
for t in $TARGETS; do
	os=${t%/*} arch=${t#*/}
	start=$(date +%s)
	# No cgo: a cross build has no C toolchain for the target.
	if ! GOOS=$os GOARCH=$arch CGO_ENABLED=0 go build ./... ||
		! GOOS=$os GOARCH=$arch CGO_ENABLED=0 go vet ./...; then
		echo "cross: $t FAILED (go build / go vet)"
		fail=1
		continue
	fi
	# Every test binary built and linked, run by true(1) instead of
	# itself (go test -c cannot name two packages' binaries cairn.test).
	if $link && ! GOOS=$os GOARCH=$arch CGO_ENABLED=0 go test -count=1 -exec true ./... >"$tmp/link" 2>&1; then
		cat "$tmp/link"
		echo "cross: $t FAILED (test binaries)"
		fail=1
		continue
	fi
	echo "cross: $t ok ($(($(date +%s) - start))s)"
done
if $qemu; then
	if ! command -v qemu-aarch64 >/dev/null 2>&1; then
		echo "cross: qemu-aarch64 missing (apt-get install qemu-user)"
		fail=1
	else
		start=$(date +%s)
		# The in-process tests that touch no lower directory: qemu-user
		# 7.2 (Debian 12) has no openat2, on which local stands (and so
		# every test over a real directory); see docs/portability.md.
		if CI=false GOARCH=arm64 CGO_ENABLED=0 go test -count=1 -exec qemu-aarch64 \
			./spec ./pathmatch ./registry ./layer/fanout; then
			echo "cross: linux/arm64 tests under qemu ok ($(($(date +%s) - start))s)"
		else
			echo "cross: linux/arm64 tests under qemu FAILED"
			fail=1
		fi
	fi
fi
exit $fail
