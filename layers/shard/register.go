package shard

import (
	"fmt"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/registry"
)

// DefaultBuckets is the fixed hash bucket count where none is given and
// the layout does not grow (max_bucket = 0; see
// docs/shard.md for the measurement behind it).
const DefaultBuckets = 256

// DefaultMaxBucket is the average bucket size past which a growing
// directory splits its buckets (see docs/shard.md).
const DefaultMaxBucket = 4096

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
				Help: fmt.Sprintf("a fixed bucket count per sharded directory: a power of two for hash, 10, 100 or 1000 for digits; 0: hash directories grow (see max_bucket), digits ones get 1000; given for hash, or with max_bucket = 0 (then 0 means %d), directories get that many from the start and never grow by themselves", DefaultBuckets)},
			{Name: "max_bucket", Kind: registry.Int, Default: int64(DefaultMaxBucket),
				Help: "hash directories whose bucket count is not fixed start with one bucket, and the daemon splits their buckets (doubling their count, or more) in the background when the average bucket holds more entries than this; 0: no growth"},
			{Name: "prefix", Kind: registry.String, Default: DefaultPrefix,
				Help: "the beginning of bucket directories' names in the lower; in a directory a rule covers, names that begin with it cannot be made (EINVAL); a directory to convert that holds such names is refused until they are renamed or another prefix is chosen"},
		},
		Rules: &registry.RuleSpec{
			Help: "directories the first rule covers are sharded when made or resharded (cairn reshard); without rules, every directory is",
			Options: []registry.Option{
				{Name: "scheme", Kind: registry.String, Allowed: []string{Hash, Digits}, Help: "the layer's scheme for these directories"},
				{Name: "buckets", Kind: registry.Int, Help: "the layer's buckets option for these directories (given: a fixed count)"},
				{Name: "max_bucket", Kind: registry.Int, Help: "the layer's max_bucket option for these directories"},
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
	c := Config{Rules: o.Rules(), MaxBucket: int(o.Int("max_bucket"))}
	if c.MaxBucket < 0 {
		return Config{}, fmt.Errorf("max_bucket %d: 0 or more", c.MaxBucket)
	}
	if d.Buckets != 0 {
		c.MaxBucket = 0 // a fixed count: existing specs keep their layouts
	} else {
		d.Buckets = DefaultBuckets
		if d.Scheme == Digits {
			d.Buckets = 1000
		}
	}
	if err := d.Check(); err != nil {
		return Config{}, err
	}
	c.Default = d
	for _, r := range c.Rules {
		l, grow := rulePolicy(r, d, c.MaxBucket)
		if err := l.Check(); err != nil {
			return Config{}, fmt.Errorf("rule at %s: %v", r.Where, err)
		}
		if grow < 0 {
			return Config{}, fmt.Errorf("rule at %s: max_bucket %d: 0 or more", r.Where, grow)
		}
	}
	return c, nil
}
