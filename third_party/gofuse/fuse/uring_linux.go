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
// Each ring has one entry, on one queue, and belongs to a goroutine locked
// to its OS thread, which alone submits and waits (the kernel runs an
// entry's task work, the copy of a request into its buffers, on the thread
// that submitted its command, and cancels the commands of a thread that
// exits). The thread waits in io_uring_enter, serves the request inline,
// and sends the reply with the fetch of the next request in its next
// io_uring_enter: one system call a request, and no hand-off between
// threads (a ring that handed requests to goroutines, and took the replies
// back, cost several thread wake-ups a request). Serving inline would hold
// up the queue's other requests while one blocks: a queue gets another ring
// when its last waiting one takes a request, as go-fuse starts another
// reader of /dev/fuse before it serves one.

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	uringMaxPerQueue    = 64 // rings (threads, entries) per queue at most
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
	queues    []*uringQueue
	first     []*fuseRing   // one per queue, made before INIT
	serving   chan struct{} // closed by Serve: requests may be handled
	serveOnce sync.Once
	stop      atomic.Bool
}

// uringQueue is one of the kernel's queues (a CPU's) and its rings.
type uringQueue struct {
	qid      uint16
	idle     atomic.Int32 // rings whose entry waits in the kernel for a request
	count    atomic.Int32 // rings
	spawning atomic.Bool  // a ring is being added
}

// uringEnt is a ring's entry: its buffers and where it stands.
type uringEnt struct {
	mem      []byte // the header page, then the payload
	iov      [2]unix.Iovec
	commitID uint64
	lastCmd  uint32
}

func (e *uringEnt) header() []byte  { return e.mem[:uringHeaderSize] }
func (e *uringEnt) payload() []byte { return e.mem[pageSize:] }

// fuseRing is one ring, with one entry, on one queue, owned by one
// goroutine locked to its thread. The thread waits for a request in
// io_uring_enter, serves it inline and sends the reply with the fetch of
// the next request in the next io_uring_enter: one system call a request.
// A queue gets another ring when its last waiting one takes a request, so
// that a request that blocks never holds up the others (as go-fuse starts
// another reader of /dev/fuse before it serves a request).
type fuseRing struct {
	t      *uringTransport
	q      *uringQueue
	r      *ioURing
	e      *uringEnt
	fuseFd int

	early    bool       // a request came with the registration
	setup    chan error // the ring's creation, then its registration (first rings)
	register chan bool  // true: register the entry; false: go away
}

