#!/bin/sh
# Runs cairn's whole test suite: formatting, vet, and every test (FUSE mounts
# included) with the race detector. Needs root and /dev/fuse: CI=true is the
# default, so a test that cannot run fails instead of skipping (run with
# CI=false to let them skip). The last line counts the tests that passed,
# failed and were skipped; CAIRN_FAIL_ON_SKIP=1 (.ci/run) fails on any skip.
set -eu
cd "$(dirname "$0")"
export PATH="$PATH:/usr/local/go/bin:$HOME/go/bin"
export CI="${CI:-true}"
echo "== gofmt"
out=$(gofmt -l .)
if [ -n "$out" ]; then echo "gofmt: these files need formatting:"; echo "$out"; exit 1; fi
echo "== go vet"
go vet ./...
echo "== go test -race (CI=$CI)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/testreport" ./internal/testreport
# go test's exit code goes through a file: sh has no pipefail.
{ go test -race -count=1 -timeout 60m -json "$@" ./... 2>&1; echo $? >"$tmp/rc"; } | "$tmp/testreport" || exit 1
[ "$(cat "$tmp/rc")" = 0 ] || { echo "go test failed (exit $(cat "$tmp/rc"))"; exit 1; }
