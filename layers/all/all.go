// Package all links every layer type into a program: import it for its
// side effect of registering them.
package all

import (
	_ "cairn/layers/acl"
	_ "cairn/layers/chains"
	_ "cairn/layers/codec"
	_ "cairn/layers/crypt"
	_ "cairn/layers/fault"
	_ "cairn/layers/local"
	_ "cairn/layers/mux"
	_ "cairn/layers/null"
	_ "cairn/layers/replica"
	_ "cairn/layers/shard"
	_ "cairn/layers/snoop"
	_ "cairn/layers/union"
)
