package fault

import (
	"errors"
	"fmt"
	"time"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/registry"
)

func checkOp(s string) (layer.Class, error) { k, _, err := ParseOp(s); return k, err }

// nonNegative refuses a negative duration (which would be no delay, or no
// hang, without a word).
func nonNegative(v any) error {
	if d, _ := v.(time.Duration); d < 0 {
		return fmt.Errorf("a duration of 0 or more, found %v", d)
	}
	return nil
}

func init() {
	registry.Register(registry.Type{
		Name:      "fault",
		Summary:   "injects faults by rule: errors, latency, short reads and writes, hangs (for testing stacks)",
		MinLowers: 1, MaxLowers: 1,
		Options: []registry.Option{
			{Name: "reload", Kind: registry.Bool, Default: false,
				Help: "the rules may change while mounted (SIGHUP reads them again); files are then not passed through to the kernel"},
			{Name: "log", Kind: registry.Bool, Default: false, Help: "log each injected fault (a warning)"},
		},
		Rules: &registry.RuleSpec{
			Help: "the first rule that covers the path and the operation decides what happens to it (with nothing but match, an operation fails with EIO)",
			Options: []registry.Option{
				{Name: "ops", Kind: registry.List, Check: registry.Each(checkOp),
					Help: "operation classes (read, write, create, delete, rename, setattr, xattr, exec) or operations (getattr, open, fsync, ...) the rule applies to (default: every operation)"},
				{Name: "errno", Kind: registry.String, Help: "the error to give: EIO, ENOSPC, ETIMEDOUT, ... (EIO when the rule neither delays nor shortens)",
					Check: func(v any) error { _, err := ParseErrno(v.(string)); return err }},
				{Name: "delay", Kind: registry.Duration, Help: "a latency added before the operation goes down", Check: nonNegative},
				{Name: "hang", Kind: registry.Duration, Help: "hold the operation this long (or until it is interrupted), then fail it with errno (default EIO)", Check: nonNegative},
				{Name: "short", Kind: registry.Size, Help: "cut reads and writes to at most this many bytes"},
				{Name: "probability", Kind: registry.String, Help: "the chance that the rule fires on an operation: 0 to 1, or a percentage such as \"5%\" (default 1)",
					Check: func(v any) error { _, err := ParseProbability(v.(string)); return err }},
				{Name: "after", Kind: registry.Int, Default: int64(0), Help: "let this many operations the rule applies to pass first",
					Check: func(v any) error {
						if v.(int64) < 0 {
							return errors.New("after must be 0 or more")
						}
						return nil
					}},
			},
		},
		NoPassthrough: func(o registry.Values) string {
			if o.Bool("reload") {
				return "reload = true: the rules may change while mounted"
			}
			rs, err := FromRegistry(o.Rules())
			if err != nil {
				return ""
			}
			if k := rs.ioRule(); k >= 0 {
				return fmt.Sprintf("rule %d at %s can fire on reads and writes", k+1, rs[k].Where)
			}
			return ""
		},
		New: func(l []layer.FS, o registry.Values) (layer.FS, error) {
			rs, err := FromRegistry(o.Rules())
			if err != nil {
				return nil, fmt.Errorf("fault: %w", err)
			}
			return New(l[0], rs, o.Bool("reload"), o.Bool("log")), nil
		},
	})
}
