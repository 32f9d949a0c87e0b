// Command cairnbench is cairn's benchmark suite: the experiments of the
// source documents (../shared/seeds), run against native ext4, every cairn
// stack in bench/stacks and the peers in bench/peers. Run it with bench/run;
// see bench/README.md.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	var code int
	switch os.Args[1] {
	case "run":
		code = cmdRun(os.Args[2:])
	case "report":
		code = cmdReport(os.Args[2:])
	case "packages":
		code = cmdPackages(os.Args[2:])
	case "-h", "--help", "help":
		usage()
	default:
		fmt.Fprintf(os.Stderr, "cairnbench: unknown command %q\n", os.Args[1])
		usage()
		code = 2
	}
	os.Exit(code)
}

func usage() {
	fmt.Fprintf(os.Stderr, `Usage:
  cairnbench run [flags]      run the suite (see 'cairnbench run -h'); bench/run wraps it
  cairnbench report [flags]   make the report and plots again from a results directory
  cairnbench packages         list the Debian packages the peers need
`)
}

// Record is one measurement, a line of results.jsonl.
type Record struct {
	Workload string  `json:"workload"`
	Config   string  `json:"config"`
	Metric   string  `json:"metric"`
	X        float64 `json:"x,omitempty"` // the swept parameter (bytes, files, MiB)
	Run      int     `json:"run"`
	Value    float64 `json:"value"`
	Unit     string  `json:"unit"`
	Error    string  `json:"error,omitempty"` // a failed step: Value is meaningless
	Time     string  `json:"time"`
}

// Meta describes a run: machine, versions, options.
type Meta struct {
	Started, Finished string
	Mode              string
	Command           string
	Machine           map[string]string
	Configs           []MetaConfig
	Params            map[string]string
	Notes             []string
}

type MetaConfig struct {
	Name, Kind, Description, Version, Mount, Setup, Failed string
}

// Bench is the state of a run.
type Bench struct {
	Root    string // where instances live (an ext4 directory)
	Bin     string // helper binaries (passthrough_ll)
	Repo    string
	Quick   bool
	Runs    int
	Tarball string
	Limit   time.Duration // per (workload, config)

	ctx     context.Context // cancelled on SIGINT/SIGTERM
	cancel  func()
	mu      sync.Mutex
	cur     *Instance // the mounted instance, for cleanup on a signal
	out     *os.File
	done    map[string]bool // workload/config pairs already in the results
	started time.Time
	step    string
	// steps and stepsDone count the (workload, run, configuration) steps
	// of the run, for the progress lines' count and time left.
	steps, stepsDone int
	stepsTime        time.Duration // the time the done steps took
}

func (b *Bench) record(r Record) {
	r.Time = time.Now().UTC().Format(time.RFC3339)
	data, _ := json.Marshal(r)
	b.out.Write(append(data, '\n'))
}

// progress prints a line: the time since the start, the steps done of all
// and an estimate of the time left (the done steps' mean time), the step.
func (b *Bench) progress(f string, a ...any) {
	el := time.Since(b.started).Round(time.Second)
	left := "?"
	if b.stepsDone > 0 {
		left = (b.stepsTime / time.Duration(b.stepsDone) * time.Duration(b.steps-b.stepsDone)).Round(time.Minute).String()
	}
	fmt.Fprintf(os.Stderr, "[%8s, step %d/%d, ~%s left] %s %s\n", el, b.stepsDone, b.steps, left, b.step, fmt.Sprintf(f, a...))
}

// quickConfigs are the configurations of --quick: native, the null stack,
// one data-changing stack of each kind, and one peer of each kind
// (passthrough, union, encryption, compression), so that the subset
// stays under 10 minutes on 2 cores.
const quickConfigs = "native,cairn-null,cairn-crypt,cairn-zstd,passthrough_ll,mergerfs,gocryptfs,rclone-compress"

func (b *Bench) runs(full int) int {
	if b.Runs > 0 {
		return b.Runs
	}
	if b.Quick {
		return 1
	}
	return full
}

