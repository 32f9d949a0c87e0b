package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/crypt"
	"cairnfs.dev/cairn/layers/local"
	"cairnfs.dev/cairn/registry"
	"cairnfs.dev/cairn/spec"
)

func init() {
	register(&command{name: "init", args: "[flags] SPEC",
		summary: "create the encrypted volume of the spec's crypt layer", run: runInit})
	register(&command{name: "passwd", args: "[flags] SPEC",
		summary: "change a crypt layer's passphrase (no data is re-encrypted)", run: runPasswd})
}

// kdfFlags are the key-derivation choices of init and passwd.
type kdfFlags struct {
	fl            *flag.FlagSet
	name          string
	time, threads uint64
	memory        string
	scryptN       int64
}

func (k *kdfFlags) add(fl *flag.FlagSet) {
	d := crypt.DefaultKDF()
	k.fl = fl
	fl.StringVar(&k.name, "kdf", d.Name, "key derivation from the passphrase: argon2id or scrypt")
	fl.Uint64Var(&k.time, "argon2-time", d.Time, fmt.Sprintf("argon2id passes (%d..%d)", crypt.Argon2MinTime, crypt.Argon2MaxTime))
	fl.StringVar(&k.memory, "argon2-memory", "64MiB", fmt.Sprintf("argon2id memory (%dMiB..%dGiB)", crypt.Argon2MinMemoryKiB>>10, crypt.Argon2MaxMemoryKiB>>20))
	fl.Uint64Var(&k.threads, "argon2-threads", d.Threads, fmt.Sprintf("argon2id lanes (%d..%d)", crypt.Argon2MinThreads, crypt.Argon2MaxThreads))
	fl.Int64Var(&k.scryptN, "scrypt-n", 1<<16, fmt.Sprintf("scrypt cost N (a power of two, %d..%d; r=8, p=1)", crypt.ScryptMinN, crypt.ScryptMaxN))
}

// given reports which of the KDF flags the command line set.
func (k *kdfFlags) given() map[string]bool {
	set := map[string]bool{}
	k.fl.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "kdf", "argon2-time", "argon2-memory", "argon2-threads", "scrypt-n":
			set[f.Name] = true
		}
	})
	return set
}

// kdfFlagNames says which flag sets which field of the configuration.
var kdfFlagNames = strings.NewReplacer("kdf.time", "--argon2-time", "kdf.memory_kib", "--argon2-memory (KiB)",
	"kdf.threads", "--argon2-threads", "kdf.n", "--scrypt-n", "kdf.name", "--kdf")

// kdf returns the settings the flags give, over base (the stored settings
// of passwd, or the defaults): a flag that is not given keeps base's
// value when the KDF stays the same. The values are range-checked as given
// (nothing is converted to a narrower type before).
func (k *kdfFlags) kdf(base crypt.KDF) (crypt.KDF, error) {
	set := k.given()
	out := base
	if set["kdf"] && k.name != base.Name {
		switch k.name {
		case crypt.Argon2id:
			out = crypt.DefaultKDF()
		case crypt.Scrypt:
			out = crypt.KDF{Name: crypt.Scrypt, N: 1 << 16, R: 8, P: 1}
		default:
			return crypt.KDF{}, usagef("--kdf must be argon2id or scrypt, not %q", k.name)
		}
	}
	out.Salt = nil
	switch out.Name {
	case crypt.Argon2id:
		if set["scrypt-n"] {
			return crypt.KDF{}, usagef("--scrypt-n is for --kdf scrypt")
		}
		if set["argon2-time"] {
			out.Time = k.time
		}
		if set["argon2-threads"] {
			out.Threads = k.threads
		}
		if set["argon2-memory"] {
			m, err := registry.ParseSize(k.memory)
			if err != nil {
				return crypt.KDF{}, usagef("--argon2-memory: %v", err)
			}
			out.MemoryKiB = uint64(m) >> 10
		}
	case crypt.Scrypt:
		if set["argon2-time"] || set["argon2-threads"] || set["argon2-memory"] {
			return crypt.KDF{}, usagef("the --argon2-* flags are for --kdf argon2id")
		}
		if set["scrypt-n"] {
			if k.scryptN < 0 || k.scryptN > 1<<40 {
				return crypt.KDF{}, usagef("--scrypt-n %d is out of range (allowed %d..%d)", k.scryptN, crypt.ScryptMinN, crypt.ScryptMaxN)
			}
			out.N = int(k.scryptN)
		}
	}
	if err := out.Check(); err != nil {
		return crypt.KDF{}, usagef("%s", kdfFlagNames.Replace(strings.ReplaceAll(err.Error(), "\n", "; ")))
	}
	return out, nil
}

