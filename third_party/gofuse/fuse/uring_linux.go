// Copyright 2026 the cairn authors. All rights reserved.
// Use of this source code is governed by a BSD-style
// license that can be found in the LICENSE file.

package fuse

// FUSE over io_uring (Linux 6.14+, fs/fuse/dev_uring.c; a cairn addition,
// see FORK.md). The kernel keeps one queue of requests per possible CPU and
// sends a request to the queue of the CPU its caller runs on. The server
// registers ring entries (a header buffer and a payload buffer each) on
// every queue with IORING_OP_URING_CMD on the /dev/fuse fd; a request
// arrives as the completion of an entry's command, and the reply goes back,
// with the fetch of the entry's next request, in one COMMIT_AND_FETCH
// command. Until every queue has an entry the kernel holds requests back;
// then all go over the rings, except FORGETs and INTERRUPTs, which still
// come through /dev/fuse reads, and notifications, which the server still
// writes to /dev/fuse.
//
// Each ring belongs to a goroutine locked to its OS thread, which alone
// submits and waits (the kernel runs an entry's task work, the copy of a
// request into its buffers, on the thread that submitted its command, and
// cancels the commands of a thread that exits). It serves a share of the
// queues, hands each request to a goroutine of its own (requests may
// block, as over /dev/fuse), and takes the replies back from a list, woken
// through an eventfd when it sleeps.

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// From include/uapi/linux/fuse.h.
const (
	_FUSE_IO_URING_CMD_REGISTER         = 1
	_FUSE_IO_URING_CMD_COMMIT_AND_FETCH = 2

	// struct fuse_uring_req_header: in_out[128] (fuse_in_header in,
	// fuse_out_header out), op_in[128] (the request's first argument),
	// struct fuse_uring_ent_in_out {flags, commit_id u64; payload_sz,
	// padding u32; reserved u64}.
	uringHeaderSize     = 288
	uringOpInOffset     = 128
	uringOpInSize       = 128
	uringCommitIDOff    = 256 + 8
	uringPayloadSzOff   = 256 + 16
	uringEnableParam    = "/sys/module/fuse/parameters/enable_uring"
	uringInitialDepth   = 2   // entries per queue at first
	uringSpare          = 1   // entries kept waiting per queue: more are registered below this
	uringMaxDepth       = 128 // entries per queue at most
	sizeOfInHeaderUring = 40
)

// uringEnabled reads the fuse module's enable_uring parameter, which the
// kernel reads at each mount's INIT.
func uringEnabled() (bool, error) {
	b, err := os.ReadFile(uringEnableParam)
	if err != nil {
		return false, fmt.Errorf("this kernel has no FUSE over io_uring (%s: %w); it needs Linux 6.14 or later built with CONFIG_FUSE_IO_URING", uringEnableParam, err)
	}
	return strings.TrimSpace(string(b)) == "Y", nil
}

// uringQueues is the number of the kernel's queues: one per possible CPU
// (num_possible_cpus), which /sys/devices/system/cpu/possible lists.
func uringQueues() (int, error) {
	b, err := os.ReadFile("/sys/devices/system/cpu/possible")
	if err != nil {
		return 0, err
	}
	n := 0
	for _, r := range strings.Split(strings.TrimSpace(string(b)), ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return 0, fmt.Errorf("cpu/possible %q: %w", b, err)
		}
		z := a
		if isRange {
			if z, err = strconv.Atoi(hi); err != nil {
				return 0, fmt.Errorf("cpu/possible %q: %w", b, err)
			}
		}
		n += z - a + 1
	}
	if n < 1 || n > 1<<16 {
		return 0, fmt.Errorf("cpu/possible %q: %d CPUs", b, n)
	}
	return n, nil
}

type uringTransport struct {
	ms        *Server
	rings     []*fuseRing
	serving   chan struct{} // closed by Serve: requests may be handled
	serveOnce sync.Once
}

