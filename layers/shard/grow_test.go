//go:build linux

package shard_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/fsx"
	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/local"
	"cairnfs.dev/cairn/layers/shard"
)

// growing is a shard layer whose hash directories start with one bucket
// and split past maxBucket entries a bucket.
func growing(t testing.TB, lower string, maxBucket int) *shard.FS {
	t.Helper()
	l, err := local.New(lower)
	if err != nil {
		t.Fatal(err)
	}
	fs, err := shard.New(l, shard.Config{Default: shard.Layout{Scheme: shard.Hash, Buckets: 256, Prefix: shard.DefaultPrefix}, MaxBucket: maxBucket})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { layer.CloseStack(fs) })
	return fs
}

// record is directory dir's layout record as the mount shows it.
func record(t testing.TB, dir string) string {
	t.Helper()
	buf := make([]byte, 4096)
	n, err := unix.Getxattr(dir, "user.cairn-shard.layout", buf)
	if err != nil {
		t.Fatalf("%s: the record: %v", dir, err)
	}
	return string(buf[:n])
}

// waitGrown waits until directory dir's record is layout l, no growth
// under way.
func waitGrown(t testing.TB, dir string, l shard.Layout) {
	t.Helper()
	want := string((&shard.State{V: 1, Cur: l}).Encode())
	for i := 0; ; i++ {
		got := record(t, dir)
		if got == want {
			return
		}
		if i == 600 {
			t.Fatalf("%s: record %s, want %s", dir, got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// bucketDirs lists the bucket directories of lower directory dir.
func bucketDirs(t testing.TB, dir string) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// TestGrow fills a directory through the mount: it starts with one bucket
// and splits by itself as it fills, while a reader lists it (every name
// made before a listing began is listed once) and looks names up; at the
// end every name is once in the lower, in its bucket of the final layout,
// the old buckets gone.
func TestGrow(t *testing.T) {
	lower := t.TempDir()
	fs := growing(t, lower, 64)
	m := mounttest.Mount(t, fs)
	dir := m.Path("d")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	one := shard.Layout{Scheme: shard.Hash, Buckets: 1, Prefix: shard.DefaultPrefix}
	for i := 0; i < 10; i++ {
		os.WriteFile(filepath.Join(dir, fmt.Sprint(i)), []byte(fmt.Sprint(i)), 0o644)
	}
	if got := bucketDirs(t, filepath.Join(lower, "d")); strings.Join(got, ",") != ".shard.h0.0" {
		t.Fatalf("a new directory of 10 names keeps buckets %v, want one", got)
	}
	waitGrown(t, dir, one)

	const n = 6000
	var mu sync.Mutex
	made := 10 // names 0..made-1 exist
	stop := make(chan struct{})
	readErr := make(chan error, 1)
	go func() {
		listings, lookups := 0, 0
		defer func() { t.Logf("%d listings and %d lookups during the growth", listings, lookups) }()
		r := rand.New(rand.NewPCG(1, 2))
		for {
			select {
			case <-stop:
				readErr <- nil
				return
			default:
			}
			mu.Lock()
			k := made
			mu.Unlock()
			seen, err := listOnce(dir)
			if err != nil {
				readErr <- err
				return
			}
			listings++
			for name, c := range seen {
				if c != 1 {
					readErr <- fmt.Errorf("%s listed %d times", name, c)
					return
				}
			}
			for i := 0; i < k; i++ {
				if seen[fmt.Sprint(i)] != 1 {
					readErr <- fmt.Errorf("%d, made before the listing, listed %d times", i, seen[fmt.Sprint(i)])
					return
				}
			}
			for j := 0; j < 200; j++ {
				i := r.IntN(k)
				if b, err := os.ReadFile(filepath.Join(dir, fmt.Sprint(i))); err != nil || string(b) != fmt.Sprint(i) {
					readErr <- fmt.Errorf("lookup of %d: %q %v", i, b, err)
					return
				}
				lookups++
			}
		}
	}()
	for i := 10; i < n; i++ {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprint(i)), []byte(fmt.Sprint(i)), 0o644); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		made = i + 1
		mu.Unlock()
	}
	// 6000 names at 64 a bucket: 128 buckets.
	final := shard.Layout{Scheme: shard.Hash, Buckets: 128, Prefix: shard.DefaultPrefix}
	waitGrown(t, dir, final)
	close(stop)
	if err := <-readErr; err != nil {
		t.Fatal(err)
	}
	initial := map[string]string{}
	for i := 0; i < n; i++ {
		initial[fmt.Sprint(i)] = fmt.Sprint(i)
	}
	w := &workload{model: map[string]string{}, uncertain: map[string]bool{}}
	checkDir(t, dir, filepath.Join(lower, "d"), final, initial, w)
}

// TestGrowRename: a rename of a directory while the daemon grows it
// succeeds (no EBUSY): the growth stops at its next batch, and the next
// name made in the directory, under its new name, resumes it.
func TestGrowRename(t *testing.T) {
	lower := t.TempDir()
	fs := growing(t, lower, 64)
	m := mounttest.Mount(t, fs)
	if err := os.Mkdir(m.Path("r"), 0o755); err != nil {
		t.Fatal(err)
	}
	initial := fillFlat(t, filepath.Join(lower, "r", ".shard.h0.0"), 8000)
	os.WriteFile(m.Path("r", "first"), []byte("first"), 0o644)
	initial["first"] = "first"
	buf := make([]byte, 4096)
	for i := 0; ; i++ {
		k, _ := unix.Getxattr(m.Path("r"), "user.cairn-shard.progress", buf)
		st := string(buf[:max(k, 0)])
		var moved int
		if i := strings.Index(st, "1, "); i >= 0 {
			fmt.Sscanf(st[i+3:], "%d", &moved)
		}
		if strings.HasPrefix(st, "running") && moved > 0 {
			t.Logf("renamed at %s", st)
			break
		}
		if i == 20000 {
			t.Fatal("no growth")
		}
		time.Sleep(time.Millisecond)
	}
	if err := os.Rename(m.Path("r"), m.Path("s")); err != nil {
		t.Fatalf("rename during a growth: %v", err)
	}
	rec := record(t, m.Path("s"))
	t.Logf("record after the rename: %s", rec)
	if !strings.Contains(rec, `"from"`) {
		t.Error("the growth ended before the rename: run again")
	}
	os.WriteFile(m.Path("s", "last"), []byte("last"), 0o644)
	initial["last"] = "last"
	// 8002 names at 64 a bucket: 128 buckets.
	final := shard.Layout{Scheme: shard.Hash, Buckets: 128, Prefix: shard.DefaultPrefix}
	waitGrown(t, m.Path("s"), final)
	w := &workload{model: map[string]string{}, uncertain: map[string]bool{}}
	checkDir(t, m.Path("s"), filepath.Join(lower, "s"), final, initial, w)
}

// TestGrowSpecs: with growth on, small directories keep one
// bucket, a fixed buckets count in the spec keeps the old layout, and
// digits directories keep theirs.
func TestGrowSpecs(t *testing.T) {
	for _, c := range []struct {
		opts, want string
	}{
		{``, `{"v":1,"cur":{"scheme":"hash","buckets":1,"prefix":".shard."}}`},
		{`buckets = 256`, `{"v":1,"cur":{"scheme":"hash","buckets":256,"prefix":".shard."}}`},
		{`max_bucket = 0`, `{"v":1,"cur":{"scheme":"hash","buckets":256,"prefix":".shard."}}`},
		{`scheme = "digits"`, `{"v":1,"cur":{"scheme":"digits","buckets":1000,"prefix":".shard."}}`},
	} {
		lower := t.TempDir()
		p := mounttest.MountSpec(t, fmt.Sprintf(`mount = "top"
[layer.base]
type = "local"
path = %q
[layer.top]
type = "shard"
over = "base"
%s
`, lower, c.opts))
		os.Mkdir(p.Path("d"), 0o755)
		if got := record(t, p.Path("d")); got != c.want {
			t.Errorf("%s: a new directory's record %s, want %s", c.opts, got, c.want)
		}
		p.Unmount()
	}
	// Rules: a rule's buckets fixes the count, its max_bucket 0 stops
	// growth, and growth is the layer's default elsewhere.
	lower := t.TempDir()
	p := mounttest.MountSpec(t, fmt.Sprintf(`mount = "top"
[layer.base]
type = "local"
path = %q
[layer.top]
type = "shard"
over = "base"
[[rule]]
layer = "top"
match = "fixed"
buckets = 64
[[rule]]
layer = "top"
match = "still"
max_bucket = 0
[[rule]]
layer = "top"
match = "**"
`, lower))
	for d, want := range map[string]string{
		"fixed": `{"v":1,"cur":{"scheme":"hash","buckets":64,"prefix":".shard."}}`,
		"still": `{"v":1,"cur":{"scheme":"hash","buckets":256,"prefix":".shard."}}`,
		"other": `{"v":1,"cur":{"scheme":"hash","buckets":1,"prefix":".shard."}}`,
	} {
		os.Mkdir(p.Path(d), 0o755)
		if got := record(t, p.Path(d)); got != want {
			t.Errorf("rules: %s: record %s, want %s", d, got, want)
		}
	}
}

// TestGrowExisting: a directory sharded with a fixed layout grows once a
// growing layer serves it and it averages more than max_bucket a bucket;
// its entries are estimated from a few of its buckets.
func TestGrowExisting(t *testing.T) {
	lower := t.TempDir()
	initial := fillFlat(t, filepath.Join(lower, "d"), 20000)
	old := shard.Layout{Scheme: shard.Hash, Buckets: 8, Prefix: shard.DefaultPrefix}
	if err := stack(t, lower, 8).Reshard(context.Background(), "d", old, nil); err != nil {
		t.Fatal(err)
	}
	m := mounttest.Mount(t, growing(t, lower, 500))
	waitGrown(t, m.Path("d"), old)
	os.WriteFile(m.Path("d", "new"), []byte("new"), 0o644)
	initial["new"] = "new"
	// 20001 names at 500 a bucket: 64 buckets.
	l := shard.Layout{Scheme: shard.Hash, Buckets: 64, Prefix: shard.DefaultPrefix}
	waitGrown(t, m.Path("d"), l)
	checkDir(t, m.Path("d"), filepath.Join(lower, "d"), l, initial, &workload{model: map[string]string{}, uncertain: map[string]bool{}})
}

// TestFsxTreeGrowing runs the namespace model in directories that split
// every few names: renames of directories stop their growths, which
// resume.
func TestFsxTreeGrowing(t *testing.T) {
	fs := growing(t, t.TempDir(), 2)
	m := mounttest.Mount(t, fs)
	fsx.RunTree(t, fsx.TreeConfig{Dir: m.Dir, Ops: 3000})
}

// TestGrowCrash: the daemon is killed (kill -9) during a growth it
// started by itself, while a workload runs through the mount; after a
// remount every name is there once, and the next name made resumes the
// growth, which ends with every name in its bucket.
func TestGrowCrash(t *testing.T) {
	n := 20000
	if os.Getenv("CAIRN_LONG") != "" {
		n = 100000
	}
	lower := t.TempDir()
	spec := fmt.Sprintf(`mount = "top"
[layer.base]
type = "local"
path = %q
[layer.top]
type = "shard"
over = "base"
max_bucket = 500
[[rule]]
layer = "top"
match = "spool"
`, lower)
	p := mounttest.MountSpec(t, spec)
	dir := p.Path("spool")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// The names go straight into its one bucket in the lower (quicker
	// than through the mount); the daemon counts them at the first name
	// made through it.
	initial := fillFlat(t, filepath.Join(lower, "spool", ".shard.h0.0"), n)
	stop := make(chan struct{})
	w := startWorkload(dir, "", "", 2, stop)
	buf := make([]byte, 4096)
	for i := 0; ; i++ {
		k, err := unix.Getxattr(dir, "user.cairn-shard.progress", buf)
		st := ""
		if err == nil {
			st = string(buf[:k])
		}
		var moved int
		if i := strings.Index(st, "1, "); i >= 0 {
			fmt.Sscanf(st[i+3:], "%d", &moved)
		}
		if moved >= n/10 || strings.HasPrefix(st, "done") {
			t.Logf("killed at %s", st)
			break
		}
		if i == 20000 {
			t.Fatalf("no growth: %q %v", st, err)
		}
		time.Sleep(time.Millisecond)
	}
	w.killed.Store(true)
	p.Kill()
	if strings.HasPrefix(string(buf), "done") {
		t.Fatal("the growth ended before the kill")
	}
	close(stop)
	w.wg.Wait()
	if w.err != nil {
		t.Fatal(w.err)
	}
	p.Restart()
	rec := record(t, dir)
	if !strings.Contains(rec, `"from"`) {
		t.Fatalf("after the kill the record says %s, want a growth under way", rec)
	}
	t.Logf("after the remount: %s", rec)
	// Served whole before it resumes: every name once.
	seen, err := listOnce(dir)
	if err != nil {
		t.Fatal(err)
	}
	for name := range initial {
		if seen[name] != 1 {
			t.Fatalf("%s listed %d times after the crash", name, seen[name])
		}
	}
	os.WriteFile(filepath.Join(dir, "resume"), []byte("resume"), 0o644)
	w.model["resume"] = "resume"
	// 20000 names at 500 a bucket: 64 buckets (100000: 256).
	l := shard.Layout{Scheme: shard.Hash, Buckets: 64, Prefix: shard.DefaultPrefix}
	if n > 32000 {
		l.Buckets = 256
	}
	waitGrown(t, dir, l)
	checkDir(t, dir, filepath.Join(lower, "spool"), l, initial, w)
}
