// Package all links every layer type into a program: import it for its
// side effect of registering them.
package all

import (
	_ "cairnfs.dev/cairn/layers/acl"
	_ "cairnfs.dev/cairn/layers/chains"
	_ "cairnfs.dev/cairn/layers/codec"
	_ "cairnfs.dev/cairn/layers/crypt"
	_ "cairnfs.dev/cairn/layers/fault"
	_ "cairnfs.dev/cairn/layers/local"
	_ "cairnfs.dev/cairn/layers/mux"
	_ "cairnfs.dev/cairn/layers/null"
	_ "cairnfs.dev/cairn/layers/pack"
	_ "cairnfs.dev/cairn/layers/replica"
	_ "cairnfs.dev/cairn/layers/shard"
	_ "cairnfs.dev/cairn/layers/snoop"
	_ "cairnfs.dev/cairn/layers/union"
)
