package codec

import (
	"bytes"
	"context"
	"syscall"
	"testing"

	"cairnfs.dev/cairn/internal/mounttest"
)

// TestCapabilitySurvivesLastClose: setcap(8) on a file that is still open
// (the kernel sends the last close, RELEASE, after close(2) returns, so a
// shell's `echo x > f && setcap ... f` races with it) must not lose the
// capability to the engine's writes at that last close: the lower file
// system drops security.capability at every write.
func TestCapabilitySurvivesLastClose(t *testing.T) {
	mounttest.NeedRoot(t) // security.capability is root's
	ctx := context.Background()
	// cap_net_raw+ep, VFS_CAP_REVISION_2.
	capv := []byte{0x01, 0x00, 0x00, 0x02, 0x00, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	for _, name := range []string{"zstd", "gzip", "copy"} {
		t.Run(name, func(t *testing.T) {
			_, fs := newStack(t, name, Options{})
			f, _, err := fs.Create(ctx, "f", syscall.O_WRONLY, 0o755)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt(ctx, []byte("#!/bin/sh\necho x\n"), 0); err != nil {
				t.Fatal(err)
			}
			if err := f.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			if err := fs.Setxattr(ctx, "f", "security.capability", capv, 0); err != nil {
				t.Fatal(err)
			}
			if err := f.Release(ctx); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, 64)
			n, err := fs.Getxattr(ctx, "f", "security.capability", got)
			if err != nil {
				t.Fatalf("security.capability after the last close: %v", err)
			}
			if !bytes.Equal(got[:n], capv) {
				t.Fatalf("security.capability = %x, want %x", got[:n], capv)
			}
		})
	}
}
