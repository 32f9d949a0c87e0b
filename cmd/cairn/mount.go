package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"log/syslog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"cairn/fusefs"
	"cairn/layer"
	_ "cairn/layers/all"
	"cairn/layers/codec"
	"cairn/registry"
	"cairn/spec"
)

func init() {
	register(&command{name: "mount", args: "[flags] SPEC MOUNTPOINT",
		summary: "mount a stack; returns once it is ready", run: runMount})
	register(&command{name: "umount", args: "[-z] MOUNTPOINT",
		summary: "unmount a cairn mount", run: runUmount})
}

// daemonEnv marks the background process of `cairn mount`; its value is the
// descriptor on which it reports readiness.
const daemonEnv = "CAIRN_DAEMON_READY_FD"

type mountFlags struct {
	foreground    bool
	allowOther    bool
	debug         bool
	noPassthrough bool
	noXattr       bool
	logLevel      string
	logFile       string
	entry, attr   time.Duration
	negative      time.Duration
}

func runMount(args []string) int {
	fl := flag.NewFlagSet("mount", flag.ContinueOnError)
	var m mountFlags
	fl.BoolVar(&m.foreground, "f", false, "stay in the foreground (log to standard error); Ctrl-C unmounts")
	fl.BoolVar(&m.allowOther, "allow-other", false, "let other users use the mount (the kernel checks permissions)")
	fl.BoolVar(&m.debug, "debug", false, "log every FUSE request (very verbose)")
	fl.BoolVar(&m.noPassthrough, "no-passthrough", false, "never hand files to the kernel (FUSE passthrough)")
	fl.BoolVar(&m.noXattr, "no-xattr", false, "no extended attributes (fewer round trips; the spec's xattr = false)")
	fl.StringVar(&m.logLevel, "log-level", "", "debug, info, warn or error (default: the spec's log_level, else info)")
	fl.StringVar(&m.logFile, "log-file", "", "log to this file (JSON lines); default: standard error in the foreground, syslog in the background")
	fl.DurationVar(&m.entry, "entry-timeout", 0, "kernel cache time of names (default: the spec's, else 1s)")
	fl.DurationVar(&m.attr, "attr-timeout", 0, "kernel cache time of attributes (default: the spec's, else 1s)")
	fl.DurationVar(&m.negative, "negative-timeout", 0, "kernel cache time of missing names (default: the spec's, else 1s)")
	fl.Usage = func() {
		fmt.Fprintf(fl.Output(), `Usage: cairn mount [flags] SPEC MOUNTPOINT

Mounts the stack that SPEC describes at MOUNTPOINT. SPEC is a spec file or the
inline form, such as 'null:/srv/data' (see docs/spec.md); it is checked as
'cairn check SPEC MOUNTPOINT' does before anything is mounted. The command returns once
the mount is ready and the file system is served by a background process; with
-f it stays in the foreground until Ctrl-C, SIGTERM or 'cairn umount'.

Flags:
`)
		fl.PrintDefaults()
	}
	if code, ok := parseArgs(fl, args); !ok {
		return code
	}
	if fl.NArg() != 2 {
		fl.Usage()
		return fail(usagef("mount needs SPEC and MOUNTPOINT, got %d arguments", fl.NArg()), exitUsage)
	}
	specArg, mountpoint := fl.Arg(0), fl.Arg(1)

	s, err := loadSpec(specArg)
	if err != nil {
		return fail(errors.New(spec.Detail(err)), exitSpec)
	}
	if err := s.CheckMountpoint(mountpoint); err != nil {
		// The spec is good; the mount cannot be made there.
		return fail(errors.New(spec.Detail(err)), exitMount)
	}
	if m.logLevel == "" {
		m.logLevel = s.LogLevel
	}
	level, err := parseLevel(m.logLevel)
	if err != nil {
		return fail(err, exitUsage)
	}
	if fi, err := os.Stat(mountpoint); err != nil || !fi.IsDir() {
		return fail(fmt.Errorf("mountpoint %s is not a directory; create it first (mkdir -p %s)", mountpoint, mountpoint), exitMount)
	}

	readyFd := os.Getenv(daemonEnv)
	if !m.foreground && readyFd == "" {
		// Secrets (passphrases) are asked for here, on the terminal,
		// and go to the background process over a pipe.
		secrets, err := layerSecrets(s)
		if err != nil {
			return fail(err, exitFailed)
		}
		return daemonize(args, secrets)
	}

	logger, closeLog, err := newLogger(m, level, readyFd != "" && !m.foreground)
	if err != nil {
		return fail(err, exitFailed)
	}
	defer closeLog()
	slog.SetDefault(logger)

	var ready *os.File
	if readyFd != "" {
		ready = os.NewFile(3, "ready")
		os.Unsetenv(daemonEnv)
	}
	report := func(msg string) {
		if ready != nil {
			fmt.Fprintln(ready, msg)
			ready.Close()
			ready = nil
		}
	}

	var secrets map[string][]byte
	if fd := os.Getenv(secretEnv); readyFd != "" && fd != "" {
		secrets, err = receiveSecrets()
	} else {
		secrets, err = layerSecrets(s)
	}
	if err != nil {
		report("spec: " + err.Error())
		return fail(err, exitFailed)
	}
	for name, b := range secrets {
		s.Layers[name].Values[registry.SecretKey] = b
	}
	raiseNofile()
	stack, err := s.Build()
	if err != nil {
		report("spec: " + err.Error())
		return fail(err, exitSpec)
	}
	defer stack.Close()
	// The files of size-changing layers are served by one engine at a
	// time: a second mount of them, or an fsck, is refused while this
	// one runs.
	if err := codec.Claim(context.Background(), stack.Top); err != nil {
		report("mount: " + err.Error())
		return fail(err, exitMount)
	}
	opts := fusefs.Options{
		AllowOther:      m.allowOther || s.AllowOther,
		EntryTimeout:    pick(m.entry, s.EntryTimeout),
		AttrTimeout:     pick(m.attr, s.AttrTimeout),
		NegativeTimeout: pick(m.negative, s.NegativeTimeout),
		NoPassthrough:   m.noPassthrough,
		NoXattr:         m.noXattr || s.NoXattr,
		FsName:          "cairn:" + fsName(specArg, s),
		Debug:           m.debug,
		Logger:          logger,
		LowerDirs:       stack.Dirs,
	}
	// Catch signals before the mount appears: a signal that arrives while it
	// is being made then unmounts it (instead of killing the process and
	// leaving a dead mount).
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	srv, err := fusefs.Mount(mountpoint, stack.Top, opts)
	if err != nil {
		report("mount: " + err.Error())
		return fail(err, exitMount)
	}
	// Signals are caught before readiness is reported: a SIGHUP sent as
	// soon as the mount is ready must not kill the daemon.
	logger.Info("mounted", "mountpoint", mountpoint, "spec", specArg, "passthrough", srv.Passthrough, "pid", os.Getpid())
	report("ok")
	go func() {
		for sig := range sigs {
			if sig == syscall.SIGHUP {
				hangup(logger, stack, s, specArg)
				continue
			}
			logger.Info("unmounting", "signal", sig.String())
			if err := srv.Unmount(); err != nil {
				logger.Warn("unmount failed; the mount is busy: close the files under it, or use 'cairn umount -z'", "err", err)
			}
		}
	}()
	srv.Wait()
	logger.Info("unmounted", "mountpoint", mountpoint)
	return exitOK
}

