// Copyright 2026 the cairn authors. All rights reserved.
// Use of this source code is governed by a BSD-style
// license that can be found in the LICENSE file.

//go:build !linux

package fuse

import "errors"

// FUSE over io_uring is Linux's.

type uringTransport struct {
	serving chan struct{}
}

func uringEnabled() (bool, error) {
	return false, errors.New("FUSE over io_uring needs Linux")
}

func (ms *Server) startURing() error         { return errors.New("FUSE over io_uring needs Linux") }
func (t *uringTransport) quit()              {}
func (t *uringTransport) registerAll() error { return nil }
func (t *uringTransport) stopRings()         {}
func (t *uringTransport) closeServing()      {}
