package snoop

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"log/syslog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// batchEvery is how long records gather in the queue between two writes
// of the log: a record reaches the file at most this late.
const batchEvery = 20 * time.Millisecond

// writer writes records from a bounded queue. put never waits: when the
// queue is full the record is dropped and counted, and the count goes to
// the log as a "dropped" record before the next one written.
type writer struct {
	q       chan Record
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

func newWriter(output, path, syslogAddr string, queue int) (*writer, error) {
	w := &writer{q: make(chan Record, queue), reopenc: make(chan chan error),
		quit: make(chan struct{}), done: make(chan struct{}), path: path}
	switch output {
	case "", "file":
		if path == "" {
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
		if syslogAddr == "" {
			s, err = syslog.New(syslog.LOG_INFO|syslog.LOG_DAEMON, "cairn-snoop")
		} else {
			s, err = syslog.Dial("unixgram", syslogAddr, syslog.LOG_INFO|syslog.LOG_DAEMON, "cairn-snoop")
		}
		if err != nil {
			return nil, fmt.Errorf("cannot reach syslog: %w", err)
		}
		w.sys = s
	default:
		return nil, fmt.Errorf("output must be file, stdout or syslog, found %q", output)
	}
	go w.run()
	return w, nil
}

func (w *writer) open() error {
	f, err := os.OpenFile(w.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return fmt.Errorf("cannot open the log: %w", err)
	}
	w.file, w.buf = f, bufio.NewWriterSize(f, 64<<10)
	return nil
}

func (w *writer) put(r Record) {
	select {
	case w.q <- r:
	default:
		w.dropped.Add(1)
		w.total.Add(1)
	}
}

func (w *writer) run() {
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
func (w *writer) drain() {
	for n := len(w.q); n > 0; n-- {
		w.write(<-w.q)
	}
	w.write(Record{}) // reports drops, if any
	w.flush()
}

// write writes r, after a "dropped" record if records were dropped. A zero
// r writes only that.
func (w *writer) write(r Record) {
	if n := w.dropped.Swap(0); n > 0 {
		w.line(Record{Time: time.Now(), Op: "dropped", Result: "ok", Count: n})
	}
	if r.Op != "" {
		w.line(r)
	}
}

func (w *writer) line(r Record) {
	b, _ := json.Marshal(&r)
	w.pending++
	if w.sys != nil {
		w.check(w.sys.Info(string(b)))
		return
	}
	if _, err := w.buf.Write(append(b, '\n')); err != nil {
		w.check(err)
	}
}

func (w *writer) flush() {
	if w.buf != nil {
		w.check(w.buf.Flush())
	}
}

// check settles the records written since the last check: on a failure
// they are counted as dropped, and the first failure of a run is logged.
func (w *writer) check(err error) {
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
		slog.Error("snoop: cannot write the log; records are dropped (and counted) until it works again", "log", w.path, "err", err)
	}
	if w.buf != nil {
		w.buf.Reset(w.out())
	}
}

func (w *writer) out() io.Writer {
	if w.file != nil {
		return w.file
	}
	return os.Stdout
}

func (w *writer) doReopen() error {
	if w.file == nil {
		return nil
	}
	w.flush()
	old := w.file
	if err := w.open(); err != nil {
		slog.Error("snoop: cannot reopen the log; writing on to the old file", "log", w.path, "err", err)
		return err
	}
	old.Close()
	return nil
}

func (w *writer) reopen() error {
	reply := make(chan error)
	select {
	case w.reopenc <- reply:
		return <-reply
	case <-w.done:
		return nil
	}
}

func (w *writer) close() error {
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
