package glustertest_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"cairnfs.dev/cairn/internal/glustertest"
	"cairnfs.dev/cairn/internal/mounttest"
)

// within runs f and fails the test if it does not return within d: an
// application must not hang on a dead brick.
func within(t *testing.T, d time.Duration, what string, f func() error) error {
	t.Helper()
	ch := make(chan error, 1)
	start := time.Now()
	go func() { ch <- f() }()
	select {
	case err := <-ch:
		t.Logf("%s: %v after %v", what, err, time.Since(start).Round(time.Millisecond))
		return err
	case <-time.After(d):
		t.Fatalf("%s: no answer within %v", what, d)
		return nil
	}
}

// reconnected waits until the GlusterFS client reaches path again (it
// reconnects to a brick started again within a few seconds).
func reconnected(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the GlusterFS client did not reconnect within 30 s")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestBrickKilled: the brick of the volume under a zstd stack is killed.
// Applications get an error (EIO or ENOTCONN), not a hang, and after the
// brick is back a new mount reads every fsync'ed byte.
func TestBrickKilled(t *testing.T) {
	lower := glustertest.Dir(t, "one")
	spec := "mount = \"top\"\n[layer.base]\ntype = \"local\"\npath = \"" + lower + "\"\n[layer.top]\ntype = \"zstd\"\nover = \"base\"\n"
	p := mounttest.MountSpec(t, spec)
	want := bytes.Repeat([]byte("fsync'ed before the brick died\n"), 3000)
	f, err := os.Create(p.Path("f"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(want); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	glustertest.KillBricks(t, "one")
	restarted := false
	defer func() {
		if !restarted {
			glustertest.StartBricks(t, "one")
		}
	}()
	isNetErr := func(err error) bool {
		return errors.Is(err, syscall.EIO) || errors.Is(err, syscall.ENOTCONN)
	}
	// GlusterFS's client sees the brick's connection closed at once; the
	// volume's ping-timeout (5 s here) bounds a brick that stops answering.
	const limit = 15 * time.Second
	err = within(t, limit, "write and fsync of a new file", func() error {
		return os.WriteFile(p.Path("g"), want, 0o644)
	})
	if !isNetErr(err) {
		t.Errorf("writing a new file with the brick dead: %v, want EIO or ENOTCONN", err)
	}
	err = within(t, limit, "read of the file", func() error {
		_, err := os.ReadFile(p.Path("f"))
		return err
	})
	if !isNetErr(err) {
		t.Errorf("reading with the brick dead: %v, want EIO or ENOTCONN", err)
	}
	if log, _ := os.ReadFile(p.Log); !bytes.Contains(log, []byte("transport endpoint is not connected")) {
		t.Errorf("the daemon's log does not say why:\n%s", log)
	}
	glustertest.StartBricks(t, "one")
	restarted = true
	reconnected(t, filepath.Join(lower, "f"))
	p.Unmount()
	q := mounttest.MountSpec(t, spec)
	got, err := os.ReadFile(q.Path("f"))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("after the brick came back, a new mount reads %d bytes (%v), want the %d fsync'ed", len(got), err, len(want))
	}
}

// TestBrickKilledOpenFile: a file held open across the brick's death, on a
// null stack (the kernel reads and writes the GlusterFS file itself:
// passthrough) and a zstd stack (the daemon does). While the brick is dead
// its reads, writes and fsyncs fail promptly (EIO or ENOTCONN); once the
// brick is back, the same descriptor never returns wrong bytes: a read
// gives the file's bytes or an error, and a write that fsync acknowledges
// is there for a new mount.
func TestBrickKilledOpenFile(t *testing.T) {
	for _, kind := range []string{"null", "zstd"} {
		t.Run(kind, func(t *testing.T) {
			lower := glustertest.Dir(t, "one")
			spec := "mount = \"top\"\n[layer.base]\ntype = \"local\"\npath = \"" + lower + "\"\n[layer.top]\ntype = \"" + kind + "\"\nover = \"base\"\n"
			p := mounttest.MountSpec(t, spec)
			want := bytes.Repeat([]byte("held open while the brick died\n"), 2000)
			f, err := os.OpenFile(p.Path("f"), os.O_CREATE|os.O_RDWR, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.Write(want); err != nil {
				t.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			glustertest.KillBricks(t, "one")
			restarted := false
			defer func() {
				if !restarted {
					glustertest.StartBricks(t, "one")
				}
			}()
			isNetErr := func(err error) bool {
				return errors.Is(err, syscall.EIO) || errors.Is(err, syscall.ENOTCONN) || errors.Is(err, syscall.EBADF)
			}
			const limit = 15 * time.Second
			err = within(t, limit, "write and fsync of the open file", func() error {
				if _, err := f.WriteAt([]byte("lost"), 0); err != nil {
					return err
				}
				return f.Sync()
			})
			if !isNetErr(err) {
				t.Errorf("write and fsync with the brick dead: %v, want EIO or ENOTCONN", err)
			}
			glustertest.StartBricks(t, "one")
			restarted = true
			reconnected(t, filepath.Join(lower, "f"))
			// The descriptor may be dead for good (GlusterFS reopens some,
			// not all); what it must not do is give other bytes.
			got := make([]byte, len(want))
			n, err := within2(t, limit, "read of the open file after the brick came back", func() (int, error) { return f.ReadAt(got, 0) })
			if err == nil || n > 0 {
				g := got[:n]
				lost := append([]byte("lost"), want[4:]...)
				if !bytes.Equal(g, want[:n]) && !bytes.Equal(g, lost[:n]) {
					t.Errorf("the open file reads other bytes after the brick came back: %q...", g[:min(len(g), 40)])
				}
			} else if !isNetErr(err) {
				t.Errorf("read after the brick came back: %v", err)
			}
			tail := []byte("written after the brick came back\n")
			_, werr := within2(t, limit, "write and fsync after the brick came back", func() (int, error) {
				n, err := f.WriteAt(tail, int64(len(want)))
				if err != nil {
					return n, err
				}
				return n, f.Sync()
			})
			f.Close()
			// A new open of the file works again.
			tail2 := []byte("written through a new open\n")
			g2, err := os.OpenFile(p.Path("f"), os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatalf("a new open after the brick came back: %v", err)
			}
			if _, err := g2.Write(tail2); err != nil {
				t.Fatalf("a write through a new open after the brick came back: %v", err)
			}
			if err := g2.Sync(); err != nil {
				t.Fatalf("an fsync through a new open after the brick came back: %v", err)
			}
			g2.Close()
			p.Unmount()
			q := mounttest.MountSpec(t, spec)
			g, err := os.ReadFile(q.Path("f"))
			if err != nil {
				t.Fatalf("a new mount cannot read the file: %v", err)
			}
			if len(g) < len(want) || !bytes.Equal(g[4:len(want)], want[4:]) {
				t.Fatalf("a new mount reads %d bytes, not the fsync'ed ones", len(g))
			}
			rest := g[len(want):]
			if werr == nil {
				if !bytes.HasPrefix(rest, tail) {
					t.Fatalf("a write fsync'ed after the brick came back is not there: %q", rest)
				}
				rest = rest[len(tail):]
			}
			if !bytes.Equal(rest, tail2) {
				t.Fatalf("the write fsync'ed through a new open is not there: %q", rest)
			}
			t.Logf("after the brick came back: read %d bytes (%v), write and fsync: %v", n, err, werr)
		})
	}
}

func within2(t *testing.T, d time.Duration, what string, f func() (int, error)) (int, error) {
	t.Helper()
	var n int
	err := within(t, d, what, func() error {
		var err error
		n, err = f()
		return err
	})
	return n, err
}