// weaker says how the new settings cost an attacker less than the old
// ones (empty if they do not).
func weaker(old, new crypt.KDF) string {
	if old.Name != new.Name {
		return ""
	}
	var w []string
	less := func(what string, a, b uint64) {
		if b < a {
			w = append(w, fmt.Sprintf("%s %d -> %d", what, a, b))
		}
	}
	less("passes", old.Time, new.Time)
	less("memory KiB", old.MemoryKiB, new.MemoryKiB)
	less("N", uint64(old.N), uint64(new.N))
	less("r", uint64(old.R), uint64(new.R))
	return strings.Join(w, ", ")
}

// cryptLayer finds the crypt layer of a spec (the one named, or the only
// one) and builds the stack below it.
func cryptLayer(specArg, name string) (*spec.Layer, layer.FS, func(), error) {
	s, err := loadSpec(specArg)
	if err != nil {
		return nil, nil, nil, errors.New(spec.Detail(err))
	}
	var found []*spec.Layer
	for _, n := range s.Order {
		if l := s.Layers[n]; l.Type == "crypt" && (name == "" || n == name) {
			found = append(found, l)
		}
	}
	switch {
	case len(found) == 0 && name != "":
		return nil, nil, nil, fmt.Errorf("%s has no crypt layer called %q", specArg, name)
	case len(found) == 0:
		return nil, nil, nil, fmt.Errorf("%s has no layer of type crypt", specArg)
	case len(found) > 1:
		return nil, nil, nil, usagef("%s has %d crypt layers: say which with --layer", specArg, len(found))
	}
	l := found[0]
	below := *s
	below.Mount = l.Over[0]
	st, err := below.Build()
	if err != nil {
		return nil, nil, nil, err
	}
	return l, st.Top, func() { st.Close() }, nil
}

