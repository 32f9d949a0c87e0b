package layer

import "golang.org/x/sys/unix"

// AttrFromStat converts a stat(2) result.
func AttrFromStat(st *unix.Stat_t) Attr {
	return Attr{
		Ino: st.Ino, Dev: st.Dev, Size: uint64(st.Size), Blocks: uint64(st.Blocks),
		Atime: st.Atim, Mtime: st.Mtim, Ctime: st.Ctim,
		Mode: st.Mode, Nlink: uint32(st.Nlink), Uid: st.Uid, Gid: st.Gid,
		Rdev: st.Rdev, Blksize: uint32(st.Blksize),
	}
}

// AttrFromStatx converts a statx(2) result; the birth time, where the
// lower gives one, is also the generation (Attr.Gen).
func AttrFromStatx(st *unix.Statx_t) Attr {
	ts := func(t unix.StatxTimestamp) Time { return Time{Sec: t.Sec, Nsec: int64(t.Nsec)} }
	a := Attr{
		Ino: st.Ino, Dev: unix.Mkdev(st.Dev_major, st.Dev_minor), Size: st.Size, Blocks: st.Blocks,
		Atime: ts(st.Atime), Mtime: ts(st.Mtime), Ctime: ts(st.Ctime),
		Mode: uint32(st.Mode), Nlink: st.Nlink, Uid: st.Uid, Gid: st.Gid,
		Rdev: unix.Mkdev(st.Rdev_major, st.Rdev_minor), Blksize: st.Blksize,
	}
	if st.Mask&unix.STATX_BTIME != 0 {
		a.Btime = ts(st.Btime)
		a.Gen = uint64(st.Btime.Sec)*1e9 + uint64(st.Btime.Nsec)
	}
	return a
}
