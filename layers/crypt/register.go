package crypt

import (
	"context"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/registry"
)

func init() {
	registry.Register(registry.Type{
		Name:      "crypt",
		Summary:   "encrypts and authenticates contents, names, symlink targets and xattrs (XChaCha20-Poly1305 or AES-256-GCM, AES-SIV); 'cairn init' creates it",
		MinLowers: 1, MaxLowers: 1,
		Changes: layer.ChangesNames | layer.ChangesData | layer.ChangesAttrs,
		Finds:   true, // layer.Finder: the lower finds, names are decrypted
		Lacks:   layer.FSTmpfile,
		Options: []registry.Option{
			{Name: "passfile", Kind: registry.Path, Help: "read the passphrase from the first line of this file (default: ask on the terminal)"},
			{Name: "extpass", Kind: registry.String, Help: "run this command (sh -c) and read the passphrase from the first line of its output"},
			{Name: "unlock", Kind: registry.String, Default: "passphrase", Allowed: []string{"passphrase", "masterkey"},
				Help: "what the secret is: the passphrase, or the master key that 'cairn init --print-master-key' showed"},
			{Name: "journal", Kind: registry.Bool, Default: true,
				Help: "copy each block to a journal before rewriting it in place, so that a crash of the daemon cannot leave a block half old and half new (EIO): off saves a read and a write per in-place rewrite"},
		},
		Secret: func(o registry.Values) ([]byte, error) { return secret(o, true) },
		New: func(l []layer.FS, o registry.Values) (layer.FS, error) {
			s := o.Secret()
			if s == nil {
				var err error
				if s, err = secret(o, false); err != nil {
					return nil, err
				}
			}
			// The secret is not needed once the volume is open: clear
			// it (the slice is the one the spec's values hold).
			defer clear(s)
			return Unlock(context.Background(), l[0], s, o.String("unlock") == "masterkey", Options{NoJournal: !o.Bool("journal")})
		},
	})
}

func secret(o registry.Values, ask bool) ([]byte, error) {
	what := "passphrase"
	if o.String("unlock") == "masterkey" {
		what = "master key"
	}
	return GetSecret(o.String("passfile"), o.String("extpass"), what, ask, false)
}
