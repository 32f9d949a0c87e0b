package spec_test

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/null"
	"cairnfs.dev/cairn/registry"
	"cairnfs.dev/cairn/spec"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// Test-only layer types: one that takes rules, one with every kind of
// option (and a secret), one that changes data, one that cannot do
// everything.
func init() {
	registry.Register(registry.Type{
		Name: "testlacks", Summary: "a test type without hard links", MinLowers: 1, MaxLowers: 1,
		Lacks: layer.FSHardLinks | layer.FSRenameWhiteout,
		New:   func(l []layer.FS, _ registry.Values) (layer.FS, error) { return null.New(l[0]), nil },
	})
	registry.Register(registry.Type{
		Name: "testrules", Summary: "a test type that takes rules", MinLowers: 1, MaxLowers: 1,
		Rules: &registry.RuleSpec{Help: "what to do with matching paths", Options: []registry.Option{
			{Name: "action", Kind: registry.String, Allowed: []string{"hide", "log"}, Required: true, Help: "what to do"},
			{Name: "limit", Kind: registry.Size, Default: "4KiB", Help: "how much"},
		}},
		New: func(l []layer.FS, _ registry.Values) (layer.FS, error) { return null.New(l[0]), nil },
	})
	registry.Register(registry.Type{
		Name: "testperfile", Summary: "a test type that changes the data of some files only", MinLowers: 1, MaxLowers: 1,
		Changes: layer.ChangesData, PerFile: true,
		New: func(l []layer.FS, _ registry.Values) (layer.FS, error) { return null.New(l[0]), nil },
	})
	registry.Register(registry.Type{
		Name: "testkinds", Summary: "a test type with every kind of option", MinLowers: 1, MaxLowers: 1,
		Changes: layer.ChangesData | layer.ChangesNames,
		Options: []registry.Option{
			{Name: "n", Kind: registry.Int, Default: 3, Help: "a number"},
			{Name: "flag", Kind: registry.Bool, Help: "a flag"},
			{Name: "wait", Kind: registry.Duration, Default: time.Second, Help: "a duration"},
			{Name: "size", Kind: registry.Size, Help: "a size"},
			{Name: "mode", Kind: registry.String, Allowed: []string{"fast", "safe"}, Default: "safe", Help: "a choice"},
			{Name: "list", Kind: registry.List, Help: "a list"},
			{Name: "when", Kind: registry.String, Help: "a string"},
			{Name: "ratio", Kind: registry.Int, Help: "another number"},
			{Name: "sub", Kind: registry.String, Help: "a string"},
			{Name: "key", Kind: registry.String, Secret: true, Help: "a secret"},
			{Name: "log", Kind: registry.Path, Help: "a file"},
		},
		New: func(l []layer.FS, _ registry.Values) (layer.FS, error) { return null.New(l[0]), nil },
	})
}

// TestErrorGolden parses each testdata/errors/*.toml and compares the
// errors, as `cairn check` prints them, with the .golden file beside it.
func TestErrorGolden(t *testing.T) {
	files, _ := filepath.Glob("testdata/errors/*.toml")
	if len(files) == 0 {
		t.Fatal("no test specs")
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			_, err := spec.Load(f)
			if err == nil {
				t.Fatalf("%s parsed without error", f)
			}
			data, _ := os.ReadFile(f)
			checkErr(t, f, data, err)
			got := normalize(spec.Detail(err)) + "\n"
			golden := strings.TrimSuffix(f, ".toml") + ".golden"
			if *update {
				os.WriteFile(golden, []byte(got), 0o644)
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./spec -run TestErrorGolden -update)", err)
			}
			if got != string(want) {
				t.Errorf("errors of %s changed:\n--- got\n%s--- want\n%s", f, got, want)
			}
		})
	}
}

// normalize replaces the lists of registered types, which grow as layer
// types are added, with TYPES and RULETYPES.
func normalize(msg string) string {
	var all, rules []string
	for _, t := range registry.Types() {
		all = append(all, t.Name)
		if t.Rules != nil {
			rules = append(rules, t.Name)
		}
	}
	msg = strings.ReplaceAll(msg, "types: "+strings.Join(all, ", "), "types: TYPES")
	msg = strings.ReplaceAll(msg, "one of "+strings.Join(all, ", "), "one of TYPES")
	return strings.ReplaceAll(msg, "types that do: "+strings.Join(rules, ", "), "types that do: RULETYPES")
}

