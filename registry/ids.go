package registry

import (
	"errors"
	"fmt"
	"os/user"
	"strconv"
)

// UserID takes a user by number or name (options such as acl's users and
// snoop's uids).
func UserID(s string) (uint32, error) {
	return lookupID(s, func(s string) (string, error) {
		u, err := user.Lookup(s)
		if err != nil {
			return "", err
		}
		return u.Uid, nil
	})
}

// GroupID takes a group by number or name.
func GroupID(s string) (uint32, error) {
	return lookupID(s, func(s string) (string, error) {
		g, err := user.LookupGroup(s)
		if err != nil {
			return "", err
		}
		return g.Gid, nil
	})
}

func lookupID(s string, byName func(string) (string, error)) (uint32, error) {
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		return uint32(n), nil
	}
	id, err := byName(s)
	if err != nil {
		return 0, fmt.Errorf("%q is neither a number nor a known name", s)
	}
	n, err := strconv.ParseUint(id, 10, 32)
	return uint32(n), err
}

// Each makes an Option.Check of a list option from a check of one element
// (UserID, GroupID, a layer's own), so that cairn check refuses each bad
// element as the layer would.
func Each[T any](f func(string) (T, error)) func(any) error {
	return func(v any) error {
		l, _ := v.([]string)
		var errs []error
		for _, s := range l {
			if _, err := f(s); err != nil {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	}
}
