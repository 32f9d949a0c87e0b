package layer

import "context"

type selfKey struct{}

// AsSelf marks ctx as the stack's own operation, not a user's: a layer
// working on files of its own (a journal, an index, side data, a copy-up)
// calls its lower with it. Below it:
//   - the caller is the daemon (CallerOf gives Self()): the local layer
//     creates with the daemon's identity and the modes it is given, with no
//     caller umask;
//   - Hooked layers call no hook: acl does not judge the operation and
//     snoop does not log it (it is no user's doing), while the operation
//     itself goes through unchanged.
//
// A layer must use it only for its own bookkeeping, never for an operation
// a user asked for: it bypasses every access rule below.
func AsSelf(ctx context.Context) context.Context {
	return context.WithValue(WithCaller(ctx, Self()), selfKey{}, true)
}

// IsSelf reports whether ctx is the stack's own operation (see AsSelf).
func IsSelf(ctx context.Context) bool {
	v, _ := ctx.Value(selfKey{}).(bool)
	return v
}
