package snoop_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/fsx"
	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/local"
	"cairnfs.dev/cairn/layers/snoop"
)

func stack(t *testing.T, o snoop.Options) (lower string, fs *snoop.FS) {
	t.Helper()
	lower = t.TempDir()
	l, err := local.New(lower)
	if err != nil {
		t.Fatal(err)
	}
	if o.Log == "" && o.Output == "" {
		o.Log = filepath.Join(t.TempDir(), "snoop.jsonl")
	}
	fs, err = snoop.New(l, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { layer.CloseStack(fs) })
	return lower, fs
}

func records(t *testing.T, path string) []snoop.Record {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []snoop.Record
	s := bufio.NewScanner(f)
	for s.Scan() {
		var r snoop.Record
		if err := json.Unmarshal(s.Bytes(), &r); err != nil {
			t.Fatalf("log line %q: %v", s.Text(), err)
		}
		out = append(out, r)
	}
	return out
}

// TestRecordFormat checks the JSON line of an operation, field by field.
func TestRecordFormat(t *testing.T) {
	log := filepath.Join(t.TempDir(), "log.jsonl")
	_, fs := stack(t, snoop.Options{Log: log})
	ctx := context.Background()
	before := time.Now()
	if err := layer.WriteFile(ctx, fs, "f", []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := fs.Getattr(ctx, "missing"); err != syscall.ENOENT {
		t.Fatalf("getattr missing: %v", err)
	}
	if err := fs.Rename(ctx, "f", "g", 0); err != nil {
		t.Fatal(err)
	}
	fs.Close()
	raw, _ := os.ReadFile(log)
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	var ops []string
	for _, r := range records(t, log) {
		ops = append(ops, r.Op)
	}
	if got := strings.Join(ops, " "); got != "create write flush release getattr rename" {
		t.Fatalf("ops logged: %s\n%s", got, raw)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(lines[1]), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"time", "op", "path", "uid", "gid", "pid", "comm", "result", "bytes", "latency_ns"} {
		if _, ok := m[k]; !ok {
			t.Errorf("write record has no %q: %s", k, lines[1])
		}
	}
	rs := records(t, log)
	w := rs[1]
	if w.Op != "write" || w.Path != "f" || w.Bytes != 5 || w.Result != "ok" || w.Pid != uint32(os.Getpid()) ||
		w.Uid != uint32(os.Getuid()) || w.Time.Before(before.Add(-time.Second)) || w.Latency <= 0 {
		t.Errorf("write record: %+v", w)
	}
	if exe, _ := os.Readlink("/proc/self/exe"); !strings.HasPrefix(filepath.Base(exe), w.Comm) || w.Comm == "" {
		t.Errorf("comm %q, executable %s", w.Comm, exe)
	}
	if g := rs[4]; g.Op != "getattr" || g.Path != "missing" || g.Result != "ENOENT" {
		t.Errorf("getattr record: %+v", g)
	}
	if r := rs[5]; r.Path != "f" || r.Path2 != "g" {
		t.Errorf("rename record: %+v", r)
	}
}

func TestFilters(t *testing.T) {
	log := filepath.Join(t.TempDir(), "log.jsonl")
	_, fs := stack(t, snoop.Options{Log: log, Ops: []string{"mkdir", "rename"}, Paths: []string{"keep/"}})
	ctx := context.Background()
	for _, d := range []string{"keep", "skip", "keep/a", "skip/a"} {
		if _, err := fs.Mkdir(ctx, d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	fs.Rename(ctx, "skip/a", "keep/b", 0) // either path matches
	fs.Rename(ctx, "skip", "skip2", 0)
	fs.Getattr(ctx, "keep")
	fs.Close()
	var got []string
	for _, r := range records(t, log) {
		got = append(got, r.Op+":"+r.Path)
	}
	if s := strings.Join(got, " "); s != "mkdir:keep mkdir:keep/a rename:skip/a" {
		t.Fatalf("logged %s", s)
	}

	// classes: the deletes and the renames, whatever their operation.
	log3 := filepath.Join(t.TempDir(), "log.jsonl")
	_, fs3 := stack(t, snoop.Options{Log: log3, Classes: []string{"delete"}})
	fs3.Mkdir(ctx, "d", 0o755)
	fs3.Mkdir(ctx, "e", 0o755)
	fs3.Rename(ctx, "d", "d2", 0)
	fs3.Rmdir(ctx, "e")
	fs3.Getattr(ctx, "d2")
	fs3.Close()
	got = nil
	for _, r := range records(t, log3) {
		got = append(got, r.Op+":"+r.Path)
	}
	if s := strings.Join(got, " "); s != "rename:d rmdir:e" {
		t.Fatalf("class delete logged %s", s)
	}

	// uids: this process is root in the tests that act as users; filter
	// it out by name and number.
	log2 := filepath.Join(t.TempDir(), "log.jsonl")
	_, fs2 := stack(t, snoop.Options{Log: log2, Uids: []string{"12345"}})
	fs2.Getattr(ctx, "")
	fs2.Close()
	if rs := records(t, log2); len(rs) != 0 {
		t.Fatalf("uid filter let through %+v", rs)
	}
	for _, bad := range []snoop.Options{{Log: log, Ops: []string{"frobnicate"}}, {Log: log, Paths: []string{"a/**b"}},
		{Log: log, Uids: []string{"no-such-user-here"}}, {Log: log, Classes: []string{"chmod"}}, {Output: "file"}, {Output: "carrier-pigeon"}} {
		if _, err := snoop.New(layer.FS(nil), bad); err == nil {
			t.Errorf("options %+v accepted", bad)
		} else {
			t.Logf("%+v: %v", bad, err)
		}
	}
}

// TestDropsAreCounted blocks the log (a FIFO nobody reads) while operations
// go on: they must not wait, and every record is either in the log or
// counted in a "dropped" record.
func TestDropsAreCounted(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// Hold the read end open without reading: the pipe fills, the writer
	// blocks, the queue fills.
	r, err := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	_, fs := stack(t, snoop.Options{Log: fifo, Queue: 16})
	ctx := context.Background()
	const n = 5000
	for i := 0; i < n; i++ {
		fs.Getattr(ctx, "")
	}
	if fs.Dropped() == 0 {
		t.Fatal("nothing dropped although the log is blocked")
	}
	// Now read everything; Close writes the rest and the drop count.
	var wg sync.WaitGroup
	var logged, dropped int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		syscall.SetNonblock(int(r.Fd()), false)
		s := bufio.NewScanner(r)
		for s.Scan() {
			var rec snoop.Record
			if err := json.Unmarshal(s.Bytes(), &rec); err != nil {
				t.Errorf("bad line %q", s.Text())
				return
			}
			switch rec.Op {
			case "getattr":
				logged++
			case "dropped":
				dropped += rec.Count
			}
		}
	}()
	if err := fs.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if logged+dropped != n || dropped != fs.Dropped() {
		t.Fatalf("%d operations: %d logged + %d reported dropped (counter %d)", n, logged, dropped, fs.Dropped())
	}
	t.Logf("%d logged, %d dropped and counted", logged, dropped)
}

// TestUsersThroughMount runs commands as other users through a real mount
// and checks what the log says about them.
func TestUsersThroughMount(t *testing.T) {
	mounttest.NeedRoot(t)
	log := filepath.Join(t.TempDir(), "log.jsonl")
	lower, fs := stack(t, snoop.Options{Log: log})
	os.Chmod(lower, 0o777)
	m := mounttest.Mount(t, fs)
	alice := mounttest.User{Uid: 1001, Gid: 1001}
	bob := mounttest.User{Uid: 1002, Gid: 1002, Groups: []uint32{1001}}
	if out, err := alice.Sh(t, m.Dir, "echo hello > a && mkdir d && mv a d/b"); err != nil {
		t.Fatalf("alice: %v: %s", err, out)
	}
	if out, err := bob.Sh(t, m.Dir, "cat d/b"); err != nil || out != "hello\n" {
		t.Fatalf("bob: %q, %v", out, err)
	}
	if out, err := bob.Sh(t, m.Dir, "rm -f d/b"); err == nil {
		t.Fatalf("bob removed alice's file: %s", out)
	}
	if b, err := os.ReadFile(filepath.Join(lower, "d/b")); err != nil || string(b) != "hello\n" {
		t.Fatalf("lower d/b: %q, %v", b, err)
	}
	m.Unmount()
	fs.Close()
	want := map[string]bool{
		"1001 sh create a ok":   false,
		"1001 mkdir mkdir d ok": false,
		"1001 mv rename a ok":   false,
		"1002 cat open d/b ok":  false,
	}
	for _, r := range records(t, log) {
		k := strings.Join([]string{itoa(r.Uid), r.Comm, r.Op, r.Path, r.Result}, " ")
		if _, ok := want[k]; ok {
			want[k] = true
		}
		if r.Op == "rename" && r.Path2 != "d/b" {
			t.Errorf("rename to %q", r.Path2)
		}
		if r.Uid == 1002 && r.Gid != 1002 {
			t.Errorf("bob's record has gid %d", r.Gid)
		}
	}
	for k, seen := range want {
		if !seen {
			t.Errorf("no record %q", k)
		}
	}
}

func itoa(n uint32) string { return strconv.FormatUint(uint64(n), 10) }

// TestIOLogsEveryRead: with io = true, passthrough is refused and every
// read and write is logged: as many records, with as many bytes, as reached
// the layer below snoop; fsx checks that the data path is intact.
func TestIOLogsEveryRead(t *testing.T) {
	log := filepath.Join(t.TempDir(), "log.jsonl")
	l, err := local.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := mounttest.CountIO(l) // what passes through snoop to the lower layer
	fs, err := snoop.New(c, snoop.Options{Log: log, IO: true, Queue: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer layer.CloseStack(fs)
	m := mounttest.Mount(t, fs)
	if err := os.WriteFile(m.Path("f"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(m.Path("f")); err != nil || string(b) != "data" {
		t.Fatalf("read %q, %v", b, err)
	}
	fsx.Run(t, fsx.Config{Dir: m.Dir, Ops: 3000})
	m.Unmount()
	fs.Close()
	var reads, writes int
	var readBytes, wrotBytes int64
	for _, r := range records(t, log) {
		switch r.Op {
		case "read":
			reads++
			readBytes += r.Bytes
		case "write":
			writes++
			wrotBytes += r.Bytes
		case "dropped":
			t.Fatalf("%d records dropped", r.Count)
		}
	}
	cr, cw := int(c.Reads.Load()), int(c.Writes.Load())
	if cr < 100 || cw < 100 {
		t.Fatalf("only %d reads and %d writes reached the lower layer", cr, cw)
	}
	if reads != cr || writes != cw || readBytes != c.ReadBytes.Load() || wrotBytes != c.WriteBytes.Load() {
		t.Fatalf("logged %d reads (%d bytes) and %d writes (%d bytes); the lower layer got %d reads (%d bytes) and %d writes (%d bytes)",
			reads, readBytes, writes, wrotBytes, cr, c.ReadBytes.Load(), cw, c.WriteBytes.Load())
	}
}

// TestPassthroughKept: without io, snoop leaves passthrough on and logs
// open and release of the files, and their flushes (snoop keeps the
// kernel sending them: layer.Hooked.Flushes).
func TestPassthroughKept(t *testing.T) {
	log := filepath.Join(t.TempDir(), "log.jsonl")
	_, fs := stack(t, snoop.Options{Log: log})
	m := mounttest.Mount(t, fs)
	if !m.Server.Passthrough {
		t.Fatal("snoop turned passthrough off")
	}
	os.WriteFile(m.Path("f"), []byte("data"), 0o644)
	os.ReadFile(m.Path("f"))
	m.Unmount()
	fs.Close()
	ops := map[string]int{}
	for _, r := range records(t, log) {
		ops[r.Op]++
	}
	if ops["create"] != 1 || ops["open"] != 1 || ops["flush"] != 2 || ops["release"] == 0 || ops["read"] != 0 {
		t.Fatalf("ops: %v", ops)
	}
}

// TestSIGHUPReopens mounts with the cairn command, rotates the log and
// sends SIGHUP: records go to a new file.
func TestSIGHUPReopens(t *testing.T) {
	lower := t.TempDir()
	dir := t.TempDir()
	log := filepath.Join(dir, "snoop.jsonl")
	p := mounttest.MountSpec(t, `mount = "snoop"
[layer.snoop]
type = "snoop"
over = "base"
log = "`+log+`"
ops = ["mkdir"]
[layer.base]
type = "local"
path = "`+lower+`"
`)
	os.Mkdir(p.Path("one"), 0o755)
	if err := os.Rename(log, log+".1"); err != nil {
		t.Fatal(err)
	}
	p.Cmd.Process.Signal(syscall.SIGHUP)
	// The reopen happens in the daemon; wait for the new file.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(log); err == nil {
			break
		}
		if time.Now().After(deadline) {
			l, _ := os.ReadFile(p.Log)
			t.Fatalf("no new log after SIGHUP\n%s", l)
		}
		time.Sleep(20 * time.Millisecond)
	}
	os.Mkdir(p.Path("two"), 0o755)
	p.Unmount()
	old, cur := records(t, log+".1"), records(t, log)
	if len(old) != 1 || old[0].Path != "one" || len(cur) != 1 || cur[0].Path != "two" {
		t.Fatalf("rotated log %+v, new log %+v", old, cur)
	}
}

// TestStdout: output = "stdout" writes the records on the daemon's standard
// output (with cairn mount -f).
func TestStdout(t *testing.T) {
	lower := t.TempDir()
	p := mounttest.MountSpec(t, `mount = "snoop"
[layer.snoop]
type = "snoop"
over = "base"
output = "stdout"
ops = ["mkdir"]
[layer.base]
type = "local"
path = "`+lower+`"
`)
	if err := os.Mkdir(p.Path("seen"), 0o755); err != nil {
		t.Fatal(err)
	}
	p.Unmount()
	out, _ := os.ReadFile(p.Log)
	found := false
	for _, line := range strings.Split(string(out), "\n") {
		var r snoop.Record
		if json.Unmarshal([]byte(line), &r) == nil && r.Op == "mkdir" && r.Path == "seen" && r.Result == "ok" {
			found = true
		}
	}
	if !found {
		t.Fatalf("no mkdir record on standard output:\n%s", out)
	}
}

// TestSyslog: records go to syslog, here a socket of the test's own that
// stands for /dev/log; without a syslog, the layer says so instead of
// dropping everything.
func TestSyslog(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "log")
	if _, err := snoop.New(layer.FS(nil), snoop.Options{Output: "syslog", SyslogSocket: sock}); err == nil || !strings.Contains(err.Error(), "syslog") {
		t.Fatalf("no syslog listening, and New says %v", err)
	}
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fs, err := snoop.New(layer.FS(nil), snoop.Options{Output: "syslog", SyslogSocket: sock})
	if err != nil {
		t.Fatal(err)
	}
	fs.After(context.Background(), &layer.Op{Name: "mkdir", Path: "seen/dir", Start: time.Now()})
	if err := fs.Close(); err != nil || fs.Dropped() != 0 {
		t.Fatalf("close: %v, dropped %d", err, fs.Dropped())
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 64<<10)
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatalf("syslog received nothing: %v", err)
	}
	msg := string(buf[:n])
	// <30>: LOG_DAEMON|LOG_INFO; then the tag and the record as JSON.
	i := strings.Index(msg, "cairn-snoop[")
	j := strings.Index(msg, "{")
	if !strings.HasPrefix(msg, "<30>") || i < 0 || j < i {
		t.Fatalf("syslog message %q", msg)
	}
	var r snoop.Record
	if err := json.Unmarshal([]byte(strings.TrimSpace(msg[j:])), &r); err != nil || r.Op != "mkdir" || r.Path != "seen/dir" {
		t.Fatalf("syslog record %q: %+v %v", msg[j:], r, err)
	}
}
