// Copyright 2026 the cairn authors. All rights reserved.
// Use of this source code is governed by a BSD-style
// license that can be found in the LICENSE file.

package fuse

// A minimal io_uring: the three mappings, 128-byte SQEs (IORING_SETUP_SQE128,
// which IORING_OP_URING_CMD for FUSE needs), and io_uring_enter. Only what
// the FUSE transport (uring_linux.go) uses; one goroutine, locked to its OS
// thread, owns each ring (single issuer).

import (
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// From include/uapi/linux/io_uring.h.
const (
	_IORING_SETUP_CQSIZE        = 1 << 3
	_IORING_SETUP_SUBMIT_ALL    = 1 << 7
	_IORING_SETUP_SQE128        = 1 << 10
	_IORING_SETUP_SINGLE_ISSUER = 1 << 12
	_IORING_SETUP_DEFER_TASKRUN = 1 << 13
	_IORING_FEAT_SINGLE_MMAP    = 1 << 0
	_IORING_FEAT_NODROP         = 1 << 1
	_IORING_ENTER_GETEVENTS     = 1 << 0
	_IORING_ENTER_EXT_ARG       = 1 << 3
	_IORING_OFF_SQ_RING         = 0
	_IORING_OFF_CQ_RING         = 0x8000000
	_IORING_OFF_SQES            = 0x10000000
	_IORING_REGISTER_EVENTFD    = 4
	_IORING_OP_URING_CMD        = 46
	ioURingSQESize              = 128 // with IORING_SETUP_SQE128
	ioURingCQESize              = 16
	ioURingSQECmdOffset         = 48 // sqe->cmd: 80 bytes with SQE128
	ioURingSQEUserDataOffset    = 32
	ioURingSQECmdOpOffset       = 8
	ioURingSQEAddrOffset        = 16
	ioURingSQELenOffset         = 24
	ioURingSQEFdOffset          = 4
	ioURingSQEOpcodeOffset      = 0
)

type ioSqringOffsets struct {
	Head, Tail, RingMask, RingEntries, Flags, Dropped, Array, Resv1 uint32
	Resv2                                                           uint64
}

type ioCqringOffsets struct {
	Head, Tail, RingMask, RingEntries, Overflow, Cqes, Flags, Resv1 uint32
	Resv2                                                           uint64
}

type ioURingParams struct {
	SqEntries, CqEntries, Flags, SqThreadCPU, SqThreadIdle, Features, WqFd uint32
	Resv                                                                   [3]uint32
	SqOff                                                                  ioSqringOffsets
	CqOff                                                                  ioCqringOffsets
}

type ioURing struct {
	fd             int
	sqMem, cqMem   []byte
	sqesMem        []byte
	sqHead, sqTail *uint32
	sqMask         uint32
	sqEntries      uint32
	cqHead, cqTail *uint32
	cqMask         uint32
	cqes           unsafe.Pointer
	tail           uint32 // the next SQE's slot, published at enter
	singleMmap     bool   // cqMem is sqMem
}

// newIOURing sets up a ring of entries SQEs (a power of two) and twice as
// many CQEs, with flags on top of SQE128; it tries without the optional
// flags where the kernel refuses them.
func newIOURing(entries uint32, optional uint32) (*ioURing, error) {
	var p ioURingParams
	var fd uintptr
	var errno syscall.Errno
	for _, extra := range []uint32{optional, 0} {
		p = ioURingParams{Flags: _IORING_SETUP_SQE128 | _IORING_SETUP_CQSIZE | extra, CqEntries: 2 * entries}
		fd, _, errno = unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
		if errno != syscall.EINVAL {
			break
		}
	}
	if errno != 0 {
		return nil, errno
	}
	r := &ioURing{fd: int(fd)}
	if p.Features&_IORING_FEAT_NODROP == 0 {
		r.close()
		return nil, syscall.ENOSYS
	}
	sqSize := int(p.SqOff.Array + p.SqEntries*4)
	cqSize := int(p.CqOff.Cqes + p.CqEntries*ioURingCQESize)
	if p.Features&_IORING_FEAT_SINGLE_MMAP != 0 {
		sqSize = max(sqSize, cqSize)
	}
	var err error
	if r.sqMem, err = unix.Mmap(r.fd, _IORING_OFF_SQ_RING, sqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		r.close()
		return nil, err
	}
	r.cqMem = r.sqMem
	r.singleMmap = p.Features&_IORING_FEAT_SINGLE_MMAP != 0
	if !r.singleMmap {
		if r.cqMem, err = unix.Mmap(r.fd, _IORING_OFF_CQ_RING, cqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
			r.close()
			return nil, err
		}
	}
	if r.sqesMem, err = unix.Mmap(r.fd, _IORING_OFF_SQES, int(p.SqEntries)*ioURingSQESize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		r.close()
		return nil, err
	}
	u32 := func(mem []byte, off uint32) *uint32 { return (*uint32)(unsafe.Pointer(&mem[off])) }
	r.sqHead, r.sqTail = u32(r.sqMem, p.SqOff.Head), u32(r.sqMem, p.SqOff.Tail)
	r.sqMask, r.sqEntries = *u32(r.sqMem, p.SqOff.RingMask), p.SqEntries
	r.cqHead, r.cqTail = u32(r.cqMem, p.CqOff.Head), u32(r.cqMem, p.CqOff.Tail)
	r.cqMask = *u32(r.cqMem, p.CqOff.RingMask)
	r.cqes = unsafe.Pointer(&r.cqMem[p.CqOff.Cqes])
	// The SQ array maps ring slots to SQEs one to one, once for all.
	array := unsafe.Slice(u32(r.sqMem, p.SqOff.Array), p.SqEntries)
	for i := range array {
		array[i] = uint32(i)
	}
	r.tail = atomic.LoadUint32(r.sqTail)
	return r, nil
}

func (r *ioURing) close() {
	if r.sqesMem != nil {
		unix.Munmap(r.sqesMem)
	}
	if r.cqMem != nil && !r.singleMmap {
		unix.Munmap(r.cqMem)
	}
	if r.sqMem != nil {
		unix.Munmap(r.sqMem)
	}
	r.sqesMem, r.cqMem, r.sqMem = nil, nil, nil
	if r.fd >= 0 {
		unix.Close(r.fd)
		r.fd = -1
	}
}

// sqe returns the next free SQE, cleared, or nil if the SQ is full.
func (r *ioURing) sqe() []byte {
	if r.tail-atomic.LoadUint32(r.sqHead) >= r.sqEntries {
		return nil
	}
	off := int(r.tail&r.sqMask) * ioURingSQESize
	r.tail++
	s := r.sqesMem[off : off+ioURingSQESize]
	clear(s)
	return s
}

// enter submits the SQEs prepared since the last call and, if minComplete
// is not 0, runs the deferred task work and waits until that many CQEs are
// there, or until timeout (if not nil) has passed.
func (r *ioURing) enter(minComplete uint32, timeout *unix.Timespec) error {
	atomic.StoreUint32(r.sqTail, r.tail)
	for {
		toSubmit := r.tail - atomic.LoadUint32(r.sqHead)
		var flags, arg, argSize uintptr
		if minComplete > 0 {
			flags = _IORING_ENTER_GETEVENTS
		}
		// struct io_uring_getevents_arg {sigmask u64, sigmask_sz,
		// min_wait_usec u32, ts u64}.
		var ext [3]uint64
		if timeout != nil {
			ext[2] = uint64(uintptr(unsafe.Pointer(timeout)))
			flags |= _IORING_ENTER_EXT_ARG
			arg, argSize = uintptr(unsafe.Pointer(&ext)), unsafe.Sizeof(ext)
		}
		_, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(toSubmit), uintptr(minComplete), flags, arg, argSize)
		switch errno {
		case 0, syscall.ETIME:
			return nil
		case syscall.EINTR:
			// A signal (the Go runtime's preemption among them):
			// whatever was submitted is off the SQ; wait again.
			continue
		case syscall.EAGAIN, syscall.EBUSY:
			// No room for completions yet: the caller reaps, then
			// comes again.
			return nil
		default:
			return errno
		}
	}
}

