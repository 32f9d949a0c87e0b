package pack

import (
	"fmt"
	"time"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/registry"
)

func init() {
	registry.Register(registry.Type{
		Name:      "pack",
		Summary:   "packs small files into a pack file per directory (tail packing): an emptied lower file with an xattr takes no block",
		MinLowers: 1, MaxLowers: 1,
		Changes: layer.ChangesData | layer.ChangesAttrs,
		PerFile: true,
		Lacks:   layer.FSTmpfile,
		Options: []registry.Option{
			{Name: "max_size", Kind: registry.Size, Default: int64(DefaultMaxSize),
				Help: "the largest lower file packed, from 1 byte to 64KiB",
				Check: func(v any) error {
					if n, _ := v.(int64); n < 1 || n > maxPacked {
						return fmt.Errorf("must be from 1 to 64KiB, found %d", n)
					}
					return nil
				}},
			{Name: "delay", Kind: registry.Duration, Default: "5s",
				Help: "how long a small file is left alone (no change, no read or write through the layer) before it is packed: longer than the fold_delay of a codec above, whose fold would unpack it; an unmount packs every small file closed",
				Check: func(v any) error {
					if d, _ := v.(time.Duration); d <= 0 {
						return fmt.Errorf("must be positive")
					}
					return nil
				}},
			{Name: "compact_min", Kind: registry.Size, Default: int64(64 << 10),
				Help: "the dead bytes (of files removed or unpacked) a directory's packs may hold before they are compacted; compaction also needs more dead bytes than live ones"},
		},
		New: func(l []layer.FS, v registry.Values) (layer.FS, error) {
			return New(l[0], Options{MaxSize: v.Int("max_size"), Delay: v.Duration("delay"), CompactMin: v.Int("compact_min")})
		},
	})
}