func runInit(args []string) int {
	fl := flag.NewFlagSet("init", flag.ContinueOnError)
	var k kdfFlags
	k.add(fl)
	layerName := fl.String("layer", "", "the crypt layer to initialise (needed when the spec has several)")
	passfile := fl.String("passfile", "", "read the passphrase from this file (default: the layer's passfile, else ask twice)")
	extpass := fl.String("extpass", "", "run this command for the passphrase (default: the layer's extpass)")
	cipher := fl.String("cipher", crypt.XChaCha20Poly1305, "cipher of contents, symlink targets and xattr values: xchacha20-poly1305 (192-bit random nonces: no limit on writes), or aes-256-gcm (faster with AES instructions; random 96-bit nonces: at most 2^32 block writes per file and 2^32 symlinks and xattr writes per volume, docs/crypt.md)")
	blockSize := fl.String("block-size", "4KiB", "plaintext bytes per encrypted block")
	printKey := fl.Bool("print-master-key", false, "print the master key once, for recovery (keep it safe: it opens the data without the passphrase)")
	fl.Usage = func() {
		fmt.Fprintf(fl.Output(), `Usage: cairn init [flags] SPEC

Creates the encrypted volume of SPEC's crypt layer in the layer below it: a
random master key, wrapped by a key derived from the passphrase, in the file
%s there, and the root directory's IV.

If that layer is a directory that holds files already, they are encrypted
into the new volume: init writes the volume in DIR.cairn-init beside it
(names, contents, owners, modes, times, xattrs, hard links, symlinks, holes;
with a progress bar), makes it durable, exchanges it with DIR in one rename,
and keeps the plain files as DIR.plain-TIME for you to remove once the
mount shows them (it needs room for that second copy, on the same file
system). A run that stops before the exchange leaves DIR as it was
and DIR.cairn-init, which the next run removes. The old plain bytes stay on
the disk until that copy is removed, and even then may remain in free
blocks: encrypting a directory in place is no substitute for encrypting an
empty one on a fresh disk.

Flags:
`, crypt.ConfigName)
		fl.PrintDefaults()
	}
	if code, ok := parseArgs(fl, args); !ok {
		return code
	}
	if fl.NArg() != 1 {
		fl.Usage()
		return fail(usagef("init needs SPEC"), exitUsage)
	}
	kdf, err := k.kdf(crypt.DefaultKDF())
	if err != nil {
		return fail(err, exitUsage)
	}
	bs, err := registry.ParseSize(*blockSize)
	if err != nil {
		return fail(usagef("--block-size: %v", err), exitUsage)
	}
	l, lower, done, err := cryptLayer(fl.Arg(0), *layerName)
	if err != nil {
		return fail(err, exitSpec)
	}
	defer done()
	pf, ep := pick2(*passfile, *extpass, l.Values)
	pass, err := crypt.GetSecret(pf, ep, "passphrase", true, true)
	if err != nil {
		return fail(err, exitFailed)
	}
	defer clear(pass)
	params := crypt.InitParams{Cipher: *cipher, BlockSize: int(bs), KDF: kdf}
	empty, err := isEmptyDir(context.Background(), lower)
	if err != nil {
		return fail(fmt.Errorf("init: %v", err), exitFailed)
	}
	var master []byte
	kept := ""
	_, isLocal := lower.(*local.FS)
	switch {
	case empty:
		master, err = crypt.Init(context.Background(), lower, params, pass)
	case !isLocal:
		err = fmt.Errorf("the layer below %q is not empty, and is not a directory that init can encrypt (only a local layer's)", l.Name)
	default:
		// Files are there: encrypt them into a new volume in their place.
		if _, cerr := crypt.ReadConfig(context.Background(), lower); cerr == nil {
			err = fmt.Errorf("%s holds a volume already (%s)", layer.LowerDir(lower), crypt.ConfigName)
			break
		}
		if release, lerr := layer.LockLower(context.Background(), lower, l.Name); lerr != nil {
			code := exitFailed
			if errors.Is(lerr, layer.ErrInUse) {
				code = exitBusy
			}
			return fail(fmt.Errorf("init: %w", lerr), code)
		} else {
			defer release()
		}
		master, kept, err = initExisting(layer.LowerDir(lower), params, pass, os.Stderr)
	}
	if err != nil {
		return fail(fmt.Errorf("init: %v", err), exitFailed)
	}
	fmt.Printf("cairn: layer %q is ready (%s, %d-byte blocks, %s); mount it with 'cairn mount %s MOUNTPOINT'\n",
		l.Name, *cipher, bs, kdf.Name, fl.Arg(0))
	if kept != "" {
		fmt.Printf("cairn: the files that were in %s are encrypted in it; the plain files are kept in %s: remove them (with care: shred or a discard does not reach every copy) once the mount shows them\n",
			layer.LowerDir(lower), kept)
	}
	if *printKey {
		fmt.Printf("\nMaster key (it opens the data without the passphrase: keep it offline; mount with it by unlock = \"masterkey\"):\n\n    %s\n\n",
			crypt.FormatMasterKey(master))
	}
	clear(master)
	return exitOK
}

// pick2 takes the passphrase source from the flags, else from the layer's
// options.
func pick2(passfile, extpass string, v registry.Values) (string, string) {
	if passfile == "" && extpass == "" && v != nil {
		return v.String("passfile"), v.String("extpass")
	}
	return passfile, extpass
}

