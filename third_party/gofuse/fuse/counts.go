package fuse

import "sync/atomic"

// requestCounts counts the requests served, by opcode (cairn: the daemon's
// own counters, for the request counts of issue 20; one atomic add per
// request).
type requestCounts struct {
	byOp  [_OPCODE_COUNT]atomic.Uint64
	other atomic.Uint64
}

func (c *requestCounts) add(op uint32) {
	if op < _OPCODE_COUNT {
		c.byOp[op].Add(1)
		return
	}
	c.other.Add(1)
}

// RequestCounts returns how many requests of each kind (by the opcode's
// name: "LOOKUP", "GETATTR", ...) the server has served since it started.
// Kinds never seen are left out.
func (ms *Server) RequestCounts() map[string]uint64 {
	out := map[string]uint64{}
	for op := range ms.counts.byOp {
		if n := ms.counts.byOp[op].Load(); n > 0 {
			out[operationName(uint32(op))] = n
		}
	}
	if n := ms.counts.other.Load(); n > 0 {
		out["OTHER"] = n
	}
	return out
}
