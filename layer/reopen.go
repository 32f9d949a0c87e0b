package layer

import "errors"

// Reopener is implemented by layers that keep files of their own open, such
// as logs. `cairn mount` calls Reopen on every layer of the stack when it
// receives SIGHUP, so that a rotated log file is let go and created again.
type Reopener interface {
	Reopen() error
}

// ReopenStack calls Reopen on fs and every layer below it that is a
// Reopener.
func ReopenStack(fs FS) error {
	var errs []error
	Walk(fs, func(f FS) {
		if r, ok := f.(Reopener); ok {
			if err := r.Reopen(); err != nil {
				errs = append(errs, err)
			}
		}
	})
	return errors.Join(errs...)
}
