package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"log/syslog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"cairnfs.dev/cairn/fusefs"
	"cairnfs.dev/cairn/layer"
	_ "cairnfs.dev/cairn/layers/all"
	"cairnfs.dev/cairn/registry"
	"cairnfs.dev/cairn/spec"
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
	shared        bool
	noXattr       bool
	logLevel      string
	logFile       string
	entry, attr   time.Duration
	negative      time.Duration
	nonempty      bool
	passfile      string
	extpass       string
	options       string
	vfs           []string // mount(8) options for the kernel (from -o)
	fsname        string
	stats         string // -stats: the request counts' file
	transport     string
	writeback     bool
}

func runMount(args []string) int {
	fl := flag.NewFlagSet("mount", flag.ContinueOnError)
	var m mountFlags
	fl.BoolVar(&m.foreground, "f", false, "stay in the foreground (log to standard error); Ctrl-C unmounts")
	fl.BoolVar(&m.allowOther, "allow-other", false, "let other users use the mount (the kernel checks permissions)")
	fl.BoolVar(&m.debug, "debug", false, "log every FUSE request (very verbose)")
	fl.BoolVar(&m.noPassthrough, "no-passthrough", false, "never hand files to the kernel (FUSE passthrough)")
	fl.BoolVar(&m.shared, "shared", false, "the lowers are shared with other machines (a network file system): the kernel caches no names, attributes\nor pages across opens (timeouts not given are 0), so that an open sees what another client wrote and closed; costs\na round trip per lookup and stat, and a read again after every open (docs/distributed.md)")
	fl.StringVar(&m.stats, "stats", "", "on SIGUSR1 and at unmount, write the requests the daemon has served, by kind, to this file (JSON:\n"+
		"{\"seq\": N, \"total\": N, \"requests\": {\"LOOKUP\": N, ...}}; seq counts the writes); SIGUSR1 also logs them")
	fl.StringVar(&m.transport, "transport", "", "how the kernel's requests reach the daemon: dev (reads and writes of /dev/fuse), uring (FUSE over io_uring, Linux 6.14+;\n"+
		"experimental; needs 'echo Y > /sys/module/fuse/parameters/enable_uring', else the mount fails) or auto (io_uring where the\n"+
		"kernel offers it, else dev); default: $CAIRN_FUSE_TRANSPORT, else "+fusefs.DefaultTransport+". The log's \"mounted\" line says which serves")
	fl.BoolVar(&m.writeback, "writeback", false, "the kernel's writeback cache: writes stay in the kernel's page cache and reach the stack in large pieces at\n"+
		"fsync, close or under memory pressure; errors of the lower then show at fsync and close, not write, and no file is\n"+
		"passed through (Linux refuses backing files under it: reads come through the daemon too); see docs/posix.md,\n"+
		"\"Caching\"; only for an exclusive stack whose every layer takes it (the spec's writeback = true; -o writeback)")
	fl.BoolVar(&m.noXattr, "no-xattr", false, "no extended attributes (fewer round trips; the spec's xattr = false)")
	fl.StringVar(&m.logLevel, "log-level", "", "debug, info, warn or error (default: the spec's log_level, else info)")
	fl.StringVar(&m.logFile, "log-file", "", "log to this file (JSON lines); default: standard error in the foreground, syslog in the background,\n"+
		"and with no syslog (no /dev/log) /var/log/cairn/MOUNTPOINT.log (~/.local/state/cairn/ for users; $CAIRN_LOG_DIR if set), named as systemd names mount units")
	fl.DurationVar(&m.entry, "entry-timeout", 0, "kernel cache time of names; 0: none (default: the spec's, else 1s)")
	fl.DurationVar(&m.attr, "attr-timeout", 0, "kernel cache time of attributes; 0: none (default: the spec's, else 1s)")
	fl.DurationVar(&m.negative, "negative-timeout", 0, "kernel cache time of missing names; 0: none (default: the spec's, else 1s)")
	fl.StringVar(&m.passfile, "passfile", "", "the passphrase of every crypt layer, from the first line of this file (instead of the spec's passfile or extpass)")
	fl.StringVar(&m.extpass, "extpass", "", "the passphrase of every crypt layer, from the first line of this command's output (sh -c)")
	fl.BoolVar(&m.nonempty, "nonempty", false, "mount over a directory that holds files (hidden while mounted; refused otherwise)")
	fl.StringVar(&m.options, "o", "", "mount options, comma-separated, as mount(8) takes them: allow_other, default_permissions, fsname=NAME, nonempty, shared, writeback,\n"+
		"and "+strings.Join(fusefs.MountFlagNames(), ", ")+" (default nodev,nosuid; dev and suid need root);\n"+
		"relatime (the default), noatime, strictatime and nodiratime decide when reads change the atimes of the lower's files,\n"+
		"as on ext4, whatever the lower's own options (over a lower mounted with others they need root; see docs/posix.md);\n"+
		"defaults, auto, noauto, user, nouser, nofail, _netdev and x-* (fstab's) are ignored; subtype=cairn is the type anyway;\n"+
		"uid=, gid=, umask= and max_read= are refused, saying why")
	fl.Usage = func() {
		fmt.Fprintf(fl.Output(), `Usage: cairn mount [flags] SPEC MOUNTPOINT

Mounts the stack that SPEC describes at MOUNTPOINT. SPEC is a spec file or the
inline form, such as 'null:/srv/data' (see docs/spec.md); it is checked as
'cairn check SPEC MOUNTPOINT' does before anything is mounted. The command returns once
the mount is ready and the file system is served by a background process; with
-f it stays in the foreground until Ctrl-C, SIGTERM or 'cairn umount'.
MOUNTPOINT must be an empty directory (-nonempty: any directory) with nothing
mounted on it; a dead mount there (its process was killed) is reported with
what to do ('cairn umount MOUNTPOINT').

Flags:
`)
		fl.PrintDefaults()
	}
	if code, ok := parseArgs(fl, args); !ok {
		return code
	}
	// An explicit 0 is "no caching", as "0s" is in a spec (a zero
	// duration would mean the default).
	fl.Visit(func(f *flag.Flag) {
		for name, d := range map[string]*time.Duration{"entry-timeout": &m.entry, "attr-timeout": &m.attr, "negative-timeout": &m.negative} {
			if f.Name == name && *d == 0 {
				*d = -1
			}
		}
	})
	if fl.NArg() != 2 {
		fl.Usage()
		return fail(usagef("mount needs SPEC and MOUNTPOINT, got %d arguments", fl.NArg()), exitUsage)
	}
	specArg, mountpoint := fl.Arg(0), fl.Arg(1)
	if err := m.parseOptions(); err != nil {
		return fail(err, exitUsage)
	}
	if _, err := fusefs.ParseTransport(m.transport); err != nil {
		return fail(err, exitUsage)
	}

	s, err := loadSpec(specArg)
	if err != nil {
		return fail(errors.New(spec.Detail(err)), exitSpec)
	}
	if err := m.secretFlags(s); err != nil {
		return fail(err, exitUsage)
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
	if err := checkMountpointFree(mountpoint, m.nonempty); err != nil {
		return fail(err, exitMount)
	}
	if err := mountpointDir(mountpoint); err != nil {
		return fail(err, exitMount)
	}

	readyFd := os.Getenv(daemonEnv)
	if !m.foreground {
		if err := needsForeground(s); err != nil {
			return fail(err, exitUsage)
		}
	}
	if !m.foreground && readyFd == "" {
		// Secrets (passphrases) are asked for here, on the terminal,
		// and go to the background process over a pipe.
		secrets, err := layerSecrets(s)
		if err != nil {
			return fail(err, exitFailed)
		}
		return daemonize(args, secrets)
	}

	var ready *os.File
	if readyFd != "" {
		ready = os.NewFile(3, "ready")
		os.Unsetenv(daemonEnv)
	}
	// report tells the foreground process, which waits, that the mount is
	// ready ("ok") or why not: everything that fails before goes through it,
	// so that a background mount says what went wrong as -f would.
	report := func(msg string) {
		if ready != nil {
			fmt.Fprintln(ready, msg)
			ready.Close()
			ready = nil
		}
	}

	logger, closeLog, logPath, err := newLogger(m, level, readyFd != "" && !m.foreground, mountpoint)
	if err != nil {
		report("log: " + err.Error())
		return fail(err, exitFailed)
	}
	defer closeLog()
	slog.SetDefault(logger)

	// Held until this process exits, after the stack is closed (its data
	// flushed): 'cairn umount' waits for it.
	if hold := holdMountpoint(mountpoint, logger); hold != nil {
		defer hold.Close()
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
	// Every object the daemon makes has an explicit mode: with umask 0,
	// local creates a root caller's objects on the request's own thread
	// (see local's FS.direct) whatever umask cairn was started with.
	syscall.Umask(0)
	stack, err := s.Build()
	if errors.Is(err, layer.ErrWrongSecret) {
		report("secret: " + err.Error())
		return fail(err, exitSecret)
	}
	if err != nil {
		report("spec: " + err.Error())
		return fail(err, exitSpec)
	}
	defer stack.Close()
	// The files of size-changing layers are served by one engine at a
	// time: a second mount of them, or an fsck, is refused while this
	// one runs. With -shared, crypt and the codecs are claimed shared:
	// other -shared mounts of them (other clients of a network file
	// system) are let in, a mount without it is not.
	cctx := context.Background()
	if m.shared {
		cctx = layer.WithSharedClaim(cctx)
		layer.ShareStack(stack.Top) // caches of what other machines change: off
	}
	if err := layer.ClaimStack(cctx, stack.Top); err != nil {
		report("mount: " + err.Error())
		return fail(err, exitMount)
	}
	opts := fusefs.Options{
		AllowOther:      m.allowOther || s.AllowOther,
		EntryTimeout:    pick(m.entry, s.EntryTimeout),
		AttrTimeout:     pick(m.attr, s.AttrTimeout),
		NegativeTimeout: pick(m.negative, s.NegativeTimeout),
		NoPassthrough:   m.noPassthrough,
		Shared:          m.shared,
		NoXattr:         m.noXattr || s.NoXattr,
		Writeback:       m.writeback || s.Writeback,
		FsName:          m.source(specArg, s),
		MountFlags:      m.vfs,
		Debug:           m.debug,
		Logger:          logger,
		LowerDirs:       stack.Dirs,
		Transport:       m.transport,
	}
	// Catch signals before the mount appears: a signal that arrives while it
	// is being made then unmounts it (instead of killing the process and
	// leaving a dead mount).
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGUSR1)
	srv, err := fusefs.Mount(mountpoint, stack.Top, opts)
	if err != nil {
		report("mount: " + err.Error())
		return fail(err, exitMount)
	}
	// Signals are caught before readiness is reported: a SIGHUP sent as
	// soon as the mount is ready must not kill the daemon.
	logger.Info("mounted", "mountpoint", mountpoint, "spec", specArg, "passthrough", srv.Passthrough, "transport", srv.Transport, "writeback", opts.Writeback, "pid", os.Getpid())
	// "ok", or "ok PATH" when the log goes to a file the user did not name.
	report(strings.TrimSpace("ok " + logPath))
	// Under systemd (Type=notify, see cairn@.service) the unit is started
	// once the mount is ready.
	sdNotify("READY=1\nMAINPID=" + strconv.Itoa(os.Getpid()))
	stats := &statsWriter{path: m.stats, srv: srv}
	defer startProfile(logger)()
	go func() {
		for sig := range sigs {
			if sig == syscall.SIGHUP {
				hangup(logger, stack, s, specArg)
				continue
			}
			if sig == syscall.SIGUSR1 {
				stats.write(logger, true)
				continue
			}
			logger.Info("unmounting", "signal", sig.String())
			if err := srv.Unmount(); err != nil {
				logger.Warn("unmount failed; the mount is busy: close the files under it, or use 'cairn umount -z'", "err", err)
			}
		}
	}()
	srv.Wait()
	stats.write(logger, false)
	sdNotify("STOPPING=1")
	logger.Info("unmounted", "mountpoint", mountpoint)
	return exitOK
}

// sdNotify sends state to systemd's notification socket ($NOTIFY_SOCKET,
// set for a Type=notify service; sd_notify(3)); without one it does
// nothing.
func sdNotify(state string) {
	addr := os.Getenv("NOTIFY_SOCKET")
	if addr == "" {
		return
	}
	if addr[0] == '@' {
		addr = "\x00" + addr[1:] // an abstract socket
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		return
	}
	defer c.Close()
	c.Write([]byte(state))
}

// source is what /proc/mounts shows as the mount's source: "cairn:" and
// the spec, or -o fsname.
func (m *mountFlags) source(specArg string, s *spec.Spec) string {
	if m.fsname != "" {
		return m.fsname
	}
	return "cairn:" + fsName(specArg, s)
}

// needsForeground refuses a background mount of a stack with a layer that
// writes to standard output (snoop's output = "stdout"): a background
// process has none, and the records would be lost.
func needsForeground(s *spec.Spec) error {
	for _, name := range s.Order {
		l := s.Layers[name]
		if t := l.TypeInfo(); t != nil && t.Option("output") != nil && l.Values != nil && l.Values.String("output") == "stdout" {
			return usagef("layer %q writes to standard output (output = \"stdout\"), which a background mount does not have: mount with -f, or use output = \"file\" with log = \"FILE\", or output = \"syslog\"", name)
		}
	}
	return nil
}

// secretFlags puts -passfile or -extpass in place of the spec's for every
// layer that takes a passphrase (see useSecretFlags).
func (m *mountFlags) secretFlags(s *spec.Spec) error {
	return useSecretFlags(s, m.passfile, m.extpass)
}

// useSecretFlags puts a --passfile or --extpass flag in place of the
// spec's for every layer that takes a passphrase (an option named
// passfile): mount and fsck take them as gocryptfs does.
func useSecretFlags(s *spec.Spec, passfile, extpass string) error {
	if passfile == "" && extpass == "" {
		return nil
	}
	if passfile != "" && extpass != "" {
		return usagef("give -passfile or -extpass, not both")
	}
	pf := passfile
	if pf != "" {
		abs, err := filepath.Abs(pf)
		if err != nil {
			return err
		}
		pf = abs
	}
	for _, name := range s.Order {
		l := s.Layers[name]
		if t := l.TypeInfo(); t != nil && t.Option("passfile") != nil && l.Values != nil {
			l.Values["passfile"], l.Values["extpass"] = pf, extpass
		}
	}
	return nil
}

// parseOptions reads -o.
func (m *mountFlags) parseOptions() error {
	for _, o := range strings.Split(m.options, ",") {
		switch k, v, _ := strings.Cut(o, "="); {
		case o == "":
		case o == "allow_other":
			m.allowOther = true
		case o == "nonempty":
			m.nonempty = true
		case o == "shared": // -shared, for fstab
			m.shared = true
		case o == "writeback": // -writeback, for fstab
			m.writeback = true
		case o == "default_permissions":
			// The kernel checks permissions whenever other users may
			// come in (allow_other); a private mount leaves them to the
			// lower file system, which checks the daemon's requests.
		case k == "fsname" && v != "":
			m.fsname = v
		case o == "subtype=cairn":
		case k == "subtype":
			return usagef("-o %s: the type stays %s, by which cairn umount and mount -t %s know a cairn mount", o, cairnType, cairnType)
		case k == "uid", k == "gid", k == "umask":
			return usagef("-o %s: not taken: a stack shows the owners and modes of the lower's files as they are (change them there, or stack an acl layer)", o)
		case k == "max_read":
			return usagef("-o %s: not taken: the mount reads and writes up to 1 MiB per request, and the kernel splits larger ones", o)
		case o == "defaults", o == "auto", o == "noauto", o == "user", o == "nouser", o == "users", o == "nofail",
			o == "_netdev", strings.HasPrefix(o, "x-"), strings.HasPrefix(o, "comment="):
			// fstab's, for mount(8) and systemd, not for the file system.
		default:
			if _, err := fusefs.ParseMountFlags([]string{o}); err != nil {
				return fmt.Errorf("-o: %w; and allow_other, default_permissions, fsname=NAME, nonempty, shared, writeback", err)
			}
			m.vfs = append(m.vfs, o)
		}
	}
	return nil
}

// mountpointDir reports a mountpoint that is not a directory (cairn check
// with a MOUNTPOINT says so too).
func mountpointDir(mp string) error {
	fi, err := os.Stat(mp)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("mountpoint %s does not exist; create it first (mkdir -p %s)", mp, mp)
	case err != nil:
		return fmt.Errorf("mountpoint %s: %v", mp, err)
	case !fi.IsDir():
		return fmt.Errorf("mountpoint %s is a file, not a directory; choose a directory (a mount covers a directory)", mp)
	}
	return nil
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
// syslog in the background. A background process with no syslog to log to
// (no /dev/log) logs to a file (logFallback) and returns its path, which
// 'cairn mount' prints.
func newLogger(m mountFlags, level slog.Level, daemon bool, mountpoint string) (*slog.Logger, func(), string, error) {
	hopts := &slog.HandlerOptions{Level: level}
	if m.debug {
		hopts.Level = slog.LevelDebug
	}
	switch {
	case m.logFile != "":
		f, err := os.OpenFile(m.logFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
		if err != nil {
			return nil, nil, "", fmt.Errorf("cannot open log file: %w", err)
		}
		return slog.New(slog.NewJSONHandler(f, hopts)), func() { f.Close() }, "", nil
	case daemon:
		w, err := syslog.New(syslog.LOG_DAEMON|syslog.LOG_INFO, "cairn")
		if err == nil {
			return slog.New(slog.NewTextHandler(w, hopts)), func() { w.Close() }, "", nil
		}
		path := logFallback(mountpoint)
		os.MkdirAll(filepath.Dir(path), 0o750)
		f, ferr := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
		if ferr != nil {
			// Nowhere to log (a user without a writable home, say):
			// keep quiet rather than fail the mount.
			return slog.New(slog.NewTextHandler(io.Discard, hopts)), func() {}, "", nil
		}
		return slog.New(slog.NewJSONHandler(f, hopts)), func() { f.Close() }, path, nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, hopts)), func() {}, "", nil
}

// logFallback is where a background mount logs when there is no syslog:
// /var/log/cairn (root) or $XDG_STATE_HOME/cairn (else ~/.local/state/cairn),
// one file per mountpoint, named after its path as systemd names mount
// units ("/mnt/x" -> mnt-x.log). CAIRN_LOG_DIR, if set, is the directory.
func logFallback(mountpoint string) string {
	dir := "/var/log/cairn"
	if d := os.Getenv("CAIRN_LOG_DIR"); d != "" {
		dir = d
	} else if os.Geteuid() != 0 {
		if d := os.Getenv("XDG_STATE_HOME"); d != "" {
			dir = filepath.Join(d, "cairn")
		} else if h, err := os.UserHomeDir(); err == nil {
			dir = filepath.Join(h, ".local", "state", "cairn")
		}
	}
	name := strings.ReplaceAll(strings.Trim(absPath(mountpoint), "/"), "/", "-")
	if name == "" {
		name = "-"
	}
	return filepath.Join(dir, name+".log")
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
		sw = w2
		cmd.ExtraFiles = append(cmd.ExtraFiles, sr)
		cmd.Env = append(cmd.Env, secretEnv+"=4")
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fail(fmt.Errorf("cannot start the background process: %w", err), exitFailed)
	}
	w.Close()
	devnull.Close()
	for _, f := range cmd.ExtraFiles[1:] {
		f.Close() // the child's end of the secrets pipe: a child that dies unread must not block the writer
	}
	if sw != nil {
		// Written while the report is read: neither side waits for the other.
		go func() {
			json.NewEncoder(sw).Encode(secrets)
			sw.Close()
		}()
	}
	return awaitReady(cmd, r)
}

