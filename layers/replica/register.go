package replica

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/registry"
)

// checkDirs refuses replicas stored in one directory, or one inside
// another's.
func checkDirs(dirs [][]string) error {
	for i := range dirs {
		for j := range i {
			for _, a := range dirs[j] {
				for _, b := range dirs[i] {
					switch {
					case a == b:
						return &registry.LowerError{Index: i, Err: fmt.Errorf("replicas %d and %d are the same directory (%s): a replica must be a directory of its own", j+1, i+1, a)}
					case within(b, a):
						return &registry.LowerError{Index: i, Err: fmt.Errorf("replica %d (%s) is inside replica %d (%s): the replicas would hold each other", i+1, b, j+1, a)}
					case within(a, b):
						return &registry.LowerError{Index: i, Err: fmt.Errorf("replica %d (%s) is inside replica %d (%s): the replicas would hold each other", j+1, a, i+1, b)}
					}
				}
			}
		}
	}
	return nil
}

func within(p, dir string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, "../")
}

func init() {
	registry.Register(registry.Type{
		Name:      "replica",
		Summary:   "mirrors a tree over several lowers: changes to all, reads balanced, failover and resync (Lb2fs)",
		MinLowers: 2, MaxLowers: maxReplicas,
		Changes: layer.ChangesPlacement,
		Lacks:   layer.FSTmpfile,
		Options: []registry.Option{
			{Name: "policy", Kind: registry.String, Default: "round-robin", Allowed: PolicyNames,
				Help: "the replica that serves a read: round-robin, least-outstanding (fewest requests in flight), first (the first healthy, others as fallback), random"},
			{Name: "timeout", Kind: registry.Duration, Default: "30s",
				Help: "a replica that takes longer to answer one operation is taken as failed (degraded); 0: wait for ever",
				Check: func(v any) error {
					if d, _ := v.(time.Duration); d < 0 {
						return fmt.Errorf("a duration of 0 (wait for ever) or more, found %v", d)
					}
					return nil
				}},
			{Name: "passthrough", Kind: registry.Bool, Default: true,
				Help: "hand read-only files to the kernel (native read speed); their reads then do not fail over to another replica while open"},
			{Name: "balance_size", Kind: registry.Size, Default: int64(DefaultBalanceSize),
				Help: "read-only files smaller than this are read from the primary replica, which answered their lookup; the policy spreads the larger ones (0: every file)"},
			{Name: "resync", Kind: registry.Bool, Default: false,
				Help: "bring degraded replicas back at mount (as 'cairn resync' does) before serving"},
			{Name: "verify", Kind: registry.Bool, Default: true,
				Help: "at mount and at 'cairn resync', look for changes made to the replicas outside cairn since their last clean unmount (one stat per object, in the background; reads stay on the primary until a replica is checked) and degrade a replica found changed"},
		},
		Explain: func(v registry.Values, over []string) []string {
			return []string{fmt.Sprintf("replicas: %s (reads: %s; changes: all)", strings.Join(over, ", "), v.String("policy"))}
		},
		NoPassthrough: func(o registry.Values) string {
			if !o.Bool("passthrough") {
				return "passthrough = false: every read comes through the layer, to fail over"
			}
			return ""
		},
		CheckDirs: checkDirs,
		New: func(l []layer.FS, o registry.Values) (layer.FS, error) {
			p, err := ParsePolicy(o.String("policy"))
			if err != nil {
				return nil, err
			}
			return New(l, Options{Policy: p, Timeout: o.Duration("timeout"), NoPassthrough: !o.Bool("passthrough"), ResyncAtMount: o.Bool("resync"), BalanceSize: o.Int("balance_size"), Verify: o.Bool("verify")})
		},
	})
}
