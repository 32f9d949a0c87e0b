//go:build linux

package shard_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/local"
	"cairnfs.dev/cairn/layers/shard"
)

// fillFlat makes n files (and a few directories with a file each) in the
// lower directory dir, flat: the names a resharding must keep.
func fillFlat(t testing.TB, dir string, n int) map[string]string {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("%d", i+1)
		if i%1000 == 7 {
			name = fmt.Sprintf("sub-%d", i)
			os.Mkdir(filepath.Join(dir, name), 0o755)
			os.WriteFile(filepath.Join(dir, name, "inner"), []byte(name), 0o644)
			want[name] = "dir"
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
		want[name] = name
	}
	return want
}

// workload changes names of its own in dir until stop is closed: creates,
// unlinks, renames and hard links, keeping a model. A name whose last
// operation failed with ENOTCONN (a killed daemon) is uncertain.
type workload struct {
	mu        sync.Mutex
	model     map[string]string
	uncertain map[string]bool
	err       error
	wg        sync.WaitGroup
	// killed: the daemon is being killed; an operation in flight may then
	// fail with EIO too (an open whose reply the kernel took as the
	// connection went: its passthrough backing file went with it).
	killed atomic.Bool
}

// startWorkload runs workers in dir; a failing one says where its name is
// in lower (if given).
func startWorkload(dir, lower, prefix string, workers int, stop chan struct{}) *workload {
	w := &workload{model: map[string]string{}, uncertain: map[string]bool{}}
	for k := 0; k < workers; k++ {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			r := rand.New(rand.NewPCG(uint64(k), 1))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				a := fmt.Sprintf("%sw%d-%d", prefix, k, r.IntN(300))
				b := fmt.Sprintf("%sw%d-%d", prefix, k, r.IntN(300))
				w.mu.Lock()
				_, has := w.model[a]
				_, hasB := w.model[b]
				w.mu.Unlock()
				var err error
				var apply func()
				what := "create"
				touched := []string{a}
				switch op := r.IntN(4); {
				case !has:
					err = os.WriteFile(filepath.Join(dir, a), []byte(a), 0o644)
					apply = func() { w.model[a] = a }
				case op == 0:
					what = "unlink"
					err = os.Remove(filepath.Join(dir, a))
					apply = func() { delete(w.model, a) }
				case op == 1 && a != b:
					touched = append(touched, b)
					what = "rename"
					err = os.Rename(filepath.Join(dir, a), filepath.Join(dir, b))
					apply = func() { w.model[b] = w.model[a]; delete(w.model, a) }
				case op == 2 && !hasB:
					touched = append(touched, b)
					what = "link"
					err = os.Link(filepath.Join(dir, a), filepath.Join(dir, b))
					apply = func() { w.model[b] = w.model[a] }
				default:
					what = "read"
					var got []byte
					got, err = os.ReadFile(filepath.Join(dir, a))
					if err == nil && string(got) != w.want(a) {
						err = fmt.Errorf("%s reads %q, want %q", a, got, w.want(a))
					}
					apply = func() {}
				}
				w.mu.Lock()
				if err == nil {
					apply()
				} else if errors.Is(err, syscall.ENOTCONN) || errors.Is(err, syscall.ECONNABORTED) ||
					w.killed.Load() && errors.Is(err, syscall.EIO) {
					for _, n := range touched {
						w.uncertain[n] = true
					}
					w.mu.Unlock()
					return
				} else if w.err == nil {
					w.err = fmt.Errorf("worker %d, %s: %v", k, what, err)
					if lower != "" {
						out, _ := exec.Command("find", lower, "-name", a).CombinedOutput()
						w.err = fmt.Errorf("%v; in the lower: %s", w.err, out)
					}
				}
				w.mu.Unlock()
			}
		}()
	}
	return w
}

func (w *workload) want(a string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.model[a]
}

