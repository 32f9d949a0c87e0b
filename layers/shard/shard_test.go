//go:build linux

package shard_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/fsx"
	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/local"
	"cairnfs.dev/cairn/layers/shard"
)

func stack(t testing.TB, lower string, buckets int) *shard.FS {
	t.Helper()
	l, err := local.New(lower)
	if err != nil {
		t.Fatal(err)
	}
	fs, err := shard.New(l, shard.Config{Default: shard.Layout{Scheme: shard.Hash, Buckets: buckets, Prefix: shard.DefaultPrefix}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { layer.CloseStack(fs) })
	return fs
}

// lowerNames lists every name in the lower below dir, as dir-relative
// paths.
func lowerNames(t testing.TB, dir string) []string {
	var out []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && p != dir {
			r, _ := filepath.Rel(dir, p)
			out = append(out, r)
		}
		return nil
	})
	return out
}

func TestInProcess(t *testing.T) {
	lower := t.TempDir()
	fs := stack(t, lower, 4)
	ctx := context.Background()
	if _, err := fs.Mkdir(ctx, "spool", 0o755); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 40; i++ {
		if err := layer.WriteFile(ctx, fs, fmt.Sprintf("spool/%d", i), []byte(fmt.Sprint(i)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Every file is in a bucket of the lower, none in the directory itself.
	top, _ := os.ReadDir(filepath.Join(lower, "spool"))
	for _, e := range top {
		if !strings.HasPrefix(e.Name(), shard.DefaultPrefix) || !e.IsDir() {
			t.Fatalf("lower spool holds %s, not a bucket", e.Name())
		}
	}
	if len(top) != 4 {
		t.Fatalf("%d buckets, want 4", len(top))
	}
	ents, err := fs.ReadDir(ctx, "spool", false)
	if err != nil || len(ents) != 40 {
		t.Fatalf("readdir: %d entries, %v", len(ents), err)
	}
	b, err := layer.ReadFile(ctx, fs, "spool/17")
	if err != nil || string(b) != "17" {
		t.Fatalf("read: %q %v", b, err)
	}
	if err := layer.WriteFile(ctx, fs, "spool/"+shard.DefaultPrefix+"x", nil, 0o644); err != syscall.EINVAL {
		t.Fatalf("a name with the bucket prefix: %v, want EINVAL", err)
	}
	if err := fs.Rmdir(ctx, "spool"); err != syscall.ENOTEMPTY {
		t.Fatalf("rmdir of a full sharded directory: %v", err)
	}
	for i := 0; i < 40; i++ {
		if err := fs.Unlink(ctx, fmt.Sprintf("spool/%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := fs.Rmdir(ctx, "spool"); err != nil {
		t.Fatal(err)
	}
	if n := lowerNames(t, lower); len(n) != 0 {
		t.Fatalf("left in the lower: %v", n)
	}
}

func TestLayoutKeysOrderBuckets(t *testing.T) {
	for _, l := range []shard.Layout{{Scheme: shard.Hash, Buckets: 256, Prefix: "p"}, {Scheme: shard.Digits, Buckets: 1000, Prefix: "p"}} {
		var last uint64
		names := []string{}
		for i := 0; i < 3000; i++ {
			names = append(names, fmt.Sprint(i), fmt.Sprintf("n%d", i))
		}
		sort.Slice(names, func(i, j int) bool { return l.Key(names[i]) < l.Key(names[j]) })
		lastB := 0
		for _, n := range names {
			k, b := l.Key(n), l.Bucket(n)
			if k >= 1<<62 || b < lastB || b >= l.Buckets {
				t.Fatalf("%s: name %s key %x bucket %d after bucket %d", l, n, k, b, lastB)
			}
			last, lastB = k, b
		}
		_ = last
	}
	d := shard.Layout{Scheme: shard.Digits, Buckets: 1000, Prefix: ".shard."}
	if got := d.BucketName(d.Bucket("123042")); got != ".shard.d3.042" {
		t.Fatalf("article 123042 in %s", got)
	}
}

// mountShard mounts a shard stack whose every directory is sharded with
// buckets buckets.
func mountShard(t *testing.T, buckets int) (string, *mounttest.Mounted, *shard.FS) {
	lower := t.TempDir()
	fs := stack(t, lower, buckets)
	return lower, mounttest.Mount(t, fs), fs
}

// TestFsxTree runs the namespace model inside a sharded directory with 4
// buckets: many names share a bucket; renames go in and out of it and
// between buckets, hard links span buckets.
func TestFsxTree(t *testing.T) {
	_, m, _ := mountShard(t, 4)
	fsx.RunTree(t, fsx.TreeConfig{Dir: m.Dir, Ops: 3000})
}

// TestFsxData runs the data model in sharded directories: files are
// passed through (no read or write reaches the daemon).
func TestFsxData(t *testing.T) {
	l, err := local.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := mounttest.CountIO(l)
	fs, err := shard.New(c, shard.Config{Default: shard.Layout{Scheme: shard.Hash, Buckets: 4, Prefix: shard.DefaultPrefix}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { layer.CloseStack(fs) })
	m := mounttest.Mount(t, fs)
	if !m.Server.Passthrough {
		t.Fatal("a shard stack must use passthrough")
	}
	fsx.Run(t, fsx.Config{Dir: m.Dir, Ops: 5000})
	if n, w := c.Reads.Load(), c.Writes.Load(); n != 0 || w != 0 {
		t.Errorf("passthrough on, but %d reads and %d writes reached the daemon", n, w)
	}
}

// TestIdentity: inode numbers are the lower's, hard links in two buckets
// share one, and a rename between a sharded and a plain directory keeps it.
func TestIdentity(t *testing.T) {
	lower, m, _ := mountShard(t, 64)
	os.Mkdir(m.Path("s"), 0o755)
	if err := os.WriteFile(m.Path("s", "a"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	// find a second name in another bucket
	var other string
	l := shard.Layout{Scheme: shard.Hash, Buckets: 64, Prefix: shard.DefaultPrefix}
	for i := 0; ; i++ {
		if n := fmt.Sprintf("b%d", i); l.Bucket(n) != l.Bucket("a") {
			other = n
			break
		}
	}
	if err := os.Link(m.Path("s", "a"), m.Path("s", other)); err != nil {
		t.Fatal(err)
	}
	var st1, st2, low unix.Stat_t
	unix.Lstat(m.Path("s", "a"), &st1)
	unix.Lstat(m.Path("s", other), &st2)
	unix.Lstat(filepath.Join(lower, "s", l.BucketName(l.Bucket("a")), "a"), &low)
	if st1.Ino != st2.Ino || st1.Ino != low.Ino || st1.Nlink != 2 {
		t.Fatalf("inodes: %d %d lower %d, nlink %d", st1.Ino, st2.Ino, low.Ino, st1.Nlink)
	}
	// out of the sharded directory into the root (sharded too) and a
	// directory made flat in the lower
	os.Mkdir(filepath.Join(lower, "flat"), 0o755)
	if err := os.Rename(m.Path("s", "a"), m.Path("flat", "a")); err != nil {
		t.Fatal(err)
	}
	var st3 unix.Stat_t
	unix.Lstat(m.Path("flat", "a"), &st3)
	if st3.Ino != st1.Ino {
		t.Fatal("rename changed the inode number")
	}
	if _, err := os.Stat(filepath.Join(lower, "flat", "a")); err != nil {
		t.Fatalf("a flat directory keeps its names itself: %v", err)
	}
}

// TestReaddirChurn lists a large sharded directory in small steps while
// writers create and unlink other names: every name present throughout is
// listed exactly once. CAIRN_LONG=1: 100,000 entries.
func TestReaddirChurn(t *testing.T) {
	n := 20000
	if os.Getenv("CAIRN_LONG") != "" {
		n = 100000
	}
	lower, m, _ := mountShard(t, 256)
	os.Mkdir(m.Path("d"), 0o755)
	// Fill through the lower's layout quickly: make the names in the lower.
	l := shard.Layout{Scheme: shard.Hash, Buckets: 256, Prefix: shard.DefaultPrefix}
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("stable-%d", i)
		b := filepath.Join(lower, "d", l.BucketName(l.Bucket(name)))
		os.Mkdir(b, 0o755)
		f, err := os.Create(filepath.Join(b, name))
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	stop := make(chan struct{})
	done := make(chan error, 2)
	for w := 0; w < 2; w++ {
		go func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					done <- nil
					return
				default:
				}
				p := m.Path("d", fmt.Sprintf("churn-%d-%d", w, i%500))
				if i%1000 < 500 {
					f, err := os.Create(p)
					if err != nil {
						done <- err
						return
					}
					f.Close()
				} else if err := os.Remove(p); err != nil {
					done <- err
					return
				}
			}
		}()
	}
	seen := map[string]int{}
	f, err := os.Open(m.Path("d"))
	if err != nil {
		t.Fatal(err)
	}
	for {
		names, err := f.Readdirnames(100)
		for _, nm := range names {
			seen[nm]++
		}
		if err == io.EOF || len(names) == 0 {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	close(stop)
	for w := 0; w < 2; w++ {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	for nm, c := range seen {
		if c != 1 {
			t.Errorf("%s listed %d times", nm, c)
		}
	}
	for i := 0; i < n; i++ {
		if seen[fmt.Sprintf("stable-%d", i)] != 1 {
			t.Fatalf("stable-%d listed %d times", i, seen[fmt.Sprintf("stable-%d", i)])
		}
	}
}

// TestSeekdir: telldir/seekdir come back to the same place.
func TestSeekdir(t *testing.T) {
	_, m, _ := mountShard(t, 16)
	os.Mkdir(m.Path("d"), 0o755)
	for i := 0; i < 300; i++ {
		os.WriteFile(m.Path("d", fmt.Sprint(i)), nil, 0o644)
	}
	fd, err := unix.Open(m.Path("d"), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	read := func() []string {
		buf := make([]byte, 1024)
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
		return names
	}
	read()
	off, _ := unix.Seek(fd, 0, io.SeekCurrent)
	first := read()
	read()
	if _, err := unix.Seek(fd, off, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	again := read()
	if strings.Join(first, ",") != strings.Join(again, ",") || len(first) == 0 {
		t.Fatalf("after seekdir: %v, before: %v", again, first)
	}
}

// TestDigits: Usenetfs's scheme through a mount: an article is in the
// bucket of its last digits, other names by hash; a flat spool converts.
func TestDigits(t *testing.T) {
	lower := t.TempDir()
	fillFlat(t, filepath.Join(lower, "spool"), 500)
	l, err := local.New(lower)
	if err != nil {
		t.Fatal(err)
	}
	d := shard.Layout{Scheme: shard.Digits, Buckets: 100, Prefix: shard.DefaultPrefix}
	fs, err := shard.New(l, shard.Config{Default: d})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { layer.CloseStack(fs) })
	if err := fs.Reshard(context.Background(), "spool", d, nil); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{".shard.d2.42/42", ".shard.d2.42/142", ".shard.d2.00/500", ".shard.d2.01/1"} {
		if _, err := os.Stat(filepath.Join(lower, "spool", p)); err != nil {
			t.Errorf("lower: %v", err)
		}
	}
	m := mounttest.Mount(t, fs)
	if b, err := os.ReadFile(m.Path("spool", "142")); err != nil || string(b) != "142" {
		t.Fatalf("article 142: %q %v", b, err)
	}
	seen, err := listOnce(m.Path("spool"))
	if err != nil || len(seen) != 500 {
		t.Fatalf("%d names listed, %v", len(seen), err)
	}
	os.Mkdir(m.Path("news"), 0o755)
	fsx.RunTree(t, fsx.TreeConfig{Dir: m.Path("news"), Ops: 1000})
}
