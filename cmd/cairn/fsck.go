package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"cairn/layer"
	"cairn/layers/codec"
)

func init() {
	register(&command{name: "fsck", args: "[--repair] [-q] SPEC",
		summary: "check (and repair) the files of a stack's size-changing layers",
		run:     func(a []string) int { return runFsck(a, os.Stdout, os.Stderr) }})
}

func runFsck(args []string, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("fsck", flag.ContinueOnError)
	fl.SetOutput(stderr)
	repair := fl.Bool("repair", false, "rebuild indexes that are missing, stale or wrong")
	quiet := fl.Bool("q", false, "report only files with problems")
	fl.Usage = func() {
		fmt.Fprintf(fl.Output(), `Usage: cairn fsck [--repair] [-q] SPEC

Checks every file under each size-changing layer (copy, uuencode, gzip, zstd,
lz4) of the stack SPEC: the header and index of each file against a scan of
its records, and every chunk's data. With --repair it rebuilds the indexes
that are missing, stale or wrong (chunks whose data is damaged cannot be
brought back: reading them gives EIO). It refuses a stack that is mounted
(or being checked): unmount it first.

Exits 0 if everything is consistent (after --repair: if everything could be
repaired), 1 if problems or damage remain, 2 on a bad command line, 3 if the
spec is invalid, 5 if the stack is in use.

Flags:
`)
		fl.PrintDefaults()
	}
	if code, ok := parseArgs(fl, args); !ok {
		return code
	}
	if fl.NArg() != 1 {
		fl.Usage()
		return exitUsage
	}
	s, err := loadSpec(fl.Arg(0))
	if err != nil {
		return specFailed(stderr, fl.Arg(0), err)
	}
	stack, err := s.Build()
	if err != nil {
		return specFailed(stderr, fl.Arg(0), err)
	}
	defer stack.Close()
	var layers []*codec.FS
	layer.Walk(stack.Top, func(l layer.FS) {
		if c, ok := l.(*codec.FS); ok {
			layers = append(layers, c)
		}
	})
	if len(layers) == 0 {
		fmt.Fprintf(stdout, "%s: no size-changing layer in this stack: nothing to check\n", fl.Arg(0))
		return exitOK
	}
	ctx := context.Background()
	// A mounted daemon holds the same lock: its engine keeps files' state
	// in memory, and checking (let alone repairing) under it would report
	// or make damage.
	if err := codec.Claim(ctx, stack.Top); err != nil {
		fmt.Fprintf(stderr, "cairn fsck: %s: %v\n", fl.Arg(0), err)
		var busy *codec.InUseError
		if errors.As(err, &busy) {
			return exitBusy
		}
		return exitFailed
	}
	bad := 0
	for _, l := range layers {
		var files []string
		if err := codec.Walk(ctx, l, "", func(p string) error { files = append(files, p); return nil }); err != nil {
			return fail(fmt.Errorf("fsck: listing the files of the %s layer: %w", l.Codec(), err), exitFailed)
		}
		bar := newProgress(stderr, len(files))
		var problems, damaged, repaired int
		for i, p := range files {
			bar.update(i, p)
			rep, err := l.Check(ctx, p, *repair)
			if err != nil {
				bar.clear()
				fmt.Fprintf(stdout, "%s: cannot check: %v\n", p, err)
				bad++
				continue
			}
			if rep.Repaired {
				repaired++
			}
			if !rep.OK() {
				problems += len(rep.Problems)
				damaged += len(rep.Damaged)
				bad++
			}
			if !*quiet || !rep.OK() || rep.Repaired {
				bar.clear()
				fmt.Fprintln(stdout, rep.String())
			}
		}
		bar.done()
		fmt.Fprintf(stdout, "%s layer: %d files checked, %d repaired, %d index problems left, %d damaged chunks\n",
			l.Codec(), len(files), repaired, problems, damaged)
	}
	if bad > 0 {
		return exitFailed
	}
	return exitOK
}

// progress draws a progress bar on a terminal, and nothing elsewhere.
type progress struct {
	w     io.Writer
	n     int
	tty   bool
	shown bool
}

func newProgress(w io.Writer, n int) *progress {
	p := &progress{w: w, n: n}
	if f, ok := w.(*os.File); ok {
		_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
		p.tty = err == nil
	}
	return p
}

func (p *progress) update(i int, name string) {
	if !p.tty || p.n == 0 {
		return
	}
	const width = 30
	fill := width * i / p.n
	if len(name) > 40 {
		name = "..." + name[len(name)-37:]
	}
	fmt.Fprintf(p.w, "\r[%s%s] %d/%d %-40s", strings.Repeat("=", fill), strings.Repeat(" ", width-fill), i, p.n, name)
	p.shown = true
}

func (p *progress) clear() {
	if p.shown {
		fmt.Fprintf(p.w, "\r%s\r", strings.Repeat(" ", 90))
		p.shown = false
	}
}

func (p *progress) done() { p.clear() }
