package layer

import (
	"context"
	"syscall"
)

// NotImplemented answers every FS operation with ENOSYS. A fan-out layer,
// which has no single lower to forward to, embeds it and implements what it
// supports, so that a forgotten operation fails loudly instead of going to
// the wrong lower.
type NotImplemented struct{}

var enosys = syscall.ENOSYS

func (NotImplemented) Getattr(context.Context, string) (Attr, error) { return Attr{}, enosys }
func (NotImplemented) Setattr(context.Context, string, *SetAttr) (Attr, error) {
	return Attr{}, enosys
}
func (NotImplemented) ReadDir(context.Context, string, bool) ([]DirEntry, error) {
	return nil, enosys
}
func (NotImplemented) Open(context.Context, string, int) (File, error) { return nil, enosys }
func (NotImplemented) Create(context.Context, string, int, uint32) (File, Attr, error) {
	return nil, Attr{}, enosys
}
func (NotImplemented) Mkdir(context.Context, string, uint32) (Attr, error) { return Attr{}, enosys }
func (NotImplemented) Mknod(context.Context, string, uint32, uint64) (Attr, error) {
	return Attr{}, enosys
}
func (NotImplemented) Symlink(context.Context, string, string) (Attr, error) {
	return Attr{}, enosys
}
func (NotImplemented) Readlink(context.Context, string) (string, error) { return "", enosys }
func (NotImplemented) Link(context.Context, string, string) (Attr, error) {
	return Attr{}, enosys
}
func (NotImplemented) Unlink(context.Context, string) error                 { return enosys }
func (NotImplemented) Rmdir(context.Context, string) error                  { return enosys }
func (NotImplemented) Rename(context.Context, string, string, uint32) error { return enosys }
func (NotImplemented) Getxattr(context.Context, string, string, []byte) (int, error) {
	return 0, enosys
}
func (NotImplemented) Setxattr(context.Context, string, string, []byte, int) error { return enosys }
func (NotImplemented) Listxattr(context.Context, string, []byte) (int, error)      { return 0, enosys }
func (NotImplemented) Removexattr(context.Context, string, string) error           { return enosys }
func (NotImplemented) Statfs(context.Context, string) (Statfs, error) {
	return Statfs{}, enosys
}
func (NotImplemented) SyncDir(context.Context, string) error { return enosys }
func (NotImplemented) Tmpfile(context.Context, string, int, uint32) (File, Attr, error) {
	return nil, Attr{}, enosys
}
func (NotImplemented) LinkFile(context.Context, File, string) (Attr, error) {
	return Attr{}, enosys
}
func (NotImplemented) GetFlags(context.Context, string) (uint32, error) { return 0, enosys }
func (NotImplemented) SetFlags(context.Context, string, uint32) error   { return enosys }
func (NotImplemented) Changes() Changes                                 { return 0 }
func (NotImplemented) Close() error                                     { return nil }
