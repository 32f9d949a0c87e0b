//go:build !linux

package layer

import "golang.org/x/sys/unix"

// AttrFromStat converts a stat(2) result. The BSDs' stat carries the birth
// time, which is also the generation (Attr.Gen), as statx's does on Linux;
// its fields are narrower than Linux's (Mode is 16 bits, Dev and Rdev are
// signed 32 bits on macOS), hence the conversions.
func AttrFromStat(st *unix.Stat_t) Attr {
	a := Attr{
		Ino: uint64(st.Ino), Dev: uint64(st.Dev), Size: uint64(st.Size), Blocks: uint64(st.Blocks),
		Atime: st.Atim, Mtime: st.Mtim, Ctime: st.Ctim,
		Mode: uint32(st.Mode), Nlink: uint32(st.Nlink), Uid: st.Uid, Gid: st.Gid,
		Rdev: uint64(st.Rdev), Blksize: uint32(st.Blksize),
	}
	if st.Btim.Sec > 0 || st.Btim.Nsec > 0 {
		a.Btime = st.Btim
		a.Gen = uint64(st.Btim.Sec)*1e9 + uint64(st.Btim.Nsec)
	}
	return a
}