// uringEnt is one ring entry: its buffers and where it stands.
type uringEnt struct {
	ring     *fuseRing
	qi       int // index of its queue in ring.qids
	id       uint64
	mem      []byte // the header page, then the payload
	iov      [2]unix.Iovec
	commitID uint64
	lastCmd  uint32
	dead     bool
}

func (e *uringEnt) header() []byte  { return e.mem[:uringHeaderSize] }
func (e *uringEnt) payload() []byte { return e.mem[pageSize:] }

type fuseRing struct {
	t        *uringTransport
	qids     []uint16
	avail    []int // per queue: entries whose command waits in the kernel
	count    []int // per queue: entries registered
	ents     []*uringEnt
	live     int
	r        *ioURing
	efd      int      // the ring's eventfd: completions, and replies to send
	efdFile  *os.File // efd, read through Go's netpoller
	toSubmit []*uringEnt

	setup    chan error // the ring's creation, then its registration
	register chan bool  // true: register the entries; false: go away

	mu       sync.Mutex
	done     []*uringEnt // entries whose replies are ready
	sleeping bool        // waiting for efd: a reply wakes it
	stop     bool        // asked to stop
	stopped  bool        // gone: replies are dropped
}

// startURing creates the rings, each on a locked thread of its own, before
// INIT, so that FUSE_OVER_IO_URING is offered in the reply only if they
// exist.
func (ms *Server) startURing() error {
	nq, err := uringQueues()
	if err != nil {
		return err
	}
	nr := min(nq, max(1, runtime.NumCPU()))
	t := &uringTransport{ms: ms, serving: make(chan struct{})}
	for i := 0; i < nr; i++ {
		fr := &fuseRing{t: t, efd: -1, setup: make(chan error, 1), register: make(chan bool, 1)}
		for q := i; q < nq; q += nr {
			fr.qids = append(fr.qids, uint16(q))
		}
		fr.avail = make([]int, len(fr.qids))
		fr.count = make([]int, len(fr.qids))
		t.rings = append(t.rings, fr)
	}
	for _, fr := range t.rings {
		ms.fuseFD.loops.Add(1)
		go fr.run()
	}
	for _, fr := range t.rings {
		if e := <-fr.setup; e != nil && err == nil {
			err = e
		}
	}
	ms.uring = t
	if err != nil {
		t.quit()
		return fmt.Errorf("io_uring: %w", err)
	}
	return nil
}

// quit ends rings that serve nothing.
func (t *uringTransport) quit() {
	t.stopRings()
	for _, fr := range t.rings {
		select {
		case fr.register <- false:
		default:
		}
	}
	t.closeServing()
	t.ms.uring = nil
}

// closeServing lets the rings handle requests (or see that they are to stop).
func (t *uringTransport) closeServing() {
	t.serveOnce.Do(func() { close(t.serving) })
}

// registerAll registers the entries of every queue, once INIT is
// answered; the kernel refuses a registration at once, or not at all.
func (t *uringTransport) registerAll() error {
	for _, fr := range t.rings {
		fr.register <- true
	}
	var err error
	for _, fr := range t.rings {
		if e := <-fr.setup; e != nil && err == nil {
			err = e
		}
	}
	return err
}

// stopRings makes the rings close: the connection is gone.
func (t *uringTransport) stopRings() {
	for _, fr := range t.rings {
		fr.mu.Lock()
		fr.stop = true
		fr.wakeLocked()
		fr.mu.Unlock()
	}
}

func (fr *fuseRing) wakeLocked() {
	if fr.sleeping && !fr.stopped {
		fr.sleeping = false
		var one [8]byte
		one[0] = 1
		unix.Write(fr.efd, one[:])
	}
}