func cmdRun(args []string) int {
	fl := flag.NewFlagSet("run", flag.ExitOnError)
	repo := fl.String("repo", ".", "the cairn repository (for bench/stacks, bench/peers, bin/cairn)")
	quick := fl.Bool("quick", false, "a small subset (under 10 minutes)")
	dir := fl.String("dir", "", "an ext4 directory to work in (made by bench/run on a loop-mounted image if empty)")
	outDir := fl.String("out", "", "results directory: results.jsonl, meta.json, plots (default docs/bench, or bench/results/quick with --quick)")
	report := fl.String("report", "", "the markdown report to write (default docs/benchmarks.md, or OUT/benchmarks.md with --quick)")
	only := fl.String("configs", "", "comma-separated configurations to run (default all; with --quick: "+quickConfigs+")")
	skip := fl.String("skip-configs", "", "comma-separated configurations to leave out")
	wls := fl.String("workloads", "", "comma-separated workloads to run (default all): "+strings.Join(workloadNames(), ","))
	runs := fl.Int("runs", 0, "runs per measurement (default: 3, 2 for compile, largedir, tools and bonnie; 1 with --quick)")
	resume := fl.Bool("resume", false, "keep OUT/results.jsonl and skip workload/config pairs already in it")
	tarball := fl.String("tarball", "", "the autoconf source tarball of the compile workload (default ../shared/bench/grep_3.8.orig.tar.xz beside the repo)")
	bin := fl.String("bin", "", "directory of helper binaries (default REPO/bin/bench)")
	limit := fl.Duration("limit", 0, "time limit of one workload on one configuration (default 12m, 3m with --quick)")
	fl.Parse(args)

	b := &Bench{Repo: *repo, Quick: *quick, Runs: *runs, started: time.Now(), done: map[string]bool{}}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.Repo, _ = filepath.Abs(b.Repo)
	if *outDir == "" {
		*outDir = filepath.Join(b.Repo, "docs/bench")
		if b.Quick {
			*outDir = filepath.Join(b.Repo, "bench/results/quick")
		}
	}
	if *report == "" {
		*report = filepath.Join(b.Repo, "docs/benchmarks.md")
		if b.Quick {
			*report = filepath.Join(*outDir, "benchmarks.md")
		}
	}
	b.Tarball = *tarball
	if b.Tarball == "" {
		b.Tarball = filepath.Join(b.Repo, "../shared/bench/grep_3.8.orig.tar.xz")
	}
	b.Bin = *bin
	if b.Bin == "" {
		b.Bin = filepath.Join(b.Repo, "bin/bench")
	}
	b.Limit = *limit
	if b.Limit == 0 {
		b.Limit = 12 * time.Minute
		if b.Quick {
			b.Limit = 3 * time.Minute
		}
	}
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "cairnbench: --dir is required (bench/run makes one)")
		return 2
	}
	b.Root = filepath.Join(*dir, fmt.Sprintf("cairnbench-%d", os.Getpid()))
	if err := os.MkdirAll(b.Root, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "cairnbench:", err)
		return 1
	}
	defer os.RemoveAll(b.Root)
	// On SIGINT/SIGTERM: unmount what is mounted, remove the work tree, exit.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		sig := <-sigs
		fmt.Fprintf(os.Stderr, "cairnbench: %v: unmounting and stopping\n", sig)
		b.cancel() // kills the running command's process group
		time.Sleep(time.Second)
		b.mu.Lock()
		if b.cur != nil {
			b.cur.stop()
		}
		b.mu.Unlock()
		os.RemoveAll(b.Root)
		os.Exit(1)
	}()
	if err := os.MkdirAll(*outDir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "cairnbench:", err)
		return 1
	}

	cfgs, err := loadConfigs(filepath.Join(b.Repo, "bench/stacks"), filepath.Join(b.Repo, "bench/peers"), filepath.Join(b.Repo, "bin/cairn"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "cairnbench:", err)
		return 1
	}
	if b.Quick && *only == "" {
		*only = quickConfigs
	}
	cfgs = filterConfigs(cfgs, *only, *skip)
	ws := workloads()
	if *wls != "" {
		ws = nil
		for _, n := range strings.Split(*wls, ",") {
			w := findWorkload(n)
			if w == nil {
				fmt.Fprintf(os.Stderr, "cairnbench: unknown workload %q (have %s)\n", n, strings.Join(workloadNames(), ", "))
				return 2
			}
			ws = append(ws, w)
		}
	}

	resPath := filepath.Join(*outDir, "results.jsonl")
	var kept []Record
	if *resume {
		// Keep the pairs measured without error; the others run again.
		recs, _ := readResults(resPath)
		kept, b.done = completePairs(recs)
	}
	b.out, err = os.OpenFile(resPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cairnbench:", err)
		return 1
	}
	defer b.out.Close()
	for _, r := range kept {
		data, _ := json.Marshal(r)
		b.out.Write(append(data, '\n'))
	}

	meta := &Meta{Started: time.Now().UTC().Format(time.RFC3339), Mode: "full", Command: "bench/run " + strings.Join(args, " "),
		Machine: machineInfo(*dir), Params: map[string]string{}}
	if b.Quick {
		meta.Mode = "quick"
	}
	metaPath := filepath.Join(*outDir, "meta.json")
	var oldMeta *Meta
	if *resume {
		if old, err := readMeta(metaPath); err == nil {
			oldMeta = old
			meta.Started = old.Started
			meta.Notes = old.Notes
			meta.Command = old.Command + "; then " + meta.Command
			meta.Params = old.Params
			meta.Mode = old.Mode
		}
	}
	// Build and describe each configuration once.
	for _, c := range cfgs {
		if c.Build != "" {
			i := &Instance{Bin: b.Bin}
			if out, err := shell(i.expand(c.Build), 5*time.Minute); err != nil {
				c.Failed = fmt.Sprintf("build failed: %v: %s", err, lastLine(out))
			}
		}
		if c.Version != "" && c.Failed == "" {
			i := &Instance{Bin: b.Bin}
			out, err := shell(i.expand(c.Version), time.Minute)
			c.VersionText = strings.TrimSpace(out)
			if err != nil {
				c.VersionText = "not installed? " + lastLine(out)
			}
		}
		rel := func(s string) string { return strings.ReplaceAll(s, b.Repo+"/", "") }
		meta.Configs = append(meta.Configs, MetaConfig{Name: c.Name, Kind: c.Kind, Description: c.Description,
			Version: c.VersionText, Mount: rel(c.Mount), Setup: rel(c.Setup), Failed: c.Failed})
	}
	if oldMeta != nil {
		// Keep the configurations of the earlier run that this one leaves out.
		have := map[string]bool{}
		for _, c := range meta.Configs {
			have[c.Name] = true
		}
		merged := append([]MetaConfig(nil), meta.Configs...)
		for _, c := range oldMeta.Configs {
			if !have[c.Name] {
				merged = append(merged, c)
			}
		}
		order := map[string]int{}
		for i, c := range oldMeta.Configs {
			order[c.Name] = i
		}
		sort.SliceStable(merged, func(i, j int) bool {
			oi, iok := order[merged[i].Name]
			oj, jok := order[merged[j].Name]
			if iok && jok {
				return oi < oj
			}
			return iok
		})
		meta.Configs = merged
	}
	if meta.Params == nil {
		meta.Params = map[string]string{}
	}
	for _, w := range ws {
		meta.Params[w.Name] = w.Params(b)
	}
	writeMeta(metaPath, meta)
	fmt.Fprintf(os.Stderr, "cairnbench: %s run, %d configurations (%s), %d workloads; results in %s\n",
		meta.Mode, len(cfgs), names(cfgs), len(ws), resPath)

	for _, w := range ws {
		b.steps += b.runs(w.Runs) * len(cfgs)
	}
	for wi, w := range ws {
		// The configurations take turns, run by run, so that a change in
		// the machine's load spreads over all of them.
		failed := map[string]bool{}
		nr := b.runs(w.Runs)
		for run := 1; run <= nr; run++ {
			for ci, c := range cfgs {
				b.step = fmt.Sprintf("[%d/%d %s run %d/%d] [%d/%d %s]", wi+1, len(ws), w.Name, run, nr, ci+1, len(cfgs), c.Name)
				if b.done[w.Name+"/"+c.Name] {
					b.stepsDone++
					if run == 1 {
						b.progress("already measured (--resume)")
					}
					continue
				}
				if failed[c.Name] {
					b.stepsDone++
					continue
				}
				if c.Failed != "" {
					b.stepsDone++
					b.record(Record{Workload: w.Name, Config: c.Name, Metric: "setup", Error: c.Failed})
					b.progress("skipped: %s", c.Failed)
					failed[c.Name] = true
					continue
				}
				t0 := time.Now()
				b.record(Record{Workload: w.Name, Config: c.Name, Metric: "_load", Run: run, Value: loadAvg(), Unit: "load"})
				err := runLimited(b, w, c, run)
				b.stepsDone++
				b.stepsTime += time.Since(t0)
				b.record(Record{Workload: w.Name, Config: c.Name, Metric: "_load", Run: run, Value: loadAvg(), Unit: "load"})
				if err != nil {
					b.record(Record{Workload: w.Name, Config: c.Name, Metric: "run", Run: run, Error: err.Error()})
					b.progress("FAILED: %v", err)
					failed[c.Name] = true
				} else {
					b.progress("done in %v", time.Since(t0).Round(100*time.Millisecond))
				}
			}
		}
		// A report after each workload, so that partial results are usable.
		meta.Finished = time.Now().UTC().Format(time.RFC3339)
		writeMeta(metaPath, meta)
		if err := makeReport(*outDir, *report); err != nil {
			fmt.Fprintln(os.Stderr, "cairnbench: report:", err)
		}
	}
	fmt.Fprintf(os.Stderr, "cairnbench: finished in %v; report %s\n", time.Since(b.started).Round(time.Second), *report)
	return 0
}

