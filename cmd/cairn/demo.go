package main

import (
	"bytes"
	_ "embed"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// demoSpec is the embedded default stack: a null layer over a directory.
//
//go:embed demo.toml
var demoSpec string

func init() {
	register(&command{name: "demo", args: "[DIR]",
		summary: "mount the embedded demo stack over DIR/data, show it working, unmount", run: runDemo})
}

func runDemo(args []string) int {
	fl := flag.NewFlagSet("demo", flag.ContinueOnError)
	keep := fl.Bool("keep", false, "leave the demo mounted")
	fl.Usage = func() {
		fmt.Fprintf(fl.Output(), "Usage: cairn demo [--keep] [DIR]\n\nMounts the embedded demo stack (a null layer over DIR/data, DIR defaults to a new\ntemporary directory) at DIR/mnt, writes and reads files through it, shows the\nlower directory, and unmounts.\n\nThe embedded spec:\n\n%s\n", demoSpec)
		fl.PrintDefaults()
	}
	if code, ok := parseArgs(fl, args); !ok {
		return code
	}
	dir := fl.Arg(0)
	if dir == "" {
		d, err := os.MkdirTemp("", "cairn-demo-")
		if err != nil {
			return fail(err, exitFailed)
		}
		dir = d
	}
	// The spec names its directory absolutely: a relative one would be
	// taken relative to the spec file, which is in dir already.
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	data, mnt := filepath.Join(dir, "data"), filepath.Join(dir, "mnt")
	for _, d := range []string{data, mnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fail(err, exitFailed)
		}
	}
	spec := filepath.Join(dir, "demo.toml")
	if err := os.WriteFile(spec, []byte(strings.ReplaceAll(demoSpec, "DATA", data)), 0o644); err != nil {
		return fail(err, exitFailed)
	}
	exe, _ := os.Executable()
	step := func(f string, a ...any) { fmt.Printf("\n$ "+f+"\n", a...) }

	step("cat %s", spec)
	b, _ := os.ReadFile(spec)
	fmt.Print(string(b))

	step("cairn explain %s", spec)
	if out, err := exec.Command(exe, "explain", spec).CombinedOutput(); err != nil {
		fmt.Print(string(out))
		return fail(fmt.Errorf("demo spec: %v", err), exitSpec)
	} else {
		fmt.Print(string(out))
	}

	step("cairn mount %s %s", spec, mnt)
	if out, err := exec.Command(exe, "mount", spec, mnt).CombinedOutput(); err != nil {
		fmt.Print(string(out))
		return fail(fmt.Errorf("demo mount failed: %v", err), exitMount)
	}
	unmounted := false
	defer func() {
		if !unmounted && !*keep {
			exec.Command(exe, "umount", "-z", mnt).Run()
		}
	}()

	step("echo 'hello, cairn' > %s/hello.txt; mkdir %s/dir; seq 1 100000 > %s/dir/numbers", mnt, mnt, mnt)
	if err := os.WriteFile(filepath.Join(mnt, "hello.txt"), []byte("hello, cairn\n"), 0o644); err != nil {
		return fail(err, exitFailed)
	}
	os.Mkdir(filepath.Join(mnt, "dir"), 0o755)
	var nums bytes.Buffer
	for i := 1; i <= 100000; i++ {
		fmt.Fprintln(&nums, i)
	}
	if err := os.WriteFile(filepath.Join(mnt, "dir/numbers"), nums.Bytes(), 0o644); err != nil {
		return fail(err, exitFailed)
	}
	step("cat %s/hello.txt", mnt)
	got, err := os.ReadFile(filepath.Join(mnt, "hello.txt"))
	if err != nil {
		return fail(err, exitFailed)
	}
	fmt.Print(string(got))
	back, err := os.ReadFile(filepath.Join(mnt, "dir/numbers"))
	if err != nil || !bytes.Equal(back, nums.Bytes()) {
		return fail(fmt.Errorf("demo: dir/numbers did not read back (%v)", err), exitFailed)
	}
	for _, d := range []string{mnt, data} {
		step("ls -lR %s", d)
		out, _ := exec.Command("ls", "-lR", d).CombinedOutput()
		fmt.Print(string(out))
	}
	step("grep cairn /proc/mounts")
	m, _ := os.ReadFile("/proc/mounts")
	for _, l := range strings.Split(string(m), "\n") {
		if strings.Contains(l, mnt) {
			fmt.Println(l)
		}
	}
	if *keep {
		fmt.Printf("\nThe demo stays mounted at %s; 'cairn umount %s' unmounts it.\n", mnt, mnt)
		return exitOK
	}
	step("cairn umount %s", mnt)
	var uerr error
	for i := 0; i < 20; i++ {
		if uerr = exec.Command(exe, "umount", mnt).Run(); uerr == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if uerr != nil {
		return fail(fmt.Errorf("demo: umount failed: %v", uerr), exitFailed)
	}
	unmounted = true
	fmt.Printf("\nThe demo worked: files written through the mount are plain files in %s.\n", data)
	return exitOK
}
