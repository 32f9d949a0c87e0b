package union

import (
	"errors"
	"fmt"
	"strings"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layer/fanout"
	"cairnfs.dev/cairn/registry"
)

func init() {
	registry.Register(registry.Type{
		Name:      "union",
		Summary:   "merges its lowers, first first, with copy-up, whiteouts and opaque directories in overlayfs's format (Unionfs)",
		MinLowers: 2, MaxLowers: -1,
		Finds:   true, // layer.Finder, through its branches
		Changes: layer.ChangesPlacement,
		Lacks:   layer.FSRenameWhiteout,
		Options: []registry.Option{
			{Name: "modes", Kind: registry.List,
				Help:  "each lower's mode, in order: RW (read-write), RO (read-only) or NC (no create: written, but new objects go elsewhere); default RW for the first, RO for the others (overlayfs's upper and lowers)",
				Check: registry.Each(func(s string) (fanout.Mode, error) { return fanout.ParseMode(s) })},
			{Name: "minfreespace", Kind: registry.Size, Default: int64(0),
				Help: "free space below which a RW lower gets no new objects (mergerfs's minfreespace; 0: none)"},
			{Name: "moveonenospc", Kind: registry.Bool, Default: false,
				Help: "a file whose RW lower fills up moves to the RW lower with the most free space and the write is tried again (files open for writing are then not passed through)"},
			{Name: "shared", Kind: registry.Bool, Default: false,
				Help: "others change the lowers too (mergerfs's use: disks also written outside the union): the union keeps no names of its own and the kernel keeps names and attributes for the mount's timeouts (1 s), so changes made in a lower show within them; default false (overlayfs's rule: the lowers change only through the union, which then keeps what it learns until it changes something, and the kernel for 24 h)"},
			{Name: "create", Kind: registry.String, Default: "ff", Allowed: fanout.PolicyNames(),
				Help: "where a new object goes among the RW lowers that would show it: " + strings.Join(fanout.PolicyNames(), ", ") + " (mergerfs's create policies)"},
		},
		Check: func(o registry.Values, lowers int) error {
			modes := o.List("modes")
			if len(modes) != 0 && len(modes) != lowers {
				return &registry.OptionError{Option: "modes", Err: fmt.Errorf("%d modes for %d lowers: give one mode for each layer of over, in order", len(modes), lowers)}
			}
			return nil
		},
		Explain: func(o registry.Values, over []string) []string {
			modes, err := branchModes(o, len(over))
			if err != nil {
				return nil
			}
			var b []string
			for i, n := range over {
				b = append(b, fmt.Sprintf("%s %s", n, modes[i]))
			}
			return []string{"branches, first first: " + strings.Join(b, ", ")}
		},
		New: func(l []layer.FS, o registry.Values) (layer.FS, error) {
			modes, err := branchModes(o, len(l))
			if err != nil {
				return nil, err
			}
			bs := make([]fanout.Branch, len(l))
			for i := range l {
				bs[i] = fanout.Branch{FS: l[i], Mode: modes[i], MinFree: uint64(o.Int("minfreespace"))}
			}
			p, err := fanout.PolicyByName(o.String("create"))
			if err != nil {
				return nil, err
			}
			return New(bs, Options{Policy: p, MoveOnENOSPC: o.Bool("moveonenospc"), Shared: o.Bool("shared")})
		},
	})
}

// branchModes are the modes of n branches: the option's, or RW for the
// first and RO for the others.
func branchModes(o registry.Values, n int) ([]fanout.Mode, error) {
	names := o.List("modes")
	if len(names) != 0 && len(names) != n {
		return nil, errors.New("union: one mode for each lower")
	}
	modes := make([]fanout.Mode, n)
	for i := range modes {
		modes[i] = fanout.RO
		if i == 0 {
			modes[i] = fanout.RW
		}
		if len(names) != 0 {
			m, err := fanout.ParseMode(names[i])
			if err != nil {
				return nil, err
			}
			modes[i] = m
		}
	}
	return modes, nil
}
