package fusefs_test

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"

	"cairnfs.dev/cairn/internal/fsx"
	"cairnfs.dev/cairn/internal/mounttest"
)

// One process holding more files open through the mount than the daemon
// may have descriptors must not lock everyone else out (EMFILE), on a stack
// whose files are passed through to the kernel (null) and one whose files
// are not (zstd); every held file keeps reading and writing its own bytes
// after the daemon closed and reopened its lower descriptor.
func TestMoreOpenFilesThanDaemonDescriptors(t *testing.T) {
	mounttest.NeedRoot(t)
	const limit = 128 // the daemon's ulimit -n
	for _, top := range []string{"null", "zstd"} {
		t.Run(top, func(t *testing.T) {
			lower := t.TempDir()
			os.Chmod(lower, 0o777)
			spec := fmt.Sprintf("mount = \"top\"\n[layer.base]\ntype = \"local\"\npath = %q\n[layer.top]\ntype = %q\nover = \"base\"\n", lower, top)
			p := mounttest.MountSpecNofile(t, spec, limit)
			const n = 3 * limit
			files := make([]*os.File, n)
			content := func(i int) string { return fmt.Sprintf("file %d\n", i) }
			// In more directories than the daemon has descriptors.
			name := func(i int) string { return fmt.Sprintf("d%d/held%d", i%(limit+limit/2), i) }
			for i := range files {
				os.Mkdir(p.Path(fmt.Sprintf("d%d", i%(limit+limit/2))), 0o777)
				f, err := os.OpenFile(p.Path(name(i)), os.O_RDWR|os.O_CREATE, 0o666)
				if err != nil {
					t.Fatalf("open %d of %d: %v", i+1, n, err)
				}
				t.Cleanup(func() { f.Close() }) // before the unmount
				files[i] = f
				if _, err := f.WriteAt([]byte(content(i)), 0); err != nil {
					t.Fatalf("write %d: %v", i, err)
				}
			}
			// Another user opens, writes and reads.
			out, err := mounttest.User{Uid: 65534, Gid: 65534}.Sh(t, p.Dir, `echo other > other && cat other && cat d7/held7`)
			if want := "other\n" + content(7); err != nil || out != want {
				t.Fatalf("another user: %q %v, want %q", out, err, want)
			}
			// Each held file, its descriptor long closed by the daemon.
			for i, f := range files {
				if _, err := f.WriteAt([]byte("again\n"), int64(len(content(i)))); err != nil {
					t.Fatalf("write %d again: %v", i, err)
				}
			}
			for i, f := range files {
				want := content(i) + "again\n"
				buf := make([]byte, 64)
				m, _ := f.ReadAt(buf, 0)
				if string(buf[:m]) != want {
					t.Fatalf("%s reads %q, want %q", name(i), buf[:m], want)
				}
				if f.Sync() != nil {
					t.Fatalf("fsync %s", name(i))
				}
			}
			if top == "null" {
				b, err := os.ReadFile(lower + "/" + name(9))
				if err != nil || !bytes.Equal(b, []byte(content(9)+"again\n")) {
					t.Fatalf("lower %s: %q %v", name(9), b, err)
				}
			}
			fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.Cmd.Process.Pid))
			t.Logf("the daemon holds %d descriptors for %d open files", len(fds), n)
			// The model checker over more files than the daemon keeps
			// descriptors for, renames included.
			if err := os.Mkdir(p.Path("fsx"), 0o755); err != nil {
				t.Fatal(err)
			}
			fsx.Run(t, fsx.Config{Dir: p.Path("fsx"), Files: limit, Ops: 3000, MaxSize: 64 << 10, MaxLen: 8 << 10})
			if log, _ := os.ReadFile(p.Log); strings.Contains(string(log), "too many open files") {
				t.Errorf("the daemon ran out of descriptors:\n%s", log)
			}
		})
	}
}
