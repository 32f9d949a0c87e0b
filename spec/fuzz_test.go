package spec_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	_ "cairnfs.dev/cairn/layers/all"
	"cairnfs.dev/cairn/spec"
)

// checkErr checks that a rejection is a list of clear, positioned errors,
// each inside text (the spec's text: line and column within it, the line
// shown being the spec's line).
func checkErr(t *testing.T, file string, text []byte, err error) {
	t.Helper()
	var l spec.ErrorList
	if !errors.As(err, &l) || len(l) == 0 {
		t.Fatalf("error is not a spec.ErrorList: %T %v", err, err)
	}
	text = bytes.TrimPrefix(text, []byte("\ufeff"))
	lines := strings.Split(string(text), "\n")
	if file == spec.InlineFile {
		lines = []string{strings.NewReplacer("\n", " ", "\r", " ").Replace(string(text))}
	}
	for _, e := range l {
		if e.Pos.File != file || e.Pos.Line < 0 || (e.Pos.Line > 0 && e.Pos.Col < 1) {
			t.Fatalf("bad position %+v in %q", e.Pos, e.Error())
		}
		if e.Pos.Line > len(lines) || (e.Pos.Line > 0 && e.Pos.Col > len(lines[e.Pos.Line-1])+1) {
			t.Fatalf("position %+v is outside the text (%d lines) in %q", e.Pos, len(lines), e.Error())
		}
		if e.Pos.Line > 0 && e.Line != lines[e.Pos.Line-1] {
			t.Fatalf("error at %v shows line %q, not the spec's %q", e.Pos, e.Line, lines[e.Pos.Line-1])
		}
		if strings.TrimSpace(e.Msg) == "" {
			t.Fatalf("empty message at %v", e.Pos)
		}
		if !utf8.ValidString(e.Msg) && utf8.ValidString(e.Line) {
			// messages quote what they found; %q keeps them valid
			t.Fatalf("message is not UTF-8: %q", e.Msg)
		}
		_ = e.Detail()
	}
}

// roundTrip checks that a good spec prints as TOML that parses to the same
// spec (same TOML again, same explanation).
func roundTrip(t *testing.T, s *spec.Spec) {
	t.Helper()
	out := s.TOML(true)
	s2, err := spec.Parse("roundtrip.toml", []byte(out))
	if err != nil {
		t.Fatalf("the TOML of a good spec does not parse:\n%s\nerror: %v", out, err)
	}
	if out2 := s2.TOML(true); out2 != stripComment(out) {
		t.Fatalf("TOML round trip changed the spec:\n%s\n---\n%s", out, out2)
	}
	var e1, e2 bytes.Buffer
	s.Explain(&e1)
	s2.Explain(&e2)
	if body(e1.String()) != body(e2.String()) {
		t.Fatalf("explain differs after a round trip:\n%s\n---\n%s", e1.String(), e2.String())
	}
}

func stripComment(s string) string {
	if strings.HasPrefix(s, "#") {
		_, rest, _ := strings.Cut(s, "\n")
		return rest
	}
	return s
}

// body drops explain's first line, which names the source.
func body(s string) string {
	_, rest, _ := strings.Cut(s, "\n")
	return rest
}

var parseSeeds = []string{
	"mount = \"top\"\n[layer.top]\ntype = \"null\"\nover = \"base\"\n[layer.base]\ntype = \"local\"\npath = \"/tmp\"\n",
	"mount = \"m\"\nallow_other = true\nentry_timeout = \"2s\"\nlog_level = \"debug\"\n[layer.m]\ntype = \"mux\"\nover = [\"a\", \"b\"]\nnames = [\"x\", \"y\"]\n[layer.a]\ntype = \"local\"\npath = \"/\"\n[layer.b]\ntype = \"local\"\npath = \"/tmp\"\n",
	"mount = \"a\"\n[layer.a]\ntype = \"nul\"\nover = \"a\"\n",
	"mount = 3\n[layer]\nx = 1\n[[rule]]\nlayer = \"x\"\nmatch = \"*.{a,b}\"\n",
	"layer.a.type = \"local\"\nlayer.a.path = '/tmp'\nmount = \"a\"\n",
	"mount = \"a\"\nlayer = { a = { type = \"local\", path = \"/tmp\" } }\n",
	"[layer.a]\ntype = \"null\"\n[layer.a]\n",
	"mount = \"a\" # comment\n[layer.a]\ntype = \"local\"\npath = \"\"\"/tmp\"\"\"\nx = 1979-05-27\ny = 1.5\nz = 0x10\n",
	"a = [\n1,\n2\n\nb = \"\n",
}

func FuzzParse(f *testing.F) {
	for _, s := range parseSeeds {
		f.Add([]byte(s))
	}
	// The golden specs are seeds too.
	files, _ := filepath.Glob("testdata/errors/*.toml")
	for _, name := range files {
		if b, err := os.ReadFile(name); err == nil {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := spec.Parse("fuzz.toml", data)
		if s == nil {
			t.Fatalf("Parse returned no spec")
		}
		if err != nil {
			checkErr(t, "fuzz.toml", data, err)
			return
		}
		roundTrip(t, s)
	})
}

var inlineSeeds = []string{
	"null:/tmp",
	"/tmp",
	"null,null,null:/",
	"mux(names=a),null:/tmp",
	"mux(names=\"a,b\"),null:/tmp",
	"mux( names = 'x' ) , null : /tmp",
	"local(path=/tmp)",
	"nul:/tmp",
	"null(:/tmp",
	"null(x=\"a\\\"b\"):/tmp",
	"",
	"null,:/x",
	"null:",
	"a b",
}

func FuzzInline(f *testing.F) {
	for _, s := range inlineSeeds {
		f.Add(s)
	}
	f.Add(strings.Repeat("null,", spec.MaxDepth-1) + "null:/tmp") // one layer too deep
	f.Add(strings.Repeat("null,", spec.MaxDepth-2) + "null:/tmp") // as deep as allowed
	f.Fuzz(func(t *testing.T, text string) {
		s, err := spec.ParseInline(text)
		if s == nil {
			t.Fatalf("ParseInline returned no spec")
		}
		if err != nil {
			checkErr(t, spec.InlineFile, []byte(text), err)
			return
		}
		roundTrip(t, s)
	})
}