func (fr *fuseRing) run() {
	ms := fr.t.ms
	defer ms.fuseFD.loops.Done()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	sq := uint32(1)
	for sq < uint32(len(fr.qids)*uringMaxDepth+1) {
		sq <<= 1
	}
	r, err := newIOURing(sq, _IORING_SETUP_SUBMIT_ALL|_IORING_SETUP_SINGLE_ISSUER|_IORING_SETUP_DEFER_TASKRUN)
	if err == nil {
		fr.r = r
		fr.efd, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	}
	if err == nil {
		// The kernel signals it for every completion (and, with
		// DEFER_TASKRUN, for task work to run); the thread waits
		// for it in Go's netpoller, not in io_uring_enter, so that
		// it holds no P while it waits (see loop).
		fr.efdFile = os.NewFile(uintptr(fr.efd), "eventfd")
		_, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(r.fd), _IORING_REGISTER_EVENTFD, uintptr(unsafe.Pointer(&fr.efd)), 1, 0, 0)
		if errno != 0 {
			err = fmt.Errorf("IORING_REGISTER_EVENTFD: %w", errno)
		}
	}
	fr.setup <- err
	if err != nil || !<-fr.register {
		fr.close()
		return
	}

	fuseFd := -1
	ms.fuseFD.withFD(func(fd int) { fuseFd = fd })
	for qi := range fr.qids {
		for i := 0; i < uringInitialDepth; i++ {
			fr.newEnt(qi)
		}
	}
	fr.prepare(fuseFd)
	err = fr.r.enter(0, false)
	if err == nil {
		// A registration that fails completes at once.
		head := *fr.r.cqHead
		for n := fr.r.ready(); n > 0; n-- {
			cqe := unsafe.Add(fr.r.cqes, uintptr(head&fr.r.cqMask)*ioURingCQESize)
			ud, res := *(*uint64)(cqe), *(*int32)(unsafe.Add(cqe, 8))
			if res < 0 && fr.ents[ud].lastCmd == _FUSE_IO_URING_CMD_REGISTER {
				err = fmt.Errorf("FUSE_IO_URING_CMD_REGISTER: %w", syscall.Errno(-res))
				break
			}
			head++
		}
	}
	fr.setup <- err
	if err != nil {
		fr.close()
		return
	}
	<-fr.t.serving
	fr.loop(fuseFd)
	fr.close()
}

// newEnt makes an entry for queue qi; its REGISTER goes with the next
// submission.
func (fr *fuseRing) newEnt(qi int) {
	e := &uringEnt{ring: fr, qi: qi, id: uint64(len(fr.ents))}
	maxWrite := fr.t.ms.opts.MaxWrite
	maxPages := (maxWrite-1)/pageSize + 1
	// The kernel wants room for max(8k, max_write, max_pages pages).
	payload := max(_FUSE_MIN_READ_BUFFER, maxWrite, maxPages*pageSize)
	// Page aligned, so that WRITE data (the payload's start) is too.
	raw := make([]byte, pageSize+pageSize+payload)
	off := int(-uintptr(unsafe.Pointer(&raw[0]))) & (pageSize - 1)
	e.mem = raw[off : off+pageSize+payload]
	e.iov[0].Base = &e.mem[0]
	e.iov[0].SetLen(uringHeaderSize)
	e.iov[1].Base = &e.mem[pageSize]
	e.iov[1].SetLen(payload)
	e.lastCmd = _FUSE_IO_URING_CMD_REGISTER
	fr.ents = append(fr.ents, e)
	fr.count[qi]++
	fr.live++
	fr.toSubmit = append(fr.toSubmit, e)
}

// prepare writes the SQEs of the entries to submit.
func (fr *fuseRing) prepare(fuseFd int) {
	for _, e := range fr.toSubmit {
		s := fr.r.sqe()
		if s == nil {
			// Cannot be: the SQ has room for every entry.
			panic("fuse: io_uring SQ full")
		}
		putU8(s, ioURingSQEOpcodeOffset, _IORING_OP_URING_CMD)
		putU32(s, ioURingSQEFdOffset, uint32(fuseFd))
		putU32(s, ioURingSQECmdOpOffset, e.lastCmd)
		putU64(s, ioURingSQEUserDataOffset, e.id)
		// struct fuse_uring_cmd_req {flags u64, commit_id u64, qid u16}.
		if e.lastCmd == _FUSE_IO_URING_CMD_REGISTER {
			putU64(s, ioURingSQEAddrOffset, uint64(uintptr(unsafe.Pointer(&e.iov[0]))))
			putU32(s, ioURingSQELenOffset, 2)
		} else {
			putU64(s, ioURingSQECmdOffset+8, e.commitID)
		}
		putU16(s, ioURingSQECmdOffset+16, fr.qids[e.qi])
		fr.avail[e.qi]++
	}
	fr.toSubmit = fr.toSubmit[:0]
}