// startURing creates a ring for every queue, each on a locked thread of
// its own, before INIT, so that FUSE_OVER_IO_URING is offered in the reply
// only if they exist.
func (ms *Server) startURing() error {
	nq, err := uringQueues()
	if err != nil {
		return err
	}
	t := &uringTransport{ms: ms, serving: make(chan struct{})}
	ms.fuseFD.withFD(func(fd int) {
		for q := 0; q < nq; q++ {
			uq := &uringQueue{qid: uint16(q)}
			uq.count.Store(1)
			t.queues = append(t.queues, uq)
			t.first = append(t.first, &fuseRing{t: t, q: uq, fuseFd: fd, setup: make(chan error, 1), register: make(chan bool, 1)})
		}
	})
	for _, fr := range t.first {
		ms.fuseFD.loops.Add(1)
		go fr.run()
	}
	for _, fr := range t.first {
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
	t.stop.Store(true)
	for _, fr := range t.first {
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
	for _, fr := range t.first {
		fr.register <- true
	}
	var err error
	for _, fr := range t.first {
		if e := <-fr.setup; e != nil && err == nil {
			err = e
		}
	}
	return err
}

// stopRings makes the rings close: the connection is gone. (The kernel
// also completes their commands with ENOTCONN; a ring that waits sees the
// flag within a second otherwise.)
func (t *uringTransport) stopRings() {
	t.stop.Store(true)
}

func (fr *fuseRing) run() {
	ms := fr.t.ms
	defer ms.fuseFD.loops.Done()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	first := fr.setup != nil
	r, err := newIOURing(4, _IORING_SETUP_SUBMIT_ALL|_IORING_SETUP_SINGLE_ISSUER|_IORING_SETUP_DEFER_TASKRUN)
	if first {
		fr.setup <- err
		if err == nil && !<-fr.register {
			err = errStop
		}
	}
	if err != nil {
		if r != nil {
			r.close()
		}
		if !first {
			fr.q.spawning.Store(false)
		}
		fr.q.count.Add(-1)
		return
	}
	fr.r = r
	defer r.close()
	fr.e = newURingEnt(ms.opts.MaxWrite)
	fr.prepare()
	fr.q.idle.Add(1)
	err = fr.r.enter(0, nil)
	if err == nil {
		// A registration that fails completes at once; a request
		// may be there already too, for loop.
		if res, ok := fr.r.peek(); ok && res < 0 {
			err = fmt.Errorf("FUSE_IO_URING_CMD_REGISTER: %w", syscall.Errno(-res))
		} else {
			fr.early = ok
		}
	}
	if first {
		fr.setup <- err
	} else {
		fr.q.spawning.Store(false)
		if err != nil {
			ms.opts.Logger.Printf("fuse io_uring: another ring for qid %d: %v", fr.q.qid, err)
		}
	}
	if err != nil {
		fr.q.idle.Add(-1)
		fr.q.count.Add(-1)
		return
	}
	<-fr.t.serving
	fr.loop()
	fr.q.count.Add(-1)
}

var errStop = fmt.Errorf("stopped")

// newURingEnt allocates an entry's buffers.
func newURingEnt(maxWrite int) *uringEnt {
	e := &uringEnt{}
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
	return e
}

// prepare writes the SQE of the entry's command: its registration, or the
// commit of its reply with the fetch of the next request.
func (fr *fuseRing) prepare() {
	e := fr.e
	s := fr.r.sqe()
	putU8(s, ioURingSQEOpcodeOffset, _IORING_OP_URING_CMD)
	putU32(s, ioURingSQEFdOffset, uint32(fr.fuseFd))
	putU32(s, ioURingSQECmdOpOffset, e.lastCmd)
	// struct fuse_uring_cmd_req {flags u64, commit_id u64, qid u16}.
	if e.lastCmd == _FUSE_IO_URING_CMD_REGISTER {
		putU64(s, ioURingSQEAddrOffset, uint64(uintptr(unsafe.Pointer(&e.iov[0]))))
		putU32(s, ioURingSQELenOffset, 2)
	} else {
		putU64(s, ioURingSQECmdOffset+8, e.commitID)
	}
	putU16(s, ioURingSQECmdOffset+16, fr.q.qid)
}

// spawn adds a ring to the queue, if it has none waiting.
func (fr *fuseRing) spawn() {
	q := fr.q
	if q.idle.Load() > 0 || q.count.Load() >= uringMaxPerQueue || !q.spawning.CompareAndSwap(false, true) {
		return
	}
	q.count.Add(1)
	nr := &fuseRing{t: fr.t, q: q, fuseFd: fr.fuseFd}
	fr.t.ms.fuseFD.loops.Add(1)
	go nr.run()
}

func (fr *fuseRing) loop() {
	ms := fr.t.ms
	e := fr.e
	pending := fr.early // the first request is in already
	for {
		if !pending {
			if fr.t.stop.Load() {
				return
			}
			// Sends the reply, if any, and waits for the next
			// request (a second at most, to see the stop flag).
			if err := fr.r.enter(1, &uringWaitTimeout); err != nil {
				ms.opts.Logger.Printf("io_uring_enter: %v", err)
				fr.q.idle.Add(-1)
				return
			}
		}
		pending = false
		var res int32
		got := false
		fr.r.reap(func(_ uint64, r int32) { res, got = r, true })
		if !got {
			continue // the timeout
		}
		fr.q.idle.Add(-1)
		switch errno := syscall.Errno(-res); {
		case res == 0:
			e.commitID = getU64(e.header(), uringCommitIDOff)
			fr.spawn()
			ms.serveURing(e)
			e.lastCmd = _FUSE_IO_URING_CMD_COMMIT_AND_FETCH
		case errno == syscall.EAGAIN || errno == syscall.EINTR:
		case errno == syscall.ENOTCONN || errno == syscall.ECONNABORTED || errno == syscall.ECANCELED || errno == syscall.ENODEV:
			// The connection is going.
			return
		default:
			ms.opts.Logger.Printf("fuse io_uring: qid %d cmd %d: %v", fr.q.qid, e.lastCmd, errno)
			if e.lastCmd != _FUSE_IO_URING_CMD_COMMIT_AND_FETCH {
				return
			}
			// The kernel lost the entry's request (a commit it
			// did not find): register the buffers again.
			e.lastCmd = _FUSE_IO_URING_CMD_REGISTER
		}
		fr.prepare()
		fr.q.idle.Add(1)
	}
}

var uringWaitTimeout = unix.Timespec{Sec: 1}

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
