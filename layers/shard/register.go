package shard

import (
	"fmt"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/registry"
)

// DefaultBuckets is the hash bucket count where none is given (see
// docs/shard.md for the measurement behind it).
const DefaultBuckets = 256

// DefaultPrefix begins the names of bucket directories.
const DefaultPrefix = ".shard."

func init() {
	registry.Register(registry.Type{
		Name:      "shard",
		Summary:   "keeps the entries of large directories in hashed bucket subdirectories of the lower, with stable listings and online resharding (Usenetfs)",
		MinLowers: 1, MaxLowers: 1,
		Changes: layer.ChangesNames | layer.ChangesPlacement,
		Options: []registry.Option{
			{Name: "scheme", Kind: registry.String, Default: Hash, Allowed: []string{Hash, Digits},
				Help: "how a name chooses its bucket: hash (of the name) or digits (a number's last digits, Usenetfs's; other names by hash)"},
			{Name: "buckets", Kind: registry.Int, Default: int64(0),
				Help: fmt.Sprintf("buckets per sharded directory: a power of two for hash, 10, 100 or 1000 for digits; 0: %d for hash, 1000 for digits", DefaultBuckets)},
			{Name: "prefix", Kind: registry.String, Default: DefaultPrefix,
				Help: "the beginning of bucket directories' names in the lower; in a directory a rule covers, names that begin with it cannot be made (EINVAL); a directory to convert that holds such names is refused until they are renamed or another prefix is chosen"},
		},
		Rules: &registry.RuleSpec{
			Help: "directories the first rule covers are sharded when made or resharded (cairn reshard); without rules, every directory is",
			Options: []registry.Option{
				{Name: "scheme", Kind: registry.String, Allowed: []string{Hash, Digits}, Help: "the layer's scheme for these directories"},
				{Name: "buckets", Kind: registry.Int, Help: "the layer's bucket count for these directories"},
			},
		},
		Check: func(o registry.Values, lowers int) error {
			if _, err := config(o); err != nil {
				return &registry.OptionError{Option: "buckets", Err: err}
			}
			return nil
		},
		New: func(l []layer.FS, o registry.Values) (layer.FS, error) {
			c, err := config(o)
			if err != nil {
				return nil, err
			}
			return New(l[0], c)
		},
	})
}

func config(o registry.Values) (Config, error) {
	d := Layout{Scheme: o.String("scheme"), Buckets: int(o.Int("buckets")), Prefix: o.String("prefix")}
	if d.Buckets == 0 {
		d.Buckets = DefaultBuckets
		if d.Scheme == Digits {
			d.Buckets = 1000
		}
	}
	if err := d.Check(); err != nil {
		return Config{}, err
	}
	c := Config{Rules: o.Rules(), Default: d}
	for _, r := range c.Rules {
		if err := ruleLayout(r, d).Check(); err != nil {
			return Config{}, fmt.Errorf("rule at %s: %v", r.Where, err)
		}
	}
	return c, nil
}
