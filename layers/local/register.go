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
		},
		New: func(_ []layer.FS, o registry.Values) (layer.FS, error) {
			return New(o.String("path"))
		},
	})
}
