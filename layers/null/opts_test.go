package null_test

import "cairnfs.dev/cairn/fusefs"

func mountOpts(noPassthrough bool) fusefs.Options {
	return fusefs.Options{AllowOther: true, NoPassthrough: noPassthrough}
}
