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
