package dfstest

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"cairnfs.dev/cairn/internal/mounttest"
)

// TwoSpecs returns the specs of the same stack (kind: null, crypt or zstd) over
// the same directory sub of the file system, reached through two clients' mounts
// a and b, after making (and for crypt initialising) the directory.
func TwoSpecs(t *testing.T, kind, a, b, sub string) (specA, specB string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(a, sub), 0o755); err != nil {
		t.Fatal(err)
	}
	pf := filepath.Join(t.TempDir(), "pass")
	if err := os.WriteFile(pf, []byte("two clients\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	spec := func(root string) string {
		s := "mount = \"top\"\n[layer.base]\ntype = \"local\"\npath = " + strconv.Quote(filepath.Join(root, sub)) + "\n[layer.top]\n"
		switch kind {
		case "null":
			return s + "type = \"null\"\nover = \"base\"\n"
		case "crypt":
			return s + "type = \"crypt\"\nover = \"base\"\npassfile = " + strconv.Quote(pf) + "\n"
		default:
			return s + "type = \"zstd\"\nover = \"base\"\nchunk_size = \"4KiB\"\nlevel = 1\n"
		}
	}
	specA, specB = spec(a), spec(b)
	if kind == "crypt" {
		sp := filepath.Join(t.TempDir(), "spec.toml")
		if err := os.WriteFile(sp, []byte(specA), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, code := mounttest.Run(t, "init", "-kdf", "scrypt", "-scrypt-n", "32768", sp); code != 0 {
			t.Fatalf("cairn init: %s", out)
		}
	}
	return specA, specB
}

// ClaimAcrossClients: a crypt or zstd stack keeps state of its lower's
// files in memory (layer.Claimer), so a second `cairn mount` of the same
// stack is refused: also through b, another client's mount of the file
// system a is on (as from another machine), whose lock of a regular file of
// the lower root (crypt's configuration, the codec's lock file) reaches the
// servers. -shared mounts share it, never with a mount without -shared;
// hand-over keeps every byte.
func ClaimAcrossClients(t *testing.T, a, b string) {
	for _, kind := range []string{"crypt", "zstd"} {
		t.Run(kind, func(t *testing.T) {
			sub := fmt.Sprintf("claim-%s-%d", kind, rand.Uint32())
			specA, specB := TwoSpecs(t, kind, a, b, sub)
			pa := mounttest.MountSpec(t, specA)
			if err := os.WriteFile(pa.Path("f"), []byte("written through client a"), 0o644); err != nil {
				t.Fatal(err)
			}
			sp := filepath.Join(t.TempDir(), "spec.toml")
			if err := os.WriteFile(sp, []byte(specB), 0o644); err != nil {
				t.Fatal(err)
			}
			mnt := t.TempDir()
			out, code := mounttest.Run(t, "mount", sp, mnt)
			if code == 0 {
				mounttest.Run(t, "umount", mnt)
				t.Fatalf("a second mount of the %s stack through another client was not refused", kind)
			}
			if !bytes.Contains([]byte(out), []byte("in use by another cairn process")) {
				t.Fatalf("the second mount failed, but not with the claim's message: %s", out)
			}
			// Mounts with -shared share the directory with each other, never
			// with one without it.
			pa.Unmount()
			ps := mounttest.MountSpec(t, specA, "-shared")
			if out, code := mounttest.Run(t, "mount", sp, mnt); code == 0 || !strings.Contains(out, "only mounts with -shared share it") {
				if code == 0 {
					mounttest.Run(t, "umount", mnt)
				}
				t.Fatalf("a mount without -shared through another client, while a -shared one runs: exit %d: %s", code, out)
			}
			pss := mounttest.MountSpec(t, specB, "-shared")
			if got, err := os.ReadFile(pss.Path("f")); err != nil || string(got) != "written through client a" {
				t.Fatalf("the second -shared mount reads %q, %v", got, err)
			}
			pss.Unmount()
			ps.Unmount()
			// Hand-over: once a unmounts, b mounts and reads every byte.
			pb := mounttest.MountSpec(t, specB)
			got, err := os.ReadFile(pb.Path("f"))
			if err != nil || string(got) != "written through client a" {
				t.Fatalf("after the hand-over, b reads %q, %v", got, err)
			}
			// The claim's lock file is not shown.
			if ents, err := os.ReadDir(pb.Dir); err != nil || len(ents) != 1 || ents[0].Name() != "f" {
				t.Fatalf("the stack's root holds %v (%v), want only f", ents, err)
			}
		})
	}
}