// maxReport bounds how much of the background process's report is kept.
const maxReport = 1 << 20

// awaitReady reads the background process's report on r: "ok" when the
// mount is ready, else "spec: ..." or "mount: ..." and the message, which may
// be long and hold several lines. All of it is read before the process is
// waited for: a process blocked writing a long message into a full pipe
// would otherwise never exit.
func awaitReady(cmd *exec.Cmd, r io.ReadCloser) int {
	defer r.Close()
	br := bufio.NewReader(r)
	line, err := br.ReadString('\n')
	if path, ok := strings.CutPrefix(strings.TrimSpace(line), "ok "); ok {
		// Said to a person at a terminal; scripts (and mount(8)) get
		// nothing on success, as from any mount.
		if term.IsTerminal(int(os.Stderr.Fd())) {
			fmt.Fprintf(os.Stderr, "cairn: no syslog (no /dev/log): the mount logs to %s\n", path)
		}
		line = "ok"
	}
	if strings.TrimSpace(line) == "ok" {
		cmd.Process.Release()
		return exitOK
	}
	var rest bytes.Buffer
	if err == nil {
		_, err = io.Copy(&rest, io.LimitReader(br, maxReport))
		if n, _ := io.Copy(io.Discard, br); n > 0 {
			fmt.Fprintf(&rest, "\n... (%d more bytes)", n)
		}
	}
	state, _ := cmd.Process.Wait()
	report := strings.TrimSpace(line + rest.String())
	if report == "" {
		if err == nil || err == io.EOF {
			err = fmt.Errorf("exited with %v before the mount was ready", state)
		}
		return fail(fmt.Errorf("the background process failed: %v", err), exitMount)
	}
	kind, msg, _ := strings.Cut(report, ": ")
	switch kind {
	case "spec":
		return fail(errors.New(msg), exitSpec)
	case "secret":
		return fail(errors.New(msg), exitSecret)
	}
	return fail(errors.New(msg), exitMount)
}