// hangup serves SIGHUP: layers reopen their own files (logs, after
// rotation), and layers whose rules may change (registry.RuleReloader) get
// the [[rule]] tables of the spec as it is now.
func hangup(logger *slog.Logger, stack *spec.Stack, orig *spec.Spec, specArg string) {
	if err := layer.ReopenStack(stack.Top); err != nil {
		logger.Error("SIGHUP: reopening files failed", "err", err)
	} else {
		logger.Info("SIGHUP: files reopened")
	}
	var s *spec.Spec
	for name, fs := range stack.Layers {
		rr, ok := fs.(registry.RuleReloader)
		if !ok {
			continue
		}
		if s == nil {
			var err error
			if s, err = loadSpec(specArg); err != nil {
				logger.Error("SIGHUP: the spec has errors; the rules stay as they were", "err", spec.Detail(err))
				return
			}
		}
		l := s.Layers[name]
		if l == nil || l.Values == nil || l.Type != orig.Layers[name].Type {
			logger.Error("SIGHUP: the layer is gone from the spec or changed type; its rules stay as they were", "layer", name)
			continue
		}
		if err := rr.ReloadRules(l.Values.Rules()); err != nil {
			logger.Warn("SIGHUP: rules not reloaded", "layer", name, "err", err)
			continue
		}
		logger.Info("SIGHUP: rules reloaded", "layer", name, "rules", len(l.Values.Rules()))
	}
}