func TestInlineErrors(t *testing.T) {
	cases := map[string]string{
		"":                        "inline:1:1: the inline spec is empty: expected a chain of layers over a directory, such as null:/srv/data",
		"nul:/tmp":                `inline:1:1: unknown layer type "nul"; did you mean "null"?`,
		"null(:/tmp":              `inline:1:6: expected an option name in null(...), found ':'`,
		"null(a=1:/tmp":           `inline:1:14: expected "," or ")" after the value of "a", found the end (close null( with ")")`,
		"null(a=1):/tmp":          `inline:1:6: layer "null" (type null) has no option "a" (null takes no options)`,
		"null:":                   `inline:1:6: expected a directory after ":", found the end`,
		"null,:/tmp":              `inline:1:6: expected a layer type after ",", found ':'`,
		"null":                    `inline:1:1: null stacks over another layer: end the chain with ":DIR", as in null:/srv/data`,
		"local(path=/):/tmp":      `inline:1:1: local is a bottom layer: it must come last, and nothing (no ":DIR") may follow it`,
		"null:/nonexistent/cairn": `inline:1:6: layer "local": option "path": directory /nonexistent/cairn does not exist (create it first: mkdir -p /nonexistent/cairn)`,
		`testkinds(n="x\q"):/`:    `inline:1:15: in a "quoted" value, \ must be followed by " or \`,
		`testkinds(n='x):/`:       `inline:1:13: the quoted value is not closed (expected a closing ')`,
		"testkinds(n=1,n=2):/":    `inline:1:15: option "n" of testkinds is given twice`,
		"testkinds(n=x y):/":      `inline:1:13: layer "testkinds": option "n" must be an integer, found the string "x y"`,
		"testkinds(mod=fast):/":   `inline:1:11: layer "testkinds" (type testkinds) has no option "mod"; did you mean "mode"? (options of testkinds: n, flag, wait, size, mode, list, when, ratio, sub, key, log)`,
		"null x":                  `inline:1:6: expected "(", "," or ":" after layer type "null", found 'x'`,
		"testkinds(mode=fsat):/":  `inline:1:16: layer "testkinds": option "mode" must be one of "fast" or "safe", found the string "fsat"; did you mean "fast"?`,
		"(":                       `inline:1:1: expected a layer type (letters, digits, - and _) or a directory, found '('`,
		"a:/":                     `inline:1:1: unknown layer type "a" (known types: TYPES)`,
	}
	for in, want := range cases {
		_, err := spec.ParseInline(in)
		if err == nil {
			t.Errorf("%q: no error", in)
			continue
		}
		checkErr(t, spec.InlineFile, []byte(in), err)
		if normalize(err.Error()) != want {
			t.Errorf("%q:\n got %s\nwant %s", in, err, want)
		}
	}
}

func TestInlineGood(t *testing.T) {
	dir := t.TempDir()
	cases := map[string]string{
		dir:                        "local",
		"null:" + dir:              "null > local",
		"null , null : " + dir:     "null > null-2 > local",
		"mux(names=a),null:" + dir: "mux > null > local",
		"testkinds(n=7, flag=true, wait=2m, size=64KiB, mode=fast, list=a+b+c, key=\"s,e)c\"):" + dir: "testkinds > local",
		"null,local(path=" + dir + ")":              "null > local",
		"null:" + dir + "/../" + filepath.Base(dir): "null > local",
	}
	for in, chain := range cases {
		s, err := spec.ParseInline(in)
		if err != nil {
			t.Errorf("%q: %v", in, err)
			continue
		}
		var got []string
		for n := s.Mount; n != ""; {
			got = append(got, n)
			l := s.Layers[n]
			n = ""
			if len(l.Over) == 1 {
				n = l.Over[0]
			}
		}
		if strings.Join(got, " > ") != chain {
			t.Errorf("%q: chain %s, want %s", in, strings.Join(got, " > "), chain)
		}
		if p := s.Layers["local"].Values.String("path"); p != dir {
			t.Errorf("%q: local path %q, want %q", in, p, dir)
		}
		roundTrip(t, s)
	}
	// A layer over several lowers takes their directories, ":" between.
	dir2 := t.TempDir()
	s, err := spec.ParseInline("mux(names=a+b): " + dir + ":" + dir2)
	if err != nil {
		t.Fatal(err)
	}
	if o := s.Layers["mux"].Over; len(o) != 2 || s.Layers[o[0]].Values.String("path") != dir || s.Layers[o[1]].Values.String("path") != dir2 {
		t.Fatalf("mux over two directories: %v", o)
	}
	roundTrip(t, s)
	if _, err := spec.ParseInline("mux:" + dir + "::" + dir2); err == nil || !strings.Contains(err.Error(), "expected a directory between") {
		t.Fatalf("an empty directory between colons: %v", err)
	}
	s, err = spec.ParseInline("testkinds(n=7, flag=true, wait=2m, size=64KiB, mode=fast, list=a+b+c, key=\"s,e)c\"):" + dir)
	if err != nil {
		t.Fatal(err)
	}
	v := s.Layers["testkinds"].Values
	if v.Int("n") != 7 || !v.Bool("flag") || v.Duration("wait") != 2*time.Minute || v.Int("size") != 64<<10 ||
		v.String("mode") != "fast" || strings.Join(v.List("list"), ",") != "a,b,c" || v.String("key") != "s,e)c" {
		t.Errorf("values: %#v", v)
	}
	toml := s.TOML(false)
	if strings.Contains(toml, "s,e)c") || !strings.Contains(toml, `key = "********"`) {
		t.Errorf("the secret is not masked:\n%s", toml)
	}
	var b bytes.Buffer
	s.Explain(&b)
	if strings.Contains(b.String(), "s,e)c") {
		t.Errorf("explain shows the secret:\n%s", b.String())
	}
}

// TestRoundTrip: inline form -> spec file -> parse -> the same stack, and
// the same explanation.
func TestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	in := "testkinds(n=7,wait=90s,size=1MiB,list=x+y,log=log.jsonl),mux(names=only),null:" + dir
	s, err := spec.ParseInline(in)
	if err != nil {
		t.Fatal(err)
	}
	toml := s.TOML(true)
	file := filepath.Join(t.TempDir(), "stack.toml")
	os.WriteFile(file, []byte(toml), 0o644)
	s2, err := spec.Load(file)
	if err != nil {
		t.Fatalf("%v\n%s", err, toml)
	}
	if s2.Mount != s.Mount || len(s2.Layers) != len(s.Layers) {
		t.Fatalf("different stacks:\n%s", toml)
	}
	for name, l := range s.Layers {
		l2 := s2.Layers[name]
		if l2 == nil || l2.Type != l.Type || strings.Join(l2.Over, ",") != strings.Join(l.Over, ",") {
			t.Fatalf("layer %s differs", name)
		}
		for k, v := range l.Values {
			if tomlOf(v) != tomlOf(l2.Values[k]) {
				t.Errorf("layer %s option %s: %v, then %v", name, k, v, l2.Values[k])
			}
		}
	}
	var e1, e2 bytes.Buffer
	s.Explain(&e1)
	s2.Explain(&e2)
	if body(e1.String()) != body(e2.String()) {
		t.Errorf("explain differs:\n%s\n---\n%s", e1.String(), e2.String())
	}
	for _, want := range []string{"kernel passthrough: no", "changes: names, data", `wait = "90s"`, `n = 7`, `mode = "safe" (default)`} {
		if !strings.Contains(e1.String(), want) {
			t.Errorf("explain lacks %q:\n%s", want, e1.String())
		}
	}
	// Build the stack for real: the spec is good all the way.
	st, err := s2.Build()
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
}

func tomlOf(v any) string { return fmt.Sprint(v) }

// TestExplainGolden compares explain and --toml output for the good specs
// in testdata/explain with their .golden files.
func TestExplainGolden(t *testing.T) {
	files, _ := filepath.Glob("testdata/explain/*.toml")
	if len(files) == 0 {
		t.Fatal("no test specs")
	}
	for _, f := range files {
		s, err := spec.Load(f)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var b bytes.Buffer
		s.Explain(&b)
		b.WriteString("\n--- as TOML:\n")
		b.WriteString(s.TOML(false))
		golden := strings.TrimSuffix(f, ".toml") + ".golden"
		if *update {
			os.WriteFile(golden, b.Bytes(), 0o644)
			continue
		}
		want, err := os.ReadFile(golden)
		if err != nil {
			t.Fatalf("%v (run go test ./spec -run TestExplainGolden -update)", err)
		}
		if b.String() != string(want) {
			t.Errorf("explain of %s changed:\n--- got\n%s--- want\n%s", f, b.String(), want)
		}
		if strings.Contains(b.String(), "hunter2") {
			t.Errorf("a secret is shown")
		}
		roundTrip(t, s)
	}
}

// TestRules checks that a layer's rules reach its values, in order, and
// match as documented.
func TestRules(t *testing.T) {
	s, err := spec.Load("testdata/explain/fanout.toml")
	if err != nil {
		t.Fatal(err)
	}
	rules := s.Layers["plain"].Values.Rules()
	if len(rules) != 2 {
		t.Fatalf("%d rules", len(rules))
	}
	for path, want := range map[string]string{
		"a.log": "log", "x/y.log": "log", "tmp": "log", "tmp/x": "log", "tmp/keep/x": "hide", "other": "hide", "": "hide",
	} {
		r, ok := rules.First(path)
		if !ok || r.Values.String("action") != want {
			t.Errorf("%q: rule %v %v, want action %s", path, r.Values, ok, want)
		}
	}
	if n := len(rules.All("a.log")); n != 2 {
		t.Errorf("All(a.log): %d rules", n)
	}
	if r, _ := rules.First("other"); r.Values.Int("limit") != 1<<20 || r.Where != "testdata/explain/fanout.toml:37:3" {
		t.Errorf("second rule: %+v", r)
	}
	if r, _ := rules.First("a.log"); r.Values.Int("limit") != 4096 {
		t.Errorf("default limit: %+v", r.Values)
	}
	if s.Layers["coded"].Values.Rules() != nil {
		t.Errorf("a type without rules got rules")
	}
}

func TestTooManyErrorsAndBOM(t *testing.T) {
	var b strings.Builder
	b.WriteString("mount = \"a\"\n")
	for i := 0; i < 80; i++ {
		fmt.Fprintf(&b, "k%d = 1\n", i)
	}
	_, err := spec.Parse("many.toml", []byte(b.String()))
	l, _ := err.(spec.ErrorList)
	if len(l) != 51 || l[50].Error() != "many.toml: too many errors: stopped after 50" || l[0].Pos.Line != 2 {
		t.Errorf("%d errors, last %v", len(l), l[len(l)-1])
	}
	_, err = spec.Parse("bom.toml", []byte("\ufeffmount = \"a\"\n[layer.a]\ntype = \"local\"\npath = \"/\"\n"))
	if err != nil {
		t.Errorf("a byte order mark: %v", err)
	}
}

// TestExplainLacks: explain says what a stack cannot do (through a
// fan-out layer too), and says nothing when it can do everything.
func TestExplainLacks(t *testing.T) {
	dir := t.TempDir()
	fan := filepath.Join(t.TempDir(), "fan.toml")
	os.WriteFile(fan, []byte(`mount = "top"
[layer.top]
type = "mux"
over = ["a", "b"]
names = ["x", "y"]
[layer.a]
type = "null"
over = "base"
[layer.b]
type = "testlacks"
over = "base2"
[layer.base]
type = "local"
path = "`+dir+`"
[layer.base2]
type = "local"
path = "`+dir+`"
`), 0o644)
	one, err := spec.ParseInline("null:" + dir)
	if err != nil {
		t.Fatal(err)
	}
	two, err := spec.Load(fan)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		s    *spec.Spec
		want string
	}{{one, ""}, {two, `cannot: hard links, rename WHITEOUT ("b" (testlacks))`}} {
		var b bytes.Buffer
		c.s.Explain(&b)
		if got := b.String(); c.want == "" && strings.Contains(got, "cannot:") || c.want != "" && !strings.Contains(got, c.want) {
			t.Errorf("want %q:\n%s", c.want, got)
		}
	}
}