func runUmount(args []string) int {
	fl := flag.NewFlagSet("umount", flag.ContinueOnError)
	lazy := fl.Bool("z", false, "lazy: detach now, finish when the files in use are closed (does not wait)")
	timeout := fl.Duration("timeout", time.Minute, "how long to wait for the process that served the mount to finish")
	fl.Usage = func() {
		fmt.Fprintf(fl.Output(), `Usage: cairn umount [-z] [-timeout D] MOUNTPOINT

Unmounts a cairn mount and waits until the process that served it has
written out its data and exited, so that the next command (cairn fsck, a
new mount) can run at once. Exits 1 if that takes longer than -timeout
(the mount is gone by then; the process is still finishing). Refuses a
mountpoint where nothing is mounted and a mount that is not cairn's; a dead
mount (its process was killed) unmounts as any other, lazily (-z) if it is
still in use.

Flags:
`)
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
	if err := checkUnmountable(mp); err != nil {
		return fail(err, exitFailed)
	}
	err := fusefs.Unmount(mp, *lazy)
	if errors.Is(err, syscall.EBUSY) && isDead(mp) {
		// Nothing serves a dead mount: the processes that still use it
		// get errors whatever happens, so detach it now.
		fmt.Fprintf(os.Stderr, "cairn: %s is a dead mount still in use (a process's directory or open file is under it): detached lazily\n", mp)
		err, *lazy = fusefs.Unmount(mp, true), true
	}
	if err != nil {
		hint := ""
		if errors.Is(err, syscall.EBUSY) {
			hint = " (files under it are in use: close them, or use -z)"
		} else if errors.Is(err, syscall.EINVAL) {
			hint = " (nothing is mounted there)"
		}
		return fail(fmt.Errorf("umount %s: %v%s", mp, err, hint), exitFailed)
	}
	if *lazy {
		return exitOK
	}
	if err := waitServer(mp, *timeout); err != nil {
		return fail(err, exitFailed)
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

// holdMountpoint locks the directory a mount will cover (before it is
// mounted) for as long as this process lives: 'cairn umount' takes the
// same lock once the mount is gone, and so returns only when the process
// that served it has closed its stack and exited. A directory that cannot
// be locked only means umount will not wait.
func holdMountpoint(mountpoint string, logger *slog.Logger) *os.File {
	f, err := os.Open(mountpoint)
	if err != nil {
		logger.Warn("cannot open the mountpoint to lock it; cairn umount will not wait for this process", "err", err)
		return nil
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		// Another cairn process that served this mountpoint is still
		// finishing (after umount -z); this one goes ahead.
		logger.Warn("the mountpoint is locked by another process; cairn umount will not wait for this one", "err", err)
		f.Close()
		return nil
	}
	return f
}

// waitServer waits, after an unmount, until no process holds the lock that
// holdMountpoint takes on the directory under the mount.
// (Nothing under the mount is looked at before it is gone: a server that
// does not answer must not hang umount.)
func waitServer(mp string, timeout time.Duration) error {
	f, err := os.Open(mp)
	if err != nil {
		return nil // nothing to wait on (a mountpoint we may not read)
	}
	defer f.Close()
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB)
		if err == nil {
			syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
			return nil
		}
		if err != syscall.EWOULDBLOCK && err != syscall.EINTR {
			return nil // a file system without locks: nothing to wait on
		}
		if time.Now().After(deadline) {
			who := "the process that served it"
			if pid := lockHolder(f); pid > 0 {
				who = fmt.Sprintf("%s (pid %d)", who, pid)
			}
			return fmt.Errorf("umount %s: unmounted, but %s is still writing out its data after %v; wait for it to exit before running cairn fsck or mounting the stack again", mp, who, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// lockHolder finds in /proc/locks the process that holds a flock on f's
// inode (0 if none is found).
func lockHolder(f *os.File) int {
	var st syscall.Stat_t
	if syscall.Fstat(int(f.Fd()), &st) != nil {
		return 0
	}
	id := fmt.Sprintf("%02x:%02x:%d", unix.Major(uint64(st.Dev)), unix.Minor(uint64(st.Dev)), st.Ino)
	b, err := os.ReadFile("/proc/locks")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		fl := strings.Fields(l)
		// 1: FLOCK  ADVISORY  WRITE 1234 00:2d:5678 0 EOF
		if len(fl) >= 6 && fl[1] == "FLOCK" && fl[5] == id {
			pid, _ := strconv.Atoi(fl[4])
			return pid
		}
	}
	return 0
}
