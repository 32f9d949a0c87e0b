package null_test

import "cairn/fusefs"

func mountOpts(noPassthrough bool) fusefs.Options {
	return fusefs.Options{AllowOther: true, NoPassthrough: noPassthrough}
}
