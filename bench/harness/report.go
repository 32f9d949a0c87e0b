package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// stat is the median and range of one measurement over its runs.
type stat struct {
	Med, Lo, Hi float64
	N           int
	Unit        string
}

func summarize(v []float64, unit string) stat {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	n := len(s)
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return stat{Med: med, Lo: s[0], Hi: s[n-1], N: n, Unit: unit}
}

type key struct {
	Workload, Metric string
	X                float64
	Config           string
}

// results is the aggregated content of results.jsonl.
type results struct {
	stats   map[key]stat
	metrics map[string][]string  // workload -> metrics in order of appearance
	xs      map[string][]float64 // workload/metric -> sorted xs
	configs []string             // in report order
	errors  map[string]map[string]string
	load    map[string]map[string][]float64 // workload -> config -> load averages
}

func aggregate(recs []Record, meta *Meta) *results {
	r := &results{stats: map[key]stat{}, metrics: map[string][]string{}, xs: map[string][]float64{}, errors: map[string]map[string]string{},
		load: map[string]map[string][]float64{}}
	vals := map[key][]float64{}
	units := map[key]string{}
	seenM := map[string]bool{}
	seenX := map[string]bool{}
	seenC := map[string]bool{}
	addC := func(c string) {
		if !seenC[c] {
			seenC[c] = true
			r.configs = append(r.configs, c)
		}
	}
	if meta != nil {
		for _, c := range meta.Configs {
			addC(c.Name)
		}
	}
	for _, rec := range recs {
		if rec.Metric == "_load" {
			if r.load[rec.Workload] == nil {
				r.load[rec.Workload] = map[string][]float64{}
			}
			r.load[rec.Workload][rec.Config] = append(r.load[rec.Workload][rec.Config], rec.Value)
			continue
		}
		if rec.Error != "" {
			if r.errors[rec.Workload] == nil {
				r.errors[rec.Workload] = map[string]string{}
			}
			r.errors[rec.Workload][rec.Config] = rec.Error
			addC(rec.Config)
			continue
		}
		k := key{rec.Workload, rec.Metric, rec.X, rec.Config}
		vals[k] = append(vals[k], rec.Value)
		units[k] = rec.Unit
		addC(rec.Config)
		if mk := rec.Workload + "/" + rec.Metric; !seenM[mk] {
			seenM[mk] = true
			r.metrics[rec.Workload] = append(r.metrics[rec.Workload], rec.Metric)
		}
		if xk := fmt.Sprintf("%s/%s/%g", rec.Workload, rec.Metric, rec.X); !seenX[xk] {
			seenX[xk] = true
			mk := rec.Workload + "/" + rec.Metric
			r.xs[mk] = append(r.xs[mk], rec.X)
		}
	}
	for k, v := range vals {
		r.stats[k] = summarize(v, units[k])
	}
	for _, x := range r.xs {
		sort.Float64s(x)
	}
	return r
}

// higherBetter tells the direction of a unit.
func higherBetter(unit string) bool {
	return unit == "MiB/s" || unit == "MB/s" || unit == "IOPS"
}

func fmtVal(v float64, unit string) string {
	switch unit {
	case "s":
		switch {
		case v < 1e-3:
			return fmt.Sprintf("%.1f µs", v*1e6)
		case v < 1:
			return fmt.Sprintf("%.1f ms", v*1e3)
		case v < 100:
			return fmt.Sprintf("%.2f s", v)
		}
		return fmt.Sprintf("%.0f s", v)
	case "bytes":
		switch {
		case v >= 1<<20:
			return fmt.Sprintf("%.2f MiB", v/(1<<20))
		case v >= 1<<10:
			return fmt.Sprintf("%.1f KiB", v/(1<<10))
		}
		return fmt.Sprintf("%.0f B", v)
	}
	if v >= 100 {
		return fmt.Sprintf("%.0f %s", v, unit)
	}
	return fmt.Sprintf("%.1f %s", v, unit)
}

