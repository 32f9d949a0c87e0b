package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"cairn/layer"
	"cairn/layers/crypt"
	"cairn/registry"
	"cairn/spec"
)

func init() {
	register(&command{name: "init", args: "[flags] SPEC",
		summary: "create the encrypted volume of the spec's crypt layer", run: runInit})
	register(&command{name: "passwd", args: "[flags] SPEC",
		summary: "change a crypt layer's passphrase (no data is re-encrypted)", run: runPasswd})
}

// kdfFlags are the key-derivation choices of init and passwd.
type kdfFlags struct {
	name          string
	time, threads uint
	memory        string
	scryptN       int
}

func (k *kdfFlags) add(fl *flag.FlagSet) {
	fl.StringVar(&k.name, "kdf", crypt.Argon2id, "key derivation from the passphrase: argon2id or scrypt")
	fl.UintVar(&k.time, "argon2-time", 3, "argon2id passes")
	fl.StringVar(&k.memory, "argon2-memory", "64MiB", "argon2id memory")
	fl.UintVar(&k.threads, "argon2-threads", 4, "argon2id lanes")
	fl.IntVar(&k.scryptN, "scrypt-n", 1<<16, "scrypt cost N (a power of two; r=8, p=1)")
}

func (k *kdfFlags) kdf() (crypt.KDF, error) {
	switch k.name {
	case crypt.Argon2id:
		m, err := registry.ParseSize(k.memory)
		if err != nil {
			return crypt.KDF{}, usagef("--argon2-memory: %v", err)
		}
		return crypt.KDF{Name: crypt.Argon2id, Time: uint32(k.time), MemoryKiB: uint32(m >> 10), Threads: uint8(k.threads)}, nil
	case crypt.Scrypt:
		return crypt.KDF{Name: crypt.Scrypt, N: k.scryptN, R: 8, P: 1}, nil
	}
	return crypt.KDF{}, usagef("--kdf must be argon2id or scrypt, not %q", k.name)
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
	cipher := fl.String("cipher", crypt.AES256GCM, "content cipher: aes-256-gcm, or xchacha20-poly1305 for machines without AES instructions")
	blockSize := fl.String("block-size", "4KiB", "plaintext bytes per encrypted block")
	printKey := fl.Bool("print-master-key", false, "print the master key once, for recovery (keep it safe: it opens the data without the passphrase)")
	fl.Usage = func() {
		fmt.Fprintf(fl.Output(), `Usage: cairn init [flags] SPEC

Creates the encrypted volume of SPEC's crypt layer in the (empty) layer below
it: a random master key, wrapped by a key derived from the passphrase, in the
file %s there, and the root directory's IV.

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
	kdf, err := k.kdf()
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
	master, err := crypt.Init(context.Background(), lower, crypt.InitParams{Cipher: *cipher, BlockSize: int(bs), KDF: kdf}, pass)
	if err != nil {
		return fail(fmt.Errorf("init: %v", err), exitFailed)
	}
	fmt.Printf("cairn: layer %q is ready (%s, %d-byte blocks, %s); mount it with 'cairn mount %s MOUNTPOINT'\n",
		l.Name, *cipher, bs, kdf.Name, fl.Arg(0))
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

Wraps the master key of SPEC's crypt layer with a new passphrase (and new
key-derivation parameters). The data is not re-encrypted. Unmount first.

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
	kdf, err := k.kdf()
	if err != nil {
		return fail(err, exitUsage)
	}
	l, lower, done, err := cryptLayer(fl.Arg(0), *layerName)
	if err != nil {
		return fail(err, exitSpec)
	}
	defer done()
	what := "current passphrase"
	if *byKey {
		what = "master key"
	}
	pf, ep := pick2(*passfile, *extpass, l.Values)
	old, err := crypt.GetSecret(pf, ep, what, true, false)
	if err != nil {
		return fail(err, exitFailed)
	}
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
	if err := crypt.ChangePassphrase(context.Background(), lower, old, master, pass, kdf); err != nil {
		return fail(fmt.Errorf("passwd: %v", err), exitFailed)
	}
	fmt.Fprintf(os.Stdout, "cairn: the passphrase of layer %q is changed\n", l.Name)
	return exitOK
}
