// Command libbench measures a stack used in-process (package cairn)
// against the same stack through a FUSE mount (bin/cairn mount) and the
// bare directory, in one run: a 1 GiB file written in 1 MiB writes and
// fsynced, then read back (after dropping the page cache), and a
// directory of N small files created, listed with their attributes,
// stat-ed, read and removed. Medians of -runs runs; ratios to the bare
// directory. Run as root on a quiet machine (it drops caches):
//
//	go run ./bench/libbench -dir /mnt/scratch -runs 3
package main

import (
	"flag"
	"fmt"
	"io/fs"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"cairnfs.dev/cairn"
)

// target is where a workload runs: the bare directory, the stack
// in-process, or the stack through a mount; all through one small API.
type target interface {
	WriteFile(name string, b []byte, perm fs.FileMode) error
	ReadFile(name string) ([]byte, error)
	OpenFile(name string, flag int, perm fs.FileMode) (file, error)
	Mkdir(name string, perm fs.FileMode) error
	ReadDir(name string) ([]fs.DirEntry, error)
	Stat(name string) (fs.FileInfo, error)
	RemoveAll(name string) error
}

type file interface {
	Write([]byte) (int, error)
	Read([]byte) (int, error)
	Sync() error
	Close() error
}

// osDir is a directory through the kernel (bare, or a mount).
type osDir string

func (d osDir) p(n string) string { return filepath.Join(string(d), n) }
func (d osDir) WriteFile(n string, b []byte, m fs.FileMode) error {
	return os.WriteFile(d.p(n), b, m)
}
func (d osDir) ReadFile(n string) ([]byte, error) { return os.ReadFile(d.p(n)) }
func (d osDir) OpenFile(n string, f int, m fs.FileMode) (file, error) {
	return os.OpenFile(d.p(n), f, m)
}
func (d osDir) Mkdir(n string, m fs.FileMode) error     { return os.Mkdir(d.p(n), m) }
func (d osDir) ReadDir(n string) ([]fs.DirEntry, error) { return os.ReadDir(d.p(n)) }
func (d osDir) Stat(n string) (fs.FileInfo, error)      { return os.Stat(d.p(n)) }
func (d osDir) RemoveAll(n string) error                { return os.RemoveAll(d.p(n)) }

type lib struct{ *cairn.Stack }

func (l lib) OpenFile(n string, f int, m fs.FileMode) (file, error) { return l.Stack.OpenFile(n, f, m) }

func dropCaches() { os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0) }

// bigFile writes and reads back 1 GiB: seconds for each.
func bigFile(t target) (w, r float64) {
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	t0 := time.Now()
	f, err := t.OpenFile("big", os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		log.Fatal(err)
	}
	for range 1024 {
		if _, err := f.Write(buf); err != nil {
			log.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		log.Fatal(err)
	}
	f.Close()
	w = time.Since(t0).Seconds()
	dropCaches()
	t0 = time.Now()
	f, err = t.OpenFile("big", os.O_RDONLY, 0)
	if err != nil {
		log.Fatal(err)
	}
	total := 0
	for {
		n, err := f.Read(buf)
		total += n
		if err != nil || n == 0 {
			break
		}
	}
	f.Close()
	if total != 1<<30 {
		log.Fatalf("read %d bytes back", total)
	}
	r = time.Since(t0).Seconds()
	t.RemoveAll("big")
	return w, r
}

// smallFiles: create n 1 KiB files, list the directory with attributes,
// stat each, read each, remove them: seconds.
func smallFiles(t target, n int) float64 {
	t0 := time.Now()
	if err := t.Mkdir("many", 0o755); err != nil {
		log.Fatal(err)
	}
	body := []byte(strings.Repeat("x", 2048))
	for i := range n {
		if err := t.WriteFile(fmt.Sprintf("many/f%06d", i), body, 0o644); err != nil {
			log.Fatal(err)
		}
	}
	ents, err := t.ReadDir("many")
	if err != nil || len(ents) != n {
		log.Fatalf("listed %d of %d: %v", len(ents), n, err)
	}
	for _, e := range ents {
		if _, err := e.Info(); err != nil {
			log.Fatal(err)
		}
	}
	for i := range n {
		if _, err := t.Stat(fmt.Sprintf("many/f%06d", i)); err != nil {
			log.Fatal(err)
		}
		if _, err := t.ReadFile(fmt.Sprintf("many/f%06d", i)); err != nil {
			log.Fatal(err)
		}
	}
	if err := t.RemoveAll("many"); err != nil {
		log.Fatal(err)
	}
	return time.Since(t0).Seconds()
}

func median(x []float64) float64 { slices.Sort(x); return x[len(x)/2] }

func main() {
	dir := flag.String("dir", "", "a scratch directory (an ext4 of its own, without discard)")
	runs := flag.Int("runs", 3, "runs of each workload (the median is reported)")
	n := flag.Int("files", 20000, "files of the small-file workload (2 KiB each, one directory: the suite's large-directory creates)")
	chain := flag.String("chain", "null", "the stack's layers over the directory (the inline form's chain)")
	cairnBin := flag.String("cairn", "bin/cairn", "the cairn binary, for the mount")
	flag.Parse()
	if *dir == "" {
		log.Fatal("-dir is required")
	}
	bare := filepath.Join(*dir, "bare")
	lower := filepath.Join(*dir, "lower")
	mnt := filepath.Join(*dir, "mnt")
	for _, d := range []string{bare, lower, mnt} {
		os.RemoveAll(d)
		if err := os.MkdirAll(d, 0o755); err != nil {
			log.Fatal(err)
		}
	}
	spec := *chain + ":" + lower
	res := map[string][3][]float64{}
	add := func(name string, w, r, s float64) {
		x := res[name]
		x[0], x[1], x[2] = append(x[0], w), append(x[1], r), append(x[2], s)
		res[name] = x
	}
	for run := range *runs {
		fmt.Fprintf(os.Stderr, "run %d of %d\n", run+1, *runs)
		w, r := bigFile(osDir(bare))
		add("bare", w, r, smallFiles(osDir(bare), *n))

		st, err := cairn.Open(spec, cairn.Options{})
		if err != nil {
			log.Fatal(err)
		}
		w, r = bigFile(lib{st})
		add("in-process", w, r, smallFiles(lib{st}, *n))
		st.Close()

		if out, err := exec.Command(*cairnBin, "mount", spec, mnt).CombinedOutput(); err != nil {
			log.Fatalf("mount: %v: %s", err, out)
		}
		w, r = bigFile(osDir(mnt))
		add("fuse", w, r, smallFiles(osDir(mnt), *n))
		if out, err := exec.Command(*cairnBin, "umount", mnt).CombinedOutput(); err != nil {
			log.Fatalf("umount: %v: %s", err, out)
		}
	}
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("stack %q, %d runs (medians), %d small files; load average at the end: %s", spec, *runs, *n, load)
	fmt.Printf("| | 1 GiB write+fsync | 1 GiB read (cold) | %d small files |\n| --- | --- | --- | --- |\n", *n)
	b := res["bare"]
	for _, name := range []string{"bare", "in-process", "fuse"} {
		x := res[name]
		fmt.Printf("| %s | %.2f s (%.2fx) | %.2f s (%.2fx) | %.2f s (%.2fx) |\n", name,
			median(x[0]), median(x[0])/median(b[0]), median(x[1]), median(x[1])/median(b[1]), median(x[2]), median(x[2])/median(b[2]))
	}
}
