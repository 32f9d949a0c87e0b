// Package opencost times the loops of the open-cost benchmarks (MonA's
// Figures 6 to 8): opens and closes, and whole-file writes and reads each
// with its own open and close. bench/harness and bench/chainsbench use it.
package opencost

import (
	"fmt"
	"syscall"
	"time"
)

// OpenClose opens and closes names in turn, n opens in all: the seconds
// per open and close.
func OpenClose(names []string, n int) (float64, error) {
	t0 := time.Now()
	for j := 0; j < n; j++ {
		fd, err := syscall.Open(names[j%len(names)], syscall.O_RDONLY, 0)
		if err != nil {
			return 0, fmt.Errorf("open: %v", err)
		}
		syscall.Close(fd)
	}
	return time.Since(t0).Seconds() / float64(n), nil
}

// OpenWriteClose makes p hold buf n times over (open with O_TRUNC, one
// write, close): the seconds per round.
func OpenWriteClose(p string, buf []byte, n int) (float64, error) {
	t0 := time.Now()
	for j := 0; j < n; j++ {
		fd, err := syscall.Open(p, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_TRUNC, 0o644)
		if err != nil {
			return 0, fmt.Errorf("open: %v", err)
		}
		if _, err := syscall.Write(fd, buf); err != nil {
			syscall.Close(fd)
			return 0, fmt.Errorf("write: %v", err)
		}
		syscall.Close(fd)
	}
	return time.Since(t0).Seconds() / float64(n), nil
}

// OpenReadClose reads p whole into buf n times (open, reads, close): the
// seconds per round.
func OpenReadClose(p string, buf []byte, n int) (float64, error) {
	t0 := time.Now()
	for j := 0; j < n; j++ {
		fd, err := syscall.Open(p, syscall.O_RDONLY, 0)
		if err != nil {
			return 0, fmt.Errorf("open: %v", err)
		}
		for got := 0; got < len(buf); {
			r, err := syscall.Read(fd, buf[got:])
			if err != nil || r == 0 {
				syscall.Close(fd)
				return 0, fmt.Errorf("read: %d bytes of %d: %v", got, len(buf), err)
			}
			got += r
		}
		syscall.Close(fd)
	}
	return time.Since(t0).Seconds() / float64(n), nil
}
