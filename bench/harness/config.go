package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/BurntSushi/toml"
)

// Config is one thing to measure: native ext4, a cairn stack, or a peer.
type Config struct {
	Name        string
	Kind        string // "native", "cairn" or "peer"
	Description string
	// cairn: the spec file (with {lower} and {work} placeholders) and the
	// optional setup command from a "# bench-setup:" comment.
	Spec string
	// peer and cairn: shell commands with {lower}, {work}, {mnt}, {bin}.
	Packages []string
	Build    string
	Version  string
	Setup    string
	Mount    string
	Umount   string

	VersionText string // filled in at start
	Failed      string // why the configuration cannot be used at all
}

type peerFile struct {
	Description string   `toml:"description"`
	Packages    []string `toml:"packages"`
	Build       string   `toml:"build"`
	Version     string   `toml:"version"`
	Setup       string   `toml:"setup"`
	Mount       string   `toml:"mount"`
	Umount      string   `toml:"umount"`
}

// loadConfigs reads native, every cairn stack in stacks/*.toml and every
// peer in peers/*.toml.
func loadConfigs(stacksDir, peersDir, cairnBin string) ([]*Config, error) {
	cfgs := []*Config{{Name: "native", Kind: "native", Description: "ext4 directly (no FUSE)", Version: "uname -r"}}
	stacks, _ := filepath.Glob(filepath.Join(stacksDir, "*.toml"))
	sort.Strings(stacks)
	for _, f := range stacks {
		c := &Config{Name: "cairn-" + strings.TrimSuffix(filepath.Base(f), ".toml"), Kind: "cairn", Spec: f,
			Version: cairnBin + " version",
			Mount:   cairnBin + " mount {work}/spec.toml {mnt}",
			Umount:  cairnBin + " umount {mnt}"}
		if err := readSpecComments(c); err != nil {
			return nil, err
		}
		cfgs = append(cfgs, c)
	}
	peers, _ := filepath.Glob(filepath.Join(peersDir, "*.toml"))
	sort.Strings(peers)
	for _, f := range peers {
		var p peerFile
		md, err := toml.DecodeFile(f, &p)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", f, err)
		}
		if u := md.Undecoded(); len(u) > 0 {
			return nil, fmt.Errorf("%s: unknown keys %v", f, u)
		}
		if p.Mount == "" {
			return nil, fmt.Errorf("%s: no mount command", f)
		}
		if p.Umount == "" {
			p.Umount = "fusermount3 -u {mnt}"
		}
		cfgs = append(cfgs, &Config{Name: strings.TrimSuffix(filepath.Base(f), ".toml"), Kind: "peer",
			Description: p.Description, Packages: p.Packages, Build: p.Build, Version: p.Version,
			Setup: p.Setup, Mount: p.Mount, Umount: p.Umount})
	}
	return cfgs, nil
}

// readSpecComments takes "# bench-description: ..." and "# bench-setup: ..."
// lines from a stack spec.
func readSpecComments(c *Config) error {
	f, err := os.Open(c.Spec)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if v, ok := strings.CutPrefix(l, "# bench-description:"); ok {
			c.Description = strings.TrimSpace(v)
		}
		if v, ok := strings.CutPrefix(l, "# bench-setup:"); ok {
			c.Setup = strings.TrimSpace(v)
		}
	}
	return sc.Err()
}

// Instance is one fresh, mounted copy of a configuration.
type Instance struct {
	Cfg              *Config
	Lower, Work, Mnt string
	Bin              string
	// Dir is where the workload acts: the mountpoint, or Lower for native.
	Dir string
}

func (i *Instance) expand(s string) string {
	return strings.NewReplacer("{lower}", i.Lower, "{work}", i.Work, "{mnt}", i.Mnt, "{bin}", i.Bin).Replace(s)
}

var instanceSeq int