// runLimited runs one workload on one configuration with the time limit.
// On a timeout it unmounts the instance so that the workload's goroutine
// fails out, and moves on.
func runLimited(b *Bench, w *Workload, c *Config, run int) error {
	done := make(chan error, 1)
	var mu sync.Mutex
	var inst *Instance
	cctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	ctx := &Ctx{Bench: b, Cfg: c, ctx: cctx, only: run, onStart: func(i *Instance) {
		mu.Lock()
		inst = i
		mu.Unlock()
		b.mu.Lock()
		b.cur = i
		b.mu.Unlock()
	}}
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- fmt.Errorf("panic: %v", r)
			}
		}()
		done <- w.Run(ctx)
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(b.Limit):
		ctx.stopped.Store(true)
		cancel()
		mu.Lock()
		i := inst
		mu.Unlock()
		if i != nil {
			i.unmount()
		}
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
		}
		mu.Lock()
		i = inst
		mu.Unlock()
		if i != nil {
			i.stop()
		}
		return fmt.Errorf("time limit of %v reached", b.Limit)
	}
}

// loadAvg is the 1-minute load average: other work on the machine shows
// in it, and the report prints it beside each workload.
func loadAvg() float64 {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	var l float64
	fmt.Sscan(string(data), &l)
	return l
}

