// Command chainsbench measures what bench/chains.sh reports (MonA's
// Figures 6-8, issue 18) in one directory: the cost of open+close of
// existing files, and of open+read+close and open+write+close of 1 KiB to
// 1 MiB, warm. It prints CSV lines: config,operation,size,seconds per
// operation,load average.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"cairnfs.dev/cairn/bench/opencost"
)

func main() {
	dir := flag.String("dir", "", "the directory (a mount, or native ext4)")
	cfg := flag.String("config", "", "the configuration's name, for the output")
	opens := flag.Int("opens", 10000, "open+close operations")
	rw := flag.Bool("rw", true, "also measure read and write")
	flag.Parse()
	if err := run(*dir, *cfg, *opens, *rw); err != nil {
		fmt.Fprintln(os.Stderr, "chainsbench:", err)
		os.Exit(1)
	}
}

func load() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.Fields(string(b) + " 0")[0]
}

func run(dir, cfg string, opens int, rw bool) error {
	var names []string
	for j := 0; j < 100; j++ {
		p := filepath.Join(dir, fmt.Sprintf("o%03d", j))
		if err := os.WriteFile(p, make([]byte, 4096), 0o644); err != nil {
			return err
		}
		names = append(names, p)
	}
	// Warm: every file opened once.
	for _, p := range names {
		if b, err := os.ReadFile(p); err != nil || len(b) != 4096 {
			return fmt.Errorf("read %s: %d bytes, %v", p, len(b), err)
		}
	}
	sec, err := opencost.OpenClose(names, opens)
	if err != nil {
		return err
	}
	fmt.Printf("%s,open,0,%.9f,%s\n", cfg, sec, load())
	if !rw {
		return nil
	}
	for size := 1 << 10; size <= 1<<20; size *= 4 {
		buf := bytes.Repeat([]byte{'x'}, size)
		p := filepath.Join(dir, "rw")
		n := max(20, min(2000, (64<<20)/size))
		sec, err := opencost.OpenWriteClose(p, buf, n)
		if err != nil {
			return err
		}
		fmt.Printf("%s,write,%d,%.9f,%s\n", cfg, size, sec, load())
		if sec, err = opencost.OpenReadClose(p, buf, n); err != nil {
			return err
		}
		fmt.Printf("%s,read,%d,%.9f,%s\n", cfg, size, sec, load())
	}
	return nil
}
