package layer_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"testing"

	"cairnfs.dev/cairn/layer"
)

// sliceDir streams names with cookies 10, 20, 30, ... (not positions).
type sliceDir struct {
	names []string
	pos   int
}

func (s *sliceDir) Next(ctx context.Context, plus bool) (layer.DirEntry, uint64, error) {
	if s.pos >= len(s.names) {
		return layer.DirEntry{}, 0, io.EOF
	}
	s.pos++
	return layer.DirEntry{Name: s.names[s.pos-1]}, uint64(s.pos * 10), nil
}

func (s *sliceDir) Seek(ctx context.Context, off uint64) error {
	if off%10 != 0 || int(off/10) > len(s.names) {
		return fmt.Errorf("bad cookie %d", off)
	}
	s.pos = int(off / 10)
	return nil
}

func (s *sliceDir) Close() error { return nil }

// TestMergeDirs: a listing of three streams whose later ones repeat names
// of the earlier ones (left out, as a union leaves them out), read whole,
// then from random cookies (recent ones from the ring, old ones from a
// checkpoint), gives after each cookie what followed it the first time;
// at most one stream is open at a time.
func TestMergeDirs(t *testing.T) {
	ctx := context.Background()
	var streams [3][]string
	for k := range streams {
		for i := range 5000 * (k + 1) {
			streams[k] = append(streams[k], fmt.Sprintf("n%d", i*(k+1)))
		}
	}
	in := make([]map[string]bool, len(streams))
	for k := range streams {
		in[k] = map[string]bool{}
		for _, n := range streams[k] {
			in[k][n] = true
		}
	}
	open := 0
	seen := map[string]bool{}
	d := layer.MergeDirs(layer.Merge{
		N: 3,
		Open: func(ctx context.Context, k int) (layer.Dir, error) {
			open++
			if open > 1 {
				t.Errorf("%d streams open", open)
			}
			return &closeCount{Dir: &sliceDir{names: streams[k]}, open: &open}, nil
		},
		Keep: func(ctx context.Context, k int, e *layer.DirEntry, whole bool) (bool, error) {
			if whole {
				if seen[e.Name] {
					return false, nil
				}
				seen[e.Name] = true
				return true, nil
			}
			// After a seek: look in the earlier streams.
			for j := range k {
				if in[j][e.Name] {
					return false, nil
				}
			}
			return true, nil
		},
		Restart: func() { clear(seen) },
	})
	defer d.Close()
	var all []string
	var cookies []uint64
	for {
		e, c, err := d.Next(ctx, false)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, e.Name)
		cookies = append(cookies, c)
	}
	if len(all) != len(seen) {
		t.Fatalf("%d entries, %d names", len(all), len(seen))
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 50 {
		i := r.IntN(len(all) - 1)
		if err := d.Seek(ctx, cookies[i]); err != nil {
			t.Fatalf("seek to the cookie of entry %d: %v", i, err)
		}
		for j := i + 1; j < min(i+4, len(all)); j++ {
			e, _, err := d.Next(ctx, false)
			if err != nil || e.Name != all[j] {
				t.Fatalf("after the cookie of entry %d: %q, %v; want %q", i, e.Name, err, all[j])
			}
		}
	}
	if err := d.Seek(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if e, _, _ := d.Next(ctx, false); e.Name != all[0] {
		t.Errorf("after seek 0: %q, want %q", e.Name, all[0])
	}
	if err := d.Seek(ctx, uint64(len(all)+5)); err == nil {
		t.Errorf("a cookie never given was taken")
	}
}

type closeCount struct {
	layer.Dir
	open *int
}

func (c *closeCount) Close() error { *c.open--; return nil }
