package replica

import "log/slog"

// SetDebugCopy lets a test see each object resync copies.
func SetDebugCopy(fn func(k int, p string)) { debugCopy = fn }

// CheckRootsAlways makes every change check the replicas' directories
// (before the layer is mounted).
func (fs *FS) CheckRootsAlways() { fs.rootEvery = 0 }

// SetLog sends the layer's log to l.
func (fs *FS) SetLog(l *slog.Logger) { fs.log = l }
