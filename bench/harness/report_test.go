package main

import (
	"math"
	"strings"
	"testing"
)

func TestSummarize(t *testing.T) {
	s := summarize([]float64{3, 1, 2}, "s")
	if s.Med != 2 || s.Lo != 1 || s.Hi != 3 || s.N != 3 {
		t.Errorf("odd: %+v", s)
	}
	s = summarize([]float64{4, 1, 2, 3}, "s")
	if s.Med != 2.5 {
		t.Errorf("even: median %v, want 2.5", s.Med)
	}
}

func TestFmtVal(t *testing.T) {
	for _, c := range []struct {
		v    float64
		unit string
		want string
	}{
		{0.0000123, "s", "12.3 µs"}, {0.25, "s", "250.0 ms"}, {2.5, "s", "2.50 s"},
		{3 << 20, "bytes", "3.00 MiB"}, {2048, "bytes", "2.0 KiB"}, {12, "bytes", "12 B"},
		{512.4, "MiB/s", "512 MiB/s"}, {5.25, "MB/s", "5.2 MB/s"},
	} {
		if got := fmtVal(c.v, c.unit); got != c.want {
			t.Errorf("fmtVal(%v, %s) = %q, want %q", c.v, c.unit, got, c.want)
		}
	}
}

func TestAggregateRatios(t *testing.T) {
	recs := []Record{
		{Workload: "filecopy", Config: "native", Metric: "copy", X: 1, Run: 1, Value: 1, Unit: "s"},
		{Workload: "filecopy", Config: "native", Metric: "copy", X: 2, Run: 1, Value: 2, Unit: "s"},
		{Workload: "filecopy", Config: "cairn-null", Metric: "copy", X: 1, Run: 1, Value: 2, Unit: "s"},
		{Workload: "filecopy", Config: "cairn-null", Metric: "copy", X: 2, Run: 1, Value: 8, Unit: "s"},
		{Workload: "filecopy", Config: "peer", Metric: "run", Error: "mount: failed"},
	}
	r := aggregate(recs, nil)
	g, n := r.geoRatio("filecopy", "copy", "cairn-null", "native")
	if n != 2 || math.Abs(g-math.Sqrt(8)) > 1e-9 {
		t.Errorf("geoRatio = %v over %d points, want %v over 2", g, n, math.Sqrt(8))
	}
	if r.errors["filecopy"]["peer"] != "mount: failed" {
		t.Errorf("errors: %v", r.errors)
	}
	if c := r.cell(key{"filecopy", "copy", 2, "cairn-null"}, true); c != "8.00 s ×4.00" {
		t.Errorf("cell = %q", c)
	}
	var md strings.Builder
	r.sweepTables(&md, "filecopy", r.configsIn("filecopy"), nil)
	if !strings.Contains(md.String(), "| geometric mean ×native | - | 2.83 |") {
		t.Errorf("sweep table:\n%s", md.String())
	}
}

func TestCompletePairs(t *testing.T) {
	recs := []Record{
		{Workload: "w", Config: "a", Metric: "_load"},
		{Workload: "w", Config: "a", Metric: "m", Value: 1},
		{Workload: "w", Config: "b", Metric: "m", Value: 1},
		{Workload: "w", Config: "b", Metric: "run", Error: "boom"},
		{Workload: "w", Config: "c", Metric: "_load"},
		{Workload: "w", Config: "native", Metric: "m", Value: 1},
		{Workload: "w", Config: "tool: gzip -9", Metric: "m", Value: 1},
	}
	kept, done := completePairs(recs)
	if !done["w/a"] || done["w/b"] || done["w/c"] || !done["w/native"] {
		t.Errorf("done = %v", done)
	}
	if len(kept) != 4 {
		t.Errorf("kept %d records, want 4 (a's two, native, the tool): %v", len(kept), kept)
	}
}

func TestLastLine(t *testing.T) {
	if got := lastLine("spec.toml:9:8: unknown layer type\n    type = \"acl\"\n           ^\n"); got != `spec.toml:9:8: unknown layer type / type = "acl" / ^` {
		t.Errorf("lastLine = %q", got)
	}
}
