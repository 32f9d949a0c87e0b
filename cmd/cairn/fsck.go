package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/registry"
	"cairnfs.dev/cairn/spec"
)

// exitDropped: fsck --repair --force dropped data (kept in lost+found).
const exitDropped = 6

func init() {
	register(&command{name: "fsck", args: "[--repair [--force]] [-q] SPEC",
		summary: "check (and repair) the files of a stack's size-changing layers, and a union's index",
		run:     func(a []string) int { return runFsck(a, os.Stdout, os.Stderr) }})
}

func runFsck(args []string, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("fsck", flag.ContinueOnError)
	fl.SetOutput(stderr)
	repair := fl.Bool("repair", false, "rebuild indexes and headers that are missing, stale or wrong (never drops data)")
	force := fl.Bool("force", false, "with --repair: also drop data that cannot be read back, keeping a copy of each file in lost+found")
	quiet := fl.Bool("q", false, "report only files with problems")
	passfile := fl.String("passfile", "", "the passphrase of every crypt layer, from the first line of this file (default: the layer's passfile or extpass, else standard input or the terminal)")
	extpass := fl.String("extpass", "", "the passphrase of every crypt layer, from the first line of this command's output (sh -c)")
	fl.Usage = func() {
		fmt.Fprintf(fl.Output(), `Usage: cairn fsck [--repair [--force]] [-q] SPEC

Checks every file under each size-changing layer (copy, uuencode, gzip, zstd,
lz4) of the stack SPEC: the header and index of each file against a scan of
its records, and every chunk's data. A file the layer did not write (one
that was in the directory before, served as it is) is reported as "plain
(not yet converted)", which is no problem: 'cairn convert' converts them.
It refuses a stack that is mounted (or being checked): unmount it first.

With --repair it rebuilds the indexes and headers that are missing, stale or
wrong, which changes no byte of any file, and prints per file what it
changed. It drops no data: chunks whose data is damaged stay as they are
(reading them gives EIO), and a file with lost records (destroyed headers:
which bytes they changed is unknown) stays unserved; fsck says what a
forced repair would drop. With --repair --force it drops those: a copy of
the file's lower file is kept first in lost+found at the root of the
layer's lower directory (fsck skips that directory), then damaged chunks,
and in a file with lost records every chunk written before the first lost
one (a lost truncation must not bring removed bytes back), become zeros; it
prints each chunk dropped and the bytes lost.

Of a union it checks the index of hard-linked copies (.cairn-union-index on
each RW branch): an entry that no name reaches any more (neither a name of
the copy nor a name of the original the union still shows) is reported, and
removed with --repair, which frees the copy's blocks.

Of a pack layer it reads back every packed file's bytes from its directory's
pack and checks their CRC (a damaged one is reported and stays: reading it
gives EIO; --repair --force empties the file, keeping what is left of its
bytes in lost+found), reports a file whose pack or unpack a crash cut
(--repair finishes it, as an open would) and a pack no file refers to
(--repair removes it: it holds no file's bytes); see docs/pack.md.

Exit codes:
  0  every file is consistent (after --repair: repaired without losing data)
  1  problems or damage remain (or a repair was refused: see --force)
  2  bad command line
  3  the spec is invalid
  5  the stack is in use (mounted, or being checked)
  6  --repair --force dropped data (every file dropped is kept in lost+found)
  7  wrong passphrase or key

Flags:
`)
		fl.PrintDefaults()
	}
	if code, ok := parseArgs(fl, args); !ok {
		return code
	}
	if fl.NArg() != 1 || (*force && !*repair) {
		fl.Usage()
		return exitUsage
	}
	mode := layer.CheckOnly
	if *repair {
		mode = layer.Repair
		if *force {
			mode = layer.RepairForce
		}
	}
	stack, code := buildOffline("fsck", stderr, fl.Arg(0), *passfile, *extpass)
	if stack == nil {
		return code
	}
	defer stack.Close()
	checkers := layer.Checkers(stack.Top)
	if len(checkers) == 0 {
		fmt.Fprintf(stdout, "%s: no layer in this stack keeps state of its own in the lower: nothing to check\n", fl.Arg(0))
		return exitOK
	}
	ctx := context.Background()
	// A mounted daemon holds the same lock: its engine keeps files' state
	// in memory, and checking (let alone repairing) under it would report
	// or make damage.
	if err := layer.ClaimStack(ctx, stack.Top); err != nil {
		fmt.Fprintf(stderr, "cairn fsck: %s: %v\n", fl.Arg(0), err)
		if errors.Is(err, layer.ErrInUse) {
			return exitBusy
		}
		return exitFailed
	}
	bad := 0
	var lost []string
	for _, c := range checkers {
		var bar *progress
		sum, err := c.Fsck(ctx, mode,
			func(i, n int, p string) {
				if bar == nil {
					bar = newProgress(stderr, "fsck", "files", int64(n), 0)
				}
				bar.update(int64(i), 0, p)
			},
			func(r layer.FileReport) {
				if r.Err != nil {
					bar.clear()
					fmt.Fprintf(stdout, "%s: cannot check: %v\n", r.Path, r.Err)
					return
				}
				if !*quiet || !r.OK || r.Repaired {
					bar.clear()
					fmt.Fprintln(stdout, r.Text)
				}
			})
		if bar != nil {
			bar.done()
		}
		if err != nil {
			return fail(fmt.Errorf("fsck: %w", err), exitFailed)
		}
		bad += sum.Bad
		if sum.Dropped {
			lost = append(lost, sum.LostFound)
		}
		fmt.Fprintln(stdout, sum.Line)
	}
	if bad > 0 {
		return exitFailed
	}
	if len(lost) > 0 {
		fmt.Fprintf(stdout, "data was dropped (each file's report says what): the files as they were are in %s\n", strings.Join(slices.Compact(lost), ", "))
		return exitDropped
	}
	return exitOK
}

// buildOffline builds the stack of the spec at arg for a command that
// works on it without mounting it (fsck, convert): the secret flags in
// place of the spec's, passphrases asked for as mount asks for them (on
// the terminal, or read from standard input when it is not one). On
// failure it says why on stderr and returns the exit code.
func buildOffline(cmd string, stderr io.Writer, arg, passfile, extpass string) (*spec.Stack, int) {
	s, err := loadSpec(arg)
	if err != nil {
		return nil, specFailed(stderr, arg, err)
	}
	if err := useSecretFlags(s, passfile, extpass); err != nil {
		fmt.Fprintf(stderr, "cairn %s: %v\n", cmd, err)
		return nil, exitUsage
	}
	secrets, err := layerSecrets(s)
	if err != nil {
		fmt.Fprintf(stderr, "cairn %s: %v\n", cmd, err)
		return nil, exitFailed
	}
	for name, b := range secrets {
		s.Layers[name].Values[registry.SecretKey] = b
	}
	stack, err := s.Build()
	if err != nil {
		return nil, specFailed(stderr, arg, err)
	}
	return stack, exitOK
}
