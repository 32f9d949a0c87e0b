package replica

import "log/slog"

// SetDebugCopy lets a test see each object resync copies.
func SetDebugCopy(fn func(k int, p string)) { debugCopy = fn }

// CheckRootsAlways makes every change check the replicas' directories.
func CheckRootsAlways() func() {
	old := rootCheckEvery
	rootCheckEvery = 0
	return func() { rootCheckEvery = old }
}

// SetLog sends the layer's log to l.
func (fs *FS) SetLog(l *slog.Logger) { fs.log = l }
