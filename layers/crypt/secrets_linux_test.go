package crypt

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/registry"
)

// TestSecretsInMemory: after unlock, the passphrase handed to the layer is
// cleared, the process cannot be dumped, and the raw keys are in a page
// that is locked and left out of core dumps.
func TestSecretsInMemory(t *testing.T) {
	dir, _ := newVolume(t, InitParams{})
	pass := bytes.Clone(testPass)
	typ, _ := registry.Lookup("crypt")
	l, _ := openLocal(t, dir)
	top, err := typ.New([]layer.FS{l}, registry.Values{"unlock": "passphrase", registry.SecretKey: pass})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(pass, make([]byte, len(pass))) {
		t.Error("the passphrase is still in memory after unlock")
	}
	if d, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0); err != nil || d != 0 {
		t.Errorf("the process is dumpable (%d, %v)", d, err)
	}
	key := uintptr(unsafe.Pointer(&top.(*FS).t.c.key[0]))
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	var flags string
	in := false
	for _, line := range strings.Split(string(smaps), "\n") {
		var lo, hi uintptr
		if n, _ := fmt.Sscanf(line, "%x-%x ", &lo, &hi); n == 2 && strings.Contains(line, " ") && !strings.HasPrefix(line, "VmFlags") {
			in = key >= lo && key < hi
		}
		if in && strings.HasPrefix(line, "VmFlags:") {
			flags = line
		}
	}
	keyMem.Lock()
	budgetLeft := keyMem.locked+4096 <= maxLocked
	keyMem.Unlock()
	if !strings.Contains(flags, " dd") || !strings.Contains(flags, " lo") && budgetLeft {
		t.Errorf("the content key's page: %q (want dd: not dumped, lo: locked)", flags)
	}
}
