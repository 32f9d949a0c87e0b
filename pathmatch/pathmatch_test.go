package pathmatch

import (
	"math/rand"
	"regexp"
	"strings"
	"testing"
)

func TestMatch(t *testing.T) {
	cases := []struct {
		pat string
		yes []string
		no  []string
	}{
		{"*.log", []string{"a.log", "x/y/a.log", ".log"}, []string{"a.log/x", "alog", "a.logx", ""}},
		{"/*.log", []string{"a.log"}, []string{"x/a.log"}},
		{"docs/*.md", []string{"docs/a.md"}, []string{"docs/x/a.md", "a/docs/a.md", "docs"}},
		{"docs/**", []string{"docs", "docs/a", "docs/a/b/c"}, []string{"docsx", "x/docs/a"}},
		{"docs/", []string{"docs", "docs/a/b", "x/docs", "x/docs/y"}, []string{"docsx", "x"}},
		{"/docs/", []string{"docs", "docs/a/b"}, []string{"x/docs", "docsx"}},
		{"**/x", []string{"x", "a/x", "a/b/x"}, []string{"x/a", "ax"}},
		{"a/**/b", []string{"a/b", "a/x/b", "a/x/y/b"}, []string{"a", "b", "a/x", "x/a/b"}},
		{"**", []string{"", "a", "a/b"}, nil},
		{"", []string{""}, []string{"a"}},
		{"/", []string{""}, []string{"a"}},
		{"?", []string{"a", "x/é"}, []string{"", "ab"}},
		{"[a-c]x", []string{"ax", "bx", "cx", "d/bx"}, []string{"dx", "x"}},
		{"[!a-c]x", []string{"dx"}, []string{"ax", "x"}},
		{"[^a]", []string{"b"}, []string{"a"}},
		{"[]]", []string{"]"}, []string{"a"}},
		{"*.{jpg,png}", []string{"a.jpg", "b/c.png"}, []string{"a.gif", "a.{jpg,png}"}},
		{"{a,b/{c,d}}", []string{"a", "x/a", "b/c", "b/d"}, []string{"x/b/c", "b"}},
		{`\*`, []string{"*"}, []string{"a"}},
		{`a\{b`, []string{"a{b"}, nil},
		{"a*b*c", []string{"abc", "aXbYc", "abbbc"}, []string{"ab", "acb"}},
		{"*", []string{"a", "a/b"}, []string{""}},
		{"/*", []string{"a"}, []string{"a/b"}},
		{"x*", []string{"x", "xyz", "q/xy"}, []string{"yx"}},
	}
	for _, c := range cases {
		p, err := Compile(c.pat)
		if err != nil {
			t.Errorf("Compile(%q): %v", c.pat, err)
			continue
		}
		for _, y := range c.yes {
			if !p.Match(y) {
				t.Errorf("%q should match %q", c.pat, y)
			}
		}
		for _, n := range c.no {
			if p.Match(n) {
				t.Errorf("%q should not match %q", c.pat, n)
			}
		}
	}
}

func TestErrors(t *testing.T) {
	cases := map[string]string{
		"a**":                      `bad pattern "a**" at column 2: ** must be a whole path element, as in a/**/b`,
		"a//b":                     `bad pattern "a//b" at column 3: empty path element (two slashes in a row)`,
		"[abc":                     `bad pattern "[abc" at column 4: [ is not closed by ]`,
		"x[z-a]":                   `bad pattern "x[z-a]" at column 2: range z-a is backwards`,
		"{a,b":                     `bad pattern "{a,b" at column 1: { is not closed by }`,
		"a}":                       `bad pattern "a}" at column 2: } without {`,
		`a\`:                       `bad pattern "a\\" at column 2: \ at the end escapes nothing`,
		"../x":                     `bad pattern "../x" at column 1: ".." is not allowed: paths are relative to the layer's root`,
		"a/./b":                    `bad pattern "a/./b" at column 3: "." is not allowed: paths are relative to the layer's root`,
		"{a,b}**":                  `bad pattern "{a,b}**" at column 6: ** must be a whole path element, as in a/**/b`,
		strings.Repeat("{a,b}", 9): `bad pattern "` + strings.Repeat("{a,b}", 9) + `" at column 41: braces expand to more than 256 patterns`,
	}
	for pat, want := range cases {
		_, err := Compile(pat)
		if err == nil {
			t.Errorf("Compile(%q) succeeded", pat)
			continue
		}
		if err.Error() != want {
			t.Errorf("Compile(%q):\n got %s\nwant %s", pat, err, want)
		}
	}
}

func TestSet(t *testing.T) {
	s, err := NewSet([]string{"*.log", "tmp/"}, []string{"keep/**"})
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]bool{"a.log": true, "x/tmp/y": true, "keep/a.log": false, "a.txt": false} {
		if s.Contains(p) != want {
			t.Errorf("Contains(%q) = %v", p, !want)
		}
	}
	var nilSet *Set
	if nilSet.Contains("a") {
		t.Error("a nil set contains something")
	}
}

// toRegexp is a slow, obvious reference for patterns made of literals, "*",
// "?" and "**" elements, anchored at the root. It matches the path with a
// "/" after each element.
func toRegexp(pat string) *regexp.Regexp {
	var b strings.Builder
	b.WriteString("^")
	for _, e := range strings.Split(pat, "/") {
		if e == "**" {
			b.WriteString("(?:[^/]+/)*")
			continue
		}
		for _, r := range e {
			switch r {
			case '*':
				b.WriteString("[^/]*")
			case '?':
				b.WriteString("[^/]")
			default:
				b.WriteString(regexp.QuoteMeta(string(r)))
			}
		}
		b.WriteString("/")
	}
	b.WriteString("$")
	return regexp.MustCompile(b.String())
}

func TestAgainstRegexp(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	atoms := []string{"a", "b", "*", "?", "ab"}
	names := []string{"a", "b", "ab", "ba", "aab", "bb"}
	for i := 0; i < 20000; i++ {
		var elems []string
		for n := 1 + rng.Intn(4); n > 0; n-- {
			if rng.Intn(4) == 0 {
				elems = append(elems, "**")
				continue
			}
			var e string
			for m := 1 + rng.Intn(3); m > 0; m-- {
				e += atoms[rng.Intn(len(atoms))]
			}
			elems = append(elems, e)
		}
		pat := "/" + strings.Join(elems, "/")
		var pe []string
		for n := rng.Intn(5); n > 0; n-- {
			pe = append(pe, names[rng.Intn(len(names))])
		}
		path := strings.Join(pe, "/")
		p, err := Compile(pat)
		if err != nil {
			continue // "**" inside an element
		}
		slashed := path
		if path != "" {
			slashed += "/"
		}
		want := toRegexp(strings.TrimPrefix(pat, "/")).MatchString(slashed)
		if got := p.Match(path); got != want {
			t.Fatalf("%q vs %q: got %v, regexp says %v", pat, path, got, want)
		}
	}
}

func FuzzCompile(f *testing.F) {
	for _, s := range []string{"*.log", "a/**/b", "{a,{b,c}}/[!x-z]?", `\[`, "docs/", "/x"} {
		f.Add(s, "a/b/c.log")
	}
	f.Fuzz(func(t *testing.T, pat, path string) {
		p, err := Compile(pat)
		if err != nil {
			if _, ok := err.(*Error); !ok {
				t.Fatalf("error of type %T", err)
			}
			return
		}
		p.Match(path)
	})
}
