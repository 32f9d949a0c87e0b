package local

import (
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/registry"
)

func init() {
	registry.Register(registry.Type{
		Name:    "local",
		Summary: "a directory on this machine: the bottom of a stack",
		Finds:   true, // layer.Finder, by the lower's file handles (a daemon with CAP_DAC_READ_SEARCH)
		Options: []registry.Option{
			{Name: "path", Kind: registry.Dir, Required: true, Help: "the directory that holds the data"},
			{Name: "shared", Kind: registry.Bool, Help: "other programs change the directory too, not only this mount: the kernel then keeps names and attributes for the mount's timeouts (1 s) instead of until they change through the mount (default false; a directory on a network or FUSE file system is taken as shared)"},
		},
		New: func(_ []layer.FS, o registry.Values) (layer.FS, error) {
			fs, err := New(o.String("path"))
			if err == nil && o.Bool("shared") {
				fs.SetShared()
			}
			return fs, err
		},
	})
}
