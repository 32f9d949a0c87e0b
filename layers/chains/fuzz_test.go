package chains

import (
	"slices"
	"strings"
	"testing"
)

// FuzzParseRecord: the chain record parser takes any bytes (a record is
// read from the lower, where anyone with access may have written it):
// it never panics, accepts only valid link names, at most maxLinks of
// them, and what it accepts formats back to a record that parses the same.
func FuzzParseRecord(f *testing.F) {
	for _, s := range []string{"1:zstd", "1:zstd,crypt", "1:copy,copy,copy", "2:zstd", "1:", "1:,", "zstd", "1:ZSTD", "1:a-b_c", "1:-a", ":", "1:zstd,\x00"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		names, err := parseRecord(b)
		if err != nil {
			return
		}
		if len(names) > maxLinks {
			t.Fatalf("%q: %d links", b, len(names))
		}
		for _, n := range names {
			if !validName(n) {
				t.Fatalf("%q: accepted link name %q", b, n)
			}
		}
		if len(names) == 0 {
			return
		}
		again, err := parseRecord(formatRecord(names))
		if err != nil || !slices.Equal(again, names) {
			t.Fatalf("%q: %q formats to %q, which parses to %q, %v", b, names, formatRecord(names), again, err)
		}
	})
}

func TestParseRecord(t *testing.T) {
	for in, want := range map[string][]string{"1:zstd,crypt": {"zstd", "crypt"}, "1:copy": {"copy"}, "1:": nil, "1: zstd , gzip ": {"zstd", "gzip"}} {
		got, err := parseRecord([]byte(in))
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%q: %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"zstd", "2:zstd", "1:zstd,", "1:Zstd", "1:_x", "1:" + string(make([]byte, 40))} {
		if got, err := parseRecord([]byte(in)); err == nil {
			t.Errorf("%q: accepted as %q", in, got)
		}
	}
}

// FuzzParseLink: the link record parser never panics, and what it accepts
// has a target that is relative, views it knows, and formats back to a
// record that parses the same.
func FuzzParseLink(f *testing.F) {
	for _, s := range []string{"report.txt:gzip", "a/b:stored,gzip", "x:", ":gzip", "/etc/passwd:gzip", "a:b:gzip", "../x:gzip", "a:gzip,stored"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := parseLink(s)
		if err != nil {
			return
		}
		if l.target == "" || l.target[0] == '/' || len(l.views) == 0 {
			t.Fatalf("%q: accepted %+v", s, l)
		}
		for i, v := range l.views {
			if v != "gzip" && (v != "stored" || i != 0) {
				t.Fatalf("%q: accepted view %q at %d", s, v, i)
			}
		}
		again, err := parseLink(l.String())
		if err != nil || again.String() != l.String() {
			t.Fatalf("%q: %q parses to %v, %v", s, l.String(), again, err)
		}
		if p, err := l.resolve("dir/link"); err == nil && (strings.HasPrefix(p, "../") || p == ".." || strings.HasPrefix(p, "/")) {
			t.Fatalf("%q: resolves to %q", s, p)
		}
	})
}
