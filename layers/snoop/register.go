package snoop

import (
	"cairn/layer"
	"cairn/registry"
)

func init() {
	registry.Register(registry.Type{
		Name:      "snoop",
		Summary:   "logs every operation as a JSON line: who touched what (Snoopfs)",
		MinLowers: 1, MaxLowers: 1,
		Options: []registry.Option{
			{Name: "log", Kind: registry.Path, Help: "the log file, JSON lines (reopened on SIGHUP, for rotation)"},
			{Name: "output", Kind: registry.String, Allowed: []string{"file", "stdout", "syslog"},
				Help: "where records go: file (the log option; the default), stdout (with cairn mount -f) or syslog"},
			{Name: "ops", Kind: registry.List, Help: "log only these operations (open, read, rename, ...; default all)"},
			{Name: "paths", Kind: registry.List, Help: "log only paths matching one of these patterns (default all)"},
			{Name: "uids", Kind: registry.List, Help: "log only these users, by number or name (default all)"},
			{Name: "io", Kind: registry.Bool, Default: false,
				Help: "log every read and write: turns kernel passthrough off for the files under this layer"},
			{Name: "queue", Kind: registry.Int, Default: int64(8192),
				Help: "records that may wait for a slow log; beyond that they are dropped, and counted in the log"},
		},
		New: func(l []layer.FS, o registry.Values) (layer.FS, error) {
			return New(l[0], Options{
				Output: o.String("output"), Log: o.String("log"),
				Ops: o.List("ops"), Paths: o.List("paths"), Uids: o.List("uids"),
				IO: o.Bool("io"), Queue: int(o.Int("queue")),
			})
		},
	})
}