// loop serves until the connection goes. It waits for the eventfd in Go's
// netpoller: a goroutine that waited in io_uring_enter would keep its P
// while blocked, and the request goroutines it starts would wait for the
// runtime to take that P back (up to 10 ms) where the other Ps are busy (a
// process that serves its own mount: its callers hold them, blocked in
// their system calls). Each wake-up submits the replies ready, runs the
// kernel's deferred task work (which copies requests into the entries)
// and takes the completions.
func (fr *fuseRing) loop(fuseFd int) {
	ms := fr.t.ms
	var buf [8]byte
	for fr.live > 0 {
		fr.mu.Lock()
		for _, e := range fr.done {
			e.lastCmd = _FUSE_IO_URING_CMD_COMMIT_AND_FETCH
		}
		fr.toSubmit = append(fr.toSubmit, fr.done...)
		fr.done = fr.done[:0]
		stop := fr.stop
		idle := len(fr.toSubmit) == 0 && !stop
		fr.sleeping = idle
		fr.mu.Unlock()
		if stop {
			return
		}
		if idle {
			// Whatever signalled it before this read has been
			// seen below; whatever comes after makes it readable.
			_, err := fr.efdFile.Read(buf[:])
			fr.mu.Lock()
			fr.sleeping = false
			fr.mu.Unlock()
			if err != nil {
				ms.opts.Logger.Printf("fuse io_uring: eventfd: %v", err)
				return
			}
		}
		fr.prepare(fuseFd)
		if err := fr.r.enter(0, true); err != nil {
			ms.opts.Logger.Printf("io_uring_enter: %v", err)
			return
		}
		fr.r.reap(func(ud uint64, res int32) {
			e := fr.ents[ud]
			switch errno := syscall.Errno(-res); {
			case res == 0:
				e.commitID = getU64(e.header(), uringCommitIDOff)
				fr.avail[e.qi]--
				// Keep entries waiting on the queue: a request that
				// finds none is queued until a reply fetches it.
				if fr.avail[e.qi] < uringSpare && fr.count[e.qi] < uringMaxDepth {
					fr.newEnt(e.qi)
				}
				// Counted as the readers are: Serve and Unmount
				// wait for the requests in progress.
				ms.fuseFD.loops.Add(1)
				go ms.serveURing(e)
			case errno == syscall.EAGAIN || errno == syscall.EINTR:
				fr.avail[e.qi]--
				fr.toSubmit = append(fr.toSubmit, e)
			case errno == syscall.ENOTCONN || errno == syscall.ECONNABORTED || errno == syscall.ECANCELED || errno == syscall.ENODEV:
				// The connection is going: the entry is done.
				fr.avail[e.qi]--
				e.dead = true
				fr.live--
			default:
				// The kernel lost the entry's request (a commit it
				// did not find): register the buffers again.
				ms.opts.Logger.Printf("fuse io_uring: qid %d cmd %d: %v", fr.qids[e.qi], e.lastCmd, errno)
				fr.avail[e.qi]--
				if e.lastCmd == _FUSE_IO_URING_CMD_COMMIT_AND_FETCH {
					e.lastCmd = _FUSE_IO_URING_CMD_REGISTER
					fr.toSubmit = append(fr.toSubmit, e)
				} else {
					e.dead = true
					fr.live--
				}
			}
		})
	}
}

