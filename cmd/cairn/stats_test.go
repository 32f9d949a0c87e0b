package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"cairnfs.dev/cairn/internal/mounttest"
)

// readStats sends SIGUSR1 to the daemon and returns the counts it writes.
func readStats(t *testing.T, pid int, path string, seq int) statsFile {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var s statsFile
		if b, err := os.ReadFile(path); err == nil && json.Unmarshal(b, &s) == nil && s.Seq == seq {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("no request counts with seq %d in %s", seq, path)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRequestCounts: -stats writes the daemon's own request counts on
// SIGUSR1; they count each kernel request once. With -attr-timeout 0 (no
// caching, as "0s" in a spec) every fstat is one GETATTR; with the default
// timeouts of a stack that is the only user of its lower, none is.
func TestRequestCounts(t *testing.T) {
	mounttest.Need(t)
	for _, tc := range []struct {
		flags    []string
		getattrs func(n uint64) bool
	}{
		{[]string{"-attr-timeout", "0"}, func(n uint64) bool { return n >= 200 && n <= 210 }},
		{nil, func(n uint64) bool { return n <= 2 }},
	} {
		lower, mnt := t.TempDir(), t.TempDir()
		logf := filepath.Join(t.TempDir(), "log.json")
		statsf := filepath.Join(t.TempDir(), "stats.json")
		os.WriteFile(filepath.Join(lower, "f"), []byte("x"), 0o644)
		args := append([]string{"mount", "--log-file", logf, "-stats", statsf}, tc.flags...)
		if out, code := cairn(t, append(args, "null:"+lower, mnt)...); code != 0 {
			t.Fatalf("mount %v: exit %d: %s", tc.flags, code, out)
		}
		t.Cleanup(func() { cairn(t, "umount", mnt) })
		pid := daemonPid(t, logf)
		f, err := os.Open(filepath.Join(mnt, "f"))
		if err != nil {
			t.Fatal(err)
		}
		before := readStats(t, pid, statsf, 1)
		for range 200 {
			if _, err := f.Stat(); err != nil {
				t.Fatal(err)
			}
		}
		after := readStats(t, pid, statsf, 2)
		f.Close()
		if d := after.Requests["GETATTR"] - before.Requests["GETATTR"]; !tc.getattrs(d) {
			t.Errorf("mount %v: 200 fstats made %d GETATTR requests (counts before %v, after %v)", tc.flags, d, before.Requests, after.Requests)
		}
		if after.Total < before.Total || before.Requests["INIT"] != 1 {
			t.Errorf("counts: before %+v, after %+v", before, after)
		}
		if out, code := cairn(t, "umount", mnt); code != 0 {
			t.Fatalf("umount: %s", out)
		}
		// And once more at the unmount.
		deadline := time.Now().Add(10 * time.Second)
		for {
			var s statsFile
			b, _ := os.ReadFile(statsf)
			if json.Unmarshal(b, &s) == nil && s.Seq == 3 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no counts written at the unmount: %s", b)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
