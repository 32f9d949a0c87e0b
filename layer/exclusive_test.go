package layer

import "testing"

// fakeFanOut is a fan-out layer with no say of its own (a replica, a mux).
type fakeFanOut struct {
	NotImplemented
	lowers []FS
}

func (f *fakeFanOut) Lowers() []FS     { return f.lowers }
func (f *fakeFanOut) Changes() Changes { return ChangesPlacement }
func (f *fakeFanOut) Close() error     { return nil }

// fakeSays is a layer that says whether it is exclusive (a union, a local
// directory).
type fakeSays struct {
	fakeFanOut
	excl bool
}

func (f *fakeSays) Exclusive() bool { return f.excl }

// TestIsExclusive: a layer that says whether it is exclusive decides for
// itself (a local directory; a union, whatever its branches); any other
// layer is exclusive when all its lowers are (a layer over a union, a
// replica over local directories), and is not over a bottom layer that
// says nothing.
func TestIsExclusive(t *testing.T) {
	loc, shared := &fakeSays{excl: true}, &fakeSays{}
	mute := &fakeFanOut{}
	u := &fakeSays{fakeFanOut: fakeFanOut{lowers: []FS{shared, mute}}, excl: true}
	for _, c := range []struct {
		name string
		fs   FS
		want bool
	}{
		{"a bottom layer that says nothing", mute, false},
		{"a local directory", loc, true},
		{"a shared local directory", shared, false},
		{"the union (its branches do not count)", u, true},
		{"a layer over the union", &Base{Lower: &Base{Lower: u}}, true},
		{"a union that says no", &fakeSays{fakeFanOut: fakeFanOut{lowers: []FS{loc, loc}}}, false},
		{"a fan-out over two local directories", &fakeFanOut{lowers: []FS{loc, loc}}, true},
		{"a fan-out over the union and a local directory", &fakeFanOut{lowers: []FS{u, loc}}, true},
		{"a fan-out over a local and a shared directory", &fakeFanOut{lowers: []FS{loc, shared}}, false},
		{"a fan-out over the union and a silent branch", &fakeFanOut{lowers: []FS{u, mute}}, false},
	} {
		if got := IsExclusive(c.fs); got != c.want {
			t.Errorf("%s: IsExclusive %v, want %v", c.name, got, c.want)
		}
	}
}