// close gives the ring up: the kernel cancels the commands still in it.
func (fr *fuseRing) close() {
	fr.mu.Lock()
	fr.stopped = true
	fr.done = nil
	if fr.efdFile != nil {
		fr.efdFile.Close()
	} else if fr.efd >= 0 {
		unix.Close(fr.efd)
	}
	fr.efd = -1
	fr.mu.Unlock()
	if fr.r != nil {
		fr.r.close()
	}
}

// commit hands a replied entry back to its ring.
func (fr *fuseRing) commit(e *uringEnt) {
	fr.mu.Lock()
	if !fr.stopped {
		fr.done = append(fr.done, e)
		fr.wakeLocked()
	}
	fr.mu.Unlock()
}

// serveURing serves the request in e and puts the reply in its buffers.
func (ms *Server) serveURing(e *uringEnt) {
	hdr := e.header()
	payloadSz := int(getU32(hdr, uringPayloadSzOff))
	in := (*InHeader)(unsafe.Pointer(&hdr[0]))
	opSz := int(in.Length) - sizeOfInHeaderUring - payloadSz
	if opSz < 0 || opSz > uringOpInSize || payloadSz > len(e.payload()) {
		ms.opts.Logger.Printf("fuse io_uring: bad request: op %d len %d payload %d", in.Opcode, in.Length, payloadSz)
		opSz, payloadSz = 0, 0
	}
	// The request as /dev/fuse would have it: the header and the first
	// argument are put right before the payload, which the kernel wrote
	// at the start of its buffer.
	start := pageSize - sizeOfInHeaderUring - opSz
	copy(e.mem[start:], hdr[:sizeOfInHeaderUring])
	copy(e.mem[start+sizeOfInHeaderUring:], hdr[uringOpInOffset:uringOpInOffset+opSz])

	req := ms.reqPool.Get().(*requestAlloc)
	req.inputBuf = e.mem[start : pageSize+payloadSz]
	if ms.opts.SingleThreaded {
		ms.requestProcessingMu.Lock()
	}
	reply := ms.serveRequest(req)
	e.setReply(&req.request, reply)
	if ms.opts.SingleThreaded {
		ms.requestProcessingMu.Unlock()
	}

	if req.bufferPoolOutputBuf != nil {
		ms.buffers.FreeBuffer(req.bufferPoolOutputBuf)
		req.bufferPoolOutputBuf = nil
	}
	if req.interrupted {
		req.interrupted = false
		req.cancel = make(chan struct{})
	}
	req.clear()
	ms.reqPool.Put(req)
	e.ring.commit(e)
	ms.fuseFD.loops.Done()
}

// setReply puts req's reply in e: the out header in the header buffer,
// everything after it in the payload. A request that has no reply (a
// NOTIFY_REPLY) is committed all the same, with nothing, to free the entry.
func (e *uringEnt) setReply(req *request, reply bool) {
	hdr := e.header()
	payload := e.payload()
	unique := req.inHeader().Unique
	st := OK
	n := 0
	if reply {
		st = req.status
	}
	if reply && st.Ok() {
		n = copy(payload, req.outDataBuf)
		if rr := req.readResult; rr != nil {
			if ws, ok := rr.(withSlice); ok {
				var slices [][]byte
				if slices, st = ws.Slices(); st.Ok() {
					for _, s := range slices {
						n += copy(payload[n:], s)
					}
				}
			} else {
				var b []byte
				if b, st = rr.Bytes(payload[n:]); st.Ok() {
					n += copy(payload[n:], b)
				}
			}
			rr.Done()
			req.readResult = nil
		} else {
			if len(req.outPayload) > len(payload)-n {
				st = ERANGE
			}
			n += copy(payload[n:], req.outPayload)
		}
	} else if req.readResult != nil {
		req.readResult.Done()
		req.readResult = nil
	}
	if !st.Ok() {
		n = 0
	}
	out := (*OutHeader)(unsafe.Pointer(&hdr[0]))
	out.Length = uint32(int(sizeOfOutHeader) + n)
	out.Status = int32(-st)
	out.Unique = unique
	putU32(hdr, uringPayloadSzOff, uint32(n))
}
