package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/codec"
)

func init() {
	register(&command{name: "convert", args: "[--to-plain] [-v] SPEC",
		summary: "convert the existing files under a stack's size-changing layers into their format (or back)",
		run:     func(a []string) int { return runConvert(a, os.Stdout, os.Stderr) }})
}

func runConvert(args []string, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("convert", flag.ContinueOnError)
	fl.SetOutput(stderr)
	toPlain := fl.Bool("to-plain", false, "the reverse: rewrite every file of the layer as its plain bytes")
	verbose := fl.Bool("v", false, "print every file converted, with its size before and after")
	passfile := fl.String("passfile", "", "the passphrase of every crypt layer, from the first line of this file")
	extpass := fl.String("extpass", "", "the passphrase of every crypt layer, from the first line of this command's output (sh -c)")
	fl.Usage = func() {
		fmt.Fprintf(fl.Output(), `Usage: cairn convert [--to-plain] [-v] SPEC

Rewrites, in place, every file under each size-changing layer (copy,
uuencode, gzip, zstd, lz4) of the stack SPEC that is not in the layer's
format yet: the files that were in the directory before the layer was
stacked over it. A mount serves such files as they are (plain), so
converting is optional: it saves the space. With --to-plain it does the
reverse, and gives back every file's exact bytes as plain files (to stop
using the layer, or to move to another codec: convert to plain, change the
spec, convert again).

Each file is converted on its own and atomically: its new form is written
beside it (as .cairn-convert-INODE, which the layer hides), with the old
file's owner, mode, times and extended attributes, made durable, then
renamed over the old file. A crash, a full disk or ^C leaves every file
either as it was or converted: run the same command again to go on (files
already converted are skipped; what an interrupted run left is removed).
A file with several hard links is skipped and reported (a rename would
split its links). Sparse files keep their holes.

It refuses a stack that is mounted: unmount it first. It shows its
progress on standard error (a bar on a terminal, a line every few seconds
elsewhere), and ends with a summary per layer: files converted, their
sizes before and after (of a sparse file, the space its blocks take), the
space saved.

Exit codes:
  0  every file is in the wanted form
  1  some files could not be converted or were skipped (see the lines)
  2  bad command line
  3  the spec is invalid
  5  the stack is in use (mounted, or being checked)
  7  wrong passphrase or key

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
	stack, code := buildOffline("convert", stderr, fl.Arg(0), *passfile, *extpass)
	if stack == nil {
		return code
	}
	defer stack.Close()
	var codecs []*codec.FS
	layer.Walk(stack.Top, func(l layer.FS) {
		if c, ok := l.(*codec.FS); ok {
			codecs = append(codecs, c)
		}
	})
	if len(codecs) == 0 {
		fmt.Fprintf(stderr, "cairn convert: %s has no size-changing layer (copy, uuencode, gzip, zstd, lz4): nothing to convert\n", fl.Arg(0))
		return exitFailed
	}
	// The top one first: its new files are written through the ones
	// below, which then find them in their format already.
	slices.Reverse(codecs)
	ctx := context.Background()
	if err := layer.ClaimStack(ctx, stack.Top); err != nil {
		fmt.Fprintf(stderr, "cairn convert: %s: %v\n", fl.Arg(0), err)
		if errors.Is(err, layer.ErrInUse) {
			return exitBusy
		}
		return exitFailed
	}
	bad := 0
	for _, c := range codecs {
		var bar *progress
		sum, err := c.Convert(ctx, *toPlain,
			func(files, total int, bytes, totalBytes int64, path string) {
				if bar == nil {
					bar = newProgress(stderr, "convert", "files", int64(total), totalBytes)
				}
				bar.update(int64(files), bytes, path)
			},
			func(r codec.ConvertReport) {
				switch {
				case r.Converted && *verbose:
					bar.clear()
					fmt.Fprintf(stdout, "%s: converted, %s -> %s\n", r.Path, sizeString(r.Before), sizeString(r.After))
				case r.Err != nil:
					bar.clear()
					fmt.Fprintf(stdout, "%s: not converted: %v\n", r.Path, r.Err)
				case !r.Converted:
					bar.clear()
					fmt.Fprintf(stdout, "%s: %s\n", r.Path, r.Msg)
				}
			})
		bar.done()
		if err != nil {
			return fail(fmt.Errorf("convert: %w", err), exitFailed)
		}
		fmt.Fprintln(stdout, convertLine(c.Codec(), *toPlain, sum))
		bad += sum.Failed + sum.Skipped
	}
	if bad > 0 {
		return exitFailed
	}
	return exitOK
}

// convertLine sums up the conversion of one layer.
func convertLine(name string, toPlain bool, s codec.ConvertSummary) string {
	to := "the " + name + " format"
	if toPlain {
		to = "plain files"
	}
	line := fmt.Sprintf("%s layer: %s converted to %s, %d already were", name, plural(s.Converted, "file"), to, s.Already)
	if s.Skipped > 0 {
		line += fmt.Sprintf(", %d skipped", s.Skipped)
	}
	if s.Failed > 0 {
		line += fmt.Sprintf(", %d failed", s.Failed)
	}
	if s.Leftovers > 0 {
		line += fmt.Sprintf(", %d left by an interrupted run removed", s.Leftovers)
	}
	line += fmt.Sprintf("; %s before, %s after", sizeString(s.Before), sizeString(s.After))
	switch {
	case s.After < s.Before:
		line += fmt.Sprintf(", %s saved (%.0f%%)", sizeString(s.Before-s.After), 100*float64(s.Before-s.After)/float64(s.Before))
	case s.After > s.Before:
		line += fmt.Sprintf(", %s more", sizeString(s.After-s.Before))
	}
	return line
}
