package main

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layers/codec"
)

// treeSums returns the sha256 of every regular file under dir, by
// relative path.
func treeSums(t *testing.T, dir string) map[string][32]byte {
	t.Helper()
	sums := map[string][32]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == codec.LockName {
			return nil // a codec layer's claim (hidden in the mount)
		}
		sums[rel] = sha256.Sum256(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return sums
}

func sameTree(t *testing.T, what string, got, want map[string][32]byte) {
	t.Helper()
	for p, s := range want {
		if g, ok := got[p]; !ok || g != s {
			t.Errorf("%s: %s differs (present: %v)", what, p, ok)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("%s: %s should not be there", what, p)
		}
	}
}

// encoded reports whether the lower file p is in the codec format (its
// header magic).
func encoded(t *testing.T, p string) bool {
	t.Helper()
	b := make([]byte, 3)
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n, _ := f.Read(b)
	return n == 3 && string(b) == "CZF"
}

func textBytes(r *rand.Rand, n int) []byte {
	words := []string{"existing ", "data ", "under ", "a ", "codec ", "layer\n", "cairn ", "convert "}
	var b bytes.Buffer
	for b.Len() < n {
		b.WriteString(words[r.IntN(len(words))])
	}
	return b.Bytes()[:n]
}

// TestConvertExisting: a zstd stack over a directory of existing files
// serves them as they are (sizes, bytes); an appended file stays plain, a
// rewritten one is in the format; fsck calls them plain; convert refuses a
// mounted stack, skips a hard-linked file, removes what an interrupted run
// left, and converts the rest in place keeping owner, mode, times and
// xattrs; the mount then reads every byte; --to-plain gives back the exact
// bytes; damaged data of the layer stays EIO.
func TestConvertExisting(t *testing.T) {
	mounttest.Need(t)
	r := rand.New(rand.NewPCG(3, 4))
	lower, mnt := t.TempDir(), t.TempDir()
	spec := "zstd:" + lower
	os.MkdirAll(filepath.Join(lower, "sub/deep"), 0o755)
	files := map[string][]byte{
		"text":          textBytes(r, 3<<20),
		"sub/random":    randomBytes(r, 200<<10),
		"sub/deep/tiny": []byte("x"),
		"appended":      textBytes(r, 100<<10),
		"rewritten":     textBytes(r, 100<<10),
		"linked":        textBytes(r, 10<<10),
	}
	for p, b := range files {
		if err := os.WriteFile(filepath.Join(lower, p), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(lower, "empty"), nil, 0o644)
	// A sparse file: 8 MiB of hole, then bytes.
	sp, _ := os.Create(filepath.Join(lower, "sparse"))
	sp.WriteAt([]byte("end of a sparse file"), 8<<20)
	sp.Close()
	// Owner, mode, times and an xattr to keep.
	text := filepath.Join(lower, "text")
	os.Chown(text, 1234, 4321)
	os.Chmod(text, 0o640)
	if err := unix.Setxattr(text, "user.note", []byte("kept"), 0); err != nil {
		t.Fatal(err)
	}
	old := time.Date(2020, 1, 2, 3, 4, 5, 6, time.UTC)
	os.Chtimes(text, old, old)
	os.Link(filepath.Join(lower, "linked"), filepath.Join(lower, "sub/link"))

	// Served as they are.
	if out, code := cairn(t, "mount", spec, mnt); code != 0 {
		t.Fatalf("mount: exit %d: %s", code, out)
	}
	for p, b := range files {
		fi, err := os.Stat(filepath.Join(mnt, p))
		if err != nil || fi.Size() != int64(len(b)) {
			t.Fatalf("%s through the mount: %v, size %v, want %d", p, err, fi, len(b))
		}
		if got, err := os.ReadFile(filepath.Join(mnt, p)); err != nil || !bytes.Equal(got, b) {
			t.Fatalf("%s through the mount: %v, %d bytes, want %d", p, err, len(got), len(b))
		}
	}
	// Appended: stays plain. Rewritten: in the format.
	f, err := os.OpenFile(filepath.Join(mnt, "appended"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("one more line\n"))
	f.Close()
	files["appended"] = append(files["appended"], "one more line\n"...)
	files["rewritten"] = textBytes(r, 50<<10)
	if err := os.WriteFile(filepath.Join(mnt, "rewritten"), files["rewritten"], 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := cairn(t, "convert", spec); code != exitBusy || !strings.Contains(out, "unmount it first") {
		t.Errorf("convert of a mounted stack: exit %d: %s", code, out)
	}
	if out, code := cairn(t, "umount", mnt); code != 0 {
		t.Fatalf("umount: exit %d: %s", code, out)
	}
	if b, _ := os.ReadFile(filepath.Join(lower, "appended")); !bytes.Equal(b, files["appended"]) {
		t.Error("appended: the lower file is not its plain bytes")
	}
	if !encoded(t, filepath.Join(lower, "rewritten")) {
		t.Error("rewritten: not in the codec's format")
	}
	want := treeSums(t, lower)
	want["rewritten"] = sha256.Sum256(files["rewritten"])

	out, code := cairn(t, "fsck", spec)
	if code != 0 || !strings.Contains(out, "text: 3145728 bytes, plain (not yet converted)") || !strings.Contains(out, "plain files (not yet converted") {
		t.Errorf("fsck of plain files: exit %d: %s", code, out)
	}

	// An interrupted run's file, then the conversion.
	left := filepath.Join(lower, "sub", ".cairn-convert-12345")
	os.WriteFile(left, []byte("half written"), 0o600)
	out, code = cairn(t, "convert", spec)
	if code != exitFailed || !strings.Contains(out, "linked: skipped: it has 2 hard links") ||
		!strings.Contains(out, "zstd layer: 5 files converted to the zstd format, 2 already were, 2 skipped, 1 left by an interrupted run removed;") ||
		!strings.Contains(out, "saved") {
		t.Errorf("convert: exit %d: %s", code, out)
	}
	if _, err := os.Stat(left); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the interrupted run's file is still there: %v", err)
	}
	for _, p := range []string{"text", "sub/random", "sub/deep/tiny", "appended", "rewritten", "sparse"} {
		if !encoded(t, filepath.Join(lower, p)) {
			t.Errorf("%s: not converted", p)
		}
	}
	if encoded(t, filepath.Join(lower, "linked")) {
		t.Error("a hard-linked file was converted")
	}
	var st unix.Stat_t
	unix.Stat(text, &st)
	if st.Uid != 1234 || st.Gid != 4321 || st.Mode&0o7777 != 0o640 || st.Mtim.Sec != old.Unix() || st.Mtim.Nsec != 6 {
		t.Errorf("text after conversion: uid %d gid %d mode %o mtime %d.%d", st.Uid, st.Gid, st.Mode&0o7777, st.Mtim.Sec, st.Mtim.Nsec)
	}
	v := make([]byte, 10)
	if n, err := unix.Getxattr(text, "user.note", v); err != nil || string(v[:n]) != "kept" {
		t.Error("text after conversion: its xattr is gone")
	}
	if fi, _ := os.Stat(filepath.Join(lower, "text")); fi.Size() > 1<<20 {
		t.Errorf("text: %d bytes after conversion, expected it compressed", fi.Size())
	}
	// Again: nothing to do but the hard link.
	os.Remove(filepath.Join(lower, "sub/link"))
	delete(want, "sub/link")
	out, code = cairn(t, "convert", spec)
	if code != 0 || !strings.Contains(out, "zstd layer: 1 file converted to the zstd format, 7 already were;") {
		t.Errorf("second convert: exit %d: %s", code, out)
	}

	// Every byte through a mount.
	if out, code := cairn(t, "mount", spec, mnt); code != 0 {
		t.Fatalf("mount: exit %d: %s", code, out)
	}
	sameTree(t, "through the mount after convert", treeSums(t, mnt), want)
	if out, code := cairn(t, "umount", mnt); code != 0 {
		t.Fatalf("umount: exit %d: %s", code, out)
	}
	if out, code := cairn(t, "fsck", spec); code != 0 || strings.Contains(out, "plain") {
		t.Errorf("fsck after convert: exit %d: %s", code, out)
	}

	// Back to plain: the exact bytes.
	out, code = cairn(t, "convert", "--to-plain", spec)
	if code != 0 || !strings.Contains(out, "zstd layer: 7 files converted to plain files, 1 already were;") {
		t.Errorf("convert --to-plain: exit %d: %s", code, out)
	}
	sameTree(t, "the lower after --to-plain", treeSums(t, lower), want)
	unix.Stat(filepath.Join(lower, "sparse"), &st)
	if st.Blocks > 64 {
		t.Errorf("sparse: %d blocks after --to-plain, its hole is gone", st.Blocks)
	}

	// Damaged data of the layer is not taken for plain: EIO.
	if _, code := cairn(t, "convert", spec); code != 0 {
		t.Fatal("convert again")
	}
	b, _ := os.ReadFile(filepath.Join(lower, "sub/random"))
	b[len(b)/2] ^= 0xff
	os.WriteFile(filepath.Join(lower, "sub/random"), b, 0o644)
	if out, code := cairn(t, "mount", spec, mnt); code != 0 {
		t.Fatalf("mount: exit %d: %s", code, out)
	}
	if _, err := os.ReadFile(filepath.Join(mnt, "sub/random")); !errors.Is(err, syscall.EIO) {
		t.Errorf("damaged file of the layer: %v, want EIO", err)
	}
	if out, code := cairn(t, "umount", mnt); code != 0 {
		t.Fatalf("umount: exit %d: %s", code, out)
	}
}

// TestConvertKilled: a conversion killed while it writes a file leaves the
// old file whole and its own file beside it; the next run removes that and
// converts everything.
func TestConvertKilled(t *testing.T) {
	mounttest.Need(t)
	r := rand.New(rand.NewPCG(5, 6))
	lower := t.TempDir()
	spec := "gzip:" + lower
	big := textBytes(r, 128<<20)
	os.WriteFile(filepath.Join(lower, "big"), big, 0o644)
	os.WriteFile(filepath.Join(lower, "small"), []byte("small file"), 0o644)
	cmd := exec.Command(mounttest.Binary(t), "convert", spec)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Kill it once its new file of big has some bytes.
	deadline := time.Now().Add(60 * time.Second)
	for {
		ents, _ := os.ReadDir(lower)
		grown := false
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".cairn-convert-") {
				if fi, err := e.Info(); err == nil && fi.Size() > 1<<20 {
					grown = true
				}
			}
		}
		if grown {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("no conversion file appeared")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	if b, _ := os.ReadFile(filepath.Join(lower, "big")); !bytes.Equal(b, big) {
		t.Fatal("the file being converted was changed by a killed conversion")
	}
	out, code := cairn(t, "convert", spec)
	if code != 0 || !strings.Contains(out, "1 left by an interrupted run removed") {
		t.Fatalf("convert after a kill: exit %d: %s", code, out)
	}
	ents, _ := os.ReadDir(lower)
	ents = slices.DeleteFunc(ents, func(e os.DirEntry) bool { return e.Name() == codec.LockName })
	if len(ents) != 2 {
		t.Errorf("after the second run the lower holds %d files", len(ents))
	}
	mnt := t.TempDir()
	if out, code := cairn(t, "mount", spec, mnt); code != 0 {
		t.Fatalf("mount: exit %d: %s", code, out)
	}
	defer cairn(t, "umount", mnt)
	if b, err := os.ReadFile(filepath.Join(mnt, "big")); err != nil || !bytes.Equal(b, big) {
		t.Errorf("big through the mount after the conversion: %v", err)
	}
	if !encoded(t, filepath.Join(lower, "big")) || !encoded(t, filepath.Join(lower, "small")) {
		t.Error("not converted")
	}
}

// TestConvertProgress: on a terminal convert draws a bar with files and
// bytes and clears it before its summary.
func TestConvertProgress(t *testing.T) {
	lower := t.TempDir()
	for i := 0; i < 10; i++ {
		os.WriteFile(filepath.Join(lower, fmt.Sprint("f", i)), bytes.Repeat([]byte("data "), 1000), 0o644)
	}
	out, err := exec.Command("script", "-qec", mounttest.Binary(t)+" convert lz4:"+lower, "/dev/null").Output()
	text := strings.ReplaceAll(string(out), "\r\n", "\n")
	if err != nil || !strings.Contains(text, "\r[") || !strings.Contains(text, "/10 files, ") || !strings.Contains(text, "KiB/48.8 KiB") ||
		!strings.Contains(text, "\rlz4 layer: 10 files converted to the lz4 format") {
		t.Errorf("convert on a terminal: %v, %q", err, text)
	}
}

func randomBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestInitExisting: cairn init over a directory that holds files encrypts
// them into a new volume in its place (names, bytes, owners, modes, times,
// xattrs, hard links, symlinks, fifos), keeps the plain files beside it,
// removes what an interrupted run left, refuses a leftover that is not
// one, and refuses a directory that holds a volume already.
func TestInitExisting(t *testing.T) {
	mounttest.Need(t)
	r := rand.New(rand.NewPCG(7, 8))
	base := t.TempDir()
	dir, mnt := filepath.Join(base, "data"), t.TempDir()
	os.MkdirAll(filepath.Join(dir, "sub/deep"), 0o750)
	os.WriteFile(filepath.Join(dir, "text"), textBytes(r, 300<<10), 0o640)
	os.WriteFile(filepath.Join(dir, "sub/deep/random"), randomBytes(r, 70<<10), 0o600)
	os.WriteFile(filepath.Join(dir, "empty"), nil, 0o644)
	os.Link(filepath.Join(dir, "text"), filepath.Join(dir, "sub/hard"))
	os.Symlink("../text", filepath.Join(dir, "sub/sym"))
	unix.Mkfifo(filepath.Join(dir, "fifo"), 0o620)
	os.Chmod(filepath.Join(dir, "fifo"), 0o620)
	unix.Setxattr(filepath.Join(dir, "text"), "user.note", []byte("kept"), 0)
	os.Chown(filepath.Join(dir, "sub/deep/random"), 1234, 4321)
	old := time.Date(2021, 5, 6, 7, 8, 9, 10, time.UTC)
	os.Chtimes(filepath.Join(dir, "sub/deep/random"), old, old)
	os.Chtimes(filepath.Join(dir, "sub/deep"), old, old)
	want := treeSums(t, dir)
	pf := filepath.Join(base, "pass")
	os.WriteFile(pf, []byte("a passphrase\n"), 0o600)
	spec := "crypt:" + dir
	kdf := []string{"--argon2-memory", "19MiB", "--argon2-time", "2", "--argon2-threads", "1", "--passfile", pf}

	// A leftover that is not an interrupted encryption: refused.
	os.Mkdir(dir+".cairn-init", 0o700)
	os.WriteFile(dir+".cairn-init/mine", []byte("x"), 0o600)
	if out, code := cairn(t, append(append([]string{"init"}, kdf...), spec)...); code != exitFailed || !strings.Contains(out, "is not an encryption that stopped") {
		t.Fatalf("init with a foreign leftover: exit %d: %s", code, out)
	}
	// One that is: removed.
	os.Remove(dir + ".cairn-init/mine")
	os.WriteFile(dir+".cairn-init/.cairn-crypt.conf", []byte("{}"), 0o600)
	out, code := cairn(t, append(append([]string{"init"}, kdf...), spec)...)
	if code != 0 || !strings.Contains(out, "removing "+dir+".cairn-init, left by an encryption that stopped") ||
		!strings.Contains(out, "the plain files are kept in "+dir+".plain-") {
		t.Fatalf("init of a directory with files: exit %d: %s", code, out)
	}
	// The lower holds no plain name or byte now; the plain files are kept.
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.Name() == "text" || e.Name() == "sub" {
			t.Errorf("a plain name in the encrypted lower: %s", e.Name())
		}
	}
	kept, _ := filepath.Glob(dir + ".plain-*")
	if len(kept) != 1 {
		t.Fatalf("plain files kept in %v", kept)
	}
	sameTree(t, "the plain files kept", treeSums(t, kept[0]), want)
	if _, err := os.Stat(dir + ".cairn-init"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the work directory is still there: %v", err)
	}
	if out, code := cairn(t, append(append([]string{"init"}, kdf...), spec)...); code != exitFailed || !strings.Contains(out, "holds a volume already") {
		t.Errorf("init of a volume: exit %d: %s", code, out)
	}

	if out, code := cairn(t, "mount", "--passfile", pf, spec, mnt); code != 0 {
		t.Fatalf("mount: exit %d: %s", code, out)
	}
	defer cairn(t, "umount", mnt)
	sameTree(t, "through the mount", treeSums(t, mnt), want)
	var st unix.Stat_t
	unix.Stat(filepath.Join(mnt, "sub/deep/random"), &st)
	if st.Uid != 1234 || st.Gid != 4321 || st.Mode&0o7777 != 0o600 || st.Mtim.Sec != old.Unix() || st.Mtim.Nsec != 10 {
		t.Errorf("sub/deep/random: uid %d gid %d mode %o mtime %d.%d", st.Uid, st.Gid, st.Mode&0o7777, st.Mtim.Sec, st.Mtim.Nsec)
	}
	unix.Stat(filepath.Join(mnt, "sub/deep"), &st)
	if st.Mode&0o7777 != 0o750 || st.Mtim.Sec != old.Unix() {
		t.Errorf("sub/deep: mode %o mtime %d", st.Mode&0o7777, st.Mtim.Sec)
	}
	unix.Stat(filepath.Join(mnt, "text"), &st)
	if st.Nlink != 2 || st.Mode&0o7777 != 0o640 {
		t.Errorf("text: %d links, mode %o", st.Nlink, st.Mode&0o7777)
	}
	if target, err := os.Readlink(filepath.Join(mnt, "sub/sym")); err != nil || target != "../text" {
		t.Errorf("sub/sym: %q %v", target, err)
	}
	unix.Lstat(filepath.Join(mnt, "fifo"), &st)
	if st.Mode&unix.S_IFMT != unix.S_IFIFO || st.Mode&0o7777 != 0o620 {
		t.Errorf("fifo: mode %o", st.Mode)
	}
	v := make([]byte, 10)
	if n, err := unix.Getxattr(filepath.Join(mnt, "text"), "user.note", v); err != nil || string(v[:n]) != "kept" {
		t.Errorf("text's xattr: %q %v", v[:max(n, 0)], err)
	}
}
