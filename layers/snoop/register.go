package snoop

import (
	"errors"
	"fmt"
	"strings"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/logsink"
	"cairnfs.dev/cairn/pathmatch"
	"cairnfs.dev/cairn/registry"
	"cairnfs.dev/cairn/spec"
)

// The options' checks, which cairn check runs too: everything New would
// refuse, refused before anything is built.

func checkOps(v any) error {
	for _, op := range v.([]string) {
		if !known(op) {
			return fmt.Errorf("unknown operation %q%s (known: %s)", op, spec.DidYouMean(op, layer.OpNames), strings.Join(layer.OpNames, ", "))
		}
	}
	return nil
}

func checkPaths(v any) error {
	_, err := pathmatch.NewSet(v.([]string), nil)
	return err
}

func init() {
	registry.Register(registry.Type{
		Name:      "snoop",
		Summary:   "logs every operation as a JSON line: who touched what (Snoopfs)",
		MinLowers: 1, MaxLowers: 1,
		Options: []registry.Option{
			{Name: "log", Kind: registry.Path, Help: "the log file, JSON lines (reopened on SIGHUP, for rotation)", Check: logsink.CheckPath},
			{Name: "output", Kind: registry.String, Allowed: []string{"file", "stdout", "syslog"},
				Help: "where records go: file (the log option; the default), stdout (with cairn mount -f) or syslog"},
			{Name: "ops", Kind: registry.List, Help: "log only these operations (open, read, rename, ...; default all)", Check: checkOps},
			{Name: "classes", Kind: registry.List, Help: "log only operations of these classes: " + strings.Join(layer.ClassNames, ", ") + " (as acl's rules name them; default all)", Check: registry.Each(layer.ParseClass)},
			{Name: "paths", Kind: registry.List, Help: "log only paths matching one of these patterns (default all)", Check: checkPaths},
			{Name: "uids", Kind: registry.List, Help: "log only these users, by number or name (default all)", Check: registry.Each(registry.UserID)},
			{Name: "io", Kind: registry.Bool, Default: false,
				Help: "log every read and write: turns kernel passthrough off for the files under this layer"},
			{Name: "queue", Kind: registry.Int, Default: int64(8192),
				Help: "records that may wait for a slow log; beyond that they are dropped, and counted in the log"},
		},
		Check: func(o registry.Values, _ int) error {
			if out := o.String("output"); (out == "" || out == "file") && o.String("log") == "" {
				return &registry.OptionError{Option: "log", Err: errors.New(`a log file is needed: add log = "/var/log/cairn-snoop.json" (or output = "syslog")`)}
			}
			return nil
		},
		NoPassthrough: func(o registry.Values) string {
			if o.Bool("io") {
				return "io = true: every read and write is logged"
			}
			return ""
		},
		New: func(l []layer.FS, o registry.Values) (layer.FS, error) {
			return New(l[0], Options{
				Output: o.String("output"), Log: o.String("log"),
				Ops: o.List("ops"), Classes: o.List("classes"), Paths: o.List("paths"), Uids: o.List("uids"),
				IO: o.Bool("io"), Queue: int(o.Int("queue")),
			})
		},
	})
}