// fsName is the mount's source in /proc/mounts: the spec as given, unless an
// inline spec holds a secret.
func fsName(arg string, s *spec.Spec) string {
	if s.Inline != "" && s.HasSecrets() {
		return "inline"
	}
	return arg
}

func pick(flag, spec time.Duration) time.Duration {
	if flag != 0 {
		return flag
	}
	return spec
}

// loadSpec reads a spec file, or parses the inline form when arg is not an
// existing file (see spec.LooksInline).
func loadSpec(arg string) (*spec.Spec, error) {
	if spec.LooksInline(arg) {
		return spec.ParseInline(arg)
	}
	s, err := spec.Load(arg)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, fmt.Errorf("spec file %s does not exist (an inline spec has a \":\" before its directory, as in null:/srv/data)", arg)
		}
		return nil, err
	}
	return s, nil
}

func parseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "", "info":
		return slog.LevelInfo, nil
	case "debug":
		return slog.LevelDebug, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, usagef("unknown log level %q: use debug, info, warn or error", s)
}

// newLogger logs to standard error in the foreground, and to --log-file or
// syslog in the background.
func newLogger(m mountFlags, level slog.Level, daemon bool) (*slog.Logger, func(), error) {
	hopts := &slog.HandlerOptions{Level: level}
	if m.debug {
		hopts.Level = slog.LevelDebug
	}
	switch {
	case m.logFile != "":
		f, err := os.OpenFile(m.logFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
		if err != nil {
			return nil, nil, fmt.Errorf("cannot open log file: %w", err)
		}
		return slog.New(slog.NewJSONHandler(f, hopts)), func() { f.Close() }, nil
	case daemon:
		w, err := syslog.New(syslog.LOG_DAEMON|syslog.LOG_INFO, "cairn")
		if err != nil {
			// No syslog daemon: keep quiet rather than fail the mount.
			return slog.New(slog.NewTextHandler(io.Discard, hopts)), func() {}, nil
		}
		return slog.New(slog.NewTextHandler(w, hopts)), func() { w.Close() }, nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, hopts)), func() {}, nil
}

// secretEnv tells the background process of `cairn mount` that the secrets
// of its layers arrive on descriptor 4 (JSON: layer name -> bytes).
const secretEnv = "CAIRN_DAEMON_SECRET_FD"

// layerSecrets calls the Secret hook of every layer type that has one (see
// registry.Type.Secret); it may ask on the terminal.
func layerSecrets(s *spec.Spec) (map[string][]byte, error) {
	out := map[string][]byte{}
	for _, name := range s.Order {
		l := s.Layers[name]
		if t := l.TypeInfo(); t != nil && t.Secret != nil && l.Values != nil {
			b, err := t.Secret(l.Values)
			if err != nil {
				return nil, fmt.Errorf("layer %q: %w", name, err)
			}
			out[name] = b
		}
	}
	return out, nil
}