// start makes fresh directories under root, runs the setup and mounts.
func start(cfg *Config, root, bin string) (*Instance, error) {
	instanceSeq++
	base := filepath.Join(root, fmt.Sprintf("%s-%d", cfg.Name, instanceSeq))
	i := &Instance{Cfg: cfg, Lower: filepath.Join(base, "lower"), Work: filepath.Join(base, "work"),
		Mnt: fmt.Sprintf("/tmp/cairnbench-%d-mnt", os.Getpid()), Bin: bin}
	for _, d := range []string{i.Lower, i.Work, i.Mnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	if cfg.Kind == "native" {
		i.Dir = i.Lower
		return i, nil
	}
	i.Dir = i.Mnt
	if cfg.Kind == "cairn" {
		data, err := os.ReadFile(cfg.Spec)
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(i.Work, "spec.toml"), []byte(i.expand(string(data))), 0o644); err != nil {
			return nil, err
		}
	}
	if cfg.Setup != "" {
		if out, err := shell(i.expand(cfg.Setup), 2*time.Minute); err != nil {
			i.remove()
			return nil, fmt.Errorf("setup: %v: %s", err, lastLine(out))
		}
	}
	if err := i.mount(); err != nil {
		i.remove()
		return nil, err
	}
	return i, nil
}

func (i *Instance) mount() error {
	if mounted(i.Mnt) {
		return fmt.Errorf("%s is already mounted", i.Mnt)
	}
	out, err := shell(i.expand(i.Cfg.Mount), 2*time.Minute)
	if err != nil {
		return fmt.Errorf("mount: %v: %s", err, lastLine(out))
	}
	for t := 0; t < 200; t++ { // some tools return before the mount is ready
		if mounted(i.Mnt) {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("mount: %q exited 0 but nothing is mounted on %s: %s", i.expand(i.Cfg.Mount), i.Mnt, lastLine(out))
}

func (i *Instance) unmount() error {
	if i.Cfg.Kind == "native" || !mounted(i.Mnt) {
		return nil
	}
	var err error
	var out string
	for t := 0; t < 50; t++ {
		out, err = shell(i.expand(i.Cfg.Umount), time.Minute)
		if err == nil || !mounted(i.Mnt) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if mounted(i.Mnt) {
		syscall.Unmount(i.Mnt, mntDetach)
		return fmt.Errorf("umount: %v: %s (detached)", err, lastLine(out))
	}
	// Let the daemon finish writing back before the next step.
	time.Sleep(100 * time.Millisecond)
	return nil
}

// remount unmounts and mounts again; cold also syncs and drops the caches
// in between (for native it only does that).
func (i *Instance) remount(cold bool) error {
	if err := i.unmount(); err != nil {
		return err
	}
	if cold {
		dropCaches()
	}
	if i.Cfg.Kind == "native" {
		return nil
	}
	return i.mount()
}

// stop unmounts and removes the instance's directories.
func (i *Instance) stop() error {
	err := i.unmount()
	i.remove()
	return err
}

func (i *Instance) remove() {
	os.RemoveAll(filepath.Dir(i.Lower))
}

func dropCaches() {
	syscall.Sync()
	os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0)
}

// mounted reports whether path is a mountpoint (in /proc/self/mountinfo).
func mounted(path string) bool {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) > 4 && unescapeMount(f[4]) == path {
			return true
		}
	}
	return false
}

func unescapeMount(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

// shell runs a command with sh -c and a time limit; it returns the combined
// output.
func shell(cmd string, limit time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	// Output goes to a file, not a pipe: a daemon that forks and keeps its
	// standard output would hold a pipe open for ever.
	f, err := os.CreateTemp("", "cairnbench-out-")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	c := exec.CommandContext(ctx, "sh", "-c", cmd)
	c.Stdout, c.Stderr = f, f
	err = c.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("timed out after %v", limit)
	}
	out, _ := os.ReadFile(f.Name())
	return string(out), err
}

// lastLine condenses a command's output for an error message: its first
// and last lines (a caret line under a spec error says little alone).
func lastLine(s string) string {
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		if strings.TrimSpace(l) != "" {
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	switch {
	case len(lines) == 0:
		s = ""
	case len(lines) <= 3:
		s = strings.Join(lines, " / ")
	default:
		s = lines[0] + " / ... / " + lines[len(lines)-1]
	}
	if len(s) > 400 {
		s = s[:400]
	}
	return s
}
