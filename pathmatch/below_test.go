package pathmatch

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// TestAnchoredMatchesMatch: the automaton of SameBelow accepts exactly what
// Match does.
func TestAnchoredMatchesMatch(t *testing.T) {
	pats := []string{"", "/", "//", "**", "*", "a", "*.log", "a/", "/a/", "a/**", "**/b", "a/**/b", "a/*/c",
		"{a,b}/c", "x/", "/a/b/", "?", "[ab]/**/c/", "a/**/**/b"}
	r := rand.New(rand.NewPCG(1, 2))
	elems := []string{"a", "b", "c", "x", "y.log"}
	for i := 0; i < 3000; i++ {
		var ns []string
		for j := r.IntN(5); j > 0; j-- {
			ns = append(ns, elems[r.IntN(len(elems))])
		}
		path := strings.Join(ns, "/")
		for _, ps := range pats {
			p := MustCompile(ps)
			got := false
			for k := range p.alts {
				e := p.alts[k].anchored()
				got = got || states(e, split(path))[len(e)]
			}
			if got != p.Match(path) {
				t.Fatalf("pattern %q, path %q: automaton %v, Match %v", ps, path, got, p.Match(path))
			}
		}
	}
}

// TestSameBelow checks the promise: when SameBelow(a, b), a/s and b/s
// match alike for every s.
func TestSameBelow(t *testing.T) {
	cases := []struct {
		pat, a, b string
		same      bool
	}{
		{"secret/", "secret/x", "pub/x", false},
		{"secret/", "pub/x", "other/y", true},
		{"secret/", "secret/x", "secret/y", true},
		{"*.txt", "a/.tmp1", "a/f.txt", false},
		{"*.txt", "a", "b", true}, // directories: f.txt below both alike
		{"/a/*/c", "a/b", "a/d", true},
		{"/a/*/c", "a/b", "x/b", false},
		{"**", "a", "b/c", true},
		{"a/**/z", "a/b", "a/b/c", true},
	}
	for _, c := range cases {
		s, err := NewSet([]string{c.pat}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.SameBelow(c.a, c.b); got != c.same {
			t.Errorf("SameBelow(%q: %q, %q) = %v", c.pat, c.a, c.b, got)
		}
	}
	// The promise, on random paths.
	r := rand.New(rand.NewPCG(3, 4))
	elems := []string{"a", "b", "secret", "x.txt", "c"}
	rnd := func(n int) string {
		var ns []string
		for j := 0; j < n; j++ {
			ns = append(ns, elems[r.IntN(len(elems))])
		}
		return strings.Join(ns, "/")
	}
	for _, ps := range []string{"secret/", "*.txt", "/a/*/secret", "a/**/x.txt", "{a,b}/c/", "**/secret/**"} {
		s, _ := NewSet([]string{ps}, []string{"a/b/c"})
		for i := 0; i < 2000; i++ {
			a, b := rnd(1+r.IntN(3)), rnd(1+r.IntN(3))
			if !s.SameBelow(a, b) {
				continue
			}
			for j := 0; j < 20; j++ {
				suf := rnd(r.IntN(4))
				pa, pb := strings.Trim(a+"/"+suf, "/"), strings.Trim(b+"/"+suf, "/")
				if s.Contains(pa) != s.Contains(pb) {
					t.Fatalf("%q: SameBelow(%q, %q) but %q and %q differ", ps, a, b, pa, pb)
				}
			}
		}
	}
}
