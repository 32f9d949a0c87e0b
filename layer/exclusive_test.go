package layer

import "testing"

type fakeFanOut struct {
	NotImplemented
	lowers []FS
	excl   bool
}

func (f *fakeFanOut) Lowers() []FS     { return f.lowers }
func (f *fakeFanOut) Changes() Changes { return ChangesPlacement }
func (f *fakeFanOut) Close() error     { return nil }
func (f *fakeFanOut) Exclusive() bool  { return f.excl }

// TestIsExclusive: a stack is exclusive when its top, or what one-lower
// layers above stack over, says so; a fan-out layer that does not say so
// ends the walk (a mux over a union and a plain branch).
func TestIsExclusive(t *testing.T) {
	a, b := &fakeFanOut{}, &fakeFanOut{}
	u := &fakeFanOut{lowers: []FS{a, b}, excl: true}
	for _, c := range []struct {
		name string
		fs   FS
		want bool
	}{
		{"a bottom layer", a, false},
		{"the union", u, true},
		{"a layer over the union", &Base{Lower: &Base{Lower: u}}, true},
		{"a fan-out over the union and a branch", &fakeFanOut{lowers: []FS{u, b}}, false},
		{"a fan-out of one lower over the union", &fakeFanOut{lowers: []FS{u}}, true},
		{"a union that says no", &fakeFanOut{lowers: []FS{a, b}}, false},
	} {
		if got := IsExclusive(c.fs); got != c.want {
			t.Errorf("%s: IsExclusive %v, want %v", c.name, got, c.want)
		}
	}
}
