//go:build linux

package fusefs_test

import (
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/fusefs"
	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/crypt"
	"cairnfs.dev/cairn/layers/null"
)

// atimeObj is one file or directory of TestAtimeOptions: what is done to it
// through the mount, whether its atime is older than its mtime before
// (due: relatime changes it) or later than its mtime and ctime (only
// strictatime does), and whether it was read once before (warm: the access
// may be served from the kernel's page cache or a layer's own).
type atimeObj struct {
	name   string
	action string // read, exec or list
	due    bool
	warm   bool
}

func atimeObjs() []atimeObj {
	var objs []atimeObj
	for _, action := range []string{"read", "exec", "list", "empty"} {
		for _, due := range []bool{true, false} {
			for _, warm := range []bool{false, true} {
				if warm && action == "list" {
					continue
				}
				name := action + map[bool]string{true: "-due", false: "-fresh"}[due] + map[bool]string{true: "-warm", false: ""}[warm]
				objs = append(objs, atimeObj{name: name, action: action, due: due, warm: warm})
			}
		}
	}
	return objs
}

// atimeWant is mount(8)'s rule: whether the access changes the atime on a
// file system mounted with opt.
func atimeWant(opt string, o atimeObj) bool {
	has := func(w string) bool { return strings.Contains(","+opt+",", ","+w+",") }
	switch {
	case has("ro"), has("noatime"):
		return false
	case o.action == "list" && has("nodiratime"):
		return false
	case has("strictatime"):
		return true
	}
	return o.due
}

// atimeScript makes the objects, reads the warm ones, sets the times and
// accesses each object; the steps are separate so that a mount can be
// remounted between them.
type atimeScript struct {
	t    *testing.T
	objs []atimeObj
	bin  []byte // an executable
}

func (s *atimeScript) setup(dir string) {
	for _, o := range s.objs {
		p := filepath.Join(dir, o.name)
		var err error
		switch o.action {
		case "read":
			err = os.WriteFile(p, []byte(strings.Repeat("atime ", 2000)), 0o644)
		case "empty":
			err = os.WriteFile(p, nil, 0o644)
		case "exec":
			err = os.WriteFile(p, s.bin, 0o755)
		case "list":
			if err = os.Mkdir(p, 0o755); err == nil {
				err = os.WriteFile(filepath.Join(p, "entry"), nil, 0o644)
			}
		}
		if err != nil {
			s.t.Fatal(err)
		}
	}
}

func (s *atimeScript) access(dir string, o atimeObj) {
	p := filepath.Join(dir, o.name)
	var err error
	switch o.action {
	case "read", "empty":
		_, err = os.ReadFile(p)
	case "exec":
		// Through sh, so that the test process does not fork while it
		// serves the mount the new program is read from.
		var out []byte
		out, err = exec.Command("sh", "-c", `exec "$0"`, p).CombinedOutput()
		if err != nil {
			s.t.Logf("%s: %s", p, out)
		}
	case "list":
		_, err = os.ReadDir(p)
	}
	if err != nil {
		s.t.Fatal(err)
	}
}

// warm reads the warm objects once.
func (s *atimeScript) warm(dir string) {
	for _, o := range s.objs {
		if o.warm {
			s.access(dir, o)
		}
	}
}

// setTimes gives every object its atime and mtime (the ctime is now).
func (s *atimeScript) setTimes(dir string) {
	now := time.Now()
	for _, o := range s.objs {
		at, mt := now.Add(time.Hour), now.Add(-10*time.Second)
		if o.due {
			at = now.Add(-20 * time.Second)
		}
		if err := os.Chtimes(filepath.Join(dir, o.name), at, mt); err != nil {
			s.t.Fatal(err)
		}
	}
}

// run accesses every object and says whose atime changed; atime reads an
// object's atime where it is kept.
func (s *atimeScript) run(dir string, atime func(name string) unix.Timespec) map[string]bool {
	before := map[string]unix.Timespec{}
	for _, o := range s.objs {
		before[o.name] = atime(o.name)
	}
	for _, o := range s.objs {
		s.access(dir, o)
	}
	changed := map[string]bool{}
	for _, o := range s.objs {
		changed[o.name] = atime(o.name) != before[o.name]
	}
	return changed
}

func statAtime(t *testing.T, p string) unix.Timespec {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Atim
}

func atimeFlags(t *testing.T, opt string) uintptr {
	if opt == "" {
		return 0
	}
	flags, err := fusefs.ParseMountFlags(strings.Split(opt, ","))
	if err != nil {
		t.Fatal(err)
	}
	// tmpfs is not nodev,nosuid by default, and exec is what we test.
	return flags &^ (syscall.MS_NODEV | syscall.MS_NOSUID)
}

// oracle runs the script on a tmpfs mounted with opt.
func (s *atimeScript) oracle(t *testing.T, opt string) map[string]bool {
	dir := mounttest.TmpfsFlags(t, "", 0)
	s.setup(dir)
	flags := atimeFlags(t, opt)
	if flags&syscall.MS_RDONLY != 0 {
		s.setTimes(dir)
	}
	if err := syscall.Mount("cairn-test", dir, "tmpfs", syscall.MS_REMOUNT|flags, ""); err != nil {
		t.Fatalf("remount tmpfs %s: %v", opt, err)
	}
	if flags&syscall.MS_RDONLY == 0 {
		s.warm(dir)
		s.setTimes(dir)
	}
	return s.run(dir, func(name string) unix.Timespec { return statAtime(t, filepath.Join(dir, name)) })
}