func fmtX(x float64, w string) string {
	switch w {
	case "filecopy", "append", "opencost":
		return fmtVal(x, "bytes")
	case "bonnie":
		return fmt.Sprintf("%g MiB", x)
	case "largedir":
		return fmt.Sprintf("2^%d", int(math.Round(math.Log2(x))))
	}
	return fmt.Sprintf("%g", x)
}

func fmtRatio(r float64) string {
	if math.IsNaN(r) || math.IsInf(r, 0) {
		return "-"
	}
	if r >= 10 {
		return fmt.Sprintf("%.0f", r)
	}
	return fmt.Sprintf("%.2f", r)
}

func (r *results) cell(k key, withSpread bool) string {
	s, ok := r.stats[k]
	if !ok {
		return "-"
	}
	out := fmtVal(s.Med, s.Unit)
	if withSpread && s.N > 1 {
		out += fmt.Sprintf(" (%s..%s)", trimUnit(fmtVal(s.Lo, s.Unit)), trimUnit(fmtVal(s.Hi, s.Unit)))
	}
	nk := k
	nk.Config = "native"
	if n, ok := r.stats[nk]; ok && k.Config != "native" && n.Med != 0 {
		out += " ×" + fmtRatio(s.Med/n.Med)
	}
	return out
}

func trimUnit(s string) string {
	if i := strings.IndexByte(s, ' '); i > 0 {
		return s[:i]
	}
	return s
}

// configsIn lists the configurations with data or errors in a workload.
func (r *results) configsIn(w string) []string {
	var out []string
	for _, c := range r.configs {
		has := r.errors[w][c] != ""
		for _, m := range r.metrics[w] {
			for _, x := range r.xs[w+"/"+m] {
				if _, ok := r.stats[key{w, m, x, c}]; ok {
					has = true
				}
			}
		}
		if has {
			out = append(out, c)
		}
	}
	return out
}

func isSweep(w string) bool {
	switch w {
	case "largedir", "filecopy", "append", "dircache", "bonnie":
		return true
	}
	return false
}

func kindOf(meta *Meta, c string) string {
	if meta != nil {
		for _, m := range meta.Configs {
			if m.Name == c {
				return m.Kind
			}
		}
	}
	if strings.HasPrefix(c, "tool:") {
		return "tool"
	}
	return ""
}

// geoRatio is the geometric mean over the common points of a metric of
// a's median over b's.
func (r *results) geoRatio(w, m, a, b string) (float64, int) {
	sum, n := 0.0, 0
	for _, x := range r.xs[w+"/"+m] {
		sa, oka := r.stats[key{w, m, x, a}]
		sb, okb := r.stats[key{w, m, x, b}]
		if oka && okb && sa.Med > 0 && sb.Med > 0 {
			sum += math.Log(sa.Med / sb.Med)
			n++
		}
	}
	if n == 0 {
		return math.NaN(), 0
	}
	return math.Exp(sum / float64(n)), n
}

// plot descriptions for plot.py
type plotPanel struct {
	Title  string       `json:"title"`
	XLabel string       `json:"xlabel,omitempty"`
	YLabel string       `json:"ylabel"`
	Series []plotSeries `json:"series"`
}

type plotSeries struct {
	Name string    `json:"name"`
	X    []float64 `json:"x,omitempty"`
	Y    []float64 `json:"y"`
	Lo   []float64 `json:"lo"`
	Hi   []float64 `json:"hi"`
}

type plotSpec struct {
	File   string      `json:"file"`
	Title  string      `json:"title"`
	Kind   string      `json:"kind"` // loglog, bars
	Panels []plotPanel `json:"panels"`
}