func runPasswd(args []string) int {
	fl := flag.NewFlagSet("passwd", flag.ContinueOnError)
	var k kdfFlags
	k.add(fl)
	layerName := fl.String("layer", "", "the crypt layer (needed when the spec has several)")
	passfile := fl.String("passfile", "", "the current passphrase from this file (default: the layer's passfile, else ask)")
	extpass := fl.String("extpass", "", "the current passphrase from this command (default: the layer's extpass)")
	byKey := fl.Bool("masterkey", false, "the current secret is the master key (recovery), not the passphrase")
	newfile := fl.String("new-passfile", "", "the new passphrase from this file (default: ask twice)")
	newext := fl.String("new-extpass", "", "the new passphrase from this command")
	fl.Usage = func() {
		fmt.Fprintf(fl.Output(), `Usage: cairn passwd [flags] SPEC

Wraps the master key of SPEC's crypt layer with a new passphrase. The stored
key-derivation settings are kept unless a flag changes them (a flag that makes
them cheaper to attack is noted). The data is not re-encrypted. A mounted
volume is refused (exit 5): unmount it first.

Flags:
`)
		fl.PrintDefaults()
	}
	if code, ok := parseArgs(fl, args); !ok {
		return code
	}
	if fl.NArg() != 1 {
		fl.Usage()
		return fail(usagef("passwd needs SPEC"), exitUsage)
	}
	l, lower, done, err := cryptLayer(fl.Arg(0), *layerName)
	if err != nil {
		return fail(err, exitSpec)
	}
	defer done()
	// A mounted volume keeps its key in memory and is claimed by its
	// daemon (crypt's Claim): refuse rather than change it underneath.
	release, err := layer.LockLowerFile(context.Background(), lower, l.Name, crypt.ConfigName)
	if err != nil {
		code := exitFailed
		if errors.Is(err, layer.ErrInUse) {
			code = exitBusy
		}
		return fail(fmt.Errorf("passwd: %w", err), code)
	}
	defer release()
	// The stored settings stay unless a flag changes them.
	var kdf crypt.KDF
	if len(k.given()) > 0 {
		cfg, err := crypt.ReadConfig(context.Background(), lower)
		if err != nil {
			return fail(fmt.Errorf("passwd: %v", err), exitFailed)
		}
		if kdf, err = k.kdf(cfg.KDF); err != nil {
			return fail(err, exitUsage)
		}
		if w := weaker(cfg.KDF, kdf); w != "" {
			fmt.Fprintf(os.Stderr, "cairn: passwd: note: the new key derivation is cheaper to attack than the old one (%s)\n", w)
		} else if cfg.KDF.Name != kdf.Name {
			fmt.Fprintf(os.Stderr, "cairn: passwd: note: the key derivation changes from %s to %s\n", cfg.KDF.Name, kdf.Name)
		}
	}
	what := "current passphrase"
	if *byKey {
		what = "master key"
	}
	pf, ep := pick2(*passfile, *extpass, l.Values)
	old, err := crypt.GetSecret(pf, ep, what, true, false)
	if err != nil {
		return fail(err, exitFailed)
	}
	defer clear(old)
	var master []byte
	if *byKey {
		if master, err = crypt.ParseMasterKey(string(old)); err != nil {
			return fail(err, exitFailed)
		}
	}
	pass, err := crypt.GetSecret(*newfile, *newext, "new passphrase", true, true)
	if err != nil {
		return fail(err, exitFailed)
	}
	defer clear(pass)
	if err := crypt.ChangePassphrase(context.Background(), lower, old, master, pass, kdf); err != nil {
		code := exitFailed
		if errors.Is(err, layer.ErrWrongSecret) {
			code = exitSecret
		}
		return fail(fmt.Errorf("passwd: %w", err), code)
	}
	fmt.Fprintf(os.Stdout, "cairn: the passphrase of layer %q is changed\n", l.Name)
	return exitOK
}
