package fusefs

import (
	"sync/atomic"
	"syscall"
	"time"

	"cairnfs.dev/cairn/layer"
)

// The absence of a few xattrs that the kernel and common tools ask about
// every file for, remembered per node. The kernel keeps no xattr (but ACLs,
// where it handles them): `ls -l` asks security.selinux and
// system.posix_acl_access of each file it lists, and the kernel asks
// security.capability before each write and chown of a file (it cannot
// mark a FUSE inode as having none). Each is a GETXATTR round trip, and
// through the stack an lgetxattr of the lower: on a network lower
// (GlusterFS, CephFS) a round trip of its own, 150-200 us. A node that
// answered ENODATA for one of these names answers it again from memory,
// as long as its attributes would be kept (the attribute timeout; for an
// exclusive stack, whose lowers change only through it, until a change)
// and nothing changed its xattrs or attributes through the mount since
// (Setxattr, Removexattr, Setattr forget them). Only where every layer
// answers getxattr the same to every caller, from what the lower holds
// (layer.FSXattrCache: acl judges callers, snoop logs each call).

// xattrCached are the names whose absence is remembered.
var xattrCached = [...]string{"security.capability", "security.selinux", "system.posix_acl_access", "system.posix_acl_default"}

func xattrBit(name string) uint64 {
	for i, n := range xattrCached {
		if n == name {
			return 1 << i
		}
	}
	return 0
}

// noXattr is a node's remembered absences: the low 8 bits one per name of
// xattrCached, the rest a generation that each forget moves on, so that
// an absence read from the lower before a change is not recorded after it.
type noXattr struct {
	w  atomic.Uint64
	at atomic.Int64 // when the first of them was recorded (monotonic ns)
}

var clockBase = time.Now()

func now() int64 { return int64(time.Since(clockBase)) }

// absent reports whether name is known to be missing (ttl < 0: for good),
// and the word to give to record.
func (x *noXattr) absent(bit uint64, ttl time.Duration) (bool, uint64) {
	w := x.w.Load()
	if w&bit == 0 {
		return false, w
	}
	if ttl < 0 || now()-x.at.Load() < int64(ttl) {
		return true, w
	}
	return false, w
}

// record notes that the name of bit is missing, unless the node was
// forgotten since w was read.
func (x *noXattr) record(w, bit uint64, ttl time.Duration) {
	for {
		if ttl >= 0 && (w&0xff == 0 || now()-x.at.Load() >= int64(ttl)) {
			// The first one, or the others are stale: a new period.
			if !x.w.CompareAndSwap(w, w&^0xff|bit) {
				return
			}
			x.at.Store(now())
			return
		}
		if x.w.CompareAndSwap(w, w|bit) {
			return
		}
		if nw := x.w.Load(); nw>>8 == w>>8 {
			w = nw // another name recorded meanwhile: retry
			continue
		}
		return
	}
}

// forget drops what is remembered (a change of the node through the mount).
func (x *noXattr) forget() {
	for {
		w := x.w.Load()
		if x.w.CompareAndSwap(w, (w>>8+1)<<8) {
			return
		}
	}
}

// cachedNoXattr answers a GETXATTR of name from memory when its absence is
// remembered; the word and bit are for noteNoXattr.
func (n *node) cachedNoXattr(name string) (hit bool, w, bit uint64) {
	if n.st.xattrTTL == 0 {
		return false, 0, 0
	}
	if bit = xattrBit(name); bit == 0 {
		return false, 0, 0
	}
	hit, w = n.noX.absent(bit, n.st.xattrTTL)
	return hit, w, bit
}

// noteNoXattr records the answer errno of a GETXATTR (see cachedNoXattr).
func (n *node) noteNoXattr(errno syscall.Errno, w, bit uint64) {
	if bit != 0 && errno == layer.ENOATTR {
		n.noX.record(w, bit, n.st.xattrTTL)
	}
}
