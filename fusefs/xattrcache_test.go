//go:build linux

package fusefs_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/fusefs"
	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/acl"
	"cairnfs.dev/cairn/layers/local"
	"cairnfs.dev/cairn/layers/null"
)

// xattrCounter counts the getxattr calls that reach the layer under it,
// by name.
type xattrCounter struct {
	layer.Base
	mu sync.Mutex
	n  map[string]int
}

func (c *xattrCounter) Getxattr(ctx context.Context, p, name string, dest []byte) (int, error) {
	c.mu.Lock()
	c.n[name]++
	c.mu.Unlock()
	return c.Base.Getxattr(ctx, p, name, dest)
}

func (c *xattrCounter) count(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[name]
}

func getx(p, name string) error {
	_, err := unix.Lgetxattr(p, name, make([]byte, 64))
	return err
}

// TestXattrAbsenceRemembered: the absence of security.selinux and the
// other names that ls -l and the kernel ask of every file is remembered
// by the node, so a second ls -l (and every write's security.capability
// check) reaches the stack no more; any change through the mount
// (setxattr, removexattr, chmod) forgets it, and a stack that judges
// callers (acl) remembers nothing. On a stack whose lower others change,
// the absence is kept no longer than the attributes (1 s).
func TestXattrAbsenceRemembered(t *testing.T) {
	mountCounted := func(t *testing.T, shared bool, wrap func(layer.FS) layer.FS) (*mounttest.Mounted, *xattrCounter, string) {
		lower := t.TempDir()
		os.WriteFile(filepath.Join(lower, "f"), []byte("x"), 0o644)
		l, err := local.New(lower)
		if err != nil {
			t.Fatal(err)
		}
		if shared {
			l.SetShared()
		}
		c := &xattrCounter{Base: layer.Base{Lower: l}, n: map[string]int{}}
		return mounttest.MountOpts(t, wrap(null.New(c)), fusefs.Options{}), c, lower
	}
	noWrap := func(fs layer.FS) layer.FS { return fs }
	t.Run("exclusive", func(t *testing.T) {
		m, c, _ := mountCounted(t, false, noWrap)
		f := m.Path("f")
		for range 5 {
			for _, name := range []string{"security.selinux", "system.posix_acl_access", "user.other"} {
				if err := getx(f, name); !errors.Is(err, unix.ENODATA) {
					t.Fatalf("%s: %v, want ENODATA", name, err)
				}
			}
		}
		if n := c.count("security.selinux"); n != 1 {
			t.Errorf("5 getxattr of security.selinux reached the stack %d times, want 1", n)
		}
		if n := c.count("user.other"); n != 5 {
			t.Errorf("5 getxattr of user.other reached the stack %d times, want 5 (not a remembered name)", n)
		}
		// A change through the mount: the next answer is the stack's.
		if err := unix.Lsetxattr(f, "security.selinux", []byte("x"), 0); err != nil && !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.EPERM) {
			t.Fatal(err)
		}
		if err := getx(f, "system.posix_acl_access"); !errors.Is(err, unix.ENODATA) {
			t.Fatal(err)
		}
		if n := c.count("system.posix_acl_access"); n != 2 {
			t.Errorf("after a setxattr: %d getxattr of system.posix_acl_access reached the stack, want 2", n)
		}
		if err := unix.Lsetxattr(f, "user.k", []byte("v"), 0); err != nil {
			t.Fatal(err)
		}
		os.Chmod(f, 0o600)
		getx(f, "system.posix_acl_access")
		if n := c.count("system.posix_acl_access"); n != 3 {
			t.Errorf("after a chmod: %d getxattr of system.posix_acl_access reached the stack, want 3", n)
		}
		// An ACL set through the mount is read, never a stale absence.
		getx(f, "system.posix_acl_access")
		if err := unix.Lsetxattr(f, "system.posix_acl_access", aclUserRead(), 0); err != nil {
			t.Fatal(err)
		}
		if err := getx(f, "system.posix_acl_access"); err != nil {
			t.Fatalf("the ACL just set: %v", err)
		}
		if err := unix.Lremovexattr(f, "system.posix_acl_access"); err != nil {
			t.Fatal(err)
		}
		if err := getx(f, "system.posix_acl_access"); !errors.Is(err, unix.ENODATA) {
			t.Fatalf("the ACL just removed: %v", err)
		}
	})
	t.Run("shared lower", func(t *testing.T) {
		m, c, lower := mountCounted(t, true, noWrap)
		f := m.Path("f")
		getx(f, "security.selinux")
		getx(f, "security.selinux")
		if n := c.count("security.selinux"); n != 1 {
			t.Errorf("2 getxattr within the attribute timeout: %d reached the stack, want 1", n)
		}
		// Another process sets an ACL in the lower: seen once the
		// attribute timeout (1 s) has passed.
		if err := unix.Lsetxattr(filepath.Join(lower, "f"), "system.posix_acl_access", aclUserRead(), 0); err != nil {
			t.Skipf("the lower takes no ACL: %v", err)
		}
		getx(f, "system.posix_acl_access")
		time.Sleep(1100 * time.Millisecond)
		if err := getx(f, "system.posix_acl_access"); err != nil {
			t.Fatalf("an ACL set in the lower, 1.1 s later: %v", err)
		}
	})
	t.Run("acl layer", func(t *testing.T) {
		m, c, _ := mountCounted(t, false, func(fs layer.FS) layer.FS {
			return acl.New(fs, &acl.Rules{Default: true}, false, false)
		})
		for range 3 {
			getx(m.Path("f"), "security.selinux")
		}
		if n := c.count("security.selinux"); n != 3 {
			t.Errorf("under acl: %d of 3 getxattr reached the stack, want 3", n)
		}
	})
}

// aclUserRead is an access ACL giving user 1000 read, in the kernel's
// xattr form (user::rw-, user:1000:r--, group::r--, mask::r--, other::r--).
func aclUserRead() []byte {
	b := []byte{2, 0, 0, 0}
	entry := func(tag, perm uint16, id uint32) {
		b = append(b, byte(tag), byte(tag>>8), byte(perm), byte(perm>>8), byte(id), byte(id>>8), byte(id>>16), byte(id>>24))
	}
	entry(0x01, 6, 0xffffffff)
	entry(0x02, 4, 1000)
	entry(0x04, 4, 0xffffffff)
	entry(0x10, 4, 0xffffffff)
	entry(0x20, 4, 0xffffffff)
	return b
}