// listOnce lists dir in small steps and counts each name.
func listOnce(dir string) (map[string]int, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	seen := map[string]int{}
	for {
		names, err := f.Readdirnames(97)
		for _, n := range names {
			seen[n]++
		}
		if err == io.EOF || (err == nil && len(names) == 0) {
			return seen, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// checkDir compares the mount's directory with the initial names and the
// workload's model, and the lower: every name once, in its bucket, none
// left flat.
func checkDir(t *testing.T, mnt, lower string, l shard.Layout, initial map[string]string, w *workload) {
	t.Helper()
	seen, err := listOnce(mnt)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for k, v := range initial {
		want[k] = v
	}
	for k, v := range w.model {
		want[k] = v
	}
	for n, c := range seen {
		if c != 1 {
			t.Errorf("%s listed %d times", n, c)
		}
		if _, ok := want[n]; !ok && !w.uncertain[n] {
			t.Errorf("%s listed, not expected", n)
		}
	}
	for n, v := range want {
		if seen[n] == 0 && !w.uncertain[n] {
			t.Errorf("%s missing", n)
			continue
		}
		if w.uncertain[n] {
			continue
		}
		p := filepath.Join(mnt, n)
		if v == "dir" {
			p = filepath.Join(p, "inner")
			v = n
		}
		if b, err := os.ReadFile(p); err != nil || string(b) != v {
			t.Errorf("%s reads %q, %v", p, b, err)
		}
	}
	top, _ := os.ReadDir(lower)
	for _, e := range top {
		if !strings.HasPrefix(e.Name(), l.Prefix) {
			t.Errorf("lower %s still holds %s", lower, e.Name())
		}
	}
	lowerSeen := map[string]int{}
	for _, e := range top {
		in, _ := os.ReadDir(filepath.Join(lower, e.Name()))
		for _, x := range in {
			lowerSeen[x.Name()]++
			if got := l.BucketName(l.Bucket(x.Name())); got != e.Name() {
				t.Errorf("%s in bucket %s, belongs in %s", x.Name(), e.Name(), got)
			}
		}
	}
	for n, c := range lowerSeen {
		if c != 1 {
			t.Errorf("%s %d times in the lower", n, c)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

// TestReshardOnline converts a flat directory while writers change it and
// a reader lists it (each listing: every initial name once), then grows
// its buckets the same way.
func TestReshardOnline(t *testing.T) {
	n := 20000
	if os.Getenv("CAIRN_LONG") != "" {
		n = 100000
	}
	lower := t.TempDir()
	initial := fillFlat(t, filepath.Join(lower, "spool"), n)
	fs := stack(t, lower, 64)
	m := mounttest.Mount(t, fs)
	dir := m.Path("spool")
	for round, to := range []shard.Layout{
		{Scheme: shard.Hash, Buckets: 64, Prefix: shard.DefaultPrefix},
		{Scheme: shard.Hash, Buckets: 256, Prefix: shard.DefaultPrefix},
	} {
		stop := make(chan struct{})
		w := startWorkload(dir, lower, fmt.Sprintf("r%d", round), 2, stop)
		listErr := make(chan error, 1)
		go func() {
			listings := 0
			defer func() { t.Logf("%d listings during the resharding", listings) }()
			for {
				select {
				case <-stop:
					listErr <- nil
					return
				default:
				}
				seen, err := listOnce(dir)
				if err != nil {
					listErr <- err
					return
				}
				listings++
				for name, c := range seen {
					if c != 1 {
						listErr <- fmt.Errorf("%s listed %d times", name, c)
						return
					}
				}
				for name := range initial {
					if seen[name] != 1 {
						listErr <- fmt.Errorf("%s, there throughout, listed %d times", name, seen[name])
						return
					}
				}
			}
		}()
		var last shard.Progress
		if err := fs.Reshard(context.Background(), "spool", to, func(p shard.Progress) { last = p }); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s", last)
		time.Sleep(100 * time.Millisecond)
		close(stop)
		w.wg.Wait()
		if err := <-listErr; err != nil {
			t.Fatal(err)
		}
		if w.err != nil {
			t.Fatal(w.err)
		}
		checkDir(t, dir, filepath.Join(lower, "spool"), to, initial, w)
		for k, v := range w.model {
			initial[k] = v
		}
	}
}

// TestReshardRefusals: a flat directory holding a name with the bucket
// prefix is refused, untouched; a layout that does not grow is refused.
func TestReshardRefusals(t *testing.T) {
	lower := t.TempDir()
	fillFlat(t, filepath.Join(lower, "spool"), 50)
	os.WriteFile(filepath.Join(lower, "spool", shard.DefaultPrefix+"mine"), nil, 0o644)
	fs := stack(t, lower, 8)
	ctx := context.Background()
	l := shard.Layout{Scheme: shard.Hash, Buckets: 8, Prefix: shard.DefaultPrefix}
	err := fs.Reshard(ctx, "spool", l, nil)
	if err == nil || !strings.Contains(err.Error(), "rename them first") {
		t.Fatalf("a clash: %v", err)
	}
	t.Log(err)
	if ents, _ := os.ReadDir(filepath.Join(lower, "spool")); len(ents) != 51 {
		t.Fatalf("the refused directory changed: %d entries", len(ents))
	}
	// The flat directory is served flat meanwhile.
	if b, err := os.ReadFile(filepath.Join(lower, "spool", "3")); err != nil || string(b) != "3" {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(lower, "spool", shard.DefaultPrefix+"mine"))
	if err := fs.Reshard(ctx, "spool", l, nil); err != nil {
		t.Fatal(err)
	}
	err = fs.Reshard(ctx, "spool", shard.Layout{Scheme: shard.Hash, Buckets: 4, Prefix: shard.DefaultPrefix}, nil)
	if err == nil || !strings.Contains(err.Error(), "grows") {
		t.Fatalf("shrinking: %v", err)
	}
	t.Log(err)
}

// TestReshardCrash converts a flat directory in a daemon that is killed
// (kill -9) midway while a workload runs through the mount; after a
// remount, `cairn reshard` resumes; nothing is lost or doubled.
func TestReshardCrash(t *testing.T) {
	n := 20000
	if os.Getenv("CAIRN_LONG") != "" {
		n = 100000
	}
	lower := t.TempDir()
	initial := fillFlat(t, filepath.Join(lower, "spool"), n)
	spec := fmt.Sprintf(`mount = "top"
[layer.base]
type = "local"
path = %q
[layer.top]
type = "shard"
over = "base"
buckets = 64
[[rule]]
layer = "top"
match = "spool"
`, lower)
	p := mounttest.MountSpec(t, spec)
	dir := filepath.Join(p.Dir, "spool")
	stop := make(chan struct{})
	w := startWorkload(dir, "", "", 2, stop)
	if err := unix.Setxattr(dir, "user.cairn-shard.reshard", nil, 0); err != nil {
		t.Fatal(err)
	}
	// Kill once some entries moved, but not all.
	buf := make([]byte, 4096)
	for i := 0; ; i++ {
		k, err := unix.Getxattr(dir, "user.cairn-shard.progress", buf)
		if err != nil {
			t.Fatal(err)
		}
		st := string(buf[:k])
		var moved int
		if i := strings.Index(st, "1, "); i >= 0 {
			fmt.Sscanf(st[i+3:], "%d", &moved)
		}
		if moved >= n/10 || strings.HasPrefix(st, "done") {
			t.Logf("killed at %s", st)
			break
		}
		time.Sleep(time.Millisecond)
	}
	w.killed.Store(true)
	p.Kill()
	if strings.HasPrefix(string(buf), "done") {
		t.Fatal("the resharding ended before the kill")
	}
	close(stop)
	w.wg.Wait()
	if w.err != nil {
		t.Fatal(w.err)
	}
	// The lower holds every name once, some flat, some in buckets.
	p.Restart()
	sp := filepath.Join(filepath.Dir(p.Dir), "spec.toml")
	out, err := exec.Command(mounttest.Binary(t), "reshard", sp, dir).CombinedOutput()
	t.Logf("cairn reshard: %s", out)
	if err != nil {
		t.Fatal(err)
	}
	l := shard.Layout{Scheme: shard.Hash, Buckets: 64, Prefix: shard.DefaultPrefix}
	checkDir(t, dir, filepath.Join(lower, "spool"), l, initial, w)
	// And again: nothing to do.
	if out, err := exec.Command(mounttest.Binary(t), "reshard", sp, dir).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	// Unmounted, the command works on the stack itself; mounted, it says
	// to give the mount's path.
	out, err = exec.Command(mounttest.Binary(t), "reshard", "--layout", "hash 128", sp, "spool").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "in the mount") {
		t.Fatalf("offline reshard of a mounted stack: %s %v", out, err)
	}
	p.Unmount()
	out, err = exec.Command(mounttest.Binary(t), "reshard", "--layout", "hash 128", sp, "spool").CombinedOutput()
	t.Logf("cairn reshard (unmounted): %s", out)
	if err != nil {
		t.Fatal(err)
	}
	p.Restart()
	l.Buckets = 128
	checkDir(t, dir, filepath.Join(lower, "spool"), l, initial, w)
}

// TestReshardFullDisk converts a directory on a tmpfs that runs out of
// inodes midway (buckets are new directories): the run stops with the
// errno and says to run again; every name is still there; once there is
// room, the same call finishes.
func TestReshardFullDisk(t *testing.T) {
	mounttest.Need(t)
	lower := t.TempDir()
	if err := unix.Mount("tmpfs", lower, "tmpfs", 0, "nr_inodes=330"); err != nil {
		t.Fatalf("tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(lower, unix.MNT_DETACH) })
	initial := fillFlat(t, filepath.Join(lower, "spool"), 300)
	fs := stack(t, lower, 64)
	l := shard.Layout{Scheme: shard.Hash, Buckets: 64, Prefix: shard.DefaultPrefix}
	err := fs.Reshard(context.Background(), "spool", l, nil)
	if !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "run again to resume") {
		t.Fatalf("resharding on a full disk: %v", err)
	}
	t.Log(err)
	m := mounttest.Mount(t, fs)
	w := &workload{model: map[string]string{}, uncertain: map[string]bool{}}
	seen, err := listOnce(m.Path("spool"))
	if err != nil {
		t.Fatal(err)
	}
	for n := range initial {
		if seen[n] != 1 {
			t.Fatalf("%s listed %d times after the stop", n, seen[n])
		}
		if n[0] != 's' {
			if b, err := os.ReadFile(m.Path("spool", n)); err != nil || string(b) != n {
				t.Fatalf("%s: %q %v", n, b, err)
			}
		}
	}
	if err := unix.Mount("tmpfs", lower, "tmpfs", unix.MS_REMOUNT, "nr_inodes=1000"); err != nil {
		t.Fatal(err)
	}
	if err := fs.Reshard(context.Background(), "spool", l, nil); err != nil {
		t.Fatal(err)
	}
	checkDir(t, m.Path("spool"), filepath.Join(lower, "spool"), l, initial, w)
}

// noRenameFlags is a lower that refuses renameat2's flags, as GlusterFS's
// client does (EINVAL).
type noRenameFlags struct{ layer.Base }

func (n *noRenameFlags) Rename(ctx context.Context, from, to string, flags uint32) error {
	if flags != 0 {
		return syscall.EINVAL
	}
	return n.Base.Rename(ctx, from, to, flags)
}

// TestReshardWithoutRenameFlags: over a lower that refuses
// RENAME_NOREPLACE, a flat directory is converted and then grown all the
// same, nothing lost or doubled.
func TestReshardWithoutRenameFlags(t *testing.T) {
	lower := t.TempDir()
	initial := fillFlat(t, filepath.Join(lower, "spool"), 3000)
	l, err := local.New(lower)
	if err != nil {
		t.Fatal(err)
	}
	fs, err := shard.New(&noRenameFlags{layer.Base{Lower: l}}, shard.Config{Default: shard.Layout{Scheme: shard.Hash, Buckets: 8, Prefix: shard.DefaultPrefix}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { layer.CloseStack(fs) })
	m := mounttest.Mount(t, fs)
	w := &workload{model: map[string]string{}, uncertain: map[string]bool{}}
	for _, b := range []int{8, 32} {
		to := shard.Layout{Scheme: shard.Hash, Buckets: b, Prefix: shard.DefaultPrefix}
		if err := fs.Reshard(context.Background(), "spool", to, nil); err != nil {
			t.Fatal(err)
		}
		checkDir(t, m.Path("spool"), filepath.Join(lower, "spool"), to, initial, w)
	}
}
