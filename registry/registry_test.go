package registry

import (
	"testing"
	"time"

	"cairnfs.dev/cairn/pathmatch"
)

func TestDefaultValue(t *testing.T) {
	cases := []struct {
		o    Option
		want any
	}{
		{Option{Kind: Int, Default: 3}, int64(3)},
		{Option{Kind: Size, Default: "64KiB"}, int64(64 << 10)},
		{Option{Kind: Size, Default: 4096}, int64(4096)},
		{Option{Kind: Duration, Default: "1s"}, time.Second},
		{Option{Kind: Duration, Default: 2 * time.Second}, 2 * time.Second},
		{Option{Kind: Bool, Default: true}, true},
		{Option{Kind: String, Default: "x"}, "x"},
		{Option{Kind: Int}, nil},
	}
	for _, c := range cases {
		if got := c.o.DefaultValue(); got != c.want {
			t.Errorf("%v default %#v: got %#v, want %#v", c.o.Kind, c.o.Default, got, c.want)
		}
	}
	l := (&Option{Kind: List, Default: "a+b"}).DefaultValue().([]string)
	if len(l) != 2 || l[1] != "b" {
		t.Errorf("list default: %v", l)
	}
}

func TestReservedNames(t *testing.T) {
	for _, typ := range []Type{
		{Name: "t-reserved-1", Options: []Option{{Name: "over", Kind: String}}},
		{Name: "t-reserved-2", Rules: &RuleSpec{Options: []Option{{Name: "match", Kind: String}}}},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s registered with a reserved option name", typ.Name)
				}
			}()
			Register(typ)
		}()
	}
}

func TestRules(t *testing.T) {
	a, _ := pathmatch.NewSet([]string{"*.log"}, nil)
	b, _ := pathmatch.NewSet([]string{"**"}, []string{"tmp/"})
	v := Values{RulesKey: Rules{{Where: "a", Paths: a}, {Where: "b", Paths: b}}}
	r := v.Rules()
	if x, ok := r.First("x.log"); !ok || x.Where != "a" {
		t.Errorf("First(x.log) = %v %v", x.Where, ok)
	}
	if x, ok := r.First("y"); !ok || x.Where != "b" {
		t.Errorf("First(y) = %v %v", x.Where, ok)
	}
	if _, ok := r.First("tmp/z"); ok {
		t.Errorf("tmp/z is covered")
	}
	if n := len(r.All("a/b.log")); n != 2 {
		t.Errorf("All: %d", n)
	}
	if (Values{}).Rules() != nil {
		t.Errorf("rules from nothing")
	}
	lt := []struct {
		t    Type
		want string
	}{
		{Type{}, "none (a bottom layer)"},
		{Type{MinLowers: 1, MaxLowers: 1}, "exactly 1"},
		{Type{MinLowers: 1, MaxLowers: -1}, "at least 1"},
		{Type{MinLowers: 2, MaxLowers: 4}, "2 to 4"},
	}
	for _, c := range lt {
		if got := c.t.LowersText(); got != c.want {
			t.Errorf("LowersText: %q, want %q", got, c.want)
		}
	}
}