// cairn runs the script through a mount with opt of a stack over lower: the
// objects are made through a mount with the default options, then read
// through one with opt; their atimes are read in the lower (the lower file
// of each is found by its inode number, which the mount shows).
func (s *atimeScript) cairn(t *testing.T, build func() layer.FS, lower, opt string) map[string]bool {
	top := build()
	m := mounttest.MountOpts(t, top, fusefs.Options{AllowOther: true})
	s.setup(m.Dir)
	inos := map[uint64]string{}
	for _, o := range s.objs {
		var st unix.Stat_t
		if err := unix.Lstat(m.Path(o.name), &st); err != nil {
			t.Fatal(err)
		}
		inos[st.Ino] = o.name
	}
	lowerOf := map[string]string{}
	filepath.WalkDir(lower, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if unix.Lstat(p, &st) == nil && inos[st.Ino] != "" {
			lowerOf[inos[st.Ino]] = p
		}
		return nil
	})
	if len(lowerOf) != len(s.objs) {
		t.Fatalf("found %d of the %d objects in the lower", len(lowerOf), len(s.objs))
	}
	ro := atimeFlags(t, opt)&syscall.MS_RDONLY != 0
	if ro {
		s.setTimes(m.Dir)
	}
	m.Unmount()
	// A new stack, as cairn mount builds: the first one's layers may
	// hold files open, which were opened before the options applied.
	if err := layer.CloseStack(top); err != nil {
		t.Fatal(err)
	}
	top = build()
	t.Cleanup(func() { layer.CloseStack(top) })
	var flags []string
	if opt != "" {
		flags = strings.Split(opt, ",")
	}
	m = mounttest.MountOpts(t, top, fusefs.Options{AllowOther: true, MountFlags: flags})
	defer m.Unmount()
	if !ro {
		s.warm(m.Dir)
		s.setTimes(m.Dir)
	}
	changed := s.run(m.Dir, func(name string) unix.Timespec { return statAtime(t, lowerOf[name]) })
	// The mount shows the lower's atimes at once: the kernel does not
	// keep the old one in its attribute cache.
	for _, o := range s.objs {
		if got, want := statAtime(t, m.Path(o.name)), statAtime(t, lowerOf[o.name]); got != want {
			t.Errorf("%s: the mount shows atime %v, the lower has %v", o.name, got, want)
		}
	}
	return changed
}

// TestAtimeOptions: a mount's atime options (relatime, the default;
// noatime, strictatime, nodiratime, ro) decide when reading, listing and
// executing through null, crypt and zstd stacks change the atimes of the
// lower's files, as they decide it on a tmpfs mounted with them (the
// oracle), whatever options the lower itself is mounted with. Warm files
// show that an access the kernel or a layer serves from its cache counts
// too.
func TestAtimeOptions(t *testing.T) {
	mounttest.NeedRoot(t)
	bin, err := os.ReadFile("/bin/true")
	if err != nil {
		t.Fatal(err)
	}
	s := &atimeScript{t: t, objs: atimeObjs(), bin: bin}
	stacks := []struct {
		name   string
		lowers []string // the lower's own mount options
		new    func(t *testing.T, lower string, first bool) layer.FS
	}{
		{"null", []string{"relatime", "strictatime", "noatime,nodiratime"}, func(t *testing.T, lower string, first bool) layer.FS {
			return null.New(newLocal(t, lower))
		}},
		{"crypt", []string{"relatime", "noatime"}, func(t *testing.T, lower string, first bool) layer.FS {
			pass := []byte("atime test")
			l := newLocal(t, lower)
			if first {
				if _, err := crypt.Init(context.Background(), l, crypt.InitParams{KDF: crypt.KDF{Name: crypt.Scrypt, N: crypt.ScryptMinN, R: 8, P: 1}}, pass); err != nil {
					t.Fatal(err)
				}
			}
			fs, err := crypt.Unlock(context.Background(), l, pass, false, crypt.Options{})
			if err != nil {
				t.Fatal(err)
			}
			return fs
		}},
		{"zstd", []string{"relatime", "strictatime"}, func(t *testing.T, lower string, first bool) layer.FS {
			return newCodec(t, newLocal(t, lower), "zstd")
		}},
	}
	for _, opt := range []string{"", "relatime", "noatime", "strictatime", "nodiratime", "strictatime,nodiratime", "ro", "ro,strictatime", "lazytime"} {
		name := opt
		if name == "" {
			name = "default"
		}
		t.Run(name, func(t *testing.T) {
			s.t = t
			want := s.oracle(t, opt)
			for _, o := range s.objs {
				if want[o.name] != atimeWant(opt, o) {
					t.Fatalf("the oracle (tmpfs -o %s) does not follow mount(8)'s rule for %s: changed %v", opt, o.name, want[o.name])
				}
			}
			for _, st := range stacks {
				for _, lo := range st.lowers {
					t.Run(st.name+"/lower-"+lo, func(t *testing.T) {
						s.t = t
						lower := mounttest.TmpfsFlags(t, "", atimeFlags(t, lo))
						first := true
						got := s.cairn(t, func() layer.FS {
							defer func() { first = false }()
							return st.new(t, lower, first)
						}, lower, opt)
						for _, o := range s.objs {
							if got[o.name] != want[o.name] {
								t.Errorf("%s: atime changed %v, on tmpfs -o %s %v", o.name, got[o.name], opt, want[o.name])
							}
						}
					})
				}
			}
		})
	}
}
