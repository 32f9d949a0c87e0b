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
	"cairnfs.dev/cairn/layers/chains"
	"cairnfs.dev/cairn/layers/replica"
	"cairnfs.dev/cairn/layers/shard"
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

// exclusiveSpec is the spec of a union, shard, chains or replica stack
// (kind) over directory sub of the file system reached through root (a
// client's mount), making the directories it needs; locks are where the
// claim's lock files are, under sub.
func exclusiveSpec(t *testing.T, kind, root, sub string) (spec string, locks []string) {
	t.Helper()
	base := filepath.Join(root, sub)
	local := func(name, dir string) string {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		return "[layer." + name + "]\ntype = \"local\"\npath = " + strconv.Quote(dir) + "\n"
	}
	switch kind {
	case "union":
		return "mount = \"top\"\n" + local("up", filepath.Join(base, "upper")) + local("lo", filepath.Join(base, "lower")) +
				"[layer.top]\ntype = \"union\"\nover = [\"up\", \"lo\"]\n",
			[]string{"upper/.cairn-union-index/lock"}
	case "replica":
		return "mount = \"top\"\n" + local("r1", filepath.Join(base, "r1")) + local("r2", filepath.Join(base, "r2")) +
				"[layer.top]\ntype = \"replica\"\nover = [\"r1\", \"r2\"]\n",
			[]string{"r1/" + replica.LockName, "r2/" + replica.LockName}
	case "shard":
		return "mount = \"top\"\n" + local("base", base) + "[layer.top]\ntype = \"shard\"\nover = \"base\"\n",
			[]string{shard.LockName}
	default: // chains: f is zstd-encoded
		return "mount = \"top\"\n" + local("base", base) + "[layer.top]\ntype = \"chains\"\nover = \"base\"\n" +
				"[[rule]]\nlayer = \"top\"\nmatch = \"f\"\nchain = [\"zstd\"]\n",
			[]string{chains.LockName}
	}
}

// ClaimExclusiveAcrossClients: union, shard, chains and replica stacks
// keep state of their lowers in memory and claim them exclusively, even
// with -shared: a second `cairn mount` of the same stack through b,
// another client's mount of the file system a is on (as from another
// machine), is refused, with or without -shared, as the claim locks a
// regular file of each lower (layer.LockLowerOwn), whose lock reaches
// the servers. Hand-over (unmount through a, mount through b) keeps every
// byte, and the lock file does not show.
func ClaimExclusiveAcrossClients(t *testing.T, a, b string) {
	for _, kind := range []string{"union", "shard", "chains", "replica"} {
		t.Run(kind, func(t *testing.T) {
			sub := fmt.Sprintf("claim-%s-%d", kind, rand.Uint32())
			specA, locks := exclusiveSpec(t, kind, a, sub)
			specB, _ := exclusiveSpec(t, kind, b, sub)
			sp := filepath.Join(t.TempDir(), "spec.toml")
			if err := os.WriteFile(sp, []byte(specB), 0o644); err != nil {
				t.Fatal(err)
			}
			mnt := t.TempDir()
			refused := func(sp, how string, extra ...string) {
				t.Helper()
				out, code := mounttest.Run(t, append(append([]string{"mount"}, extra...), sp, mnt)...)
				if code == 0 {
					mounttest.Run(t, "umount", mnt)
					t.Fatalf("%s: a second mount of the %s stack through another client was not refused", how, kind)
				}
				if !strings.Contains(out, "in use by another cairn process") {
					t.Fatalf("%s: the second mount failed, but not with the claim's message: %s", how, out)
				}
			}
			// Exclusive with -shared too: a's -shared mount keeps b's out,
			// -shared or not.
			pa := mounttest.MountSpec(t, specA, "-shared")
			want := []byte(strings.Repeat("written through client a\n", 100))
			if err := os.WriteFile(pa.Path("f"), want, 0o644); err != nil {
				t.Fatal(err)
			}
			for _, l := range locks {
				if fi, err := os.Stat(filepath.Join(b, sub, l)); err != nil || !fi.Mode().IsRegular() {
					t.Fatalf("the lock file %s, seen through client b: %v, %v", l, fi, err)
				}
			}
			refused(sp, "both with -shared", "-shared")
			refused(sp, "the second without -shared")
			pa.Unmount()
			// Hand-over: once a unmounts, b mounts and reads every byte.
			pb := mounttest.MountSpec(t, specB)
			if got, err := os.ReadFile(pb.Path("f")); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("after the hand-over, b reads %d bytes, %v", len(got), err)
			}
			// The claim's lock file is not shown.
			if ents, err := os.ReadDir(pb.Dir); err != nil || len(ents) != 1 || ents[0].Name() != "f" {
				t.Fatalf("the stack's root holds %v (%v), want only f", ents, err)
			}
			// And the other way: through a, refused while b has it (both
			// without -shared).
			spA := filepath.Join(t.TempDir(), "spec.toml")
			if err := os.WriteFile(spA, []byte(specA), 0o644); err != nil {
				t.Fatal(err)
			}
			refused(spA, "from a, while b has it")
		})
	}
}