func makeReport(outDir, reportPath string) error {
	recs, err := readResults(filepath.Join(outDir, "results.jsonl"))
	if err != nil {
		return err
	}
	meta, _ := readMeta(filepath.Join(outDir, "meta.json"))
	r := aggregate(recs, meta)
	var md strings.Builder
	var plots []plotSpec
	relDir, err := filepath.Rel(filepath.Dir(reportPath), outDir)
	if err != nil {
		relDir = outDir
	}
	p := func(f string, a ...any) { fmt.Fprintf(&md, f, a...) }

	p("# cairn benchmarks\n\n")
	p("Generated by cairn's benchmark suite (`bench/run`, see `bench/README.md`) from `%s/results.jsonl`.\n", relDir)
	if meta != nil {
		p("Mode: **%s**; command: `%s`; started %s, last results %s (UTC).\n\n", meta.Mode, meta.Command, meta.Started, meta.Finished)
		p("## Machine\n\n| | |\n| --- | --- |\n")
		var ks []string
		for k := range meta.Machine {
			ks = append(ks, k)
		}
		sort.Strings(ks)
		for _, k := range ks {
			p("| %s | %s |\n", k, strings.ReplaceAll(meta.Machine[k], "|", "/"))
		}
		p("\n## Configurations\n\n")
		p("Each cairn stack is a spec in `bench/stacks/`, each peer a file in `bench/peers/`; `{lower}` is a fresh directory on the ext4 file system above, `{mnt}` the mountpoint, `{work}` a scratch directory beside the lower.\n\n")
		p("| configuration | kind | version | setup and mount | what it is | status |\n| --- | --- | --- | --- | --- | --- |\n")
		for _, c := range meta.Configs {
			status := "ok"
			if c.Failed != "" {
				status = "**failed**: " + c.Failed
			} else {
				var failed []string
				for w, e := range r.errors {
					if e[c.Name] != "" {
						failed = append(failed, w)
					}
				}
				sort.Strings(failed)
				if len(failed) > 0 {
					status = "failed in: " + strings.Join(failed, ", ")
				}
			}
			mount := c.Mount
			if c.Setup != "" {
				mount = c.Setup + " ; " + mount
			}
			if c.Kind == "native" {
				mount = "-"
			}
			p("| %s | %s | %s | `%s` | %s | %s |\n", c.Name, c.Kind, oneLine(c.Version), strings.ReplaceAll(oneLine(mount), "|", "\\|"), c.Description, oneLine(status))
		}
	}
	// Hand-written findings, kept beside the results.
	if notes, err := os.ReadFile(filepath.Join(outDir, "notes.md")); err == nil {
		p("\n%s\n", strings.TrimSpace(string(notes)))
	}
	p("\n## How to read the tables\n\n")
	p("Each cell is the median over the runs, with the range (min..max) where there was more than one run, and `×r`, the ratio to native (value / native value). For times and space lower is better; for MiB/s, MB/s and IOPS higher is better. The tables \"against the peers\" give each cairn stack's value divided by each peer's (for sweeps: the geometric mean of that ratio over the sizes both measured). Cold means: unmounted, `sync`, `echo 3 > /proc/sys/vm/drop_caches`, mounted again.\n\n")

	for _, w := range workloads() {
		wn := w.Name
		sub := []string{wn}
		if wn == "compile" {
			sub = append(sub, "attributes")
		}
		if len(r.metrics[wn]) == 0 && len(r.errors[wn]) == 0 {
			continue
		}
		p("## %s\n\n", w.Title)
		if meta != nil && meta.Params[wn] != "" {
			p("%s.\n\n", meta.Params[wn])
		}
		if l := r.loadNote(wn); l != "" {
			p("%s\n\n", l)
		}
		if errs := r.errors[wn]; len(errs) > 0 {
			var cs []string
			for c := range errs {
				cs = append(cs, c)
			}
			sort.Strings(cs)
			for _, c := range cs {
				p("- **%s failed**: %s\n", c, oneLine(errs[c]))
			}
			p("\n")
		}
		for _, sw := range sub {
			cfgs := r.configsIn(sw)
			if len(r.metrics[sw]) == 0 {
				continue
			}
			if sw == "attributes" {
				p("### File attributes (ls -lRF of the tree) and its removal (rm -rf)\n\n")
			}
			if isSweep(sw) || (sw == "opencost") {
				r.sweepTables(&md, sw, cfgs, meta)
			} else {
				r.flatTable(&md, sw, cfgs)
			}
			r.peerTable(&md, sw, cfgs, meta)
			ps := r.plotFor(sw, cfgs, w.Title)
			for _, pl := range ps {
				plots = append(plots, pl)
				p("![%s](%s)\n\n", pl.Title, filepath.Join(relDir, pl.File))
			}
		}
	}
	data, _ := json.MarshalIndent(plots, "", " ")
	pd := filepath.Join(outDir, "plots.json")
	if err := os.WriteFile(pd, data, 0o644); err != nil {
		return err
	}
	script := os.Getenv("CAIRNBENCH_PLOT")
	if script == "" {
		script = "bench/plot.py" // bench/run runs from the repository's root
	}
	if out, err := exec.Command("/usr/bin/python3", script, pd, outDir).CombinedOutput(); err != nil {
		p("\n(plots could not be made: %v: %s)\n", err, lastLine(string(out)))
	}
	return os.WriteFile(reportPath, []byte(md.String()), 0o644)
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// flatTable: rows are configurations, columns metrics.
func (r *results) flatTable(md *strings.Builder, w string, cfgs []string) {
	ms := r.metrics[w]
	fmt.Fprintf(md, "| configuration | %s |\n|---|%s\n", strings.Join(ms, " | "), strings.Repeat("---|", len(ms)))
	for _, c := range cfgs {
		fmt.Fprintf(md, "| %s |", c)
		for _, m := range ms {
			fmt.Fprintf(md, " %s |", r.cell(key{w, m, 0, c}, true))
		}
		md.WriteString("\n")
	}
	md.WriteString("\n")
}

// sweepTables: one table per metric; rows are the swept sizes, columns the
// configurations.
func (r *results) sweepTables(md *strings.Builder, w string, cfgs []string, meta *Meta) {
	for _, m := range r.metrics[w] {
		xs := r.xs[w+"/"+m]
		if len(xs) == 1 {
			fmt.Fprintf(md, "**%s**\n\n| configuration | %s |\n|---|---|\n", m, m)
			for _, c := range cfgs {
				fmt.Fprintf(md, "| %s | %s |\n", c, r.cell(key{w, m, xs[0], c}, true))
			}
			md.WriteString("\n")
			continue
		}
		fmt.Fprintf(md, "**%s** (median; ×native)\n\n| size | %s |\n|---|%s\n", m, strings.Join(cfgs, " | "), strings.Repeat("---|", len(cfgs)))
		for _, x := range xs {
			fmt.Fprintf(md, "| %s |", fmtX(x, w))
			for _, c := range cfgs {
				fmt.Fprintf(md, " %s |", r.cell(key{w, m, x, c}, false))
			}
			md.WriteString("\n")
		}
		fmt.Fprintf(md, "| geometric mean ×native |")
		for _, c := range cfgs {
			g, n := r.geoRatio(w, m, c, "native")
			if n == 0 || c == "native" {
				md.WriteString(" - |")
			} else {
				fmt.Fprintf(md, " %s |", fmtRatio(g))
			}
		}
		md.WriteString("\n\n")
	}
}

// peerTable: each cairn stack against each peer.
func (r *results) peerTable(md *strings.Builder, w string, cfgs []string, meta *Meta) {
	var stacks, peers []string
	for _, c := range cfgs {
		switch kindOf(meta, c) {
		case "cairn":
			stacks = append(stacks, c)
		case "peer", "tool":
			peers = append(peers, c)
		}
	}
	if len(stacks) == 0 || len(peers) == 0 {
		return
	}
	fmt.Fprintf(md, "Against the peers (cairn stack / peer):\n\n| stack | metric | %s |\n|---|---|%s\n", strings.Join(peers, " | "), strings.Repeat("---|", len(peers)))
	for _, s := range stacks {
		for _, m := range r.metrics[w] {
			fmt.Fprintf(md, "| %s | %s |", s, m)
			for _, pc := range peers {
				g, n := r.geoRatio(w, m, s, pc)
				if n == 0 {
					md.WriteString(" - |")
				} else {
					fmt.Fprintf(md, " %s |", fmtRatio(g))
				}
			}
			md.WriteString("\n")
		}
	}
	md.WriteString("\n")
}

func (r *results) plotFor(w string, cfgs []string, title string) []plotSpec {
	var panels []plotPanel
	sweep := isSweep(w)
	for _, m := range r.metrics[w] {
		xs := r.xs[w+"/"+m]
		unit := ""
		pn := plotPanel{Title: m}
		if sweep || len(xs) > 1 {
			for _, c := range cfgs {
				s := plotSeries{Name: c}
				for _, x := range xs {
					if st, ok := r.stats[key{w, m, x, c}]; ok && st.Med > 0 && x > 0 {
						s.X = append(s.X, x)
						s.Y, s.Lo, s.Hi = append(s.Y, st.Med), append(s.Lo, st.Lo), append(s.Hi, st.Hi)
						unit = st.Unit
					}
				}
				if len(s.Y) > 0 {
					pn.Series = append(pn.Series, s)
				}
			}
			pn.XLabel = map[string]string{"largedir": "files in the directory", "filecopy": "file size (bytes)", "append": "file size (bytes)",
				"opencost": "size (bytes)", "bonnie": "file size (MiB)", "dircache": "files"}[w]
		} else {
			for _, c := range cfgs {
				if st, ok := r.stats[key{w, m, xs[0], c}]; ok {
					pn.Series = append(pn.Series, plotSeries{Name: c, Y: []float64{st.Med}, Lo: []float64{st.Lo}, Hi: []float64{st.Hi}})
					unit = st.Unit
				}
			}
		}
		pn.YLabel = unit
		if unit == "s" && sweep {
			pn.YLabel = "seconds"
		}
		if len(pn.Series) > 0 {
			panels = append(panels, pn)
		}
	}
	if len(panels) == 0 {
		return nil
	}
	kind := "bars"
	if sweep {
		kind = "loglog"
	}
	if w == "opencost" { // one bar panel (open) and two sweeps
		var bars, sw []plotPanel
		for _, pn := range panels {
			if pn.XLabel == "" {
				bars = append(bars, pn)
			} else {
				sw = append(sw, pn)
			}
		}
		return []plotSpec{{File: w + "-open.png", Title: title + ": open", Kind: "bars", Panels: bars},
			{File: w + "-rw.png", Title: title + ": read/write", Kind: "loglog", Panels: sw}}
	}
	if w == "attributes" {
		title = "File attributes (ls -lRF)"
	}
	return []plotSpec{{File: w + ".png", Title: title, Kind: kind, Panels: panels}}
}

// loadNote tells the machine's load average around each configuration's
// measurement: on a shared machine, the figures are only as quiet as that.
func (r *results) loadNote(w string) string {
	if len(r.load[w]) == 0 {
		return ""
	}
	var parts []string
	for _, c := range r.configs {
		l := r.load[w][c]
		if len(l) == 0 {
			continue
		}
		lo, hi := l[0], l[0]
		for _, v := range l {
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
		parts = append(parts, fmt.Sprintf("%s %.1f-%.1f", c, lo, hi))
	}
	return "Load average (1 min) at the start and end of each configuration's measurement (2 cores; above 2 means other work competed): " + strings.Join(parts, ", ") + "."
}
