package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"cairnfs.dev/cairn/bench/opencost"
)

// Workload is one experiment.
type Workload struct {
	Name, Title string
	Runs        int // runs of a full run
	Run         func(*Ctx) error
	Params      func(*Bench) string
}

// Ctx is one workload on one configuration.
type Ctx struct {
	*Bench
	Cfg     *Config
	ctx     context.Context
	onStart func(*Instance)
	stopped atomic.Bool
	only    int // run only this run (the configurations take turns run by run)
}

// runList is the runs this call makes: c.only, or all of them.
func (c *Ctx) runList(full int) []int {
	if c.only > 0 {
		return []int{c.only}
	}
	var l []int
	for r := 1; r <= c.runs(full); r++ {
		l = append(l, r)
	}
	return l
}

func (c *Ctx) start() (*Instance, error) {
	if c.stopped.Load() {
		return nil, fmt.Errorf("stopped")
	}
	i, err := start(c.Cfg, c.Root, c.Bin)
	if err != nil {
		return nil, err
	}
	c.onStart(i)
	return i, nil
}

func (c *Ctx) rec(w, metric string, x float64, run int, v float64, unit string) {
	c.record(Record{Workload: w, Config: c.Cfg.Name, Metric: metric, X: x, Run: run, Value: v, Unit: unit})
}

// timed runs a command in dir and returns its elapsed, user and system
// seconds (user and system include the command's children).
func (c *Ctx) timed(dir string, argv ...string) (el, user, sys float64, err error) {
	var out bytes.Buffer
	cmd := c.command(dir, argv...)
	cmd.Stdout = io.Discard
	cmd.Stderr = &limited{b: &out, n: 1 << 16}
	t0 := time.Now()
	err = cmd.Run()
	el = time.Since(t0).Seconds()
	if cmd.ProcessState != nil {
		user = cmd.ProcessState.UserTime().Seconds()
		sys = cmd.ProcessState.SystemTime().Seconds()
	}
	if err != nil {
		err = fmt.Errorf("%s: %v: %s", strings.Join(argv, " "), err, lastLine(out.String()))
	}
	return
}

// output runs a command and returns its standard output.
func (c *Ctx) output(dir string, argv ...string) (string, float64, error) {
	var out, errb bytes.Buffer
	cmd := c.command(dir, argv...)
	cmd.Stdout = &out
	cmd.Stderr = &limited{b: &errb, n: 1 << 16}
	t0 := time.Now()
	err := cmd.Run()
	el := time.Since(t0).Seconds()
	if err != nil {
		err = fmt.Errorf("%s: %v: %s", strings.Join(argv, " "), err, lastLine(errb.String()+out.String()))
	}
	return out.String(), el, err
}

