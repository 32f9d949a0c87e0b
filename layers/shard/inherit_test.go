//go:build linux

package shard_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layers/shard"
)

var root = mounttest.User{Uid: 0, Gid: 0}

// oracleDir is a directory of ext4 (the temporary directory's file system)
// that uid 65534 may enter.
func oracleDir(t *testing.T) string {
	d := t.TempDir()
	os.Chmod(d, 0o755)
	os.Chmod(filepath.Dir(d), 0o755)
	return d
}

// sameAsExt4 runs script as root in an ext4 directory and in dir, and
// says how their outputs differ.
func sameAsExt4(t *testing.T, dir, script string) {
	t.Helper()
	run := func(d string) string {
		out, err := root.Sh(t, d, script)
		if err != nil {
			out += "exit: " + err.Error()
		}
		return strings.ReplaceAll(out, d, "DIR")
	}
	want, got := run(oracleDir(t)), run(dir)
	if got != want {
		t.Errorf("through the mount:\n%s\non ext4:\n%s", got, want)
	}
}

// show prints what a new object in d got: mode, owner, group and ACL.
const show = `show() { for f in "$@"; do stat -c '%n %a %u %g' $f; getfacl -n --omit-header $f | tr '\n' ' '; echo; done; }
asNobody() { su -s /bin/sh nobody -c "umask 022; $1"; }
`

// inheritScript changes what a directory passes on to new objects (a
// default ACL, an access ACL, set-group-ID and its group) after objects are
// in it, so that a sharded directory's buckets exist before each change,
// and shows what new objects get, made by root and by uid 65534.
const inheritScript = show + `exec 2>&1
umask 022
mkdir d && touch d/a d/b d/c d/e d/h && mkdir d/s
setfacl -m u:65534:rwx d && setfacl -d -m u:65534:rwx d
touch d/f1 d/f2 d/f3 d/f4 d/f5 d/f6 && mkdir d/t1 d/t2 d/t3 && mkdir d/t1/x
asNobody 'touch d/n1 d/n2 d/n3 d/n4 d/n5 && mkdir d/m1 d/m2 d/m3'
show d d/f? d/t? d/t1/x d/n? d/m?
setfacl -d -m g::r-x,o::--- d
touch d/q1 d/q2 d/q3 d/q4 && mkdir d/r1 d/r2
show d d/q? d/r?
chgrp 65534 d && chmod g+s d
touch d/g1 d/g2 d/g3 d/g4 d/g5 && mkdir d/k1 d/k2 d/k3 && mkdir d/k1/x
asNobody 'touch d/p1 d/p2 d/p3 d/p4 && mkdir d/o1 d/o2'
show d d/g? d/k? d/k1/x d/p? d/o?
chmod 750 d && setfacl -k d
touch d/w1 d/w2 d/w3 d/w4 && mkdir d/v1 d/v2
asNobody 'touch d/u1 d/u2 d/u3' || echo nobody cannot create
show d d/w? d/v?
setfacl -b d && chmod g-s d && chgrp 0 d && chmod 777 d
touch d/z1 d/z2 d/z3 d/z4 && mkdir d/y1 d/y2
asNobody 'touch d/x1 d/x2 d/x3 && mkdir d/j1'
show d d/z? d/y? d/x? d/j?
`

// TestInheritLikeExt4: a new object in a sharded directory gets the
// default ACL, mode, group and set-group-ID bit it gets in an ext4
// directory, whoever makes it, before and after the directory's ACLs,
// mode and group change (its buckets follow each change).
func TestInheritLikeExt4(t *testing.T) {
	mounttest.NeedRoot(t)
	lower, m, _ := mountShard(t, 4)
	sameAsExt4(t, m.Dir, inheritScript)
	checkBuckets(t, filepath.Join(lower, "d"))
}

// checkBuckets says where a bucket of lower directory dir has other
// attributes than dir (owner, group, mode, ACLs).
func checkBuckets(t *testing.T, dir string) {
	t.Helper()
	attrs := func(p string) string {
		out, err := root.Command("sh", "-c", `stat -c '%a %u %g' "$1" && getfacl -n --omit-header "$1"`, "sh", p).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v %s", p, err, out)
		}
		return string(out)
	}
	want := attrs(dir)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), shard.DefaultPrefix) {
			continue
		}
		n++
		if got := attrs(filepath.Join(dir, e.Name())); got != want {
			t.Errorf("bucket %s:\n%s\ndirectory:\n%s", e.Name(), got, want)
		}
	}
	if n == 0 {
		t.Errorf("%s has no buckets", dir)
	}
}

// TestInheritDuringReshard: a flat directory with a default ACL is
// converted, and then split to more buckets, while its default ACL,
// access ACL, group and set-group-ID bit change through the mount: every
// bucket, old or new, ends with the directory's attributes, and new
// objects get what they get in an ext4 directory changed the same way.
func TestInheritDuringReshard(t *testing.T) {
	mounttest.NeedRoot(t)
	lower := t.TempDir()
	spool := filepath.Join(lower, "spool")
	fillFlat(t, spool, 20000)
	if out, err := root.Command("setfacl", "-d", "-m", "u:65534:rwx", spool).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	fs := stack(t, lower, 4)
	m := mounttest.Mount(t, fs)
	oracle := oracleDir(t)
	os.Mkdir(filepath.Join(oracle, "spool"), 0o755)
	if out, err := root.Command("setfacl", "-d", "-m", "u:65534:rwx", filepath.Join(oracle, "spool")).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	changes := []string{
		`setfacl -m u:65534:rwx spool && setfacl -d -m g::rwx spool`,
		`chgrp 65534 spool && chmod g+s spool`,
		`setfacl -d -m o::--- spool && chmod 770 spool`,
	}
	for _, to := range []shard.Layout{
		{Scheme: shard.Hash, Buckets: 16, Prefix: shard.DefaultPrefix},
		{Scheme: shard.Hash, Buckets: 64, Prefix: shard.DefaultPrefix},
	} {
		done := make(chan error, 1)
		var last shard.Progress
		go func() {
			done <- fs.Reshard(context.Background(), "spool", to, func(p shard.Progress) { last = p })
		}()
		for _, c := range changes {
			for _, d := range []string{m.Dir, oracle} {
				if out, err := root.Sh(t, d, c); err != nil {
					t.Fatalf("%s in %s: %v %s", c, d, err, out)
				}
			}
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		t.Logf("%s", last)
		checkBuckets(t, spool)
		changes = []string{`setfacl -x u:65534 spool && setfacl -d -m u:65534:r-x spool`, `chmod g-s spool && chgrp 0 spool`}
	}
	script := show + `exec 2>&1
touch spool/new1 spool/new2 spool/new3 && mkdir spool/newd1 spool/newd2
asNobody 'touch spool/nb1' || echo nobody cannot create
show spool spool/new*
`
	run := func(d string) string {
		out, _ := root.Sh(t, d, script)
		return strings.ReplaceAll(out, d, "DIR")
	}
	if got, want := run(m.Dir), run(oracle); got != want {
		t.Errorf("through the mount:\n%s\non ext4:\n%s", got, want)
	}
}
