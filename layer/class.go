package layer

import (
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Class is a class of operations, or a set of them: what access rules
// (acl) and log filters (snoop) name instead of single operations.
type Class uint16

const (
	ClassRead    Class = 1 << iota // open for reading, read, readdir
	ClassWrite                     // open for writing, write, truncate, fallocate, touch
	ClassCreate                    // create, mkdir, mknod, symlink, link (the new name)
	ClassDelete                    // unlink, rmdir
	ClassRename                    // rename (both names)
	ClassSetattr                   // chmod, chown, setting given times, chattr
	ClassXattr                     // get, list, set and remove extended attributes
	ClassExec                      // execve
	ClassAll     = ClassExec<<1 - 1
)

// ClassNames are the classes' names, in the order of their bits.
var ClassNames = []string{"read", "write", "create", "delete", "rename", "setattr", "xattr", "exec"}

func (k Class) String() string {
	var s []string
	for i, n := range ClassNames {
		if k&(1<<i) != 0 {
			s = append(s, n)
		}
	}
	return strings.Join(s, "+")
}

// ParseClass is the class called name (one of ClassNames).
func ParseClass(name string) (Class, error) {
	i := slices.Index(ClassNames, name)
	if i < 0 {
		return 0, fmt.Errorf("unknown operation class %q (known: %s)", name, strings.Join(ClassNames, ", "))
	}
	return 1 << i, nil
}

// fmodeExec is the kernel's __FMODE_EXEC: execve opens with it.
const fmodeExec = 0x20

// Classes are the classes of op for its path, and for its second path
// where it has one that it changes (link's and rename's new name,
// copy_file_range's destination). A rename is a delete of the old name and
// a create of the new one; with RENAME_EXCHANGE each name is both, and a
// write of what it names (whether a plain rename replaces a file, and so
// writes it, only the lower can say). Truncation and setting the times to
// now (touch) are writes; chmod, chown and setting given times are
// setattr, and so is setting inode flags (chattr); a tmpfile is a create
// in its directory, and the link that names it a create of the new name.
// Operations that read only metadata (getattr, readlink, statfs, getflags)
// and those that end or order what an open did (flush, fsync, release,
// locks, lseek) have no class.
func (op *Op) Classes() (first, second Class) {
	switch op.Name {
	case "readdir", "read":
		return ClassRead, 0
	case "write", "fallocate":
		return ClassWrite, 0
	case "copy_file_range":
		return ClassRead, ClassWrite
	case "open":
		return openClasses(op.Flags), 0
	case "create", "tmpfile":
		return ClassCreate | openClasses(op.Flags), 0
	case "mkdir", "mknod", "symlink":
		return ClassCreate, 0
	case "link":
		return 0, ClassCreate
	case "unlink", "rmdir":
		return ClassDelete, 0
	case "rename":
		if op.Flags&RenameExchange != 0 {
			k := ClassRename | ClassDelete | ClassCreate | ClassWrite
			return k, k
		}
		return ClassRename | ClassDelete, ClassRename | ClassCreate
	case "setattr", "fsetattr":
		return setattrClasses(op.Set), 0
	case "setflags":
		return ClassSetattr, 0
	case "getxattr", "listxattr", "setxattr", "removexattr":
		return ClassXattr, 0
	}
	return 0, 0
}

func openClasses(flags int) Class {
	var k Class
	switch flags & unix.O_ACCMODE {
	case unix.O_RDONLY:
		k = ClassRead
	case unix.O_WRONLY:
		k = ClassWrite
	default:
		k = ClassRead | ClassWrite
	}
	if flags&fmodeExec != 0 {
		k = ClassExec
	}
	if flags&unix.O_TRUNC != 0 {
		k |= ClassWrite
	}
	return k
}

func setattrClasses(s *SetAttr) Class {
	if s == nil {
		return 0
	}
	var k Class
	if s.Valid&(SetSize|SetAtimeNow|SetMtimeNow) != 0 {
		k |= ClassWrite
	}
	if s.Valid&(SetMode|SetUid|SetGid|SetAtime|SetMtime) != 0 {
		k |= ClassSetattr
	}
	return k
}