func filterConfigs(cfgs []*Config, only, skip string) []*Config {
	in := func(list, n string) bool {
		for _, x := range strings.Split(list, ",") {
			if strings.TrimSpace(x) == n {
				return true
			}
		}
		return false
	}
	var out []*Config
	for _, c := range cfgs {
		if only != "" && !in(only, c.Name) {
			continue
		}
		if skip != "" && in(skip, c.Name) {
			continue
		}
		out = append(out, c)
	}
	return out
}

func names(cfgs []*Config) string {
	var n []string
	for _, c := range cfgs {
		n = append(n, c.Name)
	}
	return strings.Join(n, ", ")
}

func machineInfo(dir string) map[string]string {
	m := map[string]string{"cpus": fmt.Sprint(runtime.NumCPU()), "go": runtime.Version()}
	run := func(k string, name string, args ...string) {
		if out, err := exec.Command(name, args...).Output(); err == nil {
			m[k] = strings.TrimSpace(string(out))
		}
	}
	run("kernel", "uname", "-srvm")
	run("os", "sh", "-c", ". /etc/os-release; echo $PRETTY_NAME")
	run("cpu", "sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2")
	run("memory", "sh", "-c", "free -h | awk '/Mem:/ {print $2}'")
	run("filesystem", "sh", "-c", "findmnt -n -o SOURCE,FSTYPE,OPTIONS --target "+dir)
	run("fio", "fio", "--version")
	run("dbench", "sh", "-c", "dpkg-query -W -f '${Version}' dbench")
	run("bonnie++", "sh", "-c", "dpkg-query -W -f '${Version}' bonnie++")
	run("fuse3", "sh", "-c", "dpkg-query -W -f '${Version}' fuse3")
	return m
}

