package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/term"
)

// progress shows how far a long piece of work went (fsck, convert, resync,
// reshard), on standard error. On a terminal it draws a bar with the count
// done of the total, the rate, and what is being worked on, redrawn at most
// every tickTTY; elsewhere (a log, a pipe) it writes a plain line every
// tickLine at most, none for work shorter than that.
type progress struct {
	w          io.Writer
	what, unit string // "fsck", "files"
	total      int64
	totalBytes int64 // 0: no byte counts
	tty        bool
	shown      bool
	width      int // of the bar drawn
	start      time.Time
	last       time.Time // of the last bar or line
}

const (
	tickTTY  = 50 * time.Millisecond
	tickLine = 5 * time.Second
	barWidth = 30
)

// newProgress starts showing work on total items of unit (and totalBytes
// bytes, if not 0).
func newProgress(w io.Writer, what, unit string, total, totalBytes int64) *progress {
	p := &progress{w: w, what: what, unit: unit, total: total, totalBytes: totalBytes, start: time.Now()}
	if f, ok := w.(*os.File); ok {
		p.tty = term.IsTerminal(int(f.Fd()))
	}
	p.last = p.start
	return p
}

// update says done items (and bytes) are done, and what is worked on now.
func (p *progress) update(done, bytes int64, name string) {
	if p == nil {
		return
	}
	now := time.Now()
	secs := now.Sub(p.start).Seconds()
	rate := ""
	if secs >= 0.1 {
		if p.totalBytes > 0 {
			rate = sizeString(int64(float64(bytes)/secs)) + "/s"
		} else {
			rate = fmt.Sprintf("%.0f/s", float64(done)/secs)
		}
	}
	count := fmt.Sprintf("%d/%d", done, p.total)
	if p.totalBytes > 0 {
		count += fmt.Sprintf(" %s, %s/%s", p.unit, sizeString(bytes), sizeString(p.totalBytes))
	}
	if !p.tty {
		if now.Sub(p.last) < tickLine {
			return
		}
		p.last = now
		line := fmt.Sprintf("cairn %s: %s", p.what, count)
		if p.totalBytes == 0 {
			line += " " + p.unit
		}
		if rate != "" {
			line += ", " + rate
		}
		if name != "" {
			line += ": " + name
		}
		fmt.Fprintln(p.w, line)
		return
	}
	// The first and the last item are always drawn.
	if p.shown && done < p.total-1 && now.Sub(p.last) < tickTTY {
		return
	}
	p.last = now
	fill := 0
	if p.total > 0 {
		fill = int(barWidth * done / p.total)
	}
	if p.totalBytes > 0 {
		fill = int(barWidth * bytes / p.totalBytes)
	}
	fill = min(max(fill, 0), barWidth)
	if len(name) > 40 {
		name = "..." + name[len(name)-37:]
	}
	bar := fmt.Sprintf("[%s%s] %s %8s %-40s", strings.Repeat("=", fill), strings.Repeat(" ", barWidth-fill), count, rate, name)
	fmt.Fprint(p.w, "\r"+bar)
	p.shown, p.width = true, max(p.width, len(bar))
}

// clear takes the bar away (before a line of output, and at the end).
func (p *progress) clear() {
	if p != nil && p.shown {
		fmt.Fprintf(p.w, "\r%s\r", strings.Repeat(" ", max(100, p.width)))
		p.shown = false
	}
}

func (p *progress) done() { p.clear() }

// sizeString says n bytes in binary units.
func sizeString(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	f, u := float64(n), 0
	for f >= unit && u < 5 {
		f /= unit
		u++
	}
	return fmt.Sprintf("%.1f %ciB", f, "KMGTPE"[u-1])
}
