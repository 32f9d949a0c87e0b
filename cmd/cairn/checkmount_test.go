package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cairnfs.dev/cairn/internal/mounttest"
)

// TestCheckRefusesWhatMountRefuses: one validation path. Each of these
// stacks used to pass cairn check and fail at mount; now check refuses
// each with the option's position, and mount refuses it with the same
// words before anything is built (exit 3, a bad spec).
func TestCheckRefusesWhatMountRefuses(t *testing.T) {
	mounttest.Need(t)
	lower := t.TempDir()
	bad := []struct{ spec, where, want string }{
		{"zstd(level=30):" + lower, "inline:1:12", `option "level": must be from 1 to 22 for zstd, found 30`},
		{"gzip(chunk_size=3000):" + lower, "inline:1:17", `option "chunk_size": must be a power of two from 4KiB to 1MiB, found 3000`},
		{"lz4(chunk_size=3KiB):" + lower, "inline:1:16", `option "chunk_size": must be a power of two from 4KiB to 1MiB, found 3072`},
		{"snoop(ops=opne,log=/tmp/x.log):" + lower, "inline:1:11", `option "ops": unknown operation "opne"; did you mean "open"?`},
		{"snoop:" + lower, "inline:1:1", `option "log": a log file is needed`},
		{"shard(buckets=100):" + lower, "inline:1:7", `option "buckets": hash buckets 100: a power of two`},
		{"snoop(log=/nonexistent-dir/x.log):" + lower, "inline:1:11", `option "log": directory /nonexistent-dir does not exist`},
		{"snoop(uids=no-such-user-here,log=/tmp/x.log):" + lower, "inline:1:12", `option "uids": "no-such-user-here" is neither a number nor a known name`},
	}
	mux := filepath.Join(t.TempDir(), "mux.toml")
	os.WriteFile(mux, []byte("mount = \"m\"\n[layer.a]\ntype = \"local\"\npath = \""+lower+"\"\n[layer.b]\ntype = \"local\"\npath = \""+t.TempDir()+"\"\n[layer.m]\ntype = \"mux\"\nover = [\"a\", \"b\"]\nnames = [\"x\"]\n"), 0o644)
	bad = append(bad, struct{ spec, where, want string }{mux, mux + ":11:1", `option "names": 1 names for 2 lowers`})
	for _, b := range bad {
		out, code := cairn(t, "check", b.spec)
		if code != 3 || !strings.Contains(out, b.where+": ") || !strings.Contains(out, b.want) {
			t.Errorf("cairn check %s: exit %d:\n%s\nwant exit 3 and %s: ...%s", b.spec, code, out, b.where, b.want)
		}
		mnt := t.TempDir()
		out, code = cairn(t, "mount", b.spec, mnt)
		if code != 3 || !strings.Contains(out, b.want) {
			t.Errorf("cairn mount %s: exit %d:\n%s\nwant exit 3 and %s", b.spec, code, out, b.want)
		}
		if _, ok := mountAt(mnt); ok {
			cairn(t, "umount", mnt)
		}
	}
}
