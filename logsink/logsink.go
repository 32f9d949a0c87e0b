// Package logsink writes records as JSON lines, to a file, to standard
// output or to syslog, from a bounded queue: a layer that logs (snoop's
// operations, acl's denials) puts a record and never waits. When the queue
// is full, or the log cannot be written, records are dropped and counted,
// and the count goes to the log as a record of its own before the next one.
// The file is reopened on Reopen (log rotation, SIGHUP).
package logsink

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"log/syslog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// batchEvery is how long records gather in the queue between two writes
// of the log: a record reaches the file at most this late.
const batchEvery = 20 * time.Millisecond

// Options say where a Sink writes.
type Options struct {
	// Output is "file" (Path), "stdout" or "syslog".
	Output string
	Path   string
	// SyslogSocket is the unix datagram socket of syslog (default: the
	// system's, /dev/log); tests point it at a socket of their own.
	SyslogSocket string
	// Tag is the syslog tag and the prefix of the sink's own messages
	// ("cairn-snoop").
	Tag string
	// Queue is how many records may wait (default 8192).
	Queue int
	// Dropped makes the record that reports n dropped records.
	Dropped func(n int64) any
}

// Sink writes records from a bounded queue. Put never waits: when the
// queue is full the record is dropped and counted, and the count goes to
// the log as a Dropped record before the next one written.
type Sink struct {
	o       Options
	q       chan any
	dropped atomic.Int64 // not yet reported
	total   atomic.Int64 // ever
	reopenc chan chan error
	quit    chan struct{}
	done    chan struct{}
	once    sync.Once

	// owned by the writer goroutine
	path    string
	file    *os.File
	buf     *bufio.Writer
	sys     *syslog.Writer
	pending int  // records written since the last successful flush
	failed  bool // the last write failed (logged once)
}

// CheckPath refuses a log file that cannot be written: its directory must
// exist and be writable (the file is created at mount).
func CheckPath(v any) error {
	p, _ := v.(string)
	if fi, err := os.Stat(p); err == nil {
		if fi.IsDir() {
			return fmt.Errorf("%s is a directory; name a file in it", p)
		}
		if unix.Access(p, unix.W_OK) != nil {
			return fmt.Errorf("%s cannot be written (check its permissions)", p)
		}
		return nil
	}
	dir := filepath.Dir(p)
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return fmt.Errorf("directory %s does not exist (create it first: mkdir -p %s)", dir, dir)
	}
	if unix.Access(dir, unix.W_OK) != nil {
		return fmt.Errorf("%s cannot be created: directory %s is not writable", p, dir)
	}
	return nil
}

// New opens the log and starts its writer.
func New(o Options) (*Sink, error) {
	if o.Queue <= 0 {
		o.Queue = 8192
	}
	w := &Sink{o: o, q: make(chan any, o.Queue), reopenc: make(chan chan error),
		quit: make(chan struct{}), done: make(chan struct{}), path: o.Path}
	switch o.Output {
	case "", "file":
		if o.Path == "" {
			return nil, fmt.Errorf("log = \"FILE\" is needed (or output = \"stdout\" or \"syslog\")")
		}
		if err := w.open(); err != nil {
			return nil, err
		}
	case "stdout":
		w.buf = bufio.NewWriterSize(os.Stdout, 64<<10)
	case "syslog":
		var s *syslog.Writer
		var err error
		if o.SyslogSocket == "" {
			s, err = syslog.New(syslog.LOG_INFO|syslog.LOG_DAEMON, o.Tag)
		} else {
			s, err = syslog.Dial("unixgram", o.SyslogSocket, syslog.LOG_INFO|syslog.LOG_DAEMON, o.Tag)
		}
		if err != nil {
			return nil, fmt.Errorf("cannot reach syslog: %w", err)
		}
		w.sys = s
	default:
		return nil, fmt.Errorf("output must be file, stdout or syslog, found %q", o.Output)
	}
	go w.run()
	return w, nil
}

func (w *Sink) open() error {
	f, err := os.OpenFile(w.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return fmt.Errorf("cannot open the log: %w", err)
	}
	w.file, w.buf = f, bufio.NewWriterSize(f, 64<<10)
	return nil
}

// Put queues r, or drops and counts it when the queue is full.
func (w *Sink) Put(r any) {
	select {
	case w.q <- r:
	default:
		w.dropped.Add(1)
		w.total.Add(1)
	}
}

func (w *Sink) run() {
	defer close(w.done)
	for {
		select {
		case r := <-w.q:
			// Write what has gathered, then let the next records gather
			// for a while: one write(2) and one wake-up per batch, not
			// per record.
			w.write(r)
			w.drain()
			time.Sleep(batchEvery)
		case reply := <-w.reopenc:
			// What was queued before the signal goes to the old file.
			w.drain()
			reply <- w.doReopen()
		case <-w.quit:
			w.drain()
			return
		}
	}
}

// drain writes the records queued now, reports drops and flushes.
func (w *Sink) drain() {
	for n := len(w.q); n > 0; n-- {
		w.write(<-w.q)
	}
	w.write(nil) // reports drops, if any
	w.flush()
}

// write writes r, after a Dropped record if records were dropped. A nil r
// writes only that.
func (w *Sink) write(r any) {
	if n := w.dropped.Swap(0); n > 0 && w.o.Dropped != nil {
		w.line(w.o.Dropped(n))
	}
	if r != nil {
		w.line(r)
	}
}

func (w *Sink) line(r any) {
	b, _ := json.Marshal(r)
	w.pending++
	if w.sys != nil {
		w.check(w.sys.Info(string(b)))
		return
	}
	if _, err := w.buf.Write(append(b, '\n')); err != nil {
		w.check(err)
	}
}

func (w *Sink) flush() {
	if w.buf != nil {
		w.check(w.buf.Flush())
	}
}

// check settles the records written since the last check: on a failure
// they are counted as dropped, and the first failure of a run is logged.
func (w *Sink) check(err error) {
	if err == nil {
		w.pending, w.failed = 0, false
		return
	}
	n := int64(w.pending)
	w.pending = 0
	w.dropped.Add(n)
	w.total.Add(n)
	if !w.failed {
		w.failed = true
		slog.Error(w.o.Tag+": cannot write the log; records are dropped (and counted) until it works again", "log", w.path, "err", err)
	}
	if w.buf != nil {
		w.buf.Reset(w.out())
	}
}

func (w *Sink) out() io.Writer {
	if w.file != nil {
		return w.file
	}
	return os.Stdout
}

func (w *Sink) doReopen() error {
	if w.file == nil {
		return nil
	}
	w.flush()
	old := w.file
	if err := w.open(); err != nil {
		slog.Error(w.o.Tag+": cannot reopen the log; writing on to the old file", "log", w.path, "err", err)
		return err
	}
	old.Close()
	return nil
}

// Reopen writes what is queued to the old file and opens the log file
// again (after rotation); other outputs have nothing to reopen.
func (w *Sink) Reopen() error {
	reply := make(chan error)
	select {
	case w.reopenc <- reply:
		return <-reply
	case <-w.done:
		return nil
	}
}

// Close writes what is queued and closes the log.
func (w *Sink) Close() error {
	w.once.Do(func() { close(w.quit) })
	<-w.done
	var err error
	if w.file != nil {
		err = w.file.Close()
	}
	if w.sys != nil {
		w.sys.Close()
	}
	return err
}

// Dropped is the number of records dropped so far.
func (w *Sink) Dropped() int64 { return w.total.Load() }
