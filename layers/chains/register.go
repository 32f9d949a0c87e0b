package chains

import (
	"context"
	"errors"
	"fmt"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/crypt"
	"cairnfs.dev/cairn/layers/local"
	"cairnfs.dev/cairn/registry"
)

func init() {
	registry.Register(registry.Type{
		Name:      "chains",
		Summary:   "per-file chains of transformations (MonA): rules give new files a chain of codec and crypt links, recorded with the file; user.cairn.chain shows, pushes and pops it; files without one pass through",
		MinLowers: 1, MaxLowers: 1,
		Changes: layer.ChangesData | layer.ChangesAttrs,
		PerFile: true,
		Lacks:   layer.FSTmpfile,
		Options: []registry.Option{
			{Name: "crypt_dir", Kind: registry.Dir, Help: "a directory holding a crypt volume's configuration (" + crypt.ConfigName + ", made by 'cairn init' of a crypt layer over it): the key of crypt links (without it, a crypt link gives EACCES)"},
			{Name: "passfile", Kind: registry.Path, Help: "read the crypt passphrase from the first line of this file (default: ask on the terminal, if crypt_dir is set)"},
			{Name: "extpass", Kind: registry.String, Help: "run this command (sh -c) and read the crypt passphrase from the first line of its output"},
			{Name: "unlock", Kind: registry.String, Default: "passphrase", Allowed: []string{"passphrase", "masterkey"},
				Help: "what the secret is: the passphrase, or the master key that 'cairn init --print-master-key' showed"},
			{Name: "view_budget", Kind: registry.Size, Default: int64(DefaultViewBudget),
				Help: "the memory all open transformation links may hold for their views together; an open beyond it waits a second for room, then fails with ENOMEM",
				Check: func(v any) error {
					if n, _ := v.(int64); n <= 0 {
						return errors.New("must be more than 0")
					}
					return nil
				}},
		},
		Rules: &registry.RuleSpec{
			Help: "the first rule that covers a new file's path gives it its chain (none: the file is unguarded)",
			Options: []registry.Option{
				{Name: "chain", Kind: registry.List, Required: true, Help: "the links, top first: codec names (copy, zstd, gzip, lz4, uuencode) and crypt (last only)",
					Check: func(v any) error { l, _ := v.([]string); return checkNames(l, true) }},
			},
		},
		Secret: func(o registry.Values) ([]byte, error) {
			if o.String("crypt_dir") == "" {
				return nil, nil
			}
			return secret(o, true)
		},
		New: func(l []layer.FS, o registry.Values) (layer.FS, error) {
			opts := Options{ViewBudget: o.Int("view_budget")}
			for _, r := range o.Rules() {
				opts.Rules = append(opts.Rules, Rule{Paths: r.Paths, Chain: r.Values.List("chain")})
			}
			if dir := o.String("crypt_dir"); dir != "" {
				s := o.Secret()
				if s == nil {
					var err error
					if s, err = secret(o, false); err != nil {
						return nil, err
					}
				}
				defer clear(s)
				c, err := OpenCrypt(l[0], dir, s, o.String("unlock") == "masterkey")
				if err != nil {
					return nil, err
				}
				opts.Crypt = c
			}
			return New(l[0], opts)
		},
	})
}

// OpenCrypt makes crypt's content encryption for the links of a chains
// layer over lower, with the volume configuration in dir and its secret.
func OpenCrypt(lower layer.FS, dir string, secret []byte, isMasterKey bool) (*crypt.Content, error) {
	ctx := context.Background()
	cl, err := local.New(dir)
	if err != nil {
		return nil, err
	}
	defer layer.CloseStack(cl)
	cfg, err := crypt.ReadConfig(ctx, cl)
	if err != nil {
		return nil, err
	}
	var master []byte
	if isMasterKey {
		if master, err = crypt.ParseMasterKey(string(secret)); err == nil {
			err = cfg.CheckMasterKey(master)
		}
	} else {
		master, err = cfg.Unwrap(secret)
	}
	if err != nil {
		return nil, fmt.Errorf("crypt_dir %s: %w", dir, err)
	}
	defer clear(master)
	return crypt.NewContent(lower, cfg, master, crypt.Options{})
}

func secret(o registry.Values, ask bool) ([]byte, error) {
	what := "passphrase"
	if o.String("unlock") == "masterkey" {
		what = "master key"
	}
	s, err := crypt.GetSecret(o.String("passfile"), o.String("extpass"), what, ask, false)
	if err != nil {
		return nil, errors.Join(errors.New("chains: the key of crypt links"), err)
	}
	return s, nil
}