func writeMeta(path string, m *Meta) {
	data, _ := json.MarshalIndent(m, "", "  ")
	os.WriteFile(path, append(data, '\n'), 0o644)
}

func readMeta(path string) (*Meta, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var m Meta
	return &m, json.Unmarshal(data, &m)
}

// completePairs keeps the records of the workload/configuration pairs that
// have measurements and no error, and tells which pairs those are.
func completePairs(recs []Record) ([]Record, map[string]bool) {
	bad, has := map[string]bool{}, map[string]bool{}
	for _, r := range recs {
		k := r.Workload + "/" + r.Config
		if r.Error != "" {
			bad[k] = true
		} else if r.Metric != "_load" {
			has[k] = true
		}
	}
	// Records of tools ("tool: gzip -9") come with native's pair.
	pair := func(r Record) string {
		if strings.HasPrefix(r.Config, "tool: ") {
			return r.Workload + "/native"
		}
		return r.Workload + "/" + r.Config
	}
	done := map[string]bool{}
	var kept []Record
	for _, r := range recs {
		k := pair(r)
		if has[k] && !bad[k] {
			kept = append(kept, r)
			done[k] = true
		}
	}
	return kept, done
}

func readResults(path string) ([]Record, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var recs []Record
	for _, l := range strings.Split(string(data), "\n") {
		if strings.TrimSpace(l) == "" {
			continue
		}
		var r Record
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
		recs = append(recs, r)
	}
	return recs, nil
}

func cmdPackages(args []string) int {
	fl := flag.NewFlagSet("packages", flag.ExitOnError)
	repo := fl.String("repo", ".", "the cairn repository")
	fl.Parse(args)
	cfgs, err := loadConfigs(filepath.Join(*repo, "bench/stacks"), filepath.Join(*repo, "bench/peers"), "cairn")
	if err != nil {
		fmt.Fprintln(os.Stderr, "cairnbench:", err)
		return 1
	}
	set := map[string]bool{}
	for _, c := range cfgs {
		for _, p := range c.Packages {
			set[p] = true
		}
	}
	var ps []string
	for p := range set {
		ps = append(ps, p)
	}
	sort.Strings(ps)
	fmt.Println(strings.Join(ps, " "))
	return 0
}

func cmdReport(args []string) int {
	fl := flag.NewFlagSet("report", flag.ExitOnError)
	outDir := fl.String("out", "docs/bench", "results directory (results.jsonl, meta.json; plots go there)")
	report := fl.String("report", "docs/benchmarks.md", "the markdown report to write")
	fl.Parse(args)
	if err := makeReport(*outDir, *report); err != nil {
		fmt.Fprintln(os.Stderr, "cairnbench:", err)
		return 1
	}
	return 0
}
