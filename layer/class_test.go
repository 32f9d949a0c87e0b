package layer

import (
	"testing"

	"golang.org/x/sys/unix"
)

func TestClasses(t *testing.T) {
	for _, c := range []struct {
		op            Op
		first, second Class
	}{
		{Op{Name: "open", Flags: unix.O_RDONLY}, ClassRead, 0},
		{Op{Name: "open", Flags: unix.O_WRONLY}, ClassWrite, 0},
		{Op{Name: "open", Flags: unix.O_RDWR}, ClassRead | ClassWrite, 0},
		{Op{Name: "open", Flags: unix.O_RDONLY | unix.O_TRUNC}, ClassRead | ClassWrite, 0},
		{Op{Name: "open", Flags: unix.O_RDONLY | fmodeExec}, ClassExec, 0},
		{Op{Name: "create", Flags: unix.O_WRONLY}, ClassCreate | ClassWrite, 0},
		{Op{Name: "tmpfile", Flags: unix.O_RDWR}, ClassCreate | ClassRead | ClassWrite, 0},
		{Op{Name: "setflags"}, ClassSetattr, 0},
		{Op{Name: "getflags"}, 0, 0},
		{Op{Name: "setattr", Set: &SetAttr{Valid: SetSize}}, ClassWrite, 0},
		{Op{Name: "fsetattr", Set: &SetAttr{Valid: SetAtimeNow | SetMtimeNow}}, ClassWrite, 0},
		{Op{Name: "setattr", Set: &SetAttr{Valid: SetMode}}, ClassSetattr, 0},
		{Op{Name: "setattr", Set: &SetAttr{Valid: SetUid | SetGid}}, ClassSetattr, 0},
		{Op{Name: "setattr", Set: &SetAttr{Valid: SetMtime}}, ClassSetattr, 0},
		{Op{Name: "setattr", Set: &SetAttr{Valid: SetSize | SetMode}}, ClassWrite | ClassSetattr, 0},
		{Op{Name: "rename"}, ClassRename | ClassDelete, ClassRename | ClassCreate},
		{Op{Name: "rename", Flags: RenameExchange}, ClassRename | ClassDelete | ClassCreate | ClassWrite, ClassRename | ClassDelete | ClassCreate | ClassWrite},
		{Op{Name: "link"}, 0, ClassCreate},
		{Op{Name: "copy_file_range"}, ClassRead, ClassWrite},
		{Op{Name: "unlink"}, ClassDelete, 0},
		{Op{Name: "getxattr"}, ClassXattr, 0},
		{Op{Name: "getattr"}, 0, 0},
		{Op{Name: "fsync"}, 0, 0},
	} {
		if f, s := c.op.Classes(); f != c.first || s != c.second {
			t.Errorf("%s %#x: %v, %v; want %v, %v", c.op.Name, c.op.Flags, f, s, c.first, c.second)
		}
	}
	if s := (ClassRead | ClassExec).String(); s != "read+exec" {
		t.Errorf("class string %q", s)
	}
	for i, n := range ClassNames {
		if k, err := ParseClass(n); err != nil || k != 1<<i {
			t.Errorf("ParseClass(%q) = %v, %v", n, k, err)
		}
	}
	if _, err := ParseClass("chmod"); err == nil {
		t.Error("ParseClass accepts chmod")
	}
}
