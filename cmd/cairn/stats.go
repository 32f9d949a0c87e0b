package main

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sync"

	"cairnfs.dev/cairn/fusefs"
)

// statsWriter writes the daemon's request counts (-stats FILE) on SIGUSR1
// and at unmount: what a benchmark reads to count the requests of a
// workload (the difference of two writes), with no debug log.
type statsWriter struct {
	path string
	srv  *fusefs.Server
	mu   sync.Mutex
	seq  int
}

// statsFile is the file's content.
type statsFile struct {
	Seq      int               `json:"seq"`
	Total    uint64            `json:"total"`
	Requests map[string]uint64 `json:"requests"`
}

func (w *statsWriter) write(logger *slog.Logger, log bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	counts := w.srv.RequestCounts()
	var total uint64
	for _, n := range counts {
		total += n
	}
	if log {
		attrs := []any{"total", total}
		for k, n := range counts {
			attrs = append(attrs, k, n)
		}
		logger.Info("requests served", attrs...)
	}
	if w.path == "" {
		return
	}
	w.seq++
	b, _ := json.Marshal(statsFile{Seq: w.seq, Total: total, Requests: counts})
	// Written beside it and renamed over it: a reader never sees half.
	tmp := filepath.Join(filepath.Dir(w.path), "."+filepath.Base(w.path)+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		logger.Warn("the request counts could not be written", "file", w.path, "err", err)
		return
	}
	if err := os.Rename(tmp, w.path); err != nil {
		logger.Warn("the request counts could not be written", "file", w.path, "err", err)
	}
}

// startProfile writes a CPU profile of the daemon from the mount to the
// unmount into the file $CAIRN_CPUPROFILE, if set (for developers: go tool
// pprof; docs/DEVELOPING.md). It returns what stops it.
func startProfile(logger *slog.Logger) func() {
	path := os.Getenv("CAIRN_CPUPROFILE")
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err == nil {
		err = pprof.StartCPUProfile(f)
	}
	if err != nil {
		logger.Warn("no CPU profile", "file", path, "err", err)
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}