// peek returns the result of the first CQE waiting, if any, and leaves it.
func (r *ioURing) peek() (int32, bool) {
	head := atomic.LoadUint32(r.cqHead)
	if atomic.LoadUint32(r.cqTail) == head {
		return 0, false
	}
	cqe := unsafe.Add(r.cqes, uintptr(head&r.cqMask)*ioURingCQESize)
	return *(*int32)(unsafe.Add(cqe, 8)), true
}

// reap calls f with each waiting CQE's user data and result, and frees them.
func (r *ioURing) reap(f func(userData uint64, res int32)) int {
	head := atomic.LoadUint32(r.cqHead)
	tail := atomic.LoadUint32(r.cqTail)
	n := 0
	for ; head != tail; head++ {
		cqe := unsafe.Add(r.cqes, uintptr(head&r.cqMask)*ioURingCQESize)
		ud := *(*uint64)(cqe)
		res := *(*int32)(unsafe.Add(cqe, 8))
		// Free the slot before f runs: f may prepare SQEs whose
		// completions need room.
		atomic.StoreUint32(r.cqHead, head+1)
		f(ud, res)
		n++
	}
	return n
}

func putU8(b []byte, off int, v uint8)   { b[off] = v }
func putU16(b []byte, off int, v uint16) { *(*uint16)(unsafe.Pointer(&b[off])) = v }
func putU32(b []byte, off int, v uint32) { *(*uint32)(unsafe.Pointer(&b[off])) = v }
func putU64(b []byte, off int, v uint64) { *(*uint64)(unsafe.Pointer(&b[off])) = v }
func getU32(b []byte, off int) uint32    { return *(*uint32)(unsafe.Pointer(&b[off])) }
func getU64(b []byte, off int) uint64    { return *(*uint64)(unsafe.Pointer(&b[off])) }
