//go:build linux

package fusefs_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/local"
)

// gate holds every lookup of a name that starts with "slow" until open
// is closed (a slow lower, a lock wait), counting those it holds.
type gate struct {
	layer.Base
	open chan struct{}
	held atomic.Int32
}

func (g *gate) Getattr(ctx context.Context, p string) (layer.Attr, error) {
	if strings.HasPrefix(p, "slow") || strings.Contains(p, "/slow") {
		g.held.Add(1)
		select {
		case <-g.open:
		case <-ctx.Done():
		}
	}
	return g.Base.Getattr(ctx, p)
}

// TestBlockedRequestsStallNoOther: go-fuse serves each request on the
// goroutine that read it and keeps another reading (third_party/gofuse,
// FORK.md: "The request loop"); requests that block in the stack, more of
// them than readers wait and than GOMAXPROCS, hold up no other request.
func TestBlockedRequestsStallNoOther(t *testing.T) {
	mounttest.Need(t)
	lower := t.TempDir()
	const slow = 8
	for i := range slow {
		os.WriteFile(lower+fmt.Sprintf("/slow%d", i), []byte("s"), 0o644)
	}
	// The others in a directory of their own: a create waits for the
	// kernel's lock of its directory, which the held lookups share.
	os.Mkdir(lower+"/d", 0o755)
	os.WriteFile(lower+"/d/f", []byte("data"), 0o644)
	l, err := local.New(lower)
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{Base: layer.Base{Lower: l}, open: make(chan struct{})}
	m := mounttest.Mount(t, g)
	var wg sync.WaitGroup
	errs := make(chan error, slow)
	for i := range slow {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := os.Stat(m.Path(fmt.Sprintf("slow%d", i))); err != nil {
				errs <- err
			}
		}()
	}
	released := false
	release := func() {
		if !released {
			released = true
			close(g.open)
			wg.Wait()
		}
	}
	defer release()
	deadline := time.Now().Add(20 * time.Second)
	for g.held.Load() < slow {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d lookups reached the stack while the others were held: a blocked request held them up", g.held.Load(), slow)
		}
		time.Sleep(time.Millisecond)
	}
	// With every slow lookup held, others are served (each in its own
	// goroutine, so that a stall fails the test instead of hanging it).
	done := make(chan error, 1)
	go func() {
		for i := range 200 {
			b, err := os.ReadFile(m.Path("d", "f"))
			if err != nil || string(b) != "data" {
				done <- fmt.Errorf("read %d: %q, %v", i, b, err)
				return
			}
			name := m.Path("d", fmt.Sprintf("new%d", i))
			if err := os.WriteFile(name, []byte("x"), 0o644); err != nil {
				done <- err
				return
			}
			if _, err := os.Stat(name); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("with 8 requests blocked in the stack, a read, create and stat did not finish in 20 s")
	}
	if n := g.held.Load(); n != slow {
		t.Errorf("%d lookups held, want %d", n, slow)
	}
	release()
	close(errs)
	for err := range errs {
		t.Errorf("slow lookup after its release: %v", err)
	}
	if _, err := os.Stat(lower + "/d/new199"); err != nil {
		t.Errorf("the lower: %v", err)
	}
}
