package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/shard"
)

func init() {
	register(&command{name: "reshard", args: "[--layout L] SPEC PATH",
		summary: "convert a flat directory of a shard stack into buckets, or grow its buckets, online",
		run:     func(a []string) int { return runReshard(a, os.Stdout, os.Stderr) }})
}

// The control attributes of a mounted shard layer (layers/shard/reshard.go).
const (
	shardControl  = "user.cairn-shard.reshard"
	shardProgress = "user.cairn-shard.progress"
)

func runReshard(args []string, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("reshard", flag.ContinueOnError)
	fl.SetOutput(stderr)
	lay := fl.String("layout", "", `the new layout: "hash N" (N a power of two) or "digits N" (10, 100, 1000); default: the rule's that covers PATH, else the layer's (a growing one: the bucket count the entries need)`)
	quiet := fl.Bool("q", false, "print no progress")
	fl.Usage = func() {
		fmt.Fprintf(fl.Output(), `Usage: cairn reshard [--layout L] SPEC PATH

Converts directory PATH of the shard layer of stack SPEC into bucket
subdirectories, or grows the buckets of a hash-sharded directory (each
bucket splits into two or more), a bucket at a time, moving each entry with
one rename in the lower. Readers and writers may use the directory
meanwhile. The directory's record says how far the move went: a run that
stops (a crash, a full disk, ^C) is resumed by running the same command
again, and until then every name is found where it is.

PATH is either a directory in the mount of SPEC (an absolute path: the
mounted daemon does the work, and this command shows its progress), or,
with SPEC not mounted, the directory's path in the stack ("spool/news").

Exit codes:
  0  done (or nothing to do)
  1  refused or stopped (see the message; run again to resume)
  2  bad command line
  3  the spec is invalid
  5  the stack is mounted: give the directory's path in the mount

Flags:
`)
		fl.PrintDefaults()
	}
	if code, ok := parseArgs(fl, args); !ok {
		return code
	}
	if fl.NArg() != 2 {
		fl.Usage()
		return exitUsage
	}
	s, err := loadSpec(fl.Arg(0))
	if err != nil {
		return specFailed(stderr, fl.Arg(0), err)
	}
	path := fl.Arg(1)
	show := func(line string) {
		if !*quiet {
			fmt.Fprintln(stderr, line)
		}
	}
	if filepath.IsAbs(path) {
		if fi, err := os.Stat(path); err == nil && fi.IsDir() {
			return reshardOnline(path, *lay, stdout, show)
		}
	}
	stack, err := s.Build()
	if err != nil {
		return specFailed(stderr, fl.Arg(0), err)
	}
	defer stack.Close()
	sh := shard.Stack(stack.Top)
	if sh == nil {
		return fail(fmt.Errorf("reshard: %s has no shard layer", fl.Arg(0)), exitFailed)
	}
	ctx := context.Background()
	if err := layer.ClaimStack(ctx, stack.Top); err != nil {
		fmt.Fprintf(stderr, "cairn reshard: %s: %v: give the directory's path in the mount to reshard it there\n", fl.Arg(0), err)
		if errors.Is(err, layer.ErrInUse) {
			return exitBusy
		}
		return exitFailed
	}
	p := strings.Trim(path, "/")
	to, err := sh.LayoutFor(p, *lay)
	if err != nil {
		return fail(usagef("reshard: --layout: %v", err), exitUsage)
	}
	var bar *progress
	err = sh.Reshard(ctx, p, to, func(pr shard.Progress) {
		to = pr.To // the layout chosen, where the spec's grows
		if *quiet || pr.Sources == 0 {
			return
		}
		if bar == nil {
			bar = newProgress(stderr, "reshard", "entries", int64(pr.Total), 0)
		}
		bar.update(int64(pr.Moved), 0, fmt.Sprintf("bucket %d/%d", pr.Source, pr.Sources))
	})
	bar.done()
	if err != nil {
		return fail(err, exitFailed)
	}
	fmt.Fprintf(stdout, "%s: %s\n", p, to)
	return exitOK
}

// reshardOnline asks the daemon serving dir to reshard it, and follows it.
func reshardOnline(dir, lay string, stdout io.Writer, show func(string)) int {
	status := func() string {
		buf := make([]byte, 4096)
		n, err := unix.Getxattr(dir, shardProgress, buf)
		if err != nil {
			return ""
		}
		return string(buf[:n])
	}
	if err := unix.Setxattr(dir, shardControl, []byte(lay), 0); err != nil {
		if st := status(); strings.HasPrefix(st, "failed: ") {
			return fail(errors.New("reshard: "+strings.TrimPrefix(st, "failed: ")), exitFailed)
		}
		if errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.ENOTSUP) {
			return fail(fmt.Errorf("reshard: %s is not in a mounted shard stack (or you are not root): %v", dir, err), exitFailed)
		}
		return fail(fmt.Errorf("reshard: %s: %v", dir, err), exitFailed)
	}
	last := ""
	for {
		st := status()
		switch {
		case strings.HasPrefix(st, "done: "):
			fmt.Fprintf(stdout, "%s: %s\n", dir, strings.TrimPrefix(st, "done: "))
			return exitOK
		case strings.HasPrefix(st, "failed: "):
			return fail(errors.New("reshard: "+strings.TrimPrefix(st, "failed: ")), exitFailed)
		case st == "":
			return fail(fmt.Errorf("reshard: %s: the daemon went away; mount again and run this again to resume", dir), exitFailed)
		}
		if st != last {
			show(st)
			last = st
		}
		time.Sleep(200 * time.Millisecond)
	}
}
