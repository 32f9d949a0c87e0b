// Copyright 2026 the cairn authors. All rights reserved.
// Use of this source code is governed by a BSD-style
// license that can be found in the LICENSE file.

package fuse

import (
	"errors"
	"fmt"
)

// The choice of transport at mount (a cairn addition, see FORK.md); the
// transport itself is in uring_linux.go.

var errURingOff = errors.New("FUSE over io_uring is off in the kernel: turn it on with 'echo Y > /sys/module/fuse/parameters/enable_uring' (as root), or mount over /dev/fuse")

// setupURing makes the rings before INIT, where the mount asks for them,
// and offers FUSE_OVER_IO_URING in the reply if they exist.
func (ms *Server) setupURing() error {
	ms.transport = TransportDevFuse
	switch ms.opts.Transport {
	case TransportDevFuse:
		return nil
	case TransportAuto:
		if on, _ := uringEnabled(); !on {
			return nil
		}
	}
	err := ms.startURing()
	if err == nil {
		ms.opts.ExtraCapabilities |= CAP_OVER_IO_URING
		return nil
	}
	if ms.opts.Transport == TransportIOUring {
		return err
	}
	ms.opts.Logger.Printf("FUSE over io_uring: %v; serving over /dev/fuse", err)
	return nil
}

// registerURing registers the rings' entries with the kernel once INIT is
// answered, if the kernel took FUSE_OVER_IO_URING.
func (ms *Server) registerURing() error {
	t := ms.uring
	if t == nil {
		return nil
	}
	required := ms.opts.Transport == TransportIOUring
	if ms.negotiatedFlags&CAP_OVER_IO_URING == 0 {
		t.quit()
		if required {
			return fmt.Errorf("the kernel did not offer FUSE over io_uring at INIT: %w", errURingOff)
		}
		return nil
	}
	if err := t.registerAll(); err != nil {
		// The kernel serves over /dev/fuse after a refused
		// registration.
		t.quit()
		if required {
			return fmt.Errorf("FUSE over io_uring: %w", err)
		}
		ms.opts.Logger.Printf("FUSE over io_uring: %v; serving over /dev/fuse", err)
		return nil
	}
	ms.transport = TransportIOUring
	return nil
}
