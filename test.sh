#!/bin/sh
# Runs cairn's whole test suite: formatting, vet, and every test (FUSE mounts
# included) with the race detector. Needs root for the FUSE tests.
set -eu
cd "$(dirname "$0")"
export PATH="$PATH:/usr/local/go/bin:$HOME/go/bin"
echo "== gofmt"
out=$(gofmt -l .)
if [ -n "$out" ]; then echo "gofmt: these files need formatting:"; echo "$out"; exit 1; fi
echo "== go vet"
go vet ./...
echo "== go test -race"
go test -race -count=1 -timeout 60m "$@" ./...
# -- xfstests (issue 25): the CI list (xfstests/ci.list) on the null and crypt
# stacks, compared with xfstests/expected/*.txt; CAIRN_XFSTESTS=quick runs the
# whole quick group instead (the long job, about 20 minutes a stack), and
# CAIRN_XFSTESTS=0 skips it outside CI. See docs/xfstests.md.
echo "== xfstests"
case "${CAIRN_XFSTESTS:-ci}" in
0) if [ "${CI:-}" = true ]; then xsel=--ci; else echo "skipped (CAIRN_XFSTESTS=0)"; xsel=; fi ;;
quick) xsel="-g quick" ;;
*) xsel=--ci ;;
esac
if [ -n "$xsel" ]; then
	xst=0
	for stack in null crypt; do
		# shellcheck disable=SC2086
		nice xfstests/run --stack "$stack" $xsel || xst=1
	done
	[ "$xst" = 0 ] || { echo "xfstests: unexpected results (see above and docs/xfstests.md)"; exit 1; }
fi