// command is a command in its own process group, killed whole when the
// workload is stopped (time limit, signal).
func (c *Ctx) command(dir string, argv ...string) *exec.Cmd {
	cmd := exec.CommandContext(c.ctx, argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

type limited struct {
	b *bytes.Buffer
	n int
}

func (l *limited) Write(p []byte) (int, error) {
	if l.b.Len() < l.n {
		l.b.Write(p)
	}
	return len(p), nil
}

func workloads() []*Workload {
	return []*Workload{
		{Name: "streaming", Runs: 3, Title: "Streaming and random I/O (fio)", Run: wStreaming, Params: pStreaming},
		{Name: "compile", Runs: 2, Title: "Large compile (and file attributes)", Run: wCompile, Params: pCompile},
		{Name: "largedir", Runs: 2, Title: "Large directories (Usenetfs)", Run: wLargeDir, Params: pLargeDir},
		{Name: "filecopy", Runs: 3, Title: "File-copy", Run: wFileCopy, Params: pFileCopy},
		{Name: "append", Runs: 3, Title: "File-append", Run: wAppend, Params: pAppend},
		{Name: "dircache", Runs: 3, Title: "Directory cache (pefs): create, ls -Al, remove", Run: wDirCache, Params: pDirCache},
		{Name: "dbench", Runs: 3, Title: "dbench", Run: wDbench, Params: pDbench},
		{Name: "opencost", Runs: 3, Title: "Open and read/write cost (MonA)", Run: wOpenCost, Params: pOpenCost},
		{Name: "tools", Runs: 2, Title: "Against user-level tools (gzip -9, zstd)", Run: wTools, Params: pTools},
		{Name: "bonnie", Runs: 2, Title: "Bonnie++", Run: wBonnie, Params: pBonnie},
	}
}

func workloadNames() []string {
	var n []string
	for _, w := range workloads() {
		n = append(n, w.Name)
	}
	return n
}

func findWorkload(n string) *Workload {
	for _, w := range workloads() {
		if w.Name == n {
			return w
		}
	}
	return nil
}

// ---- data files ----

// data returns a file of size bytes of the given kind (zeros: one repeated
// character; text: C source and documentation; binary: executables;
// compressed: xz data), made once on the native file system.
func (b *Bench) data(kind string, size int64) (string, error) {
	dir := filepath.Join(b.Root, "data")
	p := filepath.Join(dir, fmt.Sprintf("%s-%d", kind, size))
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	os.MkdirAll(dir, 0o755)
	var src []string
	switch kind {
	case "zeros":
	case "text":
		src, _ = filepath.Glob("/usr/share/common-licenses/*")
		more, _ := filepath.Glob("/usr/include/linux/*.h")
		src = append(src, more...)
	case "binary":
		src, _ = filepath.Glob("/usr/bin/*")
	case "compressed":
		src = []string{b.Tarball}
		more, _ := filepath.Glob("/usr/share/doc/*/changelog.Debian.gz")
		src = append(src, more...)
	default:
		return "", fmt.Errorf("unknown data kind %q", kind)
	}
	buf := make([]byte, 0, size)
	if kind == "zeros" {
		buf = bytes.Repeat([]byte{'a'}, int(size))
	}
	for len(buf) < int(size) {
		if len(src) == 0 {
			return "", fmt.Errorf("no source files for %s data", kind)
		}
		added := false
		for _, s := range src {
			fi, err := os.Stat(s)
			if err != nil || !fi.Mode().IsRegular() {
				continue
			}
			d, err := os.ReadFile(s)
			if err != nil {
				continue
			}
			added = true
			buf = append(buf, d[:min(len(d), int(size)-len(buf))]...)
			if len(buf) >= int(size) {
				break
			}
		}
		if !added {
			return "", fmt.Errorf("no readable source files for %s data", kind)
		}
	}
	if err := os.WriteFile(p, buf, 0o644); err != nil {
		return "", err
	}
	return p, nil
}

// ---- 9. streaming ----

func pStreaming(b *Bench) string {
	size, rt := streamingParams(b)
	return fmt.Sprintf("fio %s (psync, buffered, fallocate=none): seq write %d MiB bs=1M with end_fsync; cold seq read bs=1M; cold random read 4 KiB of %d MiB (1/16 of the file); random write 4 KiB for %ds (time_based, end_fsync); %d runs",
		fioVersion(), size, size/16, rt, b.runs(3))
}

func streamingParams(b *Bench) (sizeMiB, runtimeS int) {
	if b.Quick {
		return 128, 3
	}
	return 1024, 10
}

func fioVersion() string {
	out, _ := exec.Command("fio", "--version").Output()
	return strings.TrimSpace(string(out))
}

type fioOut struct {
	Jobs []struct {
		Read, Write struct {
			BW   float64 `json:"bw"` // KiB/s
			IOPS float64 `json:"iops"`
		}
	} `json:"jobs"`
}

func (c *Ctx) fio(dir string, args ...string) (*fioOut, error) {
	argv := append([]string{"fio", "--name=bench", "--filename=" + filepath.Join(dir, "fio.dat"),
		"--ioengine=psync", "--fallocate=none", "--output-format=json"}, args...)
	out, _, err := c.output(dir, argv...)
	if err != nil {
		return nil, err
	}
	var f fioOut
	if i := strings.IndexByte(out, '{'); i > 0 {
		out = out[i:]
	}
	if err := json.Unmarshal([]byte(out), &f); err != nil || len(f.Jobs) == 0 {
		return nil, fmt.Errorf("fio output: %v", err)
	}
	return &f, nil
}

func wStreaming(c *Ctx) error {
	size, rt := streamingParams(c.Bench)
	sz := fmt.Sprintf("--size=%dM", size)
	for _, run := range c.runList(3) {
		i, err := c.start()
		if err != nil {
			return err
		}
		err = func() error {
			f, err := c.fio(i.Dir, "--rw=write", "--bs=1M", sz, "--end_fsync=1")
			if err != nil {
				return err
			}
			c.rec("streaming", "seq write", 0, run, f.Jobs[0].Write.BW/1024, "MiB/s")
			c.progress("run %d: seq write %.0f MiB/s", run, f.Jobs[0].Write.BW/1024)
			if err := i.remount(true); err != nil {
				return err
			}
			if f, err = c.fio(i.Dir, "--rw=read", "--bs=1M", sz); err != nil {
				return err
			}
			c.rec("streaming", "seq read (cold)", 0, run, f.Jobs[0].Read.BW/1024, "MiB/s")
			if err := i.remount(true); err != nil {
				return err
			}
			// A fixed amount (1/16 of the file), not a time: over a long enough
			// time readahead would bring the whole file into the cache.
			if f, err = c.fio(i.Dir, "--rw=randread", "--bs=4k", sz, fmt.Sprintf("--io_size=%dM", size/16)); err != nil {
				return err
			}
			c.rec("streaming", "random read 4k (cold)", 0, run, f.Jobs[0].Read.IOPS, "IOPS")
			if err := i.remount(true); err != nil {
				return err
			}
			if f, err = c.fio(i.Dir, "--rw=randwrite", "--bs=4k", sz, "--time_based", fmt.Sprintf("--runtime=%d", rt), "--end_fsync=1"); err != nil {
				return err
			}
			c.rec("streaming", "random write 4k", 0, run, f.Jobs[0].Write.IOPS, "IOPS")
			c.progress("run %d: done", run)
			return nil
		}()
		if e := i.stop(); err == nil {
			err = e
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// ---- 6. large directories ----

func largeDirParams(b *Bench) (kmax, step int) {
	if b.Quick {
		return 10, 2
	}
	return 17, 1
}

func pLargeDir(b *Bench) string {
	kmax, step := largeDirParams(b)
	return fmt.Sprintf("in-process Go driver; one directory grown to 2^k files of 2048 bytes for k = 0..%d (step %d); at each k, after a remount with caches dropped: 1000 lstat of random existing names, then 1000 creates (create, write 2048 bytes, close) and 1000 unlinks of the oldest files; %d runs",
		kmax, step, b.runs(2))
}

func wLargeDir(c *Ctx) error {
	kmax, step := largeDirParams(c.Bench)
	payload := bytes.Repeat([]byte("usenet article body\n"), 2048/20+1)[:2048]
	for _, run := range c.runList(2) {
		i, err := c.start()
		if err != nil {
			return err
		}
		err = func() error {
			d := filepath.Join(i.Dir, "big")
			if err := os.Mkdir(d, 0o755); err != nil {
				return err
			}
			name := func(n int) string { return filepath.Join(d, fmt.Sprintf("a%08d", n)) }
			create := func(n int) error {
				f, err := os.OpenFile(name(n), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
				if err != nil {
					return err
				}
				if _, err := f.Write(payload); err != nil {
					f.Close()
					return err
				}
				return f.Close()
			}
			lo, hi := 0, 0
			rng := rand.New(rand.NewPCG(uint64(run), 17))
			for k := 0; k <= kmax; k += step {
				if c.stopped.Load() {
					return fmt.Errorf("stopped")
				}
				n := 1 << k
				for hi-lo < n {
					if err := create(hi); err != nil {
						return err
					}
					hi++
				}
				if err := i.remount(true); err != nil {
					return err
				}
				t0 := time.Now()
				var st syscall.Stat_t
				for j := 0; j < 1000; j++ {
					if err := syscall.Lstat(name(lo+rng.IntN(hi-lo)), &st); err != nil {
						return fmt.Errorf("lstat: %v", err)
					}
				}
				tl := time.Since(t0).Seconds()
				t0 = time.Now()
				for j := 0; j < 1000; j++ {
					if err := create(hi); err != nil {
						return err
					}
					hi++
				}
				tc := time.Since(t0).Seconds()
				t0 = time.Now()
				for j := 0; j < 1000; j++ {
					if err := syscall.Unlink(name(lo)); err != nil {
						return fmt.Errorf("unlink: %v", err)
					}
					lo++
				}
				tu := time.Since(t0).Seconds()
				c.rec("largedir", "1000 lookups", float64(n), run, tl, "s")
				c.rec("largedir", "1000 creates", float64(n), run, tc, "s")
				c.rec("largedir", "1000 unlinks", float64(n), run, tu, "s")
				if k >= 10 {
					c.progress("run %d: 2^%d files: lookups %.3fs creates %.3fs unlinks %.3fs", run, k, tl, tc, tu)
				}
			}
			return nil
		}()
		if e := i.stop(); err == nil {
			err = e
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// ---- 3. file-copy ----

func copySizes(b *Bench) []int64 {
	s := []int64{0}
	step, max := 1, 25
	if b.Quick {
		step, max = 4, 24
	}
	for k := 0; k <= max; k += step {
		s = append(s, 1<<k)
	}
	return s
}

func copyCount(size int64) int {
	if size == 0 {
		return 200
	}
	return int(max(3, min(200, (64<<20)/size)))
}

func pFileCopy(b *Bench) string {
	return fmt.Sprintf("in-process copy (128 KiB buffer, no fsync) of a text file from native ext4 (warm) into the file system; sizes 0 and 2^k bytes %v; per size, min(200, max(3, 64 MiB/size)) files, time per file; %d runs",
		copySizes(b), b.runs(3))
}

func copyFile(src, dst string, buf []byte) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.CopyBuffer(onlyWriter{out}, onlyReader{in}, buf); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// onlyReader/onlyWriter hide ReadFrom/WriteTo so that io.CopyBuffer uses
// plain read and write calls (no copy_file_range or splice shortcuts).
type onlyReader struct{ r io.Reader }

func (o onlyReader) Read(p []byte) (int, error) { return o.r.Read(p) }

type onlyWriter struct{ w io.Writer }

func (o onlyWriter) Write(p []byte) (int, error) { return o.w.Write(p) }

func wFileCopy(c *Ctx) error {
	buf := make([]byte, 128<<10)
	for _, run := range c.runList(3) {
		i, err := c.start()
		if err != nil {
			return err
		}
		err = func() error {
			for _, size := range copySizes(c.Bench) {
				src, err := c.data("text", size)
				if err != nil {
					return err
				}
				os.ReadFile(src) // warm
				n := copyCount(size)
				t0 := time.Now()
				for j := 0; j < n; j++ {
					if err := copyFile(src, filepath.Join(i.Dir, fmt.Sprintf("copy%d", j)), buf); err != nil {
						return err
					}
				}
				c.rec("filecopy", "copy", float64(size), run, time.Since(t0).Seconds()/float64(n), "s")
				for j := 0; j < n; j++ {
					os.Remove(filepath.Join(i.Dir, fmt.Sprintf("copy%d", j)))
				}
			}
			c.progress("run %d: done", run)
			return nil
		}()
		if e := i.stop(); err == nil {
			err = e
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// ---- 4. file-append ----

func appendParams(b *Bench) (maxAppends int, maxSize int64) {
	if b.Quick {
		return 1 << 12, 1 << 20
	}
	return 1 << 17, 32 << 20
}

func pAppend(b *Bench) string {
	ma, ms := appendParams(b)
	return fmt.Sprintf("in-process: a new file opened once with O_APPEND and built by write(2) calls of 10, 100 or 1000 bytes of text up to 2^k bytes, for every 2^k >= the unit, at most %d appends and %d MiB; time per file; %d runs",
		ma, ms>>20, b.runs(3))
}

func wAppend(c *Ctx) error {
	ma, ms := appendParams(c.Bench)
	src, err := c.data("text", ms)
	if err != nil {
		return err
	}
	text, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	for _, run := range c.runList(3) {
		i, err := c.start()
		if err != nil {
			return err
		}
		err = func() error {
			for _, unit := range []int64{10, 100, 1000} {
				for k := 0; k <= 25; k++ {
					size := int64(1) << k
					if size < unit || size > ms || size/unit > int64(ma) {
						continue
					}
					if c.stopped.Load() {
						return fmt.Errorf("stopped")
					}
					p := filepath.Join(i.Dir, "appended")
					t0 := time.Now()
					f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND|os.O_TRUNC, 0o644)
					if err != nil {
						return err
					}
					for off := int64(0); off < size; off += unit {
						n := min(unit, size-off)
						if _, err := f.Write(text[off : off+n]); err != nil {
							f.Close()
							return err
						}
					}
					if err := f.Close(); err != nil {
						return err
					}
					c.rec("append", fmt.Sprintf("append %d B", unit), float64(size), run, time.Since(t0).Seconds(), "s")
					os.Remove(p)
				}
			}
			c.progress("run %d: done", run)
			return nil
		}()
		if e := i.stop(); err == nil {
			err = e
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// ---- 1. compile, 5. file attributes ----

func pCompile(b *Bench) string {
	what := "unpack (tar -xf), ./configure, make -j2"
	if b.Quick {
		what = "unpack only (--quick skips configure and make)"
	}
	return fmt.Sprintf("%s of %s inside the file system, compiler and headers outside; then ls -lRF of the tree after a remount with caches dropped (cold) and again (warm), then rm -rf of it and sync; elapsed, user and system seconds of the commands; %d runs",
		what, filepath.Base(b.Tarball), b.runs(2))
}

func wCompile(c *Ctx) error {
	if _, err := os.Stat(c.Tarball); err != nil {
		return fmt.Errorf("tarball: %v (use --tarball)", err)
	}
	for _, run := range c.runList(2) {
		os.ReadFile(c.Tarball) // the tarball comes from the page cache
		i, err := c.start()
		if err != nil {
			return err
		}
		err = func() error {
			steps := [][]string{{"unpack", "tar", "-xf", c.Tarball}}
			if !c.Quick {
				steps = append(steps, []string{"configure", "./configure", "--quiet"}, []string{"make", "make", "-j2"})
			}
			top := i.Dir
			var stepErr error
			for _, s := range steps {
				el, us, sy, err := c.timed(top, s[1:]...)
				if err != nil {
					// The tree is still there: measure its attributes anyway.
					stepErr = fmt.Errorf("%s: %v", s[0], err)
					break
				}
				c.rec("compile", s[0], 0, run, el, "s")
				c.rec("compile", s[0]+" (user)", 0, run, us, "s")
				c.rec("compile", s[0]+" (system)", 0, run, sy, "s")
				c.progress("run %d: %s %.1fs", run, s[0], el)
				if s[0] == "unpack" {
					ents, err := os.ReadDir(i.Dir)
					if err != nil {
						return err
					}
					if len(ents) == 1 && ents[0].IsDir() {
						top = filepath.Join(i.Dir, ents[0].Name())
					}
				}
			}
			if err := i.remount(true); err != nil {
				return err
			}
			for _, m := range []string{"ls -lRF (cold)", "ls -lRF (warm)"} {
				el, _, _, err := c.timed(i.Dir, "ls", "-lRF", i.Dir)
				if err != nil {
					return err
				}
				c.rec("attributes", m, 0, run, el, "s")
			}
			// rm -rf of the tree, then sync (the distributed-lower issue's
			// "rm -rf"; a layer that keeps side files removes them too).
			t0 := time.Now()
			ents, err := os.ReadDir(i.Dir)
			if err != nil {
				return err
			}
			args := []string{"-rf"}
			for _, e := range ents {
				args = append(args, e.Name())
			}
			if _, _, _, err := c.timed(i.Dir, append([]string{"rm"}, args...)...); err != nil {
				return err
			}
			syscall.Sync()
			c.rec("attributes", "rm -rf", 0, run, time.Since(t0).Seconds(), "s")
			return stepErr
		}()
		if e := i.stop(); err == nil {
			err = e
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// ---- 7. directory cache, dbench ----

func dirCacheCounts(b *Bench) []int {
	if b.Quick {
		return []int{1000}
	}
	return []int{1000, 2000, 3000}
}

func pDirCache(b *Bench) string {
	return fmt.Sprintf("in-process create of N empty files in one directory, ls -Al of it (a process), in-process unlink of them; N = %v; %d runs",
		dirCacheCounts(b), b.runs(3))
}

func wDirCache(c *Ctx) error {
	for _, run := range c.runList(3) {
		i, err := c.start()
		if err != nil {
			return err
		}
		err = func() error {
			for _, n := range dirCacheCounts(c.Bench) {
				d := filepath.Join(i.Dir, fmt.Sprintf("d%d", n))
				if err := os.Mkdir(d, 0o755); err != nil {
					return err
				}
				t0 := time.Now()
				for j := 0; j < n; j++ {
					fd, err := syscall.Open(filepath.Join(d, fmt.Sprintf("file%05d", j)), syscall.O_CREAT|syscall.O_EXCL|syscall.O_WRONLY, 0o644)
					if err != nil {
						return fmt.Errorf("create: %v", err)
					}
					syscall.Close(fd)
				}
				c.rec("dircache", "create", float64(n), run, time.Since(t0).Seconds(), "s")
				el, _, _, err := c.timed(d, "ls", "-Al", d)
				if err != nil {
					return err
				}
				c.rec("dircache", "ls -Al", float64(n), run, el, "s")
				t0 = time.Now()
				for j := 0; j < n; j++ {
					if err := syscall.Unlink(filepath.Join(d, fmt.Sprintf("file%05d", j))); err != nil {
						return fmt.Errorf("unlink: %v", err)
					}
				}
				c.rec("dircache", "remove", float64(n), run, time.Since(t0).Seconds(), "s")
			}
			return nil
		}()
		if e := i.stop(); err == nil {
			err = e
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func dbenchTime(b *Bench) int {
	if b.Quick {
		return 5
	}
	return 15
}

func pDbench(b *Bench) string {
	return fmt.Sprintf("dbench %s -t %d -c /usr/share/dbench/client.txt 2 (2 clients); throughput MB/s; %d runs", "(Debian)", dbenchTime(b), b.runs(3))
}

var dbenchRE = regexp.MustCompile(`Throughput ([0-9.]+) MB/sec`)

func wDbench(c *Ctx) error {
	for _, run := range c.runList(3) {
		i, err := c.start()
		if err != nil {
			return err
		}
		err = func() error {
			out, _, err := c.output(i.Dir, "dbench", "-D", i.Dir, "-t", strconv.Itoa(dbenchTime(c.Bench)), "-c", "/usr/share/dbench/client.txt", "2")
			if err != nil {
				return err
			}
			m := dbenchRE.FindStringSubmatch(out)
			if m == nil {
				return fmt.Errorf("dbench: no throughput in its output: %s", lastLine(out))
			}
			v, _ := strconv.ParseFloat(m[1], 64)
			c.rec("dbench", "throughput", 0, run, v, "MB/s")
			c.progress("run %d: %.1f MB/s", run, v)
			return nil
		}()
		if e := i.stop(); err == nil {
			err = e
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// ---- 8. open and read/write cost ----

func rwSizes(b *Bench) []int64 {
	if b.Quick {
		return []int64{1 << 10, 32 << 10, 1 << 20}
	}
	var s []int64
	for k := 10; k <= 20; k++ {
		s = append(s, 1<<k)
	}
	return s
}

func rwCount(size int64) int { return int(max(20, min(2000, (64<<20)/size))) }

func pOpenCost(b *Bench) string {
	return fmt.Sprintf("in-process: open+close (O_RDONLY) of 100 existing files, 10000 times round robin, warm; for sizes %v bytes: write = open(O_WRONLY|O_TRUNC)+write+close, read = open+read+close, min(2000, max(20, 64 MiB/size)) times each, warm; time per operation; %d runs",
		rwSizes(b), b.runs(3))
}

func wOpenCost(c *Ctx) error {
	for _, run := range c.runList(3) {
		i, err := c.start()
		if err != nil {
			return err
		}
		err = func() error {
			var names []string
			for j := 0; j < 100; j++ {
				p := filepath.Join(i.Dir, fmt.Sprintf("o%03d", j))
				if err := os.WriteFile(p, make([]byte, 4096), 0o644); err != nil {
					return err
				}
				names = append(names, p)
			}
			sec, err := opencost.OpenClose(names, 10000)
			if err != nil {
				return err
			}
			c.rec("opencost", "open+close", 0, run, sec, "s")
			for _, size := range rwSizes(c.Bench) {
				buf := bytes.Repeat([]byte{'x'}, int(size))
				p := filepath.Join(i.Dir, "rw")
				n := rwCount(size)
				sec, err := opencost.OpenWriteClose(p, buf, n)
				if err != nil {
					return err
				}
				c.rec("opencost", "write", float64(size), run, sec, "s")
				if sec, err = opencost.OpenReadClose(p, buf, n); err != nil {
					return err
				}
				c.rec("opencost", "read", float64(size), run, sec, "s")
			}
			return nil
		}()
		if e := i.stop(); err == nil {
			err = e
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// ---- 2. bonnie ----

func bonnieSizes(b *Bench) []int {
	if b.Quick {
		return []int{16}
	}
	var s []int
	for m := 1; m <= 1024; m *= 2 {
		s = append(s, m)
	}
	return s
}

func pBonnie(b *Bench) string {
	return fmt.Sprintf("bonnie++ -s SIZE -r 0 -n 0 -f -u root (fast mode: no per-character tests, no file-creation tests) for SIZE = %v MiB; elapsed time of the whole run, and block write/rewrite/read throughput where bonnie++ measures it; %d runs",
		bonnieSizes(b), b.runs(2))
}

func wBonnie(c *Ctx) error {
	for _, run := range c.runList(2) {
		i, err := c.start()
		if err != nil {
			return err
		}
		err = func() error {
			for _, s := range bonnieSizes(c.Bench) {
				d := filepath.Join(i.Dir, fmt.Sprintf("b%d", s))
				if err := os.Mkdir(d, 0o755); err != nil {
					return err
				}
				out, el, err := c.output(d, "bonnie++", "-d", d, "-s", strconv.Itoa(s), "-r", "0", "-n", "0", "-f", "-u", "root", "-q")
				if err != nil {
					return err
				}
				c.rec("bonnie", "elapsed", float64(s), run, el, "s")
				// CSV: ...,11 block write K/s,12 cpu,13 rewrite K/s,14 cpu,...,17 block read K/s
				for _, l := range strings.Split(out, "\n") {
					f := strings.Split(l, ",")
					if len(f) < 20 || !strings.HasPrefix(f[0], "1.") {
						continue
					}
					for _, m := range []struct {
						i    int
						name string
					}{{11, "block write"}, {13, "rewrite"}, {17, "block read"}} {
						if v, err := strconv.ParseFloat(f[m.i], 64); err == nil {
							c.rec("bonnie", m.name, float64(s), run, v/1024, "MiB/s")
						}
					}
				}
				os.RemoveAll(d)
				c.progress("run %d: %d MiB: %.1fs", run, s, el)
			}
			return nil
		}()
		if e := i.stop(); err == nil {
			err = e
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// ---- 10. user-level tools ----

var toolKinds = []string{"zeros", "text", "binary", "compressed"}

func toolSize(b *Bench) int64 {
	if b.Quick {
		return 4 << 20
	}
	return 32 << 20
}

func pTools(b *Bench) string {
	return fmt.Sprintf("a %d MiB file of each kind (%s) copied into the file system (in-process; then a wait until the lower stops growing, and an unmount, so that everything is written); space = apparent bytes added to the lower directory; the tools compress the same file on native ext4: gzip -9 -c, zstd -q -c (level 3) and zstd -19; %d runs",
		toolSize(b)>>20, strings.Join(toolKinds, ", "), b.runs(2))
}

// lowerBytes sums the sizes of the regular files under dir.
func lowerBytes(dir string) int64 {
	var n int64
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

func wTools(c *Ctx) error {
	buf := make([]byte, 128<<10)
	for _, run := range c.runList(2) {
		for _, kind := range toolKinds {
			src, err := c.data(kind, toolSize(c.Bench))
			if err != nil {
				return err
			}
			os.ReadFile(src)
			i, err := c.start()
			if err != nil {
				return err
			}
			err = func() error {
				base := lowerBytes(i.Lower)
				t0 := time.Now()
				if err := copyFile(src, filepath.Join(i.Dir, kind), buf); err != nil {
					return err
				}
				el := time.Since(t0).Seconds()
				settle(i.Lower, base)
				if err := i.unmount(); err != nil {
					return err
				}
				if i.Cfg.Kind == "native" {
					syscall.Sync()
				}
				c.rec("tools", "copy "+kind, 0, run, el, "s")
				c.rec("tools", "space "+kind, 0, run, float64(lowerBytes(i.Lower)-base), "bytes")
				if c.Cfg.Kind != "native" {
					return nil
				}
				// The user-level tools, once, beside native.
				for _, t := range []struct{ name, cmd string }{
					{"gzip -9", "gzip -9 -c"}, {"zstd", "zstd -q -c"}, {"zstd -19", "zstd -q -19 -c"},
				} {
					out := filepath.Join(i.Lower, kind+".out")
					el, _, _, err := c.timed(i.Lower, "sh", "-c", t.cmd+" "+src+" > "+out)
					if err != nil {
						return err
					}
					fi, err := os.Stat(out)
					if err != nil {
						return err
					}
					c.record(Record{Workload: "tools", Config: "tool: " + t.name, Metric: "copy " + kind, Run: run, Value: el, Unit: "s"})
					c.record(Record{Workload: "tools", Config: "tool: " + t.name, Metric: "space " + kind, Run: run, Value: float64(fi.Size()), Unit: "bytes"})
				}
				return nil
			}()
			if e := i.stop(); err == nil {
				err = e
			}
			if err != nil {
				return err
			}
		}
		c.progress("run %d: done", run)
	}
	return nil
}

// settle waits (up to 30 s) until the bytes under the lower directory stop
// changing: some peers write back after close (rclone's VFS cache uploads
// 5 s later, and drops what is pending when unmounted).
func settle(dir string, base int64) {
	last, stable := int64(-1), 0
	for t := 0; t < 120 && stable < 4; t++ {
		n := lowerBytes(dir)
		if n == last && n > base {
			stable++
		} else {
			stable = 0
		}
		last = n
		time.Sleep(250 * time.Millisecond)
	}
}
