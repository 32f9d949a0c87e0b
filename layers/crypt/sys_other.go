//go:build !linux

package crypt

import "golang.org/x/sys/unix"

// protectProcess: no PR_SET_DUMPABLE off Linux; the process dumps no core
// at all instead (RLIMIT_CORE 0), so keys never reach one. Another process
// of the same user may still attach a debugger (docs/portability.md).
func protectProcess() {
	unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{})
}