// receiveSecrets reads what the foreground process sent.
func receiveSecrets() (map[string][]byte, error) {
	f := os.NewFile(4, "secrets")
	defer f.Close()
	os.Unsetenv(secretEnv)
	var m map[string][]byte
	if err := json.NewDecoder(f).Decode(&m); err != nil {
		return nil, fmt.Errorf("cannot read the secrets from the foreground process: %v", err)
	}
	return m, nil
}

// daemonize starts this command again in the background and waits until it
// reports that the mount is ready (or why it is not).
func daemonize(args []string, secrets map[string][]byte) int {
	exe, err := os.Executable()
	if err != nil {
		return fail(err, exitFailed)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return fail(err, exitFailed)
	}
	devnull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return fail(err, exitFailed)
	}
	cmd := exec.Command(exe, append([]string{"mount"}, args...)...)
	cmd.Env = append(os.Environ(), daemonEnv+"=3")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, devnull, devnull
	cmd.ExtraFiles = []*os.File{w}
	var sw *os.File
	if len(secrets) > 0 {
		sr, w2, err := os.Pipe()
		if err != nil {
			return fail(err, exitFailed)
		}
		defer sr.Close()
		sw = w2
		cmd.ExtraFiles = append(cmd.ExtraFiles, sr)
		cmd.Env = append(cmd.Env, secretEnv+"=4")
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fail(fmt.Errorf("cannot start the background process: %w", err), exitFailed)
	}
	w.Close()
	if sw != nil {
		json.NewEncoder(sw).Encode(secrets)
		sw.Close()
	}
	devnull.Close()
	line, err := bufio.NewReader(r).ReadString('\n')
	line = strings.TrimSpace(line)
	if line == "ok" {
		cmd.Process.Release()
		return exitOK
	}
	state, _ := cmd.Process.Wait()
	if line == "" {
		if err == nil || err == io.EOF {
			err = fmt.Errorf("exited with %v before the mount was ready", state)
		}
		return fail(fmt.Errorf("the background process failed: %v", err), exitMount)
	}
	kind, msg, _ := strings.Cut(line, ": ")
	if kind == "spec" {
		return fail(errors.New(msg), exitSpec)
	}
	return fail(errors.New(msg), exitMount)
}

func runUmount(args []string) int {
	fl := flag.NewFlagSet("umount", flag.ContinueOnError)
	lazy := fl.Bool("z", false, "lazy: detach now, finish when the files in use are closed")
	fl.Usage = func() {
		fmt.Fprintf(fl.Output(), "Usage: cairn umount [-z] MOUNTPOINT\n\nUnmounts a cairn mount; its background process then exits.\n\nFlags:\n")
		fl.PrintDefaults()
	}
	if code, ok := parseArgs(fl, args); !ok {
		return code
	}
	if fl.NArg() != 1 {
		fl.Usage()
		return exitUsage
	}
	mp := fl.Arg(0)
	if err := fusefs.Unmount(mp, *lazy); err != nil {
		hint := ""
		if errors.Is(err, syscall.EBUSY) {
			hint = " (files under it are in use: close them, or use -z)"
		} else if errors.Is(err, syscall.EINVAL) {
			hint = " (nothing is mounted there)"
		}
		return fail(fmt.Errorf("umount %s: %v%s", mp, err, hint), exitFailed)
	}
	return exitOK
}

// raiseNofile raises the soft limit of open descriptors to the hard one
// before the stack is built: the local layer bounds the descriptors of open
// files by half of it. (The Go runtime does the same at start; this makes
// it explicit where it matters.)
func raiseNofile() {
	var rl syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl) == nil && rl.Cur < rl.Max {
		rl.Cur = rl.Max
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl)
	}
}
